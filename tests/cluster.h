/*
 * cluster.h - multi-process test harness: start rdmapsd processes on
 * loopback (or on $RPS_IT_ADDR over verbs), run worker functions in forked
 * processes, collect their results, kill and stop things on purpose.
 */
#ifndef RPS_TEST_CLUSTER_H
#define RPS_TEST_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define IT_MAX_SERVERS 8
#define IT_MAX_WORKERS 16

struct it_cluster {
	int nservers;
	pid_t pid[IT_MAX_SERVERS];
	uint16_t port[IT_MAX_SERVERS];
	char servers[2048];	/* the URI list for rps_client_opts.servers */
	char dir[256];		/* scratch directory */
	const char *scheme;	/* "tcp" or "verbs" */
	const char *addr;
};

/* Start n servers with extra rdmapsd arguments (may be NULL). 0 or -errno. */
int it_cluster_start(struct it_cluster *cl, int n, const char *extra_args);
/* SIGTERM every server, wait; returns the number that did not exit 0. */
int it_cluster_stop(struct it_cluster *cl);
void it_server_kill(struct it_cluster *cl, int i);

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

#endif
