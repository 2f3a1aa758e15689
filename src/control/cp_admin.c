/*
 * cp_admin.c - psctl's requests (move, add-server, remove-server,
 * forget-lost, transfer-leader, status) and the leader's membership duties:
 * proposals are answered once the log has decided them.
 */
#include "config.h"
#include "common/common.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* ---- psctl -------------------------------------------------------------------- */

static void admin_reply(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, int status,
			uint64_t index, uint64_t epoch, const char *msg)
{
	struct rps__admin_rep rep;

	memset(&rep, 0, sizeof(rep));
	rep.leader = rps__rnode_leader(cp->rnode);
	rep.index = index;
	rep.epoch = epoch;
	if (msg)
		snprintf(rep.msg, sizeof(rep.msg), "%s", msg);
	cp->dp->conn_reply(c, RPS__MSG_ADMIN_REP, req_id, status, &rep, sizeof(rep));
}

static void admin_done(struct rps__cplane *cp, uint32_t i, int status, uint64_t epoch, const char *msg)
{
	struct admin_wait *a = &cp->admin[i];

	admin_reply(cp, a->conn, a->req_id, status, cp->map.applied, epoch, msg);
	cp->admin[i] = cp->admin[--cp->nadmin];
}

void rps__cp_admin_conn_gone(struct rps__cplane *cp, struct srv_conn *c)
{
	uint32_t i = 0;

	while (i < cp->nadmin) {
		if (cp->admin[i].conn == c) {
			cp->admin[i] = cp->admin[--cp->nadmin];
			continue;
		}
		i++;
	}
}

static bool in_conf(const struct rps__raft_status *st, uint64_t id)
{
	return rps__raft_conf_is_voter(&st->conf, id) || rps__raft_conf_is_learner(&st->conf, id);
}

/* Settle the psctl requests that the log has now decided. */
void rps__cp_admin_map_changed(struct rps__cplane *cp)
{
	struct rps__raft_status st;
	uint32_t i = 0;

	if (!cp->rnode)
		return;
	rps__rnode_status(cp->rnode, &st);
	while (i < cp->nadmin) {
		struct admin_wait *a = &cp->admin[i];
		const struct rps__smap_part *mp = a->op == RPS__ADMIN_MOVE ? &cp->map.parts[a->part] : NULL;
		char msg[200];

		switch (a->op) {
		case RPS__ADMIN_MOVE:
			if (mp->owner == a->id && mp->epoch > a->epoch) {
				admin_done(cp, i, 0, mp->epoch, NULL);
				continue;
			}
			/* (not by epoch: a replica set change on the way, the
			 * destination dropped as a failed backup, moves it on) */
			if (!mp->moving_to && cp->map.applied >= a->index) {
				snprintf(msg, sizeof(msg), "move of partition %u to member %llu was aborted: the destination did not install it in time, failed, or, a backup, did not confirm the owner's updates (see their logs)",
					 a->part, (unsigned long long)a->id);
				admin_done(cp, i, -ECANCELED, mp->epoch, msg);
				continue;
			}
			break;
		case RPS__ADMIN_ADD_SERVER:
			if (rps__smap_member(&cp->map, a->id) && in_conf(&st, a->id)) {
				admin_done(cp, i, 0, 0, NULL);
				continue;
			}
			break;
		case RPS__ADMIN_REMOVE_SERVER:
			if (!rps__smap_member(&cp->map, a->id) && !in_conf(&st, a->id)) {
				admin_done(cp, i, 0, 0, NULL);
				continue;
			}
			break;
		case RPS__ADMIN_FORCE_REMOVE:
			if (!rps__smap_member(&cp->map, a->id) && !in_conf(&st, a->id)) {
				admin_done(cp, i, 0, 0, NULL);
				continue;
			}
			break;
		case RPS__ADMIN_NOP:
		case RPS__ADMIN_FORGET_LOST:
		case RPS__ADMIN_SET_REPLICAS:
			if (cp->map.applied >= a->index) {
				if (rps__rnode_term_at(cp->rnode, a->index) == a->term)
					admin_done(cp, i, 0, 0, NULL);
				else
					admin_done(cp, i, -ECANCELED, 0, "the entry was overwritten by a new leader: retry");
				continue;
			}
			break;
		case RPS__ADMIN_TRANSFER_LEADER:
			if (st.leader && st.leader != cp->my_id) {
				admin_done(cp, i, 0, st.leader, NULL);
				continue;
			}
			break;
		}
		i++;
	}
}

static int admin_wait_add(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__admin *a,
			  uint64_t epoch, uint64_t index)
{
	struct admin_wait *w;

	if (rps__grow(&cp->admin, &cp->admin_cap, cp->nadmin + 1, sizeof(*cp->admin), 8))
		return -ENOMEM;
	w = &cp->admin[cp->nadmin++];
	*w = (struct admin_wait){
		.conn = c, .req_id = req_id, .op = a->op, .part = a->part, .id = a->id, .epoch = epoch,
		.index = index, .deadline = rps__now_ns() + ms_ns(a->timeout_ms ? a->timeout_ms : 30000),
	};
	return 0;
}

/* A member's address goes to every client and server in the map: one that
 * does not parse (or holds control bytes) would be carried there for good.
 * Refuse it with a line; true if it is fine. */
static bool admin_uri_ok(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__admin *a)
{
	struct rps__uri u;
	size_t k, n = strlen(a->uri);
	bool ok = n < RPS__SMAP_URI_MAX && rps__uri_parse(a->uri, &u) == 0 && rps__smap_uri_ok(a->uri);
	char esc[4 * sizeof(a->uri)], msg[200];

	for (k = 0; ok && k < n; k++)
		ok = (unsigned char)a->uri[k] >= 0x21 && (unsigned char)a->uri[k] <= 0x7e;
	if (ok)
		return true;
	snprintf(msg, sizeof(msg), "bad address '%.100s' for member %llu: give tcp://HOST:PORT or verbs://ADDR:PORT",
		 rps__escape(a->uri, esc, sizeof(esc)), (unsigned long long)a->id);
	rps__log(RPS__LOG_WARN, "admin %s: add-server: %s", cp->dp->conn_name(c), msg);
	admin_reply(cp, c, req_id, -EINVAL, 0, 0, msg);
	return false;
}

/* forget-lost: one CLEAR_LOST per lost partition (or the one named); the
 * answer waits for the last. */
static void admin_forget_lost(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__admin *a)
{
	struct rps__smap_cmd cmd;
	uint64_t index = 0, term = 0;
	uint32_t p, n = 0;
	int ret;

	memset(&cmd, 0, sizeof(cmd));
	for (p = 0; p < cp->map.npart; p++) {
		if (!cp->map.parts[p].lost || (a->part != UINT32_MAX && a->part != p))
			continue;
		cmd.type = RPS__SMAP_CLEAR_LOST;
		cmd.part = p;
		cmd.epoch = cp->map.parts[p].epoch;
		ret = rps__cp_propose_here(cp, &cmd, &index, &term);
		if (ret) {
			admin_reply(cp, c, req_id, ret, 0, 0, rps__errbuf());
			return;
		}
		n++;
	}
	if (!n) {
		admin_reply(cp, c, req_id, -ENOENT, 0, 0, a->part == UINT32_MAX ? "no partition is lost" :
			    "that partition is not lost");
		return;
	}
	if (admin_wait_add(cp, c, req_id, a, 0, index))
		admin_reply(cp, c, req_id, -ENOMEM, 0, 0, "out of memory");
	else
		cp->admin[cp->nadmin - 1].term = term;
	/* processed by the loop's turn after this batch of messages */
}

/* transfer-leader: to the member named, or the voter most up to date. */
static void admin_transfer_leader(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id,
				  const struct rps__admin *a, const struct rps__raft_status *st)
{
	uint64_t to = a->id, best = 0;
	uint32_t i;
	int ret;

	if (!to) {
		for (i = 0; i < st->conf.n_voters; i++) {
			struct rps__raft_progress_info pi;
			uint64_t v = st->conf.voters[i];
			if (v == cp->my_id || rps__rnode_progress(cp->rnode, v, &pi))
				continue;
			if (!to || pi.match > best) {
				to = v;
				best = pi.match;
			}
		}
	}
	if (!to || to == cp->my_id || !rps__raft_conf_is_voter(&st->conf, to)) {
		admin_reply(cp, c, req_id, -EINVAL, 0, 0, "no other voter to hand leadership to");
		return;
	}
	ret = rps__rnode_transfer_leader(cp->rnode, to);
	if (ret) {
		admin_reply(cp, c, req_id, ret, 0, 0, rps__errbuf());
		return;
	}
	if (admin_wait_add(cp, c, req_id, a, 0, 0))
		admin_reply(cp, c, req_id, -ENOMEM, 0, 0, "out of memory");
}

/* Propose the command and answer once the log has decided it. */
static void admin_propose(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__admin *a,
			  const struct rps__smap_cmd *cmd, uint64_t epoch)
{
	uint64_t index = 0, term = 0;
	int ret;

	ret = rps__smap_check(&cp->map, cmd);
	if (!ret)
		ret = rps__cp_propose_here(cp, cmd, &index, &term);
	if (ret) {
		admin_reply(cp, c, req_id, ret, 0, 0, rps__errbuf());
		return;
	}
	if (admin_wait_add(cp, c, req_id, a, epoch, index))
		admin_reply(cp, c, req_id, -ENOMEM, 0, 0, "out of memory");
	else
		cp->admin[cp->nadmin - 1].term = term;
	/* Not processed here: the server loop's turn right after this batch
	 * of messages does it (cplane.c, run_timers), so proposals that
	 * arrived together go out as one append and one WAL sync. */
}

/* Tests compare replicas: what this server holds of a tensor's partition. */
static void admin_digest(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__admin *a)
{
	struct rps__admin_rep rep;
	char name[sizeof(a->uri)];
	uint32_t crc = 0, nsh = 0;
	int ret;

	memset(&rep, 0, sizeof(rep));
	memcpy(name, a->uri, sizeof(name));
	name[sizeof(name) - 1] = '\0';
	ret = cp->dp->part_digest ? cp->dp->part_digest(cp->srv, name, a->part, &crc, &rep.epoch, &nsh) : -ENOTSUP;
	rep.index = crc;
	rep.leader = nsh;
	if (ret)
		snprintf(rep.msg, sizeof(rep.msg), "nothing of tensor '%s' partition %u here", name, a->part);
	cp->dp->conn_reply(c, RPS__MSG_ADMIN_REP, req_id, ret, &rep, sizeof(rep));
}

/* Is id a backup of a partition, or being seeded as one? */
static bool holds_replicas(const struct rps__smap *m, uint64_t id)
{
	for (uint32_t p = 0; p < m->npart; p++)
		if (m->parts[p].joining == id || rps__smap_role(m, p, id) == RPS__SMAP_ROLE_BACKUP)
			return true;
	return false;
}

void rps__cp_on_admin(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__admin *a)
{
	struct rps__smap_cmd cmd;
	struct rps__raft_status st;
	uint64_t epoch = 0;

	if (a->op == RPS__ADMIN_DIGEST) {
		admin_digest(cp, c, req_id, a);
		return;
	}
	if (!rps__rnode_is_leader(cp->rnode)) {
		admin_reply(cp, c, req_id, -EPERM, 0, 0, "not the leader: ask the leader");
		return;
	}
	memset(&cmd, 0, sizeof(cmd));
	rps__rnode_status(cp->rnode, &st);
	switch (a->op) {
	case RPS__ADMIN_MOVE:
		if (a->part >= cp->map.npart) {
			admin_reply(cp, c, req_id, -EINVAL, 0, 0, "no such partition");
			return;
		}
		cmd.type = RPS__SMAP_MOVE_BEGIN;
		cmd.part = a->part;
		cmd.from = cp->map.parts[a->part].owner;
		cmd.to = a->id;
		cmd.epoch = epoch = cp->map.parts[a->part].epoch;
		if (cmd.from == cmd.to && !cp->map.parts[a->part].moving_to) {
			admin_reply(cp, c, req_id, 0, cp->map.applied, epoch, NULL);
			return;
		}
		break;
	case RPS__ADMIN_ADD_SERVER:
		if (!admin_uri_ok(cp, c, req_id, a))
			return;
		if (rps__smap_member(&cp->map, a->id) && !strcmp(rps__smap_member(&cp->map, a->id)->uri, a->uri)) {
			/* already a member: wait for the learner to be added */
			if (admin_wait_add(cp, c, req_id, a, 0, cp->map.applied))
				admin_reply(cp, c, req_id, -ENOMEM, 0, 0, "out of memory");
			rps__cp_admin_map_changed(cp);
			return;
		}
		cmd.type = RPS__SMAP_ADD_MEMBER;
		cmd.id = a->id;
		snprintf(cmd.uri, sizeof(cmd.uri), "%s", a->uri);
		break;
	case RPS__ADMIN_REMOVE_SERVER:
		if (a->id == cp->my_id) {
			admin_reply(cp, c, req_id, -EBUSY, 0, 0,
				    "this server leads the group: transfer leadership first (psctl transfer-leader)");
			return;
		}
		if (!rps__smap_member(&cp->map, a->id)) {
			if (in_conf(&st, a->id))
				rps__rnode_conf_change(cp->rnode, RPS__RAFT_CONF_REMOVE, a->id, NULL);
			if (admin_wait_add(cp, c, req_id, a, 0, cp->map.applied))
				admin_reply(cp, c, req_id, -ENOMEM, 0, 0, "out of memory");
			rps__cp_admin_map_changed(cp);
			return;
		}
		if (!rps__smap_owned(&cp->map, a->id) && holds_replicas(&cp->map, a->id)) {
			/* its backup roles go elsewhere first: the leader's
			 * placement (repl_place.c) seeds replacements, then
			 * proposes REMOVE_MEMBER; we answer when it is out */
			rps__log(RPS__LOG_INFO, "remove-server %llu: moving its backups to other members first",
				 (unsigned long long)a->id);
			cp->removing = a->id;
			cp->removing_next = 0;
			cp->replica_kick = true;
			if (admin_wait_add(cp, c, req_id, a, 0, cp->map.applied))
				admin_reply(cp, c, req_id, -ENOMEM, 0, 0, "out of memory");
			return;
		}
		cmd.type = RPS__SMAP_REMOVE_MEMBER;
		cmd.id = a->id;
		break;
	case RPS__ADMIN_NOP:
		cmd.type = RPS__SMAP_NOP;
		break;
	case RPS__ADMIN_FORCE_REMOVE:
		if (a->id == cp->my_id) {
			admin_reply(cp, c, req_id, -EBUSY, 0, 0,
				    "this server leads the group: transfer leadership first (psctl transfer-leader)");
			return;
		}
		cmd.type = RPS__SMAP_FORCE_REMOVE;
		cmd.id = a->id;
		break;
	case RPS__ADMIN_SET_REPLICAS:
		cmd.type = RPS__SMAP_SET_REPLICAS;
		cmd.id = a->id;
		break;
	case RPS__ADMIN_FORGET_LOST:
		admin_forget_lost(cp, c, req_id, a);
		return;
	case RPS__ADMIN_TRANSFER_LEADER:
		admin_transfer_leader(cp, c, req_id, a, &st);
		return;
	default:
		admin_reply(cp, c, req_id, -EINVAL, 0, 0, "unknown admin operation");
		return;
	}
	admin_propose(cp, c, req_id, a, &cmd, epoch);
}

/* The reply lists the Raft group's nodes, and they are the map's members:
 * rps__cp_leader_membership adds every member and removes every other node
 * (one change at a time, so for a moment there may be one more: the loops
 * below stop at the reply's arrays).  So the map's bound is the reply's; the
 * core's (RPS__RAFT_MAX_NODES) is larger, for clusters the map cannot hold
 * yet, and does not change the reply. */
_Static_assert(RPS__STATUS_MAX_NODES >= RPS__SMAP_MAX_MEMBERS,
	       "a STATUS reply names every Raft node of the largest map");
_Static_assert(sizeof(struct rps__msg_hdr) + sizeof(struct rps__status_rep) + RPS__SMAP_ENC_MAX <= RPS__BIG_MSG_MAX,
	       "STATUS_REP with the largest map fits an admin connection's message");

void rps__cp_on_status(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id)
{
	static char buf[sizeof(struct rps__status_rep) + RPS__SMAP_ENC_MAX];
	struct rps__status_rep *rep = (void *)buf;
	struct rps__raft_status st;
	struct rps__dp_stats ds;
	size_t len = 0;
	uint32_t i, k = 0;

	memset(buf, 0, sizeof(*rep));
	rps__rnode_status(cp->rnode, &st);
	rep->id = cp->my_id;
	rep->term = st.term;
	rep->vote = st.vote;
	rep->leader = st.leader;
	rep->commit = st.commit;
	rep->applied = st.applied;
	rep->last_index = st.last_index;
	rep->snapshot_index = st.snapshot_index;
	rep->role = st.role;
	rep->n_voters = st.conf.n_voters;
	rep->n_learners = st.conf.n_learners;
	for (i = 0; i < st.conf.n_voters && i < RPS__STATUS_MAX_NODES; i++) {
		struct rps__raft_progress_info pi = { 0 };
		rep->voters[i] = st.conf.voters[i];
		if (!rps__rnode_progress(cp->rnode, st.conf.voters[i], &pi))
			rep->match[k] = pi.match;
		k++;
	}
	for (i = 0; i < st.conf.n_learners && i < RPS__STATUS_MAX_NODES; i++) {
		struct rps__raft_progress_info pi = { 0 };
		rep->learners[i] = st.conf.learners[i];
		if (k < RPS__STATUS_MAX_NODES && !rps__rnode_progress(cp->rnode, st.conf.learners[i], &pi))
			rep->match[k] = pi.match;
		k++;
	}
	cp->dp->stats(cp->srv, &ds);
	rep->n_conns = ds.n_conns;
	for (i = 0; i < cp->npeers; i++)
		rep->n_peers += cp->peers[i].c && !cp->dp->conn_dead(cp->peers[i].c);
	rep->flags = rps__cp_balance_pending(cp) ? RPS__STATUS_BALANCING : 0;
	rep->tensors = ds.tensors;
	rep->shards = ds.shards;
	rep->shard_bytes = ds.shard_bytes;
	rep->fsync = !cp->cfg.fsync_none;
	if (cp->map.npart && rps__smap_encode(&cp->map, buf + sizeof(*rep), sizeof(buf) - sizeof(*rep), &len))
		len = 0;
	cp->dp->conn_reply(c, RPS__MSG_STATUS_REP, req_id, 0, buf, sizeof(*rep) + len);
}

/* psctl remove-rank: the data plane's business; psctl asks every member. */
void rps__cp_on_rank(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__rank_req *req)
{
	struct rps__rank_rep rep;
	int ret;

	memset(&rep, 0, sizeof(rep));
	ret = cp->dp->rank_remove(cp->srv, req->name, req->rank);
	if (ret < 0)
		snprintf(rep.msg, sizeof(rep.msg), "%s", rps__errbuf());
	else
		rep.tensors = (uint32_t)ret;
	cp->dp->conn_reply(c, RPS__MSG_RANK_REP, req_id, ret < 0 ? ret : 0, &rep, sizeof(rep));
}

/* ---- timers ------------------------------------------------------------------- */

/* Leader: members of the map join the Raft group as learners, learners that
 * caught up become voters while there are fewer than 3 (5 from 5 members),
 * and servers that left the map leave the group.  One change at a time. */
void rps__cp_leader_membership(struct rps__cplane *cp)
{
	struct rps__raft_status st;
	uint32_t i, target;

	if (!rps__rnode_is_leader(cp->rnode))
		return;
	rps__rnode_status(cp->rnode, &st);
	/* A member that joins later is sent the snapshot and the log after
	 * it: one taken now, not the bootstrap snapshot (which holds no map
	 * in a log formed before the map went into it). */
	if (st.snapshot_index <= 1 && st.applied > 1 && rps__rnode_compact(cp->rnode))
		rps__log(RPS__LOG_WARN, "raft: %s", rps__errbuf());
	target = cp->map.nmembers >= 5 ? 5 : cp->map.nmembers >= 3 ? 3 : cp->map.nmembers;
	for (i = 0; i < cp->map.nmembers; i++) {
		uint64_t id = cp->map.members[i].id;
		if (!in_conf(&st, id)) {
			rps__rnode_conf_change(cp->rnode, RPS__RAFT_CONF_ADD_LEARNER, id, NULL);
			return;
		}
	}
	for (i = 0; i < st.conf.n_voters; i++)
		if (!rps__smap_member(&cp->map, st.conf.voters[i]) && st.conf.voters[i] != cp->my_id) {
			rps__rnode_conf_change(cp->rnode, RPS__RAFT_CONF_REMOVE, st.conf.voters[i], NULL);
			return;
		}
	for (i = 0; i < st.conf.n_learners; i++)
		if (!rps__smap_member(&cp->map, st.conf.learners[i])) {
			rps__rnode_conf_change(cp->rnode, RPS__RAFT_CONF_REMOVE, st.conf.learners[i], NULL);
			return;
		}
	if (st.conf.n_voters < target)
		for (i = 0; i < st.conf.n_learners; i++) {
			struct rps__raft_progress_info pi;
			if (!rps__rnode_progress(cp->rnode, st.conf.learners[i], &pi) && pi.match >= st.commit) {
				rps__rnode_conf_change(cp->rnode, RPS__RAFT_CONF_PROMOTE, st.conf.learners[i], NULL);
				return;
			}
		}
}

/* psctl requests whose deadline passed: answered, though the operation may
 * still complete. */
void rps__cp_admin_timeouts(struct rps__cplane *cp, uint64_t now)
{
	uint32_t i;

	for (i = 0; i < cp->nadmin;) {
		if (now >= cp->admin[i].deadline) {
			admin_done(cp, i, -ETIMEDOUT, 0, "timed out waiting for the cluster: the operation may still complete; check psctl status");
			continue;
		}
		i++;
	}
}
