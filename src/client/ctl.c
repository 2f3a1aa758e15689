/*
 * ctl.c - blocking request/reply channel from psctl to one rdmapsd (ctl.h).
 *
 * Layout: NRECV receive buffers of RPS__BIG_MSG_MAX bytes in one registered
 * region, posted as soon as the endpoint exists and reposted after every
 * completion, and one send buffer.  A call posts one signaled SEND and polls
 * the channel's own CQ until both its send completion and the reply with its
 * req_id are in; replies to other req_ids (late answers to a call that
 * timed out) are dropped.  The send buffer is only reused once the previous
 * SEND completed.
 */
#include "config.h"
#include "client/ctl.h"
#include "proto/auth.h"
#include "common/common.h"
#include "proto/proto.h"
#include "transport/transport.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NRECV 4u
#define SEND_WRID (1ull << 32)
#define DEFAULT_TIMEOUT_MS 30000
#define BUF_ALIGN 4096u

struct rps__ctl {
	struct rps__fabric *fab;
	struct rps__cq *cq;
	struct rps__ep *ep;
	char *rbufs;			/* NRECV * RPS__BIG_MSG_MAX */
	char *sbuf;			/* RPS__BIG_MSG_MAX */
	struct rps__mr *rmr, *smr;
	uint64_t next_req;
	int timeout_ms;
	uint64_t spin_ns;
	bool send_busy;			/* a SEND whose completion has not been seen */
	bool dead;			/* the endpoint failed: only close is left */
	char name[300];
};

/* What one call waits for. */
struct pending {
	uint64_t req_id;
	unsigned type;			/* the request's type */
	void *reply;
	size_t cap;
	size_t *reply_len;
	int32_t *status;
	bool done;
};

void rps__ctl_close(struct rps__ctl *ctl)
{
	if (!ctl)
		return;
	rps__ep_close(ctl->ep);
	rps__cq_destroy(ctl->cq);
	rps__mr_dereg(ctl->rmr);
	rps__mr_dereg(ctl->smr);
	free(ctl->rbufs);
	free(ctl->sbuf);
	rps__fabric_close(ctl->fab);
	free(ctl);
}

static int alloc_reg(struct rps__ctl *ctl, size_t len, char **buf, struct rps__mr **mr)
{
	void *p = NULL;
	int ret;

	if (posix_memalign(&p, BUF_ALIGN, len))
		return rps__seterr(-ENOMEM, "out of memory for %zu bytes of message buffers", len);
	memset(p, 0, len);
	ret = rps__mr_reg(ctl->fab, p, len, RPS__ACCESS_LOCAL, mr);
	if (ret) {
		free(p);
		return rps__preerr(ret, "%s: registering message buffers", ctl->name);
	}
	*buf = p;
	return 0;
}

/* The transport says "connect to HOST:PORT: why: what to do"; we name the
 * URI ourselves, so keep only what follows that prefix.  Copied out: the
 * message is about to be replaced. */
static const char *transport_reason(char *buf, size_t len)
{
	const char *e = rps__errbuf(), *p;

	if (!strncmp(e, "connect to ", 11) && (p = strstr(e, ": ")) != NULL)
		e = p + 2;
	snprintf(buf, len, "%s", e);
	return buf;
}

static int connect_error(struct rps__ctl *ctl, int ret, const char *reply, size_t reply_len, bool keyless)
{
	char reason[RPS__PRIVDATA_MAX + 1], old[512], local[PATH_MAX] = "~/.rdmaps/" RPS__LOCAL_KEY_NAME;
	size_t i;

	if (ret == -ECONNREFUSED && reply_len > 0 && reply && reply[0] >= ' ') {
		/* rdmapsd rejected us and said why (NUL-terminated text, maybe cut) */
		for (i = 0; i < reply_len && i < RPS__PRIVDATA_MAX && reply[i] >= ' '; i++)
			reason[i] = reply[i];
		reason[i] = '\0';
		if (keyless && !strncmp(reason, "key required", 12)) {
			rps__local_key_path(local, sizeof(local));
			rps__clearerr();
			return rps__seterr(ret, "connect %s: refused by the server: %s (a server started without "
					   "--key takes its user's %s)", ctl->name, reason, local);
		}
		return rps__seterr(ret, "connect %s: refused by the server: %s", ctl->name, reason);
	}
	switch (ret) {
	case -ECONNREFUSED:
		return rps__seterr(ret, "connect %s: Connection refused: is rdmapsd running there?", ctl->name);
	case -ETIMEDOUT:
		return rps__seterr(ret, "connect %s: no answer within %d ms: is the host up, the address right "
				   "and rdmapsd serving?", ctl->name, ctl->timeout_ms);
	default:
		return rps__seterr(ret, "connect %s: %s", ctl->name, transport_reason(old, sizeof(old)));
	}
}

int rps__ctl_open(const struct rps__uri *u, int timeout_ms, struct rps__ctl **out)
{
	struct rps__conn_priv priv = {
		.magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .role = RPS__ROLE_ADMIN,
	};
	struct rps__conn_priv rp;
	struct rps__key key = { .role = RPS__KEY_NONE };
	const char *key_path = rps__key_path(NULL), *insecure = getenv("RDMAPS_INSECURE");
	char local[PATH_MAX];
	struct rps__fabric_attr fattr = { 0 };
	struct rps__ep_attr attr = { 0 };
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t reply_len = RPS__PRIVDATA_MAX;
	struct rps__ctl *ctl;
	uint64_t end;
	uint32_t i;
	int ret;

	*out = NULL;
	ctl = calloc(1, sizeof(*ctl));
	if (!ctl)
		return rps__seterr(-ENOMEM, "out of memory");
	rps__uri_str(u, ctl->name, sizeof(ctl->name));
	ctl->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
	ctl->next_req = 1;
	/* the same rule as rps_client_connect: the key from RDMAPS_KEY_FILE
	 * (psctl --key sets it), else to a loopback server this user's
	 * loopback key if there is one, no key only on loopback unless
	 * insecure */
	if (!key_path && !(insecure && !strcmp(insecure, "1")) && rps__host_is_loopback(u->host)) {
		ret = rps__local_key_find(local, sizeof(local));
		if (ret && ret != -ENOENT)
			goto err;
		if (!ret)
			key_path = local;
	}
	if (key_path && (ret = rps__key_load(key_path, &key)))
		goto err;
	if (!key_path && !(insecure && !strcmp(insecure, "1")) && !rps__host_is_loopback(u->host)) {
		ret = rps__seterr(-EACCES, "connect %s: no key: give --key FILE (or RDMAPS_KEY_FILE; psctl keygen "
				  "makes one), or --insecure on a trusted network", ctl->name);
		goto err;
	}
	rps__auth_priv_init(&priv, key_path ? &key : NULL);
	fattr.kind = u->kind;
	fattr.host = u->kind == RPS__KIND_VERBS ? u->host : NULL;	/* the device that routes there */
	ret = rps__fabric_open(&fattr, &ctl->fab);
	if (ret) {
		ret = rps__preerr(ret, "connect %s", ctl->name);
		ctl->fab = NULL;
		goto err;
	}
	ret = rps__cq_create(ctl->fab, 4 * NRECV + 8, &ctl->cq);
	if (ret) {
		ret = rps__preerr(ret, "connect %s", ctl->name);
		goto err;
	}
	ret = alloc_reg(ctl, (size_t)NRECV * RPS__BIG_MSG_MAX, &ctl->rbufs, &ctl->rmr);
	if (!ret)
		ret = alloc_reg(ctl, RPS__BIG_MSG_MAX, &ctl->sbuf, &ctl->smr);
	if (ret)
		goto err;
	attr.sq_depth = 8;
	attr.rq_depth = NRECV;
	/* a server busy with a burst of handshakes from our address (a job's
	 * ranks starting on this host) refuses us at connect for a moment:
	 * dial again within our time, as librdmaps does (dialer.c) */
	end = rps__now_ns() + (uint64_t)ctl->timeout_ms * 1000000ull;
	for (uint32_t busy = 0;;) {
		uint64_t now = rps__now_ns();

		memset(reply, 0, sizeof(reply));
		reply_len = RPS__PRIVDATA_MAX;
		ret = rps__connect(ctl->fab, u->host, u->port, ctl->cq, &attr, &priv, sizeof(priv),
				   (int)RPS__MAX(1u, (end - RPS__MIN(now, end)) / 1000000ull), reply, &reply_len,
				   &ctl->ep);
		if (ret != -ECONNREFUSED || strncmp(reply, RPS__BUSY_REFUSAL, strlen(RPS__BUSY_REFUSAL)) ||
		    !rps__busy_sleep(&busy, (uint32_t)getpid(), end))
			break;
	}
	if (ret) {
		ctl->ep = NULL;
		ret = connect_error(ctl, ret, reply, reply_len, !key_path);
		goto err;
	}
	/* Before anything is sent: the server only ever answers, so every
	 * reply finds a buffer (the TCP transport delivers nothing before our
	 * first poll; verbs' accept waits for our confirmation). */
	for (i = 0; i < NRECV; i++) {
		struct rps__sge sge = {
			.addr = ctl->rbufs + (size_t)i * RPS__BIG_MSG_MAX, .len = RPS__BIG_MSG_MAX, .mr = ctl->rmr,
		};
		ret = rps__post_recv(ctl->ep, &sge, i);
		if (ret) {
			ret = rps__preerr(ret, "connect %s: posting receive buffers", ctl->name);
			goto err;
		}
	}
	if (key_path) {	/* both prove they hold the key (proto/auth.h) */
		struct rps__key proven;
		struct rps__auth msg;
		struct rps__auth_rep ar;
		struct rps__auth_transcript t;
		struct rps__msg_hdr h = { 0 };
		size_t got = 0;

		memset(&rp, 0, sizeof(rp));
		memcpy(&rp, reply, RPS__MIN(reply_len, sizeof(rp)));
		if (key_path == local && !rp.key_id) {
			ret = rps__seterr(-EACCES, "connect %s: the server takes no key (rdmapsd --insecure: every "
					  "local user gets in): not trusted with this user's loopback key; --insecure "
					  "talks to it anyway", ctl->name);
			goto err;
		}
		ret = rps__auth_connect(&key, NULL, RPS__KEY_ADMIN, "", &priv, &rp, rps__ep_local(ctl->ep),
					rps__ep_peer(ctl->ep), ctl->name, &msg, &t, &proven);
		if (!ret)
			ret = rps__ctl_call(ctl, RPS__MSG_AUTH, &msg, sizeof(msg), &ar, sizeof(ar), &got, &h.status, 0);
		if (!ret)
			ret = rps__auth_connect_check(&proven, &t, &h, &ar, ctl->name);
		rps__key_clear(&proven);
		if (ret)
			goto err;
	}
	rps__key_clear(&key);
	*out = ctl;
	return 0;

err:
	rps__key_clear(&key);
	rps__ctl_close(ctl);
	return ret;
}

static int conn_lost(struct rps__ctl *ctl, const struct pending *p, enum rps__wc_status st)
{
	ctl->dead = true;
	if (p)
		return rps__seterr(-ECONNRESET, "%s: connection lost waiting for the reply to %s (%s): "
				   "did rdmapsd stop or restart?", ctl->name,
				   rps__msg_type_name(p->type), rps__wc_status_str(st));
	return rps__seterr(-ECONNRESET, "%s: connection lost (%s): did rdmapsd stop or restart?",
			   ctl->name, rps__wc_status_str(st));
}

/* Take one received message: if it answers p, copy it out.  The buffer is
 * reposted in every case. */
static int take_recv(struct rps__ctl *ctl, const struct rps__wc *wc, struct pending *p)
{
	struct rps__msg_hdr h;
	uint32_t idx = (uint32_t)wc->wr_id;
	char *buf;
	size_t body;
	int ret = 0, ret2;

	if (idx >= NRECV)
		return 0;
	buf = ctl->rbufs + (size_t)idx * RPS__BIG_MSG_MAX;
	if (p && !p->done) {
		ret = rps__msg_check(buf, wc->byte_len);
		if (ret) {
			ret = rps__preerr(-EBADMSG, "%s: bad reply to %s", ctl->name, rps__msg_type_name(p->type));
			goto repost;
		}
		memcpy(&h, buf, sizeof(h));
		if (h.req_id != p->req_id)
			goto repost;	/* a late reply to a call that gave up */
		if (h.type != p->type + 1) {
			ret = rps__seterr(-EBADMSG, "%s: expected the reply to %s, got a %s message: "
					  "is that an rdmapsd of this release?", ctl->name,
					  rps__msg_type_name(p->type), rps__msg_type_name(h.type));
			goto repost;
		}
		body = wc->byte_len - sizeof(h);
		if (body > p->cap) {
			ret = rps__seterr(-EMSGSIZE, "%s: reply to %s of %zu bytes exceeds the %zu-byte buffer",
					  ctl->name, rps__msg_type_name(p->type), body, p->cap);
			goto repost;
		}
		if (body)
			memcpy(p->reply, rps__msg_body(buf), body);
		if (p->reply_len)
			*p->reply_len = body;
		if (p->status)
			*p->status = h.status;
		p->done = true;
	}
repost:
	{
		struct rps__sge sge = { .addr = buf, .len = RPS__BIG_MSG_MAX, .mr = ctl->rmr };
		ret2 = rps__post_recv(ctl->ep, &sge, idx);
		if (ret2) {
			ctl->dead = true;
			return rps__preerr(-ECONNRESET, "%s: reposting a receive buffer", ctl->name);
		}
	}
	return ret;
}

/* Poll until p->done (p NULL: until the outstanding SEND completed), or the
 * deadline (0: none).  Returns 0, -ETIMEDOUT (no message set), or an error. */
static int progress(struct rps__ctl *ctl, struct pending *p, uint64_t deadline)
{
	uint64_t start = rps__now_ns();
	struct rps__wc wc;
	int ret;

	while (p ? !p->done : ctl->send_busy) {
		int slice = 1000;

		if (deadline) {
			uint64_t now = rps__now_ns();
			if (now >= deadline)
				return -ETIMEDOUT;
			if ((deadline - now) / 1000000u < (uint64_t)slice)
				slice = (int)((deadline - now) / 1000000u) + 1;
		}
		/* busy-poll (rps__ctl_set_spin) before sleeping on the fd */
		ret = ctl->spin_ns && rps__now_ns() - start < ctl->spin_ns ? rps__cq_poll(ctl->cq, &wc, 1) :
		      rps__cq_wait(ctl->cq, &wc, 1, slice);
		if (ret < 0) {
			ctl->dead = true;
			return rps__preerr(-ECONNRESET, "%s: polling the completion queue", ctl->name);
		}
		if (ret == 0)
			continue;
		if (wc.status != RPS__WC_SUCCESS)
			return conn_lost(ctl, p, wc.status);
		if (wc.wr_id == SEND_WRID) {
			ctl->send_busy = false;
			continue;
		}
		if (wc.opcode != RPS__WC_RECV)
			continue;
		ret = take_recv(ctl, &wc, p);
		if (ret)
			return ret;
	}
	return 0;
}

int rps__ctl_call(struct rps__ctl *ctl, unsigned type, const void *body, size_t len,
		  void *reply, size_t cap, size_t *reply_len, int32_t *status, int timeout_ms)
{
	struct pending p = {
		.type = type, .reply = reply, .cap = reply ? cap : 0, .reply_len = reply_len, .status = status,
	};
	struct rps__wr wr = { 0 };
	uint64_t deadline = 0;
	size_t n;
	int ret;

	if (reply_len)
		*reply_len = 0;
	if (status)
		*status = 0;
	if (ctl->dead)
		return rps__seterr(-ECONNRESET, "%s: the connection failed earlier: reconnect", ctl->name);
	if (sizeof(struct rps__msg_hdr) + len > RPS__BIG_MSG_MAX)
		return rps__seterr(-EMSGSIZE, "%s: a %s request of %zu bytes exceeds the %u-byte message limit",
				   ctl->name, rps__msg_type_name(type), len, RPS__BIG_MSG_MAX);
	if (timeout_ms == 0)
		timeout_ms = ctl->timeout_ms;
	if (timeout_ms > 0)
		deadline = rps__now_ns() + (uint64_t)timeout_ms * 1000000u;

	/* The previous SEND still owns the buffer (it completes right after
	 * its reply came, normally). */
	ret = progress(ctl, NULL, deadline);
	if (ret == -ETIMEDOUT) {
		ctl->dead = true;
		return rps__seterr(-ECONNRESET, "%s: an earlier request never left: the connection is stuck, "
				   "reconnect", ctl->name);
	}
	if (ret)
		return ret;

	p.req_id = ctl->next_req++;
	n = rps__msg_build(ctl->sbuf, type, p.req_id, 0, body, len);
	wr.wr_id = SEND_WRID;
	wr.op = RPS__OP_SEND;
	wr.flags = RPS__WR_SIGNALED;
	wr.sge.addr = ctl->sbuf;
	wr.sge.len = (uint32_t)n;
	wr.sge.mr = ctl->smr;
	ret = rps__post(ctl->ep, &wr, 1);
	if (ret) {
		ctl->dead = true;
		return rps__preerr(-ECONNRESET, "%s: sending %s", ctl->name, rps__msg_type_name(type));
	}
	ctl->send_busy = true;

	/* Returns once the reply is in; the SEND's completion, if not seen
	 * yet, is collected by the next call. */
	ret = progress(ctl, &p, deadline);
	if (ret == -ETIMEDOUT)
		return rps__seterr(-ETIMEDOUT, "%s: no reply to %s within %d ms: the server is busy or stuck; "
				   "retry with a longer timeout", ctl->name, rps__msg_type_name(type), timeout_ms);
	return ret;
}

void rps__ctl_set_spin(struct rps__ctl *ctl, int spin_us)
{
	ctl->spin_ns = spin_us > 0 ? (uint64_t)spin_us * 1000u : 0;
}
