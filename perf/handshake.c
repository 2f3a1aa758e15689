/*
 * handshake.c - the connect test: what the handshake every connection starts
 * with costs (doc/security.md).  An admin channel (rps__ctl_open +
 * close: the connect, AUTH and its answer) and a worker's client
 * (rps_client_connect + rps_client_close: fabric, buffers, HELLO, the
 * map), each to a one-server cluster with a key and to one without, in
 * one run; the ratio of the two is the handshake's share.  With --servers
 * N > 1, a worker's client to a cluster of N too: its ratio to the one
 * server's is what dialing N costs.
 */
#include "config.h"
#include "psperf_int.h"
#include "client/ctl.h"
#include "transport/uri.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int one_connect(struct run *r, const struct row *row, const char *servers, const struct rps__uri *u)
{
	struct rps_client_opts co;
	struct rps__ctl *ctl;
	rps_client_t *cl;
	int ret;

	if (!row->connect_worker) {
		ret = rps__ctl_open(u, r->o->timeout_ms, &ctl);
		if (!ret)
			rps__ctl_close(ctl);
		return ret;
	}
	rps_client_opts_init(&co);
	co.servers = servers;
	co.timeout_ms = r->o->timeout_ms;
	ret = rps_client_connect(&co, &cl);
	if (!ret)
		rps_client_close(cl);
	return ret;
}

/* row's connects, timed one by one. */
static int time_row(struct run *r, struct row *row, const char *servers, const struct rps__uri *u)
{
	uint64_t t0;
	int ret = 0;
	long i;

	psperf_samples_reserve(&row->lat.s, (size_t)row->iters);
	for (i = -row->warmup; !ret && i < row->iters; i++) {
		if (i == 0)
			row->lat.t0 = rps__now_ns();
		t0 = rps__now_ns();
		ret = one_connect(r, row, servers, u);
		if (i >= 0)
			psperf_samples_add(&row->lat.s, rps__now_ns() - t0);
		if (ret)
			psperf_run_fail(r, "connect %ld (%s): %s", i + 1, row->label, rps__errbuf());
	}
	row->lat.t1 = rps__now_ns();
	return ret;
}

/* Both rows of one kind of server (with a key or without); with a key,
 * the worker's to --servers N after them. */
static int measure(struct run *r, bool nokey)
{
	struct lcluster *c = psperf_xcalloc(1, sizeof(*c));
	char servers[4096], *key = NULL;
	struct rps__uri u;
	struct row *many;
	int w, ret;

	c->no_key = nokey;
	if (nokey) {	/* the clients too: no key, and loopback or not, no refusal */
		key = getenv("RDMAPS_KEY_FILE") ? strdup(getenv("RDMAPS_KEY_FILE")) : NULL;
		unsetenv("RDMAPS_KEY_FILE");
		setenv("RDMAPS_INSECURE", "1", 1);
	}
	ret = psperf_cluster_start(r, c, 1, servers, sizeof(servers));
	if (ret)
		psperf_run_fail(r, "connect: the server could not start (see above)");
	if (!ret && rps__uri_parse(servers, &u))
		ret = psperf_run_fail(r, "connect: %s", rps__errbuf());
	for (w = 0; !ret && w < 2; w++) {
		struct row *row = psperf_plan_connect_row(r, nokey, w == 1);
		if (row)
			ret = time_row(r, row, servers, &u);
	}
	if (!ret && !nokey && (many = psperf_plan_connect_many_row(r))) {
		/* a worker's client to --servers N: the same, its dials
		 * to the N made side by side (src/client/dialer.c) */
		psperf_cluster_destroy(c);
		if (psperf_cluster_errors(c))
			ret = psperf_run_fail(r, "connect: the server stopped with an error (see above)");
		free(c);
		c = psperf_xcalloc(1, sizeof(*c));
		if (!ret && (ret = psperf_cluster_start(r, c, many->connect_servers, servers, sizeof(servers))))
			psperf_run_fail(r, "connect: the %d servers could not start (see above)", many->connect_servers);
		if (!ret)
			ret = time_row(r, many, servers, &u);
	}
	psperf_cluster_destroy(c);
	if (psperf_cluster_errors(c) && !ret)
		ret = psperf_run_fail(r, "connect: the server stopped with an error (see above)");
	free(c);
	if (nokey) {
		unsetenv("RDMAPS_INSECURE");
		if (key)
			setenv("RDMAPS_KEY_FILE", key, 1);
		free(key);
	}
	return ret;
}

int psperf_run_connect_local(struct run *r)
{
	int ret;

	if (!psperf_plan_has_cluster_rows(r))
		r->nservers = 1;
	ret = measure(r, false);
	if (!ret)
		ret = measure(r, true);
	return ret;
}
