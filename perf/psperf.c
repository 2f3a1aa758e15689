/*
 * psperf.c - the rdmaps benchmark: what perftest is to verbs, psperf is to
 * rdmaps.
 *
 * Three roles:
 *  - local (the default): start --servers in-process servers (threads running
 *    the server core of server.h) and --workers worker threads, each with its
 *    own rps_client, run the tests, print one table per test, shut down;
 *  - --server: run one server core until SIGINT/SIGTERM (with --baseline,
 *    also the raw responders that workers' baselines talk to);
 *  - --connect: run as one worker of an existing cluster.
 *
 * Tests: push, pull, pushpull (one training step), lock (the shard's CAS
 * version lock, alone and contended), agg (the server's aggregation,
 * rps__agg_add, against memcpy of the same bytes), commit (one Raft log
 * entry: ADMIN NOP to the leader of a 3-server group with data dirs,
 * against the STATUS round trip on the same admin connection; its own
 * cluster, started after the other tests' one is gone), crc and igzip (the
 * checkpoint file's kernels: ISA-L CRC-32C and level-1 raw deflate of fp32
 * parameter-like data and of zeros, against memcpy, in-process).
 *
 * How figures are taken: latency columns come from blocking calls timed one
 * by one with CLOCK_MONOTONIC after the warm-up, every worker at once, the
 * samples of all workers merged and sorted; bandwidth and ops/s come from a
 * second pass with the non-blocking API and --window requests in flight per
 * worker (perftest's tx-depth), total payload bytes over wall time.
 *
 * --baseline measures the raw operation on the same path in the same run:
 * plain TCP sockets over tcp, and RDMA WRITE / READ / CAS / SEND through
 * transport.h over verbs; every row then carries the ratio of our figure to
 * the raw one.  All output goes through small table / CSV / JSON writers at
 * the end of the file.
 */
#include "config.h"
#include "kernels/agg.h"
#include "client/client.h"
#include "common/common.h"
#include "client/ctl.h"
#include "common/parse.h"
#include "proto/proto.h"
#include "control/raft.h"
#include "control/daemon.h"
#include "server/server.h"
#include "transport/transport.h"
#include "transport/uri.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <ifaddrs.h>
#include <isa-l/crc.h>
#include <isa-l/igzip_lib.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"

#define MAX_BYTES (64u << 20)		/* largest --size */
#define AUTO_BYTES (256ull << 20)	/* default iterations: about this many bytes a pass */
#define AUTO_ITERS_MAX 1000L
#define AUTO_ITERS_MIN 20L
#define MAX_LOCAL 64			/* --servers / --workers in local mode */
#define SOCK_MAGIC 0x4b434f53u		/* "SOCK" */
#define RAWT_MAGIC 0x54574152u		/* "RAWT" */
#define RAWT_NRX 2u
#define SOCK_PORT_OFFSET 1		/* --server --baseline: socket responder on port+1 */
#define RAWT_PORT_OFFSET 2		/* ... transport responder on port+2 */

/* ---- options -------------------------------------------------------------- */

enum test_id { T_PUSH, T_PULL, T_PUSHPULL, T_LOCK, T_AGG, T_COMMIT, T_CRC, T_IGZIP, T_NTESTS };
static const char *const test_names[T_NTESTS] = { "push", "pull", "pushpull", "lock", "agg", "commit", "crc",
						  "igzip" };
/* all = the data-plane tests; commit (a cluster of its own), crc and igzip
 * (checkpoint kernels, in-process) only when named */
#define DEFAULT_TESTS ((1u << T_COMMIT) - 1)
#define COMMIT_SERVERS 3		/* commit test, local mode: a Raft group of three */

/* Tests measured in-process, without a cluster: agg, crc, igzip. */
static bool in_process(enum test_id t)
{
	return t == T_AGG || t == T_CRC || t == T_IGZIP;
}

enum role { ROLE_LOCAL, ROLE_SERVER, ROLE_WORKER };

struct opts {
	enum role role;
	unsigned tests;
	int nservers, nworkers;
	bool nservers_set;		/* --servers given (commit: else COMMIT_SERVERS) */
	bool fsync_none;		/* --fsync none (commit test, --server) */
	size_t size_min, size_max;
	unsigned factor;
	long iters, warmup;		/* -1: automatic */
	int window;
	enum rps_mode mode;
	uint32_t staleness;
	enum rps_dtype dtype;
	enum rps_optimizer optimizer;
	enum rps__kind kind;
	bool kind_set;
	const char *device, *addr;
	bool baseline, raw_transport;
	const char *json, *label, *tag;
	bool csv, quiet;
	const char *listen, *cluster;
	int index;
	const char *connect;
	int rank, num_workers;
	uint32_t shard_bytes, slots;
	int spin_us, timeout_ms;
	int argc;
	char **argv;
};

/* ---- statistics ----------------------------------------------------------- */

struct samples {
	uint64_t *v;		/* nanoseconds */
	size_t n, cap;
};

struct stats {
	bool valid;
	uint64_t n;
	double min, typ, avg, p99, p999;	/* microseconds */
	double gbs, ops;			/* GB/s (1e9 bytes), operations per second */
};

/* A pass: per-op samples plus the wall-clock span they were taken in. */
struct pass {
	struct samples s;
	uint64_t t0, t1;
};

/* ---- the plan ------------------------------------------------------------- */

enum raw_op {
	RAW_NONE,
	RAW_SOCK_RR,		/* socket: a bytes there, b bytes back */
	RAW_SOCK_STREAM,	/* socket: one-way stream of a-byte messages */
	RAW_WRITE,		/* transport: WRITE of a bytes + its completion */
	RAW_READ,
	RAW_CAS,
	RAW_SEND_PP,		/* transport: SEND a bytes, the peer SENDs b back */
	RAW_WRITE_BW,		/* transport: WRITEs of a bytes, --window in flight */
	RAW_READ_BW,
	RAW_MEMCPY,		/* in-process memcpy of W buffers of a bytes */
};

struct raw_result {
	enum raw_op op;
	size_t a, b;
	long iters, count;
	bool is_bw;
	bool transport_tcp;	/* a transport op run over the tcp transport */
	struct stats st;
	char name[64];
	int err;
};

struct row {
	enum test_id test;
	size_t bytes;		/* the row's --size (gradient bytes) */
	double moved;		/* payload bytes one operation moves */
	char label[32];		/* lock / agg / commit / igzip rows */
	bool zeros;		/* igzip: of zeros, not parameter-like floats */
	double ratio;		/* igzip: input bytes / deflated bytes */
	int workers;		/* workers doing the operation at once */
	bool lock_alone;
	bool lock_release;	/* the release half of a lock pair */
	bool commit_rtt;	/* commit test: the STATUS round trip row */
	long iters, warmup;
	struct pass lat, bw;	/* merged over workers */
	struct stats s_lat, s_bw;
	struct raw_result *raw_lat, *raw_bw;
	struct raw_result *raw_x[2];	/* --raw-transport extras over tcp */
	double x_lat, x_bw;
	double x_rtt;		/* commit row: its t_typ / the admin round trip's */
};

struct worker;

struct run {
	struct opts *o;
	struct row *rows;
	size_t nrows;
	size_t *sizes;
	size_t nsizes;
	int W;			/* workers taking part in the cluster */
	int nservers;		/* servers of the cluster */
	enum rps__kind kind;
	char addr[256];		/* local: where servers listen; baseline: where peers are */
	char device[64];
	char servers[4096];
	char cpu[128];
	struct raw_result *raws;
	size_t nraws;
	bool remote_peer;
	uint16_t sock_port, rawt_port;
	char base_err[600];	/* the first baseline failure */
	/* the commit test */
	char commit_servers[4096];
	uint64_t commit_leader, commit_term;
	int commit_voters;
	int commit_fsync;	/* what the leader's STATUS says: 1 always, 0 none, -1 unknown */
	/* progress, written by worker 0, read by the main thread */
	atomic_long prog_row, prog_done, prog_total;
	atomic_int prog_phase;
	/* local orchestration */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int nfinished;
	bool failed;
	char err[1024];
};

struct baseline;

struct worker {
	struct run *run;
	int rank;
	struct baseline *bl;	/* worker 0 with --baseline */
	pthread_t thread;
	rps_client_t *cl;
	rps_tensor_t **tens;	/* one per size index */
	rps_tensor_t *lockt;
	void *grad;
	float *pull;
	struct pass *lat, *bw;	/* per row */
	int status;
	char err[1024];
};

/* ---- small helpers -------------------------------------------------------- */

static void die_usage(const char *fmt, ...) RPS__PRINTF(1, 2);

static void die_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "psperf: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (psperf --help lists the options)\n");
	exit(2);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (!p) {
		fprintf(stderr, "psperf: out of memory (%zu x %zu bytes): lower --size / --sweep or --workers\n", n, size);
		exit(1);
	}
	return p;
}

static void *xalloc_aligned(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, len ? len : 1)) {
		fprintf(stderr, "psperf: out of memory (%zu bytes): lower --size / --sweep or --workers\n", len);
		exit(1);
	}
	memset(p, 0, len);
	return p;
}

static const char *human(size_t b, char *buf, size_t len)
{
	if (b >= (1u << 20) && b % (1u << 20) == 0)
		snprintf(buf, len, "%zu MiB", b >> 20);
	else if (b >= 1024 && b % 1024 == 0)
		snprintf(buf, len, "%zu KiB", b >> 10);
	else
		snprintf(buf, len, "%zu B", b);
	return buf;
}

static bool is_pow2(size_t x)
{
	return x && !(x & (x - 1));
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- samples and statistics ------------------------------------------------ */

static void samples_reserve(struct samples *s, size_t n)
{
	if (n <= s->cap)
		return;
	s->v = realloc(s->v, n * sizeof(*s->v));
	if (!s->v) {
		fprintf(stderr, "psperf: out of memory for %zu samples: lower --iters\n", n);
		exit(1);
	}
	s->cap = n;
}

static void samples_add(struct samples *s, uint64_t ns)
{
	if (s->n == s->cap)
		samples_reserve(s, s->cap ? s->cap * 2 : 1024);
	s->v[s->n++] = ns;
}

static void samples_free(struct samples *s)
{
	free(s->v);
	memset(s, 0, sizeof(*s));
}

static void pass_merge(struct pass *dst, const struct pass *src)
{
	size_t i;

	if (!src->s.n)
		return;
	samples_reserve(&dst->s, dst->s.n + src->s.n);
	for (i = 0; i < src->s.n; i++)
		dst->s.v[dst->s.n++] = src->s.v[i];
	if (!dst->t0 || src->t0 < dst->t0)
		dst->t0 = src->t0;
	if (src->t1 > dst->t1)
		dst->t1 = src->t1;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Value at quantile q of a sorted array: the smallest sample with at least
 * q of the samples at or below it. */
static double quantile_us(const uint64_t *v, size_t n, double q)
{
	size_t i = (size_t)ceil(q * (double)n);

	if (i < 1)
		i = 1;
	if (i > n)
		i = n;
	return (double)v[i - 1] / 1e3;
}

/* Sort the pass's samples and fill st; bytes_per_op gives the bandwidth. */
static void stats_compute(struct stats *st, struct pass *p, double bytes_per_op)
{
	double sum = 0, wall;
	size_t i, n = p->s.n;

	memset(st, 0, sizeof(*st));
	if (!n)
		return;
	qsort(p->s.v, n, sizeof(*p->s.v), cmp_u64);
	for (i = 0; i < n; i++)
		sum += (double)p->s.v[i];
	st->valid = true;
	st->n = n;
	st->min = (double)p->s.v[0] / 1e3;
	st->typ = (double)p->s.v[(n - 1) / 2] / 1e3;
	st->avg = sum / (double)n / 1e3;
	st->p99 = quantile_us(p->s.v, n, 0.99);
	st->p999 = quantile_us(p->s.v, n, 0.999);
	wall = (double)(p->t1 - p->t0) / 1e9;
	if (wall > 0) {
		st->ops = (double)n / wall;
		st->gbs = bytes_per_op * (double)n / wall / 1e9;
	}
}

/* ---- usage ---------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
"usage: psperf [options]                         local cluster: servers + workers in this process\n"
"       psperf --server --listen URI [--cluster LIST --index I] [--baseline]\n"
"       psperf --connect LIST --rank R --num-workers N [options]\n"
"\n"
"Measures rdmaps the way perftest measures verbs.  With no option it starts\n"
"1 server and 2 workers on the best transport here (verbs if an RDMA device is\n"
"present, on that device's address; else TCP on 127.0.0.1), runs a short sweep\n"
"of every test and prints one table per test.\n"
"\n"
"Tests:\n"
"  -t, --test LIST        comma-separated: push, pull, pushpull, lock, agg, commit,\n"
"                         crc, igzip, or all (default all: every test but commit,\n"
"                         crc and igzip).  push:\n"
"                         rps_push of the gradient; pull: rps_pull of the\n"
"                         parameters; pushpull: one training step\n"
"                         (push then pull); lock: rps__tensor_lock + unlock of one\n"
"                         shard, by 1 worker alone and by all workers contending;\n"
"                         agg: rps__agg_add of W gradients into an fp32\n"
"                         accumulator vs memcpy of the same bytes (in-process);\n"
"                         commit: the latency of one Raft log entry (ADMIN NOP to\n"
"                         the leader: append to followers, acks, commit, apply)\n"
"                         against the STATUS round trip on the same admin\n"
"                         connection.  Local mode: a cluster of its own, 3 servers\n"
"                         (or --servers N) with data dirs in $TMPDIR or /tmp,\n"
"                         removed after; --connect: that cluster's leader.\n"
"                         crc: CRC-32C (ISA-L crc32_iscsi) of fp32 parameter-like\n"
"                         data vs memcpy of the same bytes; igzip: ISA-L raw\n"
"                         deflate, level 1, of fp32 parameter-like data (small\n"
"                         normal-ish floats) and of zeros, vs memcpy, with the\n"
"                         compression ratio (in-process, one thread: what a\n"
"                         checkpoint costs per byte)\n"
"  -s, --size BYTES       one size (K, M suffixes: 4K, 1M; at most 64M)\n"
"  -S, --sweep MIN:MAX[:F]  every power of two from MIN to MAX, multiplying by F\n"
"                         (a power of two, default 2); default 4:1M:8\n"
"  -n, --iters N          timed iterations per row (default: 1000, fewer for big\n"
"                         sizes: about 256 MiB a pass, at least 20)\n"
"  -w, --warmup N         untimed iterations first (default iters/10, 2..100)\n"
"  -W, --window N         requests in flight per worker in the bandwidth pass\n"
"                         (default 8; 1 = no separate pass: bandwidth from the\n"
"                         latency pass)\n"
"  -m, --mode MODE        sync, bounded or async (default async: a push returns\n"
"                         once applied, so its latency is the push's own; in sync\n"
"                         mode every worker pushes every iteration; a push that\n"
"                         comes before its rank's turn is set aside).  The lock test\n"
"                         always uses an async tensor.\n"
"      --staleness K      bounded mode's k (default 4)\n"
"  -d, --dtype T          gradient type f32, bf16 or f16 (default f32)\n"
"      --optimizer O      sum, sgd, momentum or adam (default sum)\n"
"      --fsync always|none  commit test (and --server): sync the Raft log before\n"
"                         acknowledging an entry, or not (default always)\n"
"\n"
"Cluster (local mode):\n"
"      --servers N        in-process servers (default 1; commit: 3)\n"
"      --workers N        worker threads, each its own client (default 2)\n"
"      --transport T      tcp or verbs (default verbs if a device is found)\n"
"      --device NAME      RDMA device (default: the first with an IPv4 address)\n"
"      --addr ADDR        address to listen on / reach the device by\n"
"                         (default: the device's address; tcp: 127.0.0.1)\n"
"      --shard-size BYTES parameter bytes per shard (default 1M)\n"
"      --slots N          staging slots per worker connection (default 8)\n"
"      --spin-us US       servers and workers busy-poll this long before\n"
"                         sleeping (default 0; perftest always busy-polls)\n"
"      --timeout-ms MS    give up on one operation after this (default 30000)\n"
"\n"
"Separate processes / hosts:\n"
"      --server           run one server until SIGINT/SIGTERM\n"
"      --listen URI       its address: tcp://HOST:PORT or verbs://ADDR:PORT\n"
"      --cluster LIST     every server's URI, same order everywhere\n"
"      --index I          this server's place in LIST (default: found by --listen)\n"
"      --connect LIST     run as one worker of that cluster (servers' URIs);\n"
"                         -t commit alone needs no --rank / --num-workers\n"
"      --rank R           this worker's rank, 0..N-1\n"
"      --num-workers N    workers taking part (all run psperf --connect with the\n"
"                         same test options; they start together with\n"
"                         rps_barrier; each prints its own figures)\n"
"      --tag STR          tensor name prefix (default psperf; use a new one for\n"
"                         each run against a long-running cluster)\n"
"\n"
"Baseline and output:\n"
"  -b, --baseline         also measure the raw transport on the same path and\n"
"                         print our figure / raw figure on every row.  tcp: plain\n"
"                         sockets (TCP_NODELAY): request/response of the same\n"
"                         sizes, and a one-way stream of the same bytes.  verbs:\n"
"                         RDMA WRITE, READ, CAS, SEND ping-pong and WRITE/READ\n"
"                         bandwidth through transport.h on the same device.\n"
"                         agg is always compared with memcpy.  commit: a SEND\n"
"                         ping-pong of the admin messages' sizes (tcp: socket\n"
"                         request/response).  With --connect,\n"
"                         worker 0 runs it against server 0, which must run\n"
"                         psperf --server --baseline (ports +1 and +2)\n"
"      --raw-transport    over tcp, also run the raw ops of the rdmaps tcp\n"
"                         transport (WRITE, READ, CAS, SEND) for reference\n"
"  -j, --json FILE        write every figure and the configuration as JSON\n"
"      --csv              CSV on stdout instead of the tables\n"
"      --label STR        name of this run in the JSON (perf/plot uses it)\n"
"  -q, --quiet            no progress line\n"
"  -h, --help             this text\n"
"  -V, --version          print the version\n"
"\n"
"Columns: #bytes (the --size of the row: gradient bytes), #iters (timed\n"
"operations, all workers), t_min / t_typ (median) / t_avg / t_p99 / t_p99.9 in\n"
"microseconds per blocking operation, BW (payload bytes moved per second, in\n"
"GB/s = 1e9 B/s, all workers), ops/s.  With --baseline: raw[us] (the raw op's\n"
"median), x_lat (our t_typ / raw t_typ: 1.0 is the wire, 2.0 twice as slow),\n"
"raw[GB/s], x_bw (our BW / raw BW: 1.0 is the wire, 0.5 half of it).\n"
"The commit table ends with commit t_typ / admin round trip t_typ.\n"
"Progress goes to stderr when it is a terminal.  Exit status: 0 ok, 1 a test\n"
"failed, 2 bad usage.  See psperf(1).\n");
}

/* ---- option parsing ---------------------------------------------------------- */

static int parse_size(const char *s, size_t *out)
{
	uint64_t v;

	if (rps__parse_size("size", s, 0, SIZE_MAX, &v))
		return -EINVAL;
	*out = (size_t)v;
	return 0;
}

static long parse_long(const char *s, const char *what, long min, long max)
{
	uint64_t v;

	if (rps__parse_u64(what, s, (uint64_t)min, (uint64_t)max, &v))
		die_usage("%s", rps__errbuf());
	return (long)v;
}

static void parse_sweep(struct opts *o, const char *s)
{
	char buf[128], *a, *b, *c;
	size_t f = 2;

	snprintf(buf, sizeof(buf), "%s", s);
	a = buf;
	b = strchr(a, ':');
	if (!b)
		die_usage("--sweep '%s': expected MIN:MAX[:FACTOR], e.g. 4:64M", s);
	*b++ = '\0';
	c = strchr(b, ':');
	if (c)
		*c++ = '\0';
	if (parse_size(a, &o->size_min) || parse_size(b, &o->size_max) || (c && parse_size(c, &f)))
		die_usage("--sweep '%s': MIN, MAX and FACTOR are sizes such as 8, 4K, 1M", s);
	if (!is_pow2(o->size_min) || !is_pow2(o->size_max) || o->size_min > o->size_max)
		die_usage("--sweep '%s': MIN and MAX must be powers of two, MIN <= MAX", s);
	if (!is_pow2(f) || f < 2 || f > (1u << 20))
		die_usage("--sweep '%s': FACTOR must be a power of two >= 2", s);
	o->factor = (unsigned)f;
}

static unsigned parse_tests(const char *s)
{
	char buf[256], *tok, *save = NULL;
	unsigned mask = 0;
	int i;

	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcasecmp(tok, "all")) {
			mask |= DEFAULT_TESTS;
			continue;
		}
		for (i = 0; i < T_NTESTS; i++)
			if (!strcasecmp(tok, test_names[i]))
				break;
		if (i == T_NTESTS)
			die_usage("--test: unknown test '%s' (push, pull, pushpull, lock, agg, commit, crc, igzip,"
				  " all)", tok);
		mask |= 1u << i;
	}
	if (!mask)
		die_usage("--test: give at least one test");
	return mask;
}

static enum rps_mode parse_mode(const char *s)
{
	if (!strcasecmp(s, "sync") || !strcasecmp(s, "bsp"))
		return RPS_MODE_SYNC;
	if (!strcasecmp(s, "bounded") || !strcasecmp(s, "ssp"))
		return RPS_MODE_BOUNDED;
	if (!strcasecmp(s, "async") || !strcasecmp(s, "asp"))
		return RPS_MODE_ASYNC;
	die_usage("--mode: say sync, bounded or async, not '%s'", s);
	return RPS_MODE_ASYNC;
}

static enum rps_optimizer parse_optimizer(const char *s)
{
	static const char *const names[] = { "sum", "sgd", "momentum", "adam" };
	int i;

	for (i = 0; i < 4; i++)
		if (!strcasecmp(s, names[i]))
			return (enum rps_optimizer)(RPS_OPT_SUM + i);
	die_usage("--optimizer: say sum, sgd, momentum or adam, not '%s'", s);
	return RPS_OPT_SUM;
}

static const char *mode_name(enum rps_mode m)
{
	return m == RPS_MODE_SYNC ? "sync" : m == RPS_MODE_BOUNDED ? "bounded" : "async";
}

static const char *optimizer_name(enum rps_optimizer p)
{
	static const char *const names[] = { "sum", "sgd", "momentum", "adam" };

	return p >= RPS_OPT_SUM && p <= RPS_OPT_ADAM ? names[p - RPS_OPT_SUM] : "?";
}

static void opts_init(struct opts *o, int argc, char **argv)
{
	memset(o, 0, sizeof(*o));
	o->role = ROLE_LOCAL;
	o->tests = DEFAULT_TESTS;
	o->nservers = 1;
	o->nworkers = 2;
	o->size_min = 4;
	o->size_max = 1u << 20;
	o->factor = 8;
	o->iters = -1;
	o->warmup = -1;
	o->window = 8;
	o->mode = RPS_MODE_ASYNC;
	o->staleness = 4;
	o->dtype = RPS_DTYPE_F32;
	o->optimizer = RPS_OPT_SUM;
	o->kind = RPS__KIND_TCP;
	o->tag = "psperf";
	o->index = -1;
	o->rank = -1;
	o->num_workers = -1;
	o->shard_bytes = 1u << 20;
	o->slots = 8;
	o->timeout_ms = 30000;
	o->argc = argc;
	o->argv = argv;
}

enum {
	OPT_STALENESS = 256, OPT_OPTIMIZER, OPT_SERVERS, OPT_WORKERS, OPT_TRANSPORT,
	OPT_DEVICE, OPT_ADDR, OPT_SHARD, OPT_SLOTS, OPT_SPIN, OPT_TIMEOUT, OPT_SERVER,
	OPT_LISTEN, OPT_CLUSTER, OPT_INDEX, OPT_CONNECT, OPT_RANK, OPT_NUMW, OPT_TAG,
	OPT_RAWT, OPT_CSV, OPT_LABEL, OPT_FSYNC,
};

static const struct option longopts[] = {
	{ "test", required_argument, NULL, 't' },
	{ "size", required_argument, NULL, 's' },
	{ "sweep", required_argument, NULL, 'S' },
	{ "iters", required_argument, NULL, 'n' },
	{ "warmup", required_argument, NULL, 'w' },
	{ "window", required_argument, NULL, 'W' },
	{ "mode", required_argument, NULL, 'm' },
	{ "staleness", required_argument, NULL, OPT_STALENESS },
	{ "dtype", required_argument, NULL, 'd' },
	{ "optimizer", required_argument, NULL, OPT_OPTIMIZER },
	{ "servers", required_argument, NULL, OPT_SERVERS },
	{ "workers", required_argument, NULL, OPT_WORKERS },
	{ "transport", required_argument, NULL, OPT_TRANSPORT },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "addr", required_argument, NULL, OPT_ADDR },
	{ "shard-size", required_argument, NULL, OPT_SHARD },
	{ "slots", required_argument, NULL, OPT_SLOTS },
	{ "spin-us", required_argument, NULL, OPT_SPIN },
	{ "timeout-ms", required_argument, NULL, OPT_TIMEOUT },
	{ "server", no_argument, NULL, OPT_SERVER },
	{ "listen", required_argument, NULL, OPT_LISTEN },
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "index", required_argument, NULL, OPT_INDEX },
	{ "connect", required_argument, NULL, OPT_CONNECT },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "num-workers", required_argument, NULL, OPT_NUMW },
	{ "tag", required_argument, NULL, OPT_TAG },
	{ "baseline", no_argument, NULL, 'b' },
	{ "raw-transport", no_argument, NULL, OPT_RAWT },
	{ "json", required_argument, NULL, 'j' },
	{ "csv", no_argument, NULL, OPT_CSV },
	{ "label", required_argument, NULL, OPT_LABEL },
	{ "fsync", required_argument, NULL, OPT_FSYNC },
	{ "quiet", no_argument, NULL, 'q' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

static void parse_one_size(struct opts *o, const char *arg)
{
	size_t sz;

	if (parse_size(arg, &sz) || !sz)
		die_usage("--size '%s': expected a size such as 8, 4K or 1M", arg);
	o->size_min = o->size_max = sz;
	o->factor = 2;
}

static void parse_transport(struct opts *o, const char *arg)
{
	if (!strcasecmp(arg, "tcp"))
		o->kind = RPS__KIND_TCP;
	else if (!strcasecmp(arg, "verbs") || !strcasecmp(arg, "rdma"))
		o->kind = RPS__KIND_VERBS;
	else
		die_usage("--transport: say tcp or verbs, not '%s'", arg);
	o->kind_set = true;
}

static void parse_option(struct opts *o, int c, const char *arg)
{
	size_t sz;

	switch (c) {
	case 't': o->tests = parse_tests(arg); break;
	case 's': parse_one_size(o, arg); break;
	case 'S': parse_sweep(o, arg); break;
	case 'n': o->iters = parse_long(arg, "--iters", 1, 100000000); break;
	case 'w': o->warmup = parse_long(arg, "--warmup", 0, 100000000); break;
	case 'W': o->window = (int)parse_long(arg, "--window", 1, 1024); break;
	case 'm': o->mode = parse_mode(arg); break;
	case OPT_STALENESS: o->staleness = (uint32_t)parse_long(arg, "--staleness", 0, 1000000); break;
	case 'd':
		if (rps__dtype_parse(arg, &o->dtype))
			die_usage("--dtype: say f32, bf16 or f16, not '%s'", arg);
		break;
	case OPT_OPTIMIZER: o->optimizer = parse_optimizer(arg); break;
	case OPT_SERVERS:
		o->nservers = (int)parse_long(arg, "--servers", 1, MAX_LOCAL);
		o->nservers_set = true;
		break;
	case OPT_WORKERS: o->nworkers = (int)parse_long(arg, "--workers", 1, MAX_LOCAL); break;
	case OPT_TRANSPORT: parse_transport(o, arg); break;
	case OPT_DEVICE: o->device = arg; break;
	case OPT_ADDR: o->addr = arg; break;
	case OPT_SHARD:
		if (parse_size(arg, &sz) || sz < 64 || sz % 4 || sz > (1u << 30))
			die_usage("--shard-size '%s': a multiple of 4 between 64 and 1G", arg);
		o->shard_bytes = (uint32_t)sz;
		break;
	case OPT_SLOTS: o->slots = (uint32_t)parse_long(arg, "--slots", 1, 1024); break;
	case OPT_SPIN: o->spin_us = (int)parse_long(arg, "--spin-us", 0, RPS__SERVER_SPIN_US_MAX); break;
	case OPT_TIMEOUT: o->timeout_ms = (int)parse_long(arg, "--timeout-ms", 1, 3600000); break;
	case OPT_SERVER: o->role = ROLE_SERVER; break;
	case OPT_LISTEN: o->listen = arg; break;
	case OPT_CLUSTER: o->cluster = arg; break;
	case OPT_INDEX: o->index = (int)parse_long(arg, "--index", 0, 4096); break;
	case OPT_CONNECT: o->connect = arg; o->role = ROLE_WORKER; break;
	case OPT_RANK: o->rank = (int)parse_long(arg, "--rank", 0, 1000000); break;
	case OPT_NUMW: o->num_workers = (int)parse_long(arg, "--num-workers", 1, 1000000); break;
	case OPT_TAG: o->tag = arg; break;
	case 'b': o->baseline = true; break;
	case OPT_RAWT: o->raw_transport = true; break;
	case 'j': o->json = arg; break;
	case OPT_CSV: o->csv = true; break;
	case OPT_LABEL: o->label = arg; break;
	case OPT_FSYNC:
		if (!strcasecmp(arg, "always"))
			o->fsync_none = false;
		else if (!strcasecmp(arg, "none"))
			o->fsync_none = true;
		else
			die_usage("--fsync: say always or none, not '%s'", arg);
		break;
	case 'q': o->quiet = true; break;
	default: break;
	}
}

static void check_sizes(const struct opts *o)
{
	size_t dt = rps__dtype_size(o->dtype);

	if (o->size_max > MAX_BYTES)
		die_usage("sizes are at most 64M (%zu asked)", o->size_max);
	if (o->size_min < dt || o->size_min % dt)
		die_usage("--size/--sweep: %zu bytes is not a whole number of %s elements (%zu bytes each)",
			  o->size_min, rps__dtype_name(o->dtype), dt);
}

static void check_roles(struct opts *o)
{
	if (o->role == ROLE_SERVER && !o->listen)
		die_usage("--server needs --listen tcp://HOST:PORT or verbs://ADDR:PORT");
	if (o->role == ROLE_SERVER && o->connect)
		die_usage("--server and --connect exclude each other");
	if (o->role != ROLE_WORKER && (o->rank >= 0 || o->num_workers > 0))
		die_usage("--rank and --num-workers go with --connect (local mode: --workers N)");
	if (o->role != ROLE_SERVER && (o->listen || o->cluster || o->index >= 0))
		die_usage("--listen, --cluster and --index go with --server");
	if (o->role == ROLE_WORKER && o->tests == (1u << T_COMMIT) && o->rank < 0 && o->num_workers < 1) {
		o->rank = 0;	/* the commit test alone: one admin client, no workers */
		o->num_workers = 1;
	}
	if (o->role == ROLE_WORKER) {
		if (o->rank < 0 || o->num_workers < 1)
			die_usage("--connect needs --rank R and --num-workers N");
		if (o->rank >= o->num_workers)
			die_usage("--rank %d is not below --num-workers %d", o->rank, o->num_workers);
	}
	if (strlen(o->tag) > 24)
		die_usage("--tag '%s': at most 24 characters", o->tag);
}

static void parse_args(struct opts *o, int argc, char **argv)
{
	int c;

	opts_init(o, argc, argv);
	while ((c = getopt_long(argc, argv, "t:s:S:n:w:W:m:d:bj:qhV", longopts, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			exit(0);
		}
		if (c == 'V') {
			printf("psperf %s (rdmaps %d.%d)\n", PACKAGE_VERSION, RPS_VERSION_MAJOR, RPS_VERSION_MINOR);
			exit(0);
		}
		if (c == '?' || c == ':')
			die_usage("bad option");
		parse_option(o, c, optarg);
	}
	if (optind < argc)
		die_usage("unexpected argument '%s'", argv[optind]);
	check_sizes(o);
	check_roles(o);
}

/* ---- finding the RDMA device's address ------------------------------------------ */

static bool read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	bool ok;

	if (!f)
		return false;
	ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok && buf[0];
}

static bool netdev_ipv4(const char *ifname, char *addr, size_t len)
{
	struct ifaddrs *ifa, *p;
	bool found = false;

	if (getifaddrs(&ifa))
		return false;
	for (p = ifa; p && !found; p = p->ifa_next) {
		if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET || strcmp(p->ifa_name, ifname))
			continue;
		found = inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)p->ifa_addr)->sin_addr, addr,
				  (socklen_t)len) != NULL;
	}
	freeifaddrs(ifa);
	return found;
}

/* The net device of an RDMA device: RoCE/rxe through its GID table, IPoIB
 * through /sys/class/net/X/device/infiniband/DEV. */
static bool rdma_netdev(const char *dev, char *ifname, size_t len)
{
	char path[1024];
	struct dirent *e;
	DIR *d;
	int i;

	for (i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/%d", dev, i);
		if (read_line(path, ifname, len))
			return true;
	}
	d = opendir("/sys/class/net");
	if (!d)
		return false;
	while ((e = readdir(d))) {
		snprintf(path, sizeof(path), "/sys/class/net/%.255s/device/infiniband/%.255s", e->d_name, dev);
		if (e->d_name[0] != '.' && access(path, F_OK) == 0) {
			snprintf(ifname, len, "%.63s", e->d_name);
			closedir(d);
			return true;
		}
	}
	closedir(d);
	return false;
}

/* First RDMA device (or `want`) with an IPv4 address. */
static bool rdma_device_addr(const char *want, char *dev, size_t dlen, char *addr, size_t alen)
{
	char ifname[64];
	struct dirent *e;
	bool found = false;
	DIR *d = opendir("/sys/class/infiniband");

	if (!d)
		return false;
	while (!found && (e = readdir(d))) {
		if (e->d_name[0] == '.' || (want && strcmp(want, e->d_name)))
			continue;
		if (rdma_netdev(e->d_name, ifname, sizeof(ifname)) && netdev_ipv4(ifname, addr, alen)) {
			snprintf(dev, dlen, "%.63s", e->d_name);
			found = true;
		}
	}
	closedir(d);
	return found;
}

/* Local mode: pick the transport and the address to run on. */
static int choose_fabric(struct run *r)
{
	struct opts *o = r->o;
	char dev[64] = "";

	if (!o->kind_set)
		o->kind = rps__verbs_available() ? RPS__KIND_VERBS : RPS__KIND_TCP;
	r->kind = o->kind;
	if (o->kind == RPS__KIND_TCP) {
		snprintf(r->addr, sizeof(r->addr), "%s", o->addr ? o->addr : "127.0.0.1");
		return 0;
	}
	if (!rps__verbs_available()) {
		fprintf(stderr, "psperf: --transport verbs: no RDMA device found (ibv_get_device_list): load a driver (e.g. modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0) or use --transport tcp\n");
		return -ENODEV;
	}
	if (o->addr) {
		snprintf(r->addr, sizeof(r->addr), "%s", o->addr);
		return 0;
	}
	if (!rdma_device_addr(o->device, dev, sizeof(dev), r->addr, sizeof(r->addr))) {
		fprintf(stderr, "psperf: cannot find an IPv4 address of RDMA device %s (looked in /sys/class/infiniband): give --addr ADDR\n",
			o->device ? o->device : "(any)");
		return -EADDRNOTAVAIL;
	}
	return 0;
}

/* ---- the plan: rows of every test -------------------------------------------------- */

static long row_iters(const struct opts *o, size_t bytes)
{
	long n;

	if (o->iters > 0)
		return o->iters;
	n = (long)(AUTO_BYTES / (bytes ? bytes : 1));
	return n < AUTO_ITERS_MIN ? AUTO_ITERS_MIN : n > AUTO_ITERS_MAX ? AUTO_ITERS_MAX : n;
}

static long row_warmup(const struct opts *o, long iters)
{
	long n = iters / 10;

	if (o->warmup >= 0)
		return o->warmup;
	return n < 2 ? 2 : n > 100 ? 100 : n;
}

static void plan_sizes(struct run *r)
{
	const struct opts *o = r->o;
	size_t s;

	r->sizes = xcalloc(64, sizeof(*r->sizes));
	for (s = o->size_min; s <= o->size_max && r->nsizes < 64; s *= o->factor) {
		r->sizes[r->nsizes++] = s;
		if (s > SIZE_MAX / o->factor)
			break;
	}
}

static struct row *plan_add(struct run *r, enum test_id t, size_t bytes)
{
	struct row *row = &r->rows[r->nrows++];

	memset(row, 0, sizeof(*row));
	row->test = t;
	row->bytes = bytes;
	row->workers = r->W;
	row->iters = row_iters(r->o, bytes);
	row->warmup = row_warmup(r->o, row->iters);
	return row;
}

static double moved_bytes(const struct opts *o, enum test_id t, size_t bytes)
{
	double pull = (double)(bytes / rps__dtype_size(o->dtype)) * 4.0;

	switch (t) {
	case T_PUSH: return (double)bytes;
	case T_PULL: return pull;
	case T_PUSHPULL: return (double)bytes + pull;
	default: return 0;
	}
}

static void plan_lock(struct run *r)
{
	int v, alone;

	for (v = 0; v < 4; v++) {
		struct row *row;
		alone = v < 2;
		if (!alone && r->W < 2)
			break;
		row = plan_add(r, T_LOCK, 8);
		row->lock_alone = alone;
		row->lock_release = v % 2;
		row->workers = alone ? 1 : r->W;
		row->moved = 8;
		snprintf(row->label, sizeof(row->label), "%s x%d", row->lock_release ? "release" : "acquire",
			 row->workers);
	}
}

/* commit: the entry's latency, then the admin round trip it compares with;
 * the labels get the fsync policy once the leader has told it. */
static void plan_commit(struct run *r)
{
	struct row *row;
	int k;

	for (k = 0; k < 2; k++) {
		row = plan_add(r, T_COMMIT, 0);
		row->workers = 1;
		row->commit_rtt = k == 1;
		snprintf(row->label, sizeof(row->label), "%s", k ? "admin round trip" : "commit");
	}
}

static void plan_rows(struct run *r)
{
	const struct opts *o = r->o;
	int t;
	size_t i;

	plan_sizes(r);
	r->rows = xcalloc(T_NTESTS * (r->nsizes + 4), sizeof(*r->rows));
	for (t = 0; t < T_NTESTS; t++) {
		if (!(o->tests & (1u << t)))
			continue;
		if (t == T_LOCK) {
			plan_lock(r);
			continue;
		}
		if (t == T_COMMIT) {
			plan_commit(r);
			continue;
		}
		for (i = 0; i < r->nsizes; i++) {
			struct row *row = plan_add(r, (enum test_id)t, r->sizes[i]);
			row->moved = t == T_AGG ? (double)r->sizes[i] * r->W : moved_bytes(o, (enum test_id)t, r->sizes[i]);
			if (t == T_CRC || t == T_IGZIP) {
				row->workers = 1;
				row->moved = (double)r->sizes[i];
			}
			if (t == T_IGZIP) {
				snprintf(row->label, sizeof(row->label), "%zu fp32", r->sizes[i]);
				row = plan_add(r, T_IGZIP, r->sizes[i]);
				row->workers = 1;
				row->moved = (double)r->sizes[i];
				row->zeros = true;
				snprintf(row->label, sizeof(row->label), "%zu zeros", r->sizes[i]);
			}
		}
	}
}

static size_t size_index(const struct run *r, size_t bytes)
{
	size_t i;

	for (i = 0; i < r->nsizes; i++)
		if (r->sizes[i] == bytes)
			return i;
	return 0;
}

/* ---- progress ------------------------------------------------------------------- */

static bool progress_on(const struct opts *o)
{
	return !o->quiet && isatty(STDERR_FILENO);
}

static void progress_set(struct run *r, long row, int phase, long total)
{
	atomic_store_explicit(&r->prog_row, row, memory_order_relaxed);
	atomic_store_explicit(&r->prog_phase, phase, memory_order_relaxed);
	atomic_store_explicit(&r->prog_total, total, memory_order_relaxed);
	atomic_store_explicit(&r->prog_done, 0, memory_order_relaxed);
}

static void progress_print(struct run *r)
{
	static const char *const phases[] = { "setup", "warm-up", "latency", "bandwidth", "baseline" };
	long ri = atomic_load_explicit(&r->prog_row, memory_order_relaxed);
	int ph = atomic_load_explicit(&r->prog_phase, memory_order_relaxed);
	char h[32];
	const struct row *row;

	if (!progress_on(r->o) || ri < 0 || (size_t)ri >= r->nrows)
		return;
	row = &r->rows[ri];
	fprintf(stderr, "\r\033[Kpsperf: %s %s %s %ld/%ld (row %ld of %zu)", test_names[row->test],
		row->label[0] ? row->label : human(row->bytes, h, sizeof(h)), phases[ph % 5],
		atomic_load_explicit(&r->prog_done, memory_order_relaxed),
		atomic_load_explicit(&r->prog_total, memory_order_relaxed), ri + 1, r->nrows);
	fflush(stderr);
}

static void progress_clear(const struct run *r)
{
	if (progress_on(r->o)) {
		fprintf(stderr, "\r\033[K");
		fflush(stderr);
	}
}

/* ---- worker: failures --------------------------------------------------------------- */

static int worker_fail(struct worker *w, const struct row *row, const char *what, int ret)
{
	char h[32];

	snprintf(w->err, sizeof(w->err), "%s%s%s, worker %d: %s: %s", row ? test_names[row->test] : "setup",
		 row ? " " : "", row ? (row->label[0] ? row->label : human(row->bytes, h, sizeof(h))) : "", w->rank, what,
		 rps_last_error()[0] ? rps_last_error() : rps_strerror(ret));
	w->status = ret ? ret : -EIO;
	return w->status;
}

/* ---- worker: tensors ------------------------------------------------------------------ */

static int tensor_for(struct worker *w, const struct row *row, rps_tensor_t **out)
{
	const struct opts *o = w->run->o;
	size_t i = size_index(w->run, row->bytes);
	struct rps_tensor_opts to;
	char name[64];
	int ret;

	if (w->tens[i]) {
		*out = w->tens[i];
		return 0;
	}
	rps_tensor_opts_init(&to);
	to.count = row->bytes / rps__dtype_size(o->dtype);
	to.dtype = o->dtype;
	to.mode = o->mode;
	to.staleness = o->staleness;
	to.optimizer = o->optimizer;
	snprintf(name, sizeof(name), "%s.%s.%s.%zu", o->tag, mode_name(o->mode), rps__dtype_name(o->dtype),
		 row->bytes);
	ret = rps_tensor_create(w->cl, name, &to, &w->tens[i]);
	if (ret)
		return worker_fail(w, row, "rps_tensor_create", ret);
	*out = w->tens[i];
	return 0;
}

static int lock_tensor(struct worker *w, const struct row *row)
{
	struct rps_tensor_opts to;
	char name[64];
	int ret;

	if (w->lockt)
		return 0;
	rps_tensor_opts_init(&to);
	to.count = 2;
	to.mode = RPS_MODE_ASYNC;
	snprintf(name, sizeof(name), "%s.lock", w->run->o->tag);
	ret = rps_tensor_create(w->cl, name, &to, &w->lockt);
	return ret ? worker_fail(w, row, "rps_tensor_create", ret) : 0;
}

/* ---- worker: one operation ---------------------------------------------------------------- */

static size_t pull_bytes(const struct opts *o, const struct row *row)
{
	return row->bytes / rps__dtype_size(o->dtype) * 4;
}

static int op_blocking(struct worker *w, const struct row *row, rps_tensor_t *t)
{
	const struct opts *o = w->run->o;
	int ret = 0;

	if (row->test == T_PUSH || row->test == T_PUSHPULL) {
		ret = rps_push(t, w->grad, row->bytes);
		if (ret)
			return worker_fail(w, row, "rps_push", ret);
	}
	if (row->test == T_PULL || row->test == T_PUSHPULL) {
		ret = rps_pull(t, w->pull, pull_bytes(o, row), NULL);
		if (ret)
			return worker_fail(w, row, "rps_pull", ret);
	}
	return 0;
}

static int op_start(struct worker *w, const struct row *row, rps_tensor_t *t, rps_request_t **req)
{
	const struct opts *o = w->run->o;
	int ret;

	req[0] = req[1] = NULL;
	if (row->test == T_PUSH || row->test == T_PUSHPULL) {
		ret = rps_push_start(t, w->grad, row->bytes, &req[0]);
		if (ret)
			return worker_fail(w, row, "rps_push_start", ret);
	}
	if (row->test == T_PULL || row->test == T_PUSHPULL) {
		ret = rps_pull_start(t, w->pull, pull_bytes(o, row), NULL, &req[1]);
		if (ret) {
			worker_fail(w, row, "rps_pull_start", ret);
			if (req[0])
				rps_wait(req[0]);
			req[0] = NULL;
			return ret;
		}
	}
	return 0;
}

static int op_finish(struct worker *w, const struct row *row, rps_request_t **req)
{
	int i, ret, first = 0;

	for (i = 0; i < 2; i++) {
		if (!req[i])
			continue;
		ret = rps_wait(req[i]);
		req[i] = NULL;
		if (ret && !first)
			first = worker_fail(w, row, i ? "rps_wait (pull)" : "rps_wait (push)", ret);
	}
	return first;
}

/* ---- worker: passes ------------------------------------------------------------------------ */

static struct baseline *baseline_new(struct run *r);
static void baseline_free(struct baseline *b);
static void baseline_row(struct run *r, struct baseline *b, const struct row *row);

static int barrier(struct worker *w, const struct row *row)
{
	int ret = rps_barrier(w->cl);

	return ret ? worker_fail(w, row, "rps_barrier", ret) : 0;
}

static void tick(struct worker *w, long done)
{
	if (w->rank == 0)
		atomic_store_explicit(&w->run->prog_done, done, memory_order_relaxed);
}

static void phase(struct worker *w, long ri, int ph, long total)
{
	if (w->rank == 0)
		progress_set(w->run, ri, ph, total);
}

/* Worker 0 measures the row's raw operations while the others wait. */
static void row_baseline(struct worker *w, long ri)
{
	if (!w->bl)
		return;
	phase(w, ri, 4, 0);
	baseline_row(w->run, w->bl, &w->run->rows[ri]);
}

static int pass_blocking(struct worker *w, long ri, rps_tensor_t *t, long n, struct pass *out)
{
	const struct row *row = &w->run->rows[ri];
	uint64_t t0, t1;
	long i;

	if (out) {
		samples_reserve(&out->s, (size_t)n);
		out->t0 = rps__now_ns();
	}
	for (i = 0; i < n; i++) {
		t0 = rps__now_ns();
		if (op_blocking(w, row, t))
			return w->status;
		t1 = rps__now_ns();
		if (out)
			samples_add(&out->s, t1 - t0);
		tick(w, i + 1);
	}
	if (out)
		out->t1 = rps__now_ns();
	return 0;
}

/* n operations with up to --window in flight; each op's time runs from its
 * start to the return of its wait (oldest first). */
static int pass_window(struct worker *w, long ri, rps_tensor_t *t, long n, struct pass *out)
{
	const struct row *row = &w->run->rows[ri];
	int win = w->run->o->window;
	rps_request_t *(*req)[2] = xcalloc((size_t)win, sizeof(*req));
	uint64_t *ts = xcalloc((size_t)win, sizeof(*ts));
	long posted = 0, done = 0;
	int ret = 0;

	samples_reserve(&out->s, (size_t)n);
	out->t0 = rps__now_ns();
	while (done < n) {
		while (!ret && posted < n && posted - done < win) {
			ts[posted % win] = rps__now_ns();
			ret = op_start(w, row, t, req[posted % win]);
			if (!ret)
				posted++;
		}
		if (done == posted)
			break;
		if (op_finish(w, row, req[done % win]) && !ret)
			ret = w->status;
		samples_add(&out->s, rps__now_ns() - ts[done % win]);
		tick(w, ++done);
	}
	out->t1 = rps__now_ns();
	free(req);
	free(ts);
	return ret;
}

static int run_data_row(struct worker *w, long ri)
{
	const struct row *row = &w->run->rows[ri];
	rps_tensor_t *t = NULL;

	phase(w, ri, 0, 0);
	if (tensor_for(w, row, &t) || barrier(w, row))
		return w->status;
	phase(w, ri, 1, row->warmup);
	if (pass_blocking(w, ri, t, row->warmup, NULL) || barrier(w, row))
		return w->status;
	phase(w, ri, 2, row->iters);
	if (pass_blocking(w, ri, t, row->iters, &w->lat[ri]) || barrier(w, row))
		return w->status;
	if (w->run->o->window > 1) {
		phase(w, ri, 3, row->iters);
		if (pass_window(w, ri, t, row->iters, &w->bw[ri]) || barrier(w, row))
			return w->status;
	}
	row_baseline(w, ri);
	return barrier(w, row);
}

/* Rows ri (acquire) and ri+1 (release) from one loop of lock+unlock pairs. */
static int lock_loop(struct worker *w, long ri, long n, bool record)
{
	const struct row *row = &w->run->rows[ri];
	struct pass *acq = &w->lat[ri], *rel = &w->lat[ri + 1];
	uint64_t t0, t1, t2;
	long i;
	int ret;

	if (record) {
		samples_reserve(&acq->s, (size_t)n);
		samples_reserve(&rel->s, (size_t)n);
		acq->t0 = rel->t0 = rps__now_ns();
	}
	for (i = 0; i < n; i++) {
		t0 = rps__now_ns();
		ret = rps__tensor_lock(w->lockt, 0);
		if (ret)
			return worker_fail(w, row, "rps__tensor_lock", ret);
		t1 = rps__now_ns();
		ret = rps__tensor_unlock(w->lockt, 0);
		if (ret)
			return worker_fail(w, row, "rps__tensor_unlock", ret);
		t2 = rps__now_ns();
		if (record) {
			samples_add(&acq->s, t1 - t0);
			samples_add(&rel->s, t2 - t1);
		}
		tick(w, i + 1);
	}
	if (record)
		acq->t1 = rel->t1 = rps__now_ns();
	return 0;
}

static int run_lock_rows(struct worker *w, long ri)
{
	const struct row *row = &w->run->rows[ri];
	bool mine = !row->lock_alone || w->rank == 0;

	phase(w, ri, 0, 0);
	if (lock_tensor(w, row) || barrier(w, row))
		return w->status;
	phase(w, ri, 1, row->warmup);
	if ((mine && lock_loop(w, ri, row->warmup, false)) || barrier(w, row))
		return w->status;
	phase(w, ri, 2, row->iters);
	if ((mine && lock_loop(w, ri, row->iters, true)) || barrier(w, row))
		return w->status;
	row_baseline(w, ri);
	row_baseline(w, ri + 1);
	return barrier(w, row);
}

/* ---- worker: the thread ------------------------------------------------------------------- */

static void fill_gradient(void *dst, enum rps_dtype dt, size_t count)
{
	float tmp[1024];
	size_t i, k, n, esz = rps__dtype_size(dt);

	for (i = 0; i < 1024; i++)
		tmp[i] = 1e-3f * (float)((int)(i % 7) - 3);
	for (k = 0; k < count; k += n) {
		n = RPS__MIN(count - k, (size_t)1024);
		rps__f32_to_dtype((char *)dst + k * esz, tmp, dt, n);
	}
}

static int worker_setup(struct worker *w)
{
	const struct opts *o = w->run->o;
	size_t max = w->run->sizes[w->run->nsizes - 1];
	size_t count = max / rps__dtype_size(o->dtype);
	struct rps_client_opts co;
	int ret;

	w->tens = xcalloc(w->run->nsizes, sizeof(*w->tens));
	w->lat = xcalloc(w->run->nrows, sizeof(*w->lat));
	w->bw = xcalloc(w->run->nrows, sizeof(*w->bw));
	w->grad = xalloc_aligned(max);
	w->pull = xalloc_aligned(count * 4);
	fill_gradient(w->grad, o->dtype, count);
	rps_client_opts_init(&co);
	co.servers = w->run->servers;
	co.rank = w->rank;
	co.num_workers = w->run->W;
	co.timeout_ms = o->timeout_ms;
	co.spin_us = o->spin_us;	/* perftest busy-polls too: compare like with like */
	ret = rps_client_connect(&co, &w->cl);
	if (ret)
		return worker_fail(w, NULL, "rps_client_connect", ret);
	if (w->rank == 0)
		snprintf(w->run->device, sizeof(w->run->device), "%s", rps__client_fabric_name(w->cl));
	if (w->rank == 0 && o->baseline)
		w->bl = baseline_new(w->run);
	return barrier(w, NULL);
}

/* After a failure a timed-out operation may still be in flight, and
 * rps_tensor_close() waits for it without a bound: then the handles are
 * left to rps_client_close(), which fails what is in flight. */
static void worker_teardown(struct worker *w)
{
	size_t i;

	for (i = 0; !w->status && w->tens && i < w->run->nsizes; i++)
		if (w->tens[i])
			rps_tensor_close(w->tens[i]);
	if (w->lockt && !w->status)
		rps_tensor_close(w->lockt);
	if (w->cl)
		rps_client_close(w->cl);
	w->cl = NULL;
	baseline_free(w->bl);
	w->bl = NULL;
	free(w->tens);
	free(w->grad);
	free(w->pull);
	w->tens = NULL;
	w->grad = w->pull = NULL;
}

/* Tell the main thread at once, so it can stop the servers before this
 * worker's teardown. */
static void worker_flag_failure(struct worker *w)
{
	struct run *r = w->run;

	pthread_mutex_lock(&r->mu);
	if (!r->failed) {
		r->failed = true;
		snprintf(r->err, sizeof(r->err), "%s", w->err);
	}
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static void worker_done(struct worker *w)
{
	struct run *r = w->run;

	pthread_mutex_lock(&r->mu);
	r->nfinished++;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->run;
	size_t ri;

	if (!worker_setup(w)) {
		for (ri = 0; ri < r->nrows && !w->status; ri++) {
			const struct row *row = &r->rows[ri];
			if (in_process(row->test) || row->test == T_COMMIT)
				continue;
			if (row->test == T_LOCK) {
				run_lock_rows(w, (long)ri);
				ri++;	/* the release row is filled by the same loop */
				continue;
			}
			run_data_row(w, (long)ri);
		}
	}
	if (w->status)
		worker_flag_failure(w);
	worker_teardown(w);
	worker_done(w);
	return NULL;
}

static void workers_merge(struct run *r, struct worker *ws, int n)
{
	size_t ri;
	int i;

	for (ri = 0; ri < r->nrows; ri++) {
		struct row *row = &r->rows[ri];
		if (in_process(row->test) || row->test == T_COMMIT)
			continue;
		for (i = 0; i < n; i++) {
			pass_merge(&row->lat, &ws[i].lat[ri]);
			pass_merge(&row->bw, &ws[i].bw[ri]);
		}
	}
	for (i = 0; i < n; i++) {
		for (ri = 0; ri < r->nrows; ri++) {
			samples_free(&ws[i].lat[ri].s);
			samples_free(&ws[i].bw[ri].s);
		}
		free(ws[i].lat);
		free(ws[i].bw);
	}
}

/* Wait for n workers, printing progress; on the first failure call
 * on_fail (local mode: stop the servers, so the others fail fast). */
static void workers_wait(struct run *r, int n, void (*on_fail)(void *), void *arg)
{
	bool stopped = false;

	pthread_mutex_lock(&r->mu);
	while (r->nfinished < n) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		if (r->failed && !stopped && on_fail) {
			stopped = true;
			pthread_mutex_unlock(&r->mu);
			on_fail(arg);
			pthread_mutex_lock(&r->mu);
		}
		pthread_mutex_unlock(&r->mu);
		progress_print(r);
		pthread_mutex_lock(&r->mu);
	}
	pthread_mutex_unlock(&r->mu);
	progress_clear(r);
}

/* ---- local servers ------------------------------------------------------------------------- */

struct lserver {
	struct rps__daemon *srv;
	pthread_t thread;
	bool started;
	int ret;
	char err[512];
};

struct lcluster {
	struct lserver s[MAX_LOCAL];
	int n;
	char dirs[MAX_LOCAL][PATH_MAX];	/* commit test: each server's --data-dir */
};

static void *server_main(void *arg)
{
	struct lserver *s = arg;

	s->ret = rps__daemon_run(s->srv);
	if (s->ret)
		snprintf(s->err, sizeof(s->err), "%s", rps__errbuf());
	return NULL;
}

static void cluster_stop(void *arg)
{
	struct lcluster *c = arg;
	int i;

	for (i = 0; i < c->n; i++)
		if (c->s[i].started)
			rps__daemon_stop(c->s[i].srv);
}

/* Stop, join and destroy every server (idempotent).  Destroying closes
 * the workers' connections, so a worker blocked on a server fails fast. */
static void cluster_destroy(void *arg)
{
	struct lcluster *c = arg;
	int i;

	cluster_stop(c);
	for (i = 0; i < c->n; i++) {
		if (c->s[i].started)
			pthread_join(c->s[i].thread, NULL);
		rps__daemon_destroy(c->s[i].srv);
		c->s[i].srv = NULL;
		c->s[i].started = false;
	}
}

/* data_dir NULL: the server's own temporary dir, and no fsync (a data
 * benchmark: the Raft log need not survive power loss); else that dir and
 * --fsync (the commit test, where syncing is what is measured). */
static void server_cfg(const struct run *r, struct rps__server_config *cfg, const char *cluster, int i,
		       const char *data_dir)
{
	const struct opts *o = r->o;

	rps__server_config_init(cfg);
	cfg->listen.kind = r->kind;
	snprintf(cfg->listen.host, sizeof(cfg->listen.host), "%s", r->addr);
	cfg->listen.port = 0;
	cfg->cluster = cluster;
	cfg->index = i;
	cfg->data_dir = data_dir;
	cfg->fsync_none = data_dir ? o->fsync_none : 1;
	cfg->shard_bytes = o->shard_bytes;
	cfg->nslots = o->slots;
	cfg->spin_us = o->spin_us;
	cfg->max_conns = (uint32_t)(o->nworkers + 4);
}

/* A TCP port that is free right now (the kernel picks it); rdma_cm listens
 * on the same port numbers. */
static uint16_t free_port(const char *addr)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	socklen_t len = sizeof(sin);
	uint16_t port = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0)
		return 0;
	if (inet_pton(AF_INET, addr, &sin.sin_addr) == 1 && !bind(fd, (struct sockaddr *)&sin, sizeof(sin)) &&
	    !getsockname(fd, (struct sockaddr *)&sin, &len))
		port = ntohs(sin.sin_port);
	close(fd);
	return port;
}

/* Start nservers servers on ports picked now: the shard map they
 * bootstrap names every server's address (written to list), which workers
 * then use.  c->dirs[i] non-empty: server i's data dir (commit test). */
static int cluster_start(struct run *r, struct lcluster *c, int nservers, char *list, size_t listlen)
{
	const char *scheme = r->kind == RPS__KIND_VERBS ? "verbs" : "tcp";
	size_t k = 0;
	int i, ret;

	for (i = 0; i < nservers; i++) {
		uint16_t port = nservers == 1 ? 0 : free_port(r->addr);
		k += (size_t)snprintf(list + k, listlen - k, "%s%s://%s:%u", i ? "," : "", scheme, r->addr, port);
	}
	for (i = 0; i < nservers; i++) {
		struct rps__server_config cfg;
		server_cfg(r, &cfg, list, i, c->dirs[i][0] ? c->dirs[i] : NULL);
		if (nservers > 1) {
			struct rps__uri *u = NULL;
			int n = 0;
			if (!rps__uri_list_parse(list, &u, &n) && n > i)
				cfg.listen.port = u[i].port;
			free(u);
		}
		ret = rps__daemon_create(&cfg, &c->s[i].srv);
		if (ret) {
			fprintf(stderr, "psperf: starting server %d on %s://%s: %s\n", i, scheme, r->addr, rps__errbuf());
			return ret;
		}
		c->n = i + 1;
		if (!r->device[0])
			snprintf(r->device, sizeof(r->device), "%s", rps__daemon_fabric_name(c->s[i].srv));
		ret = pthread_create(&c->s[i].thread, NULL, server_main, &c->s[i]);
		if (ret) {
			fprintf(stderr, "psperf: pthread_create: %s\n", strerror(ret));
			return -ret;
		}
		c->s[i].started = true;
	}
	if (nservers == 1)
		snprintf(list, listlen, "%s://%s:%u", scheme, r->addr, rps__daemon_port(c->s[0].srv));
	return 0;
}

static int cluster_errors(struct lcluster *c)
{
	int i, bad = 0;

	for (i = 0; i < c->n; i++)
		if (c->s[i].ret) {
			fprintf(stderr, "psperf: server %d stopped with an error: %s\n", i, c->s[i].err);
			bad++;
		}
	return bad;
}

static void run_init(struct run *r, struct opts *o)
{
	memset(r, 0, sizeof(*r));
	r->o = o;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	atomic_init(&r->prog_row, -1);
	atomic_init(&r->prog_done, 0);
	atomic_init(&r->prog_total, 0);
	atomic_init(&r->prog_phase, 0);
	r->commit_fsync = -1;
}

/* Rows that workers of a data cluster measure (not agg, not commit). */
static bool plan_has_cluster_rows(const struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (!in_process(r->rows[i].test) && r->rows[i].test != T_COMMIT)
			return true;
	return false;
}

static struct row *plan_commit_row(struct run *r, bool rtt)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (r->rows[i].test == T_COMMIT && r->rows[i].commit_rtt == rtt)
			return &r->rows[i];
	return NULL;
}

/* Start workers, wait, merge.  n workers with ranks first..first+n-1. */
static int run_workers(struct run *r, int first, int n, void (*on_fail)(void *), void *arg)
{
	struct worker *ws = xcalloc((size_t)n, sizeof(*ws));
	int i, started = 0, ret;

	for (i = 0; i < n; i++) {
		ws[i].run = r;
		ws[i].rank = first + i;
		ret = pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
		if (ret) {
			fprintf(stderr, "psperf: pthread_create: %s\n", strerror(ret));
			break;
		}
		started++;
	}
	if (started < n) {
		pthread_mutex_lock(&r->mu);
		r->nfinished += n - started;
		r->failed = true;
		snprintf(r->err, sizeof(r->err), "could not start worker thread %d", started);
		pthread_mutex_unlock(&r->mu);
		if (on_fail)
			on_fail(arg);
	}
	workers_wait(r, n, on_fail, arg);
	for (i = 0; i < started; i++)
		pthread_join(ws[i].thread, NULL);
	workers_merge(r, ws, started);
	free(ws);
	return r->failed ? -EIO : 0;
}

static int run_local_cluster(struct run *r)
{
	struct lcluster c;
	int ret;

	memset(&c, 0, sizeof(c));
	ret = cluster_start(r, &c, r->o->nservers, r->servers, sizeof(r->servers));
	if (!ret)
		ret = run_workers(r, 0, r->o->nworkers, cluster_destroy, &c);
	cluster_destroy(&c);
	if (cluster_errors(&c) && !ret)
		ret = -EIO;
	return ret;
}

/* ---- commit: one Raft entry against the admin round trip --------------------------------------- */

#define COMMIT_POLL_MS 20		/* leader search: between rounds of STATUS */
#define COMMIT_RPC_MS 2000		/* leader search: one connect / STATUS at most */

/* Admin channels to every server of the cluster under test. */
struct commit_target {
	struct rps__uri *uris;
	int n;
	struct rps__ctl **ctl;	/* per server; NULL until opened */
	char *buf;		/* RPS__BIG_MSG_MAX: a STATUS reply */
	char name[300];		/* the leader's URI, for messages */
	int spin_us;		/* --spin-us for the admin connections */
};

static int commit_fail(struct run *r, const char *fmt, ...) RPS__PRINTF(2, 3);

static int commit_fail(struct run *r, const char *fmt, ...)
{
	va_list ap;

	if (!r->err[0]) {
		va_start(ap, fmt);
		vsnprintf(r->err, sizeof(r->err), fmt, ap);
		va_end(ap);
	}
	r->failed = true;
	return -EIO;
}

static int ms_left(uint64_t deadline, int cap)
{
	uint64_t now = rps__now_ns();
	uint64_t ms = now >= deadline ? 1 : (deadline - now) / 1000000u + 1;

	return (int)RPS__MIN(ms, (uint64_t)cap);
}

/* STATUS to server i (connecting first if need be). */
static int commit_status(struct commit_target *t, int i, int timeout_ms, struct rps__status_rep *st)
{
	char name[300];
	size_t len = 0;
	int32_t status = 0;
	int ret;

	rps__uri_str(&t->uris[i], name, sizeof(name));
	if (!t->ctl[i]) {
		ret = rps__ctl_open(&t->uris[i], timeout_ms, &t->ctl[i]);
		if (ret) {
			t->ctl[i] = NULL;
			return ret;
		}
		rps__ctl_set_spin(t->ctl[i], t->spin_us);	/* --spin-us: like the workers */
	}
	ret = rps__ctl_call(t->ctl[i], RPS__MSG_STATUS, NULL, 0, t->buf, RPS__BIG_MSG_MAX, &len, &status, timeout_ms);
	if (ret == -ECONNRESET) {
		rps__ctl_close(t->ctl[i]);
		t->ctl[i] = NULL;
	}
	if (ret)
		return ret;
	if (status < 0)
		return rps__seterr(status, "%s: STATUS refused: %s", name, rps_strerror(status));
	if (len < sizeof(*st))
		return rps__seterr(-EBADMSG, "%s: STATUS reply of %zu bytes is too short: is it an rdmapsd of this release?",
				   name, len);
	memcpy(st, t->buf, sizeof(*st));
	return 0;
}

/* Poll STATUS on every server until one says it leads (the highest term
 * wins); its index, or < 0 with r->err set at the deadline. */
static int commit_find_leader(struct run *r, struct commit_target *t, uint64_t deadline, struct rps__status_rep *out)
{
	struct rps__status_rep st;
	char last[512] = "";
	int i, best;

	for (;;) {
		best = -1;
		for (i = 0; i < t->n; i++) {
			if (commit_status(t, i, ms_left(deadline, COMMIT_RPC_MS), &st)) {
				snprintf(last, sizeof(last), "%s", rps__errbuf());
				continue;
			}
			if (st.role == RPS__RAFT_LEADER && (best < 0 || st.term > out->term)) {
				best = i;
				*out = st;
			}
		}
		if (best >= 0) {
			rps__uri_str(&t->uris[best], t->name, sizeof(t->name));
			return best;
		}
		if (rps__now_ns() >= deadline)
			return commit_fail(r, "commit: no server of %d reported itself leader within --timeout-ms %d%s%s",
					   t->n, r->o->timeout_ms, last[0] ? "; last error: " : " (an election in progress?)",
					   last);
		sleep_ms(COMMIT_POLL_MS);
	}
}

/* One ADMIN NOP: 0 when a reply came (*status says how it went). */
static int commit_nop(struct run *r, struct rps__ctl *ctl, int32_t *status, struct rps__admin_rep *rep)
{
	struct rps__admin a;
	size_t len = 0;
	int ret;

	memset(&a, 0, sizeof(a));
	a.op = RPS__ADMIN_NOP;
	a.timeout_ms = (uint32_t)r->o->timeout_ms;
	ret = rps__ctl_call(ctl, RPS__MSG_ADMIN, &a, sizeof(a), rep, sizeof(*rep), &len, status, r->o->timeout_ms + 5000);
	if (!ret && len < sizeof(*rep))
		memset(rep, 0, sizeof(*rep));
	rep->msg[sizeof(rep->msg) - 1] = '\0';
	return ret;
}

static void commit_progress(struct run *r, const struct row *row, int ph, long total)
{
	progress_set(r, (long)(row - r->rows), ph, total);
	progress_print(r);
}

static void commit_tick(struct run *r, long done)
{
	atomic_store_explicit(&r->prog_done, done, memory_order_relaxed);
	if ((done & 63) == 0)
		progress_print(r);
}

static void commit_label(struct run *r, struct row *cr, const struct rps__status_rep *st)
{
	r->commit_leader = st->id;
	r->commit_term = st->term;
	r->commit_voters = (int)st->n_voters;
	r->commit_fsync = st->fsync ? 1 : 0;
	snprintf(cr->label, sizeof(cr->label), "commit (fsync %s)", st->fsync ? "always" : "none");
}

/* Warm-up: NOPs until `want` have succeeded.  A leader fresh from its
 * election answers -EAGAIN until it has committed in its term; -EPERM:
 * leadership moved, find the new leader. */
static int commit_warmup(struct run *r, struct commit_target *t, int *L, long want, uint64_t deadline)
{
	struct row *cr = plan_commit_row(r, false);
	struct rps__status_rep st;
	struct rps__admin_rep rep;
	int32_t status;
	long done = 0;

	commit_progress(r, cr, 1, want);
	while (done < want) {
		if (commit_nop(r, t->ctl[*L], &status, &rep))
			return commit_fail(r, "commit warm-up: ADMIN NOP to %s: %s", t->name, rps__errbuf());
		if (status == -EAGAIN || status == -EPERM) {
			if (rps__now_ns() >= deadline)
				return commit_fail(r, "commit warm-up: %s kept answering %s to ADMIN NOP: %s", t->name,
						   rps_strerror(status), rep.msg[0] ? rep.msg : "no message");
			if (status == -EPERM) {
				*L = commit_find_leader(r, t, deadline, &st);
				if (*L < 0)
					return -EIO;
				commit_label(r, cr, &st);
			}
			sleep_ms(10);
			continue;
		}
		if (status)
			return commit_fail(r, "commit warm-up: %s refused ADMIN NOP: %s", t->name,
					   rep.msg[0] ? rep.msg : rps_strerror(status));
		commit_tick(r, ++done);
	}
	return 0;
}

/* The timed passes: NOPs (each answered once its entry is applied, at a
 * log index past the previous one's), then STATUS round trips. */
static int commit_passes(struct run *r, struct rps__ctl *ctl, const char *name, char *buf)
{
	struct row *cr = plan_commit_row(r, false), *rr = plan_commit_row(r, true);
	struct rps__admin_rep rep;
	uint64_t last = 0, t0;
	int32_t status;
	size_t len;
	long i;
	int ret;

	commit_progress(r, cr, 2, cr->iters);
	samples_reserve(&cr->lat.s, (size_t)cr->iters);
	cr->lat.t0 = rps__now_ns();
	for (i = 0; i < cr->iters; i++) {
		t0 = rps__now_ns();
		ret = commit_nop(r, ctl, &status, &rep);
		samples_add(&cr->lat.s, rps__now_ns() - t0);
		if (ret)
			return commit_fail(r, "commit %ld of %ld: ADMIN NOP to %s: %s", i + 1, cr->iters, name,
					   rps__errbuf());
		if (status)
			return commit_fail(r, "commit %ld of %ld: %s answered ADMIN NOP with %s: %s", i + 1, cr->iters,
					   name, rps_strerror(status), rep.msg[0] ? rep.msg : "no message");
		if (rep.index <= last)
			return commit_fail(r, "commit %ld of %ld: %s answered at applied index %llu, not past the "
					   "previous NOP's %llu: a NOP was not committed", i + 1, cr->iters, name,
					   (unsigned long long)rep.index, (unsigned long long)last);
		last = rep.index;
		commit_tick(r, i + 1);
	}
	cr->lat.t1 = rps__now_ns();
	commit_progress(r, rr, 1, rr->warmup + rr->iters);
	samples_reserve(&rr->lat.s, (size_t)rr->iters);
	for (i = -rr->warmup; i < rr->iters; i++) {
		if (i == 0)
			rr->lat.t0 = rps__now_ns();
		t0 = rps__now_ns();
		ret = rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, buf, RPS__BIG_MSG_MAX, &len, &status, 0);
		if (i >= 0)
			samples_add(&rr->lat.s, rps__now_ns() - t0);
		if (ret || status)
			return commit_fail(r, "admin round trip %ld: STATUS to %s: %s", i + 1, name,
					   ret ? rps__errbuf() : rps_strerror(status));
		commit_tick(r, i + rr->warmup + 1);
	}
	rr->lat.t1 = rps__now_ns();
	return 0;
}

/* Find the leader of the cluster at list, warm up, time, and measure the
 * raw SEND/RECV baseline; r->err says what failed. */
static int commit_measure(struct run *r, const char *list)
{
	struct row *cr = plan_commit_row(r, false);
	uint64_t deadline = rps__now_ns() + (uint64_t)r->o->timeout_ms * 1000000ull;
	struct commit_target t;
	struct rps__status_rep st;
	int i, L, ret;

	memset(&t, 0, sizeof(t));
	if (rps__uri_list_parse(list, &t.uris, &t.n))
		return commit_fail(r, "commit: %s", rps__errbuf());
	t.ctl = xcalloc((size_t)t.n, sizeof(*t.ctl));
	t.spin_us = r->o->spin_us;
	t.buf = xalloc_aligned(RPS__BIG_MSG_MAX);
	commit_progress(r, cr, 0, 0);
	L = commit_find_leader(r, &t, deadline, &st);
	ret = L < 0 ? -EIO : 0;
	if (!ret) {
		commit_label(r, cr, &st);
		for (i = 0; i < t.n; i++)	/* only the leader's channel is used from here */
			if (i != L) {
				rps__ctl_close(t.ctl[i]);
				t.ctl[i] = NULL;
			}
		ret = commit_warmup(r, &t, &L, RPS__MAX(cr->warmup, 1L), deadline);
	}
	if (!ret)
		ret = commit_passes(r, t.ctl[L], t.name, t.buf);
	progress_clear(r);
	for (i = 0; i < t.n; i++)
		rps__ctl_close(t.ctl[i]);
	free(t.ctl);
	free(t.buf);
	free(t.uris);
	if (!ret && r->o->baseline && cr->raw_lat) {
		struct baseline *b;
		commit_progress(r, cr, 4, 0);
		b = baseline_new(r);
		baseline_row(r, b, cr);
		baseline_free(b);
		progress_clear(r);
	}
	return ret;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void remove_tree(const char *dir)
{
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	if (access(dir, F_OK) == 0)
		fprintf(stderr, "psperf: could not remove %s: remove it by hand\n", dir);
}

/* Local mode: a cluster of its own (3 servers, or --servers), each with a
 * data dir under $TMPDIR (default /tmp) and --fsync, removed after. */
static int run_commit_local(struct run *r)
{
	struct lcluster *c = xcalloc(1, sizeof(*c));
	const char *tmp = getenv("TMPDIR");
	char root[PATH_MAX - 32];
	int n = r->o->nservers_set ? r->o->nservers : COMMIT_SERVERS;
	int i, ret;

	snprintf(root, sizeof(root), "%s/psperf-commit.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(root)) {
		ret = commit_fail(r, "commit: mkdtemp %s: %s: set TMPDIR to a writable directory", root, strerror(errno));
		free(c);
		return ret;
	}
	for (i = 0; i < n; i++) {
		snprintf(c->dirs[i], sizeof(c->dirs[i]), "%s/s%d", root, i);
		if (mkdir(c->dirs[i], 0700)) {
			ret = commit_fail(r, "commit: mkdir %s: %s", c->dirs[i], strerror(errno));
			remove_tree(root);
			free(c);
			return ret;
		}
	}
	if (!plan_has_cluster_rows(r))
		r->nservers = n;
	ret = cluster_start(r, c, n, r->commit_servers, sizeof(r->commit_servers));
	if (ret)
		commit_fail(r, "commit: the cluster of %d servers could not start (see above)", n);
	else
		ret = commit_measure(r, r->commit_servers);
	if (!r->servers[0])
		snprintf(r->servers, sizeof(r->servers), "%s", r->commit_servers);
	cluster_destroy(c);
	if (cluster_errors(c) && !ret)
		ret = commit_fail(r, "commit: a server stopped with an error (see above)");
	remove_tree(root);
	free(c);
	return ret;
}

/* ---- agg: the server's aggregation in-process ------------------------------------------------- */

static void agg_pass(struct pass *p, float *acc, void **grads, int W, enum rps_dtype dt, size_t n, long iters)
{
	long i;
	int k;

	samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		uint64_t t0 = rps__now_ns();
		for (k = 0; k < W; k++)
			rps__agg_add(acc, grads[k], dt, n);
		samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
}

static void memcpy_pass(struct pass *p, char *dst, void **grads, int W, size_t bytes, long iters)
{
	volatile char sink;
	long i;
	int k;

	samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		uint64_t t0 = rps__now_ns();
		for (k = 0; k < W; k++) {
			memcpy(dst, grads[k], bytes);
			__asm__ __volatile__("" : : "r"(dst) : "memory");
		}
		samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	sink = dst[bytes - 1];
	(void)sink;
}

static struct raw_result *raw_add(struct run *r, enum raw_op op, size_t a, size_t b, long iters, long count);

static void run_agg_row(struct run *r, struct row *row)
{
	enum rps_dtype dt = r->o->dtype;
	size_t n = row->bytes / rps__dtype_size(dt);
	float *acc = xalloc_aligned(n * 4);
	void **grads = xcalloc((size_t)r->W, sizeof(*grads));
	char *dst = xalloc_aligned(row->bytes);
	struct pass warm = { { NULL, 0, 0 }, 0, 0 };
	struct raw_result *raw;
	int k;

	for (k = 0; k < r->W; k++) {
		grads[k] = xalloc_aligned(row->bytes);
		fill_gradient(grads[k], dt, n);
	}
	agg_pass(&warm, acc, grads, r->W, dt, n, row->warmup);
	agg_pass(&row->lat, acc, grads, r->W, dt, n, row->iters);
	raw = raw_add(r, RAW_MEMCPY, row->bytes, (size_t)r->W, row->iters, row->iters);
	if (!raw->st.valid) {
		struct pass mp = { { NULL, 0, 0 }, 0, 0 };
		memcpy_pass(&mp, dst, grads, r->W, row->bytes, row->warmup);
		samples_free(&mp.s);
		memset(&mp, 0, sizeof(mp));
		memcpy_pass(&mp, dst, grads, r->W, row->bytes, row->iters);
		stats_compute(&raw->st, &mp, (double)row->bytes * r->W);
		samples_free(&mp.s);
	}
	row->raw_lat = row->raw_bw = raw;
	samples_free(&warm.s);
	for (k = 0; k < r->W; k++)
		free(grads[k]);
	free(grads);
	free(acc);
	free(dst);
}

/* ---- crc, igzip: the checkpoint kernels in-process ---------------------------------------------- */

/* fp32 parameter-like data: small normal-ish floats (Irwin-Hall of 4
 * uniforms, sd about 0.02), what a trained layer's weights look like. */
static void fill_params(float *dst, size_t n)
{
	uint64_t x = 0x2545f4914f6cdd1dull;
	size_t i;

	for (i = 0; i < n; i++) {
		double u = 0;
		int k;

		for (k = 0; k < 4; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			u += (double)(x >> 11) / 9007199254740992.0;
		}
		dst[i] = (float)((u - 2.0) * 0.0346);
	}
}

static void crc_pass(struct pass *p, const void *buf, size_t bytes, long iters)
{
	volatile uint32_t sink;
	uint32_t c = 0;
	long i;

	samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		uint64_t t0 = rps__now_ns();
		c ^= crc32_iscsi((unsigned char *)buf, (int)bytes, 0xffffffffu);
		samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	sink = c;
	(void)sink;
}

/* Returns the deflated size of the last iteration (0: did not fit). */
static size_t igzip_pass(struct pass *p, const void *buf, size_t bytes, uint8_t *out, size_t out_len,
			 uint8_t *level_buf, long iters)
{
	size_t last = 0;
	long i;

	samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		struct isal_zstream zs;
		uint64_t t0 = rps__now_ns();

		memset(&zs, 0, sizeof(zs));
		isal_deflate_stateless_init(&zs);
		zs.level = 1;
		zs.level_buf = level_buf;
		zs.level_buf_size = ISAL_DEF_LVL1_DEFAULT;
		zs.gzip_flag = IGZIP_DEFLATE;
		zs.end_of_stream = 1;
		zs.next_in = (uint8_t *)buf;
		zs.avail_in = (uint32_t)bytes;
		zs.next_out = out;
		zs.avail_out = (uint32_t)out_len;
		last = isal_deflate_stateless(&zs) == COMP_OK ? zs.total_out : 0;
		samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	return last;
}

static void run_kernel_row(struct run *r, struct row *row)
{
	size_t bytes = row->bytes, out_len = bytes + bytes / 8 + 4096;
	float *src = xalloc_aligned(bytes);
	char *dst = xalloc_aligned(bytes);
	uint8_t *out = NULL, *level_buf = NULL;
	struct pass warm = { { NULL, 0, 0 }, 0, 0 };
	struct raw_result *raw;

	if (row->zeros)
		memset(src, 0, bytes);
	else
		fill_params(src, bytes / 4);
	if (row->test == T_CRC) {
		crc_pass(&warm, src, bytes, row->warmup);
		crc_pass(&row->lat, src, bytes, row->iters);
	} else {
		size_t got;

		out = xalloc_aligned(out_len);
		level_buf = xalloc_aligned(ISAL_DEF_LVL1_DEFAULT);
		igzip_pass(&warm, src, bytes, out, out_len, level_buf, row->warmup);
		got = igzip_pass(&row->lat, src, bytes, out, out_len, level_buf, row->iters);
		row->ratio = got ? (double)bytes / (double)got : NAN;
	}
	raw = raw_add(r, RAW_MEMCPY, bytes, 1, row->iters, row->iters);
	if (!raw->st.valid) {
		void *one[1] = { src };
		struct pass mp = { { NULL, 0, 0 }, 0, 0 };

		memcpy_pass(&mp, dst, one, 1, bytes, row->warmup);
		samples_free(&mp.s);
		memset(&mp, 0, sizeof(mp));
		memcpy_pass(&mp, dst, one, 1, bytes, row->iters);
		stats_compute(&raw->st, &mp, (double)bytes);
		samples_free(&mp.s);
	}
	row->raw_lat = row->raw_bw = raw;
	samples_free(&warm.s);
	free(level_buf);
	free(out);
	free(dst);
	free(src);
}

/* Every in-process row: agg, crc, igzip. */
static void run_agg_rows(struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		if (!in_process(r->rows[i].test))
			continue;
		progress_set(r, (long)i, 2, r->rows[i].iters);
		progress_print(r);
		if (r->rows[i].test == T_AGG)
			run_agg_row(r, &r->rows[i]);
		else
			run_kernel_row(r, &r->rows[i]);
	}
	progress_clear(r);
}

/* ---- baseline: plain sockets ------------------------------------------------------------------- */

enum sock_op { SOCKOP_RR = 1, SOCKOP_STREAM = 2, SOCKOP_QUIT = 3 };

struct sock_cmd {
	uint32_t magic, op;
	uint64_t a, b, count;
};

static int io_all(int fd, void *buf, size_t len, bool wr)
{
	char *p = buf;

	while (len) {
		ssize_t n = wr ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n == 0 ? -ECONNRESET : -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void sock_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int sock_listen(const char *host, uint16_t port, uint16_t *bound)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
	struct addrinfo *res;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char svc[8];
	int fd, one = 1;

	snprintf(svc, sizeof(svc), "%u", port);
	if (getaddrinfo(host, svc, &hints, &res))
		return -EADDRNOTAVAIL;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 4) ||
	    getsockname(fd, (struct sockaddr *)&ss, &len)) {
		int e = -errno;
		if (fd >= 0)
			close(fd);
		freeaddrinfo(res);
		return e;
	}
	freeaddrinfo(res);
	*bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						 : ((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

static int sock_connect(const char *host, uint16_t port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	char svc[8];
	int fd;

	snprintf(svc, sizeof(svc), "%u", port);
	if (getaddrinfo(host, svc, &hints, &res))
		return -EHOSTUNREACH;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen)) {
		int e = -errno;
		close(fd);
		freeaddrinfo(res);
		return e;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return -errno;
	sock_nodelay(fd);
	return fd;
}

/* Responder: serve one connection's commands until QUIT or EOF. */
static void sock_serve(int fd)
{
	struct sock_cmd c;
	char *buf = NULL;
	size_t cap = 0;
	uint64_t i;

	sock_nodelay(fd);
	while (io_all(fd, &c, sizeof(c), false) == 0 && c.magic == SOCK_MAGIC && c.op != SOCKOP_QUIT) {
		size_t need = RPS__MAX(RPS__MAX(c.a, c.b), (uint64_t)8);
		if (c.a > 4ull * MAX_BYTES || c.b > 4ull * MAX_BYTES)
			break;
		if (need > cap) {
			free(buf);
			buf = xalloc_aligned(need);
			cap = need;
		}
		if (c.op == SOCKOP_RR) {
			for (i = 0; i < c.count; i++)
				if (io_all(fd, buf, c.a, false) || io_all(fd, buf, c.b, true))
					goto out;
		} else {
			for (i = 0; i < c.count; i++)
				if (io_all(fd, buf, c.a, false))
					goto out;
			if (io_all(fd, buf, 8, true))
				goto out;
		}
	}
out:
	free(buf);
	close(fd);
}

struct sock_peer {
	int lfd;
	uint16_t port;
	pthread_t thread;
	volatile sig_atomic_t *stop;	/* remote mode: loop until set */
	bool forever;
};

static void *sock_peer_main(void *arg)
{
	struct sock_peer *p = arg;

	do {
		struct pollfd pfd = { .fd = p->lfd, .events = POLLIN };
		int fd;
		if (p->forever && poll(&pfd, 1, 200) <= 0)
			continue;
		fd = accept(p->lfd, NULL, NULL);
		if (fd >= 0)
			sock_serve(fd);
	} while (p->forever && !*p->stop);
	return NULL;
}

/* Initiator: one request/response or stream run; fills the result. */
static int sock_run(int fd, struct raw_result *res, long warmup, struct pass *p, char *buf)
{
	struct sock_cmd c = { SOCK_MAGIC, res->op == RAW_SOCK_RR ? SOCKOP_RR : SOCKOP_STREAM, res->a, res->b, 0 };
	long i, n = res->op == RAW_SOCK_RR ? res->iters : res->count;
	int ret = 0;

	c.count = (uint64_t)(warmup + n);
	if (io_all(fd, &c, sizeof(c), true))
		return -ECONNRESET;
	samples_reserve(&p->s, (size_t)n);
	for (i = -warmup; i < n && !ret; i++) {
		uint64_t t0;
		if (i == 0)
			p->t0 = rps__now_ns();
		t0 = rps__now_ns();
		ret = io_all(fd, buf, res->a, true);
		if (!ret && res->op == RAW_SOCK_RR)
			ret = io_all(fd, buf, res->b, false);
		if (i >= 0)
			samples_add(&p->s, rps__now_ns() - t0);
	}
	if (!ret && res->op == RAW_SOCK_STREAM)
		ret = io_all(fd, buf, 8, false);
	p->t1 = rps__now_ns();
	return ret;
}

/* ---- baseline: raw transport ops through transport.h -------------------------------------------- */

struct rawt_req {
	uint32_t magic, pad;
	uint64_t bytes;
};

struct rawt_rep {
	uint32_t magic, rkey;
	uint64_t addr, len;
};

/* One side of a raw connection.  Memory: [0, len) target/source of the
 * one-sided ops, then RAWT_NRX receive slots of len, then an 8-byte word. */
struct rawt_side {
	struct rps__fabric *fab;
	struct rps__cq *cq;
	struct rps__listener *lis;
	struct rps__ep *ep;
	char *mem;
	size_t len;
	struct rps__mr *mr;
	struct rawt_rep remote;
	bool broken;
};

static size_t rawt_memlen(size_t len)
{
	return len * (1 + RAWT_NRX) + 64;
}

static int rawt_open(struct rawt_side *s, enum rps__kind kind, const char *device, const char *host)
{
	struct rps__fabric_attr fa = { .kind = kind, .device = device, .host = host };
	int ret;

	memset(s, 0, sizeof(*s));
	ret = rps__fabric_open(&fa, &s->fab);
	if (!ret)
		ret = rps__cq_create(s->fab, 4096, &s->cq);
	return ret;
}

static int rawt_mem(struct rawt_side *s, size_t len, int access)
{
	s->len = RPS__ALIGN_UP(RPS__MAX(len, (size_t)64), 64);
	s->mem = xalloc_aligned(rawt_memlen(s->len));
	return rps__mr_reg(s->fab, s->mem, rawt_memlen(s->len), access, &s->mr);
}

static void rawt_close(struct rawt_side *s)
{
	if (s->ep)
		rps__ep_close(s->ep);
	if (s->mr)
		rps__mr_dereg(s->mr);
	free(s->mem);
	if (s->lis)
		rps__listener_close(s->lis);
	if (s->cq)
		rps__cq_destroy(s->cq);
	if (s->fab)
		rps__fabric_close(s->fab);
	memset(s, 0, sizeof(*s));
}

static void rawt_ep_attr(struct rps__ep_attr *a, int window)
{
	memset(a, 0, sizeof(*a));
	a->sq_depth = (uint32_t)(window * 2 + 16);
	a->rq_depth = RAWT_NRX + 2;
	a->max_inline = 64;
}

static int rawt_post_rx(struct rawt_side *s, uint32_t i)
{
	struct rps__sge sge = { s->mem + s->len * (1 + i), (uint32_t)s->len, s->mr };

	return rps__post_recv(s->ep, &sge, i);
}

/* Responder: take one connection request (waiting up to timeout_ms). */
static int rawt_accept(struct rawt_side *s, int window, int timeout_ms, volatile sig_atomic_t *stop)
{
	struct rps__conn_req *cr = NULL;
	struct rps__ep_attr attr;
	struct rawt_req rq;
	struct rawt_rep rep;
	uint64_t deadline = rps__now_ns() + (uint64_t)timeout_ms * 1000000ull;
	const void *data;
	size_t dlen;
	uint32_t i;
	int ret;

	while ((ret = rps__listener_get_request(s->lis, &cr)) == -EAGAIN) {
		struct pollfd pfd = { .fd = rps__listener_fd(s->lis), .events = POLLIN };
		if ((stop && *stop) || (!stop && rps__now_ns() > deadline))
			return rps__seterr(-ETIMEDOUT, "raw baseline: no connection came to the responder");
		poll(&pfd, 1, 100);
	}
	if (ret)
		return ret;
	data = rps__conn_req_data(cr, &dlen);
	memset(&rq, 0, sizeof(rq));
	memcpy(&rq, data, RPS__MIN(dlen, sizeof(rq)));
	if (rq.magic != RAWT_MAGIC || rq.bytes > 4ull * MAX_BYTES) {
		rps__reject(cr, "not a psperf baseline", 22);
		return rps__seterr(-EPROTO, "raw baseline: a connection that is not psperf's");
	}
	ret = rawt_mem(s, (size_t)rq.bytes,
		       RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC);
	if (ret) {
		rps__reject(cr, "responder out of memory", 24);
		return ret;
	}
	rep = (struct rawt_rep){ RAWT_MAGIC, rps__mr_rkey(s->mr), (uint64_t)(uintptr_t)s->mem, s->len };
	rawt_ep_attr(&attr, window);
	ret = rps__accept(cr, s->cq, &attr, &rep, sizeof(rep), &s->ep);
	for (i = 0; !ret && i < RAWT_NRX; i++)
		ret = rawt_post_rx(s, i);
	return ret;
}

/* Responder progress: answer every SEND with a SEND of the same length. */
static int rawt_peer_progress(struct rawt_side *s, int timeout_ms)
{
	struct rps__wc wc[16];
	int i, n;

	n = timeout_ms ? rps__cq_wait(s->cq, wc, 16, timeout_ms) : rps__cq_poll(s->cq, wc, 16);
	for (i = 0; i < n; i++) {
		if (wc[i].status != RPS__WC_SUCCESS) {
			s->broken = true;
			continue;
		}
		if (wc[i].opcode == RPS__WC_RECV) {
			struct rps__wr wr = { .op = RPS__OP_SEND, .sge = { s->mem, wc[i].byte_len, s->mr } };
			if (wc[i].byte_len <= 64)
				wr.flags |= RPS__WR_INLINE;
			if (rawt_post_rx(s, (uint32_t)wc[i].wr_id) || rps__post(s->ep, &wr, 1))
				s->broken = true;
		}
	}
	return n;
}

struct rawt_conn_job {
	struct rawt_side *s;
	const char *host;
	uint16_t port;
	size_t bytes;
	int window, timeout_ms;
	int ret;
	char err[512];
};

static void *rawt_connect_main(void *arg)
{
	struct rawt_conn_job *j = arg;
	struct rawt_req rq = { RAWT_MAGIC, 0, j->bytes };
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t rlen = RPS__PRIVDATA_MAX;
	struct rps__ep_attr attr;

	rawt_ep_attr(&attr, j->window);
	memset(reply, 0, sizeof(reply));
	j->ret = rps__connect(j->s->fab, j->host, j->port, j->s->cq, &attr, &rq, sizeof(rq), j->timeout_ms,
			      reply, &rlen, &j->s->ep);
	if (!j->ret) {
		memcpy(&j->s->remote, reply, sizeof(j->s->remote));
		if (j->s->remote.magic != RAWT_MAGIC)
			j->ret = rps__seterr(-EPROTO, "raw baseline: the peer is not a psperf responder");
	}
	if (j->ret)
		snprintf(j->err, sizeof(j->err), "%s", rps__errbuf());
	return NULL;
}

/* The initiator's session: its side, and the responder's when in-process. */
struct rawt_session {
	struct rawt_side ini, peer;
	bool local_peer;
	int window;
	int timeout_ms;
};

/* Poll the initiator's CQ (and the local responder's) until `want`
 * completions of success have come; returns how many ops completed. */
static int rawt_wait(struct rawt_session *x, int want, uint64_t *done_at, int ndone)
{
	struct rps__wc wc[32];
	uint64_t deadline = rps__now_ns() + (uint64_t)x->timeout_ms * 1000000ull;
	int got = 0, n, i;
	unsigned spins = 0;

	while (got < want) {
		n = rps__cq_poll(x->ini.cq, wc, RPS__MIN(want - got, 32));
		if (n < 0)
			return n;
		for (i = 0; i < n; i++) {
			if (wc[i].status != RPS__WC_SUCCESS)
				return rps__seterr(-EIO, "raw baseline: %s", rps__wc_status_str(wc[i].status));
			if (wc[i].opcode == RPS__WC_SEND)
				continue;	/* our unsignaled SENDs report nothing; be safe */
			if (done_at && got < ndone)
				done_at[got] = rps__now_ns();
			got++;
		}
		if (x->local_peer)
			rawt_peer_progress(&x->peer, 0);
		if ((++spins & 1023) == 0 && rps__now_ns() > deadline)
			return rps__seterr(-ETIMEDOUT, "raw baseline: no completion within --timeout-ms");
	}
	return got;
}

static void rawt_wr(struct rawt_session *x, const struct raw_result *res, struct rps__wr *wr)
{
	struct rawt_side *s = &x->ini;

	memset(wr, 0, sizeof(*wr));
	wr->flags = RPS__WR_SIGNALED;
	wr->raddr = s->remote.addr;
	wr->rkey = s->remote.rkey;
	wr->sge = (struct rps__sge){ s->mem, (uint32_t)res->a, s->mr };
	switch (res->op) {
	case RAW_WRITE: case RAW_WRITE_BW: wr->op = RPS__OP_WRITE; break;
	case RAW_READ: case RAW_READ_BW: wr->op = RPS__OP_READ; break;
	case RAW_CAS:
		wr->op = RPS__OP_CAS;
		wr->sge = (struct rps__sge){ s->mem + s->len * (1 + RAWT_NRX), 8, s->mr };
		break;
	default:
		wr->op = RPS__OP_SEND;
		wr->flags = 0;
		break;
	}
	if ((wr->op == RPS__OP_WRITE || wr->op == RPS__OP_SEND) && res->a <= 64)
		wr->flags |= RPS__WR_INLINE;
}

static int rawt_post(struct rawt_session *x, const struct rps__wr *wr)
{
	int ret;

	while ((ret = rps__post(x->ini.ep, wr, 1)) == -EAGAIN)
		if (rawt_wait(x, 1, NULL, 0) < 0)
			return -EIO;
	return ret;
}

/* One op: post it, wait for its completion (SEND: for the peer's reply). */
static int rawt_one(struct rawt_session *x, const struct raw_result *res, const struct rps__wr *wr)
{
	int ret;

	if (res->op == RAW_SEND_PP) {
		struct rps__sge sge = { x->ini.mem + x->ini.len, (uint32_t)x->ini.len, x->ini.mr };
		ret = rps__post_recv(x->ini.ep, &sge, 0);
		if (ret)
			return ret;
	}
	ret = rawt_post(x, wr);
	if (ret)
		return ret;
	return rawt_wait(x, 1, NULL, 0) < 0 ? -EIO : 0;
}

static int rawt_lat(struct rawt_session *x, struct raw_result *res, long warmup, struct pass *p)
{
	struct rps__wr wr;
	long i;
	int ret;

	rawt_wr(x, res, &wr);
	samples_reserve(&p->s, (size_t)res->iters);
	for (i = -warmup; i < res->iters; i++) {
		uint64_t t0;
		if (i == 0)
			p->t0 = rps__now_ns();
		t0 = rps__now_ns();
		ret = rawt_one(x, res, &wr);
		if (ret)
			return ret;
		if (i >= 0)
			samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	return 0;
}

/* count ops with --window in flight; completions come in posting order. */
static int rawt_bw(struct rawt_session *x, struct raw_result *res, struct pass *p)
{
	int win = x->window;
	uint64_t *ts = xcalloc((size_t)win, sizeof(*ts));
	long posted = 0, done = 0;
	struct rps__wr wr;
	int ret = 0;

	rawt_wr(x, res, &wr);
	samples_reserve(&p->s, (size_t)res->count);
	p->t0 = rps__now_ns();
	while (done < res->count && !ret) {
		uint64_t at;
		while (posted < res->count && posted - done < win && !ret) {
			ts[posted % win] = rps__now_ns();
			ret = rawt_post(x, &wr);
			posted += !ret;
		}
		if (ret || rawt_wait(x, 1, &at, 1) < 0) {
			ret = -EIO;
			break;
		}
		samples_add(&p->s, at - ts[done % win]);
		done++;
	}
	p->t1 = rps__now_ns();
	free(ts);
	return ret;
}

static int rawt_local_connect(struct rawt_session *x, const char *host, size_t bytes)
{
	struct rawt_conn_job job = { &x->ini, host, 0, bytes, x->window, x->timeout_ms, 0, "" };
	pthread_t th;
	int ret;

	ret = rps__listen(x->peer.fab, host, 0, &x->peer.lis);
	if (ret)
		return ret;
	job.port = rps__listener_port(x->peer.lis);
	ret = pthread_create(&th, NULL, rawt_connect_main, &job);
	if (ret)
		return rps__seterr(-ret, "pthread_create: %s", strerror(ret));
	ret = rawt_accept(&x->peer, x->window, x->timeout_ms, NULL);
	pthread_join(th, NULL);
	if (job.ret)
		return rps__seterr(job.ret, "%s", job.err);
	return ret;
}

static int rawt_session_open(struct run *r, struct rawt_session *x, enum rps__kind kind, size_t bytes)
{
	const char *dev = kind == RPS__KIND_VERBS ? r->o->device : NULL;
	struct rawt_conn_job job;
	int ret;

	memset(x, 0, sizeof(*x));
	x->window = r->o->window;
	x->timeout_ms = r->o->timeout_ms;
	x->local_peer = !r->remote_peer;
	ret = rawt_open(&x->ini, kind, dev, r->addr);
	if (!ret)
		ret = rawt_mem(&x->ini, bytes, RPS__ACCESS_LOCAL);
	if (ret)
		return ret;
	if (x->local_peer) {
		ret = rawt_open(&x->peer, kind, dev, r->addr);
		return ret ? ret : rawt_local_connect(x, r->addr, bytes);
	}
	memset(&job, 0, sizeof(job));
	job = (struct rawt_conn_job){ &x->ini, r->addr, r->rawt_port, bytes, x->window, x->timeout_ms, 0, "" };
	rawt_connect_main(&job);
	return job.ret ? rps__seterr(job.ret, "%s", job.err) : 0;
}

static void rawt_session_close(struct rawt_session *x)
{
	rawt_close(&x->ini);
	rawt_close(&x->peer);
}

/* ---- baselines: which, and running them -------------------------------------------------- */

static const char *raw_op_name(enum raw_op op)
{
	switch (op) {
	case RAW_SOCK_RR: return "socket req/resp";
	case RAW_SOCK_STREAM: return "socket stream";
	case RAW_WRITE: return "WRITE";
	case RAW_READ: return "READ";
	case RAW_CAS: return "CAS";
	case RAW_SEND_PP: return "SEND ping-pong";
	case RAW_WRITE_BW: return "WRITE bw";
	case RAW_READ_BW: return "READ bw";
	case RAW_MEMCPY: return "memcpy";
	default: return "-";
	}
}

static bool raw_is_transport(enum raw_op op)
{
	return op >= RAW_WRITE && op <= RAW_READ_BW;
}

static struct raw_result *raw_add(struct run *r, enum raw_op op, size_t a, size_t b, long iters, long count)
{
	struct raw_result *x;
	size_t i;

	for (i = 0; i < r->nraws; i++) {
		x = &r->raws[i];
		if (x->op == op && x->a == a && x->b == b && x->iters == iters && x->count == count)
			return x;
	}
	if (!r->raws)
		r->raws = xcalloc(8 * (r->nrows + 8), sizeof(*r->raws));
	x = &r->raws[r->nraws++];
	memset(x, 0, sizeof(*x));
	x->op = op;
	x->a = a;
	x->b = b;
	x->iters = iters;
	x->count = count;
	x->is_bw = op == RAW_SOCK_STREAM || op == RAW_WRITE_BW || op == RAW_READ_BW;
	if (op == RAW_SOCK_RR)
		snprintf(x->name, sizeof(x->name), "socket %zu->%zu", a, b);
	else if (op == RAW_SEND_PP)
		snprintf(x->name, sizeof(x->name), "SEND ping-pong %zu", a);
	else
		snprintf(x->name, sizeof(x->name), "%s %zu", raw_op_name(op), a);
	return x;
}

/* The raw ops that match a row: latency and bandwidth. */
static void raw_plan_row(struct run *r, struct row *row, bool transport)
{
	size_t P = pull_bytes(r->o, row), S = row->bytes;
	long n = row->iters, total = row->iters * row->workers;

	switch (row->test) {
	case T_PUSH:
		row->raw_lat = transport ? raw_add(r, RAW_WRITE, S, 0, n, n) : raw_add(r, RAW_SOCK_RR, S, 8, n, n);
		row->raw_bw = transport ? raw_add(r, RAW_WRITE_BW, S, 0, n, total)
					: raw_add(r, RAW_SOCK_STREAM, S, 0, n, total);
		break;
	case T_PULL:
		row->raw_lat = transport ? raw_add(r, RAW_READ, P, 0, n, n) : raw_add(r, RAW_SOCK_RR, 8, P, n, n);
		row->raw_bw = transport ? raw_add(r, RAW_READ_BW, P, 0, n, total)
					: raw_add(r, RAW_SOCK_STREAM, P, 0, n, total);
		break;
	case T_PUSHPULL:
		row->raw_lat = transport ? raw_add(r, RAW_SEND_PP, RPS__MAX(S, P), 0, n, n)
					 : raw_add(r, RAW_SOCK_RR, S, P, n, n);
		row->raw_bw = transport ? raw_add(r, RAW_WRITE_BW, S, 0, n, total)
					: raw_add(r, RAW_SOCK_STREAM, S, 0, n, total);
		break;
	case T_LOCK:
		row->raw_lat = transport ? raw_add(r, RAW_CAS, 8, 0, n, n) : raw_add(r, RAW_SOCK_RR, 8, 8, n, n);
		break;
	case T_COMMIT: {
		/* the admin request and reply: the same bytes, raw */
		size_t q = sizeof(struct rps__msg_hdr) + sizeof(struct rps__admin);
		size_t a = sizeof(struct rps__msg_hdr) + sizeof(struct rps__admin_rep);
		row->raw_lat = transport ? raw_add(r, RAW_SEND_PP, RPS__MAX(q, a), 0, n, n)
					 : raw_add(r, RAW_SOCK_RR, q, a, n, n);
		break;
	}
	default:
		break;
	}
}

static long raw_warmup(const struct run *r, const struct raw_result *x)
{
	return row_warmup(r->o, x->iters);
}

static int raw_run_socket(struct run *r, int fd, struct raw_result *x, char *buf)
{
	struct pass p = { { NULL, 0, 0 }, 0, 0 };
	int ret;

	ret = sock_run(fd, x, raw_warmup(r, x), &p, buf);
	if (!ret)
		stats_compute(&x->st, &p, x->op == RAW_SOCK_RR ? (double)(x->a + x->b) : (double)x->a);
	samples_free(&p.s);
	return ret;
}

static int raw_run_transport(struct run *r, struct rawt_session *s, struct raw_result *x)
{
	struct pass p = { { NULL, 0, 0 }, 0, 0 };
	int ret;

	ret = x->is_bw ? rawt_bw(s, x, &p) : rawt_lat(s, x, raw_warmup(r, x), &p);
	if (!ret)
		stats_compute(&x->st, &p, x->op == RAW_SEND_PP ? 2.0 * (double)x->a : (double)x->a);
	samples_free(&p.s);
	return ret;
}

static size_t raw_max_bytes(const struct run *r, bool transport)
{
	size_t i, m = 64;

	for (i = 0; i < r->nraws; i++)
		if (raw_is_transport(r->raws[i].op) == transport && r->raws[i].op != RAW_MEMCPY)
			m = RPS__MAX(m, RPS__MAX(r->raws[i].a, r->raws[i].b));
	return m;
}

/* Over tcp with --raw-transport: the transport's own ops too, for
 * reference (row->raw_x; they do not enter the ratios). */
static void raw_plan_transport_extra(struct run *r, struct row *row)
{
	struct raw_result *keep_l = row->raw_lat, *keep_b = row->raw_bw;

	raw_plan_row(r, row, true);
	row->raw_x[0] = row->raw_lat;
	row->raw_x[1] = row->raw_bw;
	row->raw_lat = keep_l;
	row->raw_bw = keep_b;
	if (row->raw_x[0])
		row->raw_x[0]->transport_tcp = true;
	if (row->raw_x[1])
		row->raw_x[1]->transport_tcp = true;
}

/* Decide every row's raw operations before the run (--baseline). */
static void raw_plan_all(struct run *r)
{
	bool transport = r->kind == RPS__KIND_VERBS;
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		if (in_process(r->rows[i].test))
			continue;
		raw_plan_row(r, &r->rows[i], transport);
		if (!transport && r->o->raw_transport)
			raw_plan_transport_extra(r, &r->rows[i]);
	}
}

/* Worker 0's baseline session, open for the whole run, so that each row's
 * raw operations run right after the row (while the other workers wait at
 * the barrier): a ratio then compares figures taken under the same load. */
struct baseline {
	struct sock_peer peer;
	bool peer_started;
	int fd;
	char *buf;
	struct rawt_session rs;
	bool rs_open;
	bool failed;
};

static bool raw_is_socket(enum raw_op op)
{
	return op == RAW_SOCK_RR || op == RAW_SOCK_STREAM;
}

static void baseline_fail(struct run *r, struct baseline *b, const char *fmt, ...) RPS__PRINTF(3, 4);

static void baseline_fail(struct run *r, struct baseline *b, const char *fmt, ...)
{
	va_list ap;

	b->failed = true;
	if (r->base_err[0])
		return;
	va_start(ap, fmt);
	vsnprintf(r->base_err, sizeof(r->base_err), fmt, ap);
	va_end(ap);
}

static int baseline_open_socket(struct run *r, struct baseline *b)
{
	uint16_t port = r->sock_port;

	b->buf = xalloc_aligned(raw_max_bytes(r, false));
	if (!r->remote_peer) {
		b->peer.lfd = sock_listen(r->addr, 0, &b->peer.port);
		if (b->peer.lfd < 0) {
			baseline_fail(r, b, "socket baseline: listening on %s: %s", r->addr, strerror(-b->peer.lfd));
			return -1;
		}
		b->peer_started = pthread_create(&b->peer.thread, NULL, sock_peer_main, &b->peer) == 0;
		port = b->peer.port;
	}
	b->fd = sock_connect(r->addr, port);
	if (b->fd < 0) {
		baseline_fail(r, b, "socket baseline: connecting to %s port %u: %s%s", r->addr, port, strerror(-b->fd),
			      r->remote_peer ? ": run server 0 as psperf --server --baseline" : "");
		return -1;
	}
	return 0;
}

static int baseline_open(struct run *r, struct baseline *b)
{
	bool any_sock = false, any_t = false;
	size_t i;

	memset(b, 0, sizeof(*b));
	b->fd = -1;
	b->peer.lfd = -1;
	for (i = 0; i < r->nraws; i++) {
		any_sock |= raw_is_socket(r->raws[i].op);
		any_t |= raw_is_transport(r->raws[i].op);
	}
	if (any_sock && baseline_open_socket(r, b))
		return -1;
	if (any_t) {
		b->rs_open = true;
		if (rawt_session_open(r, &b->rs, r->kind, raw_max_bytes(r, true))) {
			baseline_fail(r, b, "%s transport baseline: %s%s", r->kind == RPS__KIND_VERBS ? "verbs" : "tcp",
				      rps__errbuf(),
				      r->remote_peer ? " (is server 0 running psperf --server --baseline?)" : "");
			return -1;
		}
	}
	return 0;
}

static void baseline_close(struct baseline *b)
{
	if (b->fd >= 0) {
		struct sock_cmd q = { SOCK_MAGIC, SOCKOP_QUIT, 0, 0, 0 };
		io_all(b->fd, &q, sizeof(q), true);
		close(b->fd);
	}
	if (b->peer_started)
		pthread_join(b->peer.thread, NULL);
	if (b->peer.lfd >= 0)
		close(b->peer.lfd);
	if (b->rs_open)
		rawt_session_close(&b->rs);
	free(b->buf);
	memset(b, 0, sizeof(*b));
	b->fd = -1;
	b->peer.lfd = -1;
}

static void baseline_one(struct run *r, struct baseline *b, struct raw_result *x)
{
	int ret;

	if (!x || x->st.valid || b->failed)
		return;
	if (raw_is_socket(x->op)) {
		ret = raw_run_socket(r, b->fd, x, b->buf);
		if (ret)
			baseline_fail(r, b, "socket baseline %s: %s", x->name, strerror(-ret));
		return;
	}
	ret = raw_run_transport(r, &b->rs, x);
	if (ret)
		baseline_fail(r, b, "%s transport baseline %s: %s", r->kind == RPS__KIND_VERBS ? "verbs" : "tcp", x->name,
			      rps__errbuf());
}

/* NULL when the session could not open (the failure is recorded). */
static struct baseline *baseline_new(struct run *r)
{
	struct baseline *b = xcalloc(1, sizeof(*b));

	if (baseline_open(r, b)) {
		baseline_close(b);
		free(b);
		return NULL;
	}
	return b;
}

static void baseline_free(struct baseline *b)
{
	if (!b)
		return;
	baseline_close(b);
	free(b);
}

/* The raw operations of one row that are not measured yet. */
static void baseline_row(struct run *r, struct baseline *b, const struct row *row)
{
	if (!b)
		return;
	baseline_one(r, b, row->raw_lat);
	baseline_one(r, b, row->raw_bw);
	baseline_one(r, b, row->raw_x[0]);
	baseline_one(r, b, row->raw_x[1]);
}

/* ---- figures and ratios ------------------------------------------------------------------------ */

static double ratio(double ours, double raw)
{
	return raw > 0 && ours > 0 ? ours / raw : NAN;
}

static void compute_figures(struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		struct row *row = &r->rows[i];
		stats_compute(&row->s_lat, &row->lat, row->moved);
		stats_compute(&row->s_bw, &row->bw, row->moved);
		if (!row->s_bw.valid)
			row->s_bw = row->s_lat;
		row->x_lat = row->raw_lat && row->raw_lat->st.valid ? ratio(row->s_lat.typ, row->raw_lat->st.typ) : NAN;
		row->x_bw = row->raw_bw && row->raw_bw->st.valid ? ratio(row->s_bw.gbs, row->raw_bw->st.gbs) : NAN;
		if (in_process(row->test) && row->raw_lat)
			row->x_lat = ratio(row->s_lat.typ, row->raw_lat->st.typ);
		row->x_rtt = NAN;
	}
	{
		struct row *cr = plan_commit_row(r, false), *rr = plan_commit_row(r, true);
		if (cr && rr && cr->s_lat.valid && rr->s_lat.valid)
			cr->x_rtt = ratio(cr->s_lat.typ, rr->s_lat.typ);
	}
}

/* ---- output: tables ---------------------------------------------------------------------------- */

static bool show_raw(const struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (!in_process(r->rows[i].test) && (r->rows[i].raw_lat || r->rows[i].raw_bw))
			return true;
	return false;
}

static void fmt_num(char *buf, size_t len, double v, const char *fmt)
{
	if (isnan(v))
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, fmt, v);
}

static void print_header(const struct run *r, enum test_id t, bool raw)
{
	const struct opts *o = r->o;
	char line[96];

	memset(line, '-', sizeof(line) - 1);
	line[sizeof(line) - 1] = '\0';
	printf("%s\n", line);
	switch (t) {
	case T_AGG:
		printf(" agg: rps__agg_add of %d %s gradients into an fp32 accumulator (%s code path), in-process\n",
		       r->W, rps__dtype_name(o->dtype), rps__agg_isa_name(rps__agg_best_isa()));
		printf(" BW = gradient bytes summed per second; raw = memcpy of the same bytes\n");
		break;
	case T_CRC:
		printf(" crc: CRC-32C (ISA-L crc32_iscsi, as checkpoint and log files use) of fp32\n"
		       " parameter-like data, in-process, one thread\n");
		printf(" BW = bytes checksummed per second; raw = memcpy of the same bytes\n");
		break;
	case T_IGZIP:
		printf(" igzip: ISA-L raw deflate, level 1 (isal_deflate_stateless, as checkpoint records use) of\n"
		       " fp32 parameter-like data (small normal-ish floats) and of zeros, in-process, one thread\n");
		printf(" BW = input bytes compressed per second; raw = memcpy of the same bytes;"
		       " ratio = input / output\n");
		break;
	case T_COMMIT:
		printf(" commit: ADMIN NOP to the Raft leader, answered once its log entry is applied (append to the\n"
		       " followers, their acks, commit, apply); %d voters, leader %llu, term %llu, fsync %s;\n"
		       " one admin connection, one call at a time.  admin round trip: STATUS on it (no log entry)\n",
		       r->commit_voters, (unsigned long long)r->commit_leader, (unsigned long long)r->commit_term,
		       r->commit_fsync < 0 ? "?" : r->commit_fsync ? "always" : "none");
		if (raw)
			printf(" raw: %s of the admin messages' sizes\n",
			       r->kind == RPS__KIND_VERBS ? "SEND ping-pong" : "socket request/response");
		break;
	case T_LOCK:
		printf(" lock: rps__tensor_lock + rps__tensor_unlock of shard 0 of an async tensor (RDMA CAS)\n");
		printf(" xN = N workers at once on the same lock; raw = %s\n",
		       r->kind == RPS__KIND_VERBS ? "CAS + completion" : "8-byte socket request/response");
		break;
	default:
		printf(" %s: %s, %s, %s; %d server(s), %d worker(s) at once; window %d\n", test_names[t],
		       t == T_PUSH ? "rps_push" : t == T_PULL ? "rps_pull" : "rps_push + rps_pull",
		       mode_name(o->mode), rps__dtype_name(o->dtype), r->nservers, r->W, o->window);
		if (raw)
			printf(" raw: %s\n", r->kind == RPS__KIND_VERBS
			       ? (t == T_PUSH ? "RDMA WRITE + completion; WRITE bw" : t == T_PULL ? "RDMA READ + completion; READ bw"
				  : "SEND ping-pong; WRITE bw")
			       : (t == T_PUSH ? "socket: S bytes there, 8 back; one-way stream of the same bytes"
				  : t == T_PULL ? "socket: 8 bytes there, S back; one-way stream"
				  : "socket: S bytes there, S back; one-way stream"));
		break;
	}
	if (o->role == ROLE_WORKER && !in_process(t) && t != T_COMMIT)
		printf(" figures of worker %d of %d only\n", o->rank, o->num_workers);
	printf("%s\n", line);
	printf(" %-*s %8s %10s %10s %10s %10s %11s %10s %11s", t == T_COMMIT ? 22 : t == T_IGZIP ? 15 : 12,
	       t == T_LOCK || t == T_COMMIT ? "op" : "#bytes", "#iters",
	       "t_min[us]", "t_typ[us]", "t_avg[us]", "t_p99[us]", "t_p99.9[us]", "BW[GB/s]", "ops/s");
	if (raw)
		printf(" %10s %7s %10s %7s", "raw[us]", "x_lat", "raw[GB/s]", "x_bw");
	if (t == T_IGZIP)
		printf(" %8s", "ratio");
	printf("\n");
}

static void print_row(const struct row *row, bool raw)
{
	char first[32], b[4][32];
	const struct stats *s = &row->s_lat;
	bool no_bw = row->test == T_LOCK || row->test == T_COMMIT;
	int w = row->test == T_COMMIT ? 22 : row->test == T_IGZIP ? 15 : 12;

	if (row->label[0])
		snprintf(first, sizeof(first), "%s", row->label);
	else
		snprintf(first, sizeof(first), "%zu", row->bytes);
	if (!s->valid) {
		printf(" %-*s %8s   (%s)\n", w, first, "-", row->lock_alone ? "measured by worker 0" : "no samples");
		return;
	}
	fmt_num(b[0], sizeof(b[0]), no_bw ? NAN : row->s_bw.gbs, "%.3f");
	printf(" %-*s %8llu %10.2f %10.2f %10.2f %10.2f %11.2f %10s %11.0f", w, first, (unsigned long long)s->n, s->min,
	       s->typ, s->avg, s->p99, s->p999, b[0], no_bw ? s->ops : row->s_bw.ops);
	if (raw) {
		fmt_num(b[1], sizeof(b[1]), row->raw_lat && row->raw_lat->st.valid ? row->raw_lat->st.typ : NAN, "%.2f");
		fmt_num(b[2], sizeof(b[2]), row->x_lat, "%.2f");
		fmt_num(b[3], sizeof(b[3]), row->raw_bw && row->raw_bw->st.valid && !no_bw
			? row->raw_bw->st.gbs : NAN, "%.3f");
		printf(" %10s %7s %10s", b[1], b[2], b[3]);
		fmt_num(b[0], sizeof(b[0]), row->x_bw, "%.2f");
		printf(" %7s", no_bw ? "-" : b[0]);
	}
	if (row->test == T_IGZIP)
		printf(" %8.2f", row->ratio);
	printf("\n");
}

static void print_raw_tables(const struct run *r)
{
	size_t i;

	if (!r->nraws)
		return;
	printf("------------------------------------------------------------------------------------------------\n");
	printf(" baseline: raw operations on the same path (%s%s)\n", r->kind == RPS__KIND_VERBS ? "verbs, device " : "tcp",
	       r->kind == RPS__KIND_VERBS ? r->device : "");
	printf("------------------------------------------------------------------------------------------------\n");
	printf(" %-32s %8s %10s %10s %10s %10s %11s %10s %11s\n", "op", "#iters", "t_min[us]", "t_typ[us]",
	       "t_avg[us]", "t_p99[us]", "t_p99.9[us]", "BW[GB/s]", "ops/s");
	for (i = 0; i < r->nraws; i++) {
		const struct raw_result *x = &r->raws[i];
		char name[80];
		snprintf(name, sizeof(name), "%s%s", x->transport_tcp ? "tcp-transport " : "", x->name);
		if (!x->st.valid) {
			printf(" %-32s   (not measured)\n", name);
			continue;
		}
		printf(" %-32s %8llu %10.2f %10.2f %10.2f %10.2f %11.2f %10.3f %11.0f\n", name,
		       (unsigned long long)x->st.n, x->st.min, x->st.typ, x->st.avg, x->st.p99, x->st.p999, x->st.gbs,
		       x->st.ops);
	}
}

static void print_commit_ratio(struct run *r)
{
	const struct row *cr = plan_commit_row(r, false);
	char x[32];

	if (!cr)
		return;
	fmt_num(x, sizeof(x), cr->x_rtt, "%.2f");
	printf(" commit / admin round trip (t_typ): %s", x);
	if (cr->raw_lat && cr->raw_lat->st.valid) {
		fmt_num(x, sizeof(x), cr->x_lat, "%.2f");
		printf("; commit / raw %s (t_typ): %s", cr->raw_lat->name, x);
	}
	printf("\n");
}

static void print_banner(const struct run *r)
{
	char host[256] = "", date[64];
	double load[3] = { 0, 0, 0 };
	time_t now = time(NULL);

	gethostname(host, sizeof(host) - 1);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	if (getloadavg(load, 3) < 0)
		load[0] = load[1] = load[2] = NAN;
	printf(" psperf %s (rdmaps %d.%d) on %s, %s: %s, device %s, %s; load %.2f %.2f %.2f\n", PACKAGE_VERSION,
	       RPS_VERSION_MAJOR, RPS_VERSION_MINOR, host, date, r->kind == RPS__KIND_VERBS ? "verbs" : "tcp",
	       r->device[0] ? r->device : "-", r->addr[0] ? r->addr : "-", load[0], load[1], load[2]);
}

static void print_tables(struct run *r)
{
	bool raw = show_raw(r);
	int t;
	size_t i;

	print_banner(r);

	for (t = 0; t < T_NTESTS; t++) {
		bool any = false;
		for (i = 0; i < r->nrows; i++)
			any |= r->rows[i].test == (enum test_id)t;
		if (!any)
			continue;
		print_header(r, (enum test_id)t, raw || in_process((enum test_id)t));
		for (i = 0; i < r->nrows; i++)
			if (r->rows[i].test == (enum test_id)t)
				print_row(&r->rows[i], raw || in_process((enum test_id)t));
		if (t == T_COMMIT)
			print_commit_ratio(r);
	}
	print_raw_tables(r);
	printf("------------------------------------------------------------------------------------------------\n");
	fflush(stdout);
}

/* ---- output: CSV --------------------------------------------------------------------------------- */

static void csv_num(double v)
{
	if (isnan(v) || isinf(v))
		printf(",");
	else
		printf(",%.6g", v);
}

static void csv_stats(const struct stats *s)
{
	printf(",%llu", (unsigned long long)s->n);
	csv_num(s->valid ? s->min : NAN);
	csv_num(s->valid ? s->typ : NAN);
	csv_num(s->valid ? s->avg : NAN);
	csv_num(s->valid ? s->p99 : NAN);
	csv_num(s->valid ? s->p999 : NAN);
	csv_num(s->valid ? s->gbs : NAN);
	csv_num(s->valid ? s->ops : NAN);
}

static void print_csv(const struct run *r)
{
	size_t i;

	printf("test,label,bytes,moved_bytes,workers,iters,t_min_us,t_typ_us,t_avg_us,t_p99_us,t_p999_us,lat_gbs,lat_ops_s,"
	       "bw_iters,bw_t_min_us,bw_t_typ_us,bw_t_avg_us,bw_t_p99_us,bw_t_p999_us,bw_gbs,ops_s,"
	       "raw_lat_op,raw_t_typ_us,x_lat,raw_bw_op,raw_gbs,x_bw\n");
	for (i = 0; i < r->nrows; i++) {
		const struct row *row = &r->rows[i];
		printf("%s,%s,%zu,%.0f,%d", test_names[row->test], row->label, row->bytes, row->moved, row->workers);
		csv_stats(&row->s_lat);
		csv_stats(&row->s_bw);
		printf(",%s", row->raw_lat ? row->raw_lat->name : "");
		csv_num(row->raw_lat ? row->raw_lat->st.typ : NAN);
		csv_num(row->x_lat);
		printf(",%s", row->raw_bw ? row->raw_bw->name : "");
		csv_num(row->raw_bw ? row->raw_bw->st.gbs : NAN);
		csv_num(row->x_bw);
		printf("\n");
	}
	for (i = 0; i < r->nraws; i++) {
		const struct raw_result *x = &r->raws[i];
		printf("raw,%s%s,%zu,%zu,1", x->transport_tcp ? "tcp-transport " : "", x->name, x->a, x->b);
		csv_stats(&x->st);
		csv_stats(&x->st);
		printf(",,,,,,\n");
	}
	fflush(stdout);
}

/* ---- output: JSON -------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static void json_num(FILE *f, double v)
{
	if (isnan(v) || isinf(v))
		fprintf(f, "null");
	else
		fprintf(f, "%.6g", v);
}

static void json_kv_str(FILE *f, const char *k, const char *v, bool comma)
{
	fprintf(f, "\"%s\": ", k);
	json_str(f, v);
	fprintf(f, comma ? ", " : "");
}

static void json_stats(FILE *f, const char *key, const struct stats *s)
{
	fprintf(f, "\"%s\": ", key);
	if (!s->valid) {
		fprintf(f, "null");
		return;
	}
	fprintf(f, "{\"n\": %llu, \"t_min_us\": ", (unsigned long long)s->n);
	json_num(f, s->min);
	fprintf(f, ", \"t_typical_us\": ");
	json_num(f, s->typ);
	fprintf(f, ", \"t_avg_us\": ");
	json_num(f, s->avg);
	fprintf(f, ", \"t_p99_us\": ");
	json_num(f, s->p99);
	fprintf(f, ", \"t_p999_us\": ");
	json_num(f, s->p999);
	fprintf(f, ", \"bw_gbs\": ");
	json_num(f, s->gbs);
	fprintf(f, ", \"ops_s\": ");
	json_num(f, s->ops);
	fprintf(f, "}");
}

static void json_raw(FILE *f, const char *key, const struct raw_result *x)
{
	fprintf(f, "\"%s\": ", key);
	if (!x) {
		fprintf(f, "null");
		return;
	}
	fprintf(f, "{");
	json_kv_str(f, "op", raw_op_name(x->op), true);
	json_kv_str(f, "name", x->name, true);
	fprintf(f, "\"a_bytes\": %zu, \"b_bytes\": %zu, \"iters\": %ld, \"count\": %ld, \"tcp_transport\": %s, ",
		x->a, x->b, x->iters, x->count, x->transport_tcp ? "true" : "false");
	json_stats(f, "stats", &x->st);
	fprintf(f, "}");
}

static void json_config(FILE *f, const struct run *r)
{
	const struct opts *o = r->o;
	struct utsname u;
	char host[256] = "", date[64], kern[600], ver[32];
	double load[3];
	time_t now = time(NULL);
	int i;

	gethostname(host, sizeof(host) - 1);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	if (uname(&u) == 0)
		snprintf(kern, sizeof(kern), "%s %s %s %s", u.sysname, u.release, u.version, u.machine);
	else
		snprintf(kern, sizeof(kern), "?");
	snprintf(ver, sizeof(ver), "%d.%d", RPS_VERSION_MAJOR, RPS_VERSION_MINOR);
	fprintf(f, "  \"config\": {");
	json_kv_str(f, "label", o->label ? o->label : "", true);
	json_kv_str(f, "host", host, true);
	json_kv_str(f, "date", date, true);
	json_kv_str(f, "kernel", kern, true);
	json_kv_str(f, "cpu", r->cpu, true);
	if (getloadavg(load, 3) == 3)
		fprintf(f, "\"loadavg\": [%.2f, %.2f, %.2f], \"ncpus\": %ld, ", load[0], load[1], load[2],
			sysconf(_SC_NPROCESSORS_ONLN));
	json_kv_str(f, "psperf_version", PACKAGE_VERSION, true);
	json_kv_str(f, "rdmaps_version", ver, true);
	json_kv_str(f, "role", o->role == ROLE_LOCAL ? "local" : "worker", true);
	json_kv_str(f, "transport", r->kind == RPS__KIND_VERBS ? "verbs" : "tcp", true);
	json_kv_str(f, "device", r->device, true);
	json_kv_str(f, "addr", r->addr, true);
	json_kv_str(f, "servers_uri", r->servers, true);
	fprintf(f, "\n    \"options\": {\"tests\": [");
	for (i = 0; i < T_NTESTS; i++)
		if (o->tests & (1u << i))
			fprintf(f, "%s\"%s\"", (o->tests & ((1u << i) - 1)) ? ", " : "", test_names[i]);
	fprintf(f, "], \"servers\": %d, \"workers\": %d, \"size_min\": %zu, \"size_max\": %zu, \"factor\": %u, "
		"\"iters\": %ld, \"warmup\": %ld, \"window\": %d, ",
		r->nservers, r->W, o->size_min, o->size_max, o->factor, o->iters, o->warmup,
		o->window);
	json_kv_str(f, "mode", mode_name(o->mode), true);
	fprintf(f, "\"staleness\": %u, ", o->staleness);
	json_kv_str(f, "dtype", rps__dtype_name(o->dtype), true);
	json_kv_str(f, "optimizer", optimizer_name(o->optimizer), true);
	fprintf(f, "\"shard_bytes\": %u, \"slots\": %u, \"spin_us\": %d, \"timeout_ms\": %d, \"baseline\": %s, "
		"\"rank\": %d, \"num_workers\": %d, ",
		o->shard_bytes, o->slots, o->spin_us, o->timeout_ms, o->baseline ? "true" : "false", o->rank,
		o->num_workers);
	json_kv_str(f, "tag", o->tag, true);
	json_kv_str(f, "fsync", o->fsync_none ? "none" : "always", true);
	if (r->commit_leader)
		fprintf(f, "\"commit_leader\": %llu, \"commit_term\": %llu, \"commit_voters\": %d, "
			"\"commit_fsync\": %s, ", (unsigned long long)r->commit_leader,
			(unsigned long long)r->commit_term, r->commit_voters, r->commit_fsync ? "true" : "false");
	json_kv_str(f, "agg_isa", rps__agg_isa_name(rps__agg_best_isa()), false);
	fprintf(f, "},\n    \"argv\": [");
	for (i = 0; i < o->argc; i++) {
		if (i)
			fprintf(f, ", ");
		json_str(f, o->argv[i]);
	}
	fprintf(f, "]\n  },\n");
}

static void json_row(FILE *f, const struct row *row)
{
	fprintf(f, "    {");
	json_kv_str(f, "test", test_names[row->test], true);
	json_kv_str(f, "label", row->label, true);
	fprintf(f, "\"bytes\": %zu, \"moved_bytes\": %.0f, \"workers\": %d, \"iters\": %ld, \"warmup\": %ld,\n     ",
		row->bytes, row->moved, row->workers, row->iters, row->warmup);
	json_stats(f, "latency", &row->s_lat);
	fprintf(f, ",\n     ");
	json_stats(f, "bandwidth", &row->s_bw);
	fprintf(f, ",\n     ");
	json_raw(f, "raw_latency", row->raw_lat);
	fprintf(f, ",\n     ");
	json_raw(f, "raw_bandwidth", row->raw_bw);
	fprintf(f, ",\n     \"x_lat\": ");
	json_num(f, row->x_lat);
	fprintf(f, ", \"x_bw\": ");
	json_num(f, row->x_bw);
	if (row->test == T_COMMIT && !row->commit_rtt) {
		fprintf(f, ", \"x_rtt\": ");
		json_num(f, row->x_rtt);
	}
	if (row->test == T_IGZIP) {
		fprintf(f, ", \"ratio\": ");
		json_num(f, row->ratio);
	}
	fprintf(f, "}");
}

static int write_json(const struct run *r, const char *path)
{
	FILE *f = fopen(path, "w");
	size_t i;

	if (!f) {
		fprintf(stderr, "psperf: --json %s: %s: give a writable path\n", path, strerror(errno));
		return -errno;
	}
	fprintf(f, "{\n  \"format\": \"psperf-1\",\n");
	json_config(f, r);
	fprintf(f, "  \"rows\": [\n");
	for (i = 0; i < r->nrows; i++) {
		json_row(f, &r->rows[i]);
		fprintf(f, "%s\n", i + 1 < r->nrows ? "," : "");
	}
	fprintf(f, "  ],\n  \"baselines\": [\n");
	for (i = 0; i < r->nraws; i++) {
		fprintf(f, "    {");
		json_raw(f, "raw", &r->raws[i]);
		fprintf(f, "}%s\n", i + 1 < r->nraws ? "," : "");
	}
	fprintf(f, "  ]\n}\n");
	if (fclose(f)) {
		fprintf(stderr, "psperf: --json %s: %s\n", path, strerror(errno));
		return -EIO;
	}
	return 0;
}

/* ---- roles ------------------------------------------------------------------------------------------ */

static void read_cpu(struct run *r)
{
	char line[256];
	FILE *f = fopen("/proc/cpuinfo", "r");

	snprintf(r->cpu, sizeof(r->cpu), "?");
	while (f && fgets(line, sizeof(line), f)) {
		char *c = strchr(line, ':');
		if (!strncmp(line, "model name", 10) && c) {
			snprintf(r->cpu, sizeof(r->cpu), "%s", c + 2);
			r->cpu[strcspn(r->cpu, "\n")] = '\0';
			break;
		}
	}
	if (f)
		fclose(f);
}

static void run_free(struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		samples_free(&r->rows[i].lat.s);
		samples_free(&r->rows[i].bw.s);
	}
	free(r->rows);
	free(r->sizes);
	free(r->raws);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
}

/* Tables / CSV / JSON; returns the exit status. */
static int report(struct run *r, int status)
{
	compute_figures(r);
	if (r->o->csv)
		print_csv(r);
	else
		print_tables(r);
	if (r->o->json && write_json(r, r->o->json))
		status = 1;
	return status;
}

static int finish_run(struct run *r, int cluster_ret)
{
	int status = 0;

	if (cluster_ret) {
		fprintf(stderr, "psperf: FAILED: %s\n", r->err[0] ? r->err : "the cluster could not start (see above)");
		status = 1;
	}
	if (!status)
		run_agg_rows(r);
	if (!status && r->base_err[0]) {
		fprintf(stderr, "psperf: FAILED: --baseline: %s; the tables lack those columns\n", r->base_err);
		status = report(r, 1);
	} else if (!status) {
		status = report(r, 0);
	}
	run_free(r);
	return status;
}

static int role_local(struct opts *o)
{
	struct run r;
	int ret = 0;

	run_init(&r, o);
	read_cpu(&r);
	r.W = o->nworkers;
	r.nservers = o->nservers;
	plan_rows(&r);
	if (plan_has_cluster_rows(&r) || o->baseline || plan_commit_row(&r, false)) {
		if (choose_fabric(&r)) {
			run_free(&r);
			return 1;
		}
	}
	if (o->baseline)
		raw_plan_all(&r);
	if (plan_has_cluster_rows(&r))
		ret = run_local_cluster(&r);
	if (!ret && plan_commit_row(&r, false))
		ret = run_commit_local(&r);
	return finish_run(&r, ret);
}

/* --connect: one worker; the baseline (worker 0) talks to server 0's responders. */
static int role_worker(struct opts *o)
{
	struct rps__uri *uris = NULL;
	struct run r;
	int n = 0, ret = 0;

	run_init(&r, o);
	read_cpu(&r);
	r.W = o->num_workers;
	if (rps__uri_list_parse(o->connect, &uris, &n))
		die_usage("--connect: %s", rps__errbuf());
	r.kind = uris[0].kind;
	r.nservers = n;
	snprintf(r.addr, sizeof(r.addr), "%s", uris[0].host);
	snprintf(r.servers, sizeof(r.servers), "%s", o->connect);
	r.remote_peer = true;
	r.sock_port = (uint16_t)(uris[0].port + SOCK_PORT_OFFSET);
	r.rawt_port = (uint16_t)(uris[0].port + RAWT_PORT_OFFSET);
	free(uris);
	if (o->rank != 0) {
		o->baseline = false;
		o->tests &= ~(1u << T_COMMIT);	/* rank 0 measures the commit test */
	}
	plan_rows(&r);
	if (o->baseline)
		raw_plan_all(&r);
	if (plan_has_cluster_rows(&r))
		ret = run_workers(&r, o->rank, 1, NULL, NULL);
	if (!ret && plan_commit_row(&r, false))
		ret = commit_measure(&r, o->connect);
	return finish_run(&r, ret);
}

/* ---- --server -------------------------------------------------------------------------------------------- */

static struct rps__daemon *the_server;
static volatile sig_atomic_t server_stopping;

static void on_signal(int sig)
{
	(void)sig;
	server_stopping = 1;
	if (the_server)
		rps__daemon_stop(the_server);
}

struct rawt_peer_thread {
	struct rawt_side s;
	pthread_t thread;
	enum rps__kind kind;
	const char *device, *host;
	uint16_t port;
	int window;
};

/* Serve raw-transport baselines, one initiator at a time, until stopped. */
static void *rawt_peer_main(void *arg)
{
	struct rawt_peer_thread *p = arg;

	while (!server_stopping) {
		if (rawt_accept(&p->s, p->window, 0, &server_stopping)) {
			if (!server_stopping)
				fprintf(stderr, "psperf: raw responder: %s\n", rps__errbuf());
			if (p->s.ep) {
				rps__ep_close(p->s.ep);
				p->s.ep = NULL;
			}
			if (!server_stopping)
				sleep_ms(100);
		}
		while (!server_stopping && p->s.ep && !p->s.broken)
			rawt_peer_progress(&p->s, 100);
		if (p->s.ep)
			rps__ep_close(p->s.ep);
		if (p->s.mr)
			rps__mr_dereg(p->s.mr);
		free(p->s.mem);
		p->s.ep = NULL;
		p->s.mr = NULL;
		p->s.mem = NULL;
		p->s.broken = false;
	}
	return NULL;
}

static int start_responders(const struct opts *o, const struct rps__uri *u, struct sock_peer *sp,
			    struct rawt_peer_thread *tp, bool *s_ok, bool *t_ok)
{
	int ret;

	sp->lfd = sock_listen(u->host, (uint16_t)(u->port + SOCK_PORT_OFFSET), &sp->port);
	if (sp->lfd < 0) {
		fprintf(stderr, "psperf: --baseline: socket responder on %s port %u: %s: free that port or use another --listen port\n",
			u->host, u->port + SOCK_PORT_OFFSET, strerror(-sp->lfd));
		return sp->lfd;
	}
	sp->forever = true;
	sp->stop = &server_stopping;
	*s_ok = pthread_create(&sp->thread, NULL, sock_peer_main, sp) == 0;
	tp->kind = u->kind;
	tp->device = o->device;
	tp->host = u->host;
	tp->port = (uint16_t)(u->port + RAWT_PORT_OFFSET);
	tp->window = o->window;
	ret = rawt_open(&tp->s, u->kind, o->device, u->host);
	if (!ret)
		ret = rps__listen(tp->s.fab, u->host, tp->port, &tp->s.lis);
	if (ret) {
		fprintf(stderr, "psperf: --baseline: raw transport responder on port %u: %s\n", tp->port, rps__errbuf());
		return ret;
	}
	*t_ok = pthread_create(&tp->thread, NULL, rawt_peer_main, tp) == 0;
	return 0;
}

static void stop_responders(struct sock_peer *sp, struct rawt_peer_thread *tp, bool s_ok, bool t_ok)
{
	server_stopping = 1;
	if (s_ok)
		pthread_join(sp->thread, NULL);
	if (t_ok)
		pthread_join(tp->thread, NULL);
	if (sp->lfd >= 0)
		close(sp->lfd);
	rawt_close(&tp->s);
}

static int role_server(struct opts *o)
{
	struct rps__server_config cfg;
	struct sock_peer sp = { -1, 0, 0, NULL, false };
	struct rawt_peer_thread tp;
	bool s_ok = false, t_ok = false;
	struct sigaction sa;
	char uri[320];
	int ret;

	memset(&tp, 0, sizeof(tp));
	rps__server_config_init(&cfg);
	if (rps__uri_parse(o->listen, &cfg.listen))
		die_usage("--listen: %s", rps__errbuf());
	cfg.cluster = o->cluster;
	cfg.index = o->index;
	cfg.shard_bytes = o->shard_bytes;
	cfg.nslots = o->slots;
	cfg.spin_us = o->spin_us;
	cfg.fsync_none = o->fsync_none;
	ret = rps__daemon_create(&cfg, &the_server);
	if (ret) {
		fprintf(stderr, "psperf: --server: %s\n", rps__errbuf());
		return 1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	cfg.listen.port = rps__daemon_port(the_server);
	if (o->baseline && start_responders(o, &cfg.listen, &sp, &tp, &s_ok, &t_ok)) {
		stop_responders(&sp, &tp, s_ok, t_ok);
		rps__daemon_destroy(the_server);
		return 1;
	}
	printf("psperf %s: serving on %s (device %s)%s; SIGINT or SIGTERM stops\n", PACKAGE_VERSION,
	       rps__uri_str(&cfg.listen, uri, sizeof(uri)), rps__daemon_fabric_name(the_server),
	       o->baseline ? ", baseline responders on ports +1 (socket) and +2 (transport)" : "");
	fflush(stdout);
	ret = rps__daemon_run(the_server);
	if (ret)
		fprintf(stderr, "psperf: --server: %s\n", rps__errbuf());
	stop_responders(&sp, &tp, s_ok, t_ok);
	rps__daemon_destroy(the_server);
	the_server = NULL;
	return ret ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct opts o;

	signal(SIGPIPE, SIG_IGN);
	parse_args(&o, argc, argv);
	switch (o.role) {
	case ROLE_SERVER: return role_server(&o);
	case ROLE_WORKER: return role_worker(&o);
	default: return role_local(&o);
	}
}
