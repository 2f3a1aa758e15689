/*
 * cluster.c - multi-process test harness (see cluster.h).
 */
#include "config.h"
#include "cluster.h"
#include "client/client_int.h"
#include "client/ctl.h"
#include "common/common.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "control/raft.h"
#include "lib/tmpdir.h"
#include "lib/watchdog.h"
#include "proto/auth.h"
#include "proto/proto.h"
#include "proto/smap.h"
#include "transport/uri.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"

/* Every process we started, for it_kill_all() (async-signal-safe). */
static volatile pid_t started[1024];
static volatile int nstarted;

static void remember(pid_t pid)
{
	int i;

	if (pid <= 0)
		return;
	for (i = 0; i < nstarted; i++)	/* a slot of a process reaped already */
		if (started[i] == 0) {
			started[i] = pid;
			return;
		}
	if (nstarted < (int)(sizeof(started) / sizeof(started[0])))
		started[nstarted++] = pid;
}

/* A process reaped: its pid may be reused by someone else's. */
static void forget(pid_t pid)
{
	int i;

	for (i = 0; i < nstarted; i++)
		if (started[i] == pid)
			started[i] = 0;
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

/* Can port be bound on addr right now? */
static bool port_free(const char *addr, uint32_t port)
{
	struct sockaddr_in sin;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	bool ok;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)port);
	inet_pton(AF_INET, addr, &sin.sin_addr);
	ok = fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* The lowest port the kernel hands out as an ephemeral one (a connect's
 * local port). */
static uint32_t ephemeral_low(void)
{
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	unsigned lo = 32768, hi = 60999;

	if (f) {
		if (fscanf(f, "%u %u", &lo, &hi) != 2)
			lo = 32768;
		fclose(f);
	}
	return lo;
}

/* A port that is free right now, below the ephemeral range: rdmapsd binds
 * it a moment later, and an ephemeral port could be taken meanwhile by
 * any connect() on the machine (the suites run in parallel: one lost
 * its --threads 3 ports so).  Random, so that suites starting together
 * pick apart. */
static uint16_t free_port(const char *addr)
{
	static unsigned seed;
	uint32_t low = 10000, high = ephemeral_low();

	if (!seed)
		seed = (unsigned)getpid() ^ (unsigned)time(NULL);
	if (high <= low + 1024)
		high = 65000, low = 61000;	/* (an unusual range: above it) */
	for (int tries = 0; tries < 256; tries++) {
		uint32_t p = low + (uint32_t)rand_r(&seed) % (high - low - 64);
		if (port_free(addr, p))
			return (uint16_t)p;
	}
	return 0;
}

/* rdmapsd --threads from RPS_IT_THREADS (the suite runs with 1 and 2):
 * server k of a thread listens on the port + k */
unsigned it_threads(void)
{
	const char *e = getenv("RPS_IT_THREADS");
	unsigned n = e ? (unsigned)atoi(e) : 1;

	return n >= 1 && n <= 16 ? n : 1;
}

/* A port that is free right now with the n - 1 after it (serving
 * threads), and none of them a port the cluster's first `upto` servers
 * got (a port is free until its server binds it). */
static uint16_t free_ports(const struct it_cluster *cl, int upto, unsigned n)
{
	const char *addr = cl->addr;
	unsigned k, tries;

	for (tries = 0; tries < 64; tries++) {
		uint16_t p = free_port(addr);
		bool ok = p && (uint32_t)p + n - 1 <= 65535;
		for (int j = 0; ok && j < upto; j++)
			ok = (uint32_t)p + n <= cl->port[j] || p >= (uint32_t)cl->port[j] + n;
		for (k = 1; ok && k < n; k++)
			ok = port_free(addr, (uint32_t)p + k);
		if (ok)
			return p;
	}
	return 0;
}

void it_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

double it_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int it_proc_status(pid_t pid, const char *name, int base, unsigned long long *val)
{
	char path[64], line[256];
	size_t n = strlen(name);
	int ret = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char *end;

		if (strncmp(line, name, n) || line[n] != ':')
			continue;
		*val = strtoull(line + n + 1, &end, base);
		ret = end == line + n + 1 ? -1 : 0;
		break;
	}
	fclose(f);
	return ret;
}

long it_proc_kib(pid_t pid, const char *name)
{
	unsigned long long kib;

	return it_proc_status(pid, name, 10, &kib) ? -1 : (long)kib;
}

static const char *log_level(void)
{
	return getenv("RPS_IT_LOG") ? getenv("RPS_IT_LOG") : "warn";
}

/* Fork server i with its command line and environment. */
static int spawn_server(struct it_cluster *cl, int i)
{
	char portfile[512];

	snprintf(portfile, sizeof(portfile), "%s/port.%d", cl->dir, i);
	unlink(portfile);	/* a server killed with SIGKILL leaves its own */
	fflush(NULL);
	cl->pid[i] = fork();
	if (cl->pid[i] < 0) {
		cl->pid[i] = 0;
		return -errno;
	}
	if (cl->pid[i] == 0) {
		const char *logs = getenv("RPS_IT_SERVER_LOGS");
		if (logs && *logs) {	/* each server's lines apart: DIR/server.<port>.log */
			char path[600];
			snprintf(path, sizeof(path), "%s/server.%u.log", logs, cl->port[i]);
			if (!freopen(path, "a", stderr))
				_exit(127);
		}
		if (cl->env[i][0])
			putenv(cl->env[i]);
		execl("/bin/sh", "sh", "-c", cl->cmd[i], (char *)NULL);
		_exit(127);
	}
	remember(cl->pid[i]);
	return 0;
}

/* Wait for readiness: the server writes its port file once listening. */
static int wait_ready(struct it_cluster *cl, int i)
{
	char portfile[512];
	int waited;

	snprintf(portfile, sizeof(portfile), "%s/port.%d", cl->dir, i);
	for (waited = 0; access(portfile, F_OK) != 0; waited += 10) {
		int st;
		if (waitpid(cl->pid[i], &st, WNOHANG) == cl->pid[i]) {
			fprintf(stderr, "it_cluster: rdmapsd %d exited during start-up\n", i);
			forget(cl->pid[i]);
			cl->pid[i] = 0;
			return -ECHILD;
		}
		if (waited > 120000) {
			fprintf(stderr, "it_cluster: rdmapsd %d not ready after 120 s\n", i);
			return -ETIMEDOUT;
		}
		it_sleep_ms(10);
	}
	return 0;
}

static char ckpt_dir[256];
static pid_t ckpt_dir_owner;

static void ckpt_dir_remove(void)
{
	/* (forked workers that exit() run this too: not theirs to remove) */
	if (ckpt_dir[0] && getpid() == ckpt_dir_owner)
		rps__remove_tree(ckpt_dir);
}

const char *it_ckpt_dir(void)
{
	if (!ckpt_dir[0]) {
		test_mkdtemp(ckpt_dir, sizeof(ckpt_dir), "rps-it-ckpt");
		ckpt_dir_owner = getpid();
		atexit(ckpt_dir_remove);
	}
	return ckpt_dir;
}

/* RPS_IT_NO_KEY=1: the suite without keys (beyond loopback too: insecure). */
static bool no_key(void)
{
	const char *no = getenv("RPS_IT_NO_KEY");

	return no && !strcmp(no, "1");
}

/* Server i's command line: what every server gets, then `args`. */
static void server_cmd(struct it_cluster *cl, int i, const char *args, const struct it_server_opts *o)
{
	char data[400] = "", ckpt[300] = "", cmd[sizeof(cl->cmd[i])];

	if (o && o->data_dir)
		snprintf(data, sizeof(data), " --data-dir %s/data.%d", cl->dir, i);
	if (!o || !o->no_ckpt_dir)
		snprintf(ckpt, sizeof(ckpt), " --checkpoint-dir %s", it_ckpt_dir());
	snprintf(cmd, sizeof(cmd), "exec %s --listen %s --threads %u %s --port-file %s/port.%d --log-level %s%s%s%s %s",
		 rdmapsd_path(), cl->uri[i], o && o->threads ? o->threads : it_threads(), args, cl->dir, i,
		 log_level(), data, ckpt, no_key() ? " --insecure" : "",
		 o && o->extra_args ? o->extra_args : "");
	memcpy(cl->cmd[i], cmd, sizeof(cmd));
	snprintf(cl->env[i], sizeof(cl->env[i]), "%s", o && o->env ? o->env : "");
}

int it_cluster_start(struct it_cluster *cl, int n, const char *extra_args)
{
	struct it_server_opts o = { .extra_args = extra_args };

	return it_cluster_start_opts(cl, n, &o);
}

/* The servers of $RPS_IT_ATTACH: n URIs, comma-separated. */
static int cluster_attach(struct it_cluster *cl, int n, const char *list)
{
	const char *p = list;
	int i;

	cl->attached = 1;
	cl->nservers = n;
	snprintf(cl->servers, sizeof(cl->servers), "%s", list);
	cl->scheme = strncmp(list, "verbs://", 8) ? "tcp" : "verbs";
	for (i = 0; i < n; i++) {
		size_t len = strcspn(p, ",");

		if (!len || len >= sizeof(cl->uri[i]))
			return -EINVAL;
		memcpy(cl->uri[i], p, len);
		cl->uri[i][len] = 0;
		p += len + (p[len] == ',');
	}
	return *p ? -EINVAL : 0;
}

/* Every test cluster runs with a key, as a deployment does
 * (doc/security.md): one cluster key for the whole program, in RDMAPS_KEY_FILE,
 * which rdmapsd, psctl and librdmaps read (RPS_IT_NO_KEY=1: none). */
static char key_dir[64];
static pid_t key_owner;

static void key_remove(void)
{
	char path[128];

	if (!key_dir[0] || getpid() != key_owner)	/* (forked workers exit too) */
		return;
	snprintf(path, sizeof(path), "%s/cluster.key", key_dir);
	unlink(path);
	rmdir(key_dir);
}

int it_key_ensure(void)
{
	char path[128];
	const char *no = getenv("RPS_IT_NO_KEY");

	if (no && !strcmp(no, "1")) {	/* and no key from outside either */
		unsetenv("RDMAPS_KEY_FILE");
		setenv("RDMAPS_INSECURE", "1", 1);
		return 0;
	}
	if (getenv("RDMAPS_KEY_FILE"))
		return 0;
	snprintf(key_dir, sizeof(key_dir), "%s/rps-it-key.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(key_dir)) {
		fprintf(stderr, "mkdtemp %s: %s\n", key_dir, strerror(errno));
		key_dir[0] = '\0';
		return -errno;
	}
	snprintf(path, sizeof(path), "%s/cluster.key", key_dir);
	if (rps__key_write(path, RPS__KEY_CLUSTER, NULL, NULL)) {
		fprintf(stderr, "%s\n", rps__errbuf());
		rmdir(key_dir);
		key_dir[0] = '\0';
		return -EIO;
	}
	key_owner = getpid();
	atexit(key_remove);
	setenv("RDMAPS_KEY_FILE", path, 1);
	return 0;
}

int it_cluster_start_opts(struct it_cluster *cl, int n, const struct it_server_opts *o)
{
	int kret = it_key_ensure();

	if (kret)
		return kret;
	int i, k, ret;

	memset(cl, 0, sizeof(*cl));
	if (n < 1 || n > IT_MAX_SERVERS)
		return -EINVAL;
	if (getenv("RPS_IT_ATTACH"))
		return cluster_attach(cl, n, getenv("RPS_IT_ATTACH"));
	cl->nservers = n;
	cl->scheme = getenv("RPS_IT_TRANSPORT") ? getenv("RPS_IT_TRANSPORT") : "tcp";
	cl->addr = getenv("RPS_IT_ADDR") ? getenv("RPS_IT_ADDR") : "127.0.0.1";
	snprintf(cl->dir, sizeof(cl->dir), "%s/rps-it.XXXXXX", test_tmpdir());
	if (!mkdtemp(cl->dir))
		return -errno;
	for (i = 0; i < n; i++) {
		cl->port[i] = free_ports(cl, i, o && o->threads ? o->threads : it_threads());
		snprintf(cl->uri[i], sizeof(cl->uri[i]), "%s://%s:%u", cl->scheme, cl->addr, cl->port[i]);
		k = (int)strlen(cl->servers);
		snprintf(cl->servers + k, sizeof(cl->servers) - (size_t)k, "%s%s", i ? "," : "", cl->uri[i]);
	}
	for (i = 0; i < n; i++) {
		char args[4800];
		bool last = i == n - 1;

		snprintf(args, sizeof(args), "--cluster %s --index %d%s%s%s", cl->servers, i,
			 o && o->witness_last && last ? " --witness --threads 1" : "",
			 o && o->last_args && last ? " " : "", o && o->last_args && last ? o->last_args : "");
		server_cmd(cl, i, args, o);
		if (o && o->last_env && last)
			snprintf(cl->env[i], sizeof(cl->env[i]), "%s", o->last_env);
		ret = spawn_server(cl, i);
		if (ret) {
			it_cluster_stop(cl);
			return ret;
		}
	}
	for (i = 0; i < n; i++) {
		ret = wait_ready(cl, i);
		if (ret) {
			it_cluster_stop(cl);
			return ret;
		}
	}
	return 0;
}

int it_server_join(struct it_cluster *cl, uint64_t id, const struct it_server_opts *o)
{
	int i = cl->nservers, ret;
	char args[4800];

	if (i >= IT_MAX_SERVERS)
		return -ENOSPC;
	cl->port[i] = free_ports(cl, i, o && o->threads ? o->threads : it_threads());
	snprintf(cl->uri[i], sizeof(cl->uri[i]), "%s://%s:%u", cl->scheme, cl->addr, cl->port[i]);
	snprintf(args, sizeof(args), "--join %llu --cluster %s", (unsigned long long)id,
		 o && o->cluster ? o->cluster : cl->servers);
	server_cmd(cl, i, args, o);
	cl->nservers++;
	ret = spawn_server(cl, i);
	if (!ret)
		ret = wait_ready(cl, i);
	return ret ? ret : i;
}

int it_server_restart(struct it_cluster *cl, int i)
{
	int ret;

	if (i < 0 || i >= cl->nservers || cl->pid[i] > 0)
		return -EINVAL;
	ret = spawn_server(cl, i);
	return ret ? ret : wait_ready(cl, i);
}

int it_server_alive(struct it_cluster *cl, int i)
{
	siginfo_t si;

	if (cl->attached)
		return i >= 0 && i < cl->nservers && !cl->gone[i];
	if (i < 0 || i >= cl->nservers || cl->pid[i] <= 0)
		return 0;
	memset(&si, 0, sizeof(si));
	/* WNOWAIT: an exit is left for it_cluster_stop to count */
	if (waitid(P_PID, (id_t)cl->pid[i], &si, WEXITED | WNOHANG | WNOWAIT) != 0)
		return 0;
	return si.si_pid == 0;
}

int it_server_wait_exit(struct it_cluster *cl, int i, int timeout_ms)
{
	int waited, st;

	if (i < 0 || i >= cl->nservers || cl->pid[i] <= 0)
		return -EINVAL;
	for (waited = 0;; waited += 10) {
		pid_t r = waitpid(cl->pid[i], &st, WNOHANG);
		if (r == cl->pid[i]) {
			forget(r);
			break;
		}
		if (r < 0 && errno != EINTR)
			return -errno;
		if (waited >= timeout_ms)
			return -ETIMEDOUT;
		it_sleep_ms(10);
	}
	cl->pid[i] = 0;
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

void it_servers_first(const struct it_cluster *cl, int first, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "%s", cl->uri[first]);

	for (int i = 0; i < cl->nservers && n < len; i++)
		if (i != first)
			n += (size_t)snprintf(buf + n, len - n, ",%s", cl->uri[i]);
}

int it_cluster_stop(struct it_cluster *cl)
{
	int i, bad = 0;

	if (cl->attached)
		return 0;

	for (i = 0; i < cl->nservers; i++)
		if (cl->pid[i] > 0)
			kill(cl->pid[i], SIGTERM);
	for (i = 0; i < cl->nservers; i++) {
		int st;
		if (cl->pid[i] <= 0)
			continue;
		if (waitpid(cl->pid[i], &st, 0) != cl->pid[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad++;
		forget(cl->pid[i]);
		cl->pid[i] = 0;
	}
	if (cl->dir[0])
		rps__remove_tree(cl->dir);
	return bad;
}

/* Attached: the hook kills member i+1's host. */
static void kill_hook(int i)
{
	const char *hook = getenv("RPS_IT_KILL_HOOK");
	char member[16];
	pid_t pid;
	int st;

	if (!hook) {
		fprintf(stderr, "it_cluster: RPS_IT_KILL_HOOK is not set: member %d not killed\n", i + 1);
		return;
	}
	snprintf(member, sizeof(member), "%d", i + 1);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", hook, "sh", member, (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		fprintf(stderr, "it_cluster: RPS_IT_KILL_HOOK failed for member %d\n", i + 1);
}

void it_server_kill(struct it_cluster *cl, int i)
{
	int st;

	if (cl->attached) {
		kill_hook(i);
		if (i >= 0 && i < IT_MAX_SERVERS)
			cl->gone[i] = 1;
		return;
	}

	if (cl->pid[i] <= 0)
		return;
	kill(cl->pid[i], SIGKILL);
	waitpid(cl->pid[i], &st, 0);
	forget(cl->pid[i]);
	cl->pid[i] = 0;
}

/* All of len bytes read into, or written from, p: 0, or -1 (an error, or
 * the end of the stream). */
static int io_all(int fd, char *p, size_t len, bool rd)
{
	while (len) {
		ssize_t n = rd ? read(fd, p, len) : write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int it_write_all(int fd, const void *buf, size_t len)
{
	return io_all(fd, (char *)buf, len, false);
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
			if (env && i == env_rank) {
				putenv((char *)env);
				/* (read once per process: the parent may have) */
				if (!strncmp(env, "RPS_FAULT=", 10))
					rps__fault_set(env + 10);
			}
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
	forget(w->pid[i]);
	w->pid[i] = 0;
	close(w->fd[i]);
	w->fd[i] = -1;
	if (WIFSIGNALED(st)) {
		/* (a worker's own failures print a line; a crash prints none;
		 * SIGKILL is the tests' own) */
		if (WTERMSIG(st) != SIGKILL)
			fprintf(stderr, "it_cluster: worker %d: killed by signal %d (%s)\n", i, WTERMSIG(st),
				strsignal(WTERMSIG(st)));
		return 128 + WTERMSIG(st);
	}
	return WEXITSTATUS(st);
}

int it_worker_read(struct it_workers *w, int i, void *buf, size_t len)
{
	return io_all(w->fd[i], buf, len, true);
}

/* ---- psctl ---------------------------------------------------------------- */

const char *it_psctl_path(void)
{
	static char path[1024];
	const char *p = getenv("PSCTL"), *d = getenv("RDMAPSD"), *slash;

	if (p)
		return p;
	if (d && (slash = strrchr(d, '/'))) {
		snprintf(path, sizeof(path), "%.*s/psctl", (int)(slash - d), d);
		return path;
	}
	return "./psctl";
}

#define PSCTL_MAX_ARGS 32

/* argv for psctl: the path, -s LIST unless given, then the words of args. */
static int psctl_argv(const struct it_cluster *cl, char *args, char **argv)
{
	int n = 0;
	char *save = NULL, *w;

	argv[n++] = (char *)it_psctl_path();
	if (strncmp(args, "-s ", 3)) {
		argv[n++] = (char *)"-s";
		argv[n++] = (char *)cl->servers;
	}
	for (w = strtok_r(args, " ", &save); w && n < PSCTL_MAX_ARGS - 1; w = strtok_r(NULL, " ", &save))
		argv[n++] = w;
	argv[n] = NULL;
	return n;
}

static int run_argv(char **argv, const char *args, int timeout_ms, char *out, size_t out_len, char *err,
		    size_t err_len);

int it_psctl(const struct it_cluster *cl, int timeout_ms, char *out, size_t out_len, char *err, size_t err_len,
	     const char *fmt, ...)
{
	char args[2048], words[2048], *argv[PSCTL_MAX_ARGS];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	memcpy(words, args, sizeof(words));
	psctl_argv(cl, words, argv);
	return run_argv(argv, args, timeout_ms, out, out_len, err, err_len);
}

int it_rdmapsd_run(int timeout_ms, char *err, size_t err_len, const char *fmt, ...)
{
	char args[2048], words[2048], *argv[PSCTL_MAX_ARGS], *save = NULL, *w;
	va_list ap;
	int n = 0;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	memcpy(words, args, sizeof(words));
	argv[n++] = (char *)rdmapsd_path();
	for (w = strtok_r(words, " ", &save); w && n < PSCTL_MAX_ARGS - 1; w = strtok_r(NULL, " ", &save))
		argv[n++] = w;
	argv[n] = NULL;
	return run_argv(argv, args, timeout_ms, NULL, 0, err, err_len);
}

/* Run argv[0] with argv, collect its output; as it_psctl. */
static int run_argv(char **argv, const char *args, int timeout_ms, char *out, size_t out_len, char *err,
		    size_t err_len)
{
	char *buf[2] = { out, err };
	size_t cap[2] = { out_len, err_len }, got[2] = { 0, 0 };
	int po[2], pe[2], open_fds = 2, st, waited = 0;
	struct pollfd pfd[2];
	pid_t pid;

	if (pipe(po))
		return -1;
	if (pipe(pe)) {
		close(po[0]);
		close(po[1]);
		return -1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		close(po[0]);
		close(po[1]);
		close(pe[0]);
		close(pe[1]);
		return -1;
	}
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		close(po[1]);
		close(pe[1]);
		execv(argv[0], argv);
		fprintf(stderr, "it_cluster: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	remember(pid);
	close(po[1]);
	close(pe[1]);
	pfd[0] = (struct pollfd){ .fd = po[0], .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = pe[0], .events = POLLIN };
	while (open_fds > 0) {
		int k, r = poll(pfd, 2, 100);
		if (r < 0 && errno != EINTR)
			break;
		if (r == 0 && (waited += 100) > timeout_ms) {
			fprintf(stderr, "it_cluster: %s %s: still running after %d ms: killed\n", argv[0], args, timeout_ms);
			kill(pid, SIGKILL);
			timeout_ms = 1 << 30;
		}
		for (k = 0; k < 2; k++) {
			char tmp[4096];
			ssize_t n;
			if (pfd[k].fd < 0 || !(pfd[k].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			n = read(pfd[k].fd, tmp, sizeof(tmp));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				close(pfd[k].fd);
				pfd[k].fd = -1;
				open_fds--;
				continue;
			}
			if (buf[k] && cap[k] > got[k] + 1) {
				size_t m = (size_t)n < cap[k] - 1 - got[k] ? (size_t)n : cap[k] - 1 - got[k];
				memcpy(buf[k] + got[k], tmp, m);
				got[k] += m;
			}
		}
	}
	for (int k = 0; k < 2; k++) {
		if (pfd[k].fd >= 0)
			close(pfd[k].fd);
		if (buf[k] && cap[k])
			buf[k][got[k]] = '\0';
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	forget(pid);
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

pid_t it_psctl_spawn(const struct it_cluster *cl, const char *err_path, const char *fmt, ...)
{
	char args[2048], *argv[PSCTL_MAX_ARGS];
	va_list ap;
	pid_t pid;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	psctl_argv(cl, args, argv);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);
		if (fd >= 0)
			dup2(fd, 1);
		fd = err_path ? open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
		if (fd >= 0)
			dup2(fd, 2);
		execv(argv[0], argv);
		_exit(127);
	}
	remember(pid);
	return pid;
}

int it_psctl_wait(pid_t pid, int timeout_ms)
{
	int waited, st;

	for (waited = 0;; waited += 10) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return -errno;
		if (waited >= timeout_ms) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			forget(pid);
			return -ETIMEDOUT;
		}
		it_sleep_ms(10);
	}
	forget(pid);
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* ---- a test program's frame ------------------------------------------------------ */

int it_worker_fail(int rank, const char *what, int ret)
{
	fprintf(stderr, "worker %d: %s: %d (%s): %s\n", rank, what, ret, rps_strerror(ret), rps_last_error());
	return 1;
}

int it_client_connect(const char *servers, int rank, int nworkers, int timeout_ms, rps_client_t **cl)
{
	struct rps_client_opts co;

	rps_client_opts_init(&co);
	co.servers = servers;
	co.rank = rank;
	co.num_workers = nworkers;
	co.timeout_ms = timeout_ms;
	return rps_client_connect(&co, cl);
}

/* A fresh client's pull, in a child. */
struct pull_fresh {
	const char *name;
	size_t count;
	int timeout_ms;
};

static int pull_fresh_child(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct pull_fresh *a = arg;
	float *p = malloc(a->count * sizeof(float));
	uint64_t version = 0;
	rps_client_t *cl;
	rps_tensor_t *t;
	int ret;

	(void)nworkers;
	if (!p)
		return it_worker_fail(rank, "malloc", -ENOMEM);
	if ((ret = it_client_connect(servers, 0, 1, a->timeout_ms, &cl)))
		return it_worker_fail(rank, "connect", ret);
	ret = rps_tensor_open(cl, a->name, &t);
	if (!ret) {
		ret = rps_pull(t, p, a->count * sizeof(float), &version);
		rps_tensor_close(t);
	}
	rps_client_close(cl);
	if (ret)
		return it_worker_fail(rank, "pull", ret);
	it_write_all(out_fd, &version, sizeof(version));
	it_write_all(out_fd, p, a->count * sizeof(float));
	free(p);
	return 0;
}

int it_pull_while_gone(struct rps_tensor *t, float *p, size_t bytes, uint64_t *version, int max_ms)
{
	int ret, tries = 0;

	while ((ret = rps_pull(t, p, bytes, version)) == -EPIPE && tries++ < max_ms / 20)
		usleep(20000);
	return ret;
}

int it_pull_fresh(const char *servers, const char *name, float *out, size_t count, int timeout_ms,
		  uint64_t *version)
{
	struct pull_fresh a = { .name = name, .count = count, .timeout_ms = timeout_ms };
	struct it_workers w;
	int ret = 0;

	*version = 0;
	if (it_workers_start(&w, 1, pull_fresh_child, servers, &a, -1, NULL))
		return -ECHILD;
	if (it_worker_read(&w, 0, version, sizeof(*version)) || it_worker_read(&w, 0, out, count * sizeof(float)))
		ret = -EIO;
	if (it_worker_wait(&w, 0) && !ret)
		ret = -ECHILD;
	return ret;
}

/* Every shard's part of req taken (or the request over), under the
 * client's lock: its progress thread moves the states. */
static bool push_taken(struct rps_request *req)
{
	struct rps_client *cl = req->cl;
	bool taken = true;

	pthread_mutex_lock(&cl->lock);
	for (uint32_t i = 0; i < req->nops; i++)
		taken = taken && req->ops[i].state == ST_TAKEN;
	taken = taken || req->done;
	pthread_mutex_unlock(&cl->lock);
	return taken;
}

int it_push_taken(struct rps_tensor *t, const void *grad, size_t nbytes, int timeout_ms, struct rps_request **req)
{
	double until = it_now_s() + timeout_ms / 1000.0;
	int ret = rps_push_start(t, grad, nbytes, req);

	if (ret)
		return ret;
	while (!push_taken(*req)) {
		if (it_now_s() > until)
			return -ETIMEDOUT;
		usleep(500);
	}
	return 0;
}

/* The program's cluster, for it_test_teardown (NULL: none). */
static struct it_cluster *prog_cl;
static bool *prog_up;

int it_prog_init(const char *prog, unsigned watchdog_s, struct it_cluster *cl, bool *up)
{
	const char *tr = getenv("RPS_IT_TRANSPORT");

	if (tr && !strcmp(tr, "verbs") && !getenv("RPS_IT_ADDR")) {
		fprintf(stderr, "%s: verbs needs RPS_IT_ADDR (an address of an RDMA device)\n", prog);
		return 77;
	}
	prog_cl = cl;
	prog_up = up;
	signal(SIGPIPE, SIG_IGN);
	watchdog_init(prog, watchdog_s, it_kill_all);
	return 0;
}

void *it_shared_map(const char *prog, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		fprintf(stderr, "%s: mmap: %s\n", prog, strerror(errno));
		return NULL;
	}
	return p;
}

void it_test_setup(void)
{
	watchdog_arm();
}

void it_test_teardown(void)
{
	watchdog_disarm();
	if (prog_cl && prog_up && *prog_up) {
		it_cluster_stop(prog_cl);
		*prog_up = false;
	}
}

/* ---- replicas: what the servers say ------------------------------------------ */

int it_member_index(const struct it_cluster *cl, uint64_t id)
{
	return id >= 1 && id <= (uint64_t)cl->nservers ? (int)id - 1 : -1;
}

/* A query of one server, done in a child. */
struct query {
	unsigned type;		/* RPS__MSG_STATUS or RPS__MSG_ADMIN (DIGEST) */
	char uri[300];
	char tensor[RPS__NAME_MAX];
	uint32_t part;
};

struct query_answer {
	int ret;		/* of the call, else the server's status */
	struct rps__status_rep st;
	struct rps__admin_rep rep;
	struct rps__smap map;
};

static void query_run(const struct query *q, int out_fd)
{
	static char buf[sizeof(struct rps__status_rep) + RPS__SMAP_ENC_MAX + 64];
	static struct query_answer a;
	struct rps__admin ad;
	struct rps__ctl *ctl = NULL;
	struct rps__uri u;
	size_t len = 0;
	int32_t status = 0;
	int ret;

	memset(&a, 0, sizeof(a));
	memset(&ad, 0, sizeof(ad));
	ad.op = RPS__ADMIN_DIGEST;
	ad.part = q->part;
	snprintf(ad.uri, sizeof(ad.uri), "%s", q->tensor);
	ret = rps__uri_parse(q->uri, &u);
	if (!ret)
		ret = rps__ctl_open(&u, 5000, &ctl);
	if (!ret && q->type == RPS__MSG_STATUS)
		ret = rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, buf, sizeof(buf), &len, &status, 5000);
	else if (!ret)
		ret = rps__ctl_call(ctl, RPS__MSG_ADMIN, &ad, sizeof(ad), &a.rep, sizeof(a.rep), &len, &status, 5000);
	if (!ret && status)
		ret = status;
	if (!ret && q->type == RPS__MSG_STATUS) {
		if (len < sizeof(struct rps__status_rep)) {
			ret = -EBADMSG;
		} else {
			memcpy(&a.st, buf, sizeof(a.st));
			ret = rps__smap_decode(buf + sizeof(struct rps__status_rep),
					       len - sizeof(struct rps__status_rep), &a.map);
		}
	}
	rps__ctl_close(ctl);
	a.ret = ret;
	it_write_all(out_fd, &a, sizeof(a));
}

/* The query runs in a process of its own, exec'd afresh: a child only
 * forked from a test that used verbs itself (a client of its own) would
 * inherit librdmacm's open devices, whose use the kernel refuses in the
 * child ("changed security contexts after opening file descriptor").
 * The test binary runs itself with RPS_IT_QUERY=RFD,WFD set; this
 * constructor, before main, reads the query from RFD, answers on WFD. */
__attribute__((constructor)) static void query_exec_entry(void)
{
	static struct query q;
	const char *e = getenv("RPS_IT_QUERY");
	int rfd, wfd;
	size_t got = 0;

	if (!e || sscanf(e, "%d,%d", &rfd, &wfd) != 2)
		return;
	while (got < sizeof(q)) {
		ssize_t n = read(rfd, (char *)&q + got, sizeof(q) - got);
		if (n <= 0)
			_exit(2);
		got += (size_t)n;
	}
	signal(SIGPIPE, SIG_IGN);
	query_run(&q, wfd);
	_exit(0);
}

static int query(const struct it_cluster *cl, int i, struct query *q, struct query_answer *a)
{
	int req[2], ans[2], st = 0, ret;
	size_t got = 0;
	pid_t pid;

	if (i < 0 || i >= cl->nservers)
		return -EINVAL;
	snprintf(q->uri, sizeof(q->uri), "%s", cl->uri[i]);
	memset(a, 0, sizeof(*a));
	if (pipe(req) || pipe(ans))
		return -errno;
	pid = fork();
	if (pid == 0) {
		char env[64], *argv[] = { "it-query", NULL };

		close(req[1]);
		close(ans[0]);
		snprintf(env, sizeof(env), "%d,%d", req[0], ans[1]);
		setenv("RPS_IT_QUERY", env, 1);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(req[0]);
	close(ans[1]);
	if (pid < 0) {
		close(req[1]);
		close(ans[0]);
		return -ECHILD;
	}
	ret = it_write_all(req[1], q, sizeof(*q));
	close(req[1]);
	while (!ret && got < sizeof(*a)) {
		ssize_t n = read(ans[0], (char *)a + got, sizeof(*a) - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			ret = -EIO;
		else
			got += (size_t)n;
	}
	close(ans[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (ret || !WIFEXITED(st) || WEXITSTATUS(st))
		return ret ? ret : -ECHILD;
	return a->ret;
}

int it_member_status(const struct it_cluster *cl, int i, struct it_member *st, struct rps__smap *map)
{
	static struct query_answer a;
	struct query q = { .type = RPS__MSG_STATUS };
	int ret = query(cl, i, &q, &a);

	if (ret)
		return ret;
	st->id = a.st.id;
	st->term = a.st.term;
	st->leader = a.st.leader;
	st->leading = a.st.role == RPS__RAFT_LEADER;
	st->balancing = !!(a.st.flags & RPS__STATUS_BALANCING);
	st->n_peers = a.st.n_peers;
	st->n_voters = RPS__MIN(a.st.n_voters, (uint32_t)RPS__ARRAY_SIZE(st->voters));
	memcpy(st->voters, a.st.voters, st->n_voters * sizeof(st->voters[0]));
	if (map)
		*map = a.map;
	return 0;
}

int it_part_digest(const struct it_cluster *cl, int i, const char *tensor, uint32_t part, struct it_digest *d)
{
	static struct query_answer a;
	struct query q = { .type = RPS__MSG_ADMIN, .part = part };
	int ret;

	snprintf(q.tensor, sizeof(q.tensor), "%s", tensor);
	ret = query(cl, i, &q, &a);
	if (ret)
		return ret;
	d->crc = (uint32_t)a.rep.index;
	d->versions = a.rep.epoch;
	d->nshards = (uint32_t)a.rep.leader;
	return 0;
}

int it_replicas_differ(const struct it_cluster *cl, const struct rps__smap *m, const char *tensor,
		       uint64_t *versions)
{
	int differ = 0, ret;

	if (versions)
		*versions = 0;
	for (uint32_t p = 0; p < m->npart; p++) {
		const struct rps__smap_part *mp = &m->parts[p];
		struct it_digest prim, b;
		int owner = it_member_index(cl, mp->owner);

		ret = it_part_digest(cl, owner, tensor, p, &prim);
		if (ret == -ENOENT) {
			/* a member that does not know the tensor holds none
			 * of it (it restarted since, and no shard of it came
			 * here): the empty digest; a partition that should
			 * hold shards then differs from its backups, and the
			 * callers' pulls see what is missing */
			memset(&prim, 0, sizeof(prim));
			ret = 0;
		}
		if (ret) {
			fprintf(stderr, "it_cluster: '%s' partition %u: no digest from its primary %llu: %d\n", tensor, p,
				(unsigned long long)mp->owner, ret);
			return ret;
		}
		if (versions)
			*versions += prim.versions;
		for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1 && mp->backups[k]; k++) {
			ret = it_part_digest(cl, it_member_index(cl, mp->backups[k]), tensor, p, &b);
			if (ret == -ENOENT && !prim.nshards) {
				/* nothing of it in this partition, here either */
				memset(&b, 0, sizeof(b));
				ret = 0;
			}
			if (ret) {
				fprintf(stderr, "it_cluster: '%s' partition %u: no digest from backup %llu: %d\n", tensor,
					p, (unsigned long long)mp->backups[k], ret);
				return ret;
			}
			if (b.crc != prim.crc || b.versions != prim.versions || b.nshards != prim.nshards) {
				fprintf(stderr, "it_cluster: '%s' partition %u: backup %llu holds crc %08x, %llu updates "
					"over %u shards; primary %llu crc %08x, %llu over %u\n", tensor, p,
					(unsigned long long)mp->backups[k], b.crc, (unsigned long long)b.versions,
					b.nshards, (unsigned long long)mp->owner, prim.crc,
					(unsigned long long)prim.versions, prim.nshards);
				differ++;
			}
		}
	}
	return differ;
}

static bool in_part_or_target(const struct rps__smap *m, uint32_t p, uint64_t id)
{
	return rps__smap_role(m, p, id) != RPS__SMAP_ROLE_NONE || m->parts[p].moving_to == id;
}

uint32_t it_peers_wanted(const struct it_member *st, const struct rps__smap *m)
{
	bool voter = false;
	uint32_t n = 0;

	for (uint32_t v = 0; v < st->n_voters; v++)
		voter |= st->voters[v] == st->id;
	for (uint32_t i = 0; i < m->nmembers; i++) {
		uint64_t id = m->members[i].id;
		bool want = voter;

		if (id == st->id)
			continue;
		for (uint32_t v = 0; v < st->n_voters && !want; v++)
			want = st->voters[v] == id;
		for (uint32_t p = 0; p < m->npart && !want; p++)
			want = in_part_or_target(m, p, st->id) && in_part_or_target(m, p, id);
		n += want;
	}
	return n;
}

int it_peers_as_wanted(const struct it_cluster *cl, double deadline_s, struct it_peers_tally *t)
{
	static struct rps__smap m;
	double until = it_now_s() + deadline_s;
	int bad, ret;

	for (;;) {
		bool last = it_now_s() > until;

		bad = 0;
		memset(t, 0, sizeof(*t));
		for (int i = 0; i < cl->nservers; i++) {
			struct it_member st;
			uint32_t want;
			bool voter = false;

			if ((ret = it_member_status(cl, i, &st, &m)))
				return ret;
			want = it_peers_wanted(&st, &m);
			for (uint32_t v = 0; v < st.n_voters; v++)
				voter |= st.voters[v] == st.id;
			if (voter) {
				t->voter_max = RPS__MAX(t->voter_max, st.n_peers);
			} else {
				t->learner_sum += st.n_peers;
				t->nlearners++;
			}
			if (st.n_peers != want) {
				if (last)
					fprintf(stderr, "\n  member %llu: %u peer connections, %u wanted",
						(unsigned long long)st.id, st.n_peers, want);
				bad++;
			}
		}
		if (!bad || last)
			return bad;
		it_sleep_ms(200);
	}
}

static int running(const struct it_cluster *cl, int i)
{
	/* (it_server_alive only peeks: WNOWAIT) */
	return it_server_alive((struct it_cluster *)cl, i);
}

static int running_id(const struct it_cluster *cl, uint64_t id)
{
	return running(cl, it_member_index(cl, id));
}

/* Has the map settled?  NULL if so, else what is missing. */
static const char *settled(const struct it_cluster *cl, uint32_t replicas, struct rps__smap *m, char *why,
			   size_t len)
{
	static struct rps__smap mi;
	struct it_member st;
	uint32_t nrun = 0, want;
	uint64_t known_leader = 0;
	bool first = true, leader = false;

	for (int i = 0; i < cl->nservers; i++) {
		if (!running(cl, i))
			continue;
		nrun++;
		if (it_member_status(cl, i, &st, &mi)) {
			snprintf(why, len, "server %d does not answer STATUS", i);
			return why;
		}
		leader = leader || st.leading;
		/* a map that settled between two balancing moves is not the
		 * one that stays: its callers compare replicas by it */
		if (st.balancing) {
			snprintf(why, len, "the leader, server %d, is still balancing the primaries", i);
			return why;
		}
		/* every member has heard from the same leader: a member the
		 * leader never heard from is never failed over (it held no
		 * lease), and right after a start the highest member's first
		 * dials may have been refused, the next a second later */
		if (!st.leader || (known_leader && st.leader != known_leader)) {
			snprintf(why, len, "server %d knows %s leader %llu", i, st.leader ? "another" : "no",
				 (unsigned long long)(st.leader ? st.leader : known_leader));
			return why;
		}
		known_leader = st.leader;
		if (first)
			*m = mi;
		else if (mi.applied != m->applied) {
			snprintf(why, len, "server %d applied %llu, another %llu", i, (unsigned long long)mi.applied,
				 (unsigned long long)m->applied);
			return why;
		}
		first = false;
	}
	if (!leader) {
		snprintf(why, len, "no leader");
		return why;
	}
	if (replicas && m->replicas != replicas) {
		snprintf(why, len, "the map's target is %u copies, not %u", m->replicas, replicas);
		return why;
	}
	want = (m->replicas < nrun ? m->replicas : nrun) - 1;
	for (uint32_t p = 0; p < m->npart; p++) {
		const struct rps__smap_part *mp = &m->parts[p];
		uint32_t nb = rps__smap_nbackups(m, p);

		if (mp->joining || mp->moving_to || mp->lost || !running_id(cl, mp->owner) || nb != want) {
			snprintf(why, len, "partition %u: owner %llu%s, %u backups (want %u), joining %llu, "
				 "moving to %llu, lost %llu", p, (unsigned long long)mp->owner,
				 running_id(cl, mp->owner) ? "" : " (not running)", nb, want,
				 (unsigned long long)mp->joining, (unsigned long long)mp->moving_to,
				 (unsigned long long)mp->lost);
			return why;
		}
		for (uint32_t k = 0; k < nb; k++)
			if (!running_id(cl, mp->backups[k]) || mp->backups[k] == mp->owner) {
				snprintf(why, len, "partition %u: backup %llu not running", p,
					 (unsigned long long)mp->backups[k]);
				return why;
			}
	}
	return NULL;
}

int it_wait_settled(const struct it_cluster *cl, uint32_t replicas, int timeout_ms, struct rps__smap *m)
{
	static struct rps__smap scratch;
	char why[512];
	const char *w = "never asked";
	struct timespec t0, t;

	if (!m)
		m = &scratch;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		if (!(w = settled(cl, replicas, m, why, sizeof(why))))
			return 0;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > timeout_ms)
			break;
		it_sleep_ms(50);
	}
	fprintf(stderr, "it_cluster: the map did not settle in %d ms: %s\n", timeout_ms, w);
	return -ETIMEDOUT;
}
