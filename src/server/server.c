/*
 * server.c - the parameter server core (see server.h).
 *
 * One thread polls one completion queue for every worker connection.  What
 * arrives:
 *  - control messages (SEND) in pre-posted receive buffers: HELLO, CREATE,
 *    WAIT, BARRIER;
 *  - pushes: a WRITE_WITH_IMM that put a descriptor and gradient data into a
 *    staging slot of the connection; the immediate names the slot.
 * A push is consumed when its consistency mode allows it (sync: in rank
 * order within a step, so sums are bit-identical whatever the arrival
 * order; async/bounded: under the shard lock the worker holds) and is held
 * in its slot until then.  A slot is the worker's own, so the worker's
 * back-pressure is its slot count and staging memory is bounded by
 * connections x slots x slot size, whatever the model size.
 *
 * Shard parameters are published with a seqlock (hdr->seq odd while written)
 * so workers can READ them one-sidedly and detect a torn read.  The lock word
 * is never stored by this CPU: a lease that expired, or the lock of a worker
 * that disconnected, is broken with rps__local_cas (through the HCA).
 *
 * This file: create, destroy, memory accounting, the loop.  The other
 * files of the data plane, and what each holds: server_int.h.
 */
#include "config.h"
#include "server/server.h"
#include "common/common.h"
#include "kernels/optim.h"
#include "proto/proto.h"
#include "proto/shard.h"
#include "common/topo.h"
#include "transport/transport.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "rdmaps.h"

#define conn_fail rps__srv_conn_fail
#define post_recv_buf rps__srv_post_recv

void rps__server_config_init(struct rps__server_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->listen.kind = RPS__KIND_TCP;
	strcpy(cfg->listen.host, "127.0.0.1");
	cfg->listen.port = 7000;
	cfg->index = -1;
	cfg->shard_bytes = 1u << 20;
	cfg->nslots = 8;
	cfg->lease_ms = 5000;
	cfg->max_conns = 64;
	cfg->numa_node = -1;
	cfg->park_limit = 256u << 20;
	cfg->tick_ms = 50;
	cfg->election_ticks = 10;
	cfg->move_timeout_ms = 30000;
	cfg->drain_ms = 2000;
}

/* ---- memory accounting ------------------------------------------------ */

size_t rps__server_min_memory(const struct rps__server_config *cfg)
{
	size_t slot = RPS__ALIGN_UP(RPS__PUSH_DESC_SIZE + (size_t)cfg->shard_bytes, 64);

	return (size_t)cfg->nslots * slot + rps__shard_stride(cfg->shard_bytes / 4);
}

/* What the limit is checked against: this server's use, or with serving
 * threads their sum (the first instance's mem_group, atomic: an instance
 * takes memory when a worker connects or creates a tensor, or a push is
 * parked; never per push otherwise). */
static size_t mem_counted(const struct rps__server *srv)
{
	return srv->thr.nthreads > 1 ? __atomic_load_n(&srv->thr.first->mem_group, __ATOMIC_RELAXED) : srv->mem_used;
}

int rps__srv_mem_take(struct rps__server *srv, size_t bytes, const char *what)
{
	size_t limit = srv->cfg.mem_limit, used = mem_counted(srv);

	/* kept parking buffers give way before anything is refused */
	if (limit && bytes > limit - RPS__MIN(used, limit) && srv->push.park_pool_bytes) {
		rps__srv_park_pool_trim(srv, bytes - (limit - RPS__MIN(used, limit)));
		used = mem_counted(srv);
	}
	if (srv->thr.nthreads > 1) {
		do {
			if (limit && (used > limit || bytes > limit - used))
				break;
		} while (!__atomic_compare_exchange_n(&srv->thr.first->mem_group, &used, used + bytes, false,
						      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	}
	if (limit && (used > limit || bytes > limit - used))
		return rps__seterr(-ENOMEM, "%s: %zu bytes would exceed the memory limit (%zu of %zu used): raise rdmapsd --memory-limit",
				   what, bytes, used, limit);
	srv->mem_used += bytes;
	return 0;
}

void rps__srv_mem_charge(struct rps__server *srv, size_t bytes)
{
	if (srv->thr.nthreads > 1)
		__atomic_fetch_add(&srv->thr.first->mem_group, bytes, __ATOMIC_RELAXED);
	srv->mem_used += bytes;
}

void rps__srv_mem_give(struct rps__server *srv, size_t bytes)
{
	if (srv->thr.nthreads > 1)
		__atomic_fetch_sub(&srv->thr.first->mem_group, bytes, __ATOMIC_RELAXED);
	srv->mem_used -= bytes;
}

/* Where shards, staging slots and the serving thread go: near the HCA
 * (verbs), or the whole machine (tcp), unless --numa-node/--cpus/--no-pin. */
static int place_server(const struct rps__server_config *cfg, struct rps__fabric *fab,
			struct rps__topo **topo, struct rps__placement *place)
{
	struct rps__topo_opts to = { .xml_path = cfg->topology, .log = 1 };
	struct rps__topo_overrides ov = { .numa_node = cfg->numa_node, .cpus = cfg->cpus, .no_pin = cfg->no_pin };
	const char *dev = cfg->listen.kind == RPS__KIND_VERBS ? rps__fabric_name(fab) : NULL;
	int ret;

	ret = rps__topo_open(&to, topo);
	if (ret)
		return ret;
	ret = rps__topo_place(*topo, dev, &ov, place);
	if (ret) {
		rps__topo_close(*topo);
		*topo = NULL;
	}
	return ret;
}

/* ---- the loop ------------------------------------------------------------- */

static void on_completion(struct rps__server *srv, const struct rps__wc *wc)
{
	struct srv_conn *c = wc->ep ? rps__ep_context(wc->ep) : NULL;
	uint32_t kind = (uint32_t)(wc->wr_id >> 32), idx = (uint32_t)wc->wr_id, gen;

	if (!c)
		return;
	if (wc->status != RPS__WC_SUCCESS) {
		if (kind == WRID_READ && srv->hooks.on_read_done)
			srv->hooks.on_read_done(srv->hooks.ctx, c, false, NULL);
		if (!c->dead)
			rps__log(RPS__LOG_INFO, "%s %s: %s", rps__srv_role_name(c), rps__ep_peer(c->ep),
				 rps__wc_status_str(wc->status));
		c->dead = true;
		return;
	}
	if (kind == WRID_SEND || kind == WRID_STEP_DONE) {
		if (idx < c->bufs.nsend)
			c->bufs.sfree[c->bufs.nsfree++] = idx;
		if (kind == WRID_STEP_DONE && c->sd.inflight)
			c->sd.inflight--;
		if (c->role == CONN_PEER && srv->hooks.on_send_done)
			srv->hooks.on_send_done(srv->hooks.ctx, c);
		return;
	}
	if (kind == WRID_READ) {
		if (srv->hooks.on_read_done)
			srv->hooks.on_read_done(srv->hooks.ctx, c, true, c->rd.buf);
		return;
	}
	if (kind != WRID_RECV || idx >= c->bufs.nrecv)
		return;
	c->last_active_ns = rps__now_ns();
	gen = c->bufs.gen;
	if (!c->dead && !c->auth.authed && wc->opcode == RPS__WC_RECV_IMM) {
		conn_fail(c, "wrote before it authenticated");
	} else if (!c->dead) {
		if (wc->opcode == RPS__WC_RECV_IMM && c->role == CONN_WORKER)
			rps__srv_on_push(srv, c, wc->imm);
		else if (wc->opcode == RPS__WC_RECV_IMM && c->role == CONN_REPL && !c->repl.out)
			rps__srv_repl_on_entry(srv, c, wc->imm);
		else if (wc->opcode == RPS__WC_RECV_IMM)
			conn_fail(c, "wrote into memory it does not own");
		else
			rps__srv_on_message(srv, c, rps__srv_rbuf(c, idx), wc->byte_len);
	}
	/* (a connection that authenticated has new buffers, all posted) */
	if (!c->dead && c->bufs.gen == gen && post_recv_buf(c, idx))
		conn_fail(c, rps__errbuf());
}

static void reap_dead(struct rps__server *srv)
{
	uint32_t i = 0;

	while (i < srv->nconns) {
		if (srv->conns[i]->dead) {
			rps__srv_conn_destroy(srv, srv->conns[i]);
			continue;
		}
		i++;
	}
}

/* --idle-timeout-ms: a worker that sent nothing for that long gives its
 * --max-connections place back.  Pulls and lock operations are one-sided
 * (no completion here), so only requests and pushes count as activity. */
static void drop_idle_workers(struct rps__server *srv, uint64_t now)
{
	uint64_t limit = (uint64_t)srv->cfg.idle_timeout_ms * 1000000ull;
	char why[96];
	uint32_t i;

	for (i = 0; i < srv->nconns; i++) {
		struct srv_conn *c = srv->conns[i];
		if (c->role != CONN_WORKER || c->dead || now - c->last_active_ns < limit)
			continue;
		snprintf(why, sizeof(why), "idle for %u ms: dropped (rdmapsd --idle-timeout-ms)",
			 srv->cfg.idle_timeout_ms);
		conn_fail(c, why);
	}
}

#define LISTENER_CHECK_NS (250ull * 1000000ull)
#define TIMERS_IDLE_MS 1000	/* no layer above: no timers of its own */

/* The loop's timers: the lease scan, the listener's (and --idle-timeout-ms)
 * and the layer above's.  Returns the ms until the layer above wants to run
 * again, or a negative errno; *stop: the layer above asks to stop. */
static int run_timers(struct rps__server *srv, uint64_t now, uint64_t scan_every,
		      uint64_t *next_listener_check, bool *stop)
{
	int cp_ms = TIMERS_IDLE_MS;

	if (now >= srv->next_lease_scan) {
		rps__srv_scan_locks(srv, 0);
		srv->next_lease_scan = now + scan_every;
	}
	/* the listener drops silent handshakes only when asked: ask on a
	 * timer too, not only when a new connection arrives */
	if (now >= *next_listener_check) {
		rps__srv_accept_pending(srv);
		rps__srv_auth_timers(srv, now);
		if (srv->retired.n)
			rps__srv_retired_reap(srv, now, false);
		if (srv->req.ndepartures)
			rps__srv_departures_run(srv, now, false);
		if (srv->req.nwaiters)
			rps__srv_waiters_check(srv, now);
		if (srv->cfg.idle_timeout_ms)
			drop_idle_workers(srv, now);
		*next_listener_check = now + LISTENER_CHECK_NS;
	}
	if (srv->hooks.run_timers)
		cp_ms = srv->hooks.run_timers(srv->hooks.ctx, now, stop);
	return cp_ms;
}

#define SLEEP_DIALS_MAX 32	/* more dials than that: stepped without sleeping */

/* Sleep until a completion, a connection request, a dial's progress, a
 * stop or the next timer.  1: stop, 0: go on, or a negative errno. */
static int sleep_until_work(struct rps__server *srv, uint64_t now, int cp_ms)
{
	struct pollfd pfd[4 + SLEEP_DIALS_MAX];
	int timeout, ndials;

	pfd[0] = (struct pollfd){ .fd = rps__cq_fd(srv->cq), .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = rps__listener_fd(srv->listener), .events = POLLIN };
	pfd[2] = (struct pollfd){ .fd = srv->stop_fd, .events = POLLIN };
	pfd[3] = (struct pollfd){ .fd = srv->thr.mbox.fd, .events = POLLIN };	/* (-1: none, ignored) */
	timeout = (int)((srv->next_lease_scan - now) / 1000000ull) + 1;
	if (cp_ms < timeout)
		timeout = cp_ms;
	if ((int)(LISTENER_CHECK_NS / 1000000ull) < timeout)
		timeout = (int)(LISTENER_CHECK_NS / 1000000ull);
	{	/* awake when the lease ends: the read fence goes up then */
		uint64_t boot = rps__dp_boottime_ns();
		if (srv->rfence.held && srv->lease_until > boot &&
		    (srv->lease_until - boot) / 1000000ull + 1 < (uint64_t)timeout)
			timeout = (int)((srv->lease_until - boot) / 1000000ull) + 1;
	}
	/* and when a dial moves on or times out (dial.c) */
	ndials = rps__srv_dials_poll(srv, pfd + 4, SLEEP_DIALS_MAX, now, &timeout);
	if (__atomic_load_n(&srv->thr.mbox.pending, __ATOMIC_ACQUIRE))
		timeout = 0;	/* asked between our last look and now */
	if (poll(pfd, 4 + (nfds_t)ndials, timeout) < 0 && errno != EINTR)
		return rps__seterr(-errno, "poll: %s", strerror(errno));
	if (pfd[2].revents)
		return 1;
	if (pfd[1].revents)
		rps__srv_accept_pending(srv);
	return 0;
}

int rps__server_run(struct rps__server *srv)
{
	struct rps__wc wc[32];
	uint64_t spin_ns = (uint64_t)srv->cfg.spin_us * 1000ull;
	uint64_t scan_every = RPS__MAX((uint64_t)srv->cfg.lease_ms * 1000000ull / 4, 1000000ull);
	uint64_t idle_since = rps__now_ns();
	uint64_t next_listener_check = 0;

	/* The serving thread near the HCA; what it mallocs (optimizer state,
	 * accumulators) then lands on its node by first touch. */
	if (rps__topo_pin_thread(srv->topo, &srv->place))
		rps__log(RPS__LOG_WARN, "%s: serving unpinned", rps__errbuf());
	srv->next_lease_scan = rps__now_ns() + scan_every;
	for (;;) {
		bool stop = false;
		uint64_t now;
		int n, i, cp_ms;

		/* here, not only after poll(): busy completions or --spin-us
		 * may keep the loop from sleeping for as long as they last */
		if (__atomic_load_n(&srv->stopping, __ATOMIC_RELAXED))
			return 0;
		rps__srv_mbox_poll(srv);	/* what the control plane's thread asks */
		/* before the completions: the TCP provider serves READs in them */
		rps__srv_read_fence(srv);
		n = rps__cq_poll(srv->cq, wc, (int)RPS__ARRAY_SIZE(wc));
		if (n < 0) {
			rps__log(RPS__LOG_ERROR, "polling completions: %s", rps__errbuf());
			return n;
		}
		for (i = 0; i < n; i++)
			on_completion(srv, &wc[i]);
		if (srv->dial.ndials)
			rps__srv_dials_turn(srv);
		if (srv->repl.active)
			rps__srv_repl_turn(srv);
		reap_dead(srv);
		now = rps__now_ns();
		cp_ms = run_timers(srv, now, scan_every, &next_listener_check, &stop);
		if (cp_ms < 0)
			return cp_ms;
		if (stop)
			return 0;
		reap_dead(srv);
		if (n > 0) {
			idle_since = now;
			continue;
		}
		if (now - idle_since < spin_ns) {
			rps__srv_accept_pending(srv);
			continue;
		}
		n = rps__cq_arm(srv->cq);
		if (n < 0)
			return -EIO;
		if (n)
			n = rps__cq_poll(srv->cq, wc, (int)RPS__ARRAY_SIZE(wc));
		for (i = 0; i < n; i++)
			on_completion(srv, &wc[i]);
		if (n > 0) {
			idle_since = rps__now_ns();
			continue;
		}
		n = sleep_until_work(srv, now, cp_ms);
		if (n)
			return n < 0 ? n : 0;
		idle_since = rps__now_ns();
	}
}

void rps__server_stop(struct rps__server *srv)
{
	uint64_t one = 1;
	ssize_t r;

	/* atomic, not only volatile: a signal handler (rdmapsd) or another
	 * thread (tests, psperf's in-process servers) may call this */
	__atomic_store_n(&srv->stopping, 1, __ATOMIC_RELAXED);
	r = write(srv->stop_fd, &one, sizeof(one));

	(void)r;
}

uint16_t rps__server_port(const struct rps__server *srv)
{
	return rps__listener_port(srv->listener);
}

int rps__server_windows(const struct rps__server *srv)
{
	return rps__fabric_windows(srv->fab);
}

const char *rps__server_fabric_name(const struct rps__server *srv)
{
	return rps__fabric_name(srv->fab);
}

int rps__server_config_check(const struct rps__server_config *cfg)
{
	if (cfg->shard_bytes < 64 || cfg->shard_bytes % 4 || cfg->shard_bytes > (1u << 30))
		return rps__seterr(-EINVAL, "--shard-size %u: must be a multiple of 4 between 64 B and 1 GiB",
				   cfg->shard_bytes);
	if (cfg->nslots < 1 || cfg->nslots > 64)
		return rps__seterr(-EINVAL, "--slots %u: must be between 1 and 64 (workers use at most 64)", cfg->nslots);
	if (cfg->max_conns < 1 || cfg->max_conns > RPS__SERVER_CONNS_MAX)
		return rps__seterr(-EINVAL, "--max-connections %u: must be between 1 and %u", cfg->max_conns,
				   RPS__SERVER_CONNS_MAX);
	if (cfg->spin_us < 0 || (uint32_t)cfg->spin_us > RPS__SERVER_SPIN_US_MAX)
		return rps__seterr(-EINVAL, "--spin-us %d: must be between 0 and %u", cfg->spin_us,
				   RPS__SERVER_SPIN_US_MAX);
	if (cfg->mem_limit && cfg->mem_limit < rps__server_min_memory(cfg))
		return rps__seterr(-EINVAL, "--memory-limit %zu: below the %zu bytes one worker connection and one shard need",
				   cfg->mem_limit, rps__server_min_memory(cfg));
	return 0;
}

int rps__server_create(const struct rps__server_config *cfg, struct rps__server **out)
{
	struct rps__fabric_attr fattr = { 0 };
	struct rps__server *srv;
	int ret;

	ret = rps__server_config_check(cfg);
	if (ret)
		return ret;
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return rps__seterr(-ENOMEM, "out of memory");
	srv->cfg = *cfg;
	srv->stop_fd = -1;
	srv->thr.mbox.fd = -1;
	srv->thr.nthreads = 1;
	srv->thr.first = srv;
	if (getrandom(&srv->incarnation, sizeof(srv->incarnation), 0) != (ssize_t)sizeof(srv->incarnation))
		srv->incarnation = rps__now_ns() ^ ((uint64_t)getpid() << 32);
	srv->incarnation |= 1;	/* (never 0: what a server without it says) */
	srv->shard_elems = cfg->shard_bytes / 4;
	srv->slot_size = RPS__ALIGN_UP(RPS__PUSH_DESC_SIZE + (size_t)cfg->shard_bytes, 64);
	srv->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv->stop_fd < 0) {
		ret = rps__seterr(-errno, "eventfd: %s", strerror(errno));
		goto err_free;
	}
	fattr.kind = cfg->listen.kind;
	fattr.host = cfg->listen.host;
	ret = rps__fabric_open(&fattr, &srv->fab);
	if (ret)
		goto err_free;
	ret = place_server(cfg, srv->fab, &srv->topo, &srv->place);
	if (ret)
		goto err_fabric;
	rps__log(srv->place.warn ? RPS__LOG_WARN : RPS__LOG_INFO, "placement: %s", srv->place.reason);
	/* grown as connections come (rps__srv_cq_charge) */
	ret = rps__cq_create(srv->fab, CQ_SPARE, &srv->cq);
	if (ret)
		goto err_fabric;
	ret = rps__listen(srv->fab, cfg->listen.host, cfg->listen.port, &srv->listener);
	if (ret)
		goto err_cq;
	*out = srv;
	return 0;
err_cq:
	rps__cq_destroy(srv->cq);
err_fabric:
	rps__topo_close(srv->topo);
	rps__fabric_close(srv->fab);
err_free:
	if (srv->stop_fd >= 0)
		close(srv->stop_fd);
	free(srv->conns);
	free(srv);
	return ret;
}

void rps__server_destroy(struct rps__server *srv)
{
	uint32_t i;

	if (!srv)
		return;
	rps__srv_dials_fini(srv);	/* their connections are in no table */
	while (srv->nconns)
		rps__srv_conn_destroy(srv, srv->conns[srv->nconns - 1]);
	if (srv->hooks.fini)
		srv->hooks.fini(srv->hooks.ctx);
	memset(&srv->hooks, 0, sizeof(srv->hooks));
	rps__listener_close(srv->listener);
	for (i = 0; i < srv->ntensors; i++)
		rps__srv_tensor_free(srv, srv->tensors[i]);
	free(srv->tensors);
	rps__srv_retired_reap(srv, 0, true);
	rps__srv_repl_fini(srv);
	free(srv->push.held);
	while (srv->push.nparked)
		rps__srv_parked_release(srv, &srv->push.parked[--srv->push.nparked]);
	free(srv->push.parked);
	rps__srv_park_pool_trim(srv, SIZE_MAX);
	free(srv->push.park_pool);
	free(srv->req.waiters);
	free(srv->req.arrivals);
	free(srv->req.departures);
	rps__cq_destroy(srv->cq);
	rps__fabric_close(srv->fab);
	rps__topo_close(srv->topo);	/* after every rps__topo_free */
	close(srv->stop_fd);
	free(srv->conns);
	free(srv);
}

int rps__server_show_topology(const struct rps__server_config *cfg, FILE *f)
{
	struct rps__fabric_attr fattr = { 0 };
	struct rps__fabric *fab;
	struct rps__topo *topo;
	struct rps__placement place;
	int ret;

	fattr.kind = cfg->listen.kind;
	fattr.host = cfg->listen.host;
	ret = rps__fabric_open(&fattr, &fab);
	if (ret)
		return ret;
	ret = place_server(cfg, fab, &topo, &place);
	if (!ret) {
		fprintf(f, "transport: %s\n", rps__fabric_name(fab));
		ret = rps__topo_print(topo, &place, f);
		rps__topo_close(topo);
	}
	rps__fabric_close(fab);
	return ret;
}
