/*
 * cp_map.c - applying the shard map: the Raft node's callbacks (apply,
 * restore, snapshot, send), bringing what this server serves in line with
 * the map (reconcile), publishing the map to workers, and proposals.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* ---- the map as workers see it -------------------------------------------- */

_Static_assert(RPS__SMAP_ENC_MAX + 4u <= RPS__MAP_BUF, "an encoded map fits the buffer workers READ");

_Static_assert(4 + RPS__SMAP_ENC_MAX <= RPS__MAP_BUF - sizeof(struct rps__quorum_note),
	       "the longest map leaves the quorum note alone");

/* Workers READ the encoded map one-sidedly; its crc tells them a read that
 * raced with this copy (they read again). */
void rps__cp_map_publish(struct rps__cplane *cp)
{
	char tmp[RPS__MAP_BUF];
	size_t len = 0;
	uint32_t len32;

	if (!cp->map.npart)
		return;
	/* [u32 length][encoded map]: the map's crc catches a torn read */
	if (rps__smap_encode(&cp->map, tmp + 4, sizeof(tmp) - 4, &len)) {
		rps__log(RPS__LOG_ERROR, "encoding the shard map: %s", rps__errbuf());
		return;
	}
	len32 = (uint32_t)len;
	memcpy(tmp, &len32, 4);
	memset(tmp + 4 + len, 0, sizeof(tmp) - 4 - len - sizeof(struct rps__quorum_note));
	/* (the note at the end is repl_failover.c's) */
	memcpy(cp->mapbuf, tmp, sizeof(tmp) - sizeof(struct rps__quorum_note));
}

/* ---- what the data plane serves by ------------------------------------------ */

void rps__cp_part_sync(struct rps__cplane *cp, uint32_t p)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];
	const struct part_local *pl = &cp->parts[p];
	struct rps__dp_part v = {
		.epoch = pl->epoch, .map_epoch = mp->epoch, .serving = rps__cp_serving(cp, p),
		.lost = rps__cp_lost(cp, p),
		.incoming = pl->st == PART_INCOMING || mp->moving_to == cp->my_id,
	};
	uint32_t k;

	v.owned_lost = mp->owner == cp->my_id && v.lost;
	/* seeding a backup: tensors created meanwhile get their region here too */
	v.incoming |= pl->st == PART_SEED_FENCING || pl->st == PART_SEED_SHIPPED;
	/* the replica set: who streams to whom (src/server/repl_stream.c) */
	v.primary = mp->owner;
	for (k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++)
		if (mp->backups[k]) {
			v.backups[v.nbackups++] = mp->backups[k];
			v.backup |= mp->backups[k] == cp->my_id;
		}
	v.joining = mp->joining;
	v.backup |= mp->joining && mp->joining == cp->my_id;
	v.seeded = mp->joining && mp->joining == cp->my_id && pl->st == PART_SEEDING && pl->installed;
	cp->dp->part_set(cp->srv, p, &v);
}

/* rps__cp_part_sync of every partition, after the map changed */
static void parts_sync_all(struct rps__cplane *cp)
{
	uint32_t p;

	cp->dp->set_map(cp->srv, cp->map.npart, cp->map.applied);
	for (p = 0; p < cp->map.nmembers; p++)
		if (cp->dp->repl_peer && cp->map.members[p].id != cp->my_id)
			cp->dp->repl_peer(cp->srv, cp->map.members[p].id, cp->map.members[p].uri);
	for (p = 0; p < RPS__SMAP_MAX_PART; p++)
		rps__cp_part_sync(cp, p);
}

/* ---- applying the map ----------------------------------------------------- */

/* Does the map list us as a backup of p?  (A joiner is seeded first.) */
static bool backs_up(const struct rps__cplane *cp, uint32_t p)
{
	for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++)
		if (cp->map.parts[p].backups[k] == cp->my_id)
			return true;
	return false;
}

/* p is not ours to serve; the map made us one of its backups when the
 * cluster began (seeded ones, and backups dropped from the set, are
 * repl_place.c's).  A restart took what we held: never promote an empty
 * copy (it stays PART_NONE: we leave the set, cp_moves.c). */
static void backup_reconcile(struct rps__cplane *cp, uint32_t p)
{
	cp->parts[p].epoch = cp->map.parts[p].epoch;
	if (!cp->restarted)
		cp->parts[p].st = PART_BACKUP;
}

/* Bring what this server does with partition p in line with the map. */
static void reconcile_part(struct rps__cplane *cp, uint32_t p, uint64_t now)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];
	struct part_local *pl = &cp->parts[p];

	if (rps__cp_replica_reconcile(cp, p, now))	/* seeding, backups (repl_place.c) */
		return;
	if (mp->owner == cp->my_id && !mp->moving_to) {
		if (pl->st == PART_BACKUP) {
			/* a FAILOVER made us primary: what the stream gave us is it */
			rps__log(RPS__LOG_INFO, "partition %u: promoted from backup to primary (epoch %llu)", p,
				 (unsigned long long)mp->epoch);
			cp->dp->part_promote(cp->srv, p, mp->epoch);
		} else if (pl->st == PART_LEAVING || pl->st == PART_SHIPPED) {
			rps__log(RPS__LOG_INFO, "partition %u: move aborted, serving it again", p);
			rps__cp_blob_free(cp, pl);
			cp->dp->part_unfence(cp->srv, p, mp->epoch);
		} else if (pl->st == PART_INCOMING) {
			cp->dp->part_publish(cp->srv, p, mp->epoch);
			rps__log(RPS__LOG_INFO, "partition %u is ours now (epoch %llu)", p,
				 (unsigned long long)mp->epoch);
		} else if (pl->st != PART_ACTIVE && (mp->lost || pl->gone || (cp->restarted && !pl->cleared))) {
			/* A restart took what was in memory: refuse it (never
			 * zeros) until restored or accepted empty. */
			if (!mp->lost && !pl->gone && cp->rnode && mp->backups[0])	/* (after replay: below) */
				rps__log(RPS__LOG_WARN, "partition %u: restarted without it: failing over to its backup,"
					 " member %llu", p, (unsigned long long)mp->backups[0]);
			else if (!mp->lost && !pl->gone && cp->rnode)
				rps__log(RPS__LOG_ERROR, "partition %u lost with member %llu (restarted): restore it"
					 " (psctl restore NAME) or accept it empty (psctl forget-lost %u)", p,
					 (unsigned long long)cp->my_id, p);
			pl->gone = !mp->lost;
			pl->st = PART_NONE;
			pl->epoch = mp->epoch;
			return;
		} else if (pl->st != PART_ACTIVE) {
			/* (bootstrap, or a lost partition accepted empty) */
			cp->dp->part_create(cp->srv, p);
		} else if (pl->epoch != mp->epoch) {
			/* still ours, its replica set changed (REPLICA_DROP): the
			 * headers workers READ must carry the epoch they now name */
			cp->dp->part_publish(cp->srv, p, mp->epoch);
		}
		pl->st = PART_ACTIVE;
		pl->epoch = mp->epoch;
		return;
	}
	if (mp->owner == cp->my_id && mp->moving_to) {
		if (pl->st == PART_ACTIVE || pl->st == PART_NONE) {
			pl->st = PART_LEAVING;
			pl->epoch = mp->epoch;
			pl->to = mp->moving_to;
			pl->switching = rps__smap_role(&cp->map, p, pl->to) == RPS__SMAP_ROLE_BACKUP;
			pl->next_try = 0;
			pl->give_up = now + ms_ns(cp->cfg.move_timeout_ms);
			rps__log(RPS__LOG_INFO, "partition %u: %s member %llu (epoch %llu): fencing", p,
				 pl->switching ? "switching to its backup," : "moving to",
				 (unsigned long long)pl->to, (unsigned long long)pl->epoch);
			rps__cp_part_sync(cp, p);
			cp->dp->part_refuse(cp->srv, p);
		}
		return;
	}
	/* not ours */
	pl->gone = false;
	pl->cleared = false;
	if (pl->st == PART_NONE && backs_up(cp, p)) {
		backup_reconcile(cp, p);
		return;
	}
	if (pl->st == PART_ACTIVE || pl->st == PART_LEAVING || pl->st == PART_SHIPPED) {
		rps__log(RPS__LOG_INFO, "partition %u now belongs to member %llu (epoch %llu)", p,
			 (unsigned long long)mp->owner, (unsigned long long)mp->epoch);
		rps__cp_blob_free(cp, pl);
		if (pl->st == PART_ACTIVE) {
			/* deposed (a FAILOVER while we were cut off): workers
			 * still READing our copy learn it moved */
			cp->dp->part_publish(cp->srv, p, RPS__EPOCH_MOVED);
			cp->dp->part_refuse(cp->srv, p);
		}
		pl->st = PART_DRAINING;
		pl->free_at = now + ms_ns(cp->cfg.drain_ms);
	} else if (pl->st == PART_INCOMING && mp->moving_to != cp->my_id) {
		rps__log(RPS__LOG_INFO, "partition %u: move aborted, dropping what was installed", p);
		cp->dp->part_drop(cp->srv, p);
		pl->st = PART_NONE;
	}
	pl->epoch = mp->epoch;
}

/* Bring what this server does with each partition in line with the map. */
void rps__cp_reconcile(struct rps__cplane *cp)
{
	uint64_t now = rps__now_ns();
	uint32_t p;

	parts_sync_all(cp);	/* the map changed */
	for (p = 0; p < cp->map.npart; p++) {
		reconcile_part(cp, p, now);
		rps__cp_part_sync(cp, p);
	}
	rps__cp_map_publish(cp);
	rps__cp_admin_map_changed(cp);
}

static bool all_lost(const struct rps__smap *m)
{
	for (uint32_t p = 0; p < m->npart; p++)
		if (!m->parts[p].lost)
			return false;
	return m->npart > 0;
}

static void cb_apply(void *ctx, uint64_t index, uint64_t term, const void *data, size_t len)
{
	struct rps__cplane *cp = ctx;
	struct rps__smap_cmd cmd;
	char what[256];
	int ret;

	(void)term;
	if (rps__smap_cmd_decode(data, len, &cmd)) {
		rps__log(RPS__LOG_ERROR, "log entry %llu: %s", (unsigned long long)index, rps__errbuf());
		cp->map.applied = index;
		cp->dp->set_map(cp->srv, cp->map.npart, cp->map.applied);
		return;
	}
	ret = rps__smap_apply(&cp->map, index, &cmd);
	rps__smap_cmd_str(&cmd, what, sizeof(what));
	if (ret)
		rps__log(RPS__LOG_DEBUG, "log entry %llu: %s: refused: %s", (unsigned long long)index, what,
			 rps__errbuf());
	else
		rps__log(cmd.type == RPS__SMAP_NOP ? RPS__LOG_DEBUG : RPS__LOG_INFO, "log entry %llu: %s",
			 (unsigned long long)index, what);
	rps__cp_replica_applied(cp, &cmd, ret, rps__now_ns());
	/* what leaves the primaries uneven, as news (not a restart's replay):
	 * the leader spreads them again once the map is quiet
	 * (rps__cp_balance_duty).  Not an ADD_MEMBER: psctl add-server
	 * moves the new member's share itself, unless told not to
	 * (--no-rebalance: a witness to be, or the operator's own plan) */
	if (!ret && index > cp->replay_to &&
	    (cmd.type == RPS__SMAP_FAILOVER || cmd.type == RPS__SMAP_SET_WITNESS || cmd.type == RPS__SMAP_FORCE_REMOVE))
		cp->balance_due = true;
	if (!ret && cmd.type == RPS__SMAP_CLEAR_LOST && cp->map.parts[cmd.part].owner == cp->my_id &&
	    (cmd.id ? cmd.id == cp->incarnation : index > cp->replay_to)) {
		/* restored here (our own CLEAR_LOST: it names this start), or
		 * accepted empty (psctl forget-lost) after what our log held
		 * at start.  One from a previous life of this server restored
		 * memory that is gone now: replayed, it must not make us serve
		 * zeros (the partition is lost again: restarted_without). */
		cp->parts[cmd.part].gone = false;
		cp->parts[cmd.part].cleared = true;
	}
	if (!ret && cmd.type == RPS__SMAP_FAILOVER && cmd.to == cp->my_id && cp->parts[cmd.part].st != PART_BACKUP) {
		/* promoted without a copy (a restart, or one dropped meanwhile):
		 * refuse it as lost, never serve it empty.  Replayed after a
		 * restart it is history, not news: a previous life of ours was
		 * promoted (and the restart took that copy); what became of it
		 * since is in the entries that follow, and what is still ours
		 * at the end fails over or is marked lost (restarted_without). */
		if (index <= cp->replay_to)
			rps__log(RPS__LOG_DEBUG, "partition %u: failed over to us before the restart (replayed)", cmd.part);
		else if (cp->map.parts[cmd.part].backups[0])
			/* a backup it kept holds it: we hand it on (restarted_without) */
			rps__log(RPS__LOG_WARN, "partition %u failed over to us, but we hold no copy of it: failing over"
				 " to its backup, member %llu", cmd.part,
				 (unsigned long long)cp->map.parts[cmd.part].backups[0]);
		else
			rps__log(RPS__LOG_ERROR, "partition %u failed over to us, but we hold no copy of it: lost: restore"
				 " it (psctl restore NAME) or accept it empty (psctl forget-lost %u)", cmd.part, cmd.part);
		cp->parts[cmd.part].gone = true;
	}
	if (!ret && cmd.type == RPS__SMAP_MARK_LOST && all_lost(&cp->map))
		/* (the whole cluster restarted: memory was the only copy) */
		rps__log(RPS__LOG_ERROR, "every partition is lost: no server kept a copy of the parameters across"
			 " its restart: restore a checkpoint (psctl restore NAME, or rdmapsd --restore DIR on every"
			 " server) or start over empty (psctl forget-lost)");
	if (!ret && (cmd.type == RPS__SMAP_REMOVE_MEMBER || cmd.type == RPS__SMAP_FORCE_REMOVE) &&
	    cmd.id == cp->my_id)
		/* linger a moment: workers with operations on their way learn
		 * from refusals that the partitions moved, not from a reset */
		cp->removed_at = rps__now_ns() + ms_ns(cp->cfg.drain_ms);
	rps__cp_reconcile(cp);
}

static void cb_conf_change(void *ctx, uint64_t index, enum rps__raft_conf_op op, uint64_t node)
{
	struct rps__cplane *cp = ctx;
	static const char *names[] = { "?", "add voter", "add learner", "promote", "remove" };

	rps__log(RPS__LOG_INFO, "log entry %llu: membership: %s %llu", (unsigned long long)index,
		 names[op <= 4 ? op : 0], (unsigned long long)node);
	rps__cp_admin_map_changed(cp);
}

int rps__cp_bootstrap_map(struct rps__cplane *cp, struct rps__smap *m)
{
	const char *uris[RPS__SMAP_MAX_MEMBERS];
	char bufs[RPS__SMAP_MAX_MEMBERS][300];
	long r;
	int i;

	if (cp->ncluster > (int)RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-EINVAL, "--cluster lists %d servers; at most %u", cp->ncluster,
				   RPS__SMAP_MAX_MEMBERS);
	for (i = 0; i < cp->ncluster; i++)
		uris[i] = rps__uri_str(&cp->cluster[i], bufs[i], sizeof(bufs[i]));
	/* Test hook (RPS_FAULT=bootstrap-replicas-2 or -3): a new cluster's map
	 * with that many copies, for the failover tests. */
	if (RPS__UNLIKELY(rps__fault_arg("bootstrap-replicas-", &r)))
		return rps__smap_init_replicated(m, uris, (uint32_t)cp->ncluster, cp->cfg.npart, (uint32_t)r);
	/* R = 2 from 2 servers on (the default, doc/design.md), with the backups in the
	 * map from the start: nothing is stored yet, so nothing is seeded.  It
	 * depends on --cluster alone, never on this member's --replicas: every
	 * founding member builds this map by itself, and they must all agree.
	 * A --replicas that differs reaches the map through the leader
	 * (SET_REPLICAS, then drops or seedings: repl_place.c).  The map goes
	 * into the Raft log's bootstrap snapshot (cplane.c open_raft): a
	 * restart replays onto it, not onto what its flags or this code's
	 * defaults would build by then. */
	return rps__smap_init_replicated(m, uris, (uint32_t)cp->ncluster, cp->cfg.npart,
					 cp->ncluster >= 2 ? 2 : 1);
}

void rps__cp_restored(struct rps__cplane *cp)
{
	struct rps__smap_cmd cmd;
	bool local = false;
	uint32_t p;

	for (p = 0; p < cp->map.npart; p++) {
		struct part_local *pl = &cp->parts[p];
		if (cp->map.parts[p].owner != cp->my_id || !rps__cp_lost(cp, p))
			continue;
		rps__log(RPS__LOG_INFO, "partition %u restored from a checkpoint", p);
		pl->gone = false;
		pl->cleared = true;
		local = true;
		if (!cp->map.parts[p].lost)
			continue;
		memset(&cmd, 0, sizeof(cmd));
		cmd.type = RPS__SMAP_CLEAR_LOST;
		cmd.part = p;
		cmd.id = cp->incarnation;	/* restored in this start's memory */
		cmd.epoch = cp->map.parts[p].epoch;
		pl->next_try = rps__now_ns() + PEER_RETRY_NS / 2;	/* (move_duties retries) */
		rps__cp_propose_cmd(cp, &cmd);
	}
	if (local)
		rps__cp_reconcile(cp);
}

static int cb_restore(void *ctx, uint64_t index, const void *data, size_t len)
{
	struct rps__cplane *cp = ctx;
	int ret;

	(void)index;
	if (!len) {
		if (cp->cfg.join_id)
			return 0;	/* the leader's snapshot brings the map */
		/* a log bootstrapped without its map (before it went into the
		 * bootstrap snapshot): build it again */
		ret = rps__cp_bootstrap_map(cp, &cp->map);
	} else {
		ret = rps__smap_decode(data, len, &cp->map);
	}
	if (ret)
		return ret;
	rps__cp_reconcile(cp);
	return 0;
}

static int cb_snapshot(void *ctx, void **data, size_t *len)
{
	struct rps__cplane *cp = ctx;
	size_t cap = rps__smap_encoded_size(&cp->map);
	void *buf = malloc(cap);
	int ret;

	if (!buf)
		return -ENOMEM;
	ret = rps__smap_encode(&cp->map, buf, cap, len);
	if (ret) {
		free(buf);
		return ret;
	}
	*data = buf;
	return 0;
}

static int cb_send(void *ctx, uint64_t to, const void *buf, size_t len)
{
	struct rps__cplane *cp = ctx;

	if (len + sizeof(struct rps__msg_hdr) > RPS__BIG_MSG_MAX) {
		rps__log(RPS__LOG_WARN, "a Raft message of %zu bytes to %llu is too large for a peer buffer; dropped",
			 len, (unsigned long long)to);
		return -EMSGSIZE;
	}
	rps__cp_peer_send(cp, to, RPS__MSG_RAFT, 0, 0, buf, len);
	return 0;
}

static void cb_flush(void *ctx)
{
	struct rps__cplane *cp = ctx;

	if (cp->dp->flush)
		cp->dp->flush(cp->srv);
}

static void cb_read_ready(void *ctx, uint64_t read_ctx, uint64_t index)
{
	rps__cp_failover_read_ready(ctx, read_ctx, index);	/* (leases are the only reads) */
}

static void cb_role_change(void *ctx, enum rps__raft_role role, uint64_t leader, uint64_t term)
{
	struct rps__cplane *cp = ctx;

	rps__cp_failover_role(cp, role == RPS__RAFT_LEADER, leader);
	if (role == RPS__RAFT_LEADER)
		rps__log(RPS__LOG_INFO, "raft: leader of term %llu", (unsigned long long)term);
	else if (leader)
		rps__log(RPS__LOG_INFO, "raft: member %llu leads term %llu", (unsigned long long)leader,
			 (unsigned long long)term);
}

/* ---- proposals ---------------------------------------------------------------- */

void rps__cp_propose_cmd(struct rps__cplane *cp, const struct rps__smap_cmd *cmd)
{
	char buf[RPS__SMAP_CMD_MAX];
	size_t len;
	uint64_t leader;

	if (rps__smap_cmd_encode(cmd, buf, sizeof(buf), &len))
		return;
	if (rps__rnode_is_leader(cp->rnode)) {
		rps__rnode_propose(cp->rnode, buf, len, NULL, NULL);
		return;
	}
	leader = rps__rnode_leader(cp->rnode);
	if (leader)
		rps__cp_peer_send(cp, leader, RPS__MSG_PROPOSE, 0, 0, buf, len);
}

/* Propose on this node, which leads: 0 with the entry's index and term, or a
 * negative errno with the reason in rps__errbuf() (for an admin's answer). */
int rps__cp_propose_here(struct rps__cplane *cp, const struct rps__smap_cmd *cmd, uint64_t *index,
			 uint64_t *term)
{
	char buf[RPS__SMAP_CMD_MAX];
	size_t len;
	int ret = rps__smap_cmd_encode(cmd, buf, sizeof(buf), &len);

	return ret ? ret : rps__rnode_propose(cp->rnode, buf, len, index, term);
}

void rps__cp_on_propose(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const void *body, size_t len)
{
	struct rps__propose_rep rep = { 0 };
	struct rps__smap_cmd cmd;
	int ret;

	ret = rps__smap_cmd_decode(body, len, &cmd);
	if (!ret)
		ret = rps__rnode_propose(cp->rnode, body, len, &rep.index, NULL);
	rep.leader = rps__rnode_leader(cp->rnode);
	cp->dp->conn_reply(c, RPS__MSG_PROPOSE_REP, req_id, ret, &rep, sizeof(rep));
}

const struct rps__rnode_callbacks rps__cp_rnode_callbacks = {
	.send = cb_send, .apply = cb_apply, .conf_change = cb_conf_change, .restore = cb_restore,
	.snapshot = cb_snapshot, .read_ready = cb_read_ready, .role_change = cb_role_change,
	.flush = cb_flush,
};
