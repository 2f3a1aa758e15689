/*
 * baseline_xport.c - the raw transport baseline: RDMA WRITE / READ / CAS /
 * SEND ping-pong / WRITE_WITH_IMM answered by a SEND, one by one and
 * --window in flight, through transport.h
 * (over verbs, or over tcp with --raw-transport), with a responder that is
 * either in-process or psperf --server --baseline.
 */
#include "config.h"
#include "psperf_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RAWT_MAGIC 0x54574152u		/* "RAWT" */
#define RAWT_NRX 2u

/* ---- baseline: raw transport ops through transport.h -------------------------------------------- */

struct rawt_req {
	uint32_t magic, pad;
	uint64_t bytes;
};

static size_t rawt_memlen(size_t len)
{
	return len * (1 + RAWT_NRX) + 64;
}

int psperf_rawt_open(struct rawt_side *s, enum rps__kind kind, const char *device, const char *host)
{
	struct rps__fabric_attr fa = { .kind = kind, .device = device, .host = host };
	int ret;

	memset(s, 0, sizeof(*s));
	ret = rps__fabric_open(&fa, &s->fab);
	if (!ret)
		ret = rps__cq_create(s->fab, 4096, &s->cq);
	return ret;
}

static int rawt_mem(struct rawt_side *s, size_t len, int access)
{
	s->len = RPS__ALIGN_UP(RPS__MAX(len, (size_t)64), 64);
	s->mem = psperf_xalloc_aligned(rawt_memlen(s->len));
	return rps__mr_reg(s->fab, s->mem, rawt_memlen(s->len), access, &s->mr);
}

void psperf_rawt_close(struct rawt_side *s)
{
	if (s->ep)
		rps__ep_close(s->ep);
	if (s->mr)
		rps__mr_dereg(s->mr);
	free(s->mem);
	if (s->lis)
		rps__listener_close(s->lis);
	if (s->cq)
		rps__cq_destroy(s->cq);
	if (s->fab)
		rps__fabric_close(s->fab);
	memset(s, 0, sizeof(*s));
}

static void rawt_ep_attr(struct rps__ep_attr *a, int window)
{
	memset(a, 0, sizeof(*a));
	a->sq_depth = (uint32_t)(window * 2 + 16);
	a->rq_depth = RAWT_NRX + 2;
	a->max_inline = 64;
}

static int rawt_post_rx(struct rawt_side *s, uint32_t i)
{
	struct rps__sge sge = { s->mem + s->len * (1 + i), (uint32_t)s->len, s->mr };

	return rps__post_recv(s->ep, &sge, i);
}

/* Responder: take one connection request (waiting up to timeout_ms). */
int psperf_rawt_accept(struct rawt_side *s, int window, int timeout_ms, volatile sig_atomic_t *stop)
{
	struct rps__conn_req *cr = NULL;
	struct rps__ep_attr attr;
	struct rawt_req rq;
	struct rawt_rep rep;
	uint64_t deadline = rps__now_ns() + (uint64_t)timeout_ms * 1000000ull;
	const void *data;
	size_t dlen;
	uint32_t i;
	int ret;

	while ((ret = rps__listener_get_request(s->lis, &cr)) == -EAGAIN) {
		struct pollfd pfd = { .fd = rps__listener_fd(s->lis), .events = POLLIN };
		if ((stop && *stop) || (!stop && rps__now_ns() > deadline))
			return rps__seterr(-ETIMEDOUT, "raw baseline: no connection came to the responder");
		poll(&pfd, 1, 100);
	}
	if (ret)
		return ret;
	data = rps__conn_req_data(cr, &dlen);
	memset(&rq, 0, sizeof(rq));
	memcpy(&rq, data, RPS__MIN(dlen, sizeof(rq)));
	if (rq.magic != RAWT_MAGIC || rq.bytes > 4ull * MAX_BYTES) {
		rps__reject(cr, "not a psperf baseline", 22);
		return rps__seterr(-EPROTO, "raw baseline: a connection that is not psperf's");
	}
	ret = rawt_mem(s, (size_t)rq.bytes,
		       RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC);
	if (ret) {
		rps__reject(cr, "responder out of memory", 24);
		return ret;
	}
	rep = (struct rawt_rep){ RAWT_MAGIC, rps__mr_rkey(s->mr), (uint64_t)(uintptr_t)s->mem, s->len };
	rawt_ep_attr(&attr, window);
	ret = rps__accept(cr, s->cq, &attr, &rep, sizeof(rep), &s->ep);
	for (i = 0; !ret && i < RAWT_NRX; i++)
		ret = rawt_post_rx(s, i);
	return ret;
}

/* Responder progress: answer every SEND with a SEND of the same length,
 * and every WRITE_IMM with a SEND of as many bytes as its immediate says. */
int psperf_rawt_peer_progress(struct rawt_side *s, int timeout_ms)
{
	struct rps__wc wc[16];
	int i, n;

	n = timeout_ms ? rps__cq_wait(s->cq, wc, 16, timeout_ms) : rps__cq_poll(s->cq, wc, 16);
	for (i = 0; i < n; i++) {
		if (wc[i].status != RPS__WC_SUCCESS) {
			s->broken = true;
			continue;
		}
		if (wc[i].opcode == RPS__WC_RECV || wc[i].opcode == RPS__WC_RECV_IMM) {
			uint32_t len = wc[i].opcode == RPS__WC_RECV ? wc[i].byte_len : wc[i].imm;
			struct rps__wr wr = { .op = RPS__OP_SEND, .sge = { s->mem, (uint32_t)RPS__MIN(len, s->len), s->mr } };
			if (wr.sge.len <= 64)
				wr.flags |= RPS__WR_INLINE;
			if (rawt_post_rx(s, (uint32_t)wc[i].wr_id) || rps__post(s->ep, &wr, 1))
				s->broken = true;
		}
	}
	return n;
}

struct rawt_conn_job {
	struct rawt_side *s;
	const char *host;
	uint16_t port;
	size_t bytes;
	int window, timeout_ms;
	int ret;
	char err[512];
};

static void *rawt_connect_main(void *arg)
{
	struct rawt_conn_job *j = arg;
	struct rawt_req rq = { RAWT_MAGIC, 0, j->bytes };
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t rlen = RPS__PRIVDATA_MAX;
	struct rps__ep_attr attr;

	rawt_ep_attr(&attr, j->window);
	memset(reply, 0, sizeof(reply));
	j->ret = rps__connect(j->s->fab, j->host, j->port, j->s->cq, &attr, &rq, sizeof(rq), j->timeout_ms,
			      reply, &rlen, &j->s->ep);
	if (!j->ret) {
		memcpy(&j->s->remote, reply, sizeof(j->s->remote));
		if (j->s->remote.magic != RAWT_MAGIC)
			j->ret = rps__seterr(-EPROTO, "raw baseline: the peer is not a psperf responder");
	}
	if (j->ret)
		snprintf(j->err, sizeof(j->err), "%s", rps__errbuf());
	return NULL;
}

/* Poll the initiator's CQ (and the local responder's) until `want`
 * completions of success have come; returns how many ops completed. */
static int rawt_wait(struct rawt_session *x, int want, uint64_t *done_at, int ndone)
{
	struct rps__wc wc[32];
	uint64_t deadline = rps__now_ns() + (uint64_t)x->timeout_ms * 1000000ull;
	int got = 0, n, i;
	unsigned spins = 0;

	while (got < want) {
		n = rps__cq_poll(x->ini.cq, wc, RPS__MIN(want - got, 32));
		if (n < 0)
			return n;
		for (i = 0; i < n; i++) {
			if (wc[i].status != RPS__WC_SUCCESS)
				return rps__seterr(-EIO, "raw baseline: %s", rps__wc_status_str(wc[i].status));
			if (wc[i].opcode == RPS__WC_SEND)
				continue;	/* our unsignaled SENDs psperf_report nothing; be safe */
			if (done_at && got < ndone)
				done_at[got] = rps__now_ns();
			got++;
		}
		if (x->local_peer)
			psperf_rawt_peer_progress(&x->peer, 0);
		if ((++spins & 1023) == 0 && rps__now_ns() > deadline)
			return rps__seterr(-ETIMEDOUT, "raw baseline: no completion within --timeout-ms");
	}
	return got;
}

static void rawt_wr(struct rawt_session *x, const struct raw_result *res, struct rps__wr *wr)
{
	struct rawt_side *s = &x->ini;

	memset(wr, 0, sizeof(*wr));
	wr->flags = RPS__WR_SIGNALED;
	wr->raddr = s->remote.addr;
	wr->rkey = s->remote.rkey;
	wr->sge = (struct rps__sge){ s->mem, (uint32_t)res->a, s->mr };
	switch (res->op) {
	case RAW_WRITE: case RAW_WRITE_BW: wr->op = RPS__OP_WRITE; break;
	case RAW_READ: case RAW_READ_BW: wr->op = RPS__OP_READ; break;
	case RAW_CAS:
		wr->op = RPS__OP_CAS;
		wr->sge = (struct rps__sge){ s->mem + s->len * (1 + RAWT_NRX), 8, s->mr };
		break;
	case RAW_WRITE_IMM_PP:
		/* the immediate tells the responder how many bytes to SEND back */
		wr->op = RPS__OP_WRITE_IMM;
		wr->flags = 0;
		wr->imm = (uint32_t)res->b;
		break;
	default:
		wr->op = RPS__OP_SEND;
		wr->flags = 0;
		break;
	}
	if ((wr->op == RPS__OP_WRITE || wr->op == RPS__OP_WRITE_IMM || wr->op == RPS__OP_SEND) && res->a <= 64)
		wr->flags |= RPS__WR_INLINE;
}

static int rawt_post(struct rawt_session *x, const struct rps__wr *wr)
{
	int ret;

	while ((ret = rps__post(x->ini.ep, wr, 1)) == -EAGAIN)
		if (rawt_wait(x, 1, NULL, 0) < 0)
			return -EIO;
	return ret;
}

/* One op: post it, wait for its completion (SEND, WRITE_IMM: for the
 * peer's reply). */
static int rawt_one(struct rawt_session *x, const struct raw_result *res, const struct rps__wr *wr)
{
	int ret;

	if (res->op == RAW_SEND_PP || res->op == RAW_WRITE_IMM_PP) {
		struct rps__sge sge = { x->ini.mem + x->ini.len, (uint32_t)x->ini.len, x->ini.mr };
		ret = rps__post_recv(x->ini.ep, &sge, 0);
		if (ret)
			return ret;
	}
	ret = rawt_post(x, wr);
	if (ret)
		return ret;
	return rawt_wait(x, 1, NULL, 0) < 0 ? -EIO : 0;
}

int psperf_rawt_lat(struct rawt_session *x, struct raw_result *res, long warmup, struct pass *p)
{
	struct rps__wr wr;
	long i;
	int ret;

	rawt_wr(x, res, &wr);
	psperf_samples_reserve(&p->s, (size_t)res->iters);
	for (i = -warmup; i < res->iters; i++) {
		uint64_t t0;
		if (i == 0)
			p->t0 = rps__now_ns();
		t0 = rps__now_ns();
		ret = rawt_one(x, res, &wr);
		if (ret)
			return ret;
		if (i >= 0)
			psperf_samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	return 0;
}

/* count ops with --window in flight; completions come in posting order. */
int psperf_rawt_bw(struct rawt_session *x, struct raw_result *res, struct pass *p)
{
	int win = x->window;
	uint64_t *ts = psperf_xcalloc((size_t)win, sizeof(*ts));
	long posted = 0, done = 0;
	struct rps__wr wr;
	int ret = 0;

	rawt_wr(x, res, &wr);
	psperf_samples_reserve(&p->s, (size_t)res->count);
	p->t0 = rps__now_ns();
	while (done < res->count && !ret) {
		uint64_t at;
		while (posted < res->count && posted - done < win && !ret) {
			ts[posted % win] = rps__now_ns();
			ret = rawt_post(x, &wr);
			posted += !ret;
		}
		if (ret || rawt_wait(x, 1, &at, 1) < 0) {
			ret = -EIO;
			break;
		}
		psperf_samples_add(&p->s, at - ts[done % win]);
		done++;
	}
	p->t1 = rps__now_ns();
	free(ts);
	return ret;
}

static int rawt_local_connect(struct rawt_session *x, const char *host, size_t bytes)
{
	struct rawt_conn_job job = { &x->ini, host, 0, bytes, x->window, x->timeout_ms, 0, "" };
	pthread_t th;
	int ret;

	ret = rps__listen(x->peer.fab, host, 0, &x->peer.lis);
	if (ret)
		return ret;
	job.port = rps__listener_port(x->peer.lis);
	ret = pthread_create(&th, NULL, rawt_connect_main, &job);
	if (ret)
		return rps__seterr(-ret, "pthread_create: %s", strerror(ret));
	ret = psperf_rawt_accept(&x->peer, x->window, x->timeout_ms, NULL);
	pthread_join(th, NULL);
	if (job.ret)
		return rps__seterr(job.ret, "%s", job.err);
	return ret;
}

int psperf_rawt_session_open(struct run *r, struct rawt_session *x, enum rps__kind kind, size_t bytes)
{
	const char *dev = kind == RPS__KIND_VERBS ? r->o->device : NULL;
	struct rawt_conn_job job;
	int ret;

	memset(x, 0, sizeof(*x));
	x->window = r->o->window;
	x->timeout_ms = r->o->timeout_ms;
	x->local_peer = !r->remote_peer;
	ret = psperf_rawt_open(&x->ini, kind, dev, r->addr);
	if (!ret)
		ret = rawt_mem(&x->ini, bytes, RPS__ACCESS_LOCAL);
	if (ret)
		return ret;
	if (x->local_peer) {
		ret = psperf_rawt_open(&x->peer, kind, dev, r->addr);
		return ret ? ret : rawt_local_connect(x, r->addr, bytes);
	}
	memset(&job, 0, sizeof(job));
	job = (struct rawt_conn_job){ &x->ini, r->addr, r->rawt_port, bytes, x->window, x->timeout_ms, 0, "" };
	rawt_connect_main(&job);
	return job.ret ? rps__seterr(job.ret, "%s", job.err) : 0;
}

void psperf_rawt_session_close(struct rawt_session *x)
{
	psperf_rawt_close(&x->ini);
	psperf_rawt_close(&x->peer);
}
