/*
 * servers.c - the servers psperf runs itself: a local cluster of
 * in-process server cores (threads) for local mode and the commit test,
 * and --server, one server core until SIGINT/SIGTERM with, under
 * --baseline, the raw responders that remote workers' baselines talk to.
 */
#include "config.h"
#include "psperf_int.h"
#include "client/ctl.h"
#include "control/daemon.h"
#include "proto/auth.h"
#include "proto/proto.h"
#include "proto/smap.h"
#include "server/server.h"
#include "transport/uri.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- local servers ------------------------------------------------------------------------- */

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
void psperf_cluster_destroy(void *arg)
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
 * --fsync (the commit test, where syncing is what is measured).
 * no_target: no --replicas (the reseed test sets the map's target itself,
 * and a leader's flag would set it back). */
/*
 * The servers psperf starts run with a key, as a deployment does, so the
 * connect path measured is the real one: RDMAPS_KEY_FILE's (psperf --key),
 * else a cluster key made for this run, in a directory removed at exit.
 * Its workers, in this process or forked, find it in RDMAPS_KEY_FILE.
 */
static struct rps__keyring *run_keys;
static char run_key_dir[64];
static pid_t run_key_owner;

static void run_key_remove(void)
{
	char path[128];

	if (getpid() != run_key_owner)
		return;
	snprintf(path, sizeof(path), "%s/cluster.key", run_key_dir);
	unlink(path);
	rmdir(run_key_dir);
}

static struct rps__keyring *psperf_keys(void)
{
	const char *path = rps__key_path(NULL);
	char made[128];

	if (run_keys)
		return run_keys;
	if (!path) {
		snprintf(run_key_dir, sizeof(run_key_dir), "%s/psperf-key.XXXXXX",
			 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
		if (!mkdtemp(run_key_dir)) {
			fprintf(stderr, "psperf: making a key for this run: mkdtemp %s: %s\n", run_key_dir,
				strerror(errno));
			exit(1);
		}
		snprintf(made, sizeof(made), "%s/cluster.key", run_key_dir);
		if (rps__key_write(made, RPS__KEY_CLUSTER, NULL, NULL)) {
			fprintf(stderr, "psperf: making a key for this run: %s\n", rps__errbuf());
			exit(1);
		}
		run_key_owner = getpid();
		atexit(run_key_remove);
		setenv("RDMAPS_KEY_FILE", made, 1);
		path = made;
	}
	if (rps__keyring_open(path, true, &run_keys)) {
		fprintf(stderr, "psperf: --key: %s\n", rps__errbuf());
		exit(1);
	}
	return run_keys;
}

static void server_cfg(const struct run *r, struct rps__server_config *cfg, const char *cluster, int i,
		       const char *data_dir, bool no_target, bool no_key)
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
	cfg->nthreads = o->threads;
	cfg->max_conns = (uint32_t)(o->nworkers + 4);
	cfg->replicas = no_target ? 0 : (uint32_t)o->replicas;
	cfg->npart = o->partitions;
	cfg->keys = no_key ? NULL : psperf_keys();
	cfg->insecure = no_key;	/* (psperf's own servers, measured without a key) */
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
int psperf_cluster_start(struct run *r, struct lcluster *c, int nservers, char *list, size_t listlen)
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
		server_cfg(r, &cfg, list, i, c->dirs[i][0] ? c->dirs[i] : NULL, c->no_target, c->no_key);
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

int psperf_cluster_errors(struct lcluster *c)
{
	int i, bad = 0;

	for (i = 0; i < c->n; i++)
		if (c->s[i].ret) {
			fprintf(stderr, "psperf: server %d stopped with an error: %s\n", i, c->s[i].err);
			bad++;
		}
	return bad;
}

/* --replicas R: wait until server 0's map has exactly R copies of every
 * partition (a new cluster of 2 or more servers starts with 2: the leader
 * sets the target, then seeds each backup with a partition image, a move's
 * pause, or drops them, each an epoch change): timing starts on the
 * cluster at R, not while it gets there. */
/* A partition with more copies than the target (drops to come)? */
static bool over(const struct rps__smap *m)
{
	for (uint32_t p = 0; p < m->npart; p++)
		if (1 + rps__smap_nbackups(m, p) > m->replicas || m->parts[p].joining)
			return true;
	return false;
}

static int wait_replicated(struct run *r, const char *list)
{
	static char buf[RPS__BIG_MSG_MAX];
	uint64_t deadline = rps__now_ns() + 60ull * 1000000000ull;
	struct rps__status_rep st;
	struct rps__smap map;
	struct rps__ctl *ctl = NULL;
	struct rps__uri *u = NULL;
	int n = 0, ret;

	if ((ret = rps__uri_list_parse(list, &u, &n)) || (ret = rps__ctl_open(&u[0], 5000, &ctl))) {
		free(u);
		return ret;
	}
	for (;;) {
		size_t len = 0;
		int32_t status = 0;
		ret = rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, buf, sizeof(buf), &len, &status, 5000);
		if (!ret && !status && len > sizeof(st) &&
		    !rps__smap_decode(buf + sizeof(st), len - sizeof(st), &map) &&
		    map.replicas == (uint32_t)r->o->replicas && !rps__smap_nunder(&map) && !over(&map))
			break;
		if (rps__now_ns() > deadline) {
			ret = rps__seterr(-ETIMEDOUT, "--replicas %d: the partitions were not all replicated within 60 s",
					  r->o->replicas);
			break;
		}
		psperf_sleep_ms(20);
	}
	rps__ctl_close(ctl);
	free(u);
	return ret;
}

int psperf_run_local_cluster(struct run *r)
{
	struct lcluster c;
	int ret;

	memset(&c, 0, sizeof(c));
	ret = psperf_cluster_start(r, &c, r->o->nservers, r->servers, sizeof(r->servers));
	if (!ret && r->o->nservers > 1 && (ret = wait_replicated(r, r->servers)))
		fprintf(stderr, "psperf: %s\n", rps__errbuf());
	if (!ret)
		ret = psperf_run_workers(r, 0, r->o->nworkers, psperf_cluster_destroy, &c);
	psperf_cluster_destroy(&c);
	if (psperf_cluster_errors(&c) && !ret)
		ret = -EIO;
	return ret;
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
		if (psperf_rawt_accept(&p->s, p->window, 0, &server_stopping)) {
			if (!server_stopping)
				fprintf(stderr, "psperf: raw responder: %s\n", rps__errbuf());
			if (p->s.ep) {
				rps__ep_close(p->s.ep);
				p->s.ep = NULL;
			}
			if (!server_stopping)
				psperf_sleep_ms(100);
		}
		while (!server_stopping && p->s.ep && !p->s.broken)
			psperf_rawt_peer_progress(&p->s, 100);
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

	sp->lfd = psperf_sock_listen(u->host, (uint16_t)(u->port + SOCK_PORT_OFFSET), &sp->port);
	if (sp->lfd < 0) {
		fprintf(stderr, "psperf: --baseline: socket responder on %s port %u: %s: free that port or use another --listen port\n",
			u->host, u->port + SOCK_PORT_OFFSET, strerror(-sp->lfd));
		return sp->lfd;
	}
	sp->forever = true;
	sp->stop = &server_stopping;
	*s_ok = pthread_create(&sp->thread, NULL, psperf_sock_peer_main, sp) == 0;
	tp->kind = u->kind;
	tp->device = o->device;
	tp->host = u->host;
	tp->port = (uint16_t)(u->port + RAWT_PORT_OFFSET);
	tp->window = o->window;
	ret = psperf_rawt_open(&tp->s, u->kind, o->device, u->host);
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
	psperf_rawt_close(&tp->s);
}

int psperf_role_server(struct opts *o)
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
		psperf_die_usage("--listen: %s", rps__errbuf());
	cfg.cluster = o->cluster;
	cfg.index = o->index;
	cfg.shard_bytes = o->shard_bytes;
	cfg.nslots = o->slots;
	cfg.spin_us = o->spin_us;
	cfg.nthreads = o->threads;
	cfg.fsync_none = o->fsync_none;
	if (rps__key_path(NULL)) {
		cfg.keys = psperf_keys();
	} else if (!getenv("RDMAPS_INSECURE") && !rps__host_is_loopback(cfg.listen.host)) {
		fprintf(stderr, "psperf: --server on %s without a key: give --key FILE (psctl keygen makes one), "
			"or --insecure on a network you trust\n", cfg.listen.host);
		return 2;
	} else if (!getenv("RDMAPS_INSECURE")) {	/* as rdmapsd: this user's loopback key */
		char local[PATH_MAX];
		bool made;

		if (rps__local_key_ensure(local, sizeof(local), &made) ||
		    rps__keyring_open(local, true, &cfg.keys)) {
			fprintf(stderr, "psperf: --server without --key: %s\n", rps__errbuf());
			return 1;
		}
	}
	cfg.insecure = getenv("RDMAPS_INSECURE") != NULL;
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
