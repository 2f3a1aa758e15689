/*
 * raft.c - the Raft consensus core (see raft.h for the contract).
 *
 * The structure follows etcd-raft: one step function per role behind a
 * common term check, progress tracking per follower (probe / replicate /
 * snapshot with an in-flight window), a ready/advance batch for the
 * application.  Differences, each for a reason:
 *  - the core keeps the whole (compacted) log in memory, so there is no
 *    Storage interface: the control-plane log is small and a restart hands it
 *    back in rps__raft_persisted;
 *  - membership changes take effect when appended (Raft thesis 4.1), which is
 *    what makes single-server changes safe; etcd applies them on commit and
 *    needs joint consensus for safety;
 *  - a leader that cannot reach a follower with a snapshot retries after an
 *    election timeout instead of waiting for a ReportSnapshot call.
 *
 * Allocation failures deep inside a step leave the core half-updated, so the
 * core then refuses every further call (the sticky r->broken): the caller
 * frees it and restarts from what it persisted, which is always safe.
 *
 * This file is the state machine: roles, replication, ReadIndex, step and
 * tick.  Its log, progress tracking, quorum arithmetic, configuration changes,
 * messages and the application's calls are beside it (raft_int.h).
 */
#include "config.h"
#include "control/raft_int.h"
#include "common/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void rps__raft_fail(struct rps__raft *r, int err)
{
	if (!r->broken)
		r->broken = err;
}

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64: good enough to spread election timeouts, and seedable */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void rps__raft_send_timeout_now(struct rps__raft *r, uint64_t to)
{
	rps__raft_msg_push(r, RPS__RAFT_MSG_TIMEOUT_NOW, to);
}

/* Append entries following the log, taking conf entries into force. */
static int append_entries(struct rps__raft *r, const struct rps__raft_entry *ents, size_t n)
{
	bool conf = false;

	for (size_t i = 0; i < n; i++) {
		int err = rps__raft_log_append(&r->log, &ents[i]);

		if (err) {
			rps__raft_fail(r, err);
			return err;
		}
		if (ents[i].type == RPS__RAFT_ENTRY_CONF) {
			rps__raft_conf_apply_entry(&r->conf, &ents[i]);
			r->conf_index = rps__raft_log_last(&r->log);
			conf = true;
		}
	}
	if (conf)
		rps__raft_conf_changed(r);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* roles */

static void reset_randomized_timeout(struct rps__raft *r)
{
	r->randomized_timeout = r->cfg.election_ticks +
				(unsigned)(rng_next(&r->rng) % r->cfg.election_ticks);
}

static void abort_transfer(struct rps__raft *r)
{
	r->lead_transferee = RPS__RAFT_NONE;
}

static void reset(struct rps__raft *r, uint64_t term)
{
	if (r->term != term) {
		r->term = term;
		r->vote = RPS__RAFT_NONE;
	}
	r->lead = RPS__RAFT_NONE;
	r->election_elapsed = 0;
	r->heartbeat_elapsed = 0;
	reset_randomized_timeout(r);
	abort_transfer(r);
	r->n_votes = 0;
	r->n_reads = 0;
	rps__raft_progress_reset_all(r);
}

void rps__raft_become_follower(struct rps__raft *r, uint64_t term, uint64_t lead)
{
	reset(r, term);
	r->lead = lead;
	r->role = RPS__RAFT_FOLLOWER;
}

static void become_pre_candidate(struct rps__raft *r)
{
	/* neither the term nor the vote change: a failed PreVote leaves no trace */
	r->role = RPS__RAFT_PRE_CANDIDATE;
	r->n_votes = 0;
	r->lead = RPS__RAFT_NONE;
}

static void become_candidate(struct rps__raft *r)
{
	reset(r, r->term + 1);
	r->vote = r->id;
	r->role = RPS__RAFT_CANDIDATE;
}

/* Append as leader: the entry gets our term and the next index. */
int rps__raft_leader_append(struct rps__raft *r, uint32_t type, const void *data, size_t len,
			    uint64_t *index)
{
	struct rps__raft_entry e = {
		.term = r->term, .index = rps__raft_log_last(&r->log) + 1, .type = type,
		.len = (uint32_t)len, .data = data,
	};
	struct progress *self;
	int err = append_entries(r, &e, 1);

	if (err)
		return err;
	self = rps__raft_progress_find(r, r->id);
	if (self)
		rps__raft_pr_maybe_update(self, rps__raft_log_last(&r->log));
	if (index)
		*index = e.index;
	/* a single voter commits alone; otherwise followers have to answer */
	rps__raft_maybe_commit(r);
	return 0;
}

static void become_leader(struct rps__raft *r)
{
	struct progress *self;

	reset(r, r->term);
	r->lead = r->id;
	r->role = RPS__RAFT_LEADER;
	self = rps__raft_progress_find(r, r->id);
	if (self) {
		rps__raft_pr_become_replicate(r, self);
		self->recent_active = true;
	}
	/* Commit something of our own term: only then is everything before it
	 * known committed (Raft 5.4.2), and only then may reads and membership
	 * changes be served. */
	rps__raft_leader_append(r, RPS__RAFT_ENTRY_NORMAL, NULL, 0, NULL);
}

static void campaign(struct rps__raft *r, bool pre, bool transfer)
{
	uint8_t type;
	uint64_t term;

	if (pre) {
		become_pre_candidate(r);
		type = RPS__RAFT_MSG_PRE_VOTE;
		term = r->term + 1;
	} else {
		become_candidate(r);
		type = RPS__RAFT_MSG_VOTE;
		term = r->term;
	}
	if (rps__raft_poll(r, r->id, true) == VOTE_WON) {
		if (pre)
			campaign(r, false, false);
		else
			become_leader(r);
		return;
	}
	for (uint32_t i = 0; i < r->conf.n_voters; i++) {
		struct rps__raft_msg *m;

		if (r->conf.voters[i] == r->id)
			continue;
		m = rps__raft_msg_push(r, type, r->conf.voters[i]);
		if (!m)
			return;
		m->term = term;
		m->index = rps__raft_log_last(&r->log);
		m->log_term = rps__raft_log_last_term(&r->log);
		m->flags = transfer ? RPS__RAFT_MSG_F_TRANSFER : 0;
	}
}

static void hup(struct rps__raft *r, bool transfer)
{
	if (r->role == RPS__RAFT_LEADER || !rps__raft_promotable(r) || r->term >= TERM_MAX)
		return;
	campaign(r, r->cfg.pre_vote && !transfer, transfer);
}

/* ------------------------------------------------------------------------ */
/* leader: replication */

/* Send the follower what it misses, or a snapshot if that is compacted.
 * False if nothing was sent. */
bool rps__raft_send_append(struct rps__raft *r, struct progress *pr, bool send_if_empty)
{
	uint64_t last = rps__raft_log_last(&r->log), prev, prev_term, hi;
	struct rps__raft_msg *m;

	if (pr->id == r->id || rps__raft_pr_paused(pr))
		return false;
	if (pr->next > last + 1)
		pr->next = last + 1;
	prev = pr->next - 1;
	if (!rps__raft_log_term(&r->log, prev, &prev_term)) {
		/* compacted away: only the snapshot can bring it up */
		m = rps__raft_msg_push(r, RPS__RAFT_MSG_SNAP, pr->id);
		if (!m || rps__raft_msg_attach_snapshot(r, m))
			return false;
		rps__raft_pr_become_snapshot(pr, r->snap.index);
		return true;
	}
	hi = RPS__MIN(last, prev + r->cfg.max_msg_entries);
	if (hi == prev && !send_if_empty)
		return false;
	m = rps__raft_msg_push(r, RPS__RAFT_MSG_APP, pr->id);
	if (!m)
		return false;
	m->index = prev;
	m->log_term = prev_term;
	m->commit = r->log.committed;
	if (hi > prev && rps__raft_msg_attach_entries(r, m, prev + 1, hi))
		return false;
	switch (pr->state) {
	case RPS__RAFT_PROGRESS_REPLICATE:
		if (hi > prev) {
			/* pipeline: assume it arrives, a rejection brings us back */
			pr->next = hi + 1;
			rps__raft_inflights_add(&pr->ins, hi);
		}
		break;
	case RPS__RAFT_PROGRESS_PROBE:
		pr->probe_sent = true;
		break;
	case RPS__RAFT_PROGRESS_SNAPSHOT:
		break;
	}
	return true;
}

void rps__raft_bcast_append(struct rps__raft *r)
{
	for (unsigned i = 0; i < r->n_prs; i++)
		rps__raft_send_append(r, &r->prs[i], true);
}

static void bcast_heartbeat(struct rps__raft *r, uint64_t ctx)
{
	for (unsigned i = 0; i < r->n_prs; i++) {
		struct progress *pr = &r->prs[i];
		struct rps__raft_msg *m;

		if (pr->id == r->id)
			continue;
		m = rps__raft_msg_push(r, RPS__RAFT_MSG_HEARTBEAT, pr->id);
		if (!m)
			return;
		/* never past what it is known to hold: it may not have the rest */
		m->commit = RPS__MIN(pr->match, r->log.committed);
		m->context = ctx;
	}
}

/* ------------------------------------------------------------------------ */
/* leader: ReadIndex */

bool rps__raft_leader_committed_in_term(const struct rps__raft *r)
{
	return rps__raft_log_term_or0(&r->log, r->log.committed) == r->term;
}

static void read_respond(struct rps__raft *r, uint64_t from, uint64_t index, uint64_t ctx)
{
	struct rps__raft_msg *m;

	if (from == r->id) {
		rps__raft_read_state_push(r, index, ctx);
		return;
	}
	m = rps__raft_msg_push(r, RPS__RAFT_MSG_READ_INDEX_RESP, from);
	if (!m)
		return;
	m->index = index;
	m->context = ctx;
}

/* Register a read; confirmed once a quorum answers a heartbeat sent after
 * it (no newer leader can have committed anything before that). */
int rps__raft_read_request_add(struct rps__raft *r, uint64_t from, uint64_t ctx)
{
	struct read_request *rq;

	if (rps__raft_quorum(r) == 1) {
		read_respond(r, from, r->log.committed, ctx);
		return 0;
	}
	for (unsigned i = 0; i < r->n_reads; i++)
		if (r->reads[i].ctx == ctx)
			return -EEXIST;
	if (r->n_reads == READS_MAX)
		return -EAGAIN;
	rq = &r->reads[r->n_reads++];
	rq->ctx = ctx;
	rq->index = r->log.committed;
	rq->from = from;
	rq->n_acks = 1;
	rq->acks[0] = r->id;
	bcast_heartbeat(r, ctx);
	return 0;
}

static void drop_non_voter_acks(const struct rps__raft *r, struct read_request *rq)
{
	unsigned k = 0;

	for (unsigned i = 0; i < rq->n_acks; i++)
		if (rps__raft_conf_is_voter(&r->conf, rq->acks[i]))
			rq->acks[k++] = rq->acks[i];
	rq->n_acks = k;
}

static void read_ack(struct rps__raft *r, uint64_t from, uint64_t ctx)
{
	struct read_request *rq = NULL;
	unsigned k, votes = 0;

	for (k = 0; k < r->n_reads; k++)
		if (r->reads[k].ctx == ctx) {
			rq = &r->reads[k];
			break;
		}
	if (!rq)
		return;
	/* Only voters' acks count, so only they are kept: learners answer
	 * heartbeats too, and there may be a thousand of them. */
	if (rps__raft_conf_is_voter(&r->conf, from) && !rps__raft_id_in(rq->acks, rq->n_acks, from)) {
		if (rq->n_acks == RPS__RAFT_MAX_VOTERS)
			drop_non_voter_acks(r, rq);	/* voters removed since: room for from */
		if (rq->n_acks < RPS__RAFT_MAX_VOTERS)
			rq->acks[rq->n_acks++] = from;
	}
	for (unsigned i = 0; i < rq->n_acks; i++)
		if (rps__raft_conf_is_voter(&r->conf, rq->acks[i]))
			votes++;
	if (votes < rps__raft_quorum(r))
		return;
	/* the heartbeat for ctx went out after every earlier request too */
	for (unsigned i = 0; i <= k; i++)
		read_respond(r, r->reads[i].from, r->reads[i].index, r->reads[i].ctx);
	memmove(r->reads, r->reads + k + 1, (r->n_reads - k - 1) * sizeof(*r->reads));
	r->n_reads -= k + 1;
}

/* ------------------------------------------------------------------------ */
/* step */

static void step_leader(struct rps__raft *r, const struct rps__raft_msg *m)
{
	struct progress *pr;
	uint64_t last = rps__raft_log_last(&r->log);

	if (m->type == RPS__RAFT_MSG_READ_INDEX) {
		if (rps__raft_leader_committed_in_term(r))
			rps__raft_read_request_add(r, m->from, m->context);
		/* else dropped: the follower times out and retries */
		return;
	}
	pr = rps__raft_progress_find(r, m->from);
	if (!pr || pr->id == r->id)
		return;
	switch (m->type) {
	case RPS__RAFT_MSG_APP_RESP:
		pr->recent_active = true;
		if (m->reject) {
			uint64_t next_probe = m->hint, t;

			if (m->log_term > 0)
				next_probe = rps__raft_log_find_conflict_by_term(&r->log, m->hint, m->log_term, &t);
			if (rps__raft_pr_maybe_decr_to(pr, m->index, next_probe)) {
				if (pr->state == RPS__RAFT_PROGRESS_REPLICATE)
					rps__raft_pr_become_probe(pr);
				rps__raft_send_append(r, pr, true);
			}
			return;
		}
		{
			bool old_paused = rps__raft_pr_paused(pr);

			if (!rps__raft_pr_maybe_update(pr, m->index) &&
			    !(pr->match == m->index && pr->state == RPS__RAFT_PROGRESS_PROBE))
				return;
			switch (pr->state) {
			case RPS__RAFT_PROGRESS_PROBE:
				rps__raft_pr_become_replicate(r, pr);
				break;
			case RPS__RAFT_PROGRESS_SNAPSHOT:
				if (pr->match >= pr->pending_snapshot || pr->match + 1 > r->log.snap_index) {
					rps__raft_pr_become_probe(pr);
					if (pr->match + 1 > r->log.snap_index)
						rps__raft_pr_become_replicate(r, pr);
				}
				break;
			case RPS__RAFT_PROGRESS_REPLICATE:
				rps__raft_inflights_free_le(&pr->ins, m->index);
				break;
			}
			if (rps__raft_maybe_commit(r))
				rps__raft_bcast_append(r);
			else if (old_paused)
				rps__raft_send_append(r, pr, true);
			while (rps__raft_send_append(r, pr, false))
				;
			if (m->from == r->lead_transferee && pr->match == last)
				rps__raft_send_timeout_now(r, m->from);
		}
		return;
	case RPS__RAFT_MSG_HEARTBEAT_RESP:
		pr->recent_active = true;
		pr->probe_sent = false;
		/* a lost append would otherwise keep a full window stuck */
		if (pr->state == RPS__RAFT_PROGRESS_REPLICATE && rps__raft_inflights_full(&pr->ins))
			rps__raft_inflights_free_first(&pr->ins);
		if (pr->match < last)
			rps__raft_send_append(r, pr, true);
		if (m->context)
			read_ack(r, m->from, m->context);
		return;
	default:
		return;
	}
}

static void send_app_resp(struct rps__raft *r, uint64_t to, uint64_t index)
{
	struct rps__raft_msg *m = rps__raft_msg_push(r, RPS__RAFT_MSG_APP_RESP, to);

	if (m)
		m->index = index;
}

static int commit_to(struct rps__raft *r, uint64_t commit)
{
	if (commit <= r->log.committed)
		return 0;
	if (commit > rps__raft_log_last(&r->log))
		return rps__seterr(-EPROTO, "raft %llu: told to commit %llu beyond its last index %llu",
				   (unsigned long long)r->id, (unsigned long long)commit,
				   (unsigned long long)rps__raft_log_last(&r->log));
	r->log.committed = commit;
	return 0;
}

static int handle_append(struct rps__raft *r, const struct rps__raft_msg *m)
{
	uint64_t last_new, conflict = 0;
	uint32_t k;
	int err;

	for (k = 0; k < m->n_entries; k++)
		if (m->entries[k].index != m->index + 1 + k || m->entries[k].term > m->term ||
		    m->entries[k].term < m->log_term)
			return rps__seterr(-EBADMSG, "raft %llu: append from %llu has a malformed entry list",
					   (unsigned long long)r->id, (unsigned long long)m->from);
	if (m->index < r->log.committed) {
		send_app_resp(r, m->from, r->log.committed);
		return 0;
	}
	if (!rps__raft_log_match_term(&r->log, m->index, m->log_term)) {
		uint64_t hint_term, hint;

		hint = rps__raft_log_find_conflict_by_term(&r->log, RPS__MIN(m->index, rps__raft_log_last(&r->log)),
							   m->log_term, &hint_term);
		struct rps__raft_msg *resp = rps__raft_msg_push(r, RPS__RAFT_MSG_APP_RESP, m->from);
		if (resp) {
			resp->index = m->index;
			resp->reject = 1;
			resp->hint = hint;
			resp->log_term = hint_term;
		}
		return 0;
	}
	last_new = m->index + m->n_entries;
	for (k = 0; k < m->n_entries; k++)
		if (!rps__raft_log_match_term(&r->log, m->entries[k].index, m->entries[k].term)) {
			conflict = m->entries[k].index;
			break;
		}
	if (conflict) {
		if (conflict <= r->log.committed)
			return rps__seterr(-EPROTO, "raft %llu: entry %llu from %llu conflicts with a committed one",
					   (unsigned long long)r->id, (unsigned long long)conflict,
					   (unsigned long long)m->from);
		if (conflict <= rps__raft_log_last(&r->log)) {
			bool conf_lost = r->conf_index >= conflict;

			rps__raft_log_truncate(&r->log, conflict);
			if (conf_lost)
				rps__raft_conf_recompute(r);
		}
		err = append_entries(r, &m->entries[k], m->n_entries - k);
		if (err)
			return err;
	}
	err = commit_to(r, RPS__MIN(m->commit, last_new));
	if (err)
		return err;
	send_app_resp(r, m->from, last_new);
	return 0;
}

static int handle_heartbeat(struct rps__raft *r, const struct rps__raft_msg *m)
{
	struct rps__raft_msg *resp;
	int err = commit_to(r, m->commit);

	if (err)
		return err;
	resp = rps__raft_msg_push(r, RPS__RAFT_MSG_HEARTBEAT_RESP, m->from);
	if (resp)
		resp->context = m->context;
	return 0;
}

int rps__raft_set_snapshot(struct rps__raft *r, const struct rps__raft_snapshot *s)
{
	void *data = NULL;

	if (s->len) {
		data = malloc(s->len);
		if (!data)
			return -ENOMEM;
		memcpy(data, s->data, s->len);
	}
	free((void *)r->snap.data);
	r->snap = *s;
	r->snap.data = data;
	return 0;
}

/* Install a snapshot from the leader; false if we already have what it holds. */
static bool restore(struct rps__raft *r, const struct rps__raft_snapshot *s)
{
	int err;

	if (s->index <= r->log.committed)
		return false;
	if (rps__raft_log_match_term(&r->log, s->index, s->term)) {
		/* our log has it: the entries up to it are committed, keep them */
		commit_to(r, s->index);
		return false;
	}
	err = rps__raft_set_snapshot(r, s);
	if (err) {
		rps__raft_fail(r, err);
		return false;
	}
	rps__raft_log_truncate(&r->log, r->log.snap_index + 1);
	r->log.snap_index = s->index;
	r->log.snap_term = s->term;
	r->log.committed = s->index;
	r->log.applied = s->index;	/* the application applies the snapshot first */
	r->log.unstable = s->index + 1;
	r->snap_pending = true;
	rps__raft_conf_recompute(r);
	return true;
}

static void handle_snapshot(struct rps__raft *r, const struct rps__raft_msg *m)
{
	if (!m->snapshot)
		return;
	if (restore(r, m->snapshot))
		send_app_resp(r, m->from, rps__raft_log_last(&r->log));
	else
		send_app_resp(r, m->from, r->log.committed);
}

static int step_follower(struct rps__raft *r, const struct rps__raft_msg *m)
{
	switch (m->type) {
	case RPS__RAFT_MSG_APP:
		r->election_elapsed = 0;
		r->lead = m->from;
		return handle_append(r, m);
	case RPS__RAFT_MSG_HEARTBEAT:
		r->election_elapsed = 0;
		r->lead = m->from;
		return handle_heartbeat(r, m);
	case RPS__RAFT_MSG_SNAP:
		r->election_elapsed = 0;
		r->lead = m->from;
		handle_snapshot(r, m);
		return 0;
	case RPS__RAFT_MSG_TIMEOUT_NOW:
		/* the leader asks us to take over: no PreVote, and the votes we
		 * ask for bypass the lease of the leader that sent us */
		hup(r, true);
		return 0;
	case RPS__RAFT_MSG_READ_INDEX_RESP:
		rps__raft_read_state_push(r, m->index, m->context);
		return 0;
	default:
		return 0;
	}
}

static int step_candidate(struct rps__raft *r, const struct rps__raft_msg *m)
{
	uint8_t resp_type = r->role == RPS__RAFT_PRE_CANDIDATE ? RPS__RAFT_MSG_PRE_VOTE_RESP
								 : RPS__RAFT_MSG_VOTE_RESP;

	switch (m->type) {
	case RPS__RAFT_MSG_APP:
	case RPS__RAFT_MSG_HEARTBEAT:
	case RPS__RAFT_MSG_SNAP:
		/* a leader of our term exists */
		rps__raft_become_follower(r, m->term, m->from);
		return step_follower(r, m);
	default:
		break;
	}
	if (m->type != resp_type)
		return 0;
	switch (rps__raft_poll(r, m->from, !m->reject)) {
	case VOTE_WON:
		if (r->role == RPS__RAFT_PRE_CANDIDATE)
			campaign(r, false, false);
		else {
			become_leader(r);
			rps__raft_bcast_append(r);
		}
		break;
	case VOTE_LOST:
		rps__raft_become_follower(r, r->term, RPS__RAFT_NONE);
		break;
	case VOTE_PENDING:
		break;
	}
	return 0;
}

static void handle_vote_request(struct rps__raft *r, const struct rps__raft_msg *m)
{
	uint8_t resp_type = m->type == RPS__RAFT_MSG_VOTE ? RPS__RAFT_MSG_VOTE_RESP : RPS__RAFT_MSG_PRE_VOTE_RESP;
	bool can_vote = r->vote == m->from ||
			/* not voted, and no leader known in this term */
			(r->vote == RPS__RAFT_NONE && r->lead == RPS__RAFT_NONE) ||
			/* a PreVote for a future term commits us to nothing */
			(m->type == RPS__RAFT_MSG_PRE_VOTE && m->term > r->term);
	struct rps__raft_msg *resp;

	if (can_vote && rps__raft_log_up_to_date(&r->log, m->index, m->log_term)) {
		resp = rps__raft_msg_push(r, resp_type, m->from);
		if (!resp)
			return;
		resp->term = m->term;
		if (m->type == RPS__RAFT_MSG_VOTE) {
			r->election_elapsed = 0;
			r->vote = m->from;
		}
	} else {
		resp = rps__raft_msg_push(r, resp_type, m->from);
		if (!resp)
			return;
		resp->reject = 1;
	}
}

/* Is m from a node we may hear?  Our configuration may lag behind the
 * leader's, so (Raft thesis 4.1) appends from a leader and vote requests from
 * a candidate it does not list yet are heard; anything else from a
 * non-member answers a message we never sent it (or comes from the leader we
 * follow). */
static bool sender_known(const struct rps__raft *r, const struct rps__raft_msg *m)
{
	if (rps__raft_conf_is_voter(&r->conf, m->from) || rps__raft_conf_is_learner(&r->conf, m->from))
		return true;
	switch (m->type) {
	case RPS__RAFT_MSG_APP:
	case RPS__RAFT_MSG_HEARTBEAT:
	case RPS__RAFT_MSG_SNAP:
	case RPS__RAFT_MSG_VOTE:
	case RPS__RAFT_MSG_PRE_VOTE:
		return true;
	default:
		return r->lead != RPS__RAFT_NONE && m->from == r->lead;
	}
}

/* Why m must be dropped before it touches anything: NULL if it may be
 * stepped, "" for a stranger's message (dropped quietly), else what is wrong
 * with it (values no correct peer sends, and that would leave persisted
 * state the node cannot continue or restart from). */
/*
 * What a real leader's append always is: entries at index+1, index+2...,
 * terms from log_term up, never past the message's term. Anything else
 * would be persisted as a log the WAL refuses to reopen (terms going down),
 * so one forged message could brick the node for good.
 */
static bool app_entries_ordered(const struct rps__raft_msg *m)
{
	uint64_t prev = m->log_term;

	if (m->n_entries && m->index > INDEX_MAX - m->n_entries)
		return false;
	for (uint32_t i = 0; i < m->n_entries; i++) {
		const struct rps__raft_entry *e = &m->entries[i];

		if (e->term < prev || e->term > m->term)	/* (indexes: checked in append) */
			return false;
		prev = e->term;
	}
	return true;
}

static const char *refuse_reason(const struct rps__raft *r, const struct rps__raft_msg *m)
{
	if (m->term > TERM_MAX)
		return "its term cannot be incremented";
	if (!sender_known(r, m))
		return "";
	if (m->type == RPS__RAFT_MSG_SNAP && m->snapshot &&
	    (m->snapshot->term > m->term || m->snapshot->index > INDEX_MAX))
		return "its snapshot is from a later term or at an impossible index";
	/* the codec checks this too, but the core sizes its tallies by it */
	if (m->type == RPS__RAFT_MSG_SNAP && m->snapshot &&
	    !rps__raft_conf_fits(m->snapshot->conf.n_voters, m->snapshot->conf.n_learners))
		return "its snapshot's configuration has too many voters or nodes";
	if (m->type == RPS__RAFT_MSG_APP && !app_entries_ordered(m))
		return "its entries' terms go down or pass the message's term";
	if (m->type == RPS__RAFT_MSG_APP_RESP && !m->reject && r->role == RPS__RAFT_LEADER &&
	    m->term == r->term && m->index > rps__raft_log_last(&r->log))
		return "it acknowledges entries beyond the leader's log";
	return NULL;
}

/* The term check common to every role (as etcd-raft's Step): a newer term
 * makes us a follower (unless a vote request meets a leader's lease), an
 * older one gets at most an answer.  True if that consumed m. */
static bool step_term(struct rps__raft *r, const struct rps__raft_msg *m)
{
	if (m->term > r->term) {
		if (m->type == RPS__RAFT_MSG_VOTE || m->type == RPS__RAFT_MSG_PRE_VOTE) {
			bool forced = m->flags & RPS__RAFT_MSG_F_TRANSFER;
			bool in_lease = r->cfg.check_quorum && r->lead != RPS__RAFT_NONE &&
					r->election_elapsed < r->cfg.election_ticks;

			/* we heard from a leader within the minimum election
			 * timeout: do not let a node that cannot hear it (or
			 * was removed) depose it */
			if (!forced && in_lease)
				return true;
		}
		if (m->type == RPS__RAFT_MSG_PRE_VOTE) {
			/* never change term for a PreVote */
		} else if (m->type == RPS__RAFT_MSG_PRE_VOTE_RESP && !m->reject) {
			/* granted for the term we would campaign in: we move
			 * there when we win the PreVote */
		} else if (m->type == RPS__RAFT_MSG_APP || m->type == RPS__RAFT_MSG_HEARTBEAT ||
			   m->type == RPS__RAFT_MSG_SNAP) {
			rps__raft_become_follower(r, m->term, m->from);
		} else {
			rps__raft_become_follower(r, m->term, RPS__RAFT_NONE);
		}
	} else if (m->term < r->term) {
		if ((r->cfg.check_quorum || r->cfg.pre_vote) &&
		    (m->type == RPS__RAFT_MSG_HEARTBEAT || m->type == RPS__RAFT_MSG_APP)) {
			/* A stale leader (or one cut off by a node whose term
			 * ran ahead while it could not win): answer with our
			 * term so it steps down instead of the cluster
			 * waiting on it forever. */
			rps__raft_msg_push(r, RPS__RAFT_MSG_APP_RESP, m->from);
		} else if (m->type == RPS__RAFT_MSG_PRE_VOTE) {
			struct rps__raft_msg *resp = rps__raft_msg_push(r, RPS__RAFT_MSG_PRE_VOTE_RESP, m->from);

			if (resp)
				resp->reject = 1;
		}
		return true;
	}
	return false;
}

int rps__raft_step(struct rps__raft *r, const struct rps__raft_msg *m)
{
	const char *why;
	int err = 0;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: step while a ready is outstanding: call advance first");
	if (m->type < RPS__RAFT_MSG_APP || m->type > RPS__RAFT_MSG_TYPE_MAX || m->from == RPS__RAFT_NONE ||
	    (m->n_entries && !m->entries))
		return rps__seterr(-EINVAL, "raft %llu: message of type %u from %llu is invalid",
				   (unsigned long long)r->id, m->type, (unsigned long long)m->from);
	if (m->to != r->id)
		return rps__seterr(-EINVAL, "raft %llu: message for %llu delivered here",
				   (unsigned long long)r->id, (unsigned long long)m->to);
	if (m->from == r->id)
		return 0;
	why = refuse_reason(r, m);
	if (why) {
		r->refused++;
		if (!*why)
			return 0;	/* a stranger's answer: routine around membership changes */
		return rps__seterr(-EPROTO, "raft %llu: dropped %s from %llu (term %llu): %s",
				   (unsigned long long)r->id, rps__raft_msg_type_name(m->type),
				   (unsigned long long)m->from, (unsigned long long)m->term, why);
	}

	if (step_term(r, m))
		return r->broken;

	switch (m->type) {
	case RPS__RAFT_MSG_VOTE:
	case RPS__RAFT_MSG_PRE_VOTE:
		handle_vote_request(r, m);
		break;
	default:
		switch (r->role) {
		case RPS__RAFT_LEADER:
			step_leader(r, m);
			break;
		case RPS__RAFT_CANDIDATE:
		case RPS__RAFT_PRE_CANDIDATE:
			err = step_candidate(r, m);
			break;
		case RPS__RAFT_FOLLOWER:
			err = step_follower(r, m);
			break;
		}
	}
	return r->broken ? r->broken : err;
}

/* ------------------------------------------------------------------------ */
/* ticks */

static void tick_leader(struct rps__raft *r)
{
	r->heartbeat_elapsed++;
	r->election_elapsed++;
	if (r->election_elapsed >= r->cfg.election_ticks) {
		r->election_elapsed = 0;
		if (r->cfg.check_quorum && !rps__raft_quorum_active(r)) {
			/* we cannot reach a quorum: stop serving reads and
			 * accepting writes that can never commit */
			rps__raft_become_follower(r, r->term, RPS__RAFT_NONE);
			return;
		}
		/* a transfer that did not finish in an election timeout failed */
		abort_transfer(r);
	}
	for (unsigned i = 0; i < r->n_prs; i++) {
		struct progress *pr = &r->prs[i];

		/* the snapshot, or its answer, was lost: probe again */
		if (pr->state == RPS__RAFT_PROGRESS_SNAPSHOT && ++pr->snapshot_ticks >= r->cfg.election_ticks) {
			rps__raft_pr_reset_state(pr, RPS__RAFT_PROGRESS_PROBE);
			pr->next = pr->match + 1;
		}
	}
	if (r->heartbeat_elapsed >= r->cfg.heartbeat_ticks) {
		r->heartbeat_elapsed = 0;
		bcast_heartbeat(r, r->n_reads ? r->reads[r->n_reads - 1].ctx : 0);
	}
}

int rps__raft_tick(struct rps__raft *r)
{
	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: tick while a ready is outstanding: call advance first");
	if (r->role == RPS__RAFT_LEADER) {
		tick_leader(r);
	} else {
		r->election_elapsed++;
		if (rps__raft_promotable(r) && r->election_elapsed >= r->randomized_timeout) {
			r->election_elapsed = 0;
			hup(r, false);
		}
	}
	return r->broken;
}

int rps__raft_campaign(struct rps__raft *r)
{
	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: campaign while a ready is outstanding");
	if (!rps__raft_promotable(r))
		return rps__seterr(-EPERM, "raft %llu: not a voter, cannot campaign", (unsigned long long)r->id);
	if (r->term >= TERM_MAX)
		return rps__seterr(-EOVERFLOW, "raft %llu: term %llu is the last one: no campaign can follow it",
				   (unsigned long long)r->id, (unsigned long long)r->term);
	hup(r, false);
	return r->broken;
}
