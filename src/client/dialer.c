/*
 * dialer.c - the client's connections to many servers, made at once.
 *
 * A worker connects to every serving thread of every member of the map.
 * Made in turn, that costs a connect, an AUTH and a HELLO round trip per
 * endpoint, one after the other: at a thousand endpoints, seconds before
 * the first push, and a dead host's connect timeout stalls all behind it.
 * So the batch starts every dial (rps__dial_start, non-blocking on both
 * providers), steps them from one poll() on their descriptors and the CQ,
 * and as each connects sends its AUTH (or HELLO) at once; the replies come
 * back through the one CQ and are matched to their connection by the
 * endpoint's context.  A connection costs about one connect's time
 * whatever the count.  One job failing leaves the others be: its outcome
 * and line are kept for connect.c to settle, as a blocking connect's were.
 */
#include "config.h"
#include "common/common.h"
#include "client/client_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum job_state { JOB_DIAL, JOB_AUTH, JOB_HELLO, JOB_BUSY, JOB_OVER };

static void job_fail(struct rps__dial_job *j, int ret)
{
	snprintf(j->err, sizeof(j->err), "%s", rps__errbuf());
	j->ret = ret;
	if (j->d)
		rps__dial_cancel(j->d);
	j->d = NULL;
	rps__key_clear(&j->proven);
	j->state = JOB_OVER;
}

static void job_ok(struct rps__dial_job *j)
{
	j->ret = 0;
	j->err[0] = 0;
	rps__key_clear(&j->proven);
	j->state = JOB_OVER;
}

static uint64_t phase_deadline(const struct rps_client *cl)
{
	return rps__now_ns() + (uint64_t)cl->dial_ms * 1000000ull;
}

/* The HELLO that opens the session; its answer is awaited next. */
static void job_send_hello(struct rps_client *cl, struct rps__dial_job *j)
{
	struct conn *c = &cl->conns[j->k];
	struct rps__hello h;
	int ret;

	j->state = JOB_HELLO;
	rps__conn_hello_msg(cl, &h);
	ret = rps__send_ctrl(c, 0, RPS__MSG_HELLO, &h, sizeof(h));
	if (ret)
		job_fail(j, rps__preerr(ret, "%s: sending %s", c->name, rps__msg_type_name(RPS__MSG_HELLO)));
}

/* Connected: AUTH if we hold a key, else HELLO. */
static void job_handshake(struct rps_client *cl, struct rps__dial_job *j)
{
	struct conn *c = &cl->conns[j->k];
	int ret;

	j->deadline = phase_deadline(cl);
	if (cl->keys) {
		struct rps__auth msg;
		ret = rps__conn_auth_msg(cl, c, &j->priv, &j->rp, &msg, &j->t, &j->proven);
		if (!ret && (ret = rps__send_ctrl(c, 0, RPS__MSG_AUTH, &msg, sizeof(msg))))
			rps__preerr(ret, "%s: sending %s", c->name, rps__msg_type_name(RPS__MSG_AUTH));
		if (ret)
			job_fail(j, ret);
		else
			j->state = JOB_AUTH;
		return;
	}
	job_send_hello(cl, j);
}

/*
 * The server refused j's connection at connect, or closed it before its
 * AUTH to make room (a burst of handshakes from our address: a job's
 * ranks starting at once): drop it and dial again after
 * rps__busy_wait_ms, while the batch's time lasts.  False: no time left,
 * j fails with the server's line.
 */
static bool job_busy(struct rps_client *cl, struct rps__dial_job *j)
{
	uint64_t now = rps__now_ns(), wait_ms = rps__busy_wait_ms(j->busy_tries, (uint32_t)j->k);

	if (now + wait_ms * 1000000ull >= j->end)
		return false;
	rps__log(RPS__LOG_DEBUG, "%s: dialing again in %llu ms", rps__errbuf(), (unsigned long long)wait_ms);
	rps__key_clear(&j->proven);
	/* closed once the completions polled with this one are through
	 * (drain_cq: one of them may be this endpoint's) */
	j->drop = true;
	j->busy_tries++;
	j->deadline = now + wait_ms * 1000000ull;
	j->state = JOB_BUSY;
	return true;
}

static void job_start(struct rps_client *cl, struct rps__dial_job *j)
{
	struct conn *c = &cl->conns[j->k];
	struct rps__ep_attr attr;
	int ret;

	j->d = NULL;
	ret = rps__conn_begin(cl, c, &j->u, j->k, &j->priv, &attr);
	if (!ret)
		ret = rps__dial_start(cl->fab, j->u.host, j->u.port, cl->cq, &attr, &j->priv, sizeof(j->priv),
				      cl->dial_ms, &j->d);
	if (ret) {
		job_fail(j, ret);
		return;
	}
	j->state = JOB_DIAL;
	j->deadline = phase_deadline(cl);
}

static void job_step_dial(struct rps_client *cl, struct rps__dial_job *j)
{
	struct conn *c = &cl->conns[j->k];
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t reply_len = RPS__PRIVDATA_MAX;
	int ret;

	memset(reply, 0, sizeof(reply));
	ret = rps__dial_step(j->d, reply, &reply_len, &c->ep);
	if (ret == -EINPROGRESS) {
		if (rps__now_ns() < j->deadline + 1000000000ull)
			return;
		/* (the dial enforces its own deadline: this is a backstop) */
		job_fail(j, rps__seterr(-ETIMEDOUT, "connecting to %s: no answer within %d ms", c->name,
					cl->dial_ms));
		return;
	}
	j->d = NULL;	/* (over: the dial freed itself) */
	ret = rps__conn_dialed(cl, c, ret, reply, reply_len, &j->rp);
	if (ret == -EBUSY && job_busy(cl, j))
		return;
	if (ret)
		job_fail(j, ret);
	else
		job_handshake(cl, j);
}

/* The job of the batch whose slot connection c is, or NULL (job_at: a
 * slot's job in jobs, or -1). */
static struct rps__dial_job *job_of(struct rps_client *cl, struct rps__dial_job *jobs, const int *job_at,
				    const struct conn *c)
{
	if (!c || c < cl->conns || c >= cl->conns + MAX_CONNS || job_at[c - cl->conns] < 0)
		return NULL;
	return &jobs[job_at[c - cl->conns]];
}

/* A reply (or a failure) on j's connection: as call_sync (connect.c)
 * takes it. */
static void job_on_recv(struct rps_client *cl, struct rps__dial_job *j, const struct rps__wc *wc)
{
	struct conn *c = &cl->conns[j->k];
	unsigned want = j->state == JOB_AUTH ? RPS__MSG_AUTH_REP : RPS__MSG_HELLO_REP;
	unsigned sent = j->state == JOB_AUTH ? RPS__MSG_AUTH : RPS__MSG_HELLO;
	uint32_t i = (uint32_t)(wc->wr_id >> 3);
	char *buf = c->rbufs + (size_t)i * RPS__MSG_MAX;
	struct rps__sge sge = { .addr = buf, .len = RPS__MSG_MAX, .mr = c->rbufs_mr };
	struct rps__msg_hdr mh;
	struct rps__auth_rep ar;
	int ret;

	if (wc->status != RPS__WC_SUCCESS) {
		job_fail(j, rps__seterr(-ECONNRESET, "%s: connection failed during %s: %s", c->name,
					rps__msg_type_name(sent), rps__wc_status_str(wc->status)));
		return;
	}
	ret = rps__msg_check(buf, wc->byte_len);
	if (ret) {
		job_fail(j, rps__preerr(ret, "%s", c->name));
		return;
	}
	memcpy(&mh, buf, sizeof(mh));
	if (mh.type != want) {
		job_fail(j, rps__seterr(-EPROTO, "%s: expected %s, got %s", c->name, rps__msg_type_name(want),
					rps__msg_type_name(mh.type)));
		return;
	}
	if (want == RPS__MSG_AUTH_REP) {
		memset(&ar, 0, sizeof(ar));
		memcpy(&ar, rps__msg_body(buf), RPS__MIN(sizeof(ar), wc->byte_len - sizeof(mh)));
	} else {
		memset(&c->hello, 0, sizeof(c->hello));
		memcpy(&c->hello, rps__msg_body(buf), RPS__MIN(sizeof(c->hello), wc->byte_len - sizeof(mh)));
	}
	ret = rps__post_recv(c->ep, &sge, wc->wr_id);
	if (ret) {
		job_fail(j, ret);
		return;
	}
	if (want == RPS__MSG_AUTH_REP) {
		ret = rps__auth_connect_check(&j->proven, &j->t, &mh, &ar, c->name);
		rps__key_clear(&j->proven);
		if (ret == -EBUSY && job_busy(cl, j))
			return;
		if (ret) {
			job_fail(j, ret);
			return;
		}
		j->deadline = phase_deadline(cl);
		job_send_hello(cl, j);
		return;
	}
	if (mh.status) {
		job_fail(j, rps__seterr(mh.status, "%s: %s", c->name, rps__status_text(mh.status)));
		return;
	}
	ret = rps__conn_finish(cl, c);
	if (ret)
		job_fail(j, ret);
	else
		job_ok(j);
}

/* What the CQ holds: replies to the batch's jobs, and (the progress
 * thread running) the other connections' completions, which are theirs. */
static void drain_cq(struct rps_client *cl, struct rps__dial_job *jobs, const int *job_at)
{
	struct rps__wc wc[32];
	int got, i;

	while ((got = rps__cq_poll(cl->cq, wc, (int)RPS__ARRAY_SIZE(wc))) > 0)
		for (i = 0; i < got; i++) {
			struct rps__dial_job *j = job_of(cl, jobs, job_at, rps__ep_context(wc[i].ep));

			if (j && j->state == JOB_BUSY)
				continue;	/* the connection it closes: nothing of it matters */
			if (j && (j->state != JOB_AUTH && j->state != JOB_HELLO))
				j = NULL;
			if (j && (wc[i].status != RPS__WC_SUCCESS || (wc[i].wr_id & 7u) == TAG_RECV))
				job_on_recv(cl, j, &wc[i]);
			else if (cl->thread_started)
				rps__on_completion(cl, &wc[i]);	/* we hold the poller role: theirs */
		}
}

void rps__dial_batch(struct rps_client *cl, struct rps__dial_job *jobs, uint32_t n)
{
	struct pollfd *pfd = calloc((size_t)n + 1, sizeof(*pfd));
	int *job_at = malloc(MAX_CONNS * sizeof(*job_at));	/* slot -> its job here, or -1 */
	uint64_t end = rps__now_ns() + (uint64_t)cl->dial_ms * 1000000ull;
	uint32_t i, live;

	if (!job_at) {
		free(pfd);
		pfd = NULL;
	} else {
		for (i = 0; i < MAX_CONNS; i++)
			job_at[i] = -1;
		for (i = 0; i < n; i++)
			job_at[jobs[i].k] = (int)i;
	}

	for (i = 0; i < n; i++) {
		memset(&jobs[i].proven, 0, sizeof(jobs[i].proven));
		jobs[i].d = NULL;
		jobs[i].end = end;
		jobs[i].busy_tries = 0;
		jobs[i].drop = false;
		jobs[i].state = JOB_OVER;
		if (!pfd)
			job_fail(&jobs[i], rps__seterr(-ENOMEM, "out of memory"));
		else
			job_start(cl, &jobs[i]);
	}
	for (;;) {
		uint64_t now = rps__now_ns();
		int timeout = 100, np = 0;
		bool replies = false;

		for (i = 0, live = 0; i < n; i++) {
			struct rps__dial_job *j = &jobs[i];
			int ms;
			if (j->state == JOB_OVER)
				continue;
			live++;
			ms = j->deadline > now ? (int)((j->deadline - now) / 1000000ull) + 1 : 0;
			if (j->state == JOB_BUSY) {
				;	/* (its wait: the deadline) */
			} else if (j->state == JOB_DIAL) {
				short events;
				int fd = rps__dial_fd(j->d, &events);
				if (fd < 0)
					ms = 0;	/* nothing to wait on: step it at once */
				else
					pfd[np++] = (struct pollfd){ .fd = fd, .events = events };
			} else {
				replies = true;
			}
			timeout = RPS__MIN(timeout, ms);
		}
		if (!live)
			break;
		if (replies) {
			rps__cq_flush(cl->cq);	/* (TCP: what was posted behind held ACKs) */
			if (rps__cq_arm(cl->cq) != 0)
				timeout = 0;
			pfd[np++] = (struct pollfd){ .fd = rps__cq_fd(cl->cq), .events = POLLIN };
		}
		if (poll(pfd, (nfds_t)np, timeout) < 0 && errno != EINTR)
			timeout = 0;	/* (nothing to do but step and poll again) */
		now = rps__now_ns();
		for (i = 0; i < n; i++)
			if (jobs[i].state == JOB_BUSY && now >= jobs[i].deadline)
				job_start(cl, &jobs[i]);
		for (i = 0; i < n; i++)
			if (jobs[i].state == JOB_DIAL)
				job_step_dial(cl, &jobs[i]);
		drain_cq(cl, jobs, job_at);
		for (i = 0; i < n; i++)
			if (jobs[i].drop) {	/* (its queued completions go with it) */
				rps__conn_free(&cl->conns[jobs[i].k]);
				memset(&cl->conns[jobs[i].k], 0, sizeof(cl->conns[jobs[i].k]));
				jobs[i].drop = false;
			}
		now = rps__now_ns();
		for (i = 0; i < n; i++) {
			struct rps__dial_job *j = &jobs[i];
			if ((j->state == JOB_AUTH || j->state == JOB_HELLO) && now >= j->deadline)
				job_fail(j, rps__seterr(-ETIMEDOUT, "%s: no %s within %d ms: is it an rdmapsd?",
							cl->conns[j->k].name,
							rps__msg_type_name(j->state == JOB_AUTH ? RPS__MSG_AUTH_REP
												: RPS__MSG_HELLO_REP),
							cl->dial_ms));
		}
	}
	free(job_at);
	free(pfd);
}
