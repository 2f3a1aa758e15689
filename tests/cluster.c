/*
 * cluster.c - multi-process test harness (see cluster.h).
 */
#include "config.h"
#include "cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every process we started, for it_kill_all() (async-signal-safe). */
static volatile pid_t started[256];
static volatile int nstarted;

static void remember(pid_t pid)
{
	if (pid > 0 && nstarted < (int)(sizeof(started) / sizeof(started[0])))
		started[nstarted++] = pid;
}

void it_kill_all(void)
{
	int i;

	for (i = 0; i < nstarted; i++)
		if (started[i] > 0)
			kill(started[i], SIGKILL);
}

static const char *rdmapsd_path(void)
{
	const char *p = getenv("RDMAPSD");
	return p ? p : "./rdmapsd";
}

/* An ephemeral port that is free right now (the kernel picks it). */
static uint16_t free_port(const char *addr)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port = 0;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	inet_pton(AF_INET, addr, &sin.sin_addr);
	if (fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sin, &len) == 0)
		port = ntohs(sin.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

int it_cluster_start(struct it_cluster *cl, int n, const char *extra_args)
{
	char portfile[512];
	int i, k;

	memset(cl, 0, sizeof(*cl));
	cl->nservers = n;
	cl->scheme = getenv("RPS_IT_TRANSPORT") ? getenv("RPS_IT_TRANSPORT") : "tcp";
	cl->addr = getenv("RPS_IT_ADDR") ? getenv("RPS_IT_ADDR") : "127.0.0.1";
	snprintf(cl->dir, sizeof(cl->dir), "%s/rps-it.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(cl->dir))
		return -errno;
	for (i = 0; i < n; i++) {
		cl->port[i] = free_port(cl->addr);
		k = (int)strlen(cl->servers);
		snprintf(cl->servers + k, sizeof(cl->servers) - (size_t)k, "%s%s://%s:%u", i ? "," : "",
			 cl->scheme, cl->addr, cl->port[i]);
	}
	for (i = 0; i < n; i++) {
		char cmd[4096], listen[300];
		snprintf(portfile, sizeof(portfile), "%s/port.%d", cl->dir, i);
		snprintf(listen, sizeof(listen), "%s://%s:%u", cl->scheme, cl->addr, cl->port[i]);
		snprintf(cmd, sizeof(cmd), "exec %s --listen %s --cluster %s --index %d --port-file %s --log-level %s %s",
			 rdmapsd_path(), listen, cl->servers, i, portfile,
			 getenv("RPS_IT_LOG") ? getenv("RPS_IT_LOG") : "warn", extra_args ? extra_args : "");
		cl->pid[i] = fork();
		if (cl->pid[i] < 0)
			return -errno;
		if (cl->pid[i] == 0) {
			execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
			_exit(127);
		}
		remember(cl->pid[i]);
	}
	/* Wait for readiness: each server writes its port file once listening. */
	for (i = 0; i < n; i++) {
		int waited;
		snprintf(portfile, sizeof(portfile), "%s/port.%d", cl->dir, i);
		for (waited = 0; access(portfile, F_OK) != 0; waited += 10) {
			int st;
			if (waitpid(cl->pid[i], &st, WNOHANG) == cl->pid[i]) {
				fprintf(stderr, "it_cluster: rdmapsd %d exited during start-up\n", i);
				cl->pid[i] = 0;
				it_cluster_stop(cl);
				return -ECHILD;
			}
			if (waited > 120000) {
				fprintf(stderr, "it_cluster: rdmapsd %d not ready after 120 s\n", i);
				it_cluster_stop(cl);
				return -ETIMEDOUT;
			}
			sleep_ms(10);
		}
	}
	return 0;
}

int it_cluster_stop(struct it_cluster *cl)
{
	int i, bad = 0;
	char path[600];

	for (i = 0; i < cl->nservers; i++)
		if (cl->pid[i] > 0)
			kill(cl->pid[i], SIGTERM);
	for (i = 0; i < cl->nservers; i++) {
		int st;
		if (cl->pid[i] <= 0)
			continue;
		if (waitpid(cl->pid[i], &st, 0) != cl->pid[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad++;
		cl->pid[i] = 0;
		snprintf(path, sizeof(path), "%s/port.%d", cl->dir, i);
		unlink(path);
	}
	rmdir(cl->dir);
	return bad;
}

void it_server_kill(struct it_cluster *cl, int i)
{
	int st;

	if (cl->pid[i] <= 0)
		return;
	kill(cl->pid[i], SIGKILL);
	waitpid(cl->pid[i], &st, 0);
	cl->pid[i] = 0;
}

int it_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int it_workers_start(struct it_workers *w, int n, it_worker_fn fn, const char *servers, void *arg,
		     int env_rank, const char *env)
{
	int i;

	memset(w, 0, sizeof(*w));
	w->n = n;
	fflush(NULL);
	for (i = 0; i < n; i++) {
		int p[2];
		if (pipe(p))
			return -errno;
		w->pid[i] = fork();
		if (w->pid[i] < 0)
			return -errno;
		if (w->pid[i] == 0) {
			int ret;
			close(p[0]);
			if (env && i == env_rank)
				putenv((char *)env);
			ret = fn(i, n, servers, arg, p[1]);
			close(p[1]);
			_exit(ret);
		}
		remember(w->pid[i]);
		close(p[1]);
		w->fd[i] = p[0];
	}
	return 0;
}

int it_worker_wait(struct it_workers *w, int i)
{
	int st;

	if (w->pid[i] <= 0)
		return -1;
	while (waitpid(w->pid[i], &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	w->pid[i] = 0;
	close(w->fd[i]);
	w->fd[i] = -1;
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return WEXITSTATUS(st);
}

int it_worker_read(struct it_workers *w, int i, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = read(w->fd[i], p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}
