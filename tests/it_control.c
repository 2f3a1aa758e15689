/*
 * it_control.c - multi-process integration tests of the control plane: three
 * rdmapsd processes forming a Raft group that owns the shard map, psctl
 * administering it, and workers in forked processes training through it,
 * over TCP on loopback (or verbs with RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=...).
 *
 * Every test starts its own servers (8 partitions, 4 KiB shards, so the
 * 16384-element tensors have 16 shards, 2 in every partition) and checks
 * exact values:
 *  - status: one leader, the same term on every member, valid JSON;
 *  - moves while 4 workers train in async, sync and bounded mode: every
 *    element equals what the pushes sum to (no update lost or doubled), and
 *    the map shows the new owners with epochs raised by the number of moves;
 *  - add-server and remove-server while training; the removed server exits;
 *    a server that joins knowing only a follower's address;
 *  - the leader killed with SIGKILL during a move (right after psctl sends
 *    it, and while the destination is cut off so the move surely waits)
 *    and restarted from its --data-dir (fsync always): the members converge
 *    on one map where the move either committed or aborted, and training
 *    completes exactly;
 *  - a follower cut off from its peers (RPS_FAULT=isolate-signals): moves
 *    commit without it, and it catches up once back; psctl finds the leader
 *    when the first server of its list is the one cut off;
 *  - transfer-leader; bad psctl input and a malformed ADMIN message;
 *  - lost partitions: a partition owner killed and restarted, or a dead
 *    one forced out (remove-server --force): what it held is refused
 *    (-ENODATA), never served as zeros, the rest stays exact, until a
 *    restore or forget-lost.
 *  - checkpoints: taken during training and restored exactly onto fewer
 *    and more servers; a request names a checkpoint under the servers'
 *    --checkpoint-dir and whatever could leave it (absolute paths, "..",
 *    links planted in it) is refused, as is every request to a server
 *    without one.
 *
 * Workers never wait for the parent while it acts, so training runs through
 * every psctl command; the parent then stops them after a number of steps
 * it decides (see struct train_shared) and checks the exact sums.
 *
 * The test process itself never opens a fabric: whatever talks to a server
 * directly (STATUS queries, pulls, raw connections) runs in a forked child,
 * so the verbs run does not share device contexts across forks.
 */
#include "config.h"
#include "cluster.h"
#include "client/ctl.h"
#include "proto/auth.h"
#include "common/common.h"
#include "proto/proto.h"
#include "control/raft.h"
#include "proto/shard.h"
#include "proto/smap.h"
#include "transport/transport.h"
#include "transport/uri.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"
#include "lib/json.h"
#include "lib/watchdog.h"
#include "lib/tmpdir.h"

#define NWORKERS 4
#define NPART 8
#define COUNT 16384u		/* fp32: 16 shards of 4 KiB, 2 per partition */
/* The tests of moves and membership run at R = 1, as they were written (the
 * default is 2 from 2 servers on: it_seed tests moves of replicated
 * partitions); BASE0 is for the failover tests, which bring their own map.
 * Each checks the exact map its moves and kills make: --rebalance off, so
 * that the leader does not even the primaries out after a member's return
 * (it_replica tests that it does). */
#define BASE0 "--partitions 8 --shard-size 4096 --slots 4 --tick-ms 20 --move-timeout-ms 10000 --rebalance off"
#define BASE_ARGS BASE0 " --replicas 1"
/* The bootstrap map of 2 or more servers has a backup of every partition;
 * --replicas 1 drops them (REPLICA_DROP: epoch + 1): what the tests start
 * from, once the map settled (start_n). */
#define EPOCH0 2u
#define FAST_ARGS BASE_ARGS " --fsync none"
#define DURABLE_ARGS BASE_ARGS " --fsync always"
#define PSCTL_MS 40000		/* psctl runs with --timeout 20: kill it well after that */
#define OUT_MAX 65536
/* workers train at least this long ...  (what a test checks happens
 * between STEPS_BEFORE and its end, with at least 10 steps of every worker
 * after its action, check_progressed: the rest only pads the run, which
 * over emulated verbs costs a minute a test at 300) */
#define MIN_STEPS 120
#define STEPS_BEFORE 50		/* ... and this long before the control plane acts */

static char out[OUT_MAX], err[8192];
/* The servers and workers of the running test (a failed fatal assertion
 * leaves them to test_teardown). */
static struct it_cluster clu;
static struct it_workers trainers;
static bool clu_up, trainers_up;

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what, int ret)
{
	fprintf(stderr, "worker: %s: %d (%s): %s\n", what, ret, rps_strerror(ret), rps_last_error());
	return 1;
}

/* Bootstrapped members are 1..n at indexes 0..n-1; joined ones get id
 * index+1 here too. */
static int idx_of(uint64_t id)
{
	return (int)id - 1;
}

/* ---- what a member says: STATUS over a ctl channel, in a child ---------- */

struct mstatus {
	struct rps__status_rep st;
	struct rps__smap map;
};

static int status_child(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	static char buf[sizeof(struct rps__status_rep) + RPS__SMAP_ENC_MAX + 64];
	static struct mstatus ms;
	struct rps__ctl *ctl = NULL;
	struct rps__uri u;
	size_t len = 0;
	int32_t status = 0;
	int ret;

	(void)rank;
	(void)nworkers;
	(void)servers;
	memset(&ms, 0, sizeof(ms));
	ret = rps__uri_parse(arg, &u);
	if (!ret)
		ret = rps__ctl_open(&u, 2000, &ctl);
	if (!ret)
		ret = rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, buf, sizeof(buf), &len, &status, 2000);
	if (!ret && status)
		ret = status;
	if (!ret && len < sizeof(ms.st))
		ret = -EBADMSG;
	if (!ret) {
		memcpy(&ms.st, buf, sizeof(ms.st));
		ret = rps__smap_decode(buf + sizeof(ms.st), len - sizeof(ms.st), &ms.map);
	}
	rps__ctl_close(ctl);
	it_write_all(out_fd, &ret, sizeof(ret));
	if (!ret)
		it_write_all(out_fd, &ms, sizeof(ms));
	return 0;
}

/* Server i's Raft state and its own copy of the map: 0 or -errno. */
static int member_status(struct it_cluster *cl, int i, struct mstatus *ms)
{
	struct it_workers w;
	int ret = -EIO, got;

	memset(ms, 0, sizeof(*ms));
	if (it_workers_start(&w, 1, status_child, NULL, cl->uri[i], -1, NULL))
		return -ECHILD;
	if (it_worker_read(&w, 0, &ret, sizeof(ret)) == 0 && !ret)
		ret = it_worker_read(&w, 0, ms, sizeof(*ms)) ? -EIO : 0;
	got = it_worker_wait(&w, 0);
	return got ? -ECHILD : ret;
}

static bool same_map(const struct rps__smap *a, const struct rps__smap *b)
{
	uint32_t i;

	if (a->applied != b->applied || a->max_id != b->max_id || a->npart != b->npart || a->nmembers != b->nmembers)
		return false;
	for (i = 0; i < a->nmembers; i++)
		if (a->members[i].id != b->members[i].id || strcmp(a->members[i].uri, b->members[i].uri))
			return false;
	for (i = 0; i < a->npart; i++)
		if (a->parts[i].owner != b->parts[i].owner || a->parts[i].epoch != b->parts[i].epoch ||
		    a->parts[i].moving_to != b->parts[i].moving_to)
			return false;
	return true;
}

/* Poll the running servers (mask, bit i: server i; 0: all running) until
 * they all name the same leader in the same term, that leader says it leads,
 * and (converge) they all applied the same log with the same map and no
 * partition moving.  The leader's index, or -1 after timeout_ms. */
static int wait_agreement(struct it_cluster *cl, unsigned mask, bool converge, int timeout_ms, struct mstatus *lead)
{
	static struct mstatus ms[IT_MAX_SERVERS];
	double until = now_s() + timeout_ms / 1000.0;
	char why[300] = "";
	int i, n;

	if (!mask)
		for (i = 0; i < cl->nservers; i++)
			mask |= it_server_alive(cl, i) ? 1u << i : 0;
	for (;;) {
		int leader = -1, first = -1;
		bool ok = true;

		for (i = 0, n = 0; i < cl->nservers && ok; i++) {
			if (!(mask & (1u << i)))
				continue;
			if (member_status(cl, i, &ms[i])) {
				snprintf(why, sizeof(why), "server %d does not answer STATUS", i);
				ok = false;
				break;
			}
			n++;
			if (first < 0)
				first = i;
			if (ms[i].st.role == RPS__RAFT_LEADER) {
				if (leader >= 0) {
					snprintf(why, sizeof(why), "two leaders: %d and %d", leader, i);
					ok = false;
				}
				leader = i;
			}
			if (!ms[i].st.leader || ms[i].st.leader != ms[first].st.leader ||
			    ms[i].st.term != ms[first].st.term) {
				snprintf(why, sizeof(why), "server %d: leader %llu term %llu; server %d: leader %llu term %llu",
					 i, (unsigned long long)ms[i].st.leader, (unsigned long long)ms[i].st.term, first,
					 (unsigned long long)ms[first].st.leader, (unsigned long long)ms[first].st.term);
				ok = false;
			}
			if (converge && ok && (ms[i].st.applied != ms[first].st.applied ||
					       !same_map(&ms[i].map, &ms[first].map))) {
				snprintf(why, sizeof(why), "server %d applied %llu, server %d applied %llu (or maps differ)",
					 i, (unsigned long long)ms[i].st.applied, first,
					 (unsigned long long)ms[first].st.applied);
				ok = false;
			}
			if (converge && ok) {
				uint32_t p;
				for (p = 0; p < ms[i].map.npart; p++)
					if (ms[i].map.parts[p].moving_to) {
						snprintf(why, sizeof(why), "partition %u still moving", p);
						ok = false;
					}
			}
		}
		if (ok && leader < 0)
			snprintf(why, sizeof(why), "no leader");
		if (ok && leader >= 0 && n > 0 && ms[leader].st.id == ms[first].st.leader) {
			if (lead)
				*lead = ms[leader];
			return leader;
		}
		if (now_s() > until) {
			fprintf(stderr, "it_control: no agreement after %d ms: %s\n", timeout_ms, why);
			return -1;
		}
		sleep_ms(30);
	}
}

/* ---- psctl output -------------------------------------------------------- */

/* python3's json module agrees, where python3 exists: 1 yes, 0 no, -1 no python3. */
static int python_json_ok(const char *text)
{
	const char *path = getenv("PATH");
	char dir[1024], cand[1100];
	bool found = false;
	FILE *f;
	int st;

	while (path && *path && !found) {
		size_t n = strcspn(path, ":");
		snprintf(dir, sizeof(dir), "%.*s", (int)n, path);
		snprintf(cand, sizeof(cand), "%s/python3", dir[0] ? dir : ".");
		found = access(cand, X_OK) == 0;
		path += n + (path[n] == ':');
	}
	if (!found)
		return -1;
	fflush(NULL);
	f = popen("python3 -c 'import json,sys; json.load(sys.stdin)' 2>/dev/null", "w");
	if (!f)
		return -1;
	fputs(text, f);
	st = pclose(f);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* How many of psctl status --json's members[] have field equal to the
 * JSON text literal (true, "leader", ...). */
static int members_with(const char *s, const char *field, const char *literal)
{
	int i, n = 0, len = json_len(s, "members");

	for (i = 0; i < len; i++)
		n += json_is(s, literal, "members[%d].%s", i, field);
	return n;
}

/* How many entries of members[] and map.members[] have that id. */
static int members_with_id(const char *s, unsigned long long id)
{
	static const char *const lists[] = { "members", "map.members" };
	unsigned long long v;
	int k, i, n = 0;

	for (k = 0; k < 2; k++)
		for (i = 0; i < json_len(s, "%s", lists[k]); i++)
			n += json_u64(s, &v, "%s[%d].id", lists[k], i) && v == id;
	return n;
}

/* The entries of members[] and map.members[]. */
static int members_listed(const char *s)
{
	return json_len(s, "members") + json_len(s, "map.members");
}

struct part_ex {
	unsigned long long owner, epoch;
};

/* The partitions of the "map" object of psctl status --json (none moving). */
static int json_map(const char *s, struct part_ex *parts, int *npart)
{
	int n = json_len(s, "map.partitions"), p;

	if (n < 0 || n > NPART)
		return -1;
	for (p = 0; p < n; p++) {
		unsigned long long part, moving;
		if (!json_u64(s, &part, "map.partitions[%d].partition", p) || part != (unsigned)p ||
		    !json_u64(s, &parts[p].owner, "map.partitions[%d].owner", p) ||
		    !json_u64(s, &parts[p].epoch, "map.partitions[%d].epoch", p) ||
		    !json_u64(s, &moving, "map.partitions[%d].moving_to", p) || moving)
			return -1;
	}
	*npart = n;
	return 0;
}

/* psctl status --json: valid, and its map (the leader's) is exactly ex. */
static void check_status_map(struct it_cluster *cl, const struct part_ex *ex, const char *servers)
{
	struct part_ex got[NPART];
	int n = 0, rc, p, bad = 0;

	rc = it_psctl(cl, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json status", servers);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_valid(out));
	CU_ASSERT_EQUAL_FATAL(json_map(out, got, &n), 0);
	CU_ASSERT_EQUAL(n, NPART);
	for (p = 0; p < n; p++)
		if (got[p].owner != ex[p].owner || got[p].epoch != ex[p].epoch) {
			fprintf(stderr, "partition %d: status says member %llu epoch %llu, expected member %llu epoch %llu\n",
				p, got[p].owner, got[p].epoch, ex[p].owner, ex[p].epoch);
			bad++;
		}
	CU_ASSERT_EQUAL(bad, 0);
}

/* The map as a member holds it equals ex. */
static int map_differs(const struct rps__smap *m, const struct part_ex *ex)
{
	int p, bad = 0;

	if (m->npart != NPART)
		return 1;
	for (p = 0; p < NPART; p++)
		bad += m->parts[p].owner != ex[p].owner || m->parts[p].epoch != ex[p].epoch || m->parts[p].moving_to;
	return bad;
}

/* Entry i of "moves" of a psctl --json run is that move. */
static bool move_is(const char *js, int i, unsigned part, unsigned long long from, unsigned long long to,
		    unsigned long long epoch)
{
	unsigned long long p, f, t, e;

	return json_u64(js, &p, "moves[%d].partition", i) && json_u64(js, &f, "moves[%d].from", i) &&
	       json_u64(js, &t, "moves[%d].to", i) && json_u64(js, &e, "moves[%d].epoch", i) && p == part &&
	       f == from && t == to && e == epoch;
}

/* The "moves" of a psctl --json run (add-server, remove-server) into ex
 * (checking each one's source and epoch against it); the number of moves. */
static int apply_moves(const char *js, struct part_ex *ex)
{
	int i, moves = json_len(js, "moves");

	CU_ASSERT_FATAL(moves >= 0);
	for (i = 0; i < moves; i++) {
		unsigned long long part = NPART, from = 0, to = 0, epoch = 0;
		json_u64(js, &part, "moves[%d].partition", i);
		json_u64(js, &from, "moves[%d].from", i);
		json_u64(js, &to, "moves[%d].to", i);
		json_u64(js, &epoch, "moves[%d].epoch", i);
		CU_ASSERT_FATAL(part < NPART);
		CU_ASSERT_EQUAL(from, ex[part].owner);
		CU_ASSERT_EQUAL(epoch, ex[part].epoch + 1);
		ex[part].owner = to;
		ex[part].epoch = epoch;
	}
	return moves;
}

static const char *move_servers;	/* psctl -s for move(), NULL: every server started */

/* psctl --json move PART TO: exit 0, exactly that one move, and ex updated. */
static void move(struct it_cluster *cl, unsigned part, unsigned long long to, struct part_ex *ex)
{
	unsigned long long owner = 0, epoch = 0;
	int rc;

	rc = it_psctl(cl, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json --timeout 20 move %u %llu",
		      move_servers ? move_servers : cl->servers, part, to);
	if (rc)
		fprintf(stderr, "psctl move %u %llu: exit %d: %s", part, to, rc, err);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_len(out, "moves") == 1 && move_is(out, 0, part, ex[part].owner, to, ex[part].epoch + 1) &&
		  json_u64(out, &owner, "owner") && owner == to && json_u64(out, &epoch, "epoch") &&
		  epoch == ex[part].epoch + 1);
	if (!rc) {
		ex[part].owner = to;
		ex[part].epoch++;
	}
}

/* exactly one line, "psctl: ..." */
static bool one_line(const char *s)
{
	size_t n = strlen(s);

	return !strncmp(s, "psctl: ", 7) && n > 8 && s[n - 1] == '\n' && !memchr(s, '\n', n - 1);
}

/* The bootstrap map: partition p on member (p mod n) + 1, epoch 1. */
static void bootstrap_ex(struct part_ex *ex, int n)
{
	int p;

	for (p = 0; p < NPART; p++) {
		ex[p].owner = (unsigned long long)(p % n) + 1;
		ex[p].epoch = EPOCH0;
	}
}

/* ---- training workers ------------------------------------------------------ */

/*
 * Workers train until the parent has done what it tests, then all stop
 * after exactly the same number of steps T, which the parent decides when
 * it stops them.  So training runs through every psctl command (workers
 * never wait for the parent before it decides to stop them), and the final
 * values are exact whatever T turned out to be.
 *
 * Shared memory (mapped before the workers fork), sequentially consistent:
 * before step s a worker stores at[rank] = s, then loads stop; only if
 * stop is set does it wait for target and stop at s == target.  The parent
 * stores stop, then reads every at[] and stores target = max + 1.  A worker
 * that does step s without seeing stop stored at = s before the parent
 * read it, so target > s: nobody overshoots, and every worker does exactly
 * target steps.
 */
struct train_shared {
	_Atomic int stop;
	_Atomic int target;		/* 0: not decided yet */
	_Atomic int at[NWORKERS];	/* the step a worker is about to do */
	_Atomic int done[NWORKERS];	/* steps it has done */
};

static struct train_shared *train_sh;

struct train_arg {
	const char *name;
	enum rps_mode mode;
	uint32_t staleness;
	int check_every;	/* pull and check every this many steps (0: never) */
};

/* What a worker pushes at each step: all 1.0 (async), rank+1 (sync, bounded). */
static float grad_of(const struct train_arg *a, int rank)
{
	return a->mode == RPS_MODE_ASYNC ? 1.0f : (float)(rank + 1);
}

/* The sum of every worker's gradient in one step. */
static float step_sum(const struct train_arg *a)
{
	float s = 0;
	int r;

	for (r = 0; r < NWORKERS; r++)
		s += grad_of(a, r);
	return s;
}

/*
 * Push every step, check pulls on the way (exact where the mode allows),
 * stop as train_shared says; then write the steps done, the final pull's
 * version and the number of bad values seen to out_fd.
 */
static int train_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct train_arg *a = arg;
	float *g = malloc(COUNT * sizeof(float)), *p = malloc(COUNT * sizeof(float));
	float sum = step_sum(a);
	struct rps_client_opts co;
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	uint64_t version = 0, i;
	int s, ret, bad = 0;

	for (i = 0; i < COUNT; i++)
		g[i] = grad_of(a, rank);
	rps_client_opts_init(&co);
	co.servers = servers;
	co.rank = rank;
	co.num_workers = nworkers;
	co.timeout_ms = 25000;
	if ((ret = rps_client_connect(&co, &cl)))
		return fail("connect", ret);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = a->mode;
	o.staleness = a->staleness;
	o.optimizer = RPS_OPT_SUM;
	o.rescale = 1.0f;
	if ((ret = rps_tensor_create(cl, a->name, &o, &t)))
		return fail("create", ret);
	if ((ret = rps_barrier(cl)))
		return fail("barrier", ret);
	for (s = 0;; s++) {
		atomic_store(&train_sh->at[rank], s);
		if (atomic_load(&train_sh->stop)) {
			int target;
			while (!(target = atomic_load(&train_sh->target)))
				usleep(500);
			if (s >= target)
				break;
		}
		if ((ret = rps_push(t, g, COUNT * sizeof(float))))
			return fail("push", ret);
		if (a->check_every && (s + 1) % a->check_every == 0) {
			if ((ret = rps_pull(t, p, COUNT * sizeof(float), &version)))
				return fail("pull", ret);
			for (i = 0; i < COUNT; i++) {
				float v = p[i];
				if (a->mode == RPS_MODE_SYNC)	/* every step so far, exactly */
					bad += v != (float)(s + 1) * sum;
				else if (a->mode == RPS_MODE_BOUNDED)	/* nobody more than k behind */
					bad += v < (float)(s + 1 - (int)a->staleness) * sum;
				else	/* at least my own pushes, whole numbers */
					bad += v < (float)(s + 1) || v != (float)(int)v;
			}
			if (a->mode == RPS_MODE_SYNC && version != (uint64_t)s + 1) {
				fprintf(stderr, "worker %d: step %d pulled version %llu\n", rank, s, (unsigned long long)version);
				bad++;
			}
		}
		atomic_store(&train_sh->done[rank], s + 1);
		usleep(500);	/* leave the servers and psctl some of the 2 cores */
	}
	if ((ret = rps_pull(t, p, COUNT * sizeof(float), &version)))
		return fail("final pull", ret);
	if (a->mode == RPS_MODE_SYNC)
		for (i = 0; i < COUNT; i++)
			bad += p[i] != (float)s * sum;
	if (bad)
		fprintf(stderr, "worker %d: %d bad values\n", rank, bad);
	it_write_all(out_fd, &s, sizeof(s));
	it_write_all(out_fd, &version, sizeof(version));
	it_write_all(out_fd, &bad, sizeof(bad));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	free(p);
	return 0;
}

static void start_training(struct it_cluster *cl, struct it_workers *w, struct train_arg *a, const char *servers)
{
	memset(train_sh, 0, sizeof(*train_sh));
	CU_ASSERT_EQUAL_FATAL(it_workers_start(w, NWORKERS, train_worker, servers ? servers : cl->servers, a, -1, NULL), 0);
	trainers_up = true;
}

/* Wait until every worker has done at least `steps` steps.  Generous:
 * under QEMU TCG on a loaded host a bounded step of four workers has been
 * seen to take most of a second. */
static void wait_progress(struct it_workers *w, int steps)
{
	double until = now_s() + 120;
	int r;

	for (r = 0; r < w->n; r++)
		while (atomic_load(&train_sh->done[r]) < steps) {
			int st;
			if (waitpid(w->pid[r], &st, WNOHANG) != 0 || now_s() > until) {
				CU_FAIL("a worker stopped before the test began");
				return;
			}
			sleep_ms(2);
		}
}

static void snap_progress(int *done)
{
	int r;

	for (r = 0; r < NWORKERS; r++)
		done[r] = atomic_load(&train_sh->done[r]);
}

/* Training goes on after what the control plane did: every worker gets at
 * least 10 steps past `before` (taken when it began).  Prints how many
 * steps each made while it was at it. */
static void check_progressed(const int *before, const char *during)
{
	int r, now[NWORKERS], stuck = 0;
	double until = now_s() + 20;

	snap_progress(now);
	fprintf(stderr, "[steps during %s:", during);
	for (r = 0; r < NWORKERS; r++)
		fprintf(stderr, " %d", now[r] - before[r]);
	fprintf(stderr, "] ");
	for (r = 0; r < NWORKERS; r++)
		while (atomic_load(&train_sh->done[r]) < before[r] + 10) {
			if (now_s() > until) {
				stuck++;
				break;
			}
			sleep_ms(2);
		}
	CU_ASSERT_EQUAL(stuck, 0);
}

/* Stop training: every worker ends after the same number of steps (at
 * least MIN_STEPS), returned. */
static int stop_training(void)
{
	int r, target = MIN_STEPS;

	atomic_store(&train_sh->stop, 1);
	for (r = 0; r < NWORKERS; r++)
		if (atomic_load(&train_sh->at[r]) + 1 > target)
			target = atomic_load(&train_sh->at[r]) + 1;
	atomic_store(&train_sh->target, target);
	return target;
}

/* Stop the workers and collect them: exit 0, `steps` steps each, final
 * version (sync: == steps), no bad values.  Returns the steps. */
static int finish_workers(struct it_workers *w, const struct train_arg *a)
{
	int r, steps = stop_training();

	for (r = 0; r < w->n; r++) {
		uint64_t version = 0;
		int bad = -1, done = -1;
		CU_ASSERT_EQUAL(it_worker_read(w, r, &done, sizeof(done)), 0);
		CU_ASSERT_EQUAL(it_worker_read(w, r, &version, sizeof(version)), 0);
		CU_ASSERT_EQUAL(it_worker_read(w, r, &bad, sizeof(bad)), 0);
		CU_ASSERT_EQUAL(done, steps);
		CU_ASSERT_EQUAL(bad, 0);
		if (a->mode == RPS_MODE_SYNC)
			CU_ASSERT_EQUAL(version, (uint64_t)steps);
		CU_ASSERT_EQUAL(it_worker_wait(w, r), 0);
	}
	trainers_up = false;
	fprintf(stderr, "[%d steps] ", steps);
	return steps;
}

/* Pull with a fresh client, in a child. */
struct pull_arg {
	const char *name;
};

static int pull_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct pull_arg *a = arg;
	float *p = malloc(COUNT * sizeof(float));
	struct rps_client_opts co;
	uint64_t version = 0;
	rps_client_t *cl;
	rps_tensor_t *t;
	int ret;

	(void)rank;
	(void)nworkers;
	rps_client_opts_init(&co);
	co.servers = servers;
	co.timeout_ms = 20000;
	if ((ret = rps_client_connect(&co, &cl)))
		return fail("connect", ret);
	ret = rps_tensor_open(cl, a->name, &t);
	if (!ret) {
		ret = rps_pull(t, p, COUNT * sizeof(float), &version);
		rps_tensor_close(t);
	}
	rps_client_close(cl);
	if (ret)
		return fail("pull", ret);
	it_write_all(out_fd, &version, sizeof(version));
	it_write_all(out_fd, p, COUNT * sizeof(float));
	free(p);
	return 0;
}

/* After training: every element == want, version == want_version. */
static void check_tensor(const char *servers, const char *name, float want, uint64_t want_version)
{
	struct pull_arg a = { .name = name };
	float *p = malloc(COUNT * sizeof(float));
	struct it_workers w;
	uint64_t version = 0, i;
	int ok, bad = 0;

	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, pull_worker, servers, &a, -1, NULL), 0);
	ok = it_worker_read(&w, 0, &version, sizeof(version)) == 0 &&
	     it_worker_read(&w, 0, p, COUNT * sizeof(float)) == 0;
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	CU_ASSERT_FATAL(ok);
	for (i = 0; i < COUNT; i++)
		if (p[i] != want) {
			if (!bad)
				fprintf(stderr, "%s[%llu] = %g, expected %g\n", name, (unsigned long long)i, (double)p[i],
					(double)want);
			bad++;
		}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, want_version);
	free(p);
}

/* The version a pull reports after training: sync counts steps, the others pushes. */
static uint64_t final_version(const struct train_arg *a, int steps)
{
	return a->mode == RPS_MODE_SYNC ? (uint64_t)steps : (uint64_t)steps * NWORKERS;
}

/* After training: every element is the sum of every push. */
static void check_trained(const char *servers, const struct train_arg *a, int steps)
{
	check_tensor(servers, a->name, (float)steps * step_sum(a), final_version(a, steps));
}

/* Every server still running, then all stop with status 0. */
static void stop_all(struct it_cluster *cl)
{
	int i, alive = 0, running = 0;

	for (i = 0; i < cl->nservers; i++) {
		if (cl->pid[i] > 0) {
			running++;
			alive += it_server_alive(cl, i);
		}
	}
	CU_ASSERT_EQUAL(alive, running);
	CU_ASSERT_EQUAL(it_cluster_stop(cl), 0);
	clu_up = false;
}

/* n servers; with --replicas 1, once the map has dropped the bootstrap's
 * backups everywhere (the tests count epochs from there: EPOCH0). */
static int start_n(struct it_cluster *cl, int n, const struct it_server_opts *o)
{
	int ret = it_cluster_start_opts(cl, n, o);

	if (ret)
		fprintf(stderr, "it_control: cannot start the servers: %s\n", strerror(-ret));
	clu_up = !ret;
	if (!ret && o->extra_args && strstr(o->extra_args, "--replicas 1") && !getenv("RPS_IT_ATTACH"))
		ret = it_wait_settled(cl, 1, 30000, NULL);
	return ret;
}

static int start3(struct it_cluster *cl, const struct it_server_opts *o)
{
	return start_n(cl, 3, o);
}

/* ---- 1. status ------------------------------------------------------------------ */

static void test_status(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	struct mstatus lead;
	unsigned long long leader = 0, term = 0, v;
	int l, rc, rows = 0, leaders = 0, py;
	char *line, *save = NULL;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, &lead);
	CU_ASSERT_FATAL(l >= 0);
	CU_ASSERT_EQUAL(lead.st.id, (uint64_t)l + 1);
	CU_ASSERT_EQUAL(lead.st.n_voters, 3u);
	CU_ASSERT_EQUAL(lead.st.n_learners, 0u);

	/* the table: one leader row, every member in the cluster's term */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "status");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_STRING_EQUAL(err, "");
	line = strstr(out, "\ncluster: leader ");
	CU_ASSERT_PTR_NOT_NULL_FATAL(line);
	CU_ASSERT_EQUAL(sscanf(line, "\ncluster: leader %llu, term %llu", &leader, &term), 2);
	CU_ASSERT_EQUAL(leader, lead.st.id);
	CU_ASSERT_EQUAL(term, lead.st.term);
	CU_ASSERT(strstr(out, "voters 1,2,3, learners none, fsync off") != NULL);
	CU_ASSERT(strstr(out, "shard map: 3 members, 8 partitions") != NULL);
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned long long id, t;
		char uri[300], role[32];
		if (sscanf(line, "%llu %299s %31s %llu", &id, uri, role, &t) != 4 || strncmp(uri, clu.scheme, 3))
			continue;
		rows++;
		CU_ASSERT_FATAL(id >= 1 && id <= 3);
		CU_ASSERT_STRING_EQUAL(uri, clu.uri[idx_of(id)]);
		CU_ASSERT_EQUAL(t, term);
		if (!strcmp(role, "leader")) {
			leaders++;
			CU_ASSERT_EQUAL(id, leader);
		} else {
			CU_ASSERT_STRING_EQUAL(role, "follower");
		}
	}
	CU_ASSERT_EQUAL(rows, 3);
	CU_ASSERT_EQUAL(leaders, 1);

	/* the same through each member's own address */
	for (l = 0; l < 3; l++) {
		unsigned long long ld2 = 0, t2 = 0;
		rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json status", clu.uri[l]);
		CU_ASSERT_EQUAL(rc, 0);
		CU_ASSERT(json_u64(out, &ld2, "leader") && json_u64(out, &t2, "term"));
		CU_ASSERT_EQUAL(ld2, leader);
		CU_ASSERT_EQUAL(t2, term);
	}

	/* JSON */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json status");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_valid(out));
	py = python_json_ok(out);
	CU_ASSERT(py != 0);
	CU_ASSERT(json_u64(out, &v, "leader") && v == leader);
	CU_ASSERT(json_u64(out, &v, "term") && v == term);
	CU_ASSERT_EQUAL(json_len(out, "voters"), 3);
	CU_ASSERT_EQUAL(json_len(out, "learners"), 0);
	CU_ASSERT_EQUAL(members_with(out, "reachable", "true"), 3);
	CU_ASSERT_EQUAL(members_with(out, "role", "\"leader\""), 1);
	CU_ASSERT_EQUAL(members_with(out, "role", "\"follower\""), 2);
	CU_ASSERT_EQUAL(json_len(out, "map.partitions"), NPART);
	CU_ASSERT_EQUAL(members_listed(out), 2 * 3);	/* members[] and map.members[] */
	{
		struct part_ex ex[NPART], got[NPART];
		int n = 0, p;
		bootstrap_ex(ex, 3);
		CU_ASSERT_EQUAL(json_map(out, got, &n), 0);
		CU_ASSERT_EQUAL(n, NPART);
		for (p = 0; p < n; p++) {
			CU_ASSERT_EQUAL(got[p].owner, ex[p].owner);
			CU_ASSERT_EQUAL(got[p].epoch, EPOCH0);
		}
	}
	/* the validator is not a rubber stamp */
	CU_ASSERT(!json_valid("{\"a\":1,}"));
	CU_ASSERT(!json_valid("{\"a\":[1,2}"));
	stop_all(&clu);
}

/* ---- 2. moves during training ------------------------------------------------------ */

#define MOVES 12

static void run_moves(enum rps_mode mode, const char *name)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	struct train_arg a = { .name = name, .mode = mode, .staleness = 2,
			       .check_every = mode == RPS_MODE_BOUNDED ? 1 : 10 };
	struct part_ex ex[NPART];
	struct mstatus lead;
	int j, i, moved[NPART] = { 0 }, before[NWORKERS], steps;
	double t0;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, NULL) >= 0);
	bootstrap_ex(ex, 3);
	start_training(&clu, &trainers, &a, NULL);
	wait_progress(&trainers, STEPS_BEFORE);
	snap_progress(before);
	/* 12 moves round robin: partition j mod 8 to the member after its owner */
	t0 = now_s();
	for (j = 0; j < MOVES; j++) {
		unsigned p = (unsigned)j % NPART;
		move(&clu, p, ex[p].owner % 3 + 1, ex);
		moved[p]++;
	}
	fprintf(stderr, "[%d moves in %.2f s] ", MOVES, now_s() - t0);
	check_progressed(before, "the moves");
	steps = finish_workers(&trainers, &a);
	check_trained(clu.servers, &a, steps);
	/* owners moved on, epochs raised once per move, on every member */
	for (j = 0; j < NPART; j++) {
		CU_ASSERT_EQUAL(ex[j].epoch, EPOCH0 + (unsigned)moved[j]);
		CU_ASSERT_EQUAL(ex[j].owner, (unsigned long long)((j % 3 + moved[j]) % 3) + 1);
	}
	CU_ASSERT(wait_agreement(&clu, 0, true, 10000, &lead) >= 0);
	CU_ASSERT_EQUAL(map_differs(&lead.map, ex), 0);
	for (i = 0; i < 3; i++) {
		struct mstatus ms;
		CU_ASSERT_EQUAL(member_status(&clu, i, &ms), 0);
		CU_ASSERT_EQUAL(map_differs(&ms.map, ex), 0);
	}
	check_status_map(&clu, ex, clu.servers);
	stop_all(&clu);
}

static void test_moves_async(void)
{
	run_moves(RPS_MODE_ASYNC, "moves-async");
}

static void test_moves_sync(void)
{
	run_moves(RPS_MODE_SYNC, "moves-sync");
}

static void test_moves_bounded(void)
{
	run_moves(RPS_MODE_BOUNDED, "moves-bounded");
}

/* ---- 3. add-server, remove-server ----------------------------------------------------- */

static void test_add_remove(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	struct train_arg a = { .name = "add-remove", .mode = RPS_MODE_SYNC, .check_every = 10 };
	struct part_ex ex[NPART];
	struct mstatus lead;
	char want[400], live[1024];
	int j, rc, moves, owned[5] = { 0 }, before[NWORKERS], steps;
	unsigned long long jv;
	uint32_t v;
	double t0;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, NULL) >= 0);
	bootstrap_ex(ex, 3);
	start_training(&clu, &trainers, &a, NULL);
	wait_progress(&trainers, STEPS_BEFORE);
	snap_progress(before);

	/* member 4 joins and takes its share */
	j = it_server_join(&clu, 4, &o);
	CU_ASSERT_EQUAL_FATAL(j, 3);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json --timeout 20 add-server 4 %s",
		      clu.uri[3]);
	if (rc)
		fprintf(stderr, "psctl add-server: exit %d: %s", rc, err);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(out, &jv, "id") && jv == 4 && json_str(out, want, sizeof(want), "uri") &&
		  !strcmp(want, clu.uri[3]) && json_u64(out, &jv, "log_index"));
	moves = apply_moves(out, ex);
	CU_ASSERT_EQUAL(moves, 2);	/* 3,3,2 -> 2,2,2,2 */
	CU_ASSERT(json_u64(out, &jv, "owned") && jv == 2 && json_u64(out, &jv, "partitions") && jv == 8);

	check_progressed(before, "add-server");

	/* member 2 leaves: its partitions go to the others, then it stops */
	snap_progress(before);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json --timeout 20 remove-server 2");
	if (rc)
		fprintf(stderr, "psctl remove-server: exit %d: %s", rc, err);
	CU_ASSERT_EQUAL(rc, 0);
	moves = apply_moves(out, ex);
	CU_ASSERT_EQUAL(moves, 2);
	CU_ASSERT(json_u64(out, &jv, "id") && jv == 2 && json_is(out, "false", "forced") &&
		  json_u64(out, &jv, "log_index"));
	check_progressed(before, "remove-server");
	t0 = now_s();
	CU_ASSERT_EQUAL(it_server_wait_exit(&clu, 1, 8000), 0);
	fprintf(stderr, "[removed server exited after %.2f s] ", now_s() - t0);

	steps = finish_workers(&trainers, &a);
	snprintf(live, sizeof(live), "%s,%s,%s", clu.uri[0], clu.uri[2], clu.uri[3]);
	check_trained(live, &a, steps);

	for (j = 0; j < NPART; j++) {
		CU_ASSERT(ex[j].owner == 1 || ex[j].owner == 3 || ex[j].owner == 4);
		owned[ex[j].owner < 5 ? ex[j].owner : 0]++;
	}
	CU_ASSERT(owned[1] >= 2 && owned[1] <= 3 && owned[3] >= 2 && owned[3] <= 3 && owned[4] >= 2 && owned[4] <= 3);
	/* every member left agrees; member 2 is out of the map and of Raft, 4 votes */
	{
		double until = now_s() + 10;
		int l;
		for (;;) {
			l = wait_agreement(&clu, (1u << 0) | (1u << 2) | (1u << 3), true, 10000, &lead);
			if (l < 0 || (lead.st.n_voters == 3 && lead.st.n_learners == 0) || now_s() > until)
				break;
			sleep_ms(50);
		}
		CU_ASSERT_FATAL(l >= 0);
	}
	CU_ASSERT_EQUAL(lead.map.nmembers, 3u);
	CU_ASSERT(rps__smap_member(&lead.map, 2) == NULL);
	CU_ASSERT(rps__smap_member(&lead.map, 4) != NULL);
	CU_ASSERT_EQUAL(lead.map.max_id, 4u);
	CU_ASSERT_EQUAL(lead.st.n_voters, 3u);
	CU_ASSERT_EQUAL(lead.st.n_learners, 0u);
	for (v = 0; v < lead.st.n_voters && v < 16; v++)
		CU_ASSERT(lead.st.voters[v] == 1 || lead.st.voters[v] == 3 || lead.st.voters[v] == 4);
	CU_ASSERT_EQUAL(map_differs(&lead.map, ex), 0);
	check_status_map(&clu, ex, live);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json status", live);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(members_with(out, "reachable", "true"), 3);
	CU_ASSERT_EQUAL(members_with_id(out, 2), 0);
	CU_ASSERT_EQUAL(members_with_id(out, 4), 2);	/* members[] and map.members[] */
	stop_all(&clu);
}

/*
 * A server joins through a follower: its --cluster names one
 * member that is not the leader, as rdmapsd(8) allows ("one is enough, in
 * any order").  Its id is the highest, so the leader never dials it: the
 * joiner must reach the leader itself, from what the follower tells it.
 * It joins (add-server completes, moving 2 partitions to it), every member
 * reports it reachable, and it serves its partitions: the workers' pushes
 * through the join, and a fresh pull, are exact.
 */
static void test_join_via_follower(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS };
	struct train_arg a = { .name = "join-follower", .mode = RPS_MODE_ASYNC, .check_every = 10 };
	struct part_ex ex[NPART];
	struct mstatus lead;
	char live[4 * 300 + 4];
	int l, f, j, rc, moves, steps, p, owned4 = 0, before[NWORKERS];
	unsigned long long jv;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, true, 10000, NULL);
	CU_ASSERT_FATAL(l >= 0);
	f = (l + 1) % 3;
	bootstrap_ex(ex, 3);
	start_training(&clu, &trainers, &a, NULL);
	wait_progress(&trainers, STEPS_BEFORE);
	snap_progress(before);

	o.cluster = clu.uri[f];
	j = it_server_join(&clu, 4, &o);
	CU_ASSERT_EQUAL_FATAL(j, 3);
	/* not added yet: asked alone, it says it has no map, and why */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s status", clu.uri[3]);
	CU_ASSERT(rc != 0 && one_line(err) && strstr(err, "no shard map yet") && strstr(err, "--join"));
	if (rc == 0 || !strstr(err, "no shard map yet"))
		fprintf(stderr, "psctl status of the joiner alone: exit %d: %s", rc, err);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json --timeout 20 add-server 4 %s",
		      clu.uri[3]);
	if (rc)
		fprintf(stderr, "psctl add-server (the joiner given only member %d, a follower): exit %d: %s", f + 1,
			rc, err);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	moves = apply_moves(out, ex);
	CU_ASSERT_EQUAL(moves, 2);	/* 3,3,2 -> 2,2,2,2 */
	CU_ASSERT(json_u64(out, &jv, "owned") && jv == 2);
	check_progressed(before, "a join through a follower");

	/* all four agree, member 4 among the voters or learners, reachable */
	CU_ASSERT_FATAL(wait_agreement(&clu, 0xf, true, 10000, &lead) >= 0);
	CU_ASSERT_EQUAL(lead.map.nmembers, 4u);
	CU_ASSERT(rps__smap_member(&lead.map, 4) != NULL);
	CU_ASSERT_EQUAL(lead.st.n_voters + lead.st.n_learners, 4u);
	CU_ASSERT_EQUAL(map_differs(&lead.map, ex), 0);
	for (p = 0; p < NPART; p++)
		owned4 += ex[p].owner == 4;
	CU_ASSERT_EQUAL(owned4, 2);
	snprintf(live, sizeof(live), "%s,%s,%s,%s", clu.uri[0], clu.uri[1], clu.uri[2], clu.uri[3]);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json status", live);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(members_with(out, "reachable", "true"), 4);
	check_status_map(&clu, ex, live);

	/* it serves what moved to it: exact, through the join and after */
	steps = finish_workers(&trainers, &a);
	check_trained(live, &a, steps);
	check_trained(clu.uri[3], &a, steps);	/* a client that knows only the joiner */
	stop_all(&clu);
}

/* ---- 4. the leader killed during a move, restarted ------------------------------------- */

enum kill_mode {
	KILL_RACE,	/* the kill follows the move as closely as a STATUS poll allows */
	KILL_STALLED,	/* the move surely under way: its destination is cut off till the kill */
	KILL_ABORTED,	/* ... and stays cut off until the move is aborted */
};

/*
 * The destination b of a move from a is cut off from its peers
 * (RPS_FAULT=isolate-signals) in the stalled modes, so the leader is surely
 * killed with the move under way: MOVE_BEGIN committed by the leader and a,
 * nothing installed.  KILL_STALLED lets b back right after the kill (a and
 * b then finish the move, or abort it); KILL_ABORTED restarts the leader
 * while b is still cut off, so a must abort the move (--move-timeout-ms
 * 5000: long enough that a slow fabric sees the move under way and kills
 * the leader before a could abort with it) with the restarted leader, and
 * b learns of it when it is back.
 */
static void run_leader_killed(enum kill_mode mode)
{
	static const char *const names[] = { "leader-killed", "leader-killed-stalled", "leader-killed-aborted" };
	bool stall = mode != KILL_RACE;
	struct it_server_opts o = { .extra_args = mode == KILL_ABORTED ? DURABLE_ARGS " --move-timeout-ms 5000" : DURABLE_ARGS,
				    .data_dir = 1, .env = stall ? "RPS_FAULT=isolate-signals" : NULL };
	struct train_arg a = { .name = names[mode], .mode = RPS_MODE_ASYNC, .check_every = 10 };
	struct part_ex ex[NPART];
	struct mstatus lead, ms;
	unsigned long long lid, aid, bid, e;
	int l, ia, ib, p, P = -1, rc, k, seen_moving = 0, steps;
	bool told_aborted = false;
	char errfile[600], list[700];
	pid_t ps;
	double t0;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, &lead);
	CU_ASSERT_FATAL(l >= 0);
	lid = (unsigned long long)l + 1;
	/* psctl names the same leader */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json status");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(out, &e, "leader") && e == lid);
	ia = (l + 1) % 3;
	ib = (l + 2) % 3;
	aid = (unsigned long long)ia + 1;
	bid = (unsigned long long)ib + 1;
	bootstrap_ex(ex, 3);
	/* the leader's partitions go first (a restarted server has lost its shards) */
	for (p = 0, k = 0; p < NPART; p++)
		if (ex[p].owner == lid)
			move(&clu, (unsigned)p, k++ % 2 ? bid : aid, ex);
	for (p = 0; p < NPART; p++)
		CU_ASSERT_NOT_EQUAL(ex[p].owner, lid);
	start_training(&clu, &trainers, &a, NULL);
	wait_progress(&trainers, STEPS_BEFORE);

	/* a move from a to b, and the leader dies under it */
	for (p = 0; p < NPART && P < 0; p++)
		if (ex[p].owner == aid)
			P = p;
	CU_ASSERT_FATAL(P >= 0);
	e = ex[P].epoch;
	if (stall)
		kill(clu.pid[ib], SIGUSR1);
	snprintf(errfile, sizeof(errfile), "%s/psctl-move.err", clu.dir);
	/* (with b cut off, psctl asks the other two: see test_psctl_past_isolated) */
	snprintf(list, sizeof(list), "%s,%s", clu.uri[l], clu.uri[ia]);
	ps = it_psctl_spawn(&clu, errfile, "-s %s --timeout 20 move %d %llu", stall ? list : clu.servers, P, bid);
	CU_ASSERT_FATAL(ps > 0);
	t0 = now_s();
	/* stalled: the move waits for b, so it shows up however slow the fabric
	 * (a loaded TCG VM took more than 5 s); racing: the kill follows at once */
	while (now_s() - t0 < (stall ? 30 : 2)) {
		if (!member_status(&clu, ia, &ms) && (ms.map.parts[P].moving_to == bid || ms.map.parts[P].epoch != e)) {
			seen_moving = ms.map.parts[P].moving_to == bid;
			break;
		}
	}
	it_server_kill(&clu, l);
	if (stall)
		CU_ASSERT(seen_moving);
	if (mode == KILL_STALLED)
		kill(clu.pid[ib], SIGUSR2);
	fprintf(stderr, "[leader %llu killed %s] ", lid, seen_moving ? "with the move under way" : "(move not seen under way)");
	rc = it_psctl_wait(ps, PSCTL_MS);
	if (stall)
		CU_ASSERT_EQUAL(rc, 1);	/* its leader died before the answer */
	CU_ASSERT(rc == 0 || rc == 1);
	{
		FILE *f = fopen(errfile, "r");
		size_t n = f ? fread(err, 1, sizeof(err) - 1, f) : 0;
		err[n] = '\0';
		if (f)
			fclose(f);
		/* a failure says so in one line: the move's outcome is unknown to
		 * it, or, when the leader gave the move up before it died (a
		 * loaded VM can take longer than --move-timeout-ms between BEGIN
		 * and the kill), the abort; the map must then show the abort */
		if (rc == 1) {
			told_aborted = strstr(err, "was aborted") != NULL;
			CU_ASSERT(one_line(err));
			/* (psctl's ADMIN lost with the leader, or asked again of
			 * a member that then waited in vain for a quorum) */
			CU_ASSERT(strstr(err, "outcome unknown") != NULL || strstr(err, "may still complete") != NULL ||
				  told_aborted);
			if (!strstr(err, "outcome unknown"))
				fprintf(stderr, "[psctl move said: %.*s] ", (int)strcspn(err, "\n"), err);
		} else {
			CU_ASSERT_STRING_EQUAL(err, "");
		}
	}

	if (mode == KILL_ABORTED) {
		/* a alone has no quorum: the leader comes back from its log, and
		 * with a aborts the move that b cannot take */
		CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, l), 0);
		CU_ASSERT_FATAL(wait_agreement(&clu, (1u << l) | (1u << ia), true, 20000, &lead) >= 0);
		CU_ASSERT_EQUAL(lead.map.parts[P].owner, aid);
		CU_ASSERT_EQUAL(lead.map.parts[P].epoch, e);
		kill(clu.pid[ib], SIGUSR2);
	} else {
		/* the others elect a leader and settle the move; then the old leader comes back */
		CU_ASSERT(wait_agreement(&clu, (1u << ia) | (1u << ib), true, 20000, NULL) >= 0);
		CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, l), 0);
	}
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, true, 20000, &lead) >= 0);
	/* committed or aborted, never both, the same everywhere */
	if (lead.map.parts[P].owner == bid) {
		CU_ASSERT_EQUAL(lead.map.parts[P].epoch, e + 1);
		ex[P].owner = bid;
		ex[P].epoch = e + 1;
	} else {
		CU_ASSERT_EQUAL(lead.map.parts[P].owner, aid);
		CU_ASSERT_EQUAL(lead.map.parts[P].epoch, e);
		CU_ASSERT_NOT_EQUAL(rc, 0);	/* psctl did not report a move that did not happen */
	}
	if (told_aborted)
		CU_ASSERT_EQUAL(lead.map.parts[P].owner, aid);
	fprintf(stderr, "[move %s, psctl exit %d] ", lead.map.parts[P].owner == bid ? "committed" : "aborted", rc);
	CU_ASSERT_EQUAL(map_differs(&lead.map, ex), 0);
	for (k = 0; k < 3; k++) {
		CU_ASSERT_EQUAL(member_status(&clu, k, &ms), 0);
		CU_ASSERT(same_map(&ms.map, &lead.map));
	}
	/* the restarted member takes part again: a move into it commits */
	move(&clu, (unsigned)P, lid, ex);
	steps = finish_workers(&trainers, &a);
	check_trained(clu.servers, &a, steps);
	CU_ASSERT(wait_agreement(&clu, 0, true, 10000, &lead) >= 0);
	CU_ASSERT_EQUAL(map_differs(&lead.map, ex), 0);
	check_status_map(&clu, ex, clu.servers);
	stop_all(&clu);
}

static void test_leader_killed_mid_move(void)
{
	run_leader_killed(KILL_RACE);
}

static void test_leader_killed_stalled_move(void)
{
	run_leader_killed(KILL_STALLED);
}

static void test_leader_killed_aborted_move(void)
{
	run_leader_killed(KILL_ABORTED);
}

/* ---- 5. a follower cut off from its peers ----------------------------------------------- */

/* Wait until server f, cut off, has given up on its leader (its election
 * timer fired): 0, or -1 after timeout_ms. */
static int wait_leaderless(struct it_cluster *cl, int f, int timeout_ms)
{
	struct mstatus fs;
	double until = now_s() + timeout_ms / 1000.0;

	while (now_s() < until) {
		if (!member_status(cl, f, &fs) && !fs.st.leader)
			return 0;
		sleep_ms(20);
	}
	return -1;
}

static void test_follower_isolated(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1, .env = "RPS_FAULT=isolate-signals" };
	struct train_arg a = { .name = "isolated", .mode = RPS_MODE_ASYNC, .check_every = 10 };
	struct part_ex ex[NPART];
	struct mstatus lead, fs;
	unsigned long long lid, fid, gid;
	int l, f, g, p, k, caught = 0, before[NWORKERS], steps;
	char majority[700];
	double t0;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, &lead);
	CU_ASSERT_FATAL(l >= 0);
	f = (l + 1) % 3;
	g = (l + 2) % 3;
	lid = (unsigned long long)l + 1;
	fid = (unsigned long long)f + 1;
	gid = (unsigned long long)g + 1;
	bootstrap_ex(ex, 3);
	start_training(&clu, &trainers, &a, NULL);
	wait_progress(&trainers, STEPS_BEFORE);

	snap_progress(before);
	kill(clu.pid[f], SIGUSR1);
	CU_ASSERT_EQUAL(wait_leaderless(&clu, f, 5000), 0);
	/* moves between the leader and the other follower commit with 2 of 3
	 * (psctl asks those two: see test_psctl_past_isolated for the third) */
	snprintf(majority, sizeof(majority), "%s,%s", clu.uri[l], clu.uri[g]);
	move_servers = majority;
	for (k = 0, p = 0; p < NPART; p++)
		if (ex[p].owner == lid || ex[p].owner == gid) {
			move(&clu, (unsigned)p, ex[p].owner == lid ? gid : lid, ex);
			k++;
		}
	move_servers = NULL;
	CU_ASSERT(k >= 5);
	check_progressed(before, "the isolation");
	/* the cut-off follower did not see them */
	l = wait_agreement(&clu, (1u << l) | (1u << g), true, 5000, &lead);
	CU_ASSERT_FATAL(l >= 0);
	CU_ASSERT_EQUAL(map_differs(&lead.map, ex), 0);
	CU_ASSERT_EQUAL(member_status(&clu, f, &fs), 0);
	CU_ASSERT(fs.st.applied < lead.st.applied);
	CU_ASSERT(!same_map(&fs.map, &lead.map));

	kill(clu.pid[f], SIGUSR2);
	t0 = now_s();
	while (now_s() - t0 < 5 && !caught) {
		int li = wait_agreement(&clu, 0, false, 5000, &lead);
		if (li >= 0 && !member_status(&clu, f, &fs) && fs.st.applied >= lead.st.applied &&
		    same_map(&fs.map, &lead.map))
			caught = 1;
		else
			sleep_ms(20);
	}
	fprintf(stderr, "[caught up in %.2f s] ", now_s() - t0);
	CU_ASSERT(caught);
	CU_ASSERT_EQUAL(map_differs(&fs.map, ex), 0);
	/* and it takes part in moves again */
	for (p = 0; p < NPART; p++)
		if (ex[p].owner == fid) {
			move(&clu, (unsigned)p, gid, ex);
			break;
		}
	steps = finish_workers(&trainers, &a);
	check_trained(clu.servers, &a, steps);
	CU_ASSERT(wait_agreement(&clu, 0, true, 10000, &lead) >= 0);
	CU_ASSERT_EQUAL(map_differs(&lead.map, ex), 0);
	check_status_map(&clu, ex, clu.servers);
	stop_all(&clu);
}

/* psctl(8): "Any member will do; the others and the leader are found from its
 * answer."  The first server of the list answers but is cut off from the
 * group and knows no leader: psctl must still find the leader the other two
 * elected, for status and for a move. */
static void test_psctl_past_isolated(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1, .env = "RPS_FAULT=isolate-signals" };
	struct part_ex ex[NPART];
	struct mstatus lead;
	unsigned long long v;
	int l, f, g, p, rc;
	char list[1000];

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, &lead);
	CU_ASSERT_FATAL(l >= 0);
	f = (l + 1) % 3;
	g = (l + 2) % 3;
	/* the cut-off server first */
	snprintf(list, sizeof(list), "%s,%s,%s", clu.uri[f], clu.uri[l], clu.uri[g]);
	bootstrap_ex(ex, 3);
	kill(clu.pid[f], SIGUSR1);
	CU_ASSERT_EQUAL(wait_leaderless(&clu, f, 5000), 0);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json status", clu.uri[f]);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(out, &v, "leader") && v == (unsigned long long)l + 1);
	/* a partition the leader owns, to the third member */
	for (p = 0; p < NPART; p++)
		if (ex[p].owner == (unsigned long long)l + 1)
			break;
	CU_ASSERT_FATAL(p < NPART);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --timeout 5 move %d %d", list, p, g + 1);
	if (rc)
		fprintf(stderr, "psctl -s %s --timeout 5 move %d %d: exit %d: %s", list, p, g + 1, rc, err);
	CU_ASSERT_EQUAL(rc, 0);
	if (!rc) {
		ex[p].owner = (unsigned long long)g + 1;
		ex[p].epoch++;
	}
	check_status_map(&clu, ex, list);
	kill(clu.pid[f], SIGUSR2);
	stop_all(&clu);
}

/* ---- 6. transfer-leader ----------------------------------------------------------------- */

static void test_transfer_leader(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	struct mstatus lead;
	unsigned long long to, v = 0, t1 = 0, t2 = 0, was = 0;
	int l, rc;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, &lead);
	CU_ASSERT_FATAL(l >= 0);
	to = (unsigned long long)(l + 1) % 3 + 1;
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json --timeout 20 transfer-leader %llu", to);
	if (rc)
		fprintf(stderr, "psctl transfer-leader: exit %d: %s", rc, err);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(out, &v, "leader") && json_u64(out, &t1, "term") && json_u64(out, &was, "was"));
	CU_ASSERT_EQUAL(v, to);
	CU_ASSERT_EQUAL(was, (unsigned long long)l + 1);
	CU_ASSERT(t1 > lead.st.term);
	l = wait_agreement(&clu, 0, false, 5000, &lead);
	CU_ASSERT_EQUAL(l, idx_of(to));
	CU_ASSERT_EQUAL(lead.st.term, t1);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json status");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(out, &v, "leader") && v == to);
	CU_ASSERT_EQUAL(members_with(out, "role", "\"leader\""), 1);
	/* again: nothing to do (it already leads: was == leader) */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json transfer-leader %llu", to);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(out, &v, "leader") && v == to && json_u64(out, &t2, "term") && t2 == t1 &&
		  json_u64(out, &was, "was") && was == to);
	/* without an id: someone else */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json --timeout 20 transfer-leader");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(out, &v, "leader") && json_u64(out, &t1, "term") && json_u64(out, &was, "was") && v != to &&
		  was == to);
	l = wait_agreement(&clu, 0, false, 5000, &lead);
	CU_ASSERT_EQUAL(l, idx_of(v));
	/* not a voter */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "transfer-leader 42");
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(strstr(err, "member 42") != NULL);
	stop_all(&clu);
}

/* ---- 7. bad input ------------------------------------------------------------------------- */

/* A raw ADMIN connection (in a child): a malformed message gets it dropped;
 * a well-formed one with a partition out of range is answered -EINVAL. */
struct raw_arg {
	const char *scheme, *addr;
	uint16_t port;
};

struct raw_peer {
	struct rps__fabric *fab;
	struct rps__cq *cq;
	struct rps__ep *ep;
	struct rps__mr *mr;
	char *buf;
	char *last;		/* the buffer raw_next's message is in */
};

#define RAW_RECV 4
#define RAW_BUF ((RAW_RECV + 1) * RPS__BIG_MSG_MAX)

static int raw_send(struct raw_peer *p, const void *msg, size_t len);
static int raw_next(struct raw_peer *p, struct rps__msg_hdr *hdr);

/* With the harness's key (RDMAPS_KEY_FILE): the admin's AUTH, as psctl
 * sends it, and the server's proof checked. */
static int raw_auth(struct raw_peer *p, const struct rps__conn_priv *req, const void *reply, size_t reply_len,
		    const struct rps__key *k)
{
	struct rps__conn_priv rep;
	struct rps__auth a;
	struct rps__auth_rep ar;
	struct rps__auth_transcript t;
	struct rps__key proven;
	struct rps__msg_hdr h;
	char msg[256];
	size_t len;
	int ret, i;

	memset(&rep, 0, sizeof(rep));
	memcpy(&rep, reply, RPS__MIN(reply_len, sizeof(rep)));
	ret = rps__auth_connect(k, NULL, RPS__KEY_ADMIN, "", req, &rep, rps__ep_local(p->ep), rps__ep_peer(p->ep),
				"raw", &a, &t, &proven);
	if (ret)
		return ret;
	len = rps__msg_build(msg, RPS__MSG_AUTH, 1, 0, &a, sizeof(a));
	if (raw_send(p, msg, len) || raw_next(p, &h) || h.type != RPS__MSG_AUTH_REP)
		return -EIO;
	memcpy(&ar, p->last + sizeof(h), sizeof(ar));
	i = (int)((p->last - p->buf) / RPS__BIG_MSG_MAX) - 1;
	{	/* (raw_next leaves it to its caller to post the buffer again) */
		struct rps__sge sge = { .addr = p->last, .len = RPS__BIG_MSG_MAX, .mr = p->mr };
		rps__post_recv(p->ep, &sge, (uint64_t)i);
	}
	return rps__auth_connect_check(&proven, &t, &h, &ar, "raw");
}

static int raw_connect(struct raw_peer *p, const struct raw_arg *a)
{
	struct rps__conn_priv priv = { .magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .role = RPS__ROLE_ADMIN };
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t reply_len = RPS__PRIVDATA_MAX;
	const char *kp = rps__key_path(NULL);
	struct rps__key k;
	bool keyed = kp && !rps__key_load(kp, &k);
	struct rps__fabric_attr fa = { .kind = strcmp(a->scheme, "verbs") ? RPS__KIND_TCP : RPS__KIND_VERBS,
				       .host = a->addr };
	struct rps__ep_attr ea = { .sq_depth = 8, .rq_depth = RAW_RECV };
	int ret, i;

	memset(p, 0, sizeof(*p));
	p->buf = aligned_alloc(4096, RAW_BUF);
	memset(p->buf, 0, RAW_BUF);
	if ((ret = rps__fabric_open(&fa, &p->fab)) || (ret = rps__cq_create(p->fab, 64, &p->cq)) ||
	    (ret = rps__mr_reg(p->fab, p->buf, RAW_BUF, RPS__ACCESS_LOCAL, &p->mr)))
		return ret;
	if (keyed)
		rps__auth_priv_init(&priv, &k);
	ret = rps__connect(p->fab, a->addr, a->port, p->cq, &ea, &priv, sizeof(priv), 5000, reply, &reply_len,
			   &p->ep);
	if (ret)
		return ret;
	for (i = 0; i < RAW_RECV; i++) {
		struct rps__sge sge = { .addr = p->buf + (size_t)(i + 1) * RPS__BIG_MSG_MAX, .len = RPS__BIG_MSG_MAX,
					.mr = p->mr };
		if ((ret = rps__post_recv(p->ep, &sge, (uint64_t)i)))
			return ret;
	}
	if (keyed) {
		ret = raw_auth(p, &priv, reply, reply_len, &k);
		rps__key_clear(&k);
	}
	return ret;
}

static void raw_close(struct raw_peer *p)
{
	if (p->ep)
		rps__ep_close(p->ep);
	if (p->mr)
		rps__mr_dereg(p->mr);
	if (p->cq)
		rps__cq_destroy(p->cq);
	if (p->fab)
		rps__fabric_close(p->fab);
	free(p->buf);
}

static int raw_send(struct raw_peer *p, const void *msg, size_t len)
{
	struct rps__wr wr = { .op = RPS__OP_SEND, .flags = RPS__WR_SIGNALED,
			      .sge = { .addr = p->buf, .len = (uint32_t)len, .mr = p->mr } };

	memcpy(p->buf, msg, len);
	return rps__post(p->ep, &wr, 1);
}

/* Completions until a receive (its status 0 and *hdr) or a flush (1); -1 after 5 s. */
static int raw_next(struct raw_peer *p, struct rps__msg_hdr *hdr)
{
	struct rps__wc wc;
	int i;

	for (i = 0; i < 500; i++) {
		if (rps__cq_wait(p->cq, &wc, 1, 10) <= 0)
			continue;
		if (wc.status == RPS__WC_FLUSH_ERR || wc.status == RPS__WC_RETRY_EXC_ERR)
			return 1;
		if (wc.status == RPS__WC_SUCCESS && wc.opcode == RPS__WC_RECV) {
			p->last = p->buf + (size_t)(wc.wr_id + 1) * RPS__BIG_MSG_MAX;
			memcpy(hdr, p->last, sizeof(*hdr));
			return 0;
		}
	}
	return -1;
}

static int raw_admin_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct raw_arg *a = arg;
	static char msg[RPS__BIG_MSG_MAX];
	struct rps__admin ad;
	struct rps__msg_hdr h;
	struct raw_peer p;
	int res[3] = { -100, -100, -100 };
	size_t len;

	(void)rank;
	(void)nworkers;
	(void)servers;
	/* the uri not NUL-terminated: dropped */
	if (raw_connect(&p, a) == 0) {
		memset(&ad, 0, sizeof(ad));
		ad.op = RPS__ADMIN_ADD_SERVER;
		ad.id = 9;
		memset(ad.uri, 'x', sizeof(ad.uri));
		len = rps__msg_build(msg, RPS__MSG_ADMIN, 1, 0, &ad, sizeof(ad));
		if (raw_send(&p, msg, len) == 0)
			res[0] = raw_next(&p, &h);	/* 1: flushed */
	}
	raw_close(&p);
	/* well-formed, a partition that does not exist: a clear refusal */
	if (raw_connect(&p, a) == 0) {
		memset(&ad, 0, sizeof(ad));
		ad.op = RPS__ADMIN_MOVE;
		ad.part = 200;
		ad.id = 1;
		len = rps__msg_build(msg, RPS__MSG_ADMIN, 2, 0, &ad, sizeof(ad));
		if (raw_send(&p, msg, len) == 0 && raw_next(&p, &h) == 0)
			res[1] = h.type == RPS__MSG_ADMIN_REP ? h.status : -200;
		/* an unknown operation */
		memset(&ad, 0, sizeof(ad));
		ad.op = 77;
		len = rps__msg_build(msg, RPS__MSG_ADMIN, 3, 0, &ad, sizeof(ad));
		if (raw_send(&p, msg, len) == 0 && raw_next(&p, &h) == 0)
			res[2] = h.type == RPS__MSG_ADMIN_REP ? h.status : -200;
	}
	raw_close(&p);
	it_write_all(out_fd, res, sizeof(res));
	return 0;
}

static void test_bad_input(void)
{
	static const char *const usage[] = {
		"",			/* no command */
		"frobnicate",
		"move 1",
		"move x 1",
		"move 0 0",
		"move 300 1",
		"status extra",
		"add-server 5 udp://1.2.3.4:5",
		"--timeout 0 status",
		"--bogus status",
		"remove-server",
		"transfer-leader 1 2",
	};
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	struct part_ex ex[NPART];
	struct raw_arg ra;
	int l, rc, res[3] = { 0, 0, 0 };
	size_t i;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, NULL);
	CU_ASSERT_FATAL(l >= 0);
	bootstrap_ex(ex, 3);

	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "move 99 1");
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(one_line(err));
	CU_ASSERT(strstr(err, "partition 99") != NULL);
	CU_ASSERT_STRING_EQUAL(out, "");
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "move 0 42");
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(one_line(err));
	CU_ASSERT(strstr(err, "member 42") != NULL);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "remove-server 42");
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(one_line(err));
	/* nobody there */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s://%s:1 status", clu.scheme, clu.addr);
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(one_line(err));
	CU_ASSERT(strstr(err, ":1") != NULL);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s://%s:1 --timeout 2 move 0 2", clu.scheme,
		      clu.addr);
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(one_line(err));
	/* usage errors */
	for (i = 0; i < sizeof(usage) / sizeof(usage[0]); i++) {
		rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "%s", usage[i]);
		if (rc != 2)
			fprintf(stderr, "psctl %s: exit %d, expected 2\n", usage[i], rc);
		CU_ASSERT_EQUAL(rc, 2);
		CU_ASSERT(!strncmp(err, "psctl: ", 7));
		CU_ASSERT(strstr(err, "usage: psctl") != NULL);
		CU_ASSERT_STRING_EQUAL(out, "");
	}
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--help");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(strstr(out, "transfer-leader") != NULL);

	/* a raw ADMIN connection to the leader (again if leadership moved meanwhile) */
	for (i = 0; i < 3; i++) {
		struct it_workers w;
		l = wait_agreement(&clu, 0, false, 10000, NULL);
		CU_ASSERT_FATAL(l >= 0);
		ra = (struct raw_arg){ .scheme = clu.scheme, .addr = clu.addr, .port = clu.port[l] };
		CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, raw_admin_worker, NULL, &ra, -1, NULL), 0);
		CU_ASSERT_EQUAL(it_worker_read(&w, 0, res, sizeof(res)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
		if (res[1] != -EPERM)
			break;
	}
	CU_ASSERT_EQUAL(res[0], 1);		/* dropped */
	CU_ASSERT_EQUAL(res[1], -EINVAL);	/* no such partition */
	CU_ASSERT_EQUAL(res[2], -EINVAL);	/* no such operation */
	/* ... and the server keeps serving */
	CU_ASSERT(it_server_alive(&clu, l));
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s status", clu.uri[l]);
	CU_ASSERT_EQUAL(rc, 0);
	move(&clu, 0, 2, ex);
	CU_ASSERT(wait_agreement(&clu, 0, true, 5000, NULL) >= 0);
	check_status_map(&clu, ex, clu.servers);
	stop_all(&clu);
}

/* ---- a member that cannot be reached ------------------------------------------------ */

/* ADD_SERVER with an address that is not one: refused by the leader with a
 * line, never put in the map.  res: status, then the reply's text. */
struct bad_uri_res {
	int status;
	char msg[256];
};

static int raw_bad_uri_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct raw_arg *a = arg;
	static char msg[RPS__BIG_MSG_MAX];
	struct bad_uri_res res = { .status = -100 };
	struct rps__admin ad;
	struct rps__msg_hdr h;
	struct raw_peer p;
	size_t len;

	(void)rank;
	(void)nworkers;
	(void)servers;
	if (raw_connect(&p, a) == 0) {
		memset(&ad, 0, sizeof(ad));
		ad.op = RPS__ADMIN_ADD_SERVER;
		ad.id = 9;
		ad.timeout_ms = 2000;
		memcpy(ad.uri, "\x01\x02garbage", 10);
		len = rps__msg_build(msg, RPS__MSG_ADMIN, 1, 0, &ad, sizeof(ad));
		if (raw_send(&p, msg, len) == 0 && raw_next(&p, &h) == 0 && h.type == RPS__MSG_ADMIN_REP) {
			struct rps__admin_rep rep;
			memcpy(&rep, p.last + sizeof(h), sizeof(rep));
			res.status = h.status;
			memcpy(res.msg, rep.msg, sizeof(res.msg));
			res.msg[sizeof(res.msg) - 1] = '\0';
		}
	}
	raw_close(&p);
	it_write_all(out_fd, &res, sizeof(res));
	return 0;
}

static void test_add_server_garbage_uri_refused(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS };
	struct bad_uri_res res = { 0 };
	struct mstatus lead;
	struct raw_arg ra;
	int i, l;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	for (i = 0; i < 3; i++) {	/* again if leadership moved meanwhile */
		struct it_workers w;
		l = wait_agreement(&clu, 0, false, 10000, NULL);
		CU_ASSERT_FATAL(l >= 0);
		ra = (struct raw_arg){ .scheme = clu.scheme, .addr = clu.addr, .port = clu.port[l] };
		CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, raw_bad_uri_worker, NULL, &ra, -1, NULL), 0);
		CU_ASSERT_EQUAL(it_worker_read(&w, 0, &res, sizeof(res)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
		if (res.status != -EPERM)
			break;
	}
	if (res.status != -EINVAL)
		fprintf(stderr, "ADD_SERVER with a garbage uri: status %d: %s\n", res.status, res.msg);
	CU_ASSERT_EQUAL(res.status, -EINVAL);
	CU_ASSERT(strstr(res.msg, "bad address") != NULL);
	CU_ASSERT(strstr(res.msg, "\\x01\\x02garbage") != NULL);	/* escaped */
	/* not a member */
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	CU_ASSERT_EQUAL(lead.map.nmembers, 3u);
	stop_all(&clu);
}

/* The worker in a cluster whose member 3 is dead and member 4 was never
 * there: connect, push to a tensor on healthy partitions, then to one with
 * a shard on member 3.  res: connect, healthy push, dead push, its text. */
struct dead_member_res {
	int connect, healthy, dead;
	char msg[512];
};

static uint32_t name_part(const char *name)
{
	struct rps__layout l;

	rps__layout_init(&l, name, 16, 4096 / 4, NPART);
	return rps__shard_server(&l, 0);
}

static int dead_member_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	struct dead_member_res res = { -100, -100, -100, "" };
	char healthy[32], dead[32];
	struct rps_client_opts co;
	struct rps_tensor_opts to;
	rps_client_t *cl = NULL;
	rps_tensor_t *t;
	float g[16];
	int k;

	(void)rank;
	(void)nworkers;
	(void)arg;
	/* one shard each: in a partition of member 1 or 2, and in one of member 3 */
	for (k = 0; name_part((snprintf(healthy, sizeof(healthy), "healthy-%d", k), healthy)) % 3 == 2; k++)
		;
	for (k = 0; name_part((snprintf(dead, sizeof(dead), "on-dead-%d", k), dead)) % 3 != 2; k++)
		;
	for (k = 0; k < 16; k++)
		g[k] = 1.0f;
	rps_client_opts_init(&co);
	co.servers = servers;
	co.timeout_ms = 5000;
	res.connect = rps_client_connect(&co, &cl);
	if (res.connect) {
		snprintf(res.msg, sizeof(res.msg), "%s", rps_last_error());
		goto out;
	}
	rps_tensor_opts_init(&to);
	to.count = 16;
	to.mode = RPS_MODE_ASYNC;
	res.healthy = rps_tensor_create(cl, healthy, &to, &t);
	if (!res.healthy) {
		res.healthy = rps_push(t, g, sizeof(g));
		rps_tensor_close(t);
	}
	res.dead = rps_tensor_create(cl, dead, &to, &t);
	if (!res.dead) {
		res.dead = rps_push(t, g, sizeof(g));
		rps_tensor_close(t);
	}
	snprintf(res.msg, sizeof(res.msg), "%s", rps_last_error());
	rps_client_close(cl);
out:
	it_write_all(out_fd, &res, sizeof(res));
	return 0;
}

static void test_dead_member_does_not_break_connect(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS };
	struct dead_member_res res;
	struct mstatus lead;
	struct it_workers w;
	int rc;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, NULL) >= 0);
	/* member 4, the highest id, at an address where nobody listens */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--timeout 5 add-server 4 %s://%s:1",
		      clu.scheme, clu.addr);
	(void)rc;	/* it never catches up: psctl may give up waiting for it */
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	CU_ASSERT_EQUAL_FATAL(lead.map.nmembers, 4u);
	/* and member 3 dead: its partitions (2 and 5) have nobody */
	it_server_kill(&clu, 2);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, dead_member_worker, clu.servers, NULL, -1, NULL), 0);
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &res, sizeof(res)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	if (res.connect || res.healthy || res.dead != -ECONNREFUSED)
		fprintf(stderr, "dead member: connect %d, healthy push %d, push to the dead %d: %s\n", res.connect,
			res.healthy, res.dead, res.msg);
	CU_ASSERT_EQUAL(res.connect, 0);
	CU_ASSERT_EQUAL(res.healthy, 0);
	CU_ASSERT_EQUAL(res.dead, -ECONNREFUSED);
	CU_ASSERT(strstr(res.msg, clu.uri[2]) != NULL);	/* named by its address */
	stop_all(&clu);
}

/* A test that fails must fail, not hang: past this, kill everything we
 * started and fail. */
#define TEST_WATCHDOG_S 60	/* seconds per test; RPS_IT_WATCHDOG_S overrides it */

static double t_test;

static void test_setup(void)
{
	t_test = now_s();
	watchdog_arm();
}

static void test_teardown(void)
{
	int i;

	watchdog_disarm();
	/* what a failed fatal assertion left running */
	if (trainers_up) {
		for (i = 0; i < trainers.n; i++)
			if (trainers.pid[i] > 0) {
				kill(trainers.pid[i], SIGKILL);
				it_worker_wait(&trainers, i);
			}
		trainers_up = false;
	}
	if (clu_up) {
		for (i = 0; i < clu.nservers; i++)
			if (clu.pid[i] > 0)
				kill(clu.pid[i], SIGKILL);
		it_cluster_stop(&clu);
		clu_up = false;
	}
	fprintf(stderr, "[%.2f s] ", now_s() - t_test);
}


/* ---- checkpoint and restore ---------------------------------------------------- */

static int copy_dir(const char *from, const char *to)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
	return system(cmd);
}

/* Flip one byte in the middle (or cut the end off) of the first member file. */
static int damage(const char *dir, bool truncate_it)
{
	char cmd[1024];

	if (truncate_it)
		snprintf(cmd, sizeof(cmd), "f=$(ls '%s'/member-*.rpsck | head -1) && truncate -s -7 \"$f\"", dir);
	else
		snprintf(cmd, sizeof(cmd),
			 "f=$(ls '%s'/member-*.rpsck | head -1) && n=$(stat -c %%s \"$f\") && "
			 "printf '\\377' | dd of=\"$f\" bs=1 seek=$((n / 2)) conv=notrunc status=none", dir);
	return system(cmd);
}

/* A cluster of n servers, the checkpoint ck restored into it, the tensor
 * pulled: every element want, version want_version. */
static void restore_into(int n, const char *ck, const char *name, float want, uint64_t want_version)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	char pout[4096] = "", perr[2048] = "", got[64] = "";
	unsigned long long installed;
	struct mstatus lead;
	int rc;

	CU_ASSERT_EQUAL_FATAL(start_n(&clu, n, &o), 0);
	clu_up = true;
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "--json restore %s", ck);
	if (rc)
		fprintf(stderr, "psctl restore: %s%s", pout, perr);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_u64(pout, &installed, "shards"));
	CU_ASSERT(json_str(pout, got, sizeof(got), "name") && !strcmp(got, ck));
	check_tensor(clu.servers, name, want, want_version);
	stop_all(&clu);
}

static void test_checkpoint_restore(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	struct train_arg a = { .name = "ckpt-sync", .mode = RPS_MODE_SYNC, .check_every = 10 };
	/* the checkpoint "sync", under every server's --checkpoint-dir; its
	 * files are in dir here (the harness gives every server the same) */
	char pout[4096] = "", perr[2048] = "", dir[512], bad[600], name[64];
	unsigned long long v;
	int k;
	struct mstatus lead;
	unsigned long long cut = 0;
	int rc, steps;

	snprintf(dir, sizeof(dir), "%s/sync", it_ckpt_dir());
	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	start_training(&clu, &trainers, &a, NULL);
	wait_progress(&trainers, 30);
	/* the checkpoint, taken while the workers train */
	rc = it_psctl(&clu, 60000, pout, sizeof(pout), perr, sizeof(perr), "--json checkpoint sync");
	if (rc)
		fprintf(stderr, "psctl checkpoint: %s%s", pout, perr);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT(json_str(pout, name, sizeof(name), "name") && !strcmp(name, "sync"));
	for (k = 0; k < json_len(pout, "tensors"); k++)
		if (json_str(pout, name, sizeof(name), "tensors[%d].name", k) && !strcmp(name, "ckpt-sync"))
			break;
	CU_ASSERT_FATAL(json_u64(pout, &cut, "tensors[%d].step", k));	/* ckpt-sync is listed, with its step */
	CU_ASSERT(json_u64(pout, &v, "longest_pause_ns"));
	for (k = 0; k < json_len(pout, "members"); k++)
		if (json_u64(pout, &v, "members[%d].id", k) && v == 3)
			break;
	CU_ASSERT(k < json_len(pout, "members"));	/* member 3 took part */
	wait_progress(&trainers, (int)cut + 20);	/* training went on */
	steps = finish_workers(&trainers, &a);
	check_trained(clu.servers, &a, steps);
	CU_ASSERT(cut >= 30 && cut < (unsigned long long)steps);
	stop_all(&clu);
	fprintf(stderr, "[cut at step %llu] ", cut);

	/* the same step on every shard, onto fewer and onto more servers */
	restore_into(2, "sync", a.name, (float)cut * step_sum(&a), cut);
	restore_into(4, "sync", a.name, (float)cut * step_sum(&a), cut);
	/* and by rdmapsd --restore at start-up: the operator's command line
	 * gives a path */
	{
		char args[1024];
		struct it_server_opts ro = { .extra_args = args, .data_dir = 1 };
		snprintf(args, sizeof(args), "%s --restore %s", FAST_ARGS, dir);
		CU_ASSERT_EQUAL_FATAL(start_n(&clu, 3, &ro), 0);
		clu_up = true;
		CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
		check_tensor(clu.servers, a.name, (float)cut * step_sum(&a), cut);
		stop_all(&clu);
	}

	/* a flipped byte and a cut-off end are refused, with the file named */
	snprintf(bad, sizeof(bad), "%s.bad", dir);	/* the checkpoint sync.bad */
	CU_ASSERT_EQUAL_FATAL(copy_dir(dir, bad), 0);
	CU_ASSERT_EQUAL_FATAL(damage(bad, false), 0);
	CU_ASSERT_EQUAL_FATAL(start_n(&clu, 2, &o), 0);
	clu_up = true;
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "restore sync.bad");
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(strstr(perr, ".rpsck") != NULL);
	CU_ASSERT(one_line(perr));
	CU_ASSERT_EQUAL_FATAL(copy_dir(dir, bad), 0);
	CU_ASSERT_EQUAL_FATAL(damage(bad, true), 0);
	rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "restore sync.bad");
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(strstr(perr, ".rpsck") != NULL);
	stop_all(&clu);
	/* servers with another shard size cannot take it: they say which */
	{
		struct it_server_opts so = { .extra_args = FAST_ARGS " --shard-size 8192", .data_dir = 1 };
		CU_ASSERT_EQUAL_FATAL(start_n(&clu, 2, &so), 0);
		clu_up = true;
		CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
		rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "restore sync");
		CU_ASSERT_EQUAL(rc, 1);
		CU_ASSERT(strstr(perr, "--shard-size") != NULL);
		CU_ASSERT(one_line(perr));
		stop_all(&clu);
	}
	{
		char cmd[1300];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", dir, bad);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}
}


/* One worker, async Adam: steps [from, to) of a fixed gradient sequence,
 * then the pulled parameters.  Deterministic (one pusher), so two clusters
 * that start from the same state end bit-identical. */
struct adam_arg {
	const char *name;
	int from, to;
};

static int adam_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct adam_arg *a = arg;
	float *g = malloc(COUNT * sizeof(float)), *p = malloc(COUNT * sizeof(float));
	struct rps_client_opts co;
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	uint64_t version = 0, i;
	int s, ret;

	(void)rank;
	(void)nworkers;
	rps_client_opts_init(&co);
	co.servers = servers;
	co.timeout_ms = 20000;
	if ((ret = rps_client_connect(&co, &cl)))
		return fail("connect", ret);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_ADAM;
	o.lr = 0.01f;
	if ((ret = rps_tensor_create(cl, a->name, &o, &t)))
		return fail("create", ret);
	for (s = a->from; s < a->to; s++) {
		for (i = 0; i < COUNT; i++)
			g[i] = (float)((int)((i * 2654435761u + (uint64_t)s * 40503u) % 2001u) - 1000) / 1000.0f;
		if ((ret = rps_push(t, g, COUNT * sizeof(float))))
			return fail("push", ret);
	}
	if ((ret = rps_pull(t, p, COUNT * sizeof(float), &version)))
		return fail("pull", ret);
	it_write_all(out_fd, &version, sizeof(version));
	it_write_all(out_fd, p, COUNT * sizeof(float));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	free(p);
	return 0;
}

static void adam_run(const char *servers, int from, int to, uint64_t *version, float *p)
{
	struct adam_arg a = { .name = "ckpt-adam", .from = from, .to = to };
	struct it_workers w;
	int ok;

	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, adam_worker, servers, &a, -1, NULL), 0);
	ok = it_worker_read(&w, 0, version, sizeof(*version)) == 0 &&
	     it_worker_read(&w, 0, p, COUNT * sizeof(float)) == 0;
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	CU_ASSERT_FATAL(ok);
}

/* Parameters, versions and Adam's moments come back exactly: ten more steps
 * on the restored cluster give bit-identical parameters to ten more steps on
 * the original one. */
static void test_checkpoint_adam_exact(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	float *want = malloc(COUNT * sizeof(float)), *got = malloc(COUNT * sizeof(float));
	char pout[4096] = "", perr[2048] = "", cmd[600];
	uint64_t v1 = 0, v2 = 0;
	struct mstatus lead;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(want);
	CU_ASSERT_PTR_NOT_NULL_FATAL(got);
	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	adam_run(clu.servers, 0, 20, &v1, want);
	CU_ASSERT_EQUAL(v1, 20u);
	rc = it_psctl(&clu, 60000, pout, sizeof(pout), perr, sizeof(perr), "checkpoint runs/adam/step20");
	if (rc)
		fprintf(stderr, "psctl checkpoint: %s%s", pout, perr);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	adam_run(clu.servers, 20, 30, &v1, want);
	CU_ASSERT_EQUAL(v1, 30u);
	stop_all(&clu);
	/* onto 2 servers: the same ten steps from the checkpoint */
	CU_ASSERT_EQUAL_FATAL(start_n(&clu, 2, &o), 0);
	clu_up = true;
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "restore runs/adam/step20");
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	adam_run(clu.servers, 20, 30, &v2, got);
	CU_ASSERT_EQUAL(v2, 30u);
	CU_ASSERT_EQUAL(memcmp(want, got, COUNT * sizeof(float)), 0);
	stop_all(&clu);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s/runs'", it_ckpt_dir());
	CU_ASSERT_EQUAL(system(cmd), 0);
	free(want);
	free(got);
}

/* ---- checkpoints stay under --checkpoint-dir ------------------------------------- */

/* One CKPT request (op, name) to a server, as a psctl would send it, in a
 * child: the status and the reply's message line. */
struct ckpt_raw_arg {
	const char *uri;
	uint32_t op;
	const char *name;
};

static int ckpt_raw_child(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct ckpt_raw_arg *a = arg;
	static char buf[RPS__BIG_MSG_MAX];
	struct rps__ckpt_req req;
	struct rps__ctl *ctl = NULL;
	char msg[256] = "";
	struct rps__uri u;
	size_t len = 0;
	int32_t status = 0;
	int ret;

	(void)rank;
	(void)nworkers;
	(void)servers;
	memset(&req, 0, sizeof(req));
	req.op = a->op;
	req.timeout_ms = 1000;
	snprintf(req.name, sizeof(req.name), "%s", a->name);
	ret = rps__uri_parse(a->uri, &u);
	if (!ret)
		ret = rps__ctl_open(&u, 2000, &ctl);
	if (!ret)
		ret = rps__ctl_call(ctl, RPS__MSG_CKPT, &req, sizeof(req), buf, sizeof(buf), &len, &status, 5000);
	if (!ret) {
		ret = status;
		if (len >= sizeof(struct rps__ckpt_rep))
			memcpy(msg, ((struct rps__ckpt_rep *)(void *)buf)->msg, sizeof(msg) - 1);
	}
	rps__ctl_close(ctl);
	it_write_all(out_fd, &ret, sizeof(ret));
	it_write_all(out_fd, msg, sizeof(msg));
	return 0;
}

/* What server i answers op of name: its status, the message in msg. */
static int ckpt_raw(struct it_cluster *cl, int i, uint32_t op, const char *name, char *msg)
{
	struct ckpt_raw_arg a = { .uri = cl->uri[i], .op = op, .name = name };
	struct it_workers w;
	int ret = -EIO;

	msg[0] = '\0';
	if (it_workers_start(&w, 1, ckpt_raw_child, NULL, &a, -1, NULL))
		return -ECHILD;
	if (it_worker_read(&w, 0, &ret, sizeof(ret)) || it_worker_read(&w, 0, msg, 256))
		ret = -EIO;
	return it_worker_wait(&w, 0) ? -ECHILD : ret;
}

/* Entries in a directory (not . and ..), -1 if it cannot be read. */
static int dir_entries(const char *path)
{
	char cmd[600];
	FILE *f;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "ls -A '%s' | wc -l", path);
	f = popen(cmd, "r");
	if (f && fscanf(f, "%d", &n) != 1)
		n = -1;
	if (f)
		pclose(f);
	return n;
}

/* psctl checkpoint/restore of name on the running cluster: refused with
 * exit 1 and one line holding want. */
static void psctl_refused(const char *cmd, const char *name, const char *want)
{
	char pout[4096] = "", perr[2048] = "";
	int rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "%s %s", cmd, name);

	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(one_line(perr));
	if (!strstr(perr, want)) {
		fprintf(stderr, "psctl %s %s said: %s(wanted '%s')\n", cmd, name, perr, want);
		CU_FAIL("psctl's line does not say why");
	}
}

/*
 * A checkpoint request names a checkpoint, never a path: the servers write
 * it only under their --checkpoint-dir, files 0600 and directories 0700,
 * and restore it exactly.  Absolute paths, "..", empty names and components
 * are refused (-EINVAL), a symbolic link planted under the directory is
 * never followed (-ELOOP; nothing is written where it points), and a server
 * without --checkpoint-dir refuses every request (-EPERM).  Each refusal is
 * one psctl line, and the servers keep serving.
 */
static void test_checkpoint_confined(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	struct it_server_opts off = { .extra_args = FAST_ARGS, .data_dir = 1, .no_ckpt_dir = 1 };
	static const char *const bad[] = { "", "/etc", "..", "a/../../x", "../x", "a//b", "a/", "./a", "a:b" };
	float *want = malloc(COUNT * sizeof(float)), *got = malloc(COUNT * sizeof(float));
	char pout[4096] = "", perr[2048] = "", path[1024], outside[256], msg[256];
	const char *ck = it_ckpt_dir();
	uint64_t v = 0;
	struct stat sb;
	struct mstatus lead;
	size_t i;
	int rc, m;

	CU_ASSERT_PTR_NOT_NULL_FATAL(want);
	CU_ASSERT_PTR_NOT_NULL_FATAL(got);
	test_mkdtemp(outside, sizeof(outside), "it_control_outside");
	CU_ASSERT_EQUAL_FATAL(start_n(&clu, 2, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	adam_run(clu.servers, 0, 5, &v, want);
	CU_ASSERT_EQUAL(v, 5u);

	/* a name: DIR/NAME/member-<id>.rpsck on every server, private */
	rc = it_psctl(&clu, 60000, pout, sizeof(pout), perr, sizeof(perr), "checkpoint conf/a");
	if (rc)
		fprintf(stderr, "psctl checkpoint: %s%s", pout, perr);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	for (m = 1; m <= 2; m++) {
		snprintf(path, sizeof(path), "%s/conf/a/member-%d.rpsck", ck, m);
		CU_ASSERT_EQUAL_FATAL(lstat(path, &sb), 0);
		CU_ASSERT(S_ISREG(sb.st_mode));
		CU_ASSERT_EQUAL(sb.st_mode & 07777, 0600);
	}
	snprintf(path, sizeof(path), "%s/conf", ck);
	CU_ASSERT(stat(path, &sb) == 0 && (sb.st_mode & 07777) == 0700);
	snprintf(path, sizeof(path), "%s/conf/a", ck);
	CU_ASSERT(stat(path, &sb) == 0 && (sb.st_mode & 07777) == 0700);

	/* names that leave the directory: -EINVAL, before anything is held */
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CU_ASSERT_EQUAL(ckpt_raw(&clu, 0, RPS__CKPT_PREPARE, bad[i], msg), -EINVAL);
		CU_ASSERT(strstr(msg, "checkpoint name") != NULL);
		CU_ASSERT_EQUAL(ckpt_raw(&clu, 1, RPS__CKPT_RESTORE, bad[i], msg), -EINVAL);
		CU_ASSERT(strstr(msg, "checkpoint name") != NULL);
	}
	psctl_refused("checkpoint", outside, "is an absolute path");
	psctl_refused("restore", "/etc", "is an absolute path");
	psctl_refused("checkpoint", "..", "'..' component");
	psctl_refused("checkpoint", "a/../../x", "'..' component");
	psctl_refused("restore", "conf/../../x", "'..' component");
	psctl_refused("checkpoint", "a//b", "empty component");
	CU_ASSERT_EQUAL(dir_entries(outside), 0);

	/* a link planted under the directory is never followed */
	snprintf(path, sizeof(path), "%s/evil", ck);
	CU_ASSERT_EQUAL_FATAL(symlink(outside, path), 0);
	psctl_refused("checkpoint", "evil", "'evil' under --checkpoint-dir is a symbolic link");
	psctl_refused("checkpoint", "evil/x", "'evil' under --checkpoint-dir is a symbolic link");
	CU_ASSERT_EQUAL(ckpt_raw(&clu, 0, RPS__CKPT_RESTORE, "evil", msg), -ELOOP);
	CU_ASSERT(strstr(msg, "symbolic link") != NULL);
	CU_ASSERT_EQUAL(dir_entries(outside), 0);	/* nothing went through it */
	/* nor a link under a checkpoint's own name: its target stays unread */
	snprintf(path, sizeof(path), "%s/conf/b", ck);
	CU_ASSERT_EQUAL_FATAL(symlink(outside, path), 0);
	psctl_refused("restore", "conf/b", "'conf/b' under --checkpoint-dir is a symbolic link");
	CU_ASSERT_EQUAL(dir_entries(outside), 0);
	psctl_refused("restore", "conf/none", "no such checkpoint");

	/* the servers kept serving: the values are still exact */
	CU_ASSERT_EQUAL(it_pull_fresh(clu.servers, "ckpt-adam", got, COUNT, 20000, &v), 0);
	CU_ASSERT_EQUAL(v, 5u);
	CU_ASSERT_EQUAL(memcmp(want, got, COUNT * sizeof(float)), 0);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "status");
	CU_ASSERT_EQUAL(rc, 0);
	stop_all(&clu);

	/* the checkpoint restores exactly into 3 new servers */
	CU_ASSERT_EQUAL_FATAL(start_n(&clu, 3, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "restore conf/a");
	if (rc)
		fprintf(stderr, "psctl restore: %s%s", pout, perr);
	CU_ASSERT_EQUAL(rc, 0);
	memset(got, 0, COUNT * sizeof(float));
	CU_ASSERT_EQUAL(it_pull_fresh(clu.servers, "ckpt-adam", got, COUNT, 20000, &v), 0);
	CU_ASSERT_EQUAL(v, 5u);
	CU_ASSERT_EQUAL(memcmp(want, got, COUNT * sizeof(float)), 0);
	stop_all(&clu);

	/* no --checkpoint-dir: every request refused, -EPERM, said so */
	CU_ASSERT_EQUAL_FATAL(start_n(&clu, 2, &off), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	CU_ASSERT_EQUAL(ckpt_raw(&clu, 0, RPS__CKPT_PREPARE, "conf/c", msg), -EPERM);
	CU_ASSERT(strstr(msg, "rdmapsd has no --checkpoint-dir: checkpoints are off") != NULL);
	CU_ASSERT_EQUAL(ckpt_raw(&clu, 1, RPS__CKPT_TAKE, "conf/c", msg), -EPERM);
	CU_ASSERT_EQUAL(ckpt_raw(&clu, 1, RPS__CKPT_RESTORE, "conf/a", msg), -EPERM);
	psctl_refused("checkpoint", "conf/c", "rdmapsd has no --checkpoint-dir: checkpoints are off");
	psctl_refused("restore", "conf/a", "rdmapsd has no --checkpoint-dir: checkpoints are off");
	snprintf(path, sizeof(path), "%s/conf/c", ck);
	CU_ASSERT_EQUAL(lstat(path, &sb), -1);
	adam_run(clu.servers, 0, 5, &v, got);	/* and they serve */
	CU_ASSERT_EQUAL(v, 5u);
	CU_ASSERT_EQUAL(memcmp(want, got, COUNT * sizeof(float)), 0);
	stop_all(&clu);

	snprintf(path, sizeof(path), "rm -rf '%s/conf' '%s/evil' '%s'", ck, ck, outside);
	CU_ASSERT_EQUAL(system(path), 0);
	free(want);
	free(got);
}


/* A partition image damaged on its way (RPS_FAULT=corrupt-migration flips a
 * bit after the crc) is refused by the destination; the move is aborted and
 * the old owner serves the partition again, nothing lost. */
static void test_move_corrupted_refused(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS " --move-timeout-ms 2000", .data_dir = 1,
				    .env = "RPS_FAULT=corrupt-migration" };
	float *before = malloc(COUNT * sizeof(float)), *after = malloc(COUNT * sizeof(float));
	char pout[4096] = "", perr[2048] = "";
	struct mstatus lead;
	uint64_t v1 = 0, v2 = 0;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(before);
	CU_ASSERT_PTR_NOT_NULL_FATAL(after);
	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, false, 10000, &lead) >= 0);
	adam_run(clu.servers, 0, 5, &v1, before);
	/* partition 0 belongs to member 1 at bootstrap */
	rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "move 0 2");
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(strstr(perr, "aborted") != NULL);
	adam_run(clu.servers, 5, 5, &v2, after);
	CU_ASSERT_EQUAL(v2, v1);
	CU_ASSERT_EQUAL(memcmp(before, after, COUNT * sizeof(float)), 0);
	stop_all(&clu);
	free(before);
	free(after);
}

/* ---- lost partitions: a restarted owner, a dead member forced out -------------------- */

/*
 * One single-shard tensor per partition (NAME-P-k, the first k whose name
 * hash lands on partition P), each pushed (P+1) per step: so which
 * partition a pull touches is known, and its exact value too.  A worker
 * keeps its client across the kill and restart and does what the parent
 * says (struct lost_shared); a fresh worker creates and pulls once.
 */
#define LOST_COUNT 1024u	/* fp32: one 4 KiB shard */

enum lost_cmd { LW_PUSH = 1, LW_PULL, LW_EXIT };

struct lost_shared {
	_Atomic int seq;	/* the parent raises it once cmd is set */
	_Atomic int cmd;
};

static struct lost_shared *lost_sh;

struct lost_arg {
	const char *prefix;
	bool oneshot;		/* create, pull once, exit */
	char names[NPART][64];
};

/* What a worker saw of one tensor. */
struct lost_rep {
	int ret;		/* of the create or the pull */
	unsigned long long lost_member;	/* N of "lost with member N" in rps_last_error(), or 0 */
	uint64_t version;
	float value;		/* element 0 */
	int uniform;		/* every element equals element 0 */
};

static void lost_names(struct lost_arg *a)
{
	unsigned p, k;

	for (p = 0; p < NPART; p++)
		for (k = 0;; k++) {
			snprintf(a->names[p], sizeof(a->names[p]), "%s-%u-%u", a->prefix, p, k);
			if (rps__name_hash(a->names[p]) % NPART == p)
				break;
		}
}

static void lost_note(struct lost_rep *r, int ret)
{
	const char *m = strstr(rps_last_error(), "lost with member ");

	r->ret = ret;
	r->lost_member = 0;
	if (ret && m)
		r->lost_member = strtoull(m + strlen("lost with member "), NULL, 10);
}

static int lost_create(rps_client_t *cl, const char *name, rps_tensor_t **t)
{
	struct rps_tensor_opts o;

	rps_tensor_opts_init(&o);
	o.count = LOST_COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SUM;
	o.rescale = 1.0f;
	return rps_tensor_create(cl, name, &o, t);
}

static void lost_pull(rps_tensor_t *t, float *buf, struct lost_rep *r)
{
	uint32_t i;
	int ret = rps_pull(t, buf, LOST_COUNT * sizeof(float), &r->version);

	lost_note(r, ret);
	if (ret)
		return;
	r->value = buf[0];
	r->uniform = 1;
	for (i = 1; i < LOST_COUNT; i++)
		r->uniform &= buf[i] == buf[0];
}

static int lost_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct lost_arg *a = arg;
	float *g = malloc(LOST_COUNT * sizeof(float)), *buf = malloc(LOST_COUNT * sizeof(float));
	struct lost_rep rep[NPART];
	rps_tensor_t *t[NPART] = { 0 };
	struct rps_client_opts co;
	rps_client_t *cl;
	int ret, seen = 0, p, s;
	uint32_t i;

	(void)rank;
	(void)nworkers;
	memset(rep, 0, sizeof(rep));
	rps_client_opts_init(&co);
	co.servers = servers;
	co.timeout_ms = 15000;
	if ((ret = rps_client_connect(&co, &cl)))
		return fail("connect", ret);
	for (p = 0; p < NPART; p++) {
		ret = lost_create(cl, a->names[p], &t[p]);
		lost_note(&rep[p], ret);
		if (ret && !a->oneshot)
			return fail("create", ret);
		if (!ret && a->oneshot)
			lost_pull(t[p], buf, &rep[p]);
	}
	if (a->oneshot) {
		it_write_all(out_fd, rep, sizeof(rep));
		goto out;
	}
	/* three steps, then at the parent's command */
	for (s = 0; s < 3; s++)
		for (p = 0; p < NPART; p++) {
			for (i = 0; i < LOST_COUNT; i++)
				g[i] = (float)(p + 1);
			if ((ret = rps_push(t[p], g, LOST_COUNT * sizeof(float))))
				return fail("push", ret);
		}
	it_write_all(out_fd, &ret, sizeof(ret));
	for (;;) {
		int cmd;
		while (atomic_load(&lost_sh->seq) == seen)
			usleep(1000);
		seen = atomic_load(&lost_sh->seq);
		cmd = atomic_load(&lost_sh->cmd);
		if (cmd == LW_EXIT)
			break;
		for (p = 0; p < NPART; p++) {
			if (cmd == LW_PUSH) {
				for (i = 0; i < LOST_COUNT; i++)
					g[i] = (float)(p + 1);
				lost_note(&rep[p], rps_push(t[p], g, LOST_COUNT * sizeof(float)));
			} else {
				lost_pull(t[p], buf, &rep[p]);
			}
		}
		it_write_all(out_fd, rep, sizeof(rep));
	}
out:
	for (p = 0; p < NPART; p++)
		if (t[p])
			rps_tensor_close(t[p]);
	rps_client_close(cl);
	free(g);
	free(buf);
	return 0;
}

/* Tell the long-lived worker what to do; read what it saw. */
static void lost_cmd(struct it_workers *w, int cmd, struct lost_rep *rep)
{
	atomic_store(&lost_sh->cmd, cmd);
	atomic_fetch_add(&lost_sh->seq, 1);
	if (cmd != LW_EXIT)
		CU_ASSERT_EQUAL_FATAL(it_worker_read(w, 0, rep, NPART * sizeof(*rep)), 0);
}

/* A fresh client creates every tensor and pulls it once. */
static void lost_fresh(const char *servers, const struct lost_arg *a0, struct lost_rep *rep)
{
	struct lost_arg a = *a0;
	struct it_workers w;

	a.oneshot = true;
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, lost_worker, servers, &a, -1, NULL), 0);
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, rep, NPART * sizeof(*rep)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
}

/* Partition p lost with member `lost` (0: not lost): its tensor refused with
 * -ENODATA naming the member, never served; the others exact at `steps`
 * steps. */
static void check_lost_reps(const struct lost_rep *rep, const unsigned long long *lost, int steps, const char *when)
{
	int p, bad = 0;

	for (p = 0; p < NPART; p++) {
		const struct lost_rep *r = &rep[p];
		bool ok = lost[p] ? r->ret == -ENODATA && r->lost_member == lost[p] :
				    !r->ret && r->uniform && r->value == (float)(steps * (p + 1)) &&
				    r->version == (uint64_t)steps;
		if (!ok) {
			fprintf(stderr, "%s: partition %d (lost with %llu): ret %d (lost with member %llu), version %llu, "
				"value %g%s; expected %s\n", when, p, lost[p], r->ret, r->lost_member,
				(unsigned long long)r->version, (double)r->value, r->uniform ? "" : " (not uniform)",
				lost[p] ? "-ENODATA naming the member" : "the trained value");
			bad++;
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
}

/* psctl status --json: every partition's owner, epoch, moving_to and lost. */
struct part_lost {
	unsigned long long owner, epoch, moving_to, lost;
};

static int json_map_lost(const char *s, struct part_lost *parts)
{
	int p;

	if (json_len(s, "map.partitions") != NPART)
		return -1;
	for (p = 0; p < NPART; p++) {
		unsigned long long part;
		if (!json_u64(s, &part, "map.partitions[%d].partition", p) || part != (unsigned)p ||
		    !json_u64(s, &parts[p].owner, "map.partitions[%d].owner", p) ||
		    !json_u64(s, &parts[p].epoch, "map.partitions[%d].epoch", p) ||
		    !json_u64(s, &parts[p].moving_to, "map.partitions[%d].moving_to", p) ||
		    !json_u64(s, &parts[p].lost, "map.partitions[%d].lost", p))
			return -1;
	}
	return 0;
}

static void status_lost(const char *servers, struct part_lost *parts)
{
	int rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json status", servers);

	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(json_valid(out));
	memset(parts, 0, NPART * sizeof(*parts));
	CU_ASSERT_EQUAL_FATAL(json_map_lost(out, parts), 0);
}

/* Wait until server i's map says every partition in lost[] is lost as
 * it says (and no other is): 0, or -1 after timeout_ms. */
static int wait_lost_map(int i, const unsigned long long *lost, int timeout_ms)
{
	double until = now_s() + timeout_ms / 1000.0;
	struct mstatus ms;

	while (now_s() < until) {
		if (!member_status(&clu, i, &ms)) {
			int p, same = 0;
			for (p = 0; p < NPART; p++)
				same += ms.map.parts[p].lost == lost[p];
			if (same == NPART)
				return 0;
		}
		sleep_ms(50);
	}
	return -1;
}

/*
 * Item 5: a partition owner killed with SIGKILL and restarted from its
 * --data-dir had its shards only in memory.  It must refuse them (-ENODATA,
 * "partition N lost with member M"), never serve them as zeros, while the
 * other partitions serve their exact values; psctl status shows them lost,
 * and a restore of a checkpoint taken before the kill brings them back.
 */
static void test_restarted_owner_refuses_lost_partitions(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS, .data_dir = 1 };
	static struct lost_arg a = { .prefix = "restart" };
	unsigned long long lost[NPART] = { 0 }, none[NPART] = { 0 }, vid;
	struct lost_rep rep[NPART];
	struct part_lost pl[NPART];
	char pout[4096] = "", perr[2048] = "", cmd[600];
	struct it_workers w;
	int l, v, p, rc, ready = -1;

	lost_names(&a);
	memset(lost_sh, 0, sizeof(*lost_sh));
	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, NULL);
	CU_ASSERT_FATAL(l >= 0);
	v = (l + 1) % 3;	/* a follower: the group keeps its leader */
	vid = (unsigned long long)v + 1;
	for (p = 0; p < NPART; p++)
		lost[p] = (unsigned long long)(p % 3) + 1 == vid ? vid : 0;	/* bootstrap owners */

	/* 3 steps, a checkpoint, 2 more steps: every value exact */
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, lost_worker, clu.servers, &a, -1, NULL), 0);
	trainers = w;
	trainers_up = true;
	CU_ASSERT_EQUAL_FATAL(it_worker_read(&w, 0, &ready, sizeof(ready)), 0);
	CU_ASSERT_EQUAL_FATAL(ready, 0);
	rc = it_psctl(&clu, 60000, pout, sizeof(pout), perr, sizeof(perr), "checkpoint lost");
	if (rc)
		fprintf(stderr, "psctl checkpoint: %s%s", pout, perr);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	lost_cmd(&w, LW_PUSH, rep);
	lost_cmd(&w, LW_PUSH, rep);
	lost_cmd(&w, LW_PULL, rep);
	check_lost_reps(rep, none, 5, "before the kill");

	/* the member is killed and comes back from its data dir, memory empty */
	it_server_kill(&clu, v);
	CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, v), 0);
	CU_ASSERT_FATAL(wait_agreement(&clu, 0, true, 20000, NULL) >= 0);
	CU_ASSERT_EQUAL(wait_lost_map(l, lost, 20000), 0);

	/* the worker that trained: refused where lost, exact elsewhere */
	lost_cmd(&w, LW_PULL, rep);
	check_lost_reps(rep, lost, 5, "restarted, the worker that trained");
	lost_cmd(&w, LW_EXIT, rep);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	trainers_up = false;
	/* a new worker (a training job started again): the same, never zeros */
	lost_fresh(clu.servers, &a, rep);
	check_lost_reps(rep, lost, 5, "restarted, a new worker");

	/* psctl status says which */
	status_lost(clu.servers, pl);
	for (p = 0; p < NPART; p++) {
		CU_ASSERT_EQUAL(pl[p].lost, lost[p]);
		CU_ASSERT_EQUAL(pl[p].owner, (unsigned long long)(p % 3) + 1);
		CU_ASSERT_EQUAL(pl[p].epoch, EPOCH0);
	}
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "status");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT(strstr(out, "LOST with member") != NULL);

	/* the checkpoint taken before the kill brings them back, exactly */
	rc = it_psctl(&clu, 30000, pout, sizeof(pout), perr, sizeof(perr), "restore lost");
	if (rc)
		fprintf(stderr, "psctl restore: %s%s", pout, perr);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(wait_lost_map(l, none, 20000), 0);
	lost_fresh(clu.servers, &a, rep);
	check_lost_reps(rep, none, 3, "restored");
	status_lost(clu.servers, pl);
	for (p = 0; p < NPART; p++)
		CU_ASSERT_EQUAL(pl[p].lost, 0);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "forget-lost all");
	CU_ASSERT_EQUAL(rc, 1);	/* nothing left to forget */
	CU_ASSERT(one_line(err));
	stop_all(&clu);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s/lost'", it_ckpt_dir());
	CU_ASSERT_EQUAL(system(cmd), 0);
}

/*
 * Item 6: a member that is dead for good (R=1).  A move of one of its
 * partitions cannot finish, and must not hang: psctl gives up with an
 * error.  psctl remove-server --force takes it out: its partitions pass to
 * the live members one epoch on, flagged lost (refused with -ENODATA,
 * never zeros), the others keep their exact values; forget-lost accepts
 * them empty.
 */
static void test_remove_server_force_dead_member(void)
{
	struct it_server_opts o = { .extra_args = FAST_ARGS " --move-timeout-ms 1000", .data_dir = 1 };
	static struct lost_arg a = { .prefix = "force" };
	unsigned long long lost[NPART] = { 0 }, none[NPART] = { 0 }, vid, other;
	struct lost_rep rep[NPART];
	struct part_lost pl[NPART];
	char live[700];
	struct it_workers w;
	int l, v, p, P = -1, rc, ready = -1, live_members;
	double t0;

	lost_names(&a);
	memset(lost_sh, 0, sizeof(*lost_sh));
	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, false, 10000, NULL);
	CU_ASSERT_FATAL(l >= 0);
	v = (l + 1) % 3;
	vid = (unsigned long long)v + 1;
	other = (unsigned long long)(l + 2) % 3 + 1;
	snprintf(live, sizeof(live), "%s,%s", clu.uri[l], clu.uri[(l + 2) % 3]);
	for (p = 0; p < NPART; p++)
		if ((unsigned long long)(p % 3) + 1 == vid) {
			lost[p] = vid;
			if (P < 0)
				P = p;
		}
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, lost_worker, clu.servers, &a, -1, NULL), 0);
	trainers = w;
	trainers_up = true;
	CU_ASSERT_EQUAL_FATAL(it_worker_read(&w, 0, &ready, sizeof(ready)), 0);
	CU_ASSERT_EQUAL_FATAL(ready, 0);
	lost_cmd(&w, LW_PULL, rep);
	check_lost_reps(rep, none, 3, "before the kill");

	it_server_kill(&clu, v);
	CU_ASSERT_FATAL(wait_agreement(&clu, (1u << l) | (1u << ((l + 2) % 3)), false, 20000, NULL) >= 0);
	/* a move out of the dead member fails, it does not hang */
	t0 = now_s();
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --timeout 5 move %d %llu", live, P,
		      other);
	fprintf(stderr, "[move from the dead member: exit %d after %.1f s: %s] ", rc, now_s() - t0, err);
	CU_ASSERT_EQUAL(rc, 1);
	CU_ASSERT(one_line(err));
	status_lost(live, pl);
	CU_ASSERT_EQUAL(pl[P].moving_to, other);	/* left moving: only its dead source could abort it */

	/* forced out: its partitions pass to the others, lost, one epoch on */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --timeout 10 remove-server --force %llu",
		      live, vid);
	if (rc)
		fprintf(stderr, "psctl remove-server --force: exit %d: %s", rc, err);
	CU_ASSERT_EQUAL(rc, 0);
	status_lost(live, pl);
	for (p = 0; p < NPART; p++) {
		if (lost[p]) {
			CU_ASSERT(pl[p].owner != vid && pl[p].owner >= 1 && pl[p].owner <= 3);
			CU_ASSERT_EQUAL(pl[p].epoch, EPOCH0 + 1);
		} else {
			CU_ASSERT_EQUAL(pl[p].owner, (unsigned long long)(p % 3) + 1);
			CU_ASSERT_EQUAL(pl[p].epoch, EPOCH0);
		}
		CU_ASSERT_EQUAL(pl[p].moving_to, 0);
		CU_ASSERT_EQUAL(pl[p].lost, lost[p]);
	}
	{
		char pat[32];
		snprintf(pat, sizeof(pat), "{\"id\":%llu,", vid);
		CU_ASSERT_EQUAL(members_with_id(out, vid), 0);	/* neither a member nor in the map */
		live_members = members_listed(out);
		CU_ASSERT_EQUAL(live_members, 2 * 2);
	}

	/* the worker that trained, and a new one: refused where lost, exact elsewhere */
	lost_cmd(&w, LW_PULL, rep);
	check_lost_reps(rep, lost, 3, "forced out, the worker that trained");
	lost_cmd(&w, LW_PUSH, rep);
	for (p = 0; p < NPART; p++)
		CU_ASSERT_EQUAL(rep[p].ret, lost[p] ? -ENODATA : 0);
	lost_cmd(&w, LW_EXIT, rep);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	trainers_up = false;
	lost_fresh(live, &a, rep);
	for (p = 0; p < NPART; p++)	/* (the others took one more step) */
		if (!lost[p]) {
			CU_ASSERT_EQUAL(rep[p].ret, 0);
			CU_ASSERT(rep[p].uniform && rep[p].value == (float)(4 * (p + 1)) && rep[p].version == 4);
		} else {
			CU_ASSERT_EQUAL(rep[p].ret, -ENODATA);
			CU_ASSERT_EQUAL(rep[p].lost_member, vid);
		}

	/* accepted empty: zeros at version 0 where lost, the rest untouched */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s forget-lost all", live);
	if (rc)
		fprintf(stderr, "psctl forget-lost: exit %d: %s", rc, err);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(wait_lost_map(l, none, 20000), 0);
	lost_fresh(live, &a, rep);
	for (p = 0; p < NPART; p++) {
		CU_ASSERT_EQUAL(rep[p].ret, 0);
		CU_ASSERT(rep[p].uniform);
		CU_ASSERT_EQUAL(rep[p].value, lost[p] ? 0.0f : (float)(4 * (p + 1)));
		CU_ASSERT_EQUAL(rep[p].version, lost[p] ? 0u : 4u);
	}
	stop_all(&clu);
}


/* ---- failure detection and failover ---------------------------------------------- */

#define FAILOVER_MS 800		/* (leases every 80 ms: a loaded machine's stalls stay well below) */

/* What the map must say once member dead failed: with R = 2 partition p is
 * owned by p%3+1 and backed by (p+1)%3+1 (the test hook's bootstrap map). */
static bool failed_over(const struct rps__smap *m, unsigned long long dead, bool check)
{
	bool ok = true;

	for (uint32_t p = 0; p < NPART; p++) {
		unsigned long long owner = p % 3 + 1, backup = (p + 1) % 3 + 1;
		const struct rps__smap_part *mp = &m->parts[p];
		bool moved = owner == dead || backup == dead;
		unsigned long long want_owner = owner == dead ? backup : owner;
		unsigned long long want_backup = moved ? 0 : backup;

		ok = ok && mp->owner == want_owner && mp->backups[0] == want_backup && mp->backups[1] == 0 &&
		     mp->epoch == (moved ? 2u : 1u) && !mp->joining && !mp->moving_to && !mp->lost;
		if (check) {
			CU_ASSERT_EQUAL(mp->owner, want_owner);
			CU_ASSERT_EQUAL(mp->backups[0], want_backup);
			CU_ASSERT_EQUAL(mp->epoch, moved ? 2u : 1u);
			CU_ASSERT(!mp->joining && !mp->moving_to && !mp->lost);
		}
	}
	return ok;
}

/* Three servers, a map with one backup per partition (test hook; the
 * leader re-seeds nothing: no-replica-duty keeps the map these checks
 * expect), no
 * failure among live servers over many lease periods; then one is killed
 * (SIGKILL: no goodbye): the leader (a new one if the leader was killed)
 * declares it failed and commits FAILOVER to the backup where it was
 * primary and REPLICA_DROP where it was backup, epoch 2 for those, every
 * other partition untouched, within a few failover_ms. */
static void failover_killed(bool kill_leader)
{
	struct it_server_opts o = { .extra_args = BASE0 " --fsync none --failover-ms 800",
				    .env = "RPS_FAULT=bootstrap-replicas-2,no-replica-duty", .data_dir = 1 };
	static struct mstatus ms, later;
	unsigned long long dead;
	int l, v, nl, p;
	double t0;

	CU_ASSERT_EQUAL_FATAL(start3(&clu, &o), 0);
	l = wait_agreement(&clu, 0, true, 10000, &ms);
	CU_ASSERT_FATAL(l >= 0);
	for (p = 0; p < NPART; p++) {
		CU_ASSERT_EQUAL_FATAL(ms.map.parts[p].owner, (unsigned long long)p % 3 + 1);
		CU_ASSERT_EQUAL_FATAL(ms.map.parts[p].backups[0], (unsigned long long)(p + 1) % 3 + 1);
		CU_ASSERT_EQUAL_FATAL(ms.map.parts[p].epoch, 1u);
	}
	/* everyone alive: nothing is declared, nothing proposed */
	sleep_ms(3 * FAILOVER_MS);
	CU_ASSERT_EQUAL_FATAL(wait_agreement(&clu, 0, true, 10000, &later), l);
	CU_ASSERT_EQUAL(later.st.applied, ms.st.applied);
	CU_ASSERT(same_map(&later.map, &ms.map));

	v = kill_leader ? l : (l + 1) % 3;
	dead = (unsigned long long)v + 1;
	t0 = now_s();
	it_server_kill(&clu, v);
	for (;;) {
		nl = wait_agreement(&clu, 0, true, 10000, &later);
		CU_ASSERT_FATAL(nl >= 0);
		if (failed_over(&later.map, dead, false) || now_s() - t0 > 10)
			break;
		sleep_ms(20);
	}
	fprintf(stderr, "[member %llu (%s) killed: failed over after %.2f s] ", dead,
		kill_leader ? "the leader" : "a follower", now_s() - t0);
	failed_over(&later.map, dead, true);
	CU_ASSERT(now_s() - t0 < 5.0);
	stop_all(&clu);
}

static void test_failover_follower_killed(void)
{
	failover_killed(false);
}

static void test_failover_leader_killed(void)
{
	failover_killed(true);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "status: one leader, one term, valid JSON", test_status },
		{ "moves during async training, exact", test_moves_async },
		{ "moves during sync training, exact", test_moves_sync },
		{ "moves during bounded training, exact", test_moves_bounded },
		{ "add-server and remove-server during training", test_add_remove },
		{ "a server joins through a follower (--cluster without the leader)", test_join_via_follower },
		{ "leader killed right after a move is issued, restarted", test_leader_killed_mid_move },
		CUTEST_FAULT("leader killed while a move waits for its destination, restarted", test_leader_killed_stalled_move),
		CUTEST_FAULT("leader killed, restarted, the move aborted without its destination", test_leader_killed_aborted_move),
		CUTEST_FAULT("follower cut off, moves go on, it catches up", test_follower_isolated),
		CUTEST_FAULT("psctl finds the leader past a server cut off from the group", test_psctl_past_isolated),
		{ "transfer-leader", test_transfer_leader },
		{ "bad input: clear errors, exit 1 or 2, malformed ADMIN dropped", test_bad_input },
		{ "checkpoint during sync training; restore onto fewer and more servers; damage refused", test_checkpoint_restore },
		{ "checkpoint: parameters, versions and Adam state restored bit-identical", test_checkpoint_adam_exact },
		{ "checkpoint names stay under --checkpoint-dir: paths, '..', links refused; off without it", test_checkpoint_confined },
		CUTEST_FAULT("a partition image corrupted in flight is refused, the move aborted, nothing lost", test_move_corrupted_refused),
		{ "restarted owner refuses lost partitions (-ENODATA, never zeros); a restore brings them back", test_restarted_owner_refuses_lost_partitions },
		{ "remove-server --force of a dead member: its partitions lost, the rest exact; forget-lost", test_remove_server_force_dead_member },
		{ "ADD_SERVER with a garbage uri refused by the server", test_add_server_garbage_uri_refused },
		{ "a dead member: clients connect, its shards fail naming it", test_dead_member_does_not_break_connect },
		CUTEST_FAULT("failover: a follower killed, its partitions fail over to their backups", test_failover_follower_killed),
		CUTEST_FAULT("failover: the leader killed, the new leader fails its partitions over", test_failover_leader_killed),
	};
	const struct cutest_suite suites[] = {
		{ "control plane, 3 servers, psctl", NULL, NULL, test_setup, test_teardown, tests, CUTEST_COUNT(tests) },
	};

	if (!strcmp(getenv("RPS_IT_TRANSPORT") ? getenv("RPS_IT_TRANSPORT") : "tcp", "verbs") &&
	    !getenv("RPS_IT_ADDR")) {
		fprintf(stderr, "it_control: verbs needs RPS_IT_ADDR (an address of an RDMA device)\n");
		return 77;
	}
	if (access(it_psctl_path(), X_OK) != 0) {
		fprintf(stderr, "it_control: no psctl at %s (set PSCTL)\n", it_psctl_path());
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	train_sh = mmap(NULL, sizeof(*train_sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	lost_sh = mmap(NULL, sizeof(*lost_sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (train_sh == MAP_FAILED || lost_sh == MAP_FAILED) {
		perror("it_control: mmap");
		return 1;
	}
	watchdog_init("it_control", TEST_WATCHDOG_S, it_kill_all);
	return cutest_run(suites, CUTEST_COUNT(suites));
}
