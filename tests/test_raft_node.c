/*
 * test_raft_node.c - unit tests of the Raft node (src/control/raft_node.c):
 * the core driven over a real write-ahead log per node, in an in-process
 * cluster.
 *
 * Every node has its own WAL directory under one mkdtemp directory, and a
 * state machine that is an append-only list of the payloads it applied.
 * Messages go through one in-memory FIFO queue: the send callback appends a
 * copy, the test loop ticks every node and delivers the queue until it is
 * empty.  A node can be cut off (its messages, both ways, are dropped) or
 * closed and reopened from its directory (a crash: memory is lost, the WAL
 * stays).  The tests check exact outcomes: one leader, the same payloads in
 * the same order exactly once everywhere, replay without double applies,
 * catching up through a snapshot, a learner joining, leadership transfer,
 * ReadIndex, and refusal of corrupted messages.
 */
#include "config.h"
#include "control/raft_node.h"
#include "control/wal.h"
#include "common/common.h"
#include "lib/cutest.h"
#include "common/fsutil.h"
#include "lib/tmpdir.h"

#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXN 4u			/* node ids 1..MAXN */
#define PAYLOAD_MAX 16u

struct item {
	uint64_t index;
	uint32_t len;
	char data[PAYLOAD_MAX];
};

struct tnode {
	uint64_t id;
	struct rps__rnode *rn;
	char dir[256];
	bool up;
	bool cut;
	unsigned incarnation;

	/* the state machine */
	struct item *items;
	size_t n_items;
	size_t cap_items;
	uint64_t last_index;		/* applied or restored up to */

	/* callback counters, reset when the node (re)opens */
	unsigned applies;
	unsigned order_errors;		/* apply at or below last_index */
	unsigned restores;
	uint64_t restore_index;
	size_t restore_len;
	size_t restore_items;		/* items the last restore produced */
	unsigned conf_changes;
	enum rps__raft_conf_op conf_ops[8];
	uint64_t conf_nodes[8];
	unsigned role_changes;
	enum rps__raft_role last_role;
	uint64_t last_leader;
	unsigned reads;
	unsigned syncs;			/* WAL syncs (fsync ALWAYS), kept across reopens */
	char events[64];		/* s(end) f(lush) y (sync), from the last clear */
	size_t n_events;
	uint64_t read_ctx;
	uint64_t read_index;
	uint64_t read_applied;		/* last_index when read_ready came */
};

struct qmsg {
	uint64_t from;
	uint64_t to;
	uint8_t *buf;
	size_t len;
};

static char base[64];
static struct tnode nodes[MAXN + 1];
static const uint64_t peers3[] = { 1, 2, 3 };
static struct qmsg *queue;
static size_t q_head, q_n, q_cap;
static unsigned cfg_compact;
static enum rps__wal_fsync cfg_fsync;
static unsigned next_payload;
static size_t cfg_n_peers;		/* a bootstrap node gets the first of peers3 */
static uint8_t cfg_boot[64];		/* a bootstrap node's initial state (cb_restore's */
static size_t cfg_boot_len;		/*   format), if cfg_boot_len */

/* ---- the state machine and the callbacks ---------------------------------- */

static void sm_clear(struct tnode *t)
{
	t->n_items = 0;
	t->last_index = 0;
}

static void sm_push(struct tnode *t, uint64_t index, const void *data, size_t len)
{
	struct item *it;

	if (t->n_items == t->cap_items) {
		t->cap_items = t->cap_items ? 2 * t->cap_items : 64;
		t->items = realloc(t->items, t->cap_items * sizeof(*t->items));
		if (!t->items)
			abort();
	}
	it = &t->items[t->n_items++];
	memset(it, 0, sizeof(*it));
	it->index = index;
	it->len = (uint32_t)(len < PAYLOAD_MAX ? len : PAYLOAD_MAX);
	memcpy(it->data, data, it->len);
}

static void note_event(struct tnode *t, char what)
{
	if (t->n_events + 1 < sizeof(t->events))
		t->events[t->n_events++] = what;
	t->events[t->n_events] = '\0';
}

static int cb_send(void *ctx, uint64_t to, const void *buf, size_t len)
{
	struct tnode *t = ctx;
	uint8_t *copy = malloc(len);

	note_event(t, 's');
	if (!copy)
		abort();
	memcpy(copy, buf, len);
	if (q_n == q_cap) {
		q_cap = q_cap ? 2 * q_cap : 256;
		queue = realloc(queue, q_cap * sizeof(*queue));
		if (!queue)
			abort();
	}
	queue[q_n++] = (struct qmsg){ .from = t->id, .to = to, .buf = copy, .len = len };
	return 0;
}

static void cb_apply(void *ctx, uint64_t index, uint64_t term, const void *data, size_t len)
{
	struct tnode *t = ctx;

	(void)term;
	if (index <= t->last_index)
		t->order_errors++;
	t->applies++;
	t->last_index = index;
	sm_push(t, index, data, len);
}

static void cb_conf_change(void *ctx, uint64_t index, enum rps__raft_conf_op op, uint64_t node)
{
	struct tnode *t = ctx;

	if (index <= t->last_index)
		t->order_errors++;
	t->last_index = index;
	if (t->conf_changes < 8) {
		t->conf_ops[t->conf_changes] = op;
		t->conf_nodes[t->conf_changes] = node;
	}
	t->conf_changes++;
}

/* Snapshot format (test only, host byte order): u64 count, then per item
 * u64 index, u32 len, len bytes. */
static int cb_snapshot(void *ctx, void **data, size_t *len)
{
	struct tnode *t = ctx;
	size_t size = 8, off = 8;
	uint8_t *p;
	uint64_t count = t->n_items;

	for (size_t i = 0; i < t->n_items; i++)
		size += 12 + t->items[i].len;
	p = malloc(size);
	if (!p)
		return -ENOMEM;
	memcpy(p, &count, 8);
	for (size_t i = 0; i < t->n_items; i++) {
		memcpy(p + off, &t->items[i].index, 8);
		memcpy(p + off + 8, &t->items[i].len, 4);
		memcpy(p + off + 12, t->items[i].data, t->items[i].len);
		off += 12 + t->items[i].len;
	}
	*data = p;
	*len = size;
	return 0;
}

static int cb_restore(void *ctx, uint64_t index, const void *data, size_t len)
{
	struct tnode *t = ctx;
	const uint8_t *p = data;
	uint64_t count;
	size_t off = 8;

	t->restores++;
	t->restore_index = index;
	t->restore_len = len;
	sm_clear(t);
	t->last_index = index;
	if (len == 0) {
		t->restore_items = 0;
		return 0;
	}
	if (len < 8)
		return -EINVAL;
	memcpy(&count, p, 8);
	for (uint64_t i = 0; i < count; i++) {
		uint64_t idx;
		uint32_t ilen;

		if (off + 12 > len)
			return -EINVAL;
		memcpy(&idx, p + off, 8);
		memcpy(&ilen, p + off + 8, 4);
		if (ilen > PAYLOAD_MAX || off + 12 + ilen > len)
			return -EINVAL;
		sm_push(t, idx, p + off + 12, ilen);
		off += 12 + ilen;
	}
	t->restore_items = t->n_items;
	return off == len ? 0 : -EINVAL;
}

static void cb_read_ready(void *ctx, uint64_t read_ctx, uint64_t index)
{
	struct tnode *t = ctx;

	t->reads++;
	t->read_ctx = read_ctx;
	t->read_index = index;
	t->read_applied = t->last_index;
}

/* The WAL's sync: counted, not done (the tests crash processes, not the
 * machine). */
static int cb_sync(int fd, bool data_only, void *ctx)
{
	struct tnode *t = ctx;

	(void)fd;
	(void)data_only;
	t->syncs++;
	note_event(t, 'y');
	return 0;
}

static void cb_flush(void *ctx)
{
	note_event(ctx, 'f');
}

static void cb_role_change(void *ctx, enum rps__raft_role role, uint64_t leader, uint64_t term)
{
	struct tnode *t = ctx;

	(void)term;
	t->role_changes++;
	t->last_role = role;
	t->last_leader = leader;
}

/* ---- the cluster ----------------------------------------------------------- */

static void setup(void)
{
	test_mkdtemp(base, sizeof(base), "test_raft_node");
	memset(nodes, 0, sizeof(nodes));
	for (uint64_t id = 1; id <= MAXN; id++) {
		nodes[id].id = id;
		snprintf(nodes[id].dir, sizeof(nodes[id].dir), "%s/node%llu", base, (unsigned long long)id);
	}
	q_head = q_n = 0;
	cfg_compact = 0;
	cfg_fsync = RPS__WAL_FSYNC_NONE;
	next_payload = 0;
	cfg_n_peers = 3;
	cfg_boot_len = 0;
}

static void queue_clear(void)
{
	for (size_t i = q_head; i < q_n; i++)
		free(queue[i].buf);
	q_head = q_n = 0;
}

static void teardown(void)
{
	for (uint64_t id = 1; id <= MAXN; id++) {
		rps__rnode_close(nodes[id].rn);
		free(nodes[id].items);
		rps__remove_tree(nodes[id].dir);
	}
	memset(nodes, 0, sizeof(nodes));
	queue_clear();
	free(queue);
	queue = NULL;
	q_cap = 0;
	rmdir(base);
}

/* Open (or reopen after a crash) node id; a bootstrap node gets peers3. */
static int open_node(uint64_t id, bool bootstrap)
{
	struct tnode *t = &nodes[id];
	struct rps__rnode_config cfg = {
		.id = id,
		.peers = bootstrap ? peers3 : NULL,
		.n_peers = bootstrap ? cfg_n_peers : 0,
		.boot_state = cfg_boot_len ? cfg_boot : NULL,
		.boot_state_len = cfg_boot_len,
		.dir = t->dir,
		.fsync = cfg_fsync,
		.compact_every = cfg_compact,
		.seed = id * 1000 + t->incarnation,
		.cb = {
			.send = cb_send,
			.apply = cb_apply,
			.conf_change = cb_conf_change,
			.restore = cb_restore,
			.snapshot = cb_snapshot,
			.read_ready = cb_read_ready,
			.role_change = cb_role_change,
			.flush = cb_flush,
			.ctx = t,
		},
		.sync_fn = cb_sync,
		.sync_ctx = t,
	};
	int err;

	/* a fresh process: the state machine and the counters start empty */
	sm_clear(t);
	t->applies = t->order_errors = t->restores = t->conf_changes = t->role_changes = t->reads = 0;
	t->restore_index = t->restore_len = t->restore_items = 0;
	t->last_role = RPS__RAFT_FOLLOWER;
	t->last_leader = 0;
	t->incarnation++;
	err = rps__rnode_open(&cfg, &t->rn);
	t->up = err == 0;
	return err;
}

static void close_node(uint64_t id)
{
	rps__rnode_close(nodes[id].rn);
	nodes[id].rn = NULL;
	nodes[id].up = false;
}

static bool linked(uint64_t from, uint64_t to)
{
	return to >= 1 && to <= MAXN && nodes[to].up && !nodes[to].cut && !nodes[from].cut;
}

static void deliver(void)
{
	while (q_head < q_n) {
		struct qmsg m = queue[q_head++];

		if (linked(m.from, m.to)) {
			CU_ASSERT_EQUAL(rps__rnode_recv(nodes[m.to].rn, m.buf, m.len), 0);
			CU_ASSERT_EQUAL(rps__rnode_process(nodes[m.to].rn), 0);
		}
		free(m.buf);
	}
	q_head = q_n = 0;
}

static void run(unsigned ticks)
{
	deliver();
	for (unsigned k = 0; k < ticks; k++) {
		for (uint64_t id = 1; id <= MAXN; id++)
			if (nodes[id].up) {
				CU_ASSERT_EQUAL(rps__rnode_tick(nodes[id].rn), 0);
				CU_ASSERT_EQUAL(rps__rnode_process(nodes[id].rn), 0);
			}
		deliver();
	}
}

/* The one leader every connected node agrees on, or 0. */
static uint64_t agreed_leader(void)
{
	uint64_t leader = 0;
	unsigned leaders = 0;

	for (uint64_t id = 1; id <= MAXN; id++)
		if (nodes[id].up && !nodes[id].cut && rps__rnode_is_leader(nodes[id].rn)) {
			leader = id;
			leaders++;
		}
	if (leaders != 1)
		return 0;
	for (uint64_t id = 1; id <= MAXN; id++)
		if (nodes[id].up && !nodes[id].cut && rps__rnode_leader(nodes[id].rn) != leader)
			return 0;
	return leader;
}

static uint64_t wait_leader(void)
{
	for (unsigned k = 0; k < 500; k++) {
		uint64_t l = agreed_leader();

		if (l)
			return l;
		run(1);
	}
	return 0;
}

/* Wait until every connected node applied count payloads. */
static bool wait_items(size_t count)
{
	for (unsigned k = 0; k < 200; k++) {
		bool all = true;

		for (uint64_t id = 1; id <= MAXN; id++)
			if (nodes[id].up && !nodes[id].cut && nodes[id].n_items != count)
				all = false;
		if (all)
			return true;
		run(1);
	}
	return false;
}

static int propose(uint64_t id)
{
	char p[PAYLOAD_MAX];
	int n = snprintf(p, sizeof(p), "p%u", next_payload);
	int err = rps__rnode_propose(nodes[id].rn, p, (size_t)n, NULL, NULL);

	if (err == 0)
		next_payload++;
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[id].rn), 0);
	return err;
}

/* The node applied exactly p0, p1, ... p(count-1), in order, at increasing
 * indices, each once. */
static bool has_sequence(const struct tnode *t, size_t count)
{
	if (t->n_items != count)
		return false;
	for (size_t i = 0; i < count; i++) {
		char p[PAYLOAD_MAX];
		int n = snprintf(p, sizeof(p), "p%zu", i);

		if (t->items[i].len != (uint32_t)n || memcmp(t->items[i].data, p, (size_t)n) != 0)
			return false;
		if (i && t->items[i].index <= t->items[i - 1].index)
			return false;
	}
	return true;
}

static bool same_items(const struct tnode *a, const struct tnode *b)
{
	if (a->n_items != b->n_items)
		return false;
	for (size_t i = 0; i < a->n_items; i++)
		if (a->items[i].index != b->items[i].index || a->items[i].len != b->items[i].len ||
		    memcmp(a->items[i].data, b->items[i].data, a->items[i].len) != 0)
			return false;
	return true;
}

static void start_cluster(void)
{
	for (uint64_t id = 1; id <= 3; id++)
		CU_ASSERT_EQUAL_FATAL(open_node(id, true), 0);
}

static uint64_t other_than(uint64_t a, uint64_t b)
{
	for (uint64_t id = 1; id <= 3; id++)
		if (id != a && id != b)
			return id;
	return 0;
}

static size_t count_files(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, prefix, strlen(prefix)))
			n++;
	closedir(d);
	return n;
}

/* ---- tests ----------------------------------------------------------------- */

static void test_bootstrap_and_election(void)
{
	uint64_t l;
	unsigned leaders = 0;

	start_cluster();
	/* open made the bootstrap snapshot durable and handed it to restore */
	for (uint64_t id = 1; id <= 3; id++) {
		struct rps__raft_status st;

		CU_ASSERT_EQUAL(nodes[id].restores, 1);
		CU_ASSERT_EQUAL(nodes[id].restore_index, 1);
		CU_ASSERT_EQUAL(nodes[id].restore_len, 0);
		CU_ASSERT_EQUAL(nodes[id].applies, 0);
		CU_ASSERT_EQUAL(count_files(nodes[id].dir, "snap-"), 1);
		CU_ASSERT_STRING_EQUAL(rps__rnode_recovery_note(nodes[id].rn), "");
		rps__rnode_status(nodes[id].rn, &st);
		CU_ASSERT_EQUAL(st.conf.n_voters, 3);
		CU_ASSERT_EQUAL(st.commit, 1);
		CU_ASSERT_EQUAL(st.applied, 1);
	}
	CU_ASSERT_EQUAL(agreed_leader(), 0);
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	run(5);
	CU_ASSERT_EQUAL(agreed_leader(), l);
	/* role_change told everyone */
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT(nodes[id].role_changes >= 1);
		CU_ASSERT_EQUAL(nodes[id].last_leader, l);
		CU_ASSERT_EQUAL(nodes[id].last_role, id == l ? RPS__RAFT_LEADER : RPS__RAFT_FOLLOWER);
		if (nodes[id].last_role == RPS__RAFT_LEADER)
			leaders++;
		CU_ASSERT_EQUAL(rps__rnode_is_leader(nodes[id].rn), id == l);
	}
	CU_ASSERT_EQUAL(leaders, 1);
	/* the leader's no-op entry commits but is not applied */
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_EQUAL(nodes[id].applies, 0);
		CU_ASSERT_EQUAL(nodes[id].order_errors, 0);
	}
}

static void check_proposals(unsigned count)
{
	uint64_t l, f;
	struct rps__raft_status st;
	uint64_t index, term;

	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	f = other_than(l, 0);
	CU_ASSERT_EQUAL(rps__rnode_propose(nodes[f].rn, "x", 1, NULL, NULL), -EPERM);
	for (unsigned i = 0; i < count; i++) {
		CU_ASSERT_EQUAL(propose(l), 0);
		if (i % 7 == 3)
			run(1);		/* some batches, some single entries */
	}
	CU_ASSERT_TRUE(wait_items(count));
	run(3);
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_TRUE(has_sequence(&nodes[id], count));
		CU_ASSERT_EQUAL(nodes[id].applies, count);
		CU_ASSERT_EQUAL(nodes[id].order_errors, 0);
		CU_ASSERT_TRUE(same_items(&nodes[id], &nodes[l]));
	}
	/* index/term of a proposal name the entry that committed there */
	CU_ASSERT_EQUAL(rps__rnode_propose(nodes[l].rn, "last", 4, &index, &term), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[l].rn), 0);
	run(2);
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_EQUAL(nodes[id].n_items, count + 1);
		CU_ASSERT_EQUAL(nodes[id].items[count].index, index);
		CU_ASSERT_EQUAL(rps__rnode_term_at(nodes[id].rn, index), term);
		rps__rnode_status(nodes[id].rn, &st);
		CU_ASSERT_EQUAL(st.applied, index);
	}
	CU_ASSERT_EQUAL(rps__rnode_term_at(nodes[l].rn, index + 100), 0);
}

static void test_proposals_commit_everywhere(void)
{
	check_proposals(40);
}

static void test_proposals_fsync_always(void)
{
	cfg_fsync = RPS__WAL_FSYNC_ALWAYS;
	check_proposals(10);
}

static unsigned syncs_of(uint64_t id)
{
	return nodes[id].syncs;
}

/* A 3-node cluster with fsync ALWAYS, its leader elected and settled;
 * before[id]: each node's syncs so far, if given.  The leader's id. */
static uint64_t start_synced_cluster(unsigned *before)
{
	uint64_t l;

	cfg_fsync = RPS__WAL_FSYNC_ALWAYS;
	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	run(3);
	for (uint64_t id = 1; before && id <= 3; id++)
		before[id] = syncs_of(id);
	return l;
}

/* fsync ALWAYS: an entry costs every node one sync, the leader's while its
 * append travels; the commit index alone is not synced, but reaches the
 * followers at once (no heartbeat needed) and reaches their disk with the
 * next entry's save. */
static void test_commit_index_not_synced(void)
{
	unsigned before[MAXN + 1];
	uint64_t l, f;

	l = start_synced_cluster(before);

	CU_ASSERT_EQUAL(propose(l), 0);
	/* the leader synced its entry; its append is on its way */
	CU_ASSERT_EQUAL(syncs_of(l), before[l] + 1);
	deliver();	/* appends, acks, the commit index: no tick */
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 1));
		CU_ASSERT_EQUAL(syncs_of(id), before[id] + 1);
	}

	/* the commit index goes to a follower's disk with the next entry */
	CU_ASSERT_EQUAL(propose(l), 0);
	deliver();
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 2));
		CU_ASSERT_EQUAL(syncs_of(id), before[id] + 2);
	}
	/* nor do heartbeats sync the commit index that waits */
	run(3);
	for (uint64_t id = 1; id <= 3; id++)
		CU_ASSERT_EQUAL(syncs_of(id), before[id] + 2);
	f = other_than(l, 0);
	close_node(f);
	CU_ASSERT_EQUAL_FATAL(open_node(f, true), 0);
	/* at open, from disk: at least the first (its commit came with the
	 * second's save) */
	CU_ASSERT(nodes[f].n_items >= 1);
	CU_ASSERT_TRUE(has_sequence(&nodes[f], nodes[f].n_items));
	CU_ASSERT_TRUE(wait_items(2));
	CU_ASSERT_TRUE(has_sequence(&nodes[f], 2));
	CU_ASSERT_EQUAL(nodes[f].order_errors, 0);
}

/* fsync ALWAYS: a leader hands its appends to send, has the transport put
 * them on the wire (flush), and only then syncs its own write, so the
 * followers sync while it does; a follower syncs before it answers. */
static void test_leader_flushes_before_sync(void)
{
	uint64_t l, f;

	l = start_synced_cluster(NULL);
	f = other_than(l, 0);
	nodes[l].n_events = nodes[f].n_events = 0;
	CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_STRING_EQUAL(nodes[l].events, "ssfy");
	deliver();
	CU_ASSERT_EQUAL(strncmp(nodes[f].events, "ys", 2), 0);
	CU_ASSERT_PTR_NULL(strchr(nodes[f].events, 'f'));	/* nothing sent before its sync */
	CU_ASSERT_TRUE(has_sequence(&nodes[f], 1));
}

/* Proposals made before one process share one WAL write and sync on every
 * node, and one append message per follower. */
static void test_batched_proposals_one_sync(void)
{
	unsigned before[MAXN + 1];
	uint64_t l;
	size_t apps = 0;

	l = start_synced_cluster(before);
	for (unsigned i = 0; i < 5; i++) {
		char p[PAYLOAD_MAX];
		int n = snprintf(p, sizeof(p), "p%u", next_payload++);

		CU_ASSERT_EQUAL(rps__rnode_propose(nodes[l].rn, p, (size_t)n, NULL, NULL), 0);
	}
	CU_ASSERT_EQUAL(q_n, 0);	/* nothing before process */
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[l].rn), 0);
	CU_ASSERT_EQUAL(syncs_of(l), before[l] + 1);
	for (size_t i = q_head; i < q_n; i++)
		apps += queue[i].from == l;
	CU_ASSERT_EQUAL(apps, 2);	/* one append to each follower */
	deliver();
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 5));
		CU_ASSERT_EQUAL(syncs_of(id), before[id] + 1);
	}
}

static void test_restart_replays_once(void)
{
	uint64_t l, l2;
	struct tnode saved[MAXN + 1];

	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	for (unsigned i = 0; i < 10; i++)
		CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(10));

	/* the leader crashes; the other two elect a leader and go on */
	close_node(l);
	l2 = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l2, 0);
	CU_ASSERT_NOT_EQUAL(l2, l);
	for (unsigned i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(propose(l2), 0);
	CU_ASSERT_TRUE(wait_items(13));
	CU_ASSERT_EQUAL(nodes[l].n_items, 10);

	/* then the rest crash too, and everyone comes back from disk */
	for (uint64_t id = 1; id <= 3; id++)
		if (nodes[id].up)
			close_node(id);
	memcpy(saved, nodes, sizeof(saved));
	for (uint64_t id = 1; id <= 3; id++) {
		/* the item arrays are reused by the reopened node: compare
		 * against copies of the contents */
		saved[id].items = malloc(nodes[id].n_items * sizeof(struct item) + 1);
		CU_ASSERT_PTR_NOT_NULL_FATAL(saved[id].items);
		memcpy(saved[id].items, nodes[id].items, nodes[id].n_items * sizeof(struct item));
		CU_ASSERT_EQUAL(open_node(id, true), 0);
	}
	for (uint64_t id = 1; id <= 3; id++) {
		size_t want = id == l ? 10 : 13;

		/* restore (the bootstrap state), then every committed entry
		 * exactly once, before open returned */
		CU_ASSERT_EQUAL(nodes[id].restores, 1);
		CU_ASSERT_EQUAL(nodes[id].restore_index, 1);
		CU_ASSERT_EQUAL(nodes[id].restore_len, 0);
		CU_ASSERT_EQUAL(nodes[id].applies, want);
		CU_ASSERT_TRUE(has_sequence(&nodes[id], want));
		CU_ASSERT_TRUE(same_items(&nodes[id], &saved[id]));
		free(saved[id].items);
	}
	/* processing does not apply anything again */
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_EQUAL(rps__rnode_process(nodes[id].rn), 0);
		CU_ASSERT_EQUAL(nodes[id].applies, id == l ? 10u : 13u);
	}
	CU_ASSERT_EQUAL(q_n, 0);	/* nothing sent before the first tick */

	/* the cluster continues */
	l2 = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l2, 0);
	for (unsigned i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(propose(l2), 0);
	CU_ASSERT_TRUE(wait_items(18));
	run(3);
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 18));
		CU_ASSERT_EQUAL(nodes[id].applies, 18);
		CU_ASSERT_EQUAL(nodes[id].restores, 1);
		CU_ASSERT_EQUAL(nodes[id].order_errors, 0);
	}
}

static void test_compaction_and_snapshot_catch_up(void)
{
	uint64_t l, c, f;
	struct rps__raft_status st;
	size_t before;
	uint64_t snap_index;

	cfg_compact = 8;
	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	c = other_than(l, 0);
	f = other_than(l, c);
	for (unsigned i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(3));

	/* c is cut off while 30 more commit and the others compact */
	nodes[c].cut = true;
	for (unsigned i = 0; i < 30; i++) {
		CU_ASSERT_EQUAL(propose(l), 0);
		run(1);
	}
	CU_ASSERT_TRUE(wait_items(33));
	CU_ASSERT_EQUAL(nodes[c].n_items, 3);
	rps__rnode_status(nodes[l].rn, &st);
	CU_ASSERT(st.snapshot_index >= 8 + 1);
	CU_ASSERT(st.applied - st.snapshot_index < 8);
	snap_index = st.snapshot_index;
	rps__rnode_status(nodes[f].rn, &st);
	CU_ASSERT(st.snapshot_index >= 8 + 1);
	/* the WAL keeps two snapshots; the bootstrap one is gone */
	CU_ASSERT_EQUAL(count_files(nodes[l].dir, "snap-"), 2);
	CU_ASSERT_EQUAL(count_files(nodes[l].dir, "snap-0000000000000001-"), 0);
	CU_ASSERT_EQUAL(nodes[c].restores, 1);

	/* back: the leader's log no longer reaches c's, so a snapshot */
	nodes[c].cut = false;
	CU_ASSERT_TRUE(wait_items(33));
	run(3);
	CU_ASSERT_EQUAL(nodes[c].restores, 2);
	CU_ASSERT_EQUAL(nodes[c].restore_index, snap_index);
	CU_ASSERT(nodes[c].restore_len > 0);
	/* the snapshot held what the leader applied up to it, the entries
	 * after it were applied one by one */
	CU_ASSERT(nodes[c].restore_items > 3);
	CU_ASSERT_EQUAL(nodes[c].applies, 3 + (33 - nodes[c].restore_items));
	CU_ASSERT(nodes[c].items[nodes[c].restore_items - 1].index <= snap_index);
	if (nodes[c].restore_items < 33)
		CU_ASSERT(nodes[c].items[nodes[c].restore_items].index > snap_index);
	CU_ASSERT_EQUAL(nodes[c].order_errors, 0);
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 33));
		CU_ASSERT_TRUE(same_items(&nodes[id], &nodes[l]));
	}

	/* more entries flow normally to c */
	before = nodes[c].applies;
	for (unsigned i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(37));
	CU_ASSERT_EQUAL(nodes[c].applies, before + 4);
	CU_ASSERT_EQUAL(nodes[c].restores, 2);

	/* c restarts from its WAL: its snapshot, then the rest */
	rps__rnode_status(nodes[c].rn, &st);
	snap_index = st.snapshot_index;
	close_node(c);
	CU_ASSERT_EQUAL(open_node(c, true), 0);
	CU_ASSERT_EQUAL(nodes[c].restores, 1);
	CU_ASSERT_EQUAL(nodes[c].restore_index, snap_index);
	CU_ASSERT(nodes[c].restore_len > 0);
	CU_ASSERT_EQUAL(nodes[c].applies, 37 - nodes[c].restore_items);
	CU_ASSERT_TRUE(has_sequence(&nodes[c], 37));
	run(5);
	CU_ASSERT_TRUE(has_sequence(&nodes[c], 37));
	CU_ASSERT_EQUAL(nodes[c].order_errors, 0);
}

/* cfg_boot: a state machine of one item, index 0, holding text. */
static void set_boot_state(const char *text)
{
	uint64_t count = 1, index = 0;
	uint32_t len = (uint32_t)strlen(text);

	memcpy(cfg_boot, &count, 8);
	memcpy(cfg_boot + 8, &index, 8);
	memcpy(cfg_boot + 16, &len, 4);
	memcpy(cfg_boot + 20, text, len);
	cfg_boot_len = 20 + len;
}

static bool boot_item_is(const struct tnode *t, const char *text)
{
	return t->n_items >= 1 && t->items[0].index == 0 && t->items[0].len == strlen(text) &&
	       memcmp(t->items[0].data, text, strlen(text)) == 0;
}

/* A new cluster's initial state is in its bootstrap snapshot: a restart
 * replays onto that one even if it is given another, and a node that joins
 * later receives it from the leader. */
static void test_bootstrap_state_kept(void)
{
	uint64_t l, idx = 0;
	size_t formed_len;

	set_boot_state("formed");
	formed_len = cfg_boot_len;
	start_cluster();
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_EQUAL(nodes[id].restores, 1);
		CU_ASSERT_EQUAL(nodes[id].restore_index, 1);
		CU_ASSERT_EQUAL(nodes[id].restore_len, formed_len);
		CU_ASSERT_EQUAL(nodes[id].restore_items, 1);
		CU_ASSERT_TRUE(boot_item_is(&nodes[id], "formed"));
	}
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	for (unsigned i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(5));

	/* every node restarts with another initial state: unused */
	for (uint64_t id = 1; id <= 3; id++)
		close_node(id);
	set_boot_state("other");
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_EQUAL_FATAL(open_node(id, true), 0);
		CU_ASSERT_EQUAL(nodes[id].restores, 1);
		CU_ASSERT_EQUAL(nodes[id].restore_len, formed_len);
		CU_ASSERT_TRUE(boot_item_is(&nodes[id], "formed"));
		CU_ASSERT_EQUAL(nodes[id].applies, 4);
		CU_ASSERT_EQUAL(nodes[id].n_items, 5);
	}

	/* a node that joins gets it with the leader's snapshot */
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	CU_ASSERT_EQUAL_FATAL(open_node(4, false), 0);
	CU_ASSERT_EQUAL(rps__rnode_conf_change(nodes[l].rn, RPS__RAFT_CONF_ADD_LEARNER, 4, &idx), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[l].rn), 0);
	CU_ASSERT_TRUE(wait_items(5));
	CU_ASSERT_EQUAL(nodes[4].restores, 1);
	CU_ASSERT_EQUAL(nodes[4].restore_len, formed_len);
	CU_ASSERT_TRUE(boot_item_is(&nodes[4], "formed"));
}

static void test_learner_joins_and_is_promoted(void)
{
	uint64_t l, idx = 0;
	struct rps__raft_status st;
	int err = -EAGAIN;

	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	for (unsigned i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(5));

	/* a fresh node with no peers: it waits for the leader */
	CU_ASSERT_EQUAL_FATAL(open_node(4, false), 0);
	CU_ASSERT_EQUAL(nodes[4].restores, 0);
	rps__rnode_status(nodes[4].rn, &st);
	CU_ASSERT_EQUAL(st.conf.n_voters, 0);
	CU_ASSERT_FALSE(st.promotable);
	CU_ASSERT_EQUAL(rps__rnode_campaign(nodes[4].rn), -EPERM);

	CU_ASSERT_EQUAL(rps__rnode_conf_change(nodes[l].rn, RPS__RAFT_CONF_ADD_LEARNER, 4, &idx), 0);
	CU_ASSERT(idx > 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[l].rn), 0);
	CU_ASSERT_TRUE(wait_items(5));
	run(3);
	/* the bootstrap snapshot from the leader, then the log */
	CU_ASSERT_EQUAL(nodes[4].restores, 1);
	CU_ASSERT_EQUAL(nodes[4].restore_index, 1);
	CU_ASSERT_EQUAL(nodes[4].restore_len, 0);
	CU_ASSERT_TRUE(has_sequence(&nodes[4], 5));
	rps__rnode_status(nodes[4].rn, &st);
	CU_ASSERT_TRUE(rps__raft_conf_is_learner(&st.conf, 4));
	CU_ASSERT_FALSE(st.promotable);

	for (unsigned k = 0; k < 50 && err == -EAGAIN; k++) {
		err = rps__rnode_conf_change(nodes[l].rn, RPS__RAFT_CONF_PROMOTE, 4, NULL);
		if (err == -EAGAIN)
			run(1);
	}
	CU_ASSERT_EQUAL(err, 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[l].rn), 0);
	run(3);
	for (uint64_t id = 1; id <= 4; id++) {
		rps__rnode_status(nodes[id].rn, &st);
		CU_ASSERT_EQUAL(st.conf.n_voters, 4);
		CU_ASSERT_EQUAL(st.conf.n_learners, 0);
		CU_ASSERT_TRUE(rps__raft_conf_is_voter(&st.conf, 4));
		/* both changes, in order, once */
		CU_ASSERT_EQUAL(nodes[id].conf_changes, 2);
		CU_ASSERT_EQUAL(nodes[id].conf_ops[0], RPS__RAFT_CONF_ADD_LEARNER);
		CU_ASSERT_EQUAL(nodes[id].conf_nodes[0], 4);
		CU_ASSERT_EQUAL(nodes[id].conf_ops[1], RPS__RAFT_CONF_PROMOTE);
		CU_ASSERT_EQUAL(nodes[id].conf_nodes[1], 4);
	}
	rps__rnode_status(nodes[4].rn, &st);
	CU_ASSERT_TRUE(st.promotable);

	for (unsigned i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(10));
	for (uint64_t id = 1; id <= 4; id++) {
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 10));
		CU_ASSERT_TRUE(same_items(&nodes[id], &nodes[l]));
		CU_ASSERT_EQUAL(nodes[id].order_errors, 0);
	}
	CU_ASSERT_EQUAL(nodes[4].applies, 10);
	/* a quorum of the four without the old leader elects one */
	close_node(l);
	CU_ASSERT_NOT_EQUAL(wait_leader(), 0);
	CU_ASSERT_NOT_EQUAL(agreed_leader(), l);
}

static void test_transfer_leader(void)
{
	uint64_t l, t;

	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(1));
	t = other_than(l, 0);
	CU_ASSERT_EQUAL(rps__rnode_transfer_leader(nodes[t].rn, l), -EPERM);
	CU_ASSERT_EQUAL(rps__rnode_transfer_leader(nodes[l].rn, 9), -EINVAL);
	CU_ASSERT_EQUAL(rps__rnode_transfer_leader(nodes[l].rn, t), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[l].rn), 0);
	deliver();
	CU_ASSERT_EQUAL(agreed_leader(), t);
	run(3);
	CU_ASSERT_EQUAL(agreed_leader(), t);
	for (uint64_t id = 1; id <= 3; id++) {
		CU_ASSERT_EQUAL(nodes[id].last_leader, t);
		CU_ASSERT_EQUAL(nodes[id].last_role, id == t ? RPS__RAFT_LEADER : RPS__RAFT_FOLLOWER);
	}
	CU_ASSERT_EQUAL(propose(l), -EPERM);
	CU_ASSERT_EQUAL(propose(t), 0);
	CU_ASSERT_TRUE(wait_items(2));
	for (uint64_t id = 1; id <= 3; id++)
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 2));
}

static void test_read_index(void)
{
	uint64_t l, f;

	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	for (unsigned i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(4));
	run(2);
	f = other_than(l, 0);
	CU_ASSERT_EQUAL(rps__rnode_read(nodes[l].rn, 0x100), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[l].rn), 0);
	CU_ASSERT_EQUAL(rps__rnode_read(nodes[f].rn, 0x200), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[f].rn), 0);
	run(2);
	CU_ASSERT_EQUAL(nodes[l].reads, 1);
	CU_ASSERT_EQUAL(nodes[l].read_ctx, 0x100);
	CU_ASSERT_EQUAL(nodes[l].read_index, nodes[l].items[3].index);
	CU_ASSERT(nodes[l].read_applied >= nodes[l].read_index);
	CU_ASSERT_EQUAL(nodes[f].reads, 1);
	CU_ASSERT_EQUAL(nodes[f].read_ctx, 0x200);
	CU_ASSERT_EQUAL(nodes[f].read_index, nodes[l].items[3].index);
	CU_ASSERT(nodes[f].read_applied >= nodes[f].read_index);

	/* a follower that lags: the read index is past what it applied, so
	 * the read waits until it has caught up (no ticks: no election) */
	nodes[f].cut = true;
	CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_EQUAL(propose(l), 0);
	deliver();
	CU_ASSERT_EQUAL(nodes[l].n_items, 6);
	CU_ASSERT_EQUAL(nodes[f].n_items, 4);
	nodes[f].cut = false;
	CU_ASSERT_EQUAL(rps__rnode_read(nodes[f].rn, 0x300), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[f].rn), 0);
	deliver();
	run(2);
	CU_ASSERT_EQUAL(nodes[f].reads, 2);
	CU_ASSERT_EQUAL(nodes[f].read_ctx, 0x300);
	CU_ASSERT_EQUAL(nodes[f].read_index, nodes[l].items[5].index);
	CU_ASSERT(nodes[f].read_applied >= nodes[f].read_index);
	CU_ASSERT_EQUAL(nodes[f].n_items, 6);
}

static void test_corrupted_message_refused(void)
{
	uint64_t l, f;
	struct rps__raft_status a, b;
	struct qmsg m = { 0 };
	uint8_t *bad;

	start_cluster();
	l = wait_leader();
	CU_ASSERT_NOT_EQUAL_FATAL(l, 0);
	CU_ASSERT_EQUAL(propose(l), 0);
	CU_ASSERT_TRUE(wait_items(1));
	run(2);
	/* take an append carrying an entry out of the queue */
	CU_ASSERT_EQUAL(propose(l), 0);
	f = other_than(l, 0);
	for (size_t i = q_head; i < q_n; i++)
		if (queue[i].to == f) {
			m = queue[i];
			queue[i].to = 0;	/* delivered by hand below */
			break;
		}
	CU_ASSERT_PTR_NOT_NULL_FATAL(m.buf);
	bad = malloc(m.len + 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(bad);

	rps__rnode_status(nodes[f].rn, &a);
	memcpy(bad, m.buf, m.len);
	CU_ASSERT_EQUAL(rps__rnode_recv(nodes[f].rn, bad, m.len - 1), -EBADMSG);	/* truncated */
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "malformed"));
	bad[m.len] = 0;
	CU_ASSERT_EQUAL(rps__rnode_recv(nodes[f].rn, bad, m.len + 1), -EBADMSG);	/* trailing byte */
	bad[0] ^= 0x40;									/* version */
	CU_ASSERT_EQUAL(rps__rnode_recv(nodes[f].rn, bad, m.len), -EBADMSG);
	bad[0] ^= 0x40;
	bad[1] = 0xee;									/* type */
	CU_ASSERT_EQUAL(rps__rnode_recv(nodes[f].rn, bad, m.len), -EBADMSG);
	CU_ASSERT_EQUAL(rps__rnode_recv(nodes[f].rn, bad, 0), -EBADMSG);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[f].rn), 0);
	rps__rnode_status(nodes[f].rn, &b);
	CU_ASSERT_EQUAL(a.term, b.term);
	CU_ASSERT_EQUAL(a.vote, b.vote);
	CU_ASSERT_EQUAL(a.commit, b.commit);
	CU_ASSERT_EQUAL(a.applied, b.applied);
	CU_ASSERT_EQUAL(a.last_index, b.last_index);
	CU_ASSERT_EQUAL(a.role, b.role);
	CU_ASSERT_EQUAL(a.leader, b.leader);
	CU_ASSERT_EQUAL(nodes[f].n_items, 1);
	for (size_t i = q_head; i < q_n; i++)
		CU_ASSERT_NOT_EQUAL(queue[i].from, f);	/* nothing answered */

	/* the intact message still works */
	CU_ASSERT_EQUAL(rps__rnode_recv(nodes[f].rn, m.buf, m.len), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[f].rn), 0);
	rps__rnode_status(nodes[f].rn, &b);
	CU_ASSERT_EQUAL(b.last_index, a.last_index + 1);
	free(bad);
	CU_ASSERT_TRUE(wait_items(2));
	for (uint64_t id = 1; id <= 3; id++)
		CU_ASSERT_TRUE(has_sequence(&nodes[id], 2));
}

/* Hand node `to` an encoded message of the given type and term from `from`. */
static int recv_forged(uint64_t to, uint8_t type, uint64_t from, uint64_t term)
{
	struct rps__raft_msg m = { .type = type, .to = to, .from = from, .term = term };
	uint8_t buf[256];
	size_t len;

	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&m, buf, sizeof(buf), &len), 0);
	return rps__rnode_recv(nodes[to].rn, buf, len);
}

/* One message with a term that cannot be incremented used to make the node
 * campaign at term 0, which the WAL refused, then and on every restart. */
static void test_unusable_term_leaves_node_restartable(void)
{
	struct rps__raft_status a, b;

	cfg_n_peers = 1;	/* a single voter campaigns alone: nothing stops it */
	CU_ASSERT_EQUAL_FATAL(open_node(1, true), 0);
	CU_ASSERT_EQUAL(rps__rnode_campaign(nodes[1].rn), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[1].rn), 0);
	CU_ASSERT_EQUAL_FATAL(wait_leader(), 1);
	CU_ASSERT_EQUAL(propose(1), 0);
	CU_ASSERT_TRUE(wait_items(1));
	rps__rnode_status(nodes[1].rn, &a);

	CU_ASSERT_EQUAL(recv_forged(1, RPS__RAFT_MSG_APP_RESP, 2, UINT64_MAX), -EPROTO);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "cannot be incremented"));
	CU_ASSERT_EQUAL(recv_forged(1, RPS__RAFT_MSG_HEARTBEAT, 2, UINT64_MAX), -EPROTO);
	/* a connection from member 3 cannot speak for 2 */
	{
		struct rps__raft_msg m = { .type = RPS__RAFT_MSG_HEARTBEAT, .to = 1, .from = 2, .term = a.term + 1 };
		uint8_t buf[256];
		size_t len;

		CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&m, buf, sizeof(buf), &len), 0);
		CU_ASSERT_EQUAL(rps__rnode_recv_from(nodes[1].rn, 3, buf, len), -EPROTO);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "sent by 3"));
	}
	/* a non-member's answer of a higher term is dropped too */
	CU_ASSERT_EQUAL(recv_forged(1, RPS__RAFT_MSG_APP_RESP, 2, a.term + 1), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[1].rn), 0);
	run(50);
	rps__rnode_status(nodes[1].rn, &b);
	CU_ASSERT_EQUAL(b.term, a.term);
	CU_ASSERT_EQUAL(b.role, RPS__RAFT_LEADER);
	CU_ASSERT_EQUAL(b.refused, 3);

	/* the same directory opens again and the node goes on */
	close_node(1);
	CU_ASSERT_EQUAL_FATAL(open_node(1, true), 0);
	rps__rnode_status(nodes[1].rn, &b);
	CU_ASSERT_EQUAL(b.term, a.term);
	CU_ASSERT_EQUAL(nodes[1].n_items, 1);
	CU_ASSERT_EQUAL(rps__rnode_campaign(nodes[1].rn), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[1].rn), 0);
	CU_ASSERT_EQUAL_FATAL(wait_leader(), 1);
	CU_ASSERT_EQUAL(propose(1), 0);
	CU_ASSERT_TRUE(wait_items(2));
	CU_ASSERT_TRUE(has_sequence(&nodes[1], 2));
}

/* The path of the node's only log segment, NULL if it has several. */
static const char *only_segment(uint64_t id)
{
	static char path[512];
	DIR *d = opendir(nodes[id].dir);
	struct dirent *de;
	unsigned n = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, "wal-", 4)) {
			snprintf(path, sizeof(path), "%s/%s", nodes[id].dir, de->d_name);
			n++;
		}
	closedir(d);
	return n == 1 ? path : NULL;
}

/* A segment cut in the middle used to pass for a torn tail: the node came
 * back with a third of its committed entries and led a new term. */
static void test_truncated_log_refused_at_open(void)
{
	const char *seg;
	off_t size;

	cfg_n_peers = 1;
	cfg_fsync = RPS__WAL_FSYNC_ALWAYS;
	CU_ASSERT_EQUAL_FATAL(open_node(1, true), 0);
	CU_ASSERT_EQUAL(rps__rnode_campaign(nodes[1].rn), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[1].rn), 0);
	CU_ASSERT_EQUAL_FATAL(wait_leader(), 1);
	for (unsigned i = 0; i < 12; i++)
		CU_ASSERT_EQUAL(propose(1), 0);
	CU_ASSERT_TRUE(wait_items(12));
	close_node(1);

	seg = only_segment(1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(seg);
	{
		FILE *f = fopen(seg, "rb");

		CU_ASSERT_PTR_NOT_NULL_FATAL(f);
		fseeko(f, 0, SEEK_END);
		size = ftello(f);
		fclose(f);
	}
	CU_ASSERT_EQUAL_FATAL(truncate(seg, size / 2 + 3), 0);
	CU_ASSERT_EQUAL(open_node(1, true), -EBADMSG);
	CU_ASSERT_PTR_NULL(nodes[1].rn);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), ") is out of range [lastIndex("));
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "was the raft log corrupted, truncated, or lost?"));
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), nodes[1].dir));
	CU_ASSERT_PTR_NULL(strchr(rps__errbuf(), '\n'));
	/* and so on every try: nothing was repaired in between */
	CU_ASSERT_EQUAL(open_node(1, true), -EBADMSG);
	CU_ASSERT_EQUAL(nodes[1].n_items, 0);
}

static void test_dir_in_use(void)
{
	struct rps__rnode *second = NULL;
	struct rps__rnode_config cfg = {
		.id = 1,
		.peers = peers3,
		.n_peers = 3,
		.dir = nodes[1].dir,
		.fsync = RPS__WAL_FSYNC_NONE,
		.cb = {
			.send = cb_send,
			.apply = cb_apply,
			.restore = cb_restore,
			.snapshot = cb_snapshot,
			.ctx = &nodes[4],
		},
	};

	CU_ASSERT_EQUAL_FATAL(open_node(1, true), 0);
	CU_ASSERT_EQUAL(rps__rnode_open(&cfg, &second), -EBUSY);
	CU_ASSERT_PTR_NULL(second);
	CU_ASSERT_NOT_EQUAL(rps__errbuf()[0], '\0');
	/* the first one is unaffected */
	CU_ASSERT_EQUAL(rps__rnode_campaign(nodes[1].rn), 0);
	CU_ASSERT_EQUAL(rps__rnode_process(nodes[1].rn), 0);
	/* bad configurations */
	cfg.id = 0;
	CU_ASSERT_EQUAL(rps__rnode_open(&cfg, &second), -EINVAL);
	cfg.id = 1;
	cfg.cb.send = NULL;
	CU_ASSERT_EQUAL(rps__rnode_open(&cfg, &second), -EINVAL);
	CU_ASSERT_PTR_NULL(second);
}

/* Write a WAL in node 1's directory holding only a snapshot of nv voters
 * (1, 2, ...) and nl learners (1001, 1002, ...), as a node would have. */
static void wal_with_conf(size_t nv, size_t nl)
{
	static uint64_t voters[RPS__RAFT_MAX_NODES + 1], learners[RPS__RAFT_MAX_NODES + 1];
	struct rps__wal_snapshot ws = { .index = 5, .term = 2, .voters = voters, .n_voters = nv,
					.learners = learners, .n_learners = nl };
	struct rps__wal_opts wo = { .fsync = RPS__WAL_FSYNC_NONE };
	struct rps__wal_recovered rec;
	struct rps__wal *w = NULL;

	for (size_t i = 0; i <= RPS__RAFT_MAX_NODES; i++) {
		voters[i] = i + 1;
		learners[i] = i + 1001;
	}
	rps__remove_tree(nodes[1].dir);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(nodes[1].dir, &wo, &w, &rec), 0);
	rps__wal_recovered_free(&rec);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &ws), 0);
	rps__wal_close(w);
}

/* The configuration a snapshot on disk claims is checked against the core's
 * bounds before the core sees it: 16 voters and 1,008 learners open, 17
 * voters or 1,025 nodes are refused, with a message that says so. */
static void test_snapshot_conf_bounds_at_open(void)
{
	struct rps__raft_status st;

	wal_with_conf(RPS__RAFT_MAX_VOTERS + 1, 0);
	CU_ASSERT_EQUAL(open_node(1, false), -EBADMSG);
	CU_ASSERT_PTR_NULL(nodes[1].rn);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "has 17 voters, 0 learners"));
	wal_with_conf(RPS__RAFT_MAX_VOTERS, RPS__RAFT_MAX_NODES - RPS__RAFT_MAX_VOTERS + 1);
	CU_ASSERT_EQUAL(open_node(1, false), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "has 16 voters, 1009 learners"));
	wal_with_conf(0, RPS__RAFT_MAX_NODES + 1);
	CU_ASSERT_EQUAL(open_node(1, false), -EBADMSG);

	wal_with_conf(RPS__RAFT_MAX_VOTERS, RPS__RAFT_MAX_NODES - RPS__RAFT_MAX_VOTERS);
	CU_ASSERT_EQUAL_FATAL(open_node(1, false), 0);
	rps__rnode_status(nodes[1].rn, &st);
	CU_ASSERT_EQUAL(st.conf.n_voters, 16);
	CU_ASSERT_EQUAL(st.conf.n_learners, 1008);
	CU_ASSERT_EQUAL(st.conf.voters[15], 16);
	CU_ASSERT_EQUAL(st.conf.learners[1007], 2008);
	CU_ASSERT_EQUAL(st.snapshot_index, 5);
	CU_ASSERT_EQUAL(nodes[1].restore_index, 5);
	close_node(1);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "bootstrap, one leader, role_change", test_bootstrap_and_election },
		{ "proposals apply everywhere in order, once", test_proposals_commit_everywhere },
		{ "the same with fsync ALWAYS", test_proposals_fsync_always },
		{ "fsync ALWAYS: one sync per entry per node, the commit index unsynced but prompt",
		  test_commit_index_not_synced },
		{ "fsync ALWAYS: a leader's appends are flushed to the wire before its sync",
		  test_leader_flushes_before_sync },
		{ "proposals before one process: one sync per node, one append per follower",
		  test_batched_proposals_one_sync },
		{ "crash and reopen: replay without double applies", test_restart_replays_once },
		{ "compaction; a cut-off node catches up by snapshot", test_compaction_and_snapshot_catch_up },
		{ "a learner joins and is promoted", test_learner_joins_and_is_promoted },
		{ "the bootstrap state is kept: restarts and joiners get the one formed", test_bootstrap_state_kept },
		{ "leadership transfer", test_transfer_leader },
		{ "ReadIndex on leader and follower", test_read_index },
		{ "corrupted messages refused, nothing changes", test_corrupted_message_refused },
		{ "directory already open: -EBUSY", test_dir_in_use },
		{ "a term that cannot be incremented leaves the node restartable",
		  test_unusable_term_leaves_node_restartable },
		{ "a log truncated below its commit index is refused", test_truncated_log_refused_at_open },
		{ "a snapshot on disk with 17 voters or 1,025 nodes is refused", test_snapshot_conf_bounds_at_open },
	};
	const struct cutest_suite suites[] = {
		{ "rnode", NULL, NULL, setup, teardown, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
