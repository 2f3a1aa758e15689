/*
 * raft_node.c - a Raft node (an rps__rnode): the I/O-free core (raft.c)
 * driven over its durable storage (wal.c), with the application behind
 * callbacks (contract in raft_node.h).  The core's raft_rawnode.c is the
 * application's synchronous side of the core; this is what drives it.
 *
 * The module owns the ready/advance loop of raft.h: every ready is made
 * durable in the WAL (snapshot first, then entries and hard state as one
 * batch) before its messages are encoded and handed to the send callback
 * (except a leader's, and a commit index's, see handle_ready);
 * then the state machine is reset from the snapshot, if any, the committed
 * entries are applied, and ReadIndex reads are released once the applied
 * index reaches them.  Every compact_every applied entries the state machine
 * is serialised, the core compacts its log and the snapshot goes to the WAL.
 *
 * Restart: the core restarts with its applied index at the snapshot and hands
 * the committed entries after it out again in its first ready.  Open resets
 * the state machine from the WAL's snapshot and applies those entries itself
 * (so the state machine is current when open returns); the rnode keeps its
 * own applied index and skips every committed entry at or below it, so no
 * entry is applied twice.
 *
 * A failed WAL write is fatal: the core's state is then ahead of the disk, so
 * the node refuses everything with -EIO until the process restarts and
 * recovers from what the disk holds.  Other failures in the middle of a ready
 * (no memory, a failed restore) are fatal the same way, with their own errno.
 * A failed compaction (the snapshot callback or the core refusing) is not:
 * process returns its error, and the next process tries again.
 */
#include "config.h"
#include "control/raft_node.h"
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RNODE_DEFAULT_ELECTION 10u
#define RNODE_DEFAULT_HEARTBEAT 1u
#define RNODE_DEFAULT_COMPACT 1024u
#define RNODE_MAX_INFLIGHT 64u
#define RNODE_MAX_MSG_ENTRIES 64u

struct pending_read {
	uint64_t ctx;
	uint64_t index;
};

struct rps__rnode {
	uint64_t id;
	struct rps__rnode_callbacks cb;
	unsigned compact_every;

	struct rps__wal *wal;
	struct rps__raft *raft;

	uint64_t applied;		/* last index handed to the state machine */
	uint64_t hs_term, hs_vote;	/* the hard state as on disk (its commit may */
	uint64_t hs_commit;		/*   lag the core's: see handle_ready) */
	enum rps__wal_fsync fsync;
	enum rps__raft_role role;	/* as last reported through role_change */
	uint64_t leader;

	int dead;			/* sticky negative errno after a fatal failure */
	char dead_msg[256];

	uint8_t *sendbuf;		/* reused for every encoded message */
	size_t sendcap;
	struct rps__wal_entry *wents;	/* a ready's entries, converted for the WAL */
	uint32_t wents_cap;
	struct pending_read *reads;	/* read states waiting for the applied index */
	size_t n_reads;
	uint32_t cap_reads;

	char note[320];
};

/* ------------------------------------------------------------------------ */
/* helpers */

static int check_alive(const struct rps__rnode *n)
{
	if (!n->dead)
		return 0;
	return rps__seterr(n->dead, "rnode %llu: unusable after an earlier failure (%s); restart the process",
			   (unsigned long long)n->id, n->dead_msg);
}

/* Make the node dead with err; the current message is kept for later calls. */
static int kill_node(struct rps__rnode *n, int err)
{
	n->dead = err;
	snprintf(n->dead_msg, sizeof(n->dead_msg), "%s", rps__errbuf());
	rps__log(RPS__LOG_ERROR, "rnode %llu: %s", (unsigned long long)n->id, n->dead_msg);
	return err;
}

static void wal_snapshot_from(struct rps__wal_snapshot *ws, const struct rps__raft_snapshot *s)
{
	ws->index = s->index;
	ws->term = s->term;
	ws->voters = s->conf.voters;
	ws->n_voters = s->conf.n_voters;
	ws->learners = s->conf.learners;
	ws->n_learners = s->conf.n_learners;
	ws->data = s->data;
	ws->len = s->len;
}

static int save_snapshot(struct rps__rnode *n, const struct rps__raft_snapshot *s)
{
	struct rps__wal_snapshot ws;
	int err;

	wal_snapshot_from(&ws, s);
	err = rps__wal_save_snapshot(n->wal, &ws);
	if (err) {
		rps__preerr(err, "rnode %llu: persisting snapshot %llu", (unsigned long long)n->id,
			    (unsigned long long)s->index);
		return kill_node(n, -EIO);
	}
	return 0;
}

/* The hard state goes with every save in which it differs from the disk's,
 * so a commit index left unwritten rides with the next save.  With fsync
 * always a commit index alone is never written (see handle_ready). */
static int save_ready(struct rps__rnode *n, const struct rps__raft_ready *rd)
{
	struct rps__wal_hard_state hs = {
		.term = rd->hard_state.term,
		.vote = rd->hard_state.vote,
		.commit = rd->hard_state.commit,
	};
	bool tv_new = hs.term != n->hs_term || hs.vote != n->hs_vote;
	bool hs_new = tv_new || hs.commit != n->hs_commit;
	struct rps__wal_entry *we;
	int err;

	if (!rd->n_entries && !tv_new && (!hs_new || n->fsync != RPS__WAL_FSYNC_NONE))
		return 0;
	if (rd->n_entries) {
		if (rd->n_entries > UINT32_MAX ||
		    rps__grow(&n->wents, &n->wents_cap, (uint32_t)rd->n_entries, sizeof(*n->wents), 16)) {
			rps__seterr(-ENOMEM, "rnode %llu: no memory to persist %zu entries",
				    (unsigned long long)n->id, rd->n_entries);
			return kill_node(n, -ENOMEM);
		}
		we = n->wents;
		for (size_t i = 0; i < rd->n_entries; i++) {
			const struct rps__raft_entry *e = &rd->entries[i];

			we[i] = (struct rps__wal_entry){
				.term = e->term,
				.index = e->index,
				.type = (uint8_t)e->type,
				.data = e->data,
				.len = e->len,
			};
		}
	}
	err = rps__wal_save(n->wal, hs_new ? &hs : NULL, n->wents, rd->n_entries);
	if (err) {
		rps__preerr(err, "rnode %llu: persisting %zu entries and the hard state", (unsigned long long)n->id,
			    rd->n_entries);
		return kill_node(n, -EIO);
	}
	if (hs_new) {
		n->hs_term = hs.term;
		n->hs_vote = hs.vote;
		n->hs_commit = hs.commit;
	}
	return 0;
}

static void send_msgs(struct rps__rnode *n, const struct rps__raft_msg *msgs, size_t n_msgs)
{
	for (size_t i = 0; i < n_msgs; i++) {
		const struct rps__raft_msg *m = &msgs[i];
		size_t need = rps__raft_msg_encoded_size(m), len;
		int rc;

		if (need > n->sendcap) {
			uint8_t *buf = realloc(n->sendbuf, need);

			if (!buf) {
				rps__log(RPS__LOG_WARN, "rnode %llu: no memory to encode a %s of %zu bytes to %llu: dropped",
					 (unsigned long long)n->id, rps__raft_msg_type_name(m->type), need,
					 (unsigned long long)m->to);
				continue;
			}
			n->sendbuf = buf;
			n->sendcap = need;
		}
		rc = rps__raft_msg_encode(m, n->sendbuf, n->sendcap, &len);
		if (rc) {
			rps__log(RPS__LOG_WARN, "rnode %llu: encoding a %s to %llu: %s", (unsigned long long)n->id,
				 rps__raft_msg_type_name(m->type), (unsigned long long)m->to, rps__errbuf());
			continue;
		}
		rc = n->cb.send(n->cb.ctx, m->to, n->sendbuf, len);
		if (rc < 0)
			rps__log(RPS__LOG_DEBUG, "rnode %llu: sending a %s to %llu failed (%d): dropped",
				 (unsigned long long)n->id, rps__raft_msg_type_name(m->type),
				 (unsigned long long)m->to, rc);
	}
}

static void apply_entry(struct rps__rnode *n, const struct rps__raft_entry *e)
{
	if (e->index <= n->applied)
		return;		/* replayed by open, or covered by a snapshot */
	if (e->type == RPS__RAFT_ENTRY_NORMAL) {
		if (e->len)
			n->cb.apply(n->cb.ctx, e->index, e->term, e->data, e->len);
	} else if (e->type == RPS__RAFT_ENTRY_CONF) {
		enum rps__raft_conf_op op;
		uint64_t node;

		if (rps__raft_conf_change_decode(e, &op, &node) == 0) {
			if (n->cb.conf_change)
				n->cb.conf_change(n->cb.ctx, e->index, op, node);
		} else {
			rps__log(RPS__LOG_WARN, "rnode %llu: membership change at %llu does not decode: %s",
				 (unsigned long long)n->id, (unsigned long long)e->index, rps__errbuf());
		}
	}
	n->applied = e->index;
}

static int restore_sm(struct rps__rnode *n, uint64_t index, const void *data, size_t len)
{
	int err = n->cb.restore(n->cb.ctx, index, data, len);

	if (err) {
		if (err > 0)
			err = -EIO;
		return rps__preerr(err, "rnode %llu: restoring the state machine from snapshot %llu (%zu bytes)",
				   (unsigned long long)n->id, (unsigned long long)index, len);
	}
	/* reads waiting for entries the snapshot covers are served below */
	n->applied = index;
	return 0;
}

static void queue_reads(struct rps__rnode *n, const struct rps__raft_read_state *rs, size_t n_rs)
{
	for (size_t i = 0; i < n_rs; i++) {
		if (rs[i].index <= n->applied) {
			if (n->cb.read_ready)
				n->cb.read_ready(n->cb.ctx, rs[i].ctx, rs[i].index);
			continue;
		}
		if (n->n_reads + 1 > UINT32_MAX ||
		    rps__grow(&n->reads, &n->cap_reads, (uint32_t)(n->n_reads + 1), sizeof(*n->reads), 16)) {
			/* like a lost request: the reader times out and retries */
			rps__log(RPS__LOG_WARN, "rnode %llu: no memory to hold read %llu: dropped",
				 (unsigned long long)n->id, (unsigned long long)rs[i].ctx);
			continue;
		}
		n->reads[n->n_reads++] = (struct pending_read){ .ctx = rs[i].ctx, .index = rs[i].index };
	}
}

static void serve_reads(struct rps__rnode *n)
{
	size_t k = 0;

	for (size_t i = 0; i < n->n_reads; i++) {
		if (n->reads[i].index <= n->applied) {
			if (n->cb.read_ready)
				n->cb.read_ready(n->cb.ctx, n->reads[i].ctx, n->reads[i].index);
		} else {
			n->reads[k++] = n->reads[i];
		}
	}
	n->n_reads = k;
}

static void note_role(struct rps__rnode *n, enum rps__raft_role role, uint64_t leader, uint64_t term)
{
	if (role == n->role && leader == n->leader)
		return;
	n->role = role;
	n->leader = leader;
	if (n->cb.role_change)
		n->cb.role_change(n->cb.ctx, role, leader, term);
}

static int handle_ready(struct rps__rnode *n, const struct rps__raft_ready *rd)
{
	bool commit_only;
	int err;

	if (rd->snapshot) {
		err = save_snapshot(n, rd->snapshot);
		if (err)
			return err;
	}
	/* A leader replicates while it writes its own log (Raft thesis
	 * 10.2.1): its messages promise nothing about its disk, and it counts
	 * the followers' acknowledgements only in a later step, after this
	 * save is done.  Everyone else sends only what is on disk. */
	/* A ready that only moves the commit index promises nothing either:
	 * apply first (the leader answers its proposer now) and write the
	 * commit index after.  With fsync always it is not written at all
	 * but goes with the next save, which syncs anyway: Raft needs no
	 * durable commit index (a restart learns it again from the leader;
	 * etcd does not sync it either), and a sync for it alone cost every
	 * node a second fdatasync per entry, on the same disk as the next
	 * entry's.  Written unsynced it could not be: a torn unsynced batch
	 * before a synced one would look like damage to an acknowledged save
	 * (wal.h). */
	commit_only = !rd->snapshot && !rd->n_entries && rd->hard_state_changed &&
		      rd->hard_state.term == n->hs_term && rd->hard_state.vote == n->hs_vote;
	if (rd->role == RPS__RAFT_LEADER || commit_only)
		send_msgs(n, rd->msgs, rd->n_msgs);
	/* and make sure they are on the wire before the sync: the transport
	 * may hold them until its next poll, which comes after the sync */
	if (rd->role == RPS__RAFT_LEADER && !commit_only && rd->n_msgs && n->fsync == RPS__WAL_FSYNC_ALWAYS &&
	    (rd->n_entries || rd->hard_state_changed) && n->cb.flush)
		n->cb.flush(n->cb.ctx);
	if (!commit_only) {
		err = save_ready(n, rd);
		if (err)
			return err;
	}
	if (rd->role != RPS__RAFT_LEADER && !commit_only)
		send_msgs(n, rd->msgs, rd->n_msgs);
	if (rd->snapshot) {
		err = restore_sm(n, rd->snapshot->index, rd->snapshot->data, rd->snapshot->len);
		if (err)
			return kill_node(n, err);
	}
	for (size_t i = 0; i < rd->n_committed; i++)
		apply_entry(n, &rd->committed[i]);
	queue_reads(n, rd->read_states, rd->n_read_states);
	serve_reads(n);
	note_role(n, rd->role, rd->leader, rd->hard_state.term);
	return commit_only ? save_ready(n, rd) : 0;
}

static int compact_now(struct rps__rnode *n, bool force)
{
	const struct rps__raft_snapshot *snap;
	struct rps__raft_status st;
	void *data = NULL;
	size_t len = 0;
	int err;

	rps__raft_status(n->raft, &st);
	if (n->applied > st.applied || n->applied <= st.snapshot_index)
		return 0;
	if (!force && n->applied < st.snapshot_index + n->compact_every)
		return 0;
	err = n->cb.snapshot(n->cb.ctx, &data, &len);
	if (err) {
		free(data);
		if (err > 0)
			err = -EIO;
		return rps__preerr(err, "rnode %llu: taking a snapshot at %llu for compaction",
				   (unsigned long long)n->id, (unsigned long long)n->applied);
	}
	err = rps__raft_compact(n->raft, n->applied, data, len, &snap);
	free(data);
	if (err)
		return rps__preerr(err, "rnode %llu: compacting the log to %llu", (unsigned long long)n->id,
				   (unsigned long long)n->applied);
	return save_snapshot(n, snap);
}

int rps__rnode_compact(struct rps__rnode *n)
{
	int err = check_alive(n);

	return err ? err : compact_now(n, true);
}

/* ------------------------------------------------------------------------ */
/* open / close */

static int check_config(const struct rps__rnode_config *cfg)
{
	if (!cfg || !cfg->dir || !cfg->dir[0])
		return rps__seterr(-EINVAL, "rnode: a configuration with a directory is required");
	if (cfg->id == RPS__RAFT_NONE)
		return rps__seterr(-EINVAL, "rnode: node id 0 is reserved");
	if (cfg->n_peers && !cfg->peers)
		return rps__seterr(-EINVAL, "rnode: %zu peers but no peer list", cfg->n_peers);
	if (cfg->boot_state_len && !cfg->boot_state)
		return rps__seterr(-EINVAL, "rnode: a %zu-byte bootstrap state but no data", cfg->boot_state_len);
	if (!cfg->cb.send || !cfg->cb.apply || !cfg->cb.restore || !cfg->cb.snapshot)
		return rps__seterr(-EINVAL, "rnode: the send, apply, restore and snapshot callbacks are required");
	if (cfg->fsync != RPS__WAL_FSYNC_ALWAYS && cfg->fsync != RPS__WAL_FSYNC_NONE)
		return rps__seterr(-EINVAL, "rnode: unknown fsync policy %d", (int)cfg->fsync);
	return 0;
}

/* Convert what the WAL recovered for the core: p points at *snap and at
 * *ents (malloc'ed), both borrowing rec's data. */
static int persisted_from(const struct rps__wal_recovered *rec, struct rps__raft_snapshot *snap,
			  struct rps__raft_entry **ents, struct rps__raft_persisted *p)
{
	memset(p, 0, sizeof(*p));
	*ents = NULL;
	p->hard_state.term = rec->hs.term;
	p->hard_state.vote = rec->hs.vote;
	p->hard_state.commit = rec->hs.commit;
	if (rec->has_snapshot) {
		const struct rps__wal_snapshot *ws = &rec->snapshot;

		if (!rps__raft_conf_fits(ws->n_voters, ws->n_learners) || ws->len > RPS__RAFT_MAX_DATA)
			return rps__seterr(-EBADMSG, "rnode: snapshot %llu on disk has %zu voters, %zu learners and"
					   " %zu bytes: too many; remove the directory and rejoin",
					   (unsigned long long)ws->index, ws->n_voters, ws->n_learners, ws->len);
		memset(snap, 0, sizeof(*snap));
		snap->index = ws->index;
		snap->term = ws->term;
		snap->conf.n_voters = (uint32_t)ws->n_voters;
		snap->conf.n_learners = (uint32_t)ws->n_learners;
		if (ws->n_voters)
			memcpy(snap->conf.voters, ws->voters, ws->n_voters * sizeof(uint64_t));
		if (ws->n_learners)
			memcpy(snap->conf.learners, ws->learners, ws->n_learners * sizeof(uint64_t));
		snap->len = (uint32_t)ws->len;
		snap->data = ws->data;
		p->snapshot = snap;
	}
	if (rec->n_ents) {
		*ents = calloc(rec->n_ents, sizeof(**ents));
		if (!*ents)
			return rps__seterr(-ENOMEM, "rnode: no memory to recover %zu entries", rec->n_ents);
		for (size_t i = 0; i < rec->n_ents; i++) {
			const struct rps__wal_entry *we = &rec->ents[i];

			if (we->len > RPS__RAFT_MAX_DATA) {
				free(*ents);
				*ents = NULL;
				return rps__seterr(-EBADMSG, "rnode: entry %llu on disk is %zu bytes, more than %u",
						   (unsigned long long)we->index, we->len, RPS__RAFT_MAX_DATA);
			}
			(*ents)[i] = (struct rps__raft_entry){
				.term = we->term,
				.index = we->index,
				.type = we->type,
				.len = (uint32_t)we->len,
				.data = we->data,
			};
		}
		p->entries = *ents;
		p->n_entries = rec->n_ents;
	}
	return 0;
}

/* The core's configuration: the node's, with rnode's defaults. */
static void raft_config(const struct rps__rnode_config *cfg, struct rps__raft_config *rc)
{
	rc->id = cfg->id;
	rc->peers = cfg->peers;
	rc->n_peers = cfg->n_peers;
	rc->boot_state = cfg->boot_state;
	rc->boot_state_len = cfg->boot_state_len;
	rc->election_ticks = cfg->election_ticks ? cfg->election_ticks : RNODE_DEFAULT_ELECTION;
	rc->heartbeat_ticks = cfg->heartbeat_ticks ? cfg->heartbeat_ticks : RNODE_DEFAULT_HEARTBEAT;
	rc->pre_vote = true;
	rc->check_quorum = true;
	rc->max_inflight_msgs = RNODE_MAX_INFLIGHT;
	rc->max_msg_entries = RNODE_MAX_MSG_ENTRIES;
	rc->seed = cfg->seed ? cfg->seed : (cfg->id * 0x9e3779b97f4a7c15ull) ^ rps__now_ns();
}

/* The state machine catches up with the disk before anything else: the
 * snapshot, then the committed entries after it (the core hands them out
 * again in its first ready: skipped there as applied). */
static int catch_up(struct rps__rnode *n, const struct rps__wal_recovered *rec)
{
	struct rps__raft_status st;
	int err;

	if (rec->has_snapshot) {
		err = restore_sm(n, rec->snapshot.index, rec->snapshot.data, rec->snapshot.len);
		if (err)
			return err;
	}
	rps__raft_status(n->raft, &st);
	for (uint64_t i = st.snapshot_index + 1; i <= st.commit; i++) {
		const struct rps__raft_entry *e;

		if (rps__raft_entry_at(n->raft, i, &e))
			return rps__seterr(-EBADMSG, "rnode %llu: committed entry %llu is missing from the recovered log",
					   (unsigned long long)n->id, (unsigned long long)i);
		apply_entry(n, e);
	}
	return 0;
}

int rps__rnode_open(const struct rps__rnode_config *cfg, struct rps__rnode **out)
{
	struct rps__wal_opts wo = { 0 };
	struct rps__wal_recovered rec;
	struct rps__raft_config rc = { 0 };
	struct rps__raft_persisted p;
	struct rps__raft_snapshot snap;
	struct rps__raft_entry *ents = NULL;
	struct rps__rnode *n;
	int err;

	*out = NULL;
	err = check_config(cfg);
	if (err)
		return err;
	n = calloc(1, sizeof(*n));
	if (!n)
		return rps__seterr(-ENOMEM, "rnode %llu: no memory", (unsigned long long)cfg->id);
	n->id = cfg->id;
	n->cb = cfg->cb;
	n->compact_every = cfg->compact_every ? cfg->compact_every : RNODE_DEFAULT_COMPACT;
	n->role = RPS__RAFT_FOLLOWER;
	n->leader = RPS__RAFT_NONE;

	wo.fsync = cfg->fsync;
	wo.sync_fn = cfg->sync_fn;
	wo.sync_ctx = cfg->sync_ctx;
	err = rps__wal_open(cfg->dir, &wo, &n->wal, &rec);
	if (err) {
		rps__preerr(err, "rnode %llu", (unsigned long long)cfg->id);
		goto err_free;
	}
	n->hs_term = rec.hs.term;
	n->hs_vote = rec.hs.vote;
	n->hs_commit = rec.hs.commit;
	n->fsync = cfg->fsync;
	snprintf(n->note, sizeof(n->note), "%s", rec.note);

	err = persisted_from(&rec, &snap, &ents, &p);
	if (err)
		goto err_rec;
	raft_config(cfg, &rc);
	err = rps__raft_new(&rc, &p, &n->raft);
	if (err) {
		rps__preerr(err, "rnode %llu: recovering from %s", (unsigned long long)cfg->id, cfg->dir);
		goto err_ents;
	}

	err = catch_up(n, &rec);
	if (err)
		goto err_raft;
	free(ents);
	ents = NULL;
	rps__wal_recovered_free(&rec);

	/* A new cluster's bootstrap snapshot, a term raised past the log's:
	 * made durable (and the bootstrap state restored) before open returns.
	 * Nothing is sent: a fresh core has no messages yet. */
	err = rps__rnode_process(n);
	if (err) {
		rps__rnode_close(n);
		return err;
	}
	*out = n;
	return 0;

err_raft:
	rps__raft_free(n->raft);
err_ents:
	free(ents);
err_rec:
	rps__wal_recovered_free(&rec);
	rps__wal_close(n->wal);
err_free:
	free(n);
	return err;
}

void rps__rnode_close(struct rps__rnode *n)
{
	if (!n)
		return;
	rps__raft_free(n->raft);
	rps__wal_close(n->wal);
	free(n->reads);
	free(n->wents);
	free(n->sendbuf);
	free(n);
}

/* ------------------------------------------------------------------------ */
/* driving */

int rps__rnode_tick(struct rps__rnode *n)
{
	int err = check_alive(n);

	return err ? err : rps__raft_tick(n->raft);
}

int rps__rnode_recv(struct rps__rnode *n, const void *buf, size_t len)
{
	return rps__rnode_recv_from(n, RPS__RAFT_NONE, buf, len);
}

int rps__rnode_recv_from(struct rps__rnode *n, uint64_t peer, const void *buf, size_t len)
{
	struct rps__raft_msg *m;
	int err = check_alive(n);

	if (err)
		return err;
	err = rps__raft_msg_decode(buf, len, &m);
	if (err)
		return rps__preerr(err, "rnode %llu: dropping a message", (unsigned long long)n->id);
	if (peer != RPS__RAFT_NONE && m->from != peer) {
		err = rps__seterr(-EPROTO, "rnode %llu: dropped %s that says it is from %llu, sent by %llu",
				  (unsigned long long)n->id, rps__raft_msg_type_name(m->type),
				  (unsigned long long)m->from, (unsigned long long)peer);
		rps__raft_msg_free(m);
		return err;
	}
	err = rps__raft_step(n->raft, m);
	rps__raft_msg_free(m);
	return err;
}

int rps__rnode_process(struct rps__rnode *n)
{
	struct rps__raft_ready rd;
	struct rps__raft_status st;
	int err = check_alive(n);

	if (err)
		return err;
	for (;;) {
		int rc = rps__raft_ready(n->raft, &rd);

		if (rc < 0)
			return rc;
		if (rc == 0)
			break;
		err = handle_ready(n, &rd);
		if (err)
			return err;
		err = rps__raft_advance(n->raft, &rd);
		if (err)
			return kill_node(n, err);
	}
	/* a role change without a ready (a leader that lost its quorum) */
	rps__raft_status(n->raft, &st);
	note_role(n, st.role, st.leader, st.term);
	return compact_now(n, false);
}

/* ------------------------------------------------------------------------ */
/* passthroughs */

int rps__rnode_propose(struct rps__rnode *n, const void *data, size_t len, uint64_t *index,
		       uint64_t *term)
{
	int err = check_alive(n);

	return err ? err : rps__raft_propose(n->raft, data, len, index, term);
}

int rps__rnode_conf_change(struct rps__rnode *n, enum rps__raft_conf_op op, uint64_t node,
			   uint64_t *index)
{
	int err = check_alive(n);

	return err ? err : rps__raft_propose_conf_change(n->raft, op, node, index);
}

int rps__rnode_transfer_leader(struct rps__rnode *n, uint64_t to)
{
	int err = check_alive(n);

	return err ? err : rps__raft_transfer_leader(n->raft, to);
}

int rps__rnode_read(struct rps__rnode *n, uint64_t read_ctx)
{
	int err = check_alive(n);

	return err ? err : rps__raft_read_index(n->raft, read_ctx);
}

int rps__rnode_campaign(struct rps__rnode *n)
{
	int err = check_alive(n);

	return err ? err : rps__raft_campaign(n->raft);
}

void rps__rnode_status(const struct rps__rnode *n, struct rps__raft_status *st)
{
	rps__raft_status(n->raft, st);
}

int rps__rnode_progress(const struct rps__rnode *n, uint64_t id, struct rps__raft_progress_info *pi)
{
	return rps__raft_progress(n->raft, id, pi);
}

uint64_t rps__rnode_applied(const struct rps__rnode *n)
{
	return n->applied;
}

uint64_t rps__rnode_leader(const struct rps__rnode *n)
{
	return rps__raft_leader(n->raft);
}

bool rps__rnode_is_leader(const struct rps__rnode *n)
{
	struct rps__raft_status st;

	rps__raft_status(n->raft, &st);
	return st.role == RPS__RAFT_LEADER;
}

uint64_t rps__rnode_term_at(const struct rps__rnode *n, uint64_t index)
{
	const struct rps__raft_entry *e;

	if (rps__raft_entry_at(n->raft, index, &e))
		return 0;
	return e->term;
}

const char *rps__rnode_recovery_note(const struct rps__rnode *n)
{
	return n->note;
}
