/*
 * test_cplane.c - unit tests of the control plane through the seam: one
 * member's control plane (a real Raft node and log, one voter) driven
 * against a FAKE data plane (the ops table of server/dataplane.h), which
 * records what it is asked.  The tests check the order of what a move asks
 * of the data plane (refuse, fence, serialise, forget parked pushes; drop
 * after the commit; install on the destination; unfence on abort), that
 * stale or corrupt offers are refused, and a checkpoint's hold and take;
 * then leases and failure detection on a clock the tests move
 * (rps__cp_fake_clock_ns): grants after the ReadIndex round, the lease's
 * end, when a member is declared failed, what is proposed then.
 * Peers and psctl are fake connections whose replies are recorded.
 */
#include "config.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "control/ckpt.h"
#include "control/cplane.h"
#include "proto/smap.h"

#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"
#include "lib/tmpdir.h"

#define NPART 4u
#define NPART_R 8u	/* the replica tests' fresh cluster: twice the seedings a primary runs at once */
#define SEED_MAX 4u	/* (SEED_MAX_PER_SRC) */
static uint32_t the_npart = NPART;	/* partitions of the cluster under test */
#define T0 1000000000000ull	/* the failover clock at the start (ns) */
#define MS 1000000ull
#define FAILOVER_NS (1000 * MS)	/* --failover-ms's default */
#define LEASE_NS (FAILOVER_NS / 2)

/* ---- the fake data plane ------------------------------------------------ */

struct srv_conn {
	enum conn_role_kind role;
	uint64_t peer_id;
	bool dead;
	const char *name;
	/* what was sent over it */
	unsigned last_type;
	uint64_t last_req_id;
	int32_t last_status;
	_Alignas(8) char last_body[1024];	/* (replies are read as their structs) */
	size_t last_len;
	unsigned nreplies;
	/* LEASE_REP sent over it (Raft messages go over it too) */
	struct rps__lease_rep lease_rep;
	int32_t lease_status;
	unsigned nlease_reps;
	/* SEED offers sent over it: which partitions (bit p), the last one */
	uint64_t seeds;
	struct rps__seed last_seed;
	/* conn_read */
	bool reading;
	uint64_t read_len;
};

#define LOG_MAX 4096
struct rps__server {
	char log[LOG_MAX][48];	/* what the control plane asked, in order */
	unsigned nlog;
	uint64_t my_id;
	uint32_t npart;
	uint64_t applied;
	struct rps__dp_part parts[RPS__SMAP_MAX_PART];
	void *mapbuf;
	bool fence_ok;		/* part_fence's answer */
	bool reached;		/* hold_reached's answer */
	int mr_next;
	float params[8];
	uint64_t lease_until;	/* set_lease */
	unsigned nleases;
	uint64_t diverged[RPS__SMAP_MAX_PART];	/* part_diverged's answer */
};

static struct rps__server fake;

static void note(const char *fmt, unsigned p)
{
	if (fake.nlog < LOG_MAX)
		snprintf(fake.log[fake.nlog++], sizeof(fake.log[0]), fmt, p);
}

/* The index of the first entry equal to what, from `from` on; -1 if none. */
static int logged(const char *what, int from)
{
	for (unsigned i = (unsigned)(from < 0 ? 0 : from); i < fake.nlog; i++)
		if (!strcmp(fake.log[i], what))
			return (int)i;
	return -1;
}

static void f_set_member_id(struct rps__server *s, uint64_t id) { s->my_id = id; }
static void f_set_map(struct rps__server *s, uint32_t npart, uint64_t applied)
{
	s->npart = npart;
	s->applied = applied;
}
static int f_map_register(struct rps__server *s, void *buf, size_t len) { (void)len; s->mapbuf = buf; return 0; }
static void f_map_deregister(struct rps__server *s) { s->mapbuf = NULL; }
static int f_mem_register(struct rps__server *s, void *buf, size_t len, struct rps__mr **mr)
{
	(void)buf;
	(void)len;
	*mr = (struct rps__mr *)(uintptr_t)(0x1000 + s->mr_next++);
	note("mem_register", 0);
	return 0;
}
static void f_mem_deregister(struct rps__mr *mr) { if (mr) note("mem_deregister", 0); }
static int f_mem_window(struct srv_conn *c, struct rps__mr *mr, uint32_t *rkey)
{
	(void)c;
	*rkey = (uint32_t)(uintptr_t)mr;
	return 0;
}
static uint16_t f_port(const struct rps__server *s) { (void)s; return 7000; }
static uint32_t f_shard_elems(const struct rps__server *s) { (void)s; return 4; }
static void f_stats(struct rps__server *s, struct rps__dp_stats *st) { (void)s; memset(st, 0, sizeof(*st)); }

static void f_conn_reply(struct srv_conn *c, unsigned type, uint64_t req_id, int32_t status, const void *body,
			 size_t len)
{
	if (type == RPS__MSG_LEASE_REP) {
		c->lease_status = status;
		memcpy(&c->lease_rep, body, sizeof(c->lease_rep));
		c->nlease_reps++;
	}
	if (type == RPS__MSG_SEED) {
		c->seeds |= 1ull << (req_id & 63);
		memcpy(&c->last_seed, body, sizeof(c->last_seed));
	}
	c->last_type = type;
	c->last_req_id = req_id;
	c->last_status = status;
	c->last_len = body ? RPS__MIN(len, sizeof(c->last_body)) : 0;
	if (body)
		memcpy(c->last_body, body, c->last_len);
	c->nreplies++;
}
static void f_conn_fail(struct srv_conn *c, const char *why) { (void)why; c->dead = true; }
static enum conn_role_kind f_conn_role(const struct srv_conn *c) { return c->role; }
static uint64_t f_conn_peer_id(const struct srv_conn *c) { return c->peer_id; }
static bool f_conn_dead(const struct srv_conn *c) { return c->dead; }
static const char *f_conn_name(const struct srv_conn *c) { return c->name; }
static size_t f_conn_msg_max(const struct srv_conn *c) { (void)c; return RPS__BIG_MSG_MAX; }
static int f_conn_read(struct srv_conn *c, uint64_t raddr, uint32_t rkey, uint64_t len)
{
	(void)raddr;
	(void)rkey;
	c->reading = true;
	c->read_len = len;
	note("conn_read", 0);
	return 0;
}
static int f_peer_dial(struct rps__server *s, const char *uri, uint64_t to_id)
{
	(void)s;
	(void)uri;
	(void)to_id;
	return -EHOSTUNREACH;	/* nobody answers */
}

static void f_part_set(struct rps__server *s, uint32_t p, const struct rps__dp_part *v) { s->parts[p] = *v; }
static void f_part_create(struct rps__server *s, uint32_t p) { (void)s; note("create %u", p); }
static void f_part_promote(struct rps__server *s, uint32_t p, uint64_t epoch)
{
	/* serving is set after the promotion, not before */
	note(s->parts[p].serving || epoch != s->parts[p].map_epoch ? "promote %u early" : "promote %u", p);
}
static void f_part_publish(struct rps__server *s, uint32_t p, uint64_t epoch)
{
	(void)s;
	note(epoch == RPS__EPOCH_MOVED ? "publish %u moved" : "publish %u", p);
}
static void f_part_refuse(struct rps__server *s, uint32_t p)
{
	/* the partition must not be served any more when what waits is refused */
	note(s->parts[p].serving ? "refuse %u while serving" : "refuse %u", p);
}
static bool f_part_fence(struct rps__server *s, uint32_t p) { note("fence %u", p); return s->fence_ok; }
static void f_part_unfence(struct rps__server *s, uint32_t p, uint64_t epoch) { (void)s; (void)epoch; note("unfence %u", p); }
static int f_part_serialize(struct rps__server *s, uint32_t p, uint64_t epoch, void **img, size_t *len)
{
	(void)s;
	(void)epoch;
	*img = calloc(1, 64);
	*len = 64;
	note("serialize %u", p);
	return *img ? 0 : -ENOMEM;
}
static void f_part_forget_parked(struct rps__server *s, uint32_t p) { (void)s; note("forget_parked %u", p); }
static int f_part_install(struct rps__server *s, uint32_t p, uint64_t epoch, const void *img, size_t len)
{
	(void)s;
	(void)epoch;
	(void)img;
	(void)len;
	note("install %u", p);
	return 0;
}
static void f_part_drop(struct rps__server *s, uint32_t p) { (void)s; note("drop %u", p); }
static uint64_t f_repl_seq(struct rps__server *s, uint32_t p) { (void)s; return 100u + p; }
static int f_part_install_backup(struct rps__server *s, uint32_t p, uint64_t epoch, const void *img, size_t len,
				 uint64_t seq)
{
	(void)s;
	(void)epoch;
	(void)img;
	(void)len;
	note("install_backup %u", p);
	note("seq %u", (unsigned)seq);
	return 0;
}

static uint32_t f_hold_steps(struct rps__server *s, struct rps__ckpt_target **out)
{
	(void)s;
	*out = calloc(1, sizeof(**out));
	snprintf((*out)->name, sizeof((*out)->name), "w");
	(*out)->step = 3;
	note("hold_steps", 0);
	return 1;
}
static void f_hold_tensor(struct rps__server *s, const char *name, uint64_t step)
{
	(void)s;
	(void)name;
	note("hold_tensor step %u", (unsigned)step);
}
static void f_hold_release(struct rps__server *s) { (void)s; note("hold_release", 0); }
static bool f_hold_reached(struct rps__server *s) { return s->reached; }
static void f_drain(struct rps__server *s) { (void)s; note("drain", 0); }
static int f_take(struct rps__server *s, struct rps__dp_copy *cc)
{
	cc->tensors = calloc(1, sizeof(*cc->tensors));
	cc->shards = calloc(1, sizeof(*cc->shards));
	if (!cc->tensors || !cc->shards)
		return -ENOMEM;
	snprintf(cc->tensors[0].name, sizeof(cc->tensors[0].name), "w");
	cc->tensors[0].spec.count = 4;
	cc->tensors[0].spec.mode = RPS_MODE_SYNC;
	cc->tensors[0].spec.num_workers = 1;
	cc->ntensors = 1;
	cc->shards[0].params = malloc(sizeof(s->params));
	memcpy(cc->shards[0].params, s->params, sizeof(s->params));
	cc->shards[0].meta = (struct rps__dp_shard){ .index = 0, .elems = 4, .version = 3, .ready = true,
						     .params = cc->shards[0].params };
	cc->nshards = 1;
	cc->raw_bytes = 16;
	note("take", 0);
	return 0;
}
static void f_copy_free(struct rps__dp_copy *cc)
{
	for (uint32_t i = 0; i < cc->nshards; i++)
		free(cc->shards[i].params);
	free(cc->shards);
	free(cc->tensors);
	memset(cc, 0, sizeof(*cc));
}
static int f_restore_tensor(struct rps__server *s, const char *file, const char *name,
			    const struct rps__tensor_spec *spec, struct srv_tensor **t)
{
	(void)s;
	(void)file;
	(void)name;
	(void)spec;
	*t = (struct srv_tensor *)(uintptr_t)1;
	note("restore_tensor", 0);
	return 0;
}
static int f_restore_shard(struct rps__server *s, const char *file, struct srv_tensor *t,
			   const struct rps__dp_shard *cs)
{
	(void)s;
	(void)file;
	(void)t;
	note("restore_shard version %u", (unsigned)cs->version);
	return 1;
}

static uint64_t f_part_diverged(struct rps__server *s, uint32_t p) { return s->diverged[p]; }

static void f_set_lease(struct rps__server *s, uint64_t until_ns)
{
	s->lease_until = until_ns;
	s->nleases++;
}

static const struct rps__dp_ops fake_ops = {
	.set_member_id = f_set_member_id, .set_map = f_set_map, .map_register = f_map_register,
	.map_deregister = f_map_deregister, .mem_register = f_mem_register, .mem_deregister = f_mem_deregister,
	.mem_window = f_mem_window, .port = f_port, .shard_elems = f_shard_elems, .stats = f_stats,
	.conn_reply = f_conn_reply, .conn_fail = f_conn_fail, .conn_role = f_conn_role,
	.conn_peer_id = f_conn_peer_id, .conn_dead = f_conn_dead, .conn_name = f_conn_name,
	.conn_msg_max = f_conn_msg_max, .conn_read = f_conn_read, .peer_dial = f_peer_dial,
	.part_set = f_part_set, .part_create = f_part_create, .part_promote = f_part_promote, .part_publish = f_part_publish,
	.part_refuse = f_part_refuse, .part_fence = f_part_fence, .part_unfence = f_part_unfence,
	.part_serialize = f_part_serialize, .part_forget_parked = f_part_forget_parked,
	.part_install = f_part_install, .part_drop = f_part_drop, .repl_seq = f_repl_seq,
	.part_install_backup = f_part_install_backup, .hold_steps = f_hold_steps,
	.hold_tensor = f_hold_tensor, .hold_release = f_hold_release, .hold_reached = f_hold_reached,
	.drain = f_drain, .take = f_take, .copy_free = f_copy_free, .restore_tensor = f_restore_tensor,
	.restore_shard = f_restore_shard, .set_lease = f_set_lease, .part_diverged = f_part_diverged,
};

/* ---- the control plane under test ------------------------------------------ */

static struct rps__cplane *cp;
static struct rps__dp_hooks hooks;
static struct rps__server_config the_cfg;
static struct srv_conn admin = { .role = CONN_ADMIN, .name = "127.0.0.1:1" };
static struct srv_conn peer2 = { .role = CONN_PEER, .peer_id = 2, .name = "127.0.0.1:2" };
static char scratch[200];
static char scratch2[200];	/* the replica tests' fresh cluster */
static char ckpt_dir[300];	/* --checkpoint-dir: scratch/ckpt */

static int suite_init(void)
{
	struct rps__server_config cfg;

	rps__log_level = getenv("RPS_TEST_LOG") ? RPS__LOG_DEBUG : RPS__LOG_ERROR;
	test_mkdtemp(scratch, sizeof(scratch), "test_cplane");
	rps__server_config_init(&cfg);
	cfg.npart = NPART;
	cfg.fsync_none = 1;
	cfg.tick_ms = 2;
	cfg.election_ticks = 3;
	cfg.move_timeout_ms = 300;
	cfg.drain_ms = 20;
	cfg.data_dir = scratch;
	snprintf(ckpt_dir, sizeof(ckpt_dir), "%s/ckpt", scratch);
	cfg.ckpt_dir = ckpt_dir;
	fake.fence_ok = true;
	rps__cp_fake_clock_ns = T0;	/* leases and failures: the tests' clock */
	/* Test hook: the leader proposes no REPLICA_BEGIN/DROP of its own
	 * (the failover tests build their maps by hand); the replica tests
	 * at the end turn it off. */
	rps__fault_set("no-replica-duty");
	the_cfg = cfg;
	if (rps__cp_create(&cfg, &cp) || rps__cp_start(cp, &fake_ops, &fake, &hooks)) {
		fprintf(stderr, "test_cplane: %s\n", rps__errbuf());
		return -1;
	}
	return 0;
}

static int suite_fini(void)
{
	hooks.fini(hooks.ctx);
	rps__cp_destroy(cp);
	(void)rps__remove_tree(scratch);
	if (scratch2[0])
		(void)rps__remove_tree(scratch2);
	return 0;
}

/* Run the control plane's timers until cond() holds (or 5 s). */
static bool run_until(bool (*cond)(void))
{
	uint64_t end = rps__now_ns() + 5000000000ull;
	struct timespec ts = { 0, 1000000 };
	bool stop = false;

	while (!cond()) {
		if (rps__now_ns() > end)
			return false;
		CU_ASSERT(hooks.run_timers(hooks.ctx, rps__now_ns(), &stop) >= 0);
		nanosleep(&ts, NULL);
	}
	return true;
}

static void send_msg(struct srv_conn *c, unsigned type, uint64_t req_id, int32_t status, void *body, uint32_t len)
{
	struct rps__msg_hdr h;

	memset(&h, 0, sizeof(h));
	h.type = (uint8_t)type;
	h.req_id = req_id;
	h.status = status;
	hooks.on_message(hooks.ctx, c, &h, body, len);
}

static void send_admin(uint32_t op, uint32_t part, uint64_t id, const char *uri, uint64_t req_id)
{
	struct rps__admin a;

	memset(&a, 0, sizeof(a));
	a.op = op;
	a.part = part;
	a.id = id;
	a.timeout_ms = 5000;
	if (uri)
		snprintf(a.uri, sizeof(a.uri), "%s", uri);
	send_msg(&admin, RPS__MSG_ADMIN, req_id, 0, &a, sizeof(a));
}

static void send_proposal(const struct rps__smap_cmd *cmd)
{
	char buf[RPS__SMAP_CMD_MAX];
	size_t len;

	CU_ASSERT_EQUAL_FATAL(rps__smap_cmd_encode(cmd, buf, sizeof(buf), &len), 0);
	send_msg(&peer2, RPS__MSG_PROPOSE, 77, 0, buf, (uint32_t)len);
}

static bool all_served(void)
{
	for (uint32_t p = 0; p < the_npart; p++)
		if (!fake.parts[p].serving)
			return false;
	return fake.npart == the_npart;
}

static uint64_t want_req;
static bool admin_answered(void)
{
	return admin.last_req_id == want_req && admin.last_type == RPS__MSG_ADMIN_REP;
}

static void admin_wait(uint64_t req_id)
{
	want_req = req_id;
	CU_ASSERT_FATAL(run_until(admin_answered));
}

/* A new one-member cluster: every partition is created empty and served. */
static void test_bootstrap_serves_every_partition(void)
{
	CU_ASSERT_FATAL(run_until(all_served));
	CU_ASSERT_EQUAL(fake.my_id, 1u);
	CU_ASSERT_PTR_NOT_NULL(fake.mapbuf);
	for (uint32_t p = 0; p < NPART; p++) {
		char what[32];
		snprintf(what, sizeof(what), "create %u", p);
		CU_ASSERT(logged(what, 0) >= 0);
		CU_ASSERT(!fake.parts[p].lost);
		CU_ASSERT_EQUAL(fake.parts[p].epoch, fake.parts[p].map_epoch);
	}
	/* member 2 joins the map (it never connects: peers are fakes) */
	send_admin(RPS__ADMIN_ADD_SERVER, 0, 2, "tcp://127.0.0.1:2", 1);
	admin_wait(1);
	CU_ASSERT_EQUAL(admin.last_status, 0);
}

static bool shipped0(void) { return logged("forget_parked 0", 0) >= 0; }
static bool p0_unfenced(void) { return logged("unfence 0", 0) >= 0 && fake.parts[0].serving; }

/* A move that the destination never takes: refused, fenced, serialised,
 * then aborted at the move timeout, and the partition unfenced and served. */
static void test_move_abort_unfences(void)
{
	int i;

	fake.nlog = 0;
	send_admin(RPS__ADMIN_MOVE, 0, 2, NULL, 2);
	CU_ASSERT_FATAL(run_until(shipped0));
	CU_ASSERT(logged("refuse 0", 0) >= 0);		/* not "while serving" */
	CU_ASSERT(logged("refuse 0 while serving", 0) < 0);
	i = logged("refuse 0", 0);
	i = logged("fence 0", i);
	CU_ASSERT(i >= 0);
	i = logged("publish 0 moved", i);
	CU_ASSERT(i >= 0);
	i = logged("serialize 0", i);
	CU_ASSERT(i >= 0);
	i = logged("mem_register", i);
	CU_ASSERT(i >= 0);
	CU_ASSERT(logged("forget_parked 0", i) >= 0);
	CU_ASSERT(!fake.parts[0].serving);
	CU_ASSERT(fake.parts[1].serving);		/* the others go on */
	CU_ASSERT_FATAL(run_until(p0_unfenced));
	CU_ASSERT(logged("mem_deregister", 0) >= 0);
	CU_ASSERT(logged("drop 0", 0) < 0);
	admin_wait(2);
	CU_ASSERT_EQUAL(admin.last_status, -ECANCELED);
}

static bool shipped1(void) { return logged("forget_parked 1", 0) >= 0; }
static bool p1_dropped(void) { return logged("drop 1", 0) >= 0; }

/* The destination commits: the old owner stops serving and drops its copy
 * after the drain time, never before. */
static void test_move_commit_drops(void)
{
	struct rps__smap_cmd cmd;
	uint64_t epoch;

	fake.nlog = 0;
	send_admin(RPS__ADMIN_MOVE, 1, 2, NULL, 3);
	CU_ASSERT_FATAL(run_until(shipped1));
	fake.nlog = 0;
	epoch = fake.parts[1].map_epoch;
	memset(&cmd, 0, sizeof(cmd));
	cmd.type = RPS__SMAP_MOVE_COMMIT;
	cmd.part = 1;
	cmd.to = 2;
	cmd.epoch = epoch;
	send_proposal(&cmd);
	CU_ASSERT_EQUAL(peer2.last_type, RPS__MSG_PROPOSE_REP);
	CU_ASSERT_EQUAL(peer2.last_status, 0);
	CU_ASSERT_FATAL(run_until(p1_dropped));
	CU_ASSERT(!fake.parts[1].serving);
	CU_ASSERT(fake.parts[1].map_epoch > epoch);
	CU_ASSERT(logged("unfence 1", 0) < 0);
	admin_wait(3);
	CU_ASSERT_EQUAL(admin.last_status, 0);
}

static bool incoming1(void) { return fake.parts[1].incoming; }
static bool read_posted(void) { return peer2.reading; }
static bool p1_ours(void) { return fake.parts[1].serving; }

/* Partition 1 comes back: stale offers are refused, a corrupt image too,
 * the good one is installed, committed and served. */
static void test_move_in_installs(void)
{
	struct rps__migrate m;
	char img[64];
	uint32_t good_crc;

	memset(img, 0x5a, sizeof(img));
	good_crc = rps__crc32c_noinv(img, sizeof(img));
	fake.nlog = 0;
	send_admin(RPS__ADMIN_MOVE, 1, 1, NULL, 4);
	CU_ASSERT_FATAL(run_until(incoming1));
	CU_ASSERT(!fake.parts[1].serving);
	memset(&m, 0, sizeof(m));
	m.part = 1;
	m.from = 2;
	m.epoch = fake.parts[1].map_epoch + 1;	/* not this move's */
	m.len = sizeof(img);
	m.crc = good_crc;
	send_msg(&peer2, RPS__MSG_MIGRATE, 1, 0, &m, sizeof(m));
	CU_ASSERT_EQUAL(peer2.last_type, RPS__MSG_MIGRATE_REP);
	CU_ASSERT_EQUAL(peer2.last_status, -EAGAIN);
	CU_ASSERT(!peer2.reading);
	/* the right epoch, but the bytes arrive damaged */
	m.epoch = fake.parts[1].map_epoch;
	m.crc = good_crc ^ 1;
	send_msg(&peer2, RPS__MSG_MIGRATE, 1, 0, &m, sizeof(m));
	CU_ASSERT_FATAL(run_until(read_posted));
	send_msg(&peer2, RPS__MSG_MIGRATE, 1, 0, &m, sizeof(m));
	CU_ASSERT_EQUAL(peer2.last_status, -EBUSY);	/* one READ at a time */
	peer2.reading = false;
	hooks.on_read_done(hooks.ctx, &peer2, true, img);
	CU_ASSERT_EQUAL(peer2.last_status, -EILSEQ);
	CU_ASSERT(logged("install 1", 0) < 0);
	/* and whole */
	m.crc = good_crc;
	send_msg(&peer2, RPS__MSG_MIGRATE, 1, 0, &m, sizeof(m));
	CU_ASSERT(peer2.reading);
	hooks.on_read_done(hooks.ctx, &peer2, true, img);
	CU_ASSERT_EQUAL(peer2.last_status, 0);
	CU_ASSERT(logged("install 1", 0) >= 0);
	CU_ASSERT_FATAL(run_until(p1_ours));
	CU_ASSERT(logged("publish 1", 0) >= 0);
	CU_ASSERT_EQUAL(fake.parts[1].epoch, fake.parts[1].map_epoch);
	admin_wait(4);
	CU_ASSERT_EQUAL(admin.last_status, 0);
}

static bool ckpt_answered(void) { return admin.last_type == RPS__MSG_CKPT_REP && admin.last_req_id == want_req; }

static void send_ckpt_named(uint32_t op, uint64_t req_id, const char *name, const struct rps__ckpt_target *t,
			    uint32_t nt)
{
	char buf[sizeof(struct rps__ckpt_req) + 4 * sizeof(struct rps__ckpt_target)];
	struct rps__ckpt_req *req = (void *)buf;

	memset(buf, 0, sizeof(buf));
	req->op = op;
	req->ckpt_id = 9;
	req->ntargets = nt;
	snprintf(req->name, sizeof(req->name), "%s", name);
	if (nt)
		memcpy(buf + sizeof(*req), t, nt * sizeof(*t));
	want_req = req_id;
	admin.last_type = 0;
	send_msg(&admin, RPS__MSG_CKPT, req_id, 0, buf, (uint32_t)(sizeof(*req) + nt * sizeof(*t)));
}

/* The checkpoint "ck" under the --checkpoint-dir. */
static void send_ckpt(uint32_t op, uint64_t req_id, const struct rps__ckpt_target *t, uint32_t nt)
{
	send_ckpt_named(op, req_id, "ck", t, nt);
}

/* A checkpoint: PREPARE holds at the steps the data plane reports, TAKE
 * waits for the targets, copies, releases the hold, and the file is
 * written; a restore hands its shards back to the data plane. */
static void test_checkpoint_hold_take(void)
{
	struct rps__ckpt_target tg = { .name = "w", .step = 3 };
	const struct rps__ckpt_rep *rep = (const void *)admin.last_body;
	int i;

	fake.nlog = 0;
	send_ckpt(RPS__CKPT_PREPARE, 10, NULL, 0);
	CU_ASSERT_FATAL(ckpt_answered());
	CU_ASSERT_EQUAL(admin.last_status, 0);
	CU_ASSERT_EQUAL(rep->ntargets, 1u);
	i = logged("hold_steps", 0);
	CU_ASSERT(logged("hold_tensor step 3", i) > i);
	fake.reached = false;
	send_ckpt(RPS__CKPT_TAKE, 11, &tg, 1);
	CU_ASSERT(logged("drain", 0) >= 0);
	CU_ASSERT(!ckpt_answered());			/* the lagging shards first */
	CU_ASSERT(logged("take", 0) < 0);
	fake.reached = true;
	CU_ASSERT_FATAL(run_until(ckpt_answered));
	CU_ASSERT_EQUAL(admin.last_status, 0);
	i = logged("take", 0);
	CU_ASSERT(i >= 0 && logged("hold_release", i) > i);
	send_ckpt(RPS__CKPT_FINISH, 12, NULL, 0);
	CU_ASSERT_FATAL(run_until(ckpt_answered));
	CU_ASSERT_EQUAL(admin.last_status, 0);
	CU_ASSERT(rep->bytes > 0);
	fake.nlog = 0;
	send_ckpt(RPS__CKPT_RESTORE, 13, NULL, 0);
	CU_ASSERT_FATAL(ckpt_answered());
	CU_ASSERT_EQUAL(admin.last_status, 0);
	CU_ASSERT(logged("restore_tensor", 0) >= 0);
	CU_ASSERT(logged("restore_shard version 3", 0) >= 0);
	{
		/* the file went under --checkpoint-dir, private */
		char file[400];
		struct stat sb;

		snprintf(file, sizeof(file), "%s/ck/member-1.rpsck", ckpt_dir);
		CU_ASSERT_EQUAL_FATAL(stat(file, &sb), 0);
		CU_ASSERT_EQUAL(sb.st_mode & 07777, 0600);
	}
}

/* A name that could leave --checkpoint-dir is refused (-EINVAL, one line
 * saying why) before anything is held, copied or read. */
static void test_checkpoint_bad_names(void)
{
	static const char *const bad[] = { "", "/tmp/x", "..", "a/../../x", "a//b", "a/", "./a", "a b", "a\\b" };
	const struct rps__ckpt_rep *rep = (const void *)admin.last_body;
	char toolong[RPS__CKPT_NAME_MAX + 2];
	size_t i;

	memset(toolong, 'a', sizeof(toolong) - 1);
	toolong[sizeof(toolong) - 1] = '\0';
	for (i = 0; i <= RPS__ARRAY_SIZE(bad); i++) {
		const char *name = i < RPS__ARRAY_SIZE(bad) ? bad[i] : toolong;

		fake.nlog = 0;
		send_ckpt_named(RPS__CKPT_PREPARE, 20 + i, name, NULL, 0);
		CU_ASSERT_FATAL(ckpt_answered());
		CU_ASSERT_EQUAL(admin.last_status, -EINVAL);
		CU_ASSERT(strstr(rep->msg, "checkpoint name") != NULL);
		CU_ASSERT(strchr(rep->msg, '\n') == NULL);
		CU_ASSERT(logged("hold_steps", 0) < 0);		/* nothing held */
		send_ckpt_named(RPS__CKPT_TAKE, 40 + i, name, NULL, 0);
		CU_ASSERT_FATAL(ckpt_answered());
		CU_ASSERT_EQUAL(admin.last_status, -EINVAL);
		CU_ASSERT(logged("drain", 0) < 0);
		send_ckpt_named(RPS__CKPT_RESTORE, 60 + i, name, NULL, 0);
		CU_ASSERT_FATAL(ckpt_answered());
		CU_ASSERT_EQUAL(admin.last_status, -EINVAL);
		CU_ASSERT(logged("restore_tensor", 0) < 0);
	}
	/* a good name of no checkpoint: not found, said so */
	send_ckpt_named(RPS__CKPT_RESTORE, 80, "no/such", NULL, 0);
	CU_ASSERT_FATAL(ckpt_answered());
	CU_ASSERT_EQUAL(admin.last_status, -ENOENT);
	CU_ASSERT(strstr(rep->msg, "no such checkpoint") != NULL);
}

/* Message types a connection may not send, and a lost connection. */
static void test_refusals(void)
{
	struct srv_conn worker_like = { .role = CONN_ADMIN, .name = "x" };

	send_msg(&worker_like, RPS__MSG_RAFT, 0, 0, NULL, 0);
	CU_ASSERT(worker_like.dead);
	peer2.dead = false;
	send_msg(&peer2, RPS__MSG_ADMIN, 1, 0, NULL, 0);
	CU_ASSERT(peer2.dead);
	hooks.on_conn_gone(hooks.ctx, &peer2);
}


/* ---- leases and failover (repl_failover.c) ------------------------------------ */

static struct srv_conn peer3 = { .role = CONN_PEER, .peer_id = 3, .name = "127.0.0.1:3" };
static struct srv_conn peer4 = { .role = CONN_PEER, .peer_id = 4, .name = "127.0.0.1:4" };
static struct rps__smap pub;	/* the map as workers READ it */

/* One turn of the server loop's timers (the failover clock does not move). */
static void turn(void)
{
	bool stop = false;

	CU_ASSERT(hooks.run_timers(hooks.ctx, rps__now_ns(), &stop) >= 0);
}

static void send_lease(struct srv_conn *c, uint64_t seq)
{
	struct rps__lease l = { .seq = seq, .t_send = rps__cp_fake_clock_ns };

	send_msg(c, RPS__MSG_LEASE, 0, 0, &l, sizeof(l));
}

static void send_lease_rep_at(struct srv_conn *c, uint64_t seq, int32_t status, uint32_t granted, uint64_t index)
{
	struct rps__lease_rep r = { .seq = seq, .granted = granted, .index = index };

	send_msg(c, RPS__MSG_LEASE_REP, 0, status, &r, sizeof(r));
}

static void send_lease_rep(struct srv_conn *c, uint64_t seq, int32_t status, uint32_t granted)
{
	struct rps__lease_rep r = { .seq = seq, .granted = granted };

	send_msg(c, RPS__MSG_LEASE_REP, 0, status, &r, sizeof(r));
}

static void read_map(void)
{
	uint32_t len;

	memcpy(&len, fake.mapbuf, 4);
	CU_ASSERT_EQUAL_FATAL(rps__smap_decode((char *)fake.mapbuf + 4, len, &pub), 0);
}

static bool failed(uint64_t id)
{
	return rps__cp_member_failed(cp, id);
}

/* The Raft log's bytes on disk (its segments in the data dir). */
static long long wal_bytes(void)
{
	DIR *d = opendir(scratch);
	struct dirent *de;
	long long sum = 0;
	char path[512];
	struct stat sb;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, "wal-", 4)) {
			snprintf(path, sizeof(path), "%s/%s", scratch, de->d_name);
			if (stat(path, &sb) == 0)
				sum += (long long)sb.st_size;
		}
	closedir(d);
	return sum;
}

/* psctl requests handled in one turn of the loop are proposed together: one
 * WAL batch (one write, one sync) for all of them, answered in that turn. */
static void test_admin_proposals_batched(void)
{
	unsigned n0 = admin.nreplies;
	long long b0, b1, b2;

	b0 = wal_bytes();
	send_admin(RPS__ADMIN_NOP, 0, 0, NULL, 200);
	turn();
	CU_ASSERT_EQUAL(admin.nreplies, n0 + 1);
	CU_ASSERT_EQUAL(admin.last_status, 0);
	b1 = wal_bytes();
	CU_ASSERT(b1 > b0);
	for (uint64_t k = 0; k < 4; k++)
		send_admin(RPS__ADMIN_NOP, 0, 0, NULL, 201 + k);
	turn();
	CU_ASSERT_EQUAL(admin.nreplies, n0 + 5);
	CU_ASSERT_EQUAL(admin.last_status, 0);
	b2 = wal_bytes();
	/* four entries and one hard state, not four of each */
	CU_ASSERT(b2 - b1 < 4 * (b1 - b0));
}

/* A LEASE is granted only once a ReadIndex round confirmed the leader, never
 * on arrival; the member's lease runs from when it asked: t_send + lease_ms
 * on its own clock, whenever the grant comes. */
static void test_lease_after_read_index(void)
{
	unsigned n, i;
	uint64_t t, t_late;

	peer2.dead = false;
	hooks.peer_attached(hooks.ctx, &peer2);
	/* our own lease, through the same round */
	t = rps__cp_fake_clock_ns += 10000 * MS;
	n = fake.nleases;
	turn();
	CU_ASSERT_EQUAL(fake.nleases, n + 1);
	CU_ASSERT_EQUAL(fake.lease_until, t + LEASE_NS);
	/* a member's */
	n = peer2.nlease_reps;
	send_lease(&peer2, 41);
	CU_ASSERT_EQUAL(peer2.nlease_reps, n);		/* not before the round */
	turn();
	CU_ASSERT_EQUAL(peer2.nlease_reps, n + 1);
	CU_ASSERT_EQUAL(peer2.lease_status, 0);
	CU_ASSERT_EQUAL(peer2.lease_rep.seq, 41u);
	CU_ASSERT_EQUAL(peer2.lease_rep.granted, 1u);
	CU_ASSERT(peer2.lease_rep.index >= 1);		/* the round's: the commit index then */
	/* 64 rounds pending: our next request (at t_late) gets none now */
	for (i = 0; i < 64; i++)
		send_lease(&peer2, 100 + i);
	t_late = rps__cp_fake_clock_ns += FAILOVER_NS / 10;
	n = fake.nleases;
	turn();
	CU_ASSERT_EQUAL(fake.nleases, n);
	CU_ASSERT_EQUAL(fake.lease_until, t + LEASE_NS);
	/* refusals and replies to requests never made change nothing */
	rps__cp_fake_clock_ns += 200 * MS;
	for (i = 1; i < 200; i++) {
		send_lease_rep(&peer2, i, 0, 0);
		send_lease_rep(&peer2, i, -EAGAIN, 1);
	}
	send_lease_rep(&peer2, 1000, 0, 1);
	CU_ASSERT_EQUAL(fake.nleases, n);
	/* a grant naming an index beyond the log we applied is not in force
	 * (a primary cut off learns it was deposed before its fence comes
	 * down) */
	for (i = 1; i < 200; i++)
		send_lease_rep_at(&peer2, i, 0, 1, UINT64_MAX / 2);
	CU_ASSERT_EQUAL(fake.nleases, n);
	/* its grant, 200 ms late: the lease still ends lease_ms after t_late */
	for (i = 1; i < 200; i++)
		send_lease_rep(&peer2, i, 0, 1);
	CU_ASSERT_EQUAL(fake.nleases, n + 1);
	CU_ASSERT_EQUAL(fake.lease_until, t_late + LEASE_NS);
}

static uint64_t applied_want;
static bool applied_reached(void) { return fake.applied >= applied_want; }

/* Propose cmd (as member 2 would) and wait until it is applied. */
static void apply_cmd(uint32_t type, uint32_t part, uint64_t id, uint64_t from, uint64_t to)
{
	const struct rps__propose_rep *rep = (const void *)peer2.last_body;
	struct rps__smap_cmd cmd;

	read_map();
	memset(&cmd, 0, sizeof(cmd));
	cmd.type = type;
	cmd.part = part;
	cmd.id = id;
	cmd.from = from;
	cmd.to = to;
	cmd.epoch = pub.parts[part].epoch;
	if (type == RPS__SMAP_ADD_MEMBER)
		snprintf(cmd.uri, sizeof(cmd.uri), "tcp://127.0.0.1:%u", (unsigned)id);
	send_proposal(&cmd);
	CU_ASSERT_EQUAL_FATAL(peer2.last_type, RPS__MSG_PROPOSE_REP);
	CU_ASSERT_EQUAL_FATAL(peer2.last_status, 0);
	applied_want = rep->index;
	CU_ASSERT_FATAL(run_until(applied_reached));
}

static void add_backup(uint32_t part, uint64_t id)
{
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, part, 0, 0, id);
	apply_cmd(RPS__SMAP_REPLICA_COMMIT, part, 0, 0, id);
}

/* Member 2 owns partition 3, which has no backup (R = 1): it is declared
 * failed exactly when failover_ms passed without a LEASE, not a ns before,
 * and nothing is proposed; a LEASE brings it back. */
static void test_failure_without_backups(void)
{
	uint64_t t, applied, epoch;
	int i;

	add_backup(3, 2);
	apply_cmd(RPS__SMAP_FAILOVER, 3, 0, 1, 2);
	read_map();
	CU_ASSERT_EQUAL_FATAL(pub.parts[3].owner, 2u);
	for (uint32_t p = 0; p < NPART; p++)
		CU_ASSERT_EQUAL_FATAL(rps__smap_nbackups(&pub, p), 0u);
	epoch = pub.parts[3].epoch;
	t = rps__cp_fake_clock_ns += 1000 * MS;
	send_lease(&peer2, 1);
	turn();
	rps__cp_fake_clock_ns = t + FAILOVER_NS;
	turn();
	CU_ASSERT(!failed(2));
	applied = fake.applied;
	rps__cp_fake_clock_ns = t + FAILOVER_NS + 1;
	turn();
	CU_ASSERT(failed(2));
	/* and through the retries: nothing to propose */
	rps__cp_fake_clock_ns += 600 * MS;
	for (i = 0; i < 20; i++)
		turn();
	CU_ASSERT_EQUAL(fake.applied, applied);
	read_map();
	CU_ASSERT_EQUAL(pub.parts[3].owner, 2u);
	CU_ASSERT_EQUAL(pub.parts[3].epoch, epoch);
	send_lease(&peer2, 2);
	CU_ASSERT(!failed(2));
}

static bool failover_applied(void)
{
	read_map();
	return pub.parts[0].owner == 3 && pub.parts[3].owner == 3 && !pub.parts[1].backups[0] &&
	       !pub.parts[2].joining;
}

/* Members 2 and 4 fall silent, 3 goes on.  Partition 0 (primary 2, backups
 * 3, 1) fails over to 3 keeping 1; partition 3 (primary 2, backups 4, 3) to
 * 3, the first live backup, keeping none; partition 1 drops backup 2;
 * partition 2's seeding of 2 is aborted.  Then nothing more is proposed. */
static void test_failover_proposed(void)
{
	uint64_t t, applied, epoch[NPART];
	int i;

	hooks.peer_attached(hooks.ctx, &peer3);
	hooks.peer_attached(hooks.ctx, &peer4);
	apply_cmd(RPS__SMAP_ADD_MEMBER, 0, 3, 0, 0);
	apply_cmd(RPS__SMAP_ADD_MEMBER, 0, 4, 0, 0);
	add_backup(0, 2);
	apply_cmd(RPS__SMAP_FAILOVER, 0, 0, 1, 2);
	add_backup(0, 3);
	add_backup(0, 1);
	add_backup(3, 4);
	add_backup(3, 3);
	add_backup(1, 2);
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 2, 0, 0, 2);
	read_map();
	CU_ASSERT_EQUAL_FATAL(pub.parts[0].owner, 2u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[0].backups[0], 3u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[0].backups[1], 1u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[1].owner, 1u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[1].backups[0], 2u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[2].owner, 1u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[2].joining, 2u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[3].owner, 2u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[3].backups[0], 4u);
	CU_ASSERT_EQUAL_FATAL(pub.parts[3].backups[1], 3u);
	for (uint32_t p = 0; p < NPART; p++)
		epoch[p] = pub.parts[p].epoch;

	t = rps__cp_fake_clock_ns += 1000 * MS;
	send_lease(&peer2, 3);
	send_lease(&peer3, 1);
	send_lease(&peer4, 1);
	turn();
	CU_ASSERT(rps__cp_member_fresh(cp, 2) && rps__cp_member_fresh(cp, 3) && rps__cp_member_fresh(cp, 4));
	rps__cp_fake_clock_ns = t + FAILOVER_NS / 2;
	send_lease(&peer3, 2);
	turn();
	/* silent for lease_ms: not failed yet, but no longer what balancing
	 * moves a partition to (it may have just stopped) */
	CU_ASSERT(!failed(2) && !rps__cp_member_fresh(cp, 2));
	CU_ASSERT(rps__cp_member_fresh(cp, 3));
	CU_ASSERT(rps__cp_member_fresh(cp, 1));	/* (ourselves) */
	applied = fake.applied;
	rps__cp_fake_clock_ns = t + FAILOVER_NS;
	turn();
	CU_ASSERT(!failed(2) && !failed(3) && !failed(4));
	CU_ASSERT_EQUAL(fake.applied, applied);
	rps__cp_fake_clock_ns = t + FAILOVER_NS + 1;
	turn();
	CU_ASSERT(failed(2) && !failed(3) && failed(4));
	CU_ASSERT_FATAL(run_until(failover_applied));
	read_map();
	CU_ASSERT_EQUAL(pub.parts[0].owner, 3u);
	CU_ASSERT_EQUAL(pub.parts[0].backups[0], 1u);
	CU_ASSERT_EQUAL(pub.parts[0].backups[1], 0u);
	CU_ASSERT_EQUAL(pub.parts[0].epoch, epoch[0] + 1);
	CU_ASSERT_EQUAL(pub.parts[1].owner, 1u);
	CU_ASSERT_EQUAL(pub.parts[1].backups[0], 0u);
	CU_ASSERT_EQUAL(pub.parts[1].epoch, epoch[1] + 1);
	CU_ASSERT_EQUAL(pub.parts[2].owner, 1u);
	CU_ASSERT_EQUAL(pub.parts[2].joining, 0u);
	CU_ASSERT_EQUAL(pub.parts[2].epoch, epoch[2]);
	CU_ASSERT_EQUAL(pub.parts[3].owner, 3u);
	CU_ASSERT_EQUAL(pub.parts[3].backups[0], 0u);
	CU_ASSERT_EQUAL(pub.parts[3].epoch, epoch[3] + 1);
	/* one batch: the retries find nothing left to propose */
	applied = fake.applied;
	send_lease(&peer3, 3);
	rps__cp_fake_clock_ns += 600 * MS;
	for (i = 0; i < 20; i++)
		turn();
	CU_ASSERT_EQUAL(fake.applied, applied);
	CU_ASSERT(!failed(3));
}

static int drop_mark;
static bool dropped_3(void) { return logged("drop 3", drop_mark) >= 0; }

/* Partition 3 (primary 3): made our backup, dropped (REPLICA_DROP): its
 * regions go after the drain, as a moved partition's; our backup again,
 * then failed over to us: promoted (never created empty), served under
 * the new epoch.  Partition 1, ours without backups, fails over to nobody:
 * a FAILOVER naming us for a partition we hold no copy of makes it lost. */
static void test_backup_promoted_or_dropped(void)
{
	int mark;

	read_map();
	CU_ASSERT_EQUAL_FATAL(pub.parts[3].owner, 3u);
	add_backup(3, 1);
	CU_ASSERT_FALSE(fake.parts[3].serving);
	CU_ASSERT(fake.parts[3].backup);
	drop_mark = (int)fake.nlog;
	apply_cmd(RPS__SMAP_REPLICA_DROP, 3, 1, 0, 0);
	CU_ASSERT_FATAL(run_until(dropped_3));
	CU_ASSERT_FALSE(fake.parts[3].backup);

	add_backup(3, 1);
	mark = (int)fake.nlog;
	apply_cmd(RPS__SMAP_FAILOVER, 3, 0, 3, 1);
	read_map();
	CU_ASSERT_EQUAL(pub.parts[3].owner, 1u);
	CU_ASSERT(logged("promote 3", mark) >= 0);
	CU_ASSERT(logged("create 3", mark) < 0);
	CU_ASSERT(fake.parts[3].serving);
	CU_ASSERT_FALSE(fake.parts[3].lost);
	CU_ASSERT_EQUAL(fake.parts[3].epoch, pub.parts[3].epoch);
}

static unsigned leases_before;
static bool leased_again(void) { return fake.nleases > leases_before; }

/* A new leader cannot know what its predecessor granted: it declares
 * nobody failed before 1.1 x lease_ms after winning, and does after; a
 * member never connected since the start is not declared failed until it
 * was connected and then silent for failover_ms. */
static void test_new_leader_waits(void)
{
	uint64_t won, t;

	int level = rps__log_level;

	hooks.fini(hooks.ctx);
	rps__cp_destroy(cp);
	cp = NULL;
	if (level == RPS__LOG_ERROR)
		rps__log_level = -1;	/* (partitions 1 and 2 are "lost with the restart") */
	won = rps__cp_fake_clock_ns += 10000 * MS;
	leases_before = fake.nleases;
	CU_ASSERT_FATAL(rps__cp_create(&the_cfg, &cp) == 0 && rps__cp_start(cp, &fake_ops, &fake, &hooks) == 0);
	hooks.peer_attached(hooks.ctx, &peer2);	/* (connected before it leads; 4 is not) */
	hooks.peer_attached(hooks.ctx, &peer3);
	CU_ASSERT_FATAL(run_until(leased_again));	/* it leads (the clock stood still) */
	CU_ASSERT_EQUAL(fake.lease_until, won + LEASE_NS);
	send_lease(&peer3, 4);
	rps__cp_fake_clock_ns = won + LEASE_NS / 10 * 11;
	turn();
	CU_ASSERT(!failed(2) && !failed(3) && !failed(4));
	rps__cp_fake_clock_ns += 1;
	turn();
	CU_ASSERT(failed(2) && !failed(3));
	/* never connected since the start (servers come up apart): not failed,
	 * and once it connects it has failover_ms from then */
	CU_ASSERT(!failed(4));
	t = rps__cp_fake_clock_ns += 1000 * MS;
	hooks.peer_attached(hooks.ctx, &peer4);
	send_lease(&peer3, 5);
	turn();
	rps__cp_fake_clock_ns = t + FAILOVER_NS / 2;
	send_lease(&peer3, 6);
	rps__cp_fake_clock_ns = t + FAILOVER_NS;
	turn();
	CU_ASSERT(!failed(4));
	rps__cp_fake_clock_ns += 1;
	turn();
	CU_ASSERT(failed(4) && !failed(3));
	rps__log_level = level;
}

/* A leader elected after another one led gives that one 1.1 x lease_ms
 * (its silence elected us, and what it granted ends by then), and every
 * other member failover_ms from the election: they renewed with the old
 * leader until it went, and must first learn of us (on a starved machine,
 * seconds late).  Follows test_new_leader_waits: members 2, 3 and 4 were
 * connected. */
static void test_new_leader_old_one_first(void)
{
	uint64_t won;

	rps__cp_failover_role(cp, false, 2);	/* member 2 leads ... */
	won = rps__cp_fake_clock_ns += 100 * MS;
	rps__cp_failover_role(cp, true, 1);	/* ... then we do */
	turn();
	CU_ASSERT(!failed(2) && !failed(3) && !failed(4));
	rps__cp_fake_clock_ns = won + LEASE_NS / 10 * 11;
	turn();
	CU_ASSERT(!failed(2) && !failed(3) && !failed(4));
	rps__cp_fake_clock_ns += 1;
	turn();
	CU_ASSERT(failed(2) && !failed(3) && !failed(4));
	rps__cp_fake_clock_ns = won + FAILOVER_NS / 2;
	send_lease(&peer3, 7);
	turn();
	rps__cp_fake_clock_ns = won + FAILOVER_NS;
	turn();
	CU_ASSERT(!failed(3) && !failed(4));
	rps__cp_fake_clock_ns += 1;
	turn();
	CU_ASSERT(failed(4) && !failed(3));
	/* with no other leader seen since it started, everybody gets
	 * 1.1 x lease_ms (test_new_leader_waits) */
}

/* ---- replica sets: placement by the leader, seeding (repl_place.c) ------------ */

/* A new one-member cluster in a fresh directory (the same fake data plane),
 * then members 2 and 3, connected (so live); the replica duty runs. */
static void fresh_cluster(void)
{
	struct rps__server_config cfg = the_cfg;

	hooks.fini(hooks.ctx);
	rps__cp_destroy(cp);
	cp = NULL;
	test_mkdtemp(scratch2, sizeof(scratch2), "test_cplane2");
	cfg.data_dir = scratch2;
	cfg.npart = NPART_R;
	the_npart = NPART_R;
	rps__fault_set(NULL);
	rps__cp_fake_clock_ns += 10000 * MS;
	CU_ASSERT_FATAL(rps__cp_create(&cfg, &cp) == 0 && rps__cp_start(cp, &fake_ops, &fake, &hooks) == 0);
	CU_ASSERT_FATAL(run_until(all_served));
	peer2.dead = peer3.dead = false;
	hooks.peer_attached(hooks.ctx, &peer2);
	hooks.peer_attached(hooks.ctx, &peer3);
	apply_cmd(RPS__SMAP_ADD_MEMBER, 0, 2, 0, 0);
	apply_cmd(RPS__SMAP_ADD_MEMBER, 0, 3, 0, 0);
}

static void apply_zone(uint64_t id, const char *zone)
{
	const struct rps__propose_rep *rep = (const void *)peer2.last_body;
	struct rps__smap_cmd cmd;

	memset(&cmd, 0, sizeof(cmd));
	cmd.type = RPS__SMAP_SET_ZONE;
	cmd.id = id;
	snprintf(cmd.zone, sizeof(cmd.zone), "%s", zone);
	send_proposal(&cmd);
	CU_ASSERT_EQUAL_FATAL(peer2.last_status, 0);
	applied_want = rep->index;
	CU_ASSERT_FATAL(run_until(applied_reached));
}

/* Turns of the loop for ms (real time: the duties' clock). */
static void turns_for(int ms)
{
	uint64_t end = rps__now_ns() + (uint64_t)ms * MS;
	struct timespec ts = { 0, 1000000 };

	while (rps__now_ns() < end) {
		turn();
		nanosleep(&ts, NULL);
	}
}

static uint32_t njoining(void)
{
	uint32_t n = 0;

	read_map();
	for (uint32_t p = 0; p < the_npart; p++)
		n += pub.parts[p].joining != 0;
	return n;
}

static bool max_joining(void) { return njoining() == SEED_MAX; }
static uint64_t seeds_want;
static bool seeds_offered(void) { return (peer3.seeds & seeds_want) == seeds_want; }

/* The joiner (peer 3) takes partition p's image once it is offered, ms
 * later (its READ). */
static void take_image(uint32_t p, int ms)
{
	seeds_want = 1ull << p;
	CU_ASSERT_FATAL(run_until(seeds_offered));
	turns_for(ms);
	send_msg(&peer3, RPS__MSG_MIGRATE_REP, p, 0, NULL, 0);
}
static bool p0_backed(void) { read_map(); return pub.parts[0].backups[0] == 3 && fake.parts[0].serving; }
static bool p2_aborted(void) { return logged("unfence 2", 0) >= 0 && fake.parts[2].serving; }

/* Turns of the loop, without sleeping, until partition p is being seeded:
 * at most 10 (a few ms, far less than REPLICA_RETRY_NS). */
static bool joining_within_turns(uint32_t p)
{
	for (int i = 0; i < 10; i++) {
		read_map();
		if (pub.parts[p].joining)
			return true;
		turn();
	}
	read_map();
	return pub.parts[p].joining != 0;
}

static bool none_backed(void)
{
	read_map();
	for (uint32_t p = 0; p < the_npart; p++)
		if (pub.parts[p].backups[0] || pub.parts[p].joining || !fake.parts[p].serving)
			return false;
	return true;
}

/* The leader's placement: nothing at R = 1; at R = 2 up to SEED_MAX
 * seedings per primary at once (of 8 partitions, all ours), to the member
 * of a zone the set lacks (3, not the lower id 2); the primary fences and
 * offers its image with its stream seq (its parked pushes stay), serves
 * again on COMMIT; a COMMIT starts the next seeding at once (no spacing
 * after a success, not even 0.5 s after the previous BEGIN); an ABORT
 * backs the primary off for 0.5 s; one never installed is aborted after
 * --move-timeout-ms; R lowered to 1: every backup dropped, every seeding
 * aborted. */
static void test_replica_placement(void)
{
	const struct rps__seed *sd = &peer3.last_seed;
	uint64_t applied, epoch0, t;

	fresh_cluster();
	/* R = 1: nothing proposed */
	applied = fake.applied;
	turns_for(200);
	CU_ASSERT_EQUAL(fake.applied, applied);
	CU_ASSERT_EQUAL(njoining(), 0u);
	apply_zone(1, "a");
	apply_zone(2, "a");
	apply_zone(3, "b");
	fake.nlog = 0;
	peer3.seeds = 0;
	epoch0 = pub.parts[0].epoch;
	apply_cmd(RPS__SMAP_SET_REPLICAS, 0, 2, 0, 0);
	CU_ASSERT_FATAL(run_until(max_joining));
	for (uint32_t p = 0; p < NPART_R; p++)
		CU_ASSERT_EQUAL(pub.parts[p].joining, p < SEED_MAX ? 3u : 0u);
	/* our side: fenced and offered like a move's source, parked pushes
	 * kept; one offer at a time to a joiner (it READs one at a time) */
	seeds_want = 1;
	CU_ASSERT_FATAL(run_until(seeds_offered));
	turns_for(100);
	CU_ASSERT_EQUAL(peer3.seeds, 1u);
	CU_ASSERT(logged("serialize 3", 0) >= 0);
	CU_ASSERT(!fake.parts[0].serving);
	CU_ASSERT(fake.parts[0].incoming);	/* (tensors created meanwhile get a region) */
	CU_ASSERT(logged("refuse 0", 0) >= 0);
	CU_ASSERT(logged("fence 0", logged("refuse 0", 0)) >= 0);
	CU_ASSERT(logged("serialize 0", logged("fence 0", 0)) >= 0);
	CU_ASSERT(logged("forget_parked 0", 0) < 0);
	CU_ASSERT(logged("publish 0 moved", 0) < 0);
	CU_ASSERT_EQUAL(sd->mig.part, 0u);
	CU_ASSERT_EQUAL(sd->mig.epoch, epoch0);
	CU_ASSERT_EQUAL(sd->mig.from, 1u);
	CU_ASSERT_EQUAL(sd->mig.len, 64u);
	CU_ASSERT_EQUAL(sd->seq, 100u);		/* the fake's stream seq of partition 0 */
	/* the joiner takes all four in turn, each offered as soon as the
	 * previous one is installed, each in 100 ms: 400 ms in all, more than
	 * --move-timeout-ms (300), but a queued one's time starts at its offer:
	 * none aborted; no more seedings while they last */
	for (uint32_t p = 0; p < SEED_MAX; p++)
		take_image(p, 100);
	for (uint32_t p = 0; p < SEED_MAX; p++) {
		char what[32];

		snprintf(what, sizeof(what), "unfence %u", p);
		CU_ASSERT_EQUAL(logged(what, 0), -1);
	}
	CU_ASSERT_EQUAL(sd->mig.part, SEED_MAX - 1);
	CU_ASSERT_EQUAL(sd->seq, 100u + SEED_MAX - 1);
	turns_for(700);
	CU_ASSERT_EQUAL(njoining(), SEED_MAX);
	read_map();
	CU_ASSERT_EQUAL(pub.parts[SEED_MAX].joining, 0u);
	/* committed: a backup, same epoch, served again; the next seeding
	 * starts in the turns right after it, and again after the next
	 * COMMIT, well within 0.5 s of the previous BEGIN */
	apply_cmd(RPS__SMAP_REPLICA_COMMIT, 0, 0, 0, 3);
	CU_ASSERT_FATAL(joining_within_turns(4));
	apply_cmd(RPS__SMAP_REPLICA_COMMIT, 1, 0, 0, 3);
	CU_ASSERT_FATAL(joining_within_turns(5));
	CU_ASSERT_EQUAL(njoining(), SEED_MAX);
	take_image(4, 0);	/* (not aborted by the timeout below) */
	take_image(5, 0);
	CU_ASSERT_FATAL(run_until(p0_backed));
	CU_ASSERT(logged("unfence 0", 0) >= 0);
	CU_ASSERT_EQUAL(pub.parts[0].epoch, epoch0);
	CU_ASSERT_EQUAL(fake.parts[0].backups[0], 3u);
	/* aborted (installed, so not the timeout's): the primary backs off
	 * 0.5 s before the next one, 2 again (the lowest that needs one) */
	t = rps__now_ns();
	apply_cmd(RPS__SMAP_REPLICA_ABORT, 2, 0, 0, 0);
	turns_for(200);
	CU_ASSERT_EQUAL(njoining(), SEED_MAX - 1);
	CU_ASSERT_FATAL(run_until(max_joining));
	CU_ASSERT(rps__now_ns() - t >= 500 * MS);
	CU_ASSERT_EQUAL(pub.parts[2].joining, 3u);
	CU_ASSERT_EQUAL(pub.parts[6].joining, 0u);
	/* never installed this time: aborted after --move-timeout-ms */
	fake.nlog = 0;
	CU_ASSERT_FATAL(run_until(p2_aborted));
	/* lowered: backups dropped, seedings aborted */
	apply_cmd(RPS__SMAP_SET_REPLICAS, 0, 1, 0, 0);
	CU_ASSERT_FATAL(run_until(none_backed));
	CU_ASSERT_EQUAL(pub.parts[0].epoch, epoch0 + 1);	/* (REPLICA_DROP) */
	applied = fake.applied;
	turns_for(700);
	CU_ASSERT_EQUAL(fake.applied, applied);
	CU_ASSERT(none_backed());
}

static bool p0_joining_3(void) { read_map(); return pub.parts[0].joining == 3; }
static bool p0_zone_spread(void)
{
	read_map();
	return pub.parts[0].backups[0] == 3 && !pub.parts[0].backups[1] && !pub.parts[0].joining;
}

static bool moving_to_2(void)
{
	read_map();
	for (uint32_t p = 0; p < NPART_R; p++)
		if (pub.parts[p].moving_to == 2 || pub.parts[p].owner == 2)
			return true;
	return false;
}

/* Balancing counts only members fresh with their lease.  Member 2 went
 * silent for longer than its lease but not its failover time (a restart:
 * its partitions failed over themselves) while the map went quiet with
 * members 1 and 3 owning 4 each: nothing to even out among the fresh.
 * Its next renewal must make the leader look again and give it its share;
 * before, the look was spent and member 2 stayed empty (it_replica's
 * "--rebalance auto", one make check in a few). */
static void test_balance_member_back(void)
{
	uint64_t t;

	fresh_cluster();
	rps__fault_set("no-replica-duty");	/* (the map is made by hand first) */
	t = rps__cp_fake_clock_ns;
	send_lease(&peer2, 1);
	send_lease(&peer3, 1);
	turn();
	CU_ASSERT(rps__cp_member_fresh(cp, 2) && rps__cp_member_fresh(cp, 3));
	apply_cmd(RPS__SMAP_SET_REPLICAS, 0, 2, 0, 0);
	for (uint32_t p = 0; p < NPART_R; p++)
		add_backup(p, 3);
	for (uint32_t p = 4; p < NPART_R; p++) {
		apply_cmd(RPS__SMAP_FAILOVER, p, 0, 1, 3);	/* (news: balancing is due) */
		add_backup(p, 1);
	}
	read_map();
	CU_ASSERT_EQUAL_FATAL(rps__smap_owned(&pub, 1), 4u);
	CU_ASSERT_EQUAL_FATAL(rps__smap_owned(&pub, 3), 4u);
	CU_ASSERT_EQUAL_FATAL(rps__smap_owned(&pub, 2), 0u);
	rps__cp_fake_clock_ns = t + LEASE_NS;	/* 2 silent for its lease, not failed */
	send_lease(&peer3, 2);
	turn();
	CU_ASSERT(rps__cp_member_fresh(cp, 3) && !rps__cp_member_fresh(cp, 2) && !failed(2));
	rps__fault_set(NULL);
	/* due, but even among the fresh (2 is not): STATUS does not say balancing */
	CU_ASSERT(!rps__cp_balance_pending(cp));
	turns_for(300);	/* quiet, even among the fresh: nothing to move */
	CU_ASSERT(!moving_to_2());
	CU_ASSERT(!rps__cp_balance_pending(cp));	/* STATUS: not balancing */
	send_lease(&peer2, 2);	/* member 2 back: fresh */
	turn();
	CU_ASSERT(rps__cp_member_fresh(cp, 2));
	CU_ASSERT(rps__cp_balance_pending(cp));	/* STATUS: balancing */
	CU_ASSERT(run_until(moving_to_2));
	CU_ASSERT(rps__cp_balance_pending(cp));	/* (its move under way) */
}

/* Zones declared after the backups were placed (a cluster bootstrapped
 * before its members' SET_ZONE): partition 0 on 1 (zone a) is backed by 2
 * (zone a too) while 3 (zone b) holds none of it.  The leader seeds a copy
 * on 3 first (three copies for a moment: not aborted as one too many),
 * then drops 2, the copy that shares a zone; partition 1, backed by 3,
 * spans both zones already and is left alone. */
static void test_replica_zones_late(void)
{
	fresh_cluster();
	rps__fault_set("no-replica-duty");
	apply_cmd(RPS__SMAP_SET_REPLICAS, 0, 2, 0, 0);
	for (uint32_t p = 0; p < NPART_R; p++)
		add_backup(p, p == 1 ? 3 : 2);
	apply_zone(1, "a");
	apply_zone(2, "a");
	apply_zone(3, "b");
	rps__fault_set(NULL);
	CU_ASSERT_FATAL(run_until(p0_joining_3));
	read_map();
	CU_ASSERT_EQUAL(pub.parts[0].backups[0], 2u);	/* kept until the new copy is in */
	CU_ASSERT_EQUAL(pub.parts[1].joining, 0u);
	take_image(0, 0);
	turns_for(100);
	read_map();
	CU_ASSERT_EQUAL(pub.parts[0].joining, 3u);	/* not aborted */
	apply_cmd(RPS__SMAP_REPLICA_COMMIT, 0, 0, 0, 3);
	CU_ASSERT_FATAL(run_until(p0_zone_spread));
	read_map();
	CU_ASSERT_EQUAL(pub.parts[1].backups[0], 3u);
	CU_ASSERT_EQUAL(pub.parts[1].backups[1], 0u);
	CU_ASSERT_EQUAL(pub.parts[1].joining, 0u);
}

static bool p0_not_joining(void) { read_map(); return !pub.parts[0].joining; }
static bool p1_not_backed(void) { read_map(); return !pub.parts[1].backups[0]; }

/* The map stays as it is for 700 ms (past REPLICA_RETRY_NS): no command
 * applied (pub.applied: the last map command's index, whatever the
 * membership entries do), its first partitions (len bytes) equal to want. */
static void map_stays(const struct rps__smap_part *want, size_t len)
{
	uint64_t applied;

	read_map();
	applied = pub.applied;
	turns_for(700);
	read_map();
	CU_ASSERT_EQUAL(pub.applied, applied);
	CU_ASSERT_EQUAL(memcmp(pub.parts, want, len), 0);
}

/* A replica whose stream broke before it confirmed an update (the data
 * plane's part_diverged names it): the primary has the map drop it, one
 * command each, not repeated: REPLICA_ABORT of partition 0's seeding of 3
 * (the joiner; the epoch stays), REPLICA_DROP of partition 1's backup 2
 * (the next epoch).  A member the partition's set does not hold (2 for
 * partition 0, 2 for partition 2, backed by 3) gets nothing proposed. */
static void test_replica_diverged(void)
{
	struct rps__smap_part want[3];

	fresh_cluster();
	rps__fault_set("no-replica-duty");	/* (the map is made by hand here) */
	peer3.seeds = 0;	/* (offered in the tests before) */
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 0, 0, 0, 3);
	take_image(0, 0);	/* (installed: no timeout ends this seeding) */
	add_backup(1, 2);
	add_backup(2, 3);
	read_map();
	memcpy(want, pub.parts, sizeof(want));
	CU_ASSERT_EQUAL_FATAL(want[0].joining, 3u);
	/* neither */
	fake.diverged[0] = 2;
	fake.diverged[2] = 2;
	map_stays(want, sizeof(want));
	/* the joiner: the seeding aborted, nothing else */
	fake.diverged[0] = 3;
	fake.diverged[2] = 0;
	CU_ASSERT_FATAL(run_until(p0_not_joining));
	want[0].joining = 0;
	map_stays(want, sizeof(want));
	/* the backup: dropped, nothing else */
	fake.diverged[0] = 0;
	fake.diverged[1] = 2;
	CU_ASSERT_FATAL(run_until(p1_not_backed));
	want[1].backups[0] = 0;
	want[1].epoch++;
	map_stays(want, sizeof(want));
	fake.diverged[1] = 0;
	rps__fault_set(NULL);
}

static bool p2_drained(void) { return logged("drop 2", 0) >= 0; }
static bool p2_not_joining(void) { read_map(); return !pub.parts[2].joining; }
static bool p3_drained(void) { return logged("drop 3", 0) >= 0; }
static bool p3_not_joining(void) { read_map(); return !pub.parts[3].joining; }
static bool p2_backup(void) { read_map(); return pub.parts[2].backups[0] == 1 && !pub.parts[2].joining; }

/* The joiner's side: a stale offer is refused, the image installed as a
 * backup at the primary's stream seq, REPLICA_COMMIT proposed; dropped
 * from the set, its copy goes after --drain-ms; seeded again without an
 * image, it aborts the seeding itself after --move-timeout-ms. */
static void test_replica_joiner(void)
{
	struct rps__seed sd;
	char img[64];

	rps__fault_set("no-replica-duty");	/* (the map is made by hand here) */
	memset(img, 0x33, sizeof(img));
	/* partition 2 goes to member 2, without us */
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 2, 0, 0, 2);
	apply_cmd(RPS__SMAP_REPLICA_COMMIT, 2, 0, 0, 2);
	apply_cmd(RPS__SMAP_FAILOVER, 2, 0, 1, 2);
	CU_ASSERT_FATAL(run_until(p2_drained));
	fake.nlog = 0;
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 2, 0, 0, 1);
	read_map();
	CU_ASSERT_EQUAL_FATAL(pub.parts[2].joining, 1u);
	CU_ASSERT(fake.parts[2].backup && !fake.parts[2].serving);
	memset(&sd, 0, sizeof(sd));
	sd.mig.part = 2;
	sd.mig.from = 2;
	sd.mig.epoch = pub.parts[2].epoch + 1;	/* not this seeding's */
	sd.mig.len = sizeof(img);
	sd.mig.crc = rps__crc32c_noinv(img, sizeof(img));
	sd.seq = 4242;
	peer2.reading = false;
	send_msg(&peer2, RPS__MSG_SEED, 2, 0, &sd, sizeof(sd));
	CU_ASSERT_EQUAL(peer2.last_type, RPS__MSG_MIGRATE_REP);
	CU_ASSERT_EQUAL(peer2.last_status, -EAGAIN);
	CU_ASSERT(!peer2.reading);
	sd.mig.epoch = pub.parts[2].epoch;
	send_msg(&peer2, RPS__MSG_SEED, 2, 0, &sd, sizeof(sd));
	CU_ASSERT_FATAL(peer2.reading);
	peer2.reading = false;
	hooks.on_read_done(hooks.ctx, &peer2, true, img);
	CU_ASSERT_EQUAL(peer2.last_type, RPS__MSG_MIGRATE_REP);
	CU_ASSERT_EQUAL(peer2.last_status, 0);
	CU_ASSERT(logged("install_backup 2", 0) >= 0);
	CU_ASSERT(logged("seq 4242", 0) >= 0);
	CU_ASSERT(logged("install 2", 0) < 0);	/* (not as a move's destination) */
	CU_ASSERT_FATAL(run_until(p2_backup));
	CU_ASSERT(fake.parts[2].backup && !fake.parts[2].serving);
	CU_ASSERT_EQUAL(fake.parts[2].primary, 2u);
	/* dropped from the set: the copy goes after the drain */
	CU_ASSERT(logged("drop 2", 0) < 0);
	apply_cmd(RPS__SMAP_REPLICA_DROP, 2, 1, 0, 0);
	CU_ASSERT(!fake.parts[2].backup);
	CU_ASSERT_FATAL(run_until(p2_drained));
	/* seeded again, but no image comes: the joiner aborts it itself */
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 2, 0, 0, 1);
	read_map();
	CU_ASSERT_EQUAL_FATAL(pub.parts[2].joining, 1u);
	CU_ASSERT_FATAL(run_until(p2_not_joining));
	CU_ASSERT(!fake.parts[2].backup);
	/* two seedings from member 2: while the first image's READ lasts,
	 * the second's offer waits, and so does its timeout (the first's
	 * runs out) */
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 3, 0, 0, 2);
	apply_cmd(RPS__SMAP_REPLICA_COMMIT, 3, 0, 0, 2);
	apply_cmd(RPS__SMAP_FAILOVER, 3, 0, 1, 2);
	CU_ASSERT_FATAL(run_until(p3_drained));
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 2, 0, 0, 1);
	apply_cmd(RPS__SMAP_REPLICA_BEGIN, 3, 0, 0, 1);
	read_map();
	sd.mig.epoch = pub.parts[2].epoch;
	peer2.reading = false;
	send_msg(&peer2, RPS__MSG_SEED, 2, 0, &sd, sizeof(sd));
	CU_ASSERT_FATAL(peer2.reading);
	turns_for(600);
	CU_ASSERT_FATAL(run_until(p2_not_joining));
	read_map();
	CU_ASSERT_EQUAL(pub.parts[3].joining, 1u);
	hooks.on_read_done(hooks.ctx, &peer2, true, img);	/* (too late) */
	CU_ASSERT_EQUAL(peer2.last_status, RPS_ESTALE_EPOCH);
	CU_ASSERT_FATAL(run_until(p3_not_joining));
	rps__fault_set(NULL);
}

/* A member restarted with other flags replays its log onto the map its
 * cluster was formed with (the log's bootstrap snapshot holds it), not onto
 * one its new flags, or newer defaults, would build. */
static void test_bootstrap_map_kept(void)
{
	struct rps__server_config cfg = the_cfg;
	char dir[200];
	int level;

	hooks.fini(hooks.ctx);
	rps__cp_destroy(cp);
	test_mkdtemp(dir, sizeof(dir), "test_cplane3");
	cfg.data_dir = dir;
	cfg.npart = NPART_R;
	cp = NULL;
	CU_ASSERT_FATAL(rps__cp_create(&cfg, &cp) == 0 && rps__cp_start(cp, &fake_ops, &fake, &hooks) == 0);
	read_map();
	CU_ASSERT_EQUAL(pub.npart, NPART_R);
	hooks.fini(hooks.ctx);
	rps__cp_destroy(cp);

	cfg.npart = NPART;
	cp = NULL;
	level = rps__log_level;
	if (level == RPS__LOG_ERROR)
		rps__log_level = -1;	/* (its partitions are "lost with the restart": a fake data plane) */
	CU_ASSERT_FATAL(rps__cp_create(&cfg, &cp) == 0 && rps__cp_start(cp, &fake_ops, &fake, &hooks) == 0);
	rps__log_level = level;
	read_map();
	CU_ASSERT_EQUAL(pub.npart, NPART_R);
	CU_ASSERT_EQUAL(pub.nmembers, 1u);
	CU_ASSERT_EQUAL(pub.parts[NPART_R - 1].owner, 1u);

	fresh_cluster();	/* (stops this one; the suite's end finds a cluster to stop) */
	(void)rps__remove_tree(dir);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "bootstrap serves every partition", test_bootstrap_serves_every_partition },
		{ "move aborted: refuse, fence, serialise, then unfence", test_move_abort_unfences },
		{ "move committed: the old copy dropped after the drain", test_move_commit_drops },
		{ "move in: stale and corrupt offers refused, the good one installed", test_move_in_installs },
		{ "checkpoint: hold, take, release, restore", test_checkpoint_hold_take },
		{ "checkpoint: names that could leave --checkpoint-dir refused first", test_checkpoint_bad_names },
		{ "messages a connection may not send", test_refusals },
		{ "psctl requests of one turn: one WAL batch", test_admin_proposals_batched },
		{ "lease: granted after a ReadIndex round, runs from t_send", test_lease_after_read_index },
		{ "failure: declared after failover_ms exactly; R=1: nothing proposed", test_failure_without_backups },
		{ "failover: FAILOVER, REPLICA_DROP, REPLICA_ABORT in one batch", test_failover_proposed },
		{ "backup: promoted on FAILOVER, drained on REPLICA_DROP", test_backup_promoted_or_dropped },
		{ "a new leader waits 1.1 x lease_ms; members never connected are not failed", test_new_leader_waits },
		{ "a new leader gives the old one 1.1 x lease_ms, the others failover_ms", test_new_leader_old_one_first },
		{ "replicas: the leader seeds 4 per primary at once, the next on a commit, backs off on an abort", test_replica_placement },
		{ "replicas: the joiner installs the image as a backup and commits", test_replica_joiner },
		{ "replicas: zones declared after placement: a copy seeded in the missing zone, then the duplicate dropped", test_replica_zones_late },
		{ "balancing: a member back without a failure gets its share at its next lease", test_balance_member_back },
		{ "replicas: a diverged joiner's seeding aborted, a diverged backup dropped, anyone else left alone", test_replica_diverged },
		{ "a restart replays onto the bootstrap map its cluster was formed with", test_bootstrap_map_kept },
	};
	int ret;

	/* (the suite runs without the leader's replica duty: no-replica-duty) */
	if ((ret = cutest_require_faults("test_cplane")))
		return ret;
	return cutest_run1("cplane", suite_init, suite_fini, NULL, NULL, tests, RPS__ARRAY_SIZE(tests));
}
