/*
 * progress.c - the progress engine of the client: one thread at a time polls
 * the completion queue (the progress thread, or a caller waiting for its
 * own request), retires dead connections, runs lock retries and request
 * deadlines; requests are created, waited for and completed here.
 */
#include "config.h"
#include "common/common.h"
#include "common/crc.h"
#include "client/client_int.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- request completion --------------------------------------------- */

static void req_free(struct rps_request *r)
{
	free(r->replies);
	free(r->rstatus);
	free(r);
}

static void deadline_unlink(struct rps_client *cl, struct rps_request *r)
{
	if (r->dprev)
		r->dprev->dnext = r->dnext;
	else if (cl->deadlines == r)
		cl->deadlines = r->dnext;
	if (r->dnext)
		r->dnext->dprev = r->dprev;
	r->dnext = r->dprev = NULL;
}

void rps__req_maybe_free(struct rps_request *r)
{
	if (r->done && r->waited && r->live_ops == 0)
		req_free(r);
}

void rps__req_finish(struct rps_request *r)
{
	struct rps_client *cl = r->cl;

	r->done = true;
	deadline_unlink(cl, r);
	if (r->version_out && r->status == 0 && r->kind == REQ_SHARDS && r->min_version_seen != UINT64_MAX)
		*r->version_out = r->min_version_seen;
	pthread_cond_broadcast(&cl->cond);
}

const char *rps__status_text(int status)
{
	switch (status) {
	case -EMSGSIZE: return "gradient size or dtype does not match the tensor";
	case -EILSEQ: return "the push arrived corrupted (checksum mismatch) and was not applied";
	case -EBADMSG: return "the server found the push malformed and did not apply it";
	case -ENOENT: return "the server does not know this tensor (was it created?)";
	case -EINVAL: return "the server refused the request as invalid (rank, shard or tensor id)";
	case -EALREADY: return "this step already has this worker's push (duplicate)";
	case -EEXIST: return "the tensor exists with different options (count, dtype, mode, optimizer, workers or init)";
	case -EFAULT: return "remote access error: the server revoked or never granted this memory";
	case -EPROTO: return "protocol error: librdmaps and rdmapsd versions differ?";
	case -ENOMEM: return "the server is out of memory: raise rdmapsd --memory-limit or add servers";
	case -EFBIG: return "the tensor has too many shards: lower its count or raise rdmapsd --shard-size";
	case -ECONNRESET: return "connection lost: is rdmapsd running and reachable?";
	case -ENODATA: return "the shard's partition was lost with its server: restore it (psctl restore NAME) or accept it empty (psctl forget-lost PART)";
	case RPS_ELEASE: return "the shard lock lease expired";
	case RPS_ESTALE_EPOCH: return "the shard moved and no server serves it yet (a move in progress or aborted?)";
	case -EAGAIN: return "the server is not ready (it has not learnt the shard map yet)";
	case -ECONNREFUSED: return "this server refused the connection when the client connected (is rdmapsd running there?)";
	case -EHOSTUNREACH: return "this server could not be reached (or its address is bad) when the client connected";
	case -ERANGE: return "the push's clock is beyond the steps the tensor can reach (a foreign or corrupted client?)";
	case -EPERM: return "refused: a reader key does not push, or this rank was removed from the tensor (psctl "
			    "remove-rank: start the job again to bring it back)";
	case -EACCES: return "refused: the tensor is outside this key's scope (README \"Security\")";
	case -EPIPE: return "a worker of this sync tensor disconnected before its push: the step waits for a replacement of its rank";
	case -ESTALE: return "a newer process took this rank over (rps_client_opts.takeover) and is connected: this "
			     "process is the one it replaced, and must exit";
	default: return "failed";
	}
}

void rps__req_part_done_at(struct rps_request *r, int status, const struct conn *c)
{
	if (rps__status_overrides(r->status, status)) {
		r->status = status;
		if (status == -EHOSTDOWN && c && c->cl->noq_text[0])	/* (rps__note_take) */
			snprintf(r->msg, sizeof(r->msg), "%s", c->cl->noq_text);
		else if (c && status == -ECONNREFUSED && c->err == status && c->refused[0])
			snprintf(r->msg, sizeof(r->msg), "%s", c->refused);	/* what the server said */
		else
			snprintf(r->msg, sizeof(r->msg), "%s: %s", c ? c->name : "rdmaps", rps__status_text(status));
	}
	assert(r->remaining > 0);	/* never more parts done than the request issued */
	if (--r->remaining == 0)
		rps__req_finish(r);
	else if (rps__req_settled(r))
		pthread_cond_broadcast(&r->cl->cond);	/* its waiter resends now */
}

/* The op's part of the request is over (the op may live on to release
 * resources). */
void rps__op_report(struct shard_op *op, int status)
{
	struct rps_request *r = op->req;

	if (!r)
		return;
	op->req = NULL;
	if (op->state == ST_TAKEN)
		r->ntaken--;
	/* a replacement's push for a step its predecessor already gave this
	 * shard: the predecessor's gradient stands, the step has this rank */
	if (status == -EALREADY && op->kind == OP_PUSH && op->clock < op->t->resume_until)
		status = 0;
	op->result = status;
	if (status == 0 && op->kind == OP_PULL && op->min_version < r->min_version_seen)
		r->min_version_seen = op->min_version;
	rps__req_part_done_at(r, status, op->c);
}

static const char *conn_error_text(int err)
{
	switch (err) {
	case -EFAULT: return "remote access error (stale registration)";
	case -EPROTO: return "protocol error";
	default: return "connection lost: is rdmapsd running and reachable?";
	}
}

/* A connection died: fail everything on it.  Closing the endpoint first
 * drops its queued completions, so no completion can reach a freed op. */
void rps__conn_kill(struct rps_client *cl, struct conn *c)
{
	struct shard_op *op;
	uint32_t i;

	if (!c->ep)
		return;
	rps__ep_close(c->ep);
	c->ep = NULL;
	rps__conn_note_lost(cl, c);
	if (!c->err)
		c->err = -ECONNRESET;
	rps__log(RPS__LOG_DEBUG, "%s: %s", c->name, conn_error_text(c->err));
	{	/* ops in backoff that belong to this connection */
		struct shard_op **pp = &cl->backoff;
		while (*pp) {
			if ((*pp)->c == c)
				*pp = (*pp)->next;
			else
				pp = &(*pp)->next;
		}
	}
	while ((op = c->active) != NULL) {
		/* its shard is free for our next push (a resend to the
		 * partition's new primary), which goes elsewhere */
		if (op->shard_turn) {
			op->shard_turn = false;
			op->t->shard_busy[op->shard]--;
		}
		rps__op_report(op, c->err);
		rps__active_del(c, op);
	}
	c->qhead = c->qtail = c->wqhead = c->wqtail = c->shhead = c->shtail = c->taken = NULL;
	for (i = 0; i < CTRL_CREDITS; i++) {
		if (c->ctrl[i].busy && c->ctrl[i].req) {
			c->ctrl[i].req->rstatus[c->ctrl[i].server] = c->err;
			rps__req_part_done_at(c->ctrl[i].req, c->err, c);
		}
		c->ctrl[i].busy = false;
	}
}

/* Does the cluster replicate (a partition with a backup in our map)?  Then
 * the control plane fails a silent member over, and what waits on it is
 * better answered elsewhere; without backups a slow server is waited for. */


bool rps__note_take(struct rps_client *cl, struct conn *c, const void *buf)
{
	struct rps__quorum_note n;
	const struct rps__smap_member *lost, *by;

	memcpy(&n, buf, sizeof(n));
	if (!n.magic) {
		c->noq = false;	/* that server has a majority */
		return rps__noq_final(cl);
	}
	if (n.magic != RPS__NOTE_MAGIC || !n.member || n.crc != rps__crc32c_noinv((const uint8_t *)&n + 8, sizeof(n) - 8))
		return rps__noq_final(cl);	/* torn by a rewrite: the next read tells */
	c->noq = true;
	lost = rps__smap_member(&cl->map, n.member);
	by = rps__smap_member(&cl->map, n.reporter);
	snprintf(cl->noq_text, sizeof(cl->noq_text),
		 "member %llu (%.80s) is unreachable and cannot be failed over: member %llu (%.80s) reaches %u of %u Raft voters,"
		 " no majority, for %u ms; restart member %llu%s", (unsigned long long)n.member,
		 lost ? lost->uri : "?", (unsigned long long)n.reporter, by ? by->uri : "?", n.reachable, n.voters,
		 n.since_ms, (unsigned long long)n.member,
		 n.voters == 2 ? ", and add a witness (rdmapsd --witness) so that 2 servers fail over" : "");
	return rps__noq_final(cl);
}

bool rps__noq_final(const struct rps_client *cl)
{
	bool said = false;
	int k;

	if (!rps__replicated(cl))
		return false;	/* (without backups there is nothing to fail over) */
	for (k = 0; k < cl->nservers; k++) {
		const struct conn *o = &cl->conns[k];

		if (o->thread)
			continue;
		if (o->noq && (o->err == -EHOSTDOWN || (o->ep && !o->dead)))
			said = true;	/* (dropped for saying so: below) */
		else if (o->ep && !o->dead)
			return false;	/* a server that answers and has a majority */
	}
	return said && cl->noq_text[0];
}

/* Is anything of ours waiting on c: an op, a control request, a pull's WAIT? */
static bool conn_waited_on(const struct conn *c)
{
	uint32_t i;

	if (c->active)
		return true;
	for (i = 0; i < CTRL_CREDITS; i++)
		if (c->ctrl[i].busy)
			return true;
	return false;
}


/*
 * A stopped or hung server process behind a live NIC: the HCA (or rxe, in
 * the kernel) answers the probe's READ for it, so probes cannot tell.  Its
 * messages can: a push waiting PROBE_DEAD_MS for its acknowledgement, or
 * a CREATE (a tensor's open, also after a map change) for its reply, with
 * no message at all from the server meanwhile, gets the verdict a probe
 * unanswered that long gets (or the cluster's failover_ms, if longer:
 * silent_ns).  (A push a live server holds acknowledges
 * soon: a sync push out of turn is TAKEN at once, one waiting for a backup
 * waits for that backup's failover, failover_ms; a CREATE is answered in
 * the turn that reads it.  What waits on other workers, a TAKEN push, a
 * pull's WAIT or a barrier, is not counted.)  Without the CREATE, a
 * refresh that reopened a tensor on a stopped primary waited its whole
 * timeout_ms over verbs (it_failover d3), its ops refused meanwhile.
 */
/* How long a server may be silent before its connection is called lost:
 * PROBE_DEAD_MS, or the cluster's failover_ms if longer.  No partition of
 * a server silent for less than failover_ms can have failed over, so an
 * earlier verdict only dials the same server again and resends, which a
 * starved cluster (thousands of workers on few cores) pays for with
 * thousands of redials and refusals of stale epochs. */
static uint64_t silent_ns(const struct conn *c)
{
	return (uint64_t)RPS__MAX((uint32_t)PROBE_DEAD_MS, c->hello.failover_ms) * 1000000ull;
}

static bool process_silent(const struct conn *c, uint64_t now)
{
	const struct shard_op *op;
	uint64_t oldest = now;
	uint32_t i;

	if (now - c->rx_ns < silent_ns(c))
		return false;	/* it spoke lately: no need to look at the ops */
	for (op = c->active; op; op = op->anext)
		if (op->state == ST_WRITING && op->written_ns < oldest)
			oldest = op->written_ns;
	for (i = 0; i < CTRL_CREDITS; i++)
		if (c->ctrl[i].busy && c->ctrl[i].req && c->ctrl[i].prompt && c->ctrl[i].sent_ns < oldest)
			oldest = c->ctrl[i].sent_ns;
	return now - RPS__MAX(oldest, c->rx_ns) >= silent_ns(c);
}

/*
 * Liveness probes (doc/design.md "Failover and leases"): when a whole host dies nothing tells us (no
 * reset, no CM disconnect), and an op whose request already reached it
 * (a push waiting for its PUSH_ACK, a sync push for its step) has nothing
 * outstanding at the transport level that could fail: it would wait for
 * its request's timeout instead of riding through the failover.  So a
 * connection that has something of ours waiting on it and no completion
 * for PROBE_MS gets a small RDMA READ of the server's map region; a dead
 * host fails it once the transport's retries run out (about 2 s, see
 * verbs_int.h), which kills the connection and hands its ops to the
 * ride-through.  A live server answers it at once: one READ per
 * PROBE_MS per connection, and only while an answer is slow.  A transport
 * that never fails it (TCP to a silent host, or to a stopped process)
 * gets the same verdict after PROBE_DEAD_MS (or failover_ms) without an
 * answer, if the cluster replicates.  That verdict can be wrong (a server stalled that
 * long): the ride-through then dials it again and resends, push ids
 * unchanged, once its partitions have not failed over (client.c).
 */
static void probe_conns(struct rps_client *cl, uint64_t now)
{
	int k;

	for (k = 0; k < cl->nservers; k++) {
		struct conn *c = &cl->conns[k];
		struct rps__wr wr;
		uint64_t last;

		if (!c->ep || c->dead || !c->hello.map_len || !conn_waited_on(c))
			continue;
		if (process_silent(c, now) && rps__replicated(cl)) {
			rps__log(RPS__LOG_DEBUG, "%s: no message for %llu ms while a push or a CREATE waits for its "
				 "answer: connection lost", c->name, (unsigned long long)(silent_ns(c) / 1000000ull));
			c->dead = true;
			c->err = -ECONNRESET;
			continue;
		}
		if (c->probing) {
			/* no answer at all: the connection is lost, as verbs
			 * would decide, so its ops ride through the failover
			 * (and a tensor refresh's OPEN does not wait its whole
			 * timeout); a server that was only slow is dialed
			 * again and its ops resent there (client.c) */
			if (now - c->probe_ns >= silent_ns(c) && rps__replicated(cl)) {
				rps__log(RPS__LOG_DEBUG, "%s: no answer to a liveness probe for %llu ms: connection lost",
					 c->name, (unsigned long long)(silent_ns(c) / 1000000ull));
				c->dead = true;
				c->err = -ECONNRESET;
			}
			continue;
		}
		last = RPS__MAX(RPS__MAX(c->wc_ns, c->busy_ns), c->probe_ns);
		if (now - last < PROBE_MS * 1000000ull)
			continue;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = TAG_PROBE;
		wr.op = RPS__OP_READ;
		wr.flags = RPS__WR_SIGNALED;
		wr.sge.addr = cl->probebuf;
		wr.sge.len = (uint32_t)RPS__MIN(c->hello.map_len, PROBE_LEN);
		wr.sge.mr = cl->probebuf_mr;
		/* the first port's map buffer ends with the quorum note: a
		 * server that lost the majority says so to what waits on it */
		wr.raddr = c->hello.map_addr + (c->hello.map_len == RPS__MAP_BUF ? RPS__MAP_BUF - PROBE_LEN : 0);
		wr.rkey = c->hello.map_rkey;
		c->probe_ns = now;
		if (rps__post(c->ep, &wr, 1) == 0)	/* a full queue: next time */
			c->probing = true;
	}
}

/* What an op still waits for, for a timeout's message.  A pull's WAIT
 * says for what: a bounded pull's slowest rank may be one that waits for
 * this worker on another tensor (rdmaps(3), "Replacing a worker"). */
static const char *op_state_what(const struct shard_op *op, char *buf, size_t len)
{
	if (op->state == ST_WAITING && op->min_clock && op->seen_min_clock < op->min_clock) {
		snprintf(buf, len, "waiting for every rank's clock to reach %llu (slowest: %llu)",
			 (unsigned long long)op->min_clock, (unsigned long long)op->seen_min_clock);
		return buf;
	}
	switch (op->state) {
	case ST_QUEUED: return "queued for a staging slot";
	case ST_LOCKING: return "taking the shard lock";
	case ST_BACKOFF: return "waiting for the shard lock";
	case ST_WRITING: return "pushed, no acknowledgement";
	case ST_RELEASING: return "releasing the shard lock";
	case ST_READING: return "reading";
	case ST_WAITING: return "waiting for a newer version";
	case ST_WAIT_QUEUED: return "queued for a control credit";
	case ST_TAKEN: return "taken into its step, waiting for the step to be on every replica";
	}
	return "in flight";
}

static void run_timers(struct rps_client *cl, uint64_t now)
{
	struct shard_op **pp = &cl->backoff, *op;
	struct rps_request *r, *next;
	int k;

	while ((op = *pp) != NULL) {
		if (op->retry_at <= now) {
			*pp = op->next;
			op->next = NULL;
			if (!op->c->dead)
				rps__lock_retry(op);
			continue;
		}
		pp = &op->next;
	}
	for (r = cl->deadlines; r; r = next) {
		next = r->dnext;
		if (r->deadline && r->deadline <= now && !r->done) {
			/* The request gives up; its ops keep their resources until
			 * the transport hands them back. */
			const struct shard_op *stuck = NULL;
			char what[96];
			uint32_t i;
			for (i = 0; i < r->nops; i++) {
				struct shard_op *o = &r->ops[i];
				if (o->req == r && !stuck)
					stuck = o;
				/* A push sent from memory the user did not
				 * register (tcp sends from any memory), its
				 * frame maybe not all written: the caller may
				 * reuse that memory once we return, so its
				 * bytes go to the op's slot buffer and the
				 * frame reads them there.  (Registered memory
				 * stays busy instead: rps_buffer_deregister.) */
				if (o->req == r && o->c && o->c->ep && o->state == ST_WRITING && o->has_res &&
				    o->src_mr && o->src_mr == cl->implicit_mr) {
					char *copy = slot_buf(o->c, o->res) + RPS__PUSH_DESC_SIZE;
					size_t n = ((const struct rps__push_desc *)slot_buf(o->c, o->res))->nbytes;
					memcpy(copy, o->src, n);
					if (rps__ep_rebase(o->c->ep, o->src, copy, n) == 0)
						o->src_mr = NULL;
				}
				o->req = NULL;
			}
			for (k = 0; k < cl->nservers; k++)
				for (i = 0; i < CTRL_CREDITS; i++)
					if (cl->conns[k].ctrl[i].req == r)
						cl->conns[k].ctrl[i].req = NULL;
			r->status = -ETIMEDOUT;
			r->remaining = 0;
			if (stuck && stuck->c) {
				snprintf(r->msg, sizeof(r->msg),
					 "request timed out after %d ms: shard %u at %s: %s: a server or a worker is "
					 "stalled (raise timeout_ms for slow steps)", cl->timeout_ms, stuck->shard,
					 stuck->c->name, op_state_what(stuck, what, sizeof(what)));
			} else
				snprintf(r->msg, sizeof(r->msg),
					 "request timed out after %d ms: a server or a worker is stalled (raise timeout_ms "
					 "for slow steps)", cl->timeout_ms);
			rps__req_finish(r);
		}
	}
}

/* How long progress may sleep: until the next lock retry, at most 50 ms
 * (request deadlines are checked that often). */
static struct timespec next_timeout(struct rps_client *cl, uint64_t now)
{
	uint64_t soonest = now + 50ull * 1000000ull, ns;
	struct shard_op *op;
	struct timespec ts;

	for (op = cl->backoff; op; op = op->next)
		soonest = RPS__MIN(soonest, op->retry_at);
	ns = soonest > now ? soonest - now : 0;
	ts.tv_sec = (time_t)(ns / 1000000000ull);
	ts.tv_nsec = (long)(ns % 1000000000ull);
	return ts;
}

/*
 * One round of progress, with the lock held: reap completions, retire dead
 * connections, run timers; if there was nothing to do, sleep on the CQ's
 * file descriptor (lock dropped) for at most the next timer.  Exactly one
 * thread polls at a time (cl->polling): the progress thread when nobody
 * waits, otherwise a waiting caller itself, which saves the hand-off from the
 * progress thread to the waiter on the latency path.
 */
static void progress_once(struct rps_client *cl)
{
	struct rps__wc wc[32];
	struct pollfd pfd[2];
	struct timespec ts;
	uint64_t now;
	int i, n;

	n = rps__cq_poll(cl->cq, wc, (int)RPS__ARRAY_SIZE(wc));
	for (i = 0; i < n; i++)
		rps__on_completion(cl, &wc[i]);
	for (i = 0; i < cl->nservers; i++)
		if (cl->conns[i].dead && cl->conns[i].ep)
			rps__conn_kill(cl, &cl->conns[i]);
	now = rps__now_ns();
	run_timers(cl, now);
	probe_conns(cl, now);
	if (n > 0) {
		cl->idle_since = now;
		return;
	}
	if (now - cl->idle_since < cl->spin_ns)
		return;	/* busy-poll a while before sleeping: saves a wake-up */
	if (rps__cq_arm(cl->cq) != 0) {
		n = rps__cq_poll(cl->cq, wc, (int)RPS__ARRAY_SIZE(wc));
		for (i = 0; i < n; i++)
			rps__on_completion(cl, &wc[i]);
		if (n > 0)
			return;
	}
	pfd[0] = (struct pollfd){ .fd = rps__cq_fd(cl->cq), .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = cl->wake_fd, .events = POLLIN };
	ts = next_timeout(cl, now);
	pthread_mutex_unlock(&cl->lock);
	ppoll(pfd, 2, &ts, NULL);
	if (pfd[1].revents) {
		uint64_t v;
		ssize_t r = read(cl->wake_fd, &v, sizeof(v));
		(void)r;
	}
	pthread_mutex_lock(&cl->lock);
}

/* The progress thread works only for requests nobody waits on (the
 * non-blocking API, ops that outlived a timed-out request); a blocked
 * caller polls for itself, so a blocking push costs the same wake-ups as a
 * socket ping-pong. */
void *rps__progress_main(void *arg)
{
	struct rps_client *cl = arg;

	/* near the HCA when it is known (the library never logs: a refusal
	 * leaves the thread where it was) */
	(void)rps__topo_pin_thread(cl->topo, &cl->place);
	pthread_mutex_lock(&cl->lock);
	while (!cl->stopping) {
		if (cl->waiters || cl->polling || !cl->nactive) {
			pthread_cond_wait(&cl->pcond, &cl->lock);
			continue;
		}
		cl->polling = cl->progress_polling = true;
		progress_once(cl);
		cl->polling = cl->progress_polling = false;
		if (cl->waiters)
			pthread_cond_broadcast(&cl->cond);
	}
	pthread_mutex_unlock(&cl->lock);
	return NULL;
}

/* Wait for r (done, or with `settled` settled) with the lock held, polling
 * ourselves when nobody else does. */
static void wait_locked(struct rps_client *cl, const struct rps_request *r, bool settled)
{
	if (settled ? rps__req_settled(r) : r->done)
		return;
	cl->waiters++;
	if (cl->progress_polling)
		wake_progress(cl);	/* get the progress thread out of its sleep */
	while (!(settled ? rps__req_settled(r) : r->done)) {
		if (cl->polling) {
			pthread_cond_wait(&cl->cond, &cl->lock);
			continue;
		}
		cl->polling = true;
		progress_once(cl);
		cl->polling = false;
		if (cl->waiters > 1)
			pthread_cond_broadcast(&cl->cond);	/* hand the poll to another waiter */
	}
	cl->waiters--;
	if (cl->waiters)
		pthread_cond_broadcast(&cl->cond);
	else if (cl->nactive)
		pthread_cond_signal(&cl->pcond);	/* work left that nobody waits on */
}

/* ---- requests ------------------------------------------------------------ */

struct rps_request *rps__req_new(struct rps_client *cl, uint32_t nops)
{
	struct rps_request *r = calloc(1, sizeof(*r) + nops * sizeof(struct shard_op));

	if (!r)
		return NULL;
	r->cl = cl;
	r->nops = nops;
	r->remaining = (int)nops;
	r->min_version_seen = UINT64_MAX;
	return r;
}

void rps__req_arm_deadline(struct rps_client *cl, struct rps_request *r)
{
	r->deadline = rps__now_ns() + (uint64_t)cl->timeout_ms * 1000000ull;
	r->dnext = cl->deadlines;
	if (cl->deadlines)
		cl->deadlines->dprev = r;
	cl->deadlines = r;
}

/* Wait for r with the lock held and return its status.  The caller then
 * calls rps__req_collect() (after copying anything it needs out of r). */
int rps__req_wait_locked(struct rps_client *cl, struct rps_request *r)
{
	wait_locked(cl, r, false);
	return r->status;
}

int rps__req_wait_settled_locked(struct rps_client *cl, struct rps_request *r)
{
	wait_locked(cl, r, true);
	return r->status;
}

void rps__req_collect(struct rps_request *r)
{
	if (r->status)
		rps__seterr(r->status, "%s", r->msg);
	r->waited = true;
	rps__req_maybe_free(r);
}

/* Send a control message to a set of servers and collect the replies. */
int rps__ctrl_call(struct rps_client *cl, unsigned type, const void *body, size_t len,
		   const bool *to, size_t reply_len, void *replies, int32_t *rstatus)
{
	struct rps_request *r = rps__req_new(cl, 0);
	int i, n = 0, status;

	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_CTRL;
	r->reply_len = reply_len;
	r->replies = calloc((size_t)cl->nservers, reply_len ? reply_len : 1);
	r->rstatus = calloc((size_t)cl->nservers, sizeof(int32_t));
	if (!r->replies || !r->rstatus) {
		req_free(r);
		return rps__seterr(-ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&cl->lock);
	for (i = 0; i < cl->nservers; i++) {
		struct conn *c = &cl->conns[i];
		int e;
		if (!to[i])
			continue;
		n++;
		r->remaining++;
		if (c->dead || (e = rps__ctrl_take(c)) < 0) {
			r->rstatus[i] = c->dead ? (c->err ? c->err : -ECONNRESET) : -EBUSY;
			rps__req_part_done_at(r, r->rstatus[i], c);
			continue;
		}
		c->ctrl[e].req = r;
		c->ctrl[e].server = i;
		/* a barrier waits for the other workers; a CREATE or an open
		 * only for the server (process_silent) */
		c->ctrl[e].prompt = type != RPS__MSG_BARRIER;
		c->ctrl[e].sent_ns = rps__now_ns();
		rps__send_ctrl(c, (uint32_t)e, type, body, len);
	}
	if (n == 0 || r->remaining == 0) {
		r->done = true;
	} else {
		rps__req_arm_deadline(cl, r);	/* a barrier too: a worker that died must not hang the rest */
	}
	wake_progress(cl);
	status = rps__req_wait_locked(cl, r);
	if (replies && reply_len)
		memcpy(replies, r->replies, (size_t)cl->nservers * reply_len);
	if (rstatus)
		memcpy(rstatus, r->rstatus, (size_t)cl->nservers * sizeof(int32_t));
	rps__req_collect(r);
	pthread_mutex_unlock(&cl->lock);
	return status;
}
