/*
 * psperf_int.h - what the files of psperf share: the options, the plan
 * (rows and the run that holds them), samples and statistics, the worker,
 * the local cluster and the baseline connections; and the functions one
 * file calls in another, psperf_-prefixed.  Private to perf/.
 */
#ifndef PSPERF_INT_H
#define PSPERF_INT_H

#include "common/common.h"
#include "transport/transport.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdmaps.h"

#define MAX_BYTES (64u << 20)		/* largest --size */
#define MAX_LOCAL 64			/* --servers / --workers in local mode */
#define SOCK_MAGIC 0x4b434f53u		/* "SOCK" */
#define SOCK_PORT_OFFSET 1		/* --server --baseline: socket responder on port+1 */
#define RAWT_PORT_OFFSET 2		/* ... transport responder on port+2 */

/* ---- options -------------------------------------------------------------- */

enum test_id { T_PUSH, T_PULL, T_PUSHPULL, T_LOCK, T_AGG, T_COMMIT, T_CRC, T_IGZIP, T_RESEED, T_GROUP, T_CONNECT,
	       T_NTESTS };
extern const char *const psperf_test_names[T_NTESTS];

/* Tests measured in-process, without a cluster: agg, crc, igzip.  (commit
 * and reseed run on a cluster of their own.) */
static inline bool psperf_in_process(enum test_id t)
{
	return t == T_AGG || t == T_CRC || t == T_IGZIP;
}

enum role { ROLE_LOCAL, ROLE_SERVER, ROLE_WORKER };

struct opts {
	enum role role;
	unsigned tests;
	int nservers, nworkers;
	int replicas;			/* --replicas: copies of each partition (local mode) */
	uint32_t partitions;		/* --partitions: of the local clusters (0: the servers' default) */
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
	int zcopy;			/* --copy -1, --registered 1, else 0: the library's default */
	int group_n;			/* --group: members of the group test's group */
	const char *json, *label, *tag;
	bool csv, quiet;
	const char *listen, *cluster;
	int index;
	const char *connect;
	int rank, num_workers;
	uint32_t shard_bytes, slots, threads;
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
	uint64_t tx;		/* payload bytes the workers' clients put on the wire */
	uint64_t cpu_ns;	/* the process's user + system CPU time over the pass */
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
	RAW_WRITE_IMM_PP,	/* transport: WRITE_WITH_IMM of a bytes, the peer SENDs b back */
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
	bool group_separate;	/* group test: the same tensors pushed one by one */
	bool connect_nokey;	/* connect test: to a server without a key */
	bool connect_worker;	/* connect test: rps_client_connect, not an admin channel */
	int connect_servers;	/* connect test: a worker's client to this many servers (0: one) */
	double x_key;		/* connect row with a key: its t_typ / the same without */
	double x_many;		/* connect row to many servers: its t_typ / the worker's to one */
	double x_group;		/* group row: its tensors/s / the separate pushes' */
	long iters, warmup;
	struct pass lat, bw;	/* merged over workers */
	struct stats s_lat, s_bw;
	struct raw_result *raw_lat, *raw_bw;
	struct raw_result *raw_ref;	/* push over verbs: the bare WRITE, beside raw_lat */
	struct raw_result *raw_x[3];	/* --raw-transport extras over tcp: lat, bw, ref */
	double x_lat, x_bw, x_ref;
	double tx_per_byte;	/* push rows: wire bytes (rps__fabric_tx_bytes) per gradient byte */
	double cpu_s_per_gb;	/* push/pull rows: process CPU seconds per 1e9 bytes moved */
	double x_rtt;		/* commit row: its t_typ / the admin round trip's */
	uint32_t reseed_parts;	/* reseed row: partition images seeded per raise */
};

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
	struct stats commit_sync;	/* --baseline, local, fsync always: one append + fdatasync */
	size_t commit_sync_bytes;	/*   of this many bytes (a NOP's WAL batch) */
	/* the reseed test */
	char reseed_servers[4096];
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

/* ---- local servers ------------------------------------------------------- */

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
	bool no_target;			/* reseed test: no --replicas, the test sets the target */
	bool no_key;			/* connect test: servers without a key */
};

/* ---- baselines ------------------------------------------------------------ */

enum sock_op { SOCKOP_RR = 1, SOCKOP_STREAM = 2, SOCKOP_QUIT = 3 };

struct sock_cmd {
	uint32_t magic, op;
	uint64_t a, b, count;
};

struct sock_peer {
	int lfd;
	uint16_t port;
	pthread_t thread;
	volatile sig_atomic_t *stop;	/* remote mode: loop until set */
	bool forever;
};

struct rawt_rep {
	uint32_t magic, rkey;
	uint64_t addr, len;
};

/* One side of a raw connection.  Memory: [0, len) target/source of the
 * one-sided ops, then RAWT_NRX (baseline_xport.c) receive slots of len,
 * then an 8-byte word. */
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

/* The initiator's session: its side, and the responder's when in-process. */
struct rawt_session {
	struct rawt_side ini, peer;
	bool local_peer;
	int window;
	int timeout_ms;
};

/* util.c: usage errors, a test's failure, allocations, sizes, the progress line */
/* exits with status 2 */
_Noreturn void psperf_die_usage(const char *fmt, ...) RPS__PRINTF(1, 2);
/* marks r failed, keeps the first error in r->err; returns -EIO */
int psperf_run_fail(struct run *r, const char *fmt, ...) RPS__PRINTF(2, 3);
void *psperf_xcalloc(size_t n, size_t size);
void *psperf_xalloc_aligned(size_t len);
const char *psperf_human(size_t b, char *buf, size_t len);
void psperf_sleep_ms(int ms);
void psperf_progress_set(struct run *r, long row, int phase, long total);
void psperf_progress_print(struct run *r);
void psperf_progress_clear(const struct run *r);

/* stats.c: samples, statistics, figures and ratios */
void psperf_samples_reserve(struct samples *s, size_t n);
void psperf_samples_add(struct samples *s, uint64_t ns);
void psperf_samples_free(struct samples *s);
void psperf_pass_merge(struct pass *dst, const struct pass *src);
void psperf_stats_compute(struct stats *st, struct pass *p, double bytes_per_op);
void psperf_compute_figures(struct run *r);

/* options.c: the command line, the fabric to run on */
const char *psperf_mode_name(enum rps_mode m);
const char *psperf_optimizer_name(enum rps_optimizer p);
void psperf_parse_args(struct opts *o, int argc, char **argv);
int psperf_choose_fabric(struct run *r);

/* plan.c: the rows */
long psperf_row_warmup(const struct opts *o, long iters);
void psperf_plan_rows(struct run *r);
size_t psperf_size_index(const struct run *r, size_t bytes);
size_t psperf_pull_bytes(const struct opts *o, const struct row *row);
bool psperf_plan_has_cluster_rows(const struct run *r);
struct row *psperf_plan_commit_row(struct run *r, bool rtt);
/* the connect test's row: with or without a key, worker or admin connects */
struct row *psperf_plan_connect_row(struct run *r, bool nokey, bool worker);
/* the connect test's row of a worker to --servers N (N > 1), or NULL */
struct row *psperf_plan_connect_many_row(struct run *r);
int psperf_run_connect_local(struct run *r);

/* worker.c: worker threads */
void psperf_fill_gradient(void *dst, enum rps_dtype dt, size_t count);
int psperf_run_workers(struct run *r, int first, int n, void (*on_fail)(void *), void *arg);

/* servers.c: local servers, --server */
void psperf_cluster_destroy(void *arg);
int psperf_cluster_start(struct run *r, struct lcluster *c, int nservers, char *list, size_t listlen);
int psperf_cluster_errors(struct lcluster *c);
int psperf_run_local_cluster(struct run *r);
int psperf_role_server(struct opts *o);

/* commit.c: the commit test */
/* sync_root: also the fdatasync yardstick, in a file there (local mode) */
int psperf_commit_measure(struct run *r, const char *list, const char *sync_root);
int psperf_run_commit_local(struct run *r);

/* reseed.c: the reseed test */
int psperf_run_reseed_local(struct run *r);

/* kernels.c: agg, crc, igzip in-process */
void psperf_run_agg_rows(struct run *r);

/* baseline_sock.c: the socket baseline */
int psperf_io_all(int fd, void *buf, size_t len, bool wr);
int psperf_sock_listen(const char *host, uint16_t port, uint16_t *bound);
int psperf_sock_connect(const char *host, uint16_t port);
void *psperf_sock_peer_main(void *arg);
int psperf_sock_run(int fd, struct raw_result *res, long warmup, struct pass *p, char *buf);

/* baseline_xport.c: the raw transport baseline */
int psperf_rawt_open(struct rawt_side *s, enum rps__kind kind, const char *device, const char *host);
void psperf_rawt_close(struct rawt_side *s);
int psperf_rawt_accept(struct rawt_side *s, int window, int timeout_ms, volatile sig_atomic_t *stop);
int psperf_rawt_peer_progress(struct rawt_side *s, int timeout_ms);
int psperf_rawt_lat(struct rawt_session *x, struct raw_result *res, long warmup, struct pass *p);
int psperf_rawt_bw(struct rawt_session *x, struct raw_result *res, struct pass *p);
int psperf_rawt_session_open(struct run *r, struct rawt_session *x, enum rps__kind kind, size_t bytes);
void psperf_rawt_session_close(struct rawt_session *x);

/* baselines.c: which raw ops, worker 0's baseline session */
const char *psperf_raw_op_name(enum raw_op op);
struct raw_result *psperf_raw_add(struct run *r, enum raw_op op, size_t a, size_t b, long iters, long count);
void psperf_raw_plan_all(struct run *r);
struct baseline *psperf_baseline_new(struct run *r);
void psperf_baseline_free(struct baseline *b);
void psperf_baseline_row(struct run *r, struct baseline *b, const struct row *row);

/* output.c: tables, CSV, JSON */
int psperf_report(struct run *r, int status);

#endif
