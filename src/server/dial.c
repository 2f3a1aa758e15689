/*
 * dial.c - the server's outgoing connections (PEER for the control plane,
 * REPL both ways) while they are under way.  A dial must not stop the loop:
 * a peer whose host died without a reset answers nothing, and a blocking
 * connect held the loop (Raft heartbeats, lease grants, failover, every
 * worker) for its whole timeout, dial after dial.  So a dial is started
 * (rps__dial_start), its descriptor joins the loop's poll() and its
 * deadline the loop's timeout, and each turn steps it; when it is over,
 * connected or not, its owner finishes it (dataplane.c for PEER, repl_stream.c
 * for REPL).  Until then the connection is in no table: work for it
 * (replication entries, peer messages) waits as it does for a connection
 * that is down.
 */
#include "config.h"
#include "common/common.h"
#include "server/server_int.h"
#include "server/repl.h"
#include "transport/uri.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rps__srv_dial(struct rps__server *srv, struct srv_conn *c, enum srv_dial_kind kind, uint64_t to_id,
		  const char *uri, const struct rps__conn_priv *priv, const struct rps__ep_attr *attr,
		  int timeout_ms)
{
	struct srv_dial *d;
	struct rps__uri u;
	int ret;

	if (rps__grow(&srv->dial.dials, &srv->dial.dials_cap, srv->dial.ndials + 1, sizeof(*srv->dial.dials), 8))
		return rps__seterr(-ENOMEM, "out of memory");
	if (strlen(uri) >= sizeof(d->uri))	/* its owner finds it by its uri */
		return rps__seterr(-ENAMETOOLONG, "dial %s: address too long", uri);
	ret = rps__uri_parse(uri, &u);
	if (ret)
		return ret;
	d = &srv->dial.dials[srv->dial.ndials];
	memset(d, 0, sizeof(*d));
	d->priv = *priv;
	if (srv->cfg.keys) {	/* our key's id and a fresh nonce (auth.c) */
		struct rps__key cur;
		rps__keyring_get(srv->cfg.keys, &cur, NULL);
		rps__auth_priv_init(&d->priv, &cur);
		rps__key_clear(&cur);
	}
	c->cq_full = attr->sq_depth + attr->rq_depth;
	ret = rps__srv_cq_charge(srv, c, c->cq_full);
	if (ret)
		return ret;
	ret = rps__dial_start(srv->fab, u.host, u.port, srv->cq, attr, &d->priv, sizeof(d->priv), timeout_ms, &d->d);
	if (ret)
		return ret;
	d->c = c;
	d->kind = kind;
	d->to_id = to_id;
	snprintf(d->uri, sizeof(d->uri), "%s", uri);
	d->deadline = rps__now_ns() + (uint64_t)timeout_ms * 1000000ull;
	srv->dial.ndials++;
	return 0;
}

bool rps__srv_dialing(const struct rps__server *srv, enum srv_dial_kind kind, uint64_t to_id)
{
	uint32_t i;

	for (i = 0; i < srv->dial.ndials; i++)
		if (srv->dial.dials[i].kind == kind && srv->dial.dials[i].to_id == to_id)
			return true;
	return false;
}

static void finish(struct rps__server *srv, struct srv_dial *d, int ret, const struct rps__conn_priv *rp)
{
	if (d->kind == SRV_DIAL_PEER)
		rps__srv_peer_dialed(srv, d->c, ret, d->to_id, d->uri, rp);
	else
		rps__srv_repl_dialed(srv, d->c, d->kind == SRV_DIAL_REPL_REV, ret, d->to_id, d->uri, rp);
}

void rps__srv_dials_turn(struct rps__server *srv)
{
	uint32_t i = 0;

	while (i < srv->dial.ndials) {
		struct srv_dial d = srv->dial.dials[i];
		struct rps__conn_priv rp;
		char reply[RPS__PRIVDATA_MAX + 1];
		size_t reply_len = RPS__PRIVDATA_MAX;
		int ret;

		if (d.authing) {	/* connected: waiting for the other's proof (auth.c) */
			if (d.c->auth.authed) {
				/* ready: the other server may talk from now on */
				rps__srv_conn_reply(d.c, RPS__MSG_AUTH_DONE, 0, 0, NULL, 0);
				ret = d.c->dead ? rps__seterr(-ECONNRESET, "%s: the handshake failed", d.uri) : 0;
			}
			else if (d.c->dead)
				ret = rps__seterr(-EACCES, "%s: the handshake failed", d.uri);
			else if (rps__now_ns() >= d.deadline)
				ret = rps__seterr(-ETIMEDOUT, "%s: no AUTH_REP in time", d.uri);
			else {
				i++;
				continue;
			}
			memmove(&srv->dial.dials[i], &srv->dial.dials[i + 1], (srv->dial.ndials - i - 1) * sizeof(d));
			srv->dial.ndials--;
			finish(srv, &d, ret, &d.rp);
			continue;
		}
		memset(reply, 0, sizeof(reply));
		ret = rps__dial_step(d.d, reply, &reply_len, &d.c->ep);
		if (ret == -EINPROGRESS) {
			i++;
			continue;
		}
		/* over (the dial freed itself): out of the table before its
		 * owner runs, which may start another */
		memmove(&srv->dial.dials[i], &srv->dial.dials[i + 1], (srv->dial.ndials - i - 1) * sizeof(d));
		srv->dial.ndials--;
		memset(&rp, 0, sizeof(rp));
		if (!ret) {
			memcpy(&rp, reply, RPS__MIN(reply_len, sizeof(rp)));
			if (reply_len < sizeof(rp))
				rp.from_id = 0;	/* not an rdmapsd: the owner refuses it */
		}
		if (!ret && srv->cfg.keys && rp.from_id) {
			/* prove ourselves; the owner hears of it once the other did */
			ret = rps__srv_auth_dialed(srv, d.c, &d.priv, &rp, d.uri);
			if (!ret) {
				d.d = NULL;
				d.rp = rp;
				d.authing = true;
				d.deadline = rps__now_ns() + RPS__AUTH_TIMEOUT_MS * 1000000ull;
				srv->dial.dials[srv->dial.ndials++] = d;	/* (room: it was just taken out) */
				continue;
			}
			rps__log(RPS__LOG_WARN, "%s", rps__errbuf());
		}
		finish(srv, &d, ret, &rp);
	}
}

int rps__srv_dials_poll(struct rps__server *srv, struct pollfd *pfd, int max, uint64_t now, int *timeout)
{
	uint32_t i;
	int n = 0;

	for (i = 0; i < srv->dial.ndials; i++) {
		const struct srv_dial *d = &srv->dial.dials[i];
		short events;
		int fd = d->authing ? -1 : rps__dial_fd(d->d, &events);
		int ms = d->deadline > now ? (int)((d->deadline - now) / 1000000ull) + 1 : 0;

		if (d->authing)
			;	/* the CQ wakes the loop for AUTH_REP; the deadline for the rest */
		else if (fd < 0 || n == max)
			ms = 0;	/* nothing to wait on (or no room): step it at once */
		else
			pfd[n++] = (struct pollfd){ .fd = fd, .events = events };
		if (ms < *timeout)
			*timeout = ms;
	}
	return n;
}

void rps__srv_dials_fini(struct rps__server *srv)
{
	while (srv->dial.ndials) {
		struct srv_dial *d = &srv->dial.dials[--srv->dial.ndials];
		rps__dial_cancel(d->d);
		rps__srv_conn_free(srv, d->c);
	}
	free(srv->dial.dials);
	srv->dial.dials = NULL;
	srv->dial.dials_cap = 0;
}
