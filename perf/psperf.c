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
 * parameter-like data and of zeros, against memcpy, in-process), reseed
 * (the re-replication rate: psctl set-replicas R timed until every
 * partition has R copies, against the raw bandwidth of the same path; a
 * cluster of its own), group (small tensors pushed as one group, against
 * the same tensors pushed one by one), connect (what the handshake costs:
 * a connection to a server with a key, against one without).
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
 * the raw one.  All output goes through small table / CSV / JSON writers
 * (output.c).
 *
 * This file holds main and the flow of the roles; the rest, one job a file
 * (shared types and helpers in psperf_int.h; tests/filemaps.sh checks that
 * this names every file of perf/):
 *   options.c         usage, option parsing, the fabric and device address
 *   plan.c            the rows of every test
 *   worker.c          worker threads: tensors, one op, passes, merging
 *   servers.c         in-process servers; --server and its raw responders
 *   commit.c          the commit test
 *   reseed.c          the reseed test
 *   handshake.c       the connect test: what the handshake costs
 *   kernels.c         agg, crc, igzip in-process
 *   baselines.c       which raw op each row compares with; running them
 *   baseline_sock.c   plain sockets
 *   baseline_xport.c  raw ops through transport.h
 *   stats.c           samples, statistics, figures and ratios
 *   output.c          tables, CSV, JSON
 *   util.c            usage errors, a test's failure, allocations, the progress line
 */
#include "config.h"
#include "psperf_int.h"
#include "transport/uri.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
		psperf_samples_free(&r->rows[i].lat.s);
		psperf_samples_free(&r->rows[i].bw.s);
	}
	free(r->rows);
	free(r->sizes);
	free(r->raws);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
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

static int finish_run(struct run *r, int cluster_ret)
{
	int status = 0;

	if (cluster_ret) {
		fprintf(stderr, "psperf: FAILED: %s\n", r->err[0] ? r->err : "the cluster could not start (see above)");
		status = 1;
	}
	if (!status)
		psperf_run_agg_rows(r);
	if (!status && r->base_err[0]) {
		fprintf(stderr, "psperf: FAILED: --baseline: %s; the tables lack those columns\n", r->base_err);
		status = psperf_report(r, 1);
	} else if (!status) {
		status = psperf_report(r, 0);
	}
	run_free(r);
	return status;
}

static bool has_reseed(const struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (r->rows[i].test == T_RESEED)
			return true;
	return false;
}

static int role_local(struct opts *o)
{
	struct run r;
	int ret = 0;

	run_init(&r, o);
	read_cpu(&r);
	r.W = o->nworkers;
	r.nservers = o->nservers;
	psperf_plan_rows(&r);
	if (psperf_plan_has_cluster_rows(&r) || o->baseline || psperf_plan_commit_row(&r, false) || has_reseed(&r) ||
	    psperf_plan_connect_row(&r, false, false)) {
		if (psperf_choose_fabric(&r)) {
			run_free(&r);
			return 1;
		}
	}
	if (o->baseline)
		psperf_raw_plan_all(&r);
	if (psperf_plan_has_cluster_rows(&r))
		ret = psperf_run_local_cluster(&r);
	if (!ret && psperf_plan_commit_row(&r, false))
		ret = psperf_run_commit_local(&r);
	if (!ret && has_reseed(&r))
		ret = psperf_run_reseed_local(&r);
	if (!ret && psperf_plan_connect_row(&r, false, false))
		ret = psperf_run_connect_local(&r);
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
		psperf_die_usage("--connect: %s", rps__errbuf());
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
	psperf_plan_rows(&r);
	if (o->baseline)
		psperf_raw_plan_all(&r);
	if (psperf_plan_has_cluster_rows(&r))
		ret = psperf_run_workers(&r, o->rank, 1, NULL, NULL);
	if (!ret && psperf_plan_commit_row(&r, false))
		ret = psperf_commit_measure(&r, o->connect, NULL);
	return finish_run(&r, ret);
}

int main(int argc, char **argv)
{
	struct opts o;

	signal(SIGPIPE, SIG_IGN);
	psperf_parse_args(&o, argc, argv);
	switch (o.role) {
	case ROLE_SERVER: return psperf_role_server(&o);
	case ROLE_WORKER: return role_worker(&o);
	default: return role_local(&o);
	}
}
