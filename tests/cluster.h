/*
 * cluster.h - multi-process test harness: start rdmapsd processes on
 * loopback (or on $RPS_IT_ADDR over verbs), run worker functions in forked
 * processes, collect their results, kill and stop things on purpose.
 */
#ifndef RPS_TEST_CLUSTER_H
#define RPS_TEST_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define IT_MAX_SERVERS 64
#define IT_MAX_WORKERS 16

struct it_cluster {
	int nservers;		/* servers started so far (joined ones included) */
	pid_t pid[IT_MAX_SERVERS];	/* 0: not running (stopped, killed, exited) */
	uint16_t port[IT_MAX_SERVERS];
	char servers[4096];	/* the URI list for rps_client_opts.servers */
	char dir[256];		/* scratch directory */
	const char *scheme;	/* "tcp" or "verbs" */
	const char *addr;
	char uri[IT_MAX_SERVERS][300];	/* server i's own URI */
	char cmd[IT_MAX_SERVERS][4096];	/* its command line, for restarts */
	char env[IT_MAX_SERVERS][128];	/* "NAME=value" in its environment, or "" */
	int attached;		/* servers started elsewhere ($RPS_IT_ATTACH) */
	int gone[IT_MAX_SERVERS];	/* attached: killed through the hook (no pid to ask) */
};

/* How to start servers (it_cluster_start_opts, it_server_join). */
struct it_server_opts {
	const char *extra_args;	/* more rdmapsd arguments, or NULL */
	const char *env;	/* "NAME=value" to put in the servers' environment, or NULL */
	int data_dir;		/* 1: --data-dir DIR/data.<i> (kept across restarts) */
	unsigned threads;	/* rdmapsd --threads (0: $RPS_IT_THREADS, or 1) */
	int no_ckpt_dir;	/* 1: no --checkpoint-dir (checkpoints are refused) */
	const char *cluster;	/* it_server_join: its --cluster (NULL: every server started so far) */
	int witness_last;	/* 1: the last server started gets --witness (one thread) */
	const char *last_args;	/* it_cluster_start_opts: more arguments for the last
				 * server only (e.g. --witness), or NULL */
	const char *last_env;	/* it_cluster_start_opts: "NAME=value" for the last
				 * server only (instead of env), or NULL */
};

/* The --checkpoint-dir every server started here gets (unless
 * no_ckpt_dir): one directory for the whole test program, so a checkpoint
 * one cluster takes (psctl checkpoint NAME) restores into the next.  Made
 * on first use, removed when the process that made it exits. */
const char *it_ckpt_dir(void);

/* Start n servers with extra rdmapsd arguments (may be NULL). 0 or -errno.
 * With $RPS_IT_ATTACH (a URI list of n servers already running elsewhere,
 * e.g. one per VM, started with the arguments the test expects) nothing is
 * started: the cluster is those servers, it_cluster_stop leaves them be,
 * and it_server_kill(i) runs $RPS_IT_KILL_HOOK (sh -c, member number i+1
 * as $1) and returns once the hook has: the hook kills the whole host. */
int it_cluster_start(struct it_cluster *cl, int n, const char *extra_args);
/* Make the program's cluster key and set RDMAPS_KEY_FILE (it_cluster_start
 * does: every test runs with a key), unless set or RPS_IT_NO_KEY=1. */
int it_key_ensure(void);
int it_cluster_start_opts(struct it_cluster *cl, int n, const struct it_server_opts *o);
/* SIGTERM every server, wait; returns the number that did not exit 0.
 * Removes the scratch directory (data directories included). */
int it_cluster_stop(struct it_cluster *cl);
/* The cluster's URI list with server `first` first (the member a client
 * connects to first and reads its first map from), into buf. */
void it_servers_first(const struct it_cluster *cl, int first, char *buf, size_t len);
void it_server_kill(struct it_cluster *cl, int i);
/* Start one more server, index cl->nservers, on a free port with --join id
 * and --cluster naming the servers started first (or o->cluster); waits
 * until it listens.
 * Its index, or -errno. */
int it_server_join(struct it_cluster *cl, uint64_t id, const struct it_server_opts *o);
/* Start server i again with the same command line (and data directory);
 * waits until it listens.  0 or -errno. */
int it_server_restart(struct it_cluster *cl, int i);
/* Is server i still running (not exited)? */
int it_server_alive(struct it_cluster *cl, int i);
/* Wait up to timeout_ms for server i to exit by itself: its exit status,
 * 128+signal, or -ETIMEDOUT (still running). */
int it_server_wait_exit(struct it_cluster *cl, int i, int timeout_ms);

/* The psctl binary: $PSCTL, or psctl next to $RDMAPSD, or ./psctl. */
const char *it_psctl_path(void);
/* Run psctl with the arguments in fmt (split on spaces; no quoting), with
 * "-s <the cluster's URI list>" first unless the arguments start with -s.
 * Its standard output and error go to out and err (NUL-terminated,
 * truncated to their size; either may be NULL).  Returns its exit status,
 * 128+signal if it was killed, or -1 if it could not be run; it is killed
 * after timeout_ms. */
int it_psctl(const struct it_cluster *cl, int timeout_ms, char *out, size_t out_len, char *err, size_t err_len,
	     const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* Run rdmapsd (no shell) with the arguments in fmt (split on spaces) as
 * it_psctl runs psctl: its exit status, 128+signal, or -1; standard error
 * in err; killed after timeout_ms. */
int it_rdmapsd_run(int timeout_ms, char *err, size_t err_len, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Start psctl like it_psctl but do not wait: its pid.  Standard output goes
 * to /dev/null, standard error to err_path (NULL: ours). */
pid_t it_psctl_spawn(const struct it_cluster *cl, const char *err_path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Wait up to timeout_ms for a spawned psctl: its exit status, 128+signal,
 * or -ETIMEDOUT (then it is killed). */
int it_psctl_wait(pid_t pid, int timeout_ms);

typedef int (*it_worker_fn)(int rank, int nworkers, const char *servers, void *arg, int out_fd);

struct it_workers {
	int n;
	pid_t pid[IT_MAX_WORKERS];
	int fd[IT_MAX_WORKERS];		/* read end of each worker's result pipe */
};

/* Fork n workers running fn; env (NULL or "NAME=value") is set in worker
 * `env_rank` only. */
int it_workers_start(struct it_workers *w, int n, it_worker_fn fn, const char *servers, void *arg,
		     int env_rank, const char *env);
/* Wait for worker i; returns its exit status (or 128+signal). */
int it_worker_wait(struct it_workers *w, int i);
/* Read exactly len bytes of worker i's results; 0 or -1. */
int it_worker_read(struct it_workers *w, int i, void *buf, size_t len);
/* SIGKILL every server and worker started so far (async-signal-safe). */
void it_kill_all(void);

/* Write all of buf to fd (in workers). */
int it_write_all(int fd, const void *buf, size_t len);

/* ---- a test program's frame --------------------------------------------------
 * The programs whose tests each start a cluster of their own (it_failover,
 * it_isolate, it_replica, it_seed) share their main() and per-test set-up. */

/* rdmapsd --threads of the servers started (RPS_IT_THREADS, default 1) */
unsigned it_threads(void);
void it_sleep_ms(int ms);
/* CLOCK_MONOTONIC, in seconds. */
double it_now_s(void);
/* Field `name` ("VmRSS", "SigCgt"...) of /proc/<pid>/status, read in
 * `base` (10 for the sizes, in KiB; 16 for the signal masks) into *val:
 * 0, or -1 if the process or the field is not there. */
int it_proc_status(pid_t pid, const char *name, int base, unsigned long long *val);
/* A /proc/<pid>/status size ("VmRSS", "VmHWM"), in KiB; -1 if unknown. */
long it_proc_kib(pid_t pid, const char *name);
/* In a worker: "worker <rank>: <what>: <ret> (<its name>): <rps_last_error>"
 * on stderr; returns 1, the worker's exit status. */
int it_worker_fail(int rank, const char *what, int ret);
/* A client of servers (a URI list) as rank of nworkers, its timeout_ms:
 * what rps_client_connect says. */
struct rps_client;
int it_client_connect(const char *servers, int rank, int nworkers, int timeout_ms, struct rps_client **cl);
/* rps_pull, made again every 20 ms while it fails with -EPIPE (a sync
 * rank gone, its replacement not in yet), for up to max_ms: its result. */
struct rps_tensor;
int it_pull_while_gone(struct rps_tensor *t, float *p, size_t bytes, uint64_t *version, int max_ms);
/* Pull count floats of tensor `name` into out with a fresh client (in a
 * child: no client state stays here), its timeout_ms as given; its version
 * in *version.  0, or -EIO / -ECHILD when the child failed (said on stderr). */
int it_pull_fresh(const char *servers, const char *name, float *out, size_t count, int timeout_ms,
		  uint64_t *version);
/* In a worker of a sync job over partitions with backups: start pushing
 * grad (rps_push_start) and return once every shard's part of it was taken
 * on its primary (PUSH_ACK TAKEN: summed or parked there, its step not
 * done yet) or the request ended; *req is then the caller's to rps_wait.
 * 0, rps_push_start's error, or -ETIMEDOUT after timeout_ms (*req still
 * running). */
struct rps_tensor;
struct rps_request;
int it_push_taken(struct rps_tensor *t, const void *grad, size_t nbytes, int timeout_ms, struct rps_request **req);
/* The start of main(): 77 (skip) when the tests would run over verbs
 * without $RPS_IT_ADDR; else 0 with SIGPIPE ignored and the watchdog
 * installed (watchdog_s per test; it_kill_all when it fires).  cl and up
 * (may be NULL): the program's cluster and whether it runs, for
 * it_test_teardown. */
int it_prog_init(const char *prog, unsigned watchdog_s, struct it_cluster *cl, bool *up);
/* len bytes (zeroed) the program shares with the workers it forks, or
 * NULL (said on stderr). */
void *it_shared_map(const char *prog, size_t len);
/* A suite's per-test set-up and tear-down: the watchdog armed; disarmed,
 * and the cluster it_prog_init was given stopped if a test (a failed
 * assertion) left it running. */
void it_test_setup(void);
void it_test_teardown(void);

/* Deterministic pseudo-random numbers for gradients. */
static inline uint64_t it_rand(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}
static inline float it_randf(uint64_t *s)
{
	return (float)((double)(it_rand(s) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* ---- replicas: what the servers say -----------------------------------------
 * Servers started by it_cluster_start* are members 1..n (member id = index
 * + 1; a restart keeps it).  Each query runs in a forked child (no
 * transport state stays in the parent, which forks workers later). */
struct rps__smap;

/* Server i's index of member id, or -1. */
int it_member_index(const struct it_cluster *cl, uint64_t id);

/* What STATUS of server i says of it (its map in *map if map is not NULL). */
struct it_member {
	uint64_t id;
	uint64_t term;
	uint64_t leader;	/* the leader it knows, 0: none */
	int leading;		/* it is the Raft leader */
	int balancing;		/* ... whose balancing will move a primary yet */
	uint32_t n_peers;	/* its connections with other members */
	uint32_t n_voters;	/* the Raft voters it knows (at most 16) ... */
	uint64_t voters[16];	/* ... these */
};
int it_member_status(const struct it_cluster *cl, int i, struct it_member *st, struct rps__smap *map);
/* The peer connections member st->id should hold in map m, computed apart
 * from the server's code: every other member if it is a Raft voter; else
 * the voters and the members it shares a partition with as owner, backup,
 * joiner or move target (cp_peers.c peers_needed). */
uint32_t it_peers_wanted(const struct it_member *st, const struct rps__smap *m);
/* Wait (up to deadline_s) until every server's peer connections are what
 * its map calls for (it_peers_wanted): 0, or how many servers differ at
 * the deadline (each printed), or -errno if one did not answer.  *t: the
 * last look's tally. */
struct it_peers_tally {
	uint32_t voter_max;	/* the most a voter holds */
	uint32_t learner_sum;	/* what the learners hold in all */
	uint32_t nlearners;
};
int it_peers_as_wanted(const struct it_cluster *cl, double deadline_s, struct it_peers_tally *t);

/* What server i holds of a tensor's partition (ADMIN DIGEST): a crc32c of
 * every shard's version, parameters, optimizer state, clocks and applied
 * push ids; the sum of the shards' versions; the shard count.  0, or
 * -ENOENT (nothing of it here) or another -errno. */
struct it_digest {
	uint32_t crc;
	uint64_t versions;
	uint32_t nshards;
};
int it_part_digest(const struct it_cluster *cl, int i, const char *tensor, uint32_t part, struct it_digest *d);

/* Compare every backup's digest of `tensor` with its primary's, for every
 * partition of map m: the number of replicas that differ (each printed),
 * or -errno if a server could not say.  A member that does not know the
 * tensor (restarted since, and no shard of it reached it) holds none of
 * it: the empty digest; a backup's -ENOENT where its primary holds shards
 * is "not seeded yet", an error.  *versions (may be NULL): the sum of the
 * primaries' versions. */
int it_replicas_differ(const struct it_cluster *cl, const struct rps__smap *m, const char *tensor,
		       uint64_t *versions);

/* Wait up to timeout_ms until the map has settled on every running server:
 * the same applied index everywhere, a leader, the target R `replicas`
 * (0: any), every running member knowing that leader, and every
 * partition owned by a running server, none moving,
 * lost or seeding, with min(R, servers running) - 1 backups, all running.
 * The map in *m (m may be NULL).  0 or -ETIMEDOUT (what was missing is
 * printed). */
int it_wait_settled(const struct it_cluster *cl, uint32_t replicas, int timeout_ms, struct rps__smap *m);

#endif
