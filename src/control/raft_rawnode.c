/*
 * raft_rawnode.c - the application's side of the Raft core (etcd-raft's
 * rawnode.go): proposals, membership changes, leadership transfer, ReadIndex
 * requests, compaction, the ready / advance batch, creation and introspection.
 */
#include "config.h"
#include "control/raft_int.h"
#include "common/common.h"
#include "common/le.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static int check_leader(struct rps__raft *r, const char *what)
{
	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: %s while a ready is outstanding: call advance first", what);
	if (r->role != RPS__RAFT_LEADER)
		return rps__seterr(-EPERM, "raft %llu: %s: not the leader (leader hint %llu)",
				   (unsigned long long)r->id, what, (unsigned long long)r->lead);
	if (r->lead_transferee != RPS__RAFT_NONE)
		return rps__seterr(-EBUSY, "raft %llu: %s: leadership is moving to %llu, retry there",
				   (unsigned long long)r->id, what, (unsigned long long)r->lead_transferee);
	return 0;
}

int rps__raft_propose(struct rps__raft *r, const void *data, size_t len, uint64_t *index,
		      uint64_t *term)
{
	int err = check_leader(r, "propose");

	if (err)
		return err;
	if (len > RPS__RAFT_MAX_DATA)
		return rps__seterr(-EMSGSIZE, "raft: proposal of %zu bytes exceeds %u", len, RPS__RAFT_MAX_DATA);
	if (term)
		*term = r->term;
	err = rps__raft_leader_append(r, RPS__RAFT_ENTRY_NORMAL, data, len, index);
	if (err)
		return err;
	/* Sent by the next ready, not now: proposals made before it go to
	 * each follower as one append (one write and sync there), not as one
	 * message per proposal. */
	r->bcast_pending = true;
	return r->broken;
}

int rps__raft_propose_conf_change(struct rps__raft *r, enum rps__raft_conf_op op, uint64_t node,
				  uint64_t *index)
{
	bool voter = rps__raft_conf_is_voter(&r->conf, node), learner = rps__raft_conf_is_learner(&r->conf, node);
	uint8_t data[CONF_DATA_LEN];
	struct progress *pr;
	int err = check_leader(r, "membership change");

	if (err)
		return err;
	if (node == RPS__RAFT_NONE)
		return rps__seterr(-EINVAL, "raft: membership change of node 0");
	if (r->conf_index > r->log.committed)
		return rps__seterr(-EBUSY, "raft: the previous membership change (index %llu) is not committed yet",
				   (unsigned long long)r->conf_index);
	if (!rps__raft_leader_committed_in_term(r))
		return rps__seterr(-EAGAIN, "raft: new leader has not committed in its term yet, retry");
	switch (op) {
	case RPS__RAFT_CONF_ADD_VOTER:
	case RPS__RAFT_CONF_ADD_LEARNER:
		if (voter || learner)
			return rps__seterr(-EEXIST, "raft: node %llu is already a member", (unsigned long long)node);
		if (!rps__raft_conf_has_room(&r->conf))
			return rps__seterr(-ENOSPC, "raft: a configuration holds at most %u nodes", RPS__RAFT_MAX_NODES);
		if (op == RPS__RAFT_CONF_ADD_VOTER && !rps__raft_conf_has_voter_room(&r->conf))
			return rps__seterr(-ENOSPC, "raft: a configuration holds at most %u voters: add node %llu as a learner",
					   RPS__RAFT_MAX_VOTERS, (unsigned long long)node);
		break;
	case RPS__RAFT_CONF_PROMOTE:
		if (!learner)
			return rps__seterr(-EINVAL, "raft: node %llu is not a learner", (unsigned long long)node);
		if (!rps__raft_conf_has_voter_room(&r->conf))
			return rps__seterr(-ENOSPC, "raft: cannot promote %llu: a configuration holds at most %u voters",
					   (unsigned long long)node, RPS__RAFT_MAX_VOTERS);
		/* a voter that cannot vote for lack of a log weakens the quorum */
		pr = rps__raft_progress_find(r, node);
		if (!pr || pr->match < r->log.committed)
			return rps__seterr(-EAGAIN, "raft: learner %llu has not caught up (%llu of %llu), retry later",
					   (unsigned long long)node, (unsigned long long)(pr ? pr->match : 0),
					   (unsigned long long)r->log.committed);
		break;
	case RPS__RAFT_CONF_REMOVE:
		if (!voter && !learner)
			return rps__seterr(-ENOENT, "raft: node %llu is not a member", (unsigned long long)node);
		if (node == r->id)
			return rps__seterr(-EBUSY, "raft: the leader cannot remove itself: transfer leadership first");
		break;
	default:
		return rps__seterr(-EINVAL, "raft: unknown membership change %d", (int)op);
	}
	data[0] = (uint8_t)op;
	rps__le_put64(data + 1, node);
	err = rps__raft_leader_append(r, RPS__RAFT_ENTRY_CONF, data, sizeof(data), index);
	if (err)
		return err;
	rps__raft_bcast_append(r);
	return r->broken;
}

int rps__raft_transfer_leader(struct rps__raft *r, uint64_t to)
{
	struct progress *pr;
	int err;

	if (r->role == RPS__RAFT_LEADER && r->lead_transferee == to && to != RPS__RAFT_NONE)
		return 0;	/* already on its way */
	err = check_leader(r, "transfer leadership");
	if (err)
		return err;
	if (to == r->id)
		return 0;
	if (!rps__raft_conf_is_voter(&r->conf, to))
		return rps__seterr(-EINVAL, "raft: cannot transfer leadership to %llu: not a voter",
				   (unsigned long long)to);
	pr = rps__raft_progress_find(r, to);
	r->lead_transferee = to;
	/* the transfer must finish within an election timeout */
	r->election_elapsed = 0;
	if (pr->match == rps__raft_log_last(&r->log))
		rps__raft_send_timeout_now(r, to);
	else
		rps__raft_send_append(r, pr, true);
	return r->broken;
}

int rps__raft_read_index(struct rps__raft *r, uint64_t ctx)
{
	struct rps__raft_msg *m;
	int err;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: read_index while a ready is outstanding");
	if (ctx == 0)
		return rps__seterr(-EINVAL, "raft: read_index context must be nonzero");
	if (r->role == RPS__RAFT_LEADER) {
		if (!rps__raft_leader_committed_in_term(r))
			return rps__seterr(-EAGAIN, "raft: new leader has not committed in its term yet, retry");
		err = rps__raft_read_request_add(r, r->id, ctx);
		if (err == -EEXIST)
			return rps__seterr(err, "raft: read context %llu is already pending", (unsigned long long)ctx);
		if (err)
			return rps__seterr(err, "raft: too many pending reads, retry");
		return r->broken;
	}
	if (r->lead == RPS__RAFT_NONE)
		return rps__seterr(-EAGAIN, "raft %llu: no leader known, retry", (unsigned long long)r->id);
	m = rps__raft_msg_push(r, RPS__RAFT_MSG_READ_INDEX, r->lead);
	if (m)
		m->context = ctx;
	return r->broken;
}

int rps__raft_compact(struct rps__raft *r, uint64_t index, const void *data, size_t len,
		      const struct rps__raft_snapshot **snap)
{
	struct rps__raft_snapshot s;
	int err;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: compact while a ready is outstanding");
	if (index <= r->log.snap_index || index > r->log.applied)
		return rps__seterr(-EINVAL, "raft: compact to %llu: must be in (%llu, applied %llu]",
				   (unsigned long long)index, (unsigned long long)r->log.snap_index,
				   (unsigned long long)r->log.applied);
	if (len > RPS__RAFT_MAX_DATA)
		return rps__seterr(-EMSGSIZE, "raft: snapshot of %zu bytes exceeds %u", len, RPS__RAFT_MAX_DATA);
	s.index = index;
	s.term = rps__raft_log_term_or0(&r->log, index);
	rps__raft_conf_at(r, index, &s.conf);
	s.len = (uint32_t)len;
	s.data = data;
	err = rps__raft_set_snapshot(r, &s);
	if (err)
		return rps__seterr(err, "raft: no memory for a snapshot of %zu bytes", len);
	rps__raft_log_compact(&r->log, index, s.term);
	if (snap)
		*snap = &r->snap;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* ready / advance */

int rps__raft_ready(struct rps__raft *r, struct rps__raft_ready *rd)
{
	struct raft_log *l = &r->log;
	uint64_t last = rps__raft_log_last(l);
	bool work = false;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: ready called twice without advance");
	if (r->bcast_pending) {
		r->bcast_pending = false;
		if (r->role == RPS__RAFT_LEADER)
			for (unsigned i = 0; i < r->n_prs; i++)
				while (rps__raft_send_append(r, &r->prs[i], false))
					;
		if (r->broken)
			return r->broken;
	}
	memset(rd, 0, sizeof(*rd));
	rd->role = r->role;
	rd->leader = r->lead;
	rd->hard_state.term = r->term;
	rd->hard_state.vote = r->vote;
	rd->hard_state.commit = l->committed;
	if (memcmp(&rd->hard_state, &r->prev_hs, sizeof(r->prev_hs)) != 0) {
		rd->hard_state_changed = true;
		work = true;
	}
	if (r->snap_pending) {
		rd->snapshot = &r->snap;
		work = true;
	}
	if (l->unstable <= l->snap_index)
		l->unstable = l->snap_index + 1;
	if (l->unstable <= last) {
		rd->entries = rps__raft_log_entry(l, l->unstable);
		rd->n_entries = (size_t)(last - l->unstable + 1);
		work = true;
	}
	if (l->committed > l->applied) {
		rd->committed = rps__raft_log_entry(l, l->applied + 1);
		rd->n_committed = (size_t)(l->committed - l->applied);
		work = true;
	}
	if (r->n_msgs) {
		rd->msgs = r->msgs;
		rd->n_msgs = r->n_msgs;
		work = true;
	}
	if (r->n_read_states) {
		rd->read_states = r->read_states;
		rd->n_read_states = r->n_read_states;
		work = true;
	}
	if (!work)
		return 0;
	r->ready_out = true;
	r->ready_hs = rd->hard_state;
	r->ready_last_index = last;
	r->ready_applied_to = l->committed;
	return 1;
}

int rps__raft_advance(struct rps__raft *r, const struct rps__raft_ready *rd)
{
	if (!r->ready_out)
		return rps__seterr(-EINVAL, "raft: advance without an outstanding ready");
	r->log.unstable = r->ready_last_index + 1;
	if (r->ready_applied_to > r->log.applied)
		r->log.applied = r->ready_applied_to;
	r->snap_pending = false;
	/* what was handed out, whatever the caller's copy became */
	r->prev_hs = r->ready_hs;
	rps__raft_msgs_clear(r);
	r->n_read_states = 0;
	r->ready_out = false;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* creation and introspection */

static int cmp_u64_asc(const void *a, const void *b)
{
	return -rps__raft_cmp_u64_desc(a, b);
}

static int validate_config(const struct rps__raft_config *cfg)
{
	if (cfg->id == RPS__RAFT_NONE)
		return rps__seterr(-EINVAL, "raft: node id 0 is reserved");
	if (cfg->heartbeat_ticks < 1 || cfg->election_ticks <= cfg->heartbeat_ticks)
		return rps__seterr(-EINVAL, "raft: need 1 <= heartbeat_ticks (%u) < election_ticks (%u)",
				   cfg->heartbeat_ticks, cfg->election_ticks);
	if (cfg->max_inflight_msgs < 1 || cfg->max_msg_entries < 1)
		return rps__seterr(-EINVAL, "raft: max_inflight_msgs and max_msg_entries must be >= 1");
	if (cfg->n_peers > RPS__RAFT_MAX_VOTERS)
		return rps__seterr(-EINVAL, "raft: %zu peers: a new cluster starts with at most %u voters",
				   cfg->n_peers, RPS__RAFT_MAX_VOTERS);
	if (cfg->boot_state_len > UINT32_MAX || (cfg->boot_state_len && !cfg->boot_state))
		return rps__seterr(-EINVAL, "raft: a bootstrap state of %zu bytes", cfg->boot_state_len);
	for (size_t i = 0; i < cfg->n_peers; i++) {
		if (cfg->peers[i] == RPS__RAFT_NONE)
			return rps__seterr(-EINVAL, "raft: peer id 0 is reserved");
		for (size_t j = 0; j < i; j++)
			if (cfg->peers[i] == cfg->peers[j])
				return rps__seterr(-EINVAL, "raft: peer %llu listed twice",
						   (unsigned long long)cfg->peers[i]);
	}
	return 0;
}

static int restore_persisted(struct rps__raft *r, const struct rps__raft_persisted *p)
{
	const struct rps__raft_hard_state *hs = &p->hard_state;
	int err;

	if (p->snapshot) {
		const struct rps__raft_snapshot *s = p->snapshot;

		if (!rps__raft_conf_fits(s->conf.n_voters, s->conf.n_learners))
			return rps__seterr(-EINVAL, "raft: restored snapshot has %u voters and %u learners: at most %u"
					   " voters and %u nodes", s->conf.n_voters, s->conf.n_learners,
					   RPS__RAFT_MAX_VOTERS, RPS__RAFT_MAX_NODES);
		err = rps__raft_set_snapshot(r, s);
		if (err)
			return err;
		r->log.snap_index = s->index;
		r->log.snap_term = s->term;
	}
	for (size_t i = 0; i < p->n_entries; i++) {
		const struct rps__raft_entry *e = &p->entries[i];

		if (e->index <= r->log.snap_index)
			continue;	/* compacted after it was stored */
		if (e->index != rps__raft_log_last(&r->log) + 1)
			return rps__seterr(-EINVAL, "raft: restored log has a gap before index %llu",
					   (unsigned long long)e->index);
		err = rps__raft_log_append(&r->log, e);
		if (err)
			return err;
	}
	if (hs->term > TERM_MAX || rps__raft_log_last_term(&r->log) > TERM_MAX ||
	    rps__raft_log_last(&r->log) > INDEX_MAX)
		return rps__seterr(-EINVAL, "raft: restored term %llu (log up to %llu, term %llu) cannot be"
				   " incremented: the log is unusable; restore this node from a peer",
				   (unsigned long long)hs->term, (unsigned long long)rps__raft_log_last(&r->log),
				   (unsigned long long)rps__raft_log_last_term(&r->log));
	r->term = hs->term;
	r->vote = hs->vote;
	r->log.committed = RPS__MAX(hs->commit, r->log.snap_index);
	if (r->log.committed > rps__raft_log_last(&r->log))
		return rps__seterr(-EINVAL, "raft: restored commit %llu is beyond the restored log (%llu)",
				   (unsigned long long)hs->commit, (unsigned long long)rps__raft_log_last(&r->log));
	if (rps__raft_log_last_term(&r->log) > r->term) {
		/* A crash between persisting entries and the hard state: keep
		 * term >= last log term.  No vote can be lost: a vote in that
		 * term would have been persisted along with the term. */
		r->term = rps__raft_log_last_term(&r->log);
		r->vote = RPS__RAFT_NONE;
	}
	r->log.applied = r->log.snap_index;	/* the application replays from its snapshot */
	r->log.unstable = rps__raft_log_last(&r->log) + 1;
	r->prev_hs = *hs;
	return 0;
}

/* A new cluster starts from a snapshot at index 1 holding the initial
 * configuration and an empty state machine: every initial member builds the
 * identical one, it is persisted atomically (a torn log write could keep only
 * part of a list of "add voter" entries, and a node that restarted believing
 * it formed a cluster alone would elect itself), and nodes that join later
 * receive it by InstallSnapshot.  The state machine's initial data
 * (boot_state) lives in that snapshot too, so a restart replays the log onto
 * the state it was formed with, whatever its command line says by then. */
static int bootstrap(struct rps__raft *r, const struct rps__raft_config *cfg)
{
	struct rps__raft_snapshot s = { .index = 1, .term = 1 };

	if (!cfg->n_peers)
		return 0;	/* joins an existing cluster: learns everything from it */
	if (cfg->boot_state_len) {
		void *data = malloc(cfg->boot_state_len);

		if (!data)
			return rps__seterr(-ENOMEM, "raft: no memory for the bootstrap state");
		memcpy(data, cfg->boot_state, cfg->boot_state_len);
		s.data = data;
		s.len = (uint32_t)cfg->boot_state_len;
	}
	for (size_t i = 0; i < cfg->n_peers; i++)
		s.conf.voters[i] = cfg->peers[i];
	s.conf.n_voters = (uint32_t)cfg->n_peers;
	qsort(s.conf.voters, s.conf.n_voters, sizeof(s.conf.voters[0]), cmp_u64_asc);
	r->snap = s;
	r->snap_pending = true;
	r->log.snap_index = 1;
	r->log.snap_term = 1;
	r->log.committed = 1;
	r->log.applied = 1;
	r->log.unstable = 2;
	r->term = 1;
	return 0;
}

int rps__raft_new(const struct rps__raft_config *cfg, const struct rps__raft_persisted *restored,
		  struct rps__raft **out)
{
	struct rps__raft *r;
	int err;

	*out = NULL;
	err = validate_config(cfg);
	if (err)
		return err;
	r = calloc(1, sizeof(*r));
	if (!r)
		return rps__seterr(-ENOMEM, "raft: no memory for a core");
	r->id = cfg->id;
	r->cfg = *cfg;
	r->cfg.peers = NULL;	/* not kept: the caller owns them */
	r->cfg.boot_state = NULL;
	r->rng = cfg->seed ^ (cfg->id * 0x9e3779b97f4a7c15ull);
	err = -ENOMEM;
	r->reads = calloc(READS_MAX, sizeof(*r->reads));
	if (!r->reads)
		goto fail_core;

	if (restored && (restored->snapshot || restored->n_entries || restored->hard_state.term))
		err = restore_persisted(r, restored);
	else
		err = bootstrap(r, cfg);
	if (err)
		goto fail_log;
	rps__raft_conf_recompute(r);
	rps__raft_become_follower(r, r->term, RPS__RAFT_NONE);
	*out = r;
	return 0;

fail_log:
	rps__raft_log_free(&r->log);
	free((void *)r->snap.data);
fail_core:
	free(r->reads);
	free(r);
	return err == -ENOMEM ? rps__seterr(err, "raft: no memory to create node %llu",
					    (unsigned long long)cfg->id) : err;
}

void rps__raft_free(struct rps__raft *r)
{
	if (!r)
		return;
	rps__raft_msgs_clear(r);
	free(r->msgs);
	free(r->read_states);
	rps__raft_log_free(&r->log);
	free((void *)r->snap.data);
	free(r->reads);
	for (unsigned i = 0; i < r->n_prs; i++)
		rps__raft_progress_free(&r->prs[i]);
	free(r);
}

uint64_t rps__raft_leader(const struct rps__raft *r)
{
	return r->lead;
}

void rps__raft_status(const struct rps__raft *r, struct rps__raft_status *st)
{
	/* not conf: status is called often, and conf is mostly unused slots */
	memset(st, 0, offsetof(struct rps__raft_status, conf));
	st->id = r->id;
	st->role = r->role;
	st->term = r->term;
	st->vote = r->vote;
	st->leader = r->lead;
	st->commit = r->log.committed;
	st->applied = r->log.applied;
	st->snapshot_index = r->log.snap_index;
	st->last_index = rps__raft_log_last(&r->log);
	st->lead_transferee = r->lead_transferee;
	st->promotable = rps__raft_promotable(r);
	rps__raft_conf_copy(&st->conf, &r->conf);
	st->refused = r->refused;
}

int rps__raft_entry_at(const struct rps__raft *r, uint64_t index, const struct rps__raft_entry **e)
{
	if (index <= r->log.snap_index || index > rps__raft_log_last(&r->log))
		return -ENOENT;
	*e = rps__raft_log_entry(&r->log, index);
	return 0;
}

int rps__raft_progress(const struct rps__raft *r, uint64_t id, struct rps__raft_progress_info *pi)
{
	const struct progress *pr = NULL;

	if (r->role != RPS__RAFT_LEADER)
		return -ENOENT;
	for (unsigned i = 0; i < r->n_prs; i++)
		if (r->prs[i].id == id)
			pr = &r->prs[i];
	if (!pr)
		return -ENOENT;
	pi->match = pr->match;
	pi->next = pr->next;
	pi->state = pr->state;
	pi->recent_active = pr->recent_active;
	pi->inflight = pr->ins.count;
	return 0;
}
