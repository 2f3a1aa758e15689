/*
 * client.c - librdmaps, the worker side of rdmaps (the API of rdmaps.h).
 *
 * A client holds one connection per server, one completion queue and one
 * progress thread.  Every tensor operation is cut into per-shard operations
 * (struct shard_op) that move through small state machines:
 *
 *   push, sync:        get slot -> WRITE_IMM(desc+data) -> PUSH_ACK
 *   push, async/bnd:   get slot -> CAS acquire lock -> WRITE_IMM -> PUSH_ACK
 *                      (the request completes here) -> CAS release -> slot free
 *   pull:              get bounce buffer -> READ(header+params), READ(seq)
 *                      -> validate seqlock; if the version is not yet the one
 *                      this worker must see -> WAIT message -> READ again
 *
 * Resources (staging slots at the server, bounce buffers, control credits)
 * are bounded per connection; a shard op that finds none waits in the
 * connection's FIFO queue.  A resource goes back to the pool only when the
 * transport has returned it (its completion arrived, or the endpoint was
 * closed), so a request that timed out can never let a late completion
 * scribble over memory that is in use again.
 *
 * One mutex guards the client; user threads post work and sleep on a
 * condition variable, the progress thread polls completions and finishes
 * requests.
 *
 * This file is the API; client_int.h says where the rest lives.
 */
#include "config.h"
#include "common/common.h"
#include "common/parse.h"
#include "common/fault.h"
#include "kernels/agg.h"
#include "client/client.h"
#include "client/client_int.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rdmaps.h"

/* A counted test hook ("kill-mid-push:9"): the count, 0 if not asked. */
static int fault_count(const char *prefix)
{
	long n;

	return rps__fault_arg(prefix, &n) && n <= INT_MAX ? (int)n : 0;
}

/* ---- the API ------------------------------------------------------------- */

/* The caller's struct may be older (smaller) or newer (larger) than ours:
 * build the defaults in a struct of our own, then copy no more than the
 * caller has, zeroing the caller's members we do not know. */
/* Address space for every connection a client may hold (MAX_CONNS: a
 * thousand, ~2.5 KiB each), zero until touched: a client of 3 servers
 * uses a page or two, and a connection never moves (ops, jobs and
 * completions point at it).  NULL if out of address space. */
static struct conn *conns_reserve(void)
{
	void *p = mmap(NULL, MAX_CONNS * sizeof(struct conn), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void conns_release(struct conn *conns)
{
	if (conns)
		munmap(conns, MAX_CONNS * sizeof(struct conn));
}

static void opts_copy_out(void *dst, size_t size, const void *ours, size_t our_size)
{
	memcpy(dst, ours, RPS__MIN(size, our_size));
	if (size > our_size)
		memset((char *)dst + our_size, 0, size - our_size);
}

RPS_EXPORT void rps_client_opts_init_sized(struct rps_client_opts *opts, size_t size)
{
	struct rps_client_opts d;

	if (!opts || size < sizeof(d.size))
		return;
	memset(&d, 0, sizeof(d));
	d.size = RPS__MIN(size, sizeof(d));
	d.num_workers = 1;
	d.timeout_ms = 30000;
	opts_copy_out(opts, size, &d, sizeof(d));
}

void rps__tensor_opts_defaults(struct rps_tensor_opts *d)
{
	memset(d, 0, sizeof(*d));
	d->size = sizeof(*d);
	d->dtype = RPS_DTYPE_F32;
	d->mode = RPS_MODE_SYNC;
	d->optimizer = RPS_OPT_SUM;
	d->lr = 0.01f;
	d->momentum = 0.9f;
	d->beta1 = 0.9f;
	d->beta2 = 0.999f;
	d->eps = 1e-8f;
	d->rescale = 1.0f;
}

RPS_EXPORT void rps_tensor_opts_init_sized(struct rps_tensor_opts *opts, size_t size)
{
	struct rps_tensor_opts d;

	if (!opts || size < sizeof(d.size))
		return;
	rps__tensor_opts_defaults(&d);
	d.size = RPS__MIN(size, sizeof(d));
	opts_copy_out(opts, size, &d, sizeof(d));
}

RPS_EXPORT int rps_version(const char **string)
{
	if (string)
		*string = RPS_VERSION_STRING;
	return RPS_VERSION_NUMBER;
}

RPS_EXPORT int rps_client_close(rps_client_t *cl)
{
	int i;

	if (!cl)
		return 0;
	if (cl->thread_started) {
		pthread_mutex_lock(&cl->lock);
		cl->stopping = true;
		pthread_cond_broadcast(&cl->cond);
		pthread_cond_broadcast(&cl->pcond);
		pthread_mutex_unlock(&cl->lock);
		wake_progress(cl);
		pthread_join(cl->thread, NULL);
	}
	for (i = 0; cl->conns && i < cl->nservers; i++) {
		if (cl->conns[i].ep) {
			cl->conns[i].err = -ECANCELED;
			rps__conn_kill(cl, &cl->conns[i]);
		}
		rps__conn_free(&cl->conns[i]);
	}
	conns_release(cl->conns);
	rps__buffers_free(cl);
	rps__mr_dereg(cl->implicit_mr);
	rps__free_reg(cl, &cl->mapbuf, &cl->mapbuf_mr, RPS__MAP_BUF);
	rps__free_reg(cl, &cl->probebuf, &cl->probebuf_mr, PROBE_LEN);
	rps__cq_destroy(cl->cq);
	rps__fabric_close(cl->fab);
	rps__topo_close(cl->topo);	/* after every rps__topo_free */
	if (cl->wake_fd >= 0)
		close(cl->wake_fd);
	pthread_cond_destroy(&cl->cond);
	pthread_cond_destroy(&cl->pcond);
	pthread_mutex_destroy(&cl->lock);
	rps__keyring_close(cl->keys);
	free(cl);
	return 0;
}

/* RDMAPS_LOG_LEVEL=error|warn|info|debug: what the library prints on
 * stderr (warn by default), read once per process.  A word it does not
 * know is said once and ignored. */
static void log_level_from_env(void)
{
	const char *e = getenv("RDMAPS_LOG_LEVEL");
	int level;

	if (!e || !*e)
		return;
	if ((level = rps__log_level_parse(e)) >= 0)
		rps__log_level = level;
	else
		rps__log(RPS__LOG_WARN, "RDMAPS_LOG_LEVEL=%s: say error, warn, info or debug: ignored", e);
}

/* RDMAPS_STAGING: the staging budget when opts.staging_bytes is 0, a size
 * as every size option takes it (rps__parse_size: 256M, 1.5G, 65536);
 * unset: the default. */
static int staging_from_env(uint64_t *bytes)
{
	const char *e = getenv("RDMAPS_STAGING");

	*bytes = STAGING_DEFAULT;
	if (!e || !*e)
		return 0;
	if (rps__parse_size("RDMAPS_STAGING", e, 1, UINT64_MAX >> 1, bytes))
		return rps__seterr(-EINVAL, "RDMAPS_STAGING=%s: say a size in bytes, or with K, M, G or T (e.g. 256M)",
				   e);
	return 0;
}

RPS_EXPORT int rps_client_connect(const struct rps_client_opts *opts, rps_client_t **out)
{
	static pthread_once_t log_once = PTHREAD_ONCE_INIT;
	struct rps__fabric_attr fattr = { 0 };
	struct rps__uri *uris = NULL;
	struct rps_client *cl;
	uint64_t connect_end;
	int i, pass, nseeds = 0, ret;

	rps__clearerr();
	pthread_once(&log_once, log_level_from_env);
	if (!opts || !out || opts->size < offsetof(struct rps_client_opts, timeout_ms) + sizeof(int))
		return rps__seterr(-EINVAL, "rps_client_connect: options not initialised with rps_client_opts_init()");
	if (opts->num_workers < 1 || opts->rank < 0 || opts->rank >= opts->num_workers)
		return rps__seterr(-EINVAL, "rps_client_connect: rank %d is not in 0..num_workers-1 (%d workers)",
				   opts->rank, opts->num_workers);
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return rps__seterr(-ENOMEM, "out of memory");
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->cond, NULL);
	pthread_cond_init(&cl->pcond, NULL);
	cl->wake_fd = -1;
	cl->rank = opts->rank;
	cl->num_workers = opts->num_workers;
	cl->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : 30000;
	cl->dial_ms = cl->timeout_ms;
	cl->fault_kill_mid_push = fault_count("kill-mid-push:");
	cl->fault_efault_all = fault_count("efault-all:");
	cl->fault_reset_all = fault_count("reset-all:");
	cl->fault_stop_after_lock = fault_count("stop-after-lock:");
	cl->fault_corrupt_push = fault_count("corrupt-push:");
	if (opts->size >= offsetof(struct rps_client_opts, verify) + sizeof(opts->verify))
		cl->verify = opts->verify != 0;
	if (opts->size >= offsetof(struct rps_client_opts, spin_us) + sizeof(opts->spin_us) && opts->spin_us > 0)
		cl->spin_ns = (uint64_t)opts->spin_us * 1000ull;
	if (opts->size >= offsetof(struct rps_client_opts, takeover) + sizeof(opts->takeover))
		cl->takeover = opts->takeover != 0;
	if (opts->size >= offsetof(struct rps_client_opts, staging_bytes) + sizeof(opts->staging_bytes))
		cl->staging_bytes = opts->staging_bytes;
	if (!cl->staging_bytes && (ret = staging_from_env(&cl->staging_bytes)))
		goto err;
	{
		const char *given = NULL, *path, *e = getenv("RDMAPS_INSECURE");
		if (opts->size >= offsetof(struct rps_client_opts, key_file) + sizeof(opts->key_file))
			given = opts->key_file;
		if (opts->size >= offsetof(struct rps_client_opts, insecure) + sizeof(opts->insecure))
			cl->insecure = opts->insecure != 0;
		cl->insecure = cl->insecure || (e && !strcmp(e, "1"));
		path = rps__key_path(given);
		if (!path && !cl->insecure) {	/* this user's loopback key, for loopback servers */
			char local[PATH_MAX];

			ret = rps__local_key_find(local, sizeof(local));
			if (!ret && (ret = rps__keyring_open(local, false, &cl->keys)) == 0)
				cl->keys_local = true;
			if (ret && ret != -ENOENT)
				goto err;
		} else if (path && (ret = rps__keyring_open(path, false, &cl->keys))) {
			goto err;
		}
	}
	ret = rps__uri_list_parse(opts->servers, &uris, &nseeds);
	if (ret)
		goto err;
	cl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	cl->conns = conns_reserve();
	if (cl->wake_fd < 0 || !cl->conns) {
		ret = rps__seterr(-ENOMEM, "out of memory or file descriptors");
		goto err;
	}
	{	/* names this client's pushes on every server (idempotent retries) */
		uint64_t r = rps__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)cl;
		r ^= r >> 33;
		r *= 0xff51afd7ed558ccdull;
		r ^= r >> 33;
		cl->client_id = r ? r : 1;
	}
	fattr.kind = uris[0].kind;
	fattr.host = uris[0].host;
	ret = rps__fabric_open(&fattr, &cl->fab);
	if (ret)
		goto err;
	cl->place.numa_node = -1;
	if (fattr.kind == RPS__KIND_VERBS) {
		struct rps__topo_opts to = { .log = 0 };

		/* placement is an optimisation: without hwloc, plain memory */
		if (rps__topo_open(&to, &cl->topo) == 0 &&
		    rps__topo_place(cl->topo, rps__fabric_name(cl->fab), NULL, &cl->place)) {
			rps__topo_close(cl->topo);
			cl->topo = NULL;
			cl->place.numa_node = -1;
		}
		rps__clearerr();
	}
	/* tcp sends from any memory: every push goes without the copy */
	if (rps__mr_reg_implicit(cl->fab, &cl->implicit_mr)) {
		cl->implicit_mr = NULL;
		rps__clearerr();
	}
	ret = rps__cq_create(cl->fab, CQ_INITIAL_CONNS * CONN_CQ_SHARE, &cl->cq);
	if (ret)
		goto err;
	ret = rps__alloc_reg(cl, RPS__MAP_BUF, RPS__ACCESS_LOCAL, &cl->mapbuf, &cl->mapbuf_mr);
	if (ret)
		goto err;
	ret = rps__alloc_reg(cl, PROBE_LEN, RPS__ACCESS_LOCAL, &cl->probebuf, &cl->probebuf_mr);
	if (ret)
		goto err;
	/* Any server of the list will do: it gives us the map, and the map
	 * gives us every member.  The whole connect keeps to timeout_ms: a
	 * seed that answers nothing (stopped, or its host gone: a failover
	 * under way) costs at most PROBE_DEAD_MS in a first pass over the
	 * list, the next may answer; a second pass gives each what is left. */
	connect_end = rps__now_ns() + (uint64_t)cl->timeout_ms * 1000000ull;
	ret = rps__seterr(-ETIMEDOUT, "no server of the list answered within %d ms", cl->timeout_ms);
	for (i = 0, pass = 0; pass < 2; i = (i + 1) % nseeds, pass += i == 0) {
		uint64_t now = rps__now_ns(), end;
		uint32_t busy = 0;

		if (now >= connect_end)
			break;
		cl->dial_ms = (int)RPS__MAX(1u, (connect_end - now) / 1000000ull);
		if (pass == 0 && nseeds > 1)
			cl->dial_ms = RPS__MIN(cl->dial_ms, PROBE_DEAD_MS);
		end = now + (uint64_t)cl->dial_ms * 1000000ull;

		for (;;) {
			ret = rps__conn_setup(cl, &cl->conns[0], &uris[i], 0);
			if (!ret) {
				cl->conns[0].member_id = cl->conns[0].hello.member_id;
				cl->shard_elems = cl->conns[0].hello.shard_elems;
				cl->nservers = 1;
				ret = rps__map_read_sync(cl, &cl->conns[0]);
				if (!ret)
					break;
			}
			rps__conn_free(&cl->conns[0]);
			memset(&cl->conns[0], 0, sizeof(cl->conns[0]));
			cl->nservers = 0;
			/* busy with a burst of handshakes (a job's ranks all
			 * starting): the same server again in a moment */
			if (ret != -EBUSY || !rps__busy_sleep(&busy, (uint32_t)i, end))
				break;
		}
		if (!ret)
			break;
	}
	if (ret)
		goto err;
	/* the seed's staging was sized before the map named its peers */
	ret = rps__conn_restage(cl, &cl->conns[0]);
	if (ret)
		goto err;
	/* the members in what is left (a member that answers nothing is
	 * then lost, and what needs it rides through its failover) */
	{
		uint64_t now = rps__now_ns();
		cl->dial_ms = (int)RPS__MAX(1000u, now < connect_end ? (connect_end - now) / 1000000ull : 0);
	}
	ret = rps__connect_members(cl);
	cl->dial_ms = cl->timeout_ms;	/* (later dials: a refresh's) */
	if (ret)
		goto err;
	ret = pthread_create(&cl->thread, NULL, rps__progress_main, cl);
	if (ret) {
		ret = rps__seterr(-ret, "pthread_create: %s", strerror(ret));
		goto err;
	}
	cl->thread_started = true;
	free(uris);
	*out = cl;
	return 0;
err:
	{
		char msg[512];
		snprintf(msg, sizeof(msg), "%s", rps__errbuf());
		free(uris);
		rps_client_close(cl);
		rps__seterr(ret, "%s", msg);
	}
	return ret;
}

static bool retryable(int status)
{
	return rps__retryable(status);	/* (client_int.h) */
}

/* An op of a request that failed retryably and was not sent again yet. */
static bool to_retry(const struct shard_op *op)
{
	return !op->retried && retryable(op->result);
}

/* After a refresh: resend an op whose connection was lost only if its
 * shard's partition has a new owner (a server that left the cluster after
 * its partitions moved), or, the partition having backups (the op rode
 * through) or having been given to its owner since the op went (another
 * epoch: a restarted server given its share back), its owner answers a
 * new connection (dialed again by the refresh: it was alive, only slow or
 * cut off a while, or it came back; the push id makes a resent push that
 * it applied before harmless), or, without backups, its owner answers as
 * the same process (struct shard_op.incarnation); a server that died
 * owning it is an error. */
static bool worth_resending(const struct rps_client *cl, const struct shard_op *op)
{
	const struct rps__smap_part *pp;
	uint32_t p;

	if (op->result != -ECONNRESET)
		return retryable(op->result);
	p = rps__shard_server(&op->t->layout, op->shard);
	if (p >= cl->map.npart)
		return false;
	pp = &cl->map.parts[p];
	/* (a partition lost with its server: resent, it is refused saying so;
	 * the same server process answering again, its incarnation, lived
	 * all along: its connection went, not its state) */
	return pp->owner != op->c->member_id || pp->lost ||
	       ((pp->backups[0] || pp->epoch != op->epoch ||
		 (op->incarnation && op->c->hello.incarnation == op->incarnation)) &&
		op->c->ep && !op->c->dead);
}

/*
 * Ride-through (doc/design.md "Failover and leases"): an op whose connection was lost, on a partition
 * that has backups in our map and whose owner there is still the server we
 * lost, is not an answer yet: that server may have died, and the control
 * plane then fails the partition over to a backup within a few failover
 * periods.  retry_stale waits for the map to move on, at most FAILOVER_WAIT_MS
 * (and never past the op's timeout_ms), then resends with the same push id
 * and clock; the new primary dedups a push the old one applied.  If the
 * map has not moved on by then, a refresh dials the owner again
 * (rps__connect_members): one that answers was alive (a liveness probe's
 * verdict on a stalled server, or a connection cut while it was not) and
 * gets the ops again; one that does not (its loss time moves past the
 * start of the wait) is the answer: the error.
 */
/* (FAILOVER_WAIT_MS: client_int.h) */

static bool rides_through(const struct rps_client *cl, const struct shard_op *op)
{
	uint32_t p = rps__shard_server(&op->t->layout, op->shard);

	/* (or given to its owner since the op went: it lives, the refresh
	 * dials it again, redial_wanted) */
	return op->result == -ECONNRESET && p < cl->map.npart && !cl->map.parts[p].lost &&
	       cl->map.parts[p].owner == op->c->member_id &&
	       (cl->map.parts[p].backups[0] || cl->map.parts[p].epoch != op->epoch);
}

/* Has the owner of a riding op been dialed again since `since`, in vain? */
static bool redial_failed(const struct shard_op *op, uint64_t since)
{
	return op->c->dead && !op->c->ep && op->c->lost_ns > since;
}

/* How many of r's ops are worth a retry; *t: their tensor. */
static uint32_t count_retryable(const struct rps_request *r, struct rps_tensor **t)
{
	uint32_t i, n = 0;

	for (i = 0; i < r->nops; i++)
		if (to_retry(&r->ops[i])) {
			n++;
			*t = r->ops[i].t;
		}
	return n;
}

/* Learn the map and where t lives now.  Lock held, let go meanwhile. */
static void refresh_routes(struct rps_client *cl, struct rps_tensor *t)
{
	t->live_ops++;	/* keep the tensor while we let go of the lock */
	pthread_mutex_unlock(&cl->lock);
	rps__map_refresh(cl);
	rps__tensor_refresh(cl, t);
	pthread_mutex_lock(&cl->lock);
	t->live_ops--;
}

/* nr's ops: cur's retryable ones again, routed anew, with their push ids,
 * clocks and targets unchanged (and cur's marked retried). */
static void copy_retryable(struct rps_request *cur, struct rps_request *nr)
{
	uint32_t i, k = 0;

	for (i = 0; i < cur->nops; i++) {
		struct shard_op *old = &cur->ops[i];
		struct shard_op *op;
		if (!to_retry(old))
			continue;
		assert(k < nr->nops);	/* counted under the same lock (retry_chain) */
		old->retried = true;
		op = rps__op_init(&nr->ops[k++], nr, old->t, old->kind, old->shard);
		op->clock = old->clock;
		op->push_id = old->push_id;
		op->src = old->src;
		op->dst = old->dst;
		op->min_version = old->min_version;
		op->min_clock = old->min_clock;
		op->held = old->held;
	}
}

/* Submit every op of r, lock held. */
static void submit_locked(struct rps_client *cl, struct rps_request *r)
{
	uint32_t i;

	rps__req_arm_deadline(cl, r);
	r->remaining++;	/* hold completion until every op is submitted */
	for (i = 0; i < r->nops; i++)
		rps__op_submit(&r->ops[i]);
	if (--r->remaining == 0)
		rps__req_finish(r);
}

/* nr ended -EALREADY: a resent sync push (or initial value) that the server
 * already has was applied before the connection went.  Its status without those. */
static int forgive_applied(struct rps_request *nr)
{
	int status = 0;
	uint32_t i;

	for (i = 0; i < nr->nops; i++) {
		int res = nr->ops[i].result;
		if (res == -EALREADY && (nr->ops[i].kind == OP_PUSH || nr->ops[i].kind == OP_INIT))
			nr->ops[i].result = res = 0;
		if (rps__status_overrides(status, res))
			status = res;
	}
	nr->status = status;
	return status;
}

/* cur ended with its ops riding through: if a member we never reached
 * (it refused or did not answer when we connected) was why, the answer is
 * that, not "connection lost". */
static int explain_unreached(struct rps_request *cur, int status)
{
	uint32_t i;

	if (status != -ECONNRESET)
		return status;
	for (i = 0; i < cur->nops; i++) {
		const struct shard_op *op = &cur->ops[i];
		if (op->result != -ECONNRESET || !op->c || !op->c->dial_err)
			continue;
		cur->status = op->c->dial_err;
		snprintf(cur->msg, sizeof(cur->msg), "%s: %s, and its partitions were not failed over to their "
			 "backups meanwhile", op->c->name, rps__status_text(cur->status));
		return cur->status;
	}
	return status;
}

/* A retry request never submitted, let go. */
static void drop_unsent(struct rps_request *nr)
{
	nr->waited = true;
	nr->done = true;
	rps__req_maybe_free(nr);
}

/* The last retry cur decided r: its status, message or version.  (cur,
 * if TAKEN pushes of it are still out, is among the pending.) */
static void adopt_outcome(struct rps_request *r, struct rps_request *cur, int status)
{
	r->status = status;
	if (status)
		snprintf(r->msg, sizeof(r->msg), "%s", cur->msg);
	else if (r->version_out && r->kind == REQ_SHARDS && cur->min_version_seen != UINT64_MAX)
		*r->version_out = cur->min_version_seen;
	if (cur->done) {
		cur->waited = true;
		rps__req_maybe_free(cur);
	}
}

/*
 * Requests a retry left behind with sync pushes TAKEN into their steps and
 * still out (rps__req_settled): they are waited for once the resends are
 * out, and what of them fails then is retried in turn.
 */
struct retry_pending {
	struct rps_request **v;
	uint32_t n, cap;
};

static int pending_add(struct retry_pending *pd, struct rps_request *r)
{
	if (rps__grow(&pd->v, &pd->cap, pd->n + 1, sizeof(*pd->v), 4))
		return rps__seterr(-ENOMEM, "out of memory");
	pd->v[pd->n++] = r;
	return 0;
}

/* A pending request p, done: the outcome of its ops not sent again (those
 * resent have theirs in the retry); a push the server had already applied
 * is no failure (forgive_applied).  Its message says which. */
static int pending_status(struct rps_request *p)
{
	uint32_t i;

	if (p->status == -ETIMEDOUT)
		return p->status;
	for (i = 0; i < p->nops; i++) {
		const struct shard_op *op = &p->ops[i];
		if (op->retried || !op->result ||
		    (op->result == -EALREADY && (op->kind == OP_PUSH || op->kind == OP_INIT)))
			continue;
		snprintf(p->msg, sizeof(p->msg), "%s: %s", op->c ? op->c->name : "rdmaps",
			 rps__status_text(op->result));
		return p->status = op->result;
	}
	return p->status = 0;
}

/* When a retry started, and until when it may go on. */
struct retry_clock {
	uint64_t start, deadline, ride_until;
};

/*
 * head settled (rps__req_settled) with RPS_ESTALE_EPOCH: some shards moved
 * (or are moving).  Read the map again, learn where the tensor lives now,
 * and send the ops that were refused there, with their push ids and clocks
 * unchanged: a refused push was not applied, and a server that did apply a
 * push id acknowledges it again without applying it.  A request left with
 * TAKEN pushes out goes to *pd.  r: the caller's request (the one whose
 * message the user reads).  Lock held.
 */
static int retry_chain(struct rps_client *cl, struct rps_request *r, struct rps_request *head,
		       const struct retry_clock *rc, struct retry_pending *pd)
{
	uint64_t start = rc->start, deadline = rc->deadline, ride_until = rc->ride_until;
	struct rps_request *cur = head;
	uint32_t pause_us = 500;
	int status = head->status;

	while (retryable(status) && rps__now_ns() < deadline) {
		struct rps_tensor *t = NULL;
		struct rps_request *nr;
		uint32_t i, n, waits, given_up;

		n = count_retryable(cur, &t);
		if (!n || !t)
			break;
		rps__log(RPS__LOG_DEBUG, "'%s': %u shard ops to send again (%s), %.1f s into the retry", t->name, n,
			 rps_strerror(status), (double)(rps__now_ns() - start) / 1e9);
		nr = rps__req_new(cl, n);
		if (!nr) {
			status = rps__seterr(-ENOMEM, "out of memory");
			break;
		}
		nr->kind = REQ_SHARDS;
		nr->min_version_seen = cur->min_version_seen;
		refresh_routes(cl, t);
		if (count_retryable(cur, &t) != nr->nops) {
			/* a TAKEN push of cur (settled, not done) failed
			 * during the refresh: nr was sized before it */
			drop_unsent(nr);
			continue;
		}
		if (cl->taken_over) {
			/* a server refused us: a newer process has our rank */
			status = -ESTALE;
			snprintf(cur->msg, sizeof(cur->msg), "rank %d: %s", cl->rank, rps__status_text(status));
			snprintf(r->msg, sizeof(r->msg), "%s", cur->msg);
			drop_unsent(nr);
			break;
		}
		if (rps__noq_final(cl)) {
			/* the server we read the map from lost the Raft
			 * majority: nothing moves on until an operator acts */
			status = -EHOSTDOWN;
			snprintf(cur->msg, sizeof(cur->msg), "%s", cl->noq_text);
			snprintf(r->msg, sizeof(r->msg), "%s", cl->noq_text);
			drop_unsent(nr);
			break;
		}
		for (i = 0, n = 0, waits = 0, given_up = 0; i < cur->nops; i++) {
			const struct shard_op *op = &cur->ops[i];
			bool riding;
			if (op->retried)
				continue;
			riding = !worth_resending(cl, op) && rides_through(cl, op);
			n += worth_resending(cl, op);
			waits += riding;
			given_up += riding && redial_failed(op, start);
		}
		if (n < nr->nops) {
			/* a server died owning some of them: that is the answer,
			 * unless their partitions can fail over (wait for it),
			 * or, that time over, their owner was not dialed again
			 * yet (the next refresh does) */
			bool wait = n + waits == nr->nops && (rps__now_ns() < ride_until || !given_up);
			drop_unsent(nr);
			if (!wait)
				break;
			pthread_mutex_unlock(&cl->lock);
			usleep(pause_us);
			pause_us = RPS__MIN(pause_us * 2, 50000u);
			pthread_mutex_lock(&cl->lock);
			continue;
		}
		pthread_mutex_unlock(&cl->lock);
		usleep(pause_us);
		pause_us = RPS__MIN(pause_us * 2, 50000u);
		pthread_mutex_lock(&cl->lock);
		if (count_retryable(cur, &t) != nr->nops) {
			/* the same, during the pause; round again with all of
			 * them (it_seed: a primary killed under TAKEN pushes
			 * overran nr) */
			drop_unsent(nr);
			continue;
		}
		copy_retryable(cur, nr);
		if (cur != head && !cur->done && pending_add(pd, cur))
			rps__req_wait_locked(cl, cur);	/* (no memory: its TAKEN pushes waited for here) */
		if (cur != head && cur->done) {
			cur->waited = true;
			rps__req_maybe_free(cur);
		}
		cur = nr;
		submit_locked(cl, nr);
		status = rps__req_wait_settled_locked(cl, nr);
		if (status == -EALREADY)
			status = forgive_applied(nr);
	}
	status = explain_unreached(cur, status);
	if (retryable(status) && rps__now_ns() >= deadline) {
		/* the time ran out while the failure could still mend (a
		 * failover or a move not over, a server too starved to
		 * answer): the status stays what the last try met (a stale
		 * epoch: refused every time, nothing applied), and the line
		 * says it lasted the whole timeout_ms */
		char last[sizeof(cur->msg)];

		snprintf(last, sizeof(last), "%s", cur->msg);
		snprintf(cur->msg, sizeof(cur->msg), "%.300s, still after %d ms of retries: raise timeout_ms, or see "
			 "what keeps the shard from settling (psctl status)", last, cl->timeout_ms);
	}
	if (cur != head) {
		if (!cur->done && pending_add(pd, cur))
			rps__req_wait_locked(cl, cur);
		adopt_outcome(head, cur, status);
	}
	return status;
}

/*
 * r is settled with a retryable status: retry what failed (retry_chain),
 * then wait for every request the retries left with TAKEN pushes out, and
 * retry what of those fails in turn.  The first failure is r's outcome.
 * Lock held; r is done on return.
 */
static int retry_stale(struct rps_client *cl, struct rps_request *r)
{
	struct retry_clock rc;
	struct retry_pending pd = { 0 };
	uint32_t i;
	int status, s;

	rc.start = rps__now_ns();
	rc.deadline = rc.start + (uint64_t)cl->timeout_ms * 1000000ull;
	rc.ride_until = rc.start + FAILOVER_WAIT_MS * 1000000ull;
	if (!r->done && pending_add(&pd, r))
		rps__req_wait_locked(cl, r);	/* (no memory: the old way, after the steps) */
	status = retry_chain(cl, r, r, &rc, &pd);
	for (i = 0; i < pd.n; i++) {
		struct rps_request *p = pd.v[i];
		char said[sizeof(r->msg)];
		memcpy(said, r->msg, sizeof(said));	/* (r's, if a retry failed already) */
		rps__req_wait_locked(cl, p);
		s = pending_status(p);
		if (retryable(s) && rps__now_ns() < rc.deadline)
			s = retry_chain(cl, r, p, &rc, &pd);
		if (s && !status) {
			status = s;
			if (p != r)
				snprintf(r->msg, sizeof(r->msg), "%s", p->msg);
		} else if (p == r) {
			memcpy(r->msg, said, sizeof(said));
		}
		if (p != r) {
			p->waited = true;
			rps__req_maybe_free(p);
		}
	}
	free(pd.v);
	r->status = status;
	return status;
}

/* Submit every op of r; wait unless async_out is given. */
int rps__submit_and_wait(struct rps_client *cl, struct rps_request *r, rps_request_t **async_out)
{
	int status;

	pthread_mutex_lock(&cl->lock);
	submit_locked(cl, r);
	if (async_out) {
		*async_out = r;
		if (!cl->waiters)
			pthread_cond_signal(&cl->pcond);
		pthread_mutex_unlock(&cl->lock);
		return 0;
	}
	status = rps__req_wait_settled_locked(cl, r);
	if (retryable(status))
		status = retry_stale(cl, r);
	rps__req_collect(r);
	pthread_mutex_unlock(&cl->lock);
	return status;
}

static int push_start(rps_tensor_t *t, const void *grad, size_t nbytes, rps_request_t **async_out)
{
	struct rps_client *cl;
	struct rps_request *r;
	size_t esize;
	uint64_t clock;
	uint32_t s;

	rps__clearerr();
	if (!t || !grad)
		return rps__seterr(-EINVAL, "rps_push: NULL argument");
	cl = t->cl;
	esize = rps__dtype_size((enum rps_dtype)t->spec.dtype);
	if (nbytes != t->spec.count * esize)
		return rps__seterr(-EMSGSIZE, "rps_push '%s': %zu bytes given, the tensor takes %llu %s elements = %llu bytes",
				   t->name, nbytes, (unsigned long long)t->spec.count,
				   rps__dtype_name((enum rps_dtype)t->spec.dtype),
				   (unsigned long long)(t->spec.count * esize));
	/* a reader's connections have no window on the staging slots (and
	 * read-only ones on the tensors): say so here, not as a broken QP */
	if (cl->keys) {
		struct rps__key k;

		rps__keyring_get(cl->keys, &k, NULL);
		if (k.role == RPS__KEY_READER) {
			rps__key_clear(&k);
			return rps__seterr(-EPERM, "rps_push '%s': this client's key is a reader key, which pulls "
					   "only: push with a worker key (psctl keygen --role worker)", t->name);
		}
		rps__key_clear(&k);
	}
	r = rps__req_new(cl, t->layout.nshards);
	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_SHARDS;
	pthread_mutex_lock(&cl->lock);
	clock = t->clock++;
	for (s = 0; s < t->layout.nshards; s++) {
		struct shard_op *op = rps__op_init(&r->ops[s], r, t, OP_PUSH, s);
		op->clock = clock;
		op->push_id = ++cl->next_push_id;
		op->src = (const char *)grad + rps__shard_first(&t->layout, s) * esize;
	}
	pthread_mutex_unlock(&cl->lock);
	return rps__submit_and_wait(cl, r, async_out);
}

static int pull_start(rps_tensor_t *t, float *out, size_t nbytes, uint64_t *version,
		      rps_request_t **async_out)
{
	struct rps_client *cl;
	struct rps_request *r;
	uint64_t min_version = 0, min_clock = 0;
	uint32_t s;

	rps__clearerr();
	if (!t || !out)
		return rps__seterr(-EINVAL, "rps_pull: NULL argument");
	cl = t->cl;
	if (nbytes != t->spec.count * 4u)
		return rps__seterr(-EMSGSIZE, "rps_pull '%s': %zu bytes given, the tensor returns %llu fp32 = %llu bytes",
				   t->name, nbytes, (unsigned long long)t->spec.count,
				   (unsigned long long)(t->spec.count * 4u));
	r = rps__req_new(cl, t->layout.nshards);
	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_SHARDS;
	r->version_out = version;
	pthread_mutex_lock(&cl->lock);
	if (t->spec.mode == RPS_MODE_SYNC)
		min_version = t->clock;
	else if (t->spec.mode == RPS_MODE_BOUNDED)
		min_clock = t->clock > t->spec.staleness ? t->clock - t->spec.staleness : 0;
	for (s = 0; s < t->layout.nshards; s++) {
		struct shard_op *op = rps__op_init(&r->ops[s], r, t, OP_PULL, s);
		op->min_version = min_version;
		op->min_clock = min_clock;
		op->dst = out + rps__shard_first(&t->layout, s);
	}
	pthread_mutex_unlock(&cl->lock);
	return rps__submit_and_wait(cl, r, async_out);
}

RPS_EXPORT int rps_push(rps_tensor_t *t, const void *grad, size_t nbytes)
{
	return push_start(t, grad, nbytes, NULL);
}

RPS_EXPORT int rps_pull(rps_tensor_t *t, float *out, size_t nbytes, uint64_t *version)
{
	return pull_start(t, out, nbytes, version, NULL);
}

RPS_EXPORT int rps_push_start(rps_tensor_t *t, const void *grad, size_t nbytes, rps_request_t **req)
{
	if (!req)
		return rps__seterr(-EINVAL, "rps_push_start: NULL request pointer");
	return push_start(t, grad, nbytes, req);
}

RPS_EXPORT int rps_pull_start(rps_tensor_t *t, float *out, size_t nbytes, uint64_t *version,
			      rps_request_t **req)
{
	if (!req)
		return rps__seterr(-EINVAL, "rps_pull_start: NULL request pointer");
	return pull_start(t, out, nbytes, version, req);
}

RPS_EXPORT int rps_test(rps_request_t *r, int *result)
{
	struct rps_client *cl;
	int done;

	if (!r)
		return rps__seterr(-EINVAL, "rps_test: NULL request");
	cl = r->cl;
	pthread_mutex_lock(&cl->lock);
	done = r->done || (r->kind == REQ_SHARDS && rps__req_settled(r));
	if (done) {
		if (retryable(r->status))
			retry_stale(cl, r);	/* blocks: a move is rare */
		if (result)
			*result = r->status;
		rps__req_collect(r);
	}
	pthread_mutex_unlock(&cl->lock);
	return done;
}

RPS_EXPORT int rps_wait(rps_request_t *r)
{
	struct rps_client *cl;
	int status;

	if (!r)
		return rps__seterr(-EINVAL, "rps_wait: NULL request");
	cl = r->cl;
	pthread_mutex_lock(&cl->lock);
	status = rps__req_wait_settled_locked(cl, r);
	if (retryable(status))
		status = retry_stale(cl, r);
	rps__req_collect(r);
	pthread_mutex_unlock(&cl->lock);
	return status;
}

RPS_EXPORT int rps_barrier(rps_client_t *cl)
{
	struct rps__barrier b = { 0 };
	bool *to;
	int ret;

	rps__clearerr();
	if (!cl)
		return rps__seterr(-EINVAL, "rps_barrier: NULL client");
	to = calloc(MAX_CONNS, sizeof(*to));
	if (!to)
		return rps__seterr(-ENOMEM, "out of memory");
	/* the lowest member id counts arrivals: every worker picks the same */
	{
		int i, best = -1;
		pthread_mutex_lock(&cl->lock);
		for (i = 0; i < cl->nservers; i++)
			if (cl->conns[i].ep && !cl->conns[i].thread &&
			    (best < 0 || cl->conns[i].member_id < cl->conns[best].member_id))
				best = i;
		pthread_mutex_unlock(&cl->lock);
		to[best < 0 ? 0 : best] = true;
	}
	ret = rps__ctrl_call(cl, RPS__MSG_BARRIER, &b, sizeof(b), to, 0, NULL, NULL);
	free(to);
	if (ret == -EINVAL)
		rps__seterr(ret, "rps_barrier: the workers already waiting in this barrier were connected with "
			    "another num_workers than this one's %d: give every worker the same", cl->num_workers);
	return ret;
}

RPS_EXPORT const char *rps_last_error(void)
{
	return rps__errbuf();
}

/* ---- internal hooks for psperf and tests (client.h) ------------------------ */

static int lock_op(rps_tensor_t *t, uint32_t shard, enum op_kind kind)
{
	struct rps_client *cl;
	struct rps_request *r;
	struct shard_op *op;

	if (!t || shard >= t->layout.nshards)
		return rps__seterr(-EINVAL, "shard %u: no such shard", shard);
	if (t->spec.mode == RPS_MODE_SYNC)
		return rps__seterr(-EINVAL, "tensor '%s': sync tensors have no shard lock", t->name);
	if (kind == OP_UNLOCK && !t->lock_held[shard])
		return rps__seterr(-EINVAL, "shard %u: not locked by us", shard);
	cl = t->cl;
	r = rps__req_new(cl, 1);
	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_SHARDS;
	op = rps__op_init(&r->ops[0], r, t, kind, shard);
	op->held = t->lock_held[shard];
	return rps__submit_and_wait(cl, r, NULL);
}

int rps__tensor_lock(rps_tensor_t *t, uint32_t shard)
{
	return lock_op(t, shard, OP_LOCK);
}

int rps__tensor_unlock(rps_tensor_t *t, uint32_t shard)
{
	return lock_op(t, shard, OP_UNLOCK);
}

const char *rps__client_fabric_name(const rps_client_t *cl)
{
	return rps__fabric_name(cl->fab);
}

void rps__client_set_copy(rps_client_t *cl, int copy)
{
	pthread_mutex_lock(&cl->lock);
	cl->copy_always = copy != 0;
	pthread_mutex_unlock(&cl->lock);
}

uint64_t rps__client_zcopy(const rps_client_t *cl, uint64_t *pulls)
{
	if (pulls)
		*pulls = __atomic_load_n(&cl->zc_pulls, __ATOMIC_RELAXED);
	return __atomic_load_n(&cl->zc_pushes, __ATOMIC_RELAXED);
}

uint64_t rps__client_tx_bytes(const rps_client_t *cl)
{
	return rps__fabric_tx_bytes(cl->fab);
}

uint64_t rps__client_pushes_fenced(const rps_client_t *cl)
{
	return __atomic_load_n(&cl->pushes_fenced, __ATOMIC_RELAXED);
}

uint64_t rps__client_staging_bytes(const rps_client_t *cl, uint64_t *budget)
{
	if (budget)
		*budget = cl->staging_bytes;
	return __atomic_load_n(&cl->staging_used, __ATOMIC_RELAXED);
}

uint64_t rps__client_pushes_chained(const rps_client_t *cl, uint64_t *requeued)
{
	if (requeued)
		*requeued = __atomic_load_n(&cl->pushes_requeued, __ATOMIC_RELAXED);
	return __atomic_load_n(&cl->pushes_chained, __ATOMIC_RELAXED);
}

