/*
 * soak.c - `make check-soak`: a fault-injection soak (doc/testing.md
 * "Fault-injection soak").
 *
 * A cluster of rdmapsd processes on loopback (TCP; 3 servers, --replicas 2,
 * growing to 5 and back through add-server/remove-server) trains three
 * tensors, one per consistency mode, with NWORKERS forked workers, while a
 * nemesis injects one fault at a time, chosen at random from SOAK_SEED:
 *   kill        kill -9 of a server (restarted with the same --data-dir) or
 *               of a worker (a replacement of the same rank, takeover)
 *   stop        SIGSTOP of a server or a worker, SIGCONT a moment later
 *   term        SIGTERM of a server, restarted with the same --data-dir
 *   partition   a server cut off from its peers (RPS_FAULT=isolate-signals:
 *               SIGUSR1 cuts, SIGUSR2 heals), then healed
 *   move        psctl move of a random partition to another member
 *   rebalance   psctl rebalance (the moves and restarts before leave the
 *               primaries uneven)
 *   membership  psctl add-server (a new rdmapsd --join) or remove-server
 *               (3 to 5 members)
 *   replicas    psctl set-replicas 3, settled, then back to 2
 *   ckpt        psctl checkpoint under live training
 *   restore     once the workers are done, psctl restore of the last
 *               checkpoint (one taken then if ckpt is off): it must hold a
 *               consistent cut of what was acknowledged while it was
 *               taken, on every replica.  Not under live training: a
 *               restore takes back acknowledged pushes by design
 *               (doc/operations.md, "Checkpoints": "Restore into a
 *               cluster whose workers have not started").
 * After each fault the map must settle (every partition owned and backed
 * by running members, nothing lost, moving or seeding, and every backup it
 * lists holding a copy) and every worker must make progress again: then
 * the fault counts as survived.
 *
 * What the workers check, and what is checked at the end:
 *  - async and bounded (staleness 2): every push adds w(i) = 1 + i % 3 to
 *    element i (SUM), so a shard of a pull holds one whole count c with
 *    element i == c * w(i) (else the pull was torn), and c lies between
 *    the pushes acknowledged before the pull began and those started
 *    before it ended (else an acknowledged push was lost, or one applied
 *    twice).  At the end every shard's count must equal the pushes
 *    acknowledged, up to the pushes a killed worker had in flight;
 *  - sync: rank r's gradient of step s is a fixed function of (r, s, i);
 *    after every step the pull must be bit-identical to the reference the
 *    worker computes (rank-order sum, as the servers add), and its
 *    version the step;
 *  - the replicas: every backup's digest (crc32c of versions, parameters,
 *    state, clocks and push ids) equals its primary's (it_replicas_differ);
 *  - every worker finishes, or fails with one line naming the cause.
 *
 * Environment: SOAK_SECONDS (default 600), SOAK_SEED (default: from the
 * clock; printed, with the command that replays it), SOAK_FAULTS (a comma-
 * separated subset of the kinds above; default all), SOAK_WITNESS=1 (2 data
 * servers + rdmapsd --witness: skipped (77) while rdmapsd has no --witness),
 * SOAK_LOG (the servers' log, default soak-servers.log).  Exit 0 pass,
 * 1 fail, 77 skip.
 */
#include "config.h"
#include "cluster.h"
#include "proto/smap.h"
#include "lib/watchdog.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"

#define NWORKERS 3
#define SHARD_ELEMS 1024u	/* --shard-size 4096, fp32 */
#define COUNT 8192u		/* async and bounded: 8 shards each */
#define SYNC_COUNT 2048u	/* sync: 2 shards (the reference is recomputed by replacements) */
#define STALENESS 2
#define MIN_SERVERS 3
#define MAX_MEMBERS 5
#define WORKER_TIMEOUT_MS 60000
#define SETTLE_MS 90000		/* the map settles after a fault within this */
#define PROGRESS_S 90.0		/* every worker progresses again within this */
#define SERVER_ARGS "--partitions 8 --shard-size 4096 --slots 4 --tick-ms 50 --fsync none " \
	"--failover-ms 2000 --replicas 2"

enum kind { K_KILL, K_STOP, K_TERM, K_PARTITION, K_MOVE, K_REBALANCE, K_MEMBERSHIP, K_REPLICAS, K_CKPT, K_RESTORE,
	    NKINDS };
static const char *const kind_name[NKINDS] = { "kill", "stop", "term", "partition", "move", "rebalance",
					       "membership", "replicas", "ckpt", "restore" };

enum { T_ASYNC, T_BOUNDED, NCOUNTED };
static const char *const tname[] = { "soak-async", "soak-bounded", "soak-sync" };

/* Shared between the driver and every worker (MAP_SHARED). */
struct shared {
	atomic_llong started[NCOUNTED][NWORKERS];	/* pushes begun (in flight included) */
	atomic_llong acked[NCOUNTED][NWORKERS];		/* pushes acknowledged */
	atomic_int step[NWORKERS];			/* sync steps done and checked */
	atomic_int stop_at;				/* >0: no sync step from this one on */
	atomic_llong pulls;				/* pulls checked, all workers */
	atomic_llong bounded_skipped;			/* bounded pushes a predecessor made */
	char line[NWORKERS][600];			/* a worker's failure, for the summary */
};
static struct shared *sh;

static struct it_cluster clu;
static uint64_t rng;
static bool witness;
static pid_t wpid[NWORKERS];
static int wgen[NWORKERS];
static char workers_servers[2048];	/* the list a replacement worker gets */
static char log_path[512];
static char server_extra[1024];	/* SERVER_ARGS and the log's redirection */

/* Server i is the witness (SOAK_WITNESS=1: the third started). */
static bool is_witness(int i)
{
	return witness && i == 2;
}


/* ---- what the workers push ------------------------------------------------------- */

static inline float weight(uint32_t i)
{
	return (float)(1 + i % 3);
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Rank r's sync gradient of step s, element i: 24 random bits in
 * [-8, 8), so the sums round and only the servers' order reproduces them. */
static float sync_grad(int r, int s, uint32_t i)
{
	uint64_t x = mix(((uint64_t)(uint32_t)r << 56) ^ ((uint64_t)(uint32_t)s << 24) ^ i);

	return (float)((int32_t)(x >> 40) - (1 << 23)) / (float)(1 << 20);
}

/* ref += the step's sum, in rank order (push.c: rank 0's, + rank 1's, ...),
 * then p + sum (SUM, rescale 1). */
static void ref_step(float *ref, int s)
{
	for (uint32_t i = 0; i < SYNC_COUNT; i++) {
		float acc = sync_grad(0, s, i);
		for (int r = 1; r < NWORKERS; r++)
			acc = acc + sync_grad(r, s, i);
		ref[i] = ref[i] + acc;
	}
}

static long long sum_of(atomic_llong *a)
{
	long long n = 0;

	for (int r = 0; r < NWORKERS; r++)
		n += atomic_load(&a[r]);
	return n;
}

/* ---- a worker ------------------------------------------------------------------------ */

static int wfail(int rank, const char *what, int ret)
{
	snprintf(sh->line[rank], sizeof(sh->line[rank]), "%s: %d (%s): %s", what, ret, rps_strerror(ret),
		 rps_last_error());
	fprintf(stderr, "soak: worker %d (pid %d): %s\n", rank, (int)getpid(), sh->line[rank]);
	return 1;
}

static int wbad(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wbad(int rank, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	snprintf(sh->line[rank], sizeof(sh->line[rank]), "%s", line);
	fprintf(stderr, "soak: worker %d (pid %d): %s\n", rank, (int)getpid(), line);
	return 2;
}

/* An async/bounded pull: every shard one whole count c, element i ==
 * c * w(i), lo <= c <= hi.  0, or a worker's exit status (said). */
static int check_counted(int rank, const char *name, const float *p, long long lo, long long hi)
{
	for (uint32_t sh0 = 0; sh0 < COUNT; sh0 += SHARD_ELEMS) {
		float c = p[sh0] / weight(sh0);
		if (c != (float)(long long)c)
			return wbad(rank, "'%s' shard %u: element %u is %.1f, not a whole number of pushes",
				    name, sh0 / SHARD_ELEMS, sh0, (double)p[sh0]);
		for (uint32_t i = sh0; i < sh0 + SHARD_ELEMS; i++)
			if (p[i] != c * weight(i))
				return wbad(rank, "torn pull of '%s' shard %u: element %u is %.1f, element %u says "
					    "%.0f pushes (%.1f expected)", name, sh0 / SHARD_ELEMS, i, (double)p[i],
					    sh0, (double)c, (double)(c * weight(i)));
		if ((long long)c < lo)
			return wbad(rank, "'%s' shard %u holds %.0f pushes, but %lld were acknowledged before the "
				    "pull began: an acknowledged push lost", name, sh0 / SHARD_ELEMS, (double)c, lo);
		if ((long long)c > hi)
			return wbad(rank, "'%s' shard %u holds %.0f pushes, but only %lld were started before the "
				    "pull ended: a push applied twice", name, sh0 / SHARD_ELEMS, (double)c, hi);
	}
	return 0;
}

static int worker_main(int rank, int takeover)
{
	float *g = malloc(COUNT * sizeof(float)), *p = malloc(COUNT * sizeof(float));
	float *sg = malloc(SYNC_COUNT * sizeof(float)), *ref = calloc(SYNC_COUNT, sizeof(float));
	struct rps_client_opts co;
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t[3];
	uint64_t version;
	int ret, s, k, resumed;

	if (!g || !p || !sg || !ref)
		return wfail(rank, "malloc", -ENOMEM);
	for (uint32_t i = 0; i < COUNT; i++)
		g[i] = weight(i);
	rps_client_opts_init(&co);
	co.servers = workers_servers;
	co.rank = rank;
	co.num_workers = NWORKERS;
	co.timeout_ms = WORKER_TIMEOUT_MS;
	co.takeover = takeover;
	if ((ret = rps_client_connect(&co, &cl)))
		return wfail(rank, "connect", ret);
	for (k = 0; k < 3; k++) {
		rps_tensor_opts_init(&o);
		o.count = k == 2 ? SYNC_COUNT : COUNT;
		o.mode = k == T_ASYNC ? RPS_MODE_ASYNC : k == T_BOUNDED ? RPS_MODE_BOUNDED : RPS_MODE_SYNC;
		o.staleness = STALENESS;
		o.optimizer = RPS_OPT_SUM;
		if ((ret = rps_tensor_create(cl, tname[k], &o, &t[k]))) {
			char what[64];
			snprintf(what, sizeof(what), "create '%s'", tname[k]);
			return wfail(rank, what, ret);
		}
	}
	/* the sync step this rank resumes at (0 for a new job): every shard
	 * there must be the reference's, or one step past it where the
	 * predecessor died part way through its push of that step and the
	 * shard completed it with the predecessor's gradient (rdmaps(3),
	 * takeover) */
	/* (a rank without a connection to a server for --failover-ms, a
	 * worker killed and its replacement not yet there, counts as gone
	 * there: the pull fails with EPIPE naming it, and is made again, as
	 * below; one that dials again sooner is only late) */
	for (double until = it_now_s() + WORKER_TIMEOUT_MS / 1000.0;;) {
		ret = rps_pull(t[2], p, SYNC_COUNT * sizeof(float), &version);
		if (ret != -EPIPE || it_now_s() > until)
			break;
		it_sleep_ms(20);
	}
	if (ret)
		return wfail(rank, "first sync pull", ret);
	for (s = 0; s < (int)version; s++)
		ref_step(ref, s);
	memcpy(sg, ref, SYNC_COUNT * sizeof(float));
	ref_step(sg, (int)version);	/* (the step after) */
	for (uint32_t sh0 = 0; sh0 < SYNC_COUNT; sh0 += SHARD_ELEMS) {
		size_t n = (SYNC_COUNT - sh0 < SHARD_ELEMS ? SYNC_COUNT - sh0 : SHARD_ELEMS) * sizeof(float);
		if (memcmp(p + sh0, ref + sh0, n) && memcmp(p + sh0, sg + sh0, n))
			return wbad(rank, "'%s' shard %u at step %d (where this worker resumes) differs from the "
				    "reference at that step and the next", tname[2], sh0 / SHARD_ELEMS, (int)version);
	}
	atomic_store(&sh->step[rank], (int)version);
	resumed = (int)version;
	for (s = (int)version;; s++) {
		int stop = atomic_load(&sh->stop_at);

		if (stop && s >= stop)
			break;
		for (k = 0; k < NCOUNTED; k++) {
			long long lo, hi;
			uint64_t clock = 0;
			char what[64];

			/* the bounded clock counts the rank's pushes: one whose
			 * predecessor pushed this step before dying resumes at
			 * s + 1, and pushing again would put the rank a clock
			 * ahead of the others for good (each such death one
			 * more): past the staleness its pull would wait for
			 * ranks that wait for it on the sync tensor (rdmaps(3),
			 * "Replacing a worker") */
			if (k == T_BOUNDED) {
				if ((ret = rps_tensor_clock(t[k], &clock)))
					return wfail(rank, "rps_tensor_clock", ret);
				if (clock > (uint64_t)s + 1 || (clock > (uint64_t)s && s > resumed))
					return wbad(rank, "'%s': clock %" PRIu64 " at sync step %d (resumed at %d): the "
						    "bounded clock runs ahead of the steps", tname[k], clock, s, resumed);
			}
			if (k == T_BOUNDED && clock > (uint64_t)s) {
				atomic_fetch_add(&sh->bounded_skipped, 1);
			} else {
				atomic_fetch_add(&sh->started[k][rank], 1);
				if ((ret = rps_push(t[k], g, COUNT * sizeof(float)))) {
					snprintf(what, sizeof(what), "push '%s'", tname[k]);
					return wfail(rank, what, ret);
				}
				atomic_fetch_add(&sh->acked[k][rank], 1);
			}
			lo = sum_of(sh->acked[k]);
			if ((ret = rps_pull(t[k], p, COUNT * sizeof(float), &version))) {
				snprintf(what, sizeof(what), "pull '%s'", tname[k]);
				return wfail(rank, what, ret);
			}
			hi = sum_of(sh->started[k]);
			if ((ret = check_counted(rank, tname[k], p, lo, hi)))
				return ret;
			atomic_fetch_add(&sh->pulls, 1);
		}
		for (uint32_t i = 0; i < SYNC_COUNT; i++)
			sg[i] = sync_grad(rank, s, i);
		if ((ret = rps_push(t[2], sg, SYNC_COUNT * sizeof(float))))
			return wfail(rank, "push 'soak-sync'", ret);
		ref_step(ref, s);
		/* a pull waiting for a rank that died fails with EPIPE (rdmaps(3),
		 * "Replacing a worker"): the replacement comes, pull again */
		for (double until = it_now_s() + WORKER_TIMEOUT_MS / 1000.0;;) {
			/* (p held the async and bounded pulls: NaN, so a shard
			 * this pull says it read but never wrote shows as NaN,
			 * not as another tensor's values) */
			memset(p, 0xff, SYNC_COUNT * sizeof(float));
			ret = rps_pull(t[2], p, SYNC_COUNT * sizeof(float), &version);
			if (ret != -EPIPE || it_now_s() > until)
				break;
			it_sleep_ms(20);
		}
		if (ret)
			return wfail(rank, "pull 'soak-sync'", ret);
		if (version != (uint64_t)s + 1)
			return wbad(rank, "'%s': the pull after step %d says version %" PRIu64 ", not %d", tname[2], s,
				    version, s + 1);
		for (uint32_t i = 0; i < SYNC_COUNT; i++) {
			uint32_t bits, unwritten = 0, differ = 0, j;
			if (!memcmp(&p[i], &ref[i], sizeof(float)))
				continue;
			/* of its shard: how many differ, how many the pull never
			 * wrote (still the 0xff fill) */
			for (j = i - i % SHARD_ELEMS; j < i - i % SHARD_ELEMS + SHARD_ELEMS && j < SYNC_COUNT; j++) {
				memcpy(&bits, &p[j], sizeof(bits));
				differ += memcmp(&p[j], &ref[j], sizeof(float)) != 0;
				unwritten += bits == 0xffffffffu;
			}
			return wbad(rank, "'%s' after step %d: element %u is %.9g, the reference %.9g "
				    "(a step lost, doubled or summed out of order; in its shard %u elements "
				    "differ, %u never written by the pull)", tname[2], s, i, (double)p[i],
				    (double)ref[i], differ, unwritten);
		}
		atomic_fetch_add(&sh->pulls, 1);
		atomic_store(&sh->step[rank], s + 1);
		it_sleep_ms(2);	/* leave the servers some of the cores */
	}
	for (k = 0; k < 3; k++)
		rps_tensor_close(t[k]);
	rps_client_close(cl);
	free(g);
	free(p);
	free(sg);
	free(ref);
	return 0;
}

/* The running data servers' URIs (a replacement worker's and the final
 * pulls' list: removed members refuse). */
static const char *servers_now(void)
{
	size_t k = 0;

	workers_servers[0] = '\0';
	for (int i = 0; i < clu.nservers; i++)
		if (clu.pid[i] > 0 && !is_witness(i) && k < sizeof(workers_servers))
			k += (size_t)snprintf(workers_servers + k, sizeof(workers_servers) - k, "%s%s",
					      k ? "," : "", clu.uri[i]);
	return workers_servers;
}

static void worker_start(int rank, int takeover)
{
	servers_now();
	fflush(NULL);
	pid_t pid = fork();

	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(worker_main(rank, takeover));
	}
	wpid[rank] = pid > 0 ? pid : 0;
	wgen[rank]++;
	if (pid < 0)
		fprintf(stderr, "soak: fork of worker %d: %s\n", rank, strerror(errno));
}

/* ---- clean-up, whatever happens -------------------------------------------------------- */

static void kill_everything(void)
{
	for (int r = 0; r < NWORKERS; r++)
		if (wpid[r] > 0) {
			kill(wpid[r], SIGCONT);
			kill(wpid[r], SIGKILL);
		}
	for (int i = 0; i < clu.nservers; i++)
		if (clu.pid[i] > 0)
			kill(clu.pid[i], SIGCONT);	/* a stopped one dies of SIGKILL anyway */
	it_kill_all();
}

static void on_signal(int sig)
{
	kill_everything();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* ---- the nemesis ------------------------------------------------------------------------ */

static uint64_t rnd(uint64_t n)
{
	return n ? it_rand(&rng) % n : 0;
}

static int rnd_ms(int lo, int hi)
{
	return lo + (int)rnd((uint64_t)(hi - lo + 1));
}

/* A random running server's index (the witness too unless data_only), or -1. */
static int pick_server(bool data_only)
{
	int idx[IT_MAX_SERVERS], n = 0;

	for (int i = 0; i < clu.nservers; i++)
		if (clu.pid[i] > 0 && !(data_only && is_witness(i)))
			idx[n++] = i;
	return n ? idx[rnd((uint64_t)n)] : -1;
}

static int running_members(void)
{
	int n = 0;

	for (int i = 0; i < clu.nservers; i++)
		n += clu.pid[i] > 0 && !is_witness(i);
	return n;
}

/* A worker exited by itself?  Its rank (its line said why), else -1. */
static int worker_exited(int *status)
{
	for (int r = 0; r < NWORKERS; r++) {
		int st;
		if (wpid[r] > 0 && waitpid(wpid[r], &st, WNOHANG) == wpid[r]) {
			wpid[r] = 0;
			*status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
			return r;
		}
	}
	return -1;
}

static char why[1024];		/* the soak's failure, or "" */

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	va_list ap;

	if (!why[0]) {
		va_start(ap, fmt);
		vsnprintf(why, sizeof(why), fmt, ap);
		va_end(ap);
		fprintf(stderr, "soak: FAILED: %s\n", why);
	}
	return -1;
}

/* Sleep ms, watching the workers: -1 (failed) if one exited meanwhile. */
static int nap(int ms)
{
	double until = it_now_s() + ms / 1000.0;
	int st, r;

	do {
		if ((r = worker_exited(&st)) >= 0)
			return fail("worker %d exited with status %d during the run: %s", r, st,
				    sh->line[r][0] ? sh->line[r] : "(no line: it crashed)");
		it_sleep_ms(20);
	} while (it_now_s() < until);
	return 0;
}

static int psctl(int timeout_s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int psctl(int timeout_s, const char *fmt, ...)
{
	char args[1024], err[4096] = "", out[4096] = "";
	va_list ap;
	int rc;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	/* (-s the members running now: the first ones may all be gone) */
	rc = it_psctl(&clu, (timeout_s + 15) * 1000, out, sizeof(out), err, sizeof(err), "-s %s --timeout %d %s",
		      servers_now(), timeout_s, args);
	if (rc)
		return fail("psctl %s: exit %d: %s", args, rc, err[0] ? err : out);
	return 0;
}

/* The map as a running server knows it. */
static int get_map(struct rps__smap *m)
{
	struct it_member st;

	for (int i = 0; i < clu.nservers; i++)
		if (clu.pid[i] > 0 && !it_member_status(&clu, i, &st, m))
			return 0;
	return fail("no running server answers STATUS");
}

static int digest(int i, int k, uint32_t p, struct it_digest *d);

/* Does every backup the map lists hold a copy of what its primary holds
 * (the same shards of every tensor)?  NULL, or what is missing.  The map
 * can list a backup that holds nothing yet (a member restarted before it
 * was declared failed, until it leaves the set and is seeded again): the
 * next fault must not find the cluster less redundant than it looks. */
static const char *backups_hold(const struct rps__smap *m, char *buf, size_t len)
{
	for (uint32_t p = 0; p < m->npart; p++) {
		const struct rps__smap_part *mp = &m->parts[p];
		for (int k = 0; k < 3; k++) {
			struct it_digest prim, b;
			if (digest(it_member_index(&clu, mp->owner), k, p, &prim))
				return snprintf(buf, len, "partition %u: no digest from its primary", p), buf;
			for (uint32_t j = 0; j < RPS__SMAP_MAX_REPLICAS - 1 && mp->backups[j]; j++)
				if (digest(it_member_index(&clu, mp->backups[j]), k, p, &b) || b.nshards != prim.nshards)
					return snprintf(buf, len, "partition %u: backup %" PRIu64 " holds %u shards of '%s', "
							"its primary %" PRIu64 " %u", p, mp->backups[j], b.nshards, tname[k],
							mp->owner, prim.nshards), buf;
		}
	}
	return NULL;
}

/* The map settled (it_wait_settled) and every backup it lists holds a copy. */
static int settle(uint32_t replicas)
{
	static struct rps__smap m;
	double until = it_now_s() + SETTLE_MS / 1000.0;
	char buf[256];
	const char *w;

	for (;;) {
		int left = (int)((until - it_now_s()) * 1000);
		if (it_wait_settled(&clu, replicas, left > 0 ? left : 1, &m))
			return fail("the map did not settle within %d s (the line above says what was missing)",
				    SETTLE_MS / 1000);
		if (!(w = backups_hold(&m, buf, sizeof(buf))))
			return 0;
		if (it_now_s() > until)
			return fail("the map settled, but not the copies within %d s: %s", SETTLE_MS / 1000, w);
		it_sleep_ms(1000);	/* (each round asks every member: keep the load down) */
	}
}

/* Every worker progressed (a sync step each, and async pushes) since the
 * snapshot. */
static int progressed(const int step0[NWORKERS], long long acked0)
{
	double until = it_now_s() + PROGRESS_S;

	for (;;) {
		bool all = sum_of(sh->acked[T_ASYNC]) > acked0;
		for (int r = 0; r < NWORKERS; r++)
			all = all && atomic_load(&sh->step[r]) > step0[r];
		if (all)
			return 0;
		if (it_now_s() > until)
			return fail("the workers made no progress for %.0f s after the fault", PROGRESS_S);
		if (nap(20))
			return -1;
	}
}

static int server_restart(int i)
{
	int ret = it_server_restart(&clu, i);

	return ret ? fail("restart of server %d (member %d): %d (%s)", i, i + 1, ret, strerror(-ret)) : 0;
}

static int fault_kill(char *what, size_t len)
{
	if (rnd(2)) {
		int r = (int)rnd(NWORKERS), hold = rnd_ms(0, 2000);

		snprintf(what, len, "kill -9 worker %d, a replacement (takeover) after %d ms", r, hold);
		kill(wpid[r], SIGKILL);
		waitpid(wpid[r], NULL, 0);
		wpid[r] = 0;
		if (nap(hold))
			return -1;
		worker_start(r, 1);
		return 0;
	}
	int i = pick_server(false), hold = rnd_ms(200, 4000);

	snprintf(what, len, "kill -9 server %d (member %d), restarted after %d ms", i, i + 1, hold);
	it_server_kill(&clu, i);
	if (nap(hold))
		return -1;
	return server_restart(i);
}

static int fault_stop(char *what, size_t len)
{
	int hold = rnd_ms(300, 5000);

	if (rnd(3) == 0) {
		int r = (int)rnd(NWORKERS);

		snprintf(what, len, "SIGSTOP worker %d for %d ms", r, hold);
		kill(wpid[r], SIGSTOP);
		int ret = nap(hold);
		kill(wpid[r], SIGCONT);
		return ret;
	}
	int i = pick_server(false);

	snprintf(what, len, "SIGSTOP server %d (member %d) for %d ms", i, i + 1, hold);
	kill(clu.pid[i], SIGSTOP);
	int ret = nap(hold);
	kill(clu.pid[i], SIGCONT);
	return ret;
}

static int fault_term(char *what, size_t len)
{
	int i = pick_server(false), hold = rnd_ms(200, 3000), ret;

	snprintf(what, len, "SIGTERM server %d (member %d), restarted after %d ms", i, i + 1, hold);
	kill(clu.pid[i], SIGTERM);
	ret = it_server_wait_exit(&clu, i, 30000);
	if (ret == -ETIMEDOUT) {
		it_server_kill(&clu, i);
		return fail("server %d did not exit within 30 s of SIGTERM", i);
	}
	if (ret)
		fprintf(stderr, "soak: [server %d exited with status %d after SIGTERM]\n", i, ret);
	if (nap(hold))
		return -1;
	return server_restart(i);
}

static int fault_partition(char *what, size_t len)
{
	int i = pick_server(false), hold = rnd_ms(500, 6000), ret;

	snprintf(what, len, "server %d (member %d) cut off from its peers for %d ms", i, i + 1, hold);
	kill(clu.pid[i], SIGUSR1);
	ret = nap(hold);
	kill(clu.pid[i], SIGUSR2);
	return ret;
}

static int fault_move(char *what, size_t len)
{
	static struct rps__smap m;
	uint64_t ids[RPS__SMAP_MAX_MEMBERS];
	int n = 0;

	if (get_map(&m))
		return -1;
	uint32_t part = (uint32_t)rnd(m.npart);
	for (uint32_t k = 0; k < m.nmembers; k++) {
		int i = it_member_index(&clu, m.members[k].id);
		if (m.members[k].id != m.parts[part].owner && i >= 0 && clu.pid[i] > 0 && !is_witness(i))
			ids[n++] = m.members[k].id;
	}
	if (!n) {
		snprintf(what, len, "no member to move partition %u to", part);
		return 1;
	}
	uint64_t to = ids[rnd((uint64_t)n)];
	snprintf(what, len, "psctl move %u %" PRIu64 " (from member %" PRIu64 ")", part, to, m.parts[part].owner);
	return psctl(60, "move %u %" PRIu64, part, to);
}

/* The fewest and most partitions a running member that holds data owns. */
static int owned_spread(uint32_t *least, uint32_t *most)
{
	static struct rps__smap m;

	if (get_map(&m))
		return -1;
	*most = 0;
	*least = UINT32_MAX;
	for (uint32_t k = 0; k < m.nmembers; k++) {
		int i = it_member_index(&clu, m.members[k].id);
		uint32_t n = rps__smap_owned(&m, m.members[k].id);
		if (i < 0 || clu.pid[i] <= 0 || is_witness(i))
			continue;
		*most = n > *most ? n : *most;
		*least = n < *least ? n : *least;
	}
	return 0;
}

static int fault_rebalance(char *what, size_t len)
{
	uint32_t least, most;

	if (owned_spread(&least, &most))
		return -1;
	snprintf(what, len, "psctl rebalance (the running members own %u to %u partitions)", least, most);
	if (psctl(60, "rebalance") || owned_spread(&least, &most))
		return -1;
	if (most > least + 1)
		return fail("psctl rebalance left the running members owning %u to %u partitions", least, most);
	return 0;
}

static int fault_membership(char *what, size_t len)
{
	int members = running_members();
	bool add = members < MAX_MEMBERS && (members <= MIN_SERVERS || rnd(2));

	if (witness) {
		snprintf(what, len, "not with a witness (its 2 data servers stay)");
		return 1;
	}
	if (add && clu.nservers >= IT_MAX_SERVERS)
		add = false;
	if (!add && members <= MIN_SERVERS) {
		snprintf(what, len, "no member slot left to add, and %d members to keep", members);
		return 1;
	}
	if (add) {
		struct it_server_opts o = { .extra_args = server_extra, .env = "RPS_FAULT=isolate-signals",
					    .data_dir = 1 };
		uint64_t id = (uint64_t)clu.nservers + 1;
		int i;

		/* --cluster: the members running now (the first ones may be
		 * gone; the joiner dials only those it is given) */
		snprintf(clu.servers, sizeof(clu.servers), "%s", servers_now());
		i = it_server_join(&clu, id, &o);

		snprintf(what, len, "add-server %" PRIu64 " (a new rdmapsd --join)", id);
		if (i < 0)
			return fail("rdmapsd --join %" PRIu64 ": %d (%s)", id, i, strerror(-i));
		return psctl(120, "add-server %" PRIu64 " %s", id, clu.uri[i]);
	}
	int i = pick_server(true), ret;

	snprintf(what, len, "remove-server %d", i + 1);
	if (psctl(120, "remove-server %d", i + 1))
		return -1;
	ret = it_server_wait_exit(&clu, i, 20000);
	if (ret == -ETIMEDOUT) {
		it_server_kill(&clu, i);
		return fail("member %d removed but still running 20 s later", i + 1);
	}
	return 0;
}

static int fault_replicas(char *what, size_t len)
{
	if (witness || running_members() < 3) {
		snprintf(what, len, "set-replicas 3 needs 3 data servers");
		return 1;
	}
	snprintf(what, len, "set-replicas 3, settled, set-replicas 2");
	if (psctl(60, "set-replicas 3") || settle(3))
		return -1;
	return psctl(60, "set-replicas 2");
}

/* The last checkpoint: what it may hold. */
static struct {
	int n;				/* checkpoints taken */
	long long lo[NCOUNTED], hi[NCOUNTED];
	int step_lo, step_hi;
} ck;

static int min_step(void)
{
	int m = atomic_load(&sh->step[0]);

	for (int r = 1; r < NWORKERS; r++)
		if (atomic_load(&sh->step[r]) < m)
			m = atomic_load(&sh->step[r]);
	return m;
}

static int max_step(void)
{
	int m = 0;

	for (int r = 0; r < NWORKERS; r++)
		if (atomic_load(&sh->step[r]) > m)
			m = atomic_load(&sh->step[r]);
	return m;
}

static int fault_ckpt(char *what, size_t len)
{
	long long lo[NCOUNTED];
	int slo = min_step();

	for (int k = 0; k < NCOUNTED; k++)
		lo[k] = sum_of(sh->acked[k]);
	snprintf(what, len, "psctl checkpoint soak%d under training", ck.n + 1);
	if (psctl(60, "checkpoint soak%d", ck.n + 1))
		return -1;
	ck.n++;
	for (int k = 0; k < NCOUNTED; k++) {
		ck.lo[k] = lo[k];
		ck.hi[k] = sum_of(sh->started[k]);
	}
	ck.step_lo = slo;
	ck.step_hi = max_step() + 1;
	return 0;
}

/* ---- the end ------------------------------------------------------------------------------ */

/* A fresh client's pull of every shard: counts within [lo, hi] and
 * untorn; what it says goes to stderr.  0 or -1. */
static int final_counted(const char *servers, int k, long long lo, long long hi, const char *when)
{
	static float p[COUNT];
	uint64_t version;
	int ret = it_pull_fresh(servers, tname[k], p, COUNT, 60000, &version);

	if (ret)
		return fail("%s: a fresh client's pull of '%s' failed: %d", when, tname[k], ret);
	for (uint32_t s0 = 0; s0 < COUNT; s0 += SHARD_ELEMS) {
		float c = p[s0] / weight(s0);
		for (uint32_t i = s0; i < s0 + SHARD_ELEMS; i++)
			if (p[i] != c * weight(i) || c != (float)(long long)c)
				return fail("%s: '%s' shard %u torn or not whole: element %u is %.1f, element %u %.1f",
					    when, tname[k], s0 / SHARD_ELEMS, i, (double)p[i], s0, (double)p[s0]);
		if ((long long)c < lo)
			return fail("%s: '%s' shard %u holds %.0f pushes, %lld were acknowledged: %lld lost", when,
				    tname[k], s0 / SHARD_ELEMS, (double)c, lo, lo - (long long)c);
		if ((long long)c > hi)
			return fail("%s: '%s' shard %u holds %.0f pushes, only %lld were started: %lld applied twice",
				    when, tname[k], s0 / SHARD_ELEMS, (double)c, hi, (long long)c - hi);
	}
	return 0;
}

/* A fresh client's pull of the sync tensor: the reference at a step in
 * [lo, hi] (its version); *step receives it. */
static int final_sync(const char *servers, int lo, int hi, int *step, const char *when)
{
	static float p[SYNC_COUNT], ref[SYNC_COUNT];
	uint64_t version;
	int ret = it_pull_fresh(servers, tname[2], p, SYNC_COUNT, 60000, &version);

	if (ret)
		return fail("%s: a fresh client's pull of '%s' failed: %d", when, tname[2], ret);
	if (version < (uint64_t)lo || version > (uint64_t)hi)
		return fail("%s: '%s' is at step %" PRIu64 ", not in [%d, %d]", when, tname[2], version, lo, hi);
	memset(ref, 0, sizeof(ref));
	for (int s = 0; s < (int)version; s++)
		ref_step(ref, s);
	for (uint32_t i = 0; i < SYNC_COUNT; i++)
		if (memcmp(&p[i], &ref[i], sizeof(float)))
			return fail("%s: '%s' at step %" PRIu64 ": element %u is %.9g, the reference %.9g", when,
				    tname[2], version, i, (double)p[i], (double)ref[i]);
	*step = (int)version;
	return 0;
}

/* Partition p's digest of tensor k on server i; a partition that holds
 * none of its shards (-ENOENT: a member that joined after the tensor was
 * made has no entry for it) is the empty digest. */
static int digest(int i, int k, uint32_t p, struct it_digest *d)
{
	int ret = i < 0 ? -EINVAL : it_part_digest(&clu, i, tname[k], p, d);

	if (ret == -ENOENT) {
		memset(d, 0, sizeof(*d));
		ret = 0;
	}
	return ret;
}

/* Every backup's digest (crc32c of versions, parameters, state, clocks and
 * push ids) equals its primary's, for every tensor and partition. */
static int replicas_identical(const char *when)
{
	static struct rps__smap m;

	if (settle(0) || get_map(&m))
		return -1;
	for (int k = 0; k < 3; k++)
		for (uint32_t p = 0; p < m.npart; p++) {
			const struct rps__smap_part *mp = &m.parts[p];
			struct it_digest prim, b;
			int ret = digest(it_member_index(&clu, mp->owner), k, p, &prim);

			if (ret)
				return fail("%s: '%s' partition %u: no digest from its primary, member %" PRIu64 ": %d",
					    when, tname[k], p, mp->owner, ret);
			for (uint32_t j = 0; j < RPS__SMAP_MAX_REPLICAS - 1 && mp->backups[j]; j++) {
				if ((ret = digest(it_member_index(&clu, mp->backups[j]), k, p, &b)))
					return fail("%s: '%s' partition %u: no digest from backup %" PRIu64 ": %d", when,
						    tname[k], p, mp->backups[j], ret);
				if (b.crc != prim.crc || b.versions != prim.versions || b.nshards != prim.nshards)
					return fail("%s: '%s' partition %u: backup %" PRIu64 " holds crc %08x, %" PRIu64
						    " updates over %u shards; its primary %" PRIu64 " crc %08x, %" PRIu64
						    " over %u", when, tname[k], p, mp->backups[j], b.crc, b.versions,
						    b.nshards, mp->owner, prim.crc, prim.versions, prim.nshards);
			}
		}
	return 0;
}

/* Stop the workers at a common sync step; each must exit 0. */
static int finish_workers(void)
{
	int stop = max_step() + 2, bad = 0;
	double until = it_now_s() + 180;

	atomic_store(&sh->stop_at, stop);
	for (int r = 0; r < NWORKERS; r++) {
		int st = -1;
		if (wpid[r] <= 0)
			continue;
		while (waitpid(wpid[r], &st, WNOHANG) == 0) {
			if (it_now_s() > until) {
				kill(wpid[r], SIGKILL);
				waitpid(wpid[r], NULL, 0);
				fail("worker %d not finished 180 s after it was told to stop at step %d (rank %d at step "
				     "%d)", r, stop, r, atomic_load(&sh->step[r]));
				st = -1;
				break;
			}
			it_sleep_ms(20);
		}
		wpid[r] = 0;
		if (st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			fail("worker %d ended with status %d: %s", r, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st),
			     sh->line[r][0] ? sh->line[r] : "(no line: it crashed)");
			bad++;
		}
	}
	return bad || why[0] ? -1 : stop;
}

/* ---- main ---------------------------------------------------------------------------------- */

static bool rdmapsd_has(const char *opt)
{
	const char *d = getenv("RDMAPSD") ? getenv("RDMAPSD") : "./rdmapsd";
	char cmd[1200], buf[16384];
	FILE *f;
	size_t n;

	snprintf(cmd, sizeof(cmd), "%s --help 2>&1", d);
	if (!(f = popen(cmd, "r")))
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	pclose(f);
	return strstr(buf, opt) != NULL;
}

/* An environment variable, NULL when unset or empty (make passes empties). */
static const char *env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

static unsigned parse_faults(const char *s)
{
	unsigned mask = 0;
	char tmp[256], *save = NULL;

	if (!s || !*s || !strcmp(s, "all"))
		return (1u << NKINDS) - 1;
	snprintf(tmp, sizeof(tmp), "%s", s);
	for (char *w = strtok_r(tmp, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		int k;
		for (k = 0; k < NKINDS && strcmp(w, kind_name[k]); k++)
			;
		if (k == NKINDS) {
			fprintf(stderr, "soak: SOAK_FAULTS: unknown fault kind '%s' (kinds: kill, stop, term, partition, "
				"move, membership, replicas, ckpt, restore)\n", w);
			exit(2);
		}
		mask |= 1u << k;
	}
	return mask;
}

int main(void)
{
	const char *e;
	unsigned seconds = (e = env("SOAK_SECONDS")) ? (unsigned)strtoul(e, NULL, 10) : 600;
	unsigned long long seed = (e = env("SOAK_SEED")) ? strtoull(e, NULL, 0) :
		(unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 16);
	unsigned faults = parse_faults(env("SOAK_FAULTS"));
	int injected[NKINDS] = { 0 }, survived[NKINDS] = { 0 }, skipped[NKINDS] = { 0 }, nkinds = 0;
	int kinds[NKINDS], stop = 0, ret;
	struct it_server_opts o = { .extra_args = SERVER_ARGS, .env = "RPS_FAULT=isolate-signals", .data_dir = 1 };
	double t0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	witness = (e = env("SOAK_WITNESS")) && !strcmp(e, "1");
	if (witness && !rdmapsd_has("--witness")) {
		printf("soak: SKIP: SOAK_WITNESS=1, but this rdmapsd has no --witness yet\n");
		return 77;
	}
#ifndef RPS_FAULT_INJECTION
	/* the partition: SIGUSR1 to a server started with isolate-signals */
	if (faults & (1u << K_PARTITION)) {
		printf("soak: SKIP: the partition fault needs the test hooks, and this rdmapsd was built "
		       "without --enable-fault-injection: configure with it to run this test "
		       "(or leave partition out of SOAK_FAULTS)\n");
		return 77;
	}
#endif
	for (int k = 0; k < NKINDS; k++)
		if (faults & (1u << k) && k != K_RESTORE)	/* (restore: at the end) */
			kinds[nkinds++] = k;
	rng = mix(seed) | 1;
	printf("soak: seed %llu, %u s, faults %s%s (replay: make check-soak SOAK_SEED=%llu SOAK_SECONDS=%u%s%s%s)\n",
	       seed, seconds, env("SOAK_FAULTS") ? env("SOAK_FAULTS") : "all", witness ? ", with a witness" : "",
	       seed, seconds, env("SOAK_FAULTS") ? " SOAK_FAULTS=" : "",
	       env("SOAK_FAULTS") ? env("SOAK_FAULTS") : "", witness ? " SOAK_WITNESS=1" : "");

	/* bounded: the run, the end's checks and restore, and then some */
	signal(SIGPIPE, SIG_IGN);
	watchdog_init("soak", seconds + 900, kill_everything);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	sh = it_shared_map("soak", sizeof(*sh));
	if (!sh)
		return 1;

	/* the servers' logs go to one file (each line names no member: the
	 * driver's own lines say which fault came when) */
	snprintf(log_path, sizeof(log_path), "%s", (e = env("SOAK_LOG")) ? e : "soak-servers.log");
	FILE *lf = fopen(log_path, "w");
	if (lf)
		fclose(lf);
	char last[64];
	snprintf(server_extra, sizeof(server_extra), "%s 2>>%s", SERVER_ARGS, log_path);
	o.extra_args = server_extra;
	snprintf(last, sizeof(last), "--witness");
	if (witness)
		o.last_args = last;
	watchdog_arm();
	if ((ret = it_cluster_start_opts(&clu, 3, &o)))
		return fail("starting 3 rdmapsd: %d (%s)", ret, strerror(-ret)), 1;
	t0 = it_now_s();
	if (settle(2))
		goto end;
	for (int r = 0; r < NWORKERS; r++)
		worker_start(r, 0);
	printf("soak: %d servers (%s), %d workers; server logs in %s\n", clu.nservers, clu.servers, NWORKERS,
	       log_path);

	while (!why[0] && it_now_s() - t0 < seconds) {
		char what[256] = "";
		int step0[NWORKERS], k, r;
		long long acked0;

		if (nap(rnd_ms(500, 3000)) || !nkinds)
			continue;
		k = kinds[rnd((uint64_t)nkinds)];
		for (int w = 0; w < NWORKERS; w++)
			step0[w] = atomic_load(&sh->step[w]);
		acked0 = sum_of(sh->acked[T_ASYNC]);
		double tf = it_now_s();
		switch (k) {
		case K_KILL: r = fault_kill(what, sizeof(what)); break;
		case K_STOP: r = fault_stop(what, sizeof(what)); break;
		case K_TERM: r = fault_term(what, sizeof(what)); break;
		case K_PARTITION: r = fault_partition(what, sizeof(what)); break;
		case K_MOVE: r = fault_move(what, sizeof(what)); break;
		case K_REBALANCE: r = fault_rebalance(what, sizeof(what)); break;
		case K_MEMBERSHIP: r = fault_membership(what, sizeof(what)); break;
		case K_REPLICAS: r = fault_replicas(what, sizeof(what)); break;
		default: r = fault_ckpt(what, sizeof(what)); break;
		}
		if (r == 1) {
			skipped[k]++;
			printf("soak: %6.1f s  %-10s skipped: %s\n", tf - t0, kind_name[k], what);
			continue;
		}
		injected[k]++;
		printf("soak: %6.1f s  %-10s %s\n", tf - t0, kind_name[k], what);
		if (r || settle(2) || progressed(step0, acked0))
			break;
		survived[k]++;
		printf("soak: %6.1f s  %-10s survived: settled and progressing after %.1f s (sync step %d, %lld async "
		       "pushes)\n", it_now_s() - t0, kind_name[k], it_now_s() - tf, min_step(),
		       sum_of(sh->acked[T_ASYNC]));
	}

	/* the end: the workers stop at one sync step, then the checks */
	stop = finish_workers();
	if (why[0])
		goto end;
	printf("soak: workers done at sync step %d; %lld async, %lld bounded pushes acknowledged (%lld bounded "
	       "pushes a replacement's predecessor had made, not made again), %lld pulls checked\n",
	       stop, sum_of(sh->acked[T_ASYNC]), sum_of(sh->acked[T_BOUNDED]),
	       (long long)atomic_load(&sh->bounded_skipped), (long long)atomic_load(&sh->pulls));
	if (settle(2))
		goto end;
	{
		int step;
		for (int k = 0; k < NCOUNTED; k++)
			if (final_counted(servers_now(), k, sum_of(sh->acked[k]), sum_of(sh->started[k]), "at the end"))
				goto end;
		if (final_sync(servers_now(), stop, stop, &step, "at the end") || replicas_identical("at the end"))
			goto end;
		if (faults & (1u << K_RESTORE)) {
			/* the last checkpoint, restored now that nobody trains: a
			 * consistent cut of what was acknowledged while it was
			 * taken, on every replica (none taken: one of the
			 * quiesced tensors, now) */
			char what[64];
			if (!ck.n && fault_ckpt(what, sizeof(what)))
				goto end;
			injected[K_RESTORE]++;
			printf("soak: restoring checkpoint soak%d (taken between sync steps %d and %d)\n", ck.n,
			       ck.step_lo, ck.step_hi);
			if (psctl(120, "restore soak%d", ck.n) || settle(2))
				goto end;
			for (int k = 0; k < NCOUNTED; k++)
				if (final_counted(servers_now(), k, ck.lo[k], ck.hi[k], "the restored checkpoint"))
					goto end;
			if (final_sync(servers_now(), ck.step_lo, ck.step_hi, &step, "the restored checkpoint") ||
			    replicas_identical("the restored checkpoint"))
				goto end;
			survived[K_RESTORE]++;
			printf("soak: the restored checkpoint is consistent (sync step %d, the reference's) on every "
			       "replica\n", step);
		}
	}
end:
	kill_everything();
	for (int r = 0; r < NWORKERS; r++)
		if (wpid[r] > 0)
			waitpid(wpid[r], NULL, 0);
	for (int i = 0; i < clu.nservers; i++)
		if (clu.pid[i] > 0)
			kill(clu.pid[i], SIGCONT);
	it_cluster_stop(&clu);
	watchdog_disarm();
	int total_i = 0, total_s = 0;
	for (int k = 0; k < NKINDS; k++) {
		if (!(faults & (1u << k)))
			continue;
		printf("soak: %-10s injected %3d, survived %3d%s", kind_name[k], injected[k], survived[k],
		       skipped[k] ? "" : "\n");
		if (skipped[k])
			printf(", skipped %d (not applicable then)\n", skipped[k]);
		total_i += injected[k];
		total_s += survived[k];
	}
	if (why[0]) {
		printf("soak: FAIL seed %llu after %.0f s: %d faults injected, %d survived: %s\n", seed,
		       it_now_s() - t0, total_i, total_s, why);
		printf("soak: replay: make check-soak SOAK_SEED=%llu SOAK_SECONDS=%u%s%s%s; the servers' log: %s\n",
		       seed, seconds, env("SOAK_FAULTS") ? " SOAK_FAULTS=" : "",
		       env("SOAK_FAULTS") ? env("SOAK_FAULTS") : "", witness ? " SOAK_WITNESS=1" : "", log_path);
		return 1;
	}
	printf("soak: PASS seed %llu, %.0f s: %d faults injected, %d survived; %lld async + %lld bounded pushes "
	       "exact, %d sync steps bit-identical, replicas identical\n", seed, it_now_s() - t0, total_i, total_s,
	       sum_of(sh->acked[T_ASYNC]), sum_of(sh->acked[T_BOUNDED]), stop);
	return 0;
}
