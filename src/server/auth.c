/*
 * auth.c - the handshake on the server's side of every connection
 * (proto/auth.h has the protocol).  An accepted connection sends AUTH
 * first; nothing else it sends is read, and nothing is told it (no rkey,
 * no address, no name), until its proof holds.  A connection we dial
 * (peer, replication) sends AUTH and waits in the dial table (dial.c)
 * until the other server's AUTH_REP proves it holds the cluster key too.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "server/server_int.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct srv_auth_dial {
	struct rps__key proven;
	struct rps__auth_transcript t;
};

/* Refusals are logged once a second at most, whoever sends them (who:
 * the role and address refused). */
void rps__srv_log_refusal_line(struct rps__server *srv, const char *who, const char *why)
{
	uint64_t now = rps__now_ns();

	if (now - srv->auth_log.last_ns < 1000000000ull) {
		srv->auth_log.quiet++;
		return;
	}
	if (srv->auth_log.quiet)
		rps__log(RPS__LOG_WARN, "%s refused: %s (and %llu refusals in the second before, not logged)", who,
			 why, (unsigned long long)srv->auth_log.quiet);
	else
		rps__log(RPS__LOG_WARN, "%s refused: %s", who, why);
	srv->auth_log.last_ns = now;
	srv->auth_log.quiet = 0;
}

void rps__srv_log_refusal(struct rps__server *srv, const struct srv_conn *c, const char *why)
{
	char who[128];

	snprintf(who, sizeof(who), "%s %s", rps__srv_role_name(c), rps__ep_peer(c->ep));
	rps__srv_log_refusal_line(srv, who, why);
}

void rps__srv_auth_accepted(struct rps__server *srv, struct srv_conn *c, const struct rps__conn_priv *req,
			    struct rps__conn_priv *rep)
{
	struct rps__key cur, prev;

	if (!srv->cfg.keys) {
		c->auth.authed = true;
		rps__auth_priv_init(rep, NULL);
		return;
	}
	rps__keyring_get(srv->cfg.keys, &cur, &prev);
	/* mid-rotation: answer with the key the connector has, if we have it */
	rps__auth_priv_init(rep, prev.role != RPS__KEY_NONE && req->key_id == prev.id ? &prev : &cur);
	rps__key_clear(&cur);
	rps__key_clear(&prev);
	c->auth.authed = false;
	c->auth.req = *req;
	c->auth.rep = *rep;
	c->auth.deadline_ns = rps__now_ns() + RPS__PREAUTH_TIMEOUT_MS * 1000000ull;
}

/* A dial connected: prove ourselves.  The dial stays in the table until
 * the answer. */
int rps__srv_auth_dialed(struct rps__server *srv, struct srv_conn *c, const struct rps__conn_priv *req,
			 const struct rps__conn_priv *rep, const char *uri)
{
	struct rps__key cur, prev;
	struct rps__auth msg;
	int ret;

	c->auth.dial = calloc(1, sizeof(*c->auth.dial));
	if (!c->auth.dial)
		return rps__seterr(-ENOMEM, "out of memory");
	rps__keyring_get(srv->cfg.keys, &cur, &prev);
	ret = rps__auth_connect(&cur, &prev, RPS__KEY_PEER, "", req, rep, rps__ep_local(c->ep), rps__ep_peer(c->ep),
				uri, &msg, &c->auth.dial->t, &c->auth.dial->proven);
	rps__key_clear(&cur);
	rps__key_clear(&prev);
	if (ret)
		return ret;
	c->auth.authed = false;
	c->auth.deadline_ns = rps__now_ns() + RPS__AUTH_TIMEOUT_MS * 1000000ull;
	rps__ep_set_context(c->ep, c);
	if (!c->bufs.recvs_posted) {
		uint32_t i;
		for (i = 0; i < c->bufs.nrecv; i++) {
			ret = rps__srv_post_recv(c, i);
			if (ret)
				return ret;
		}
		c->bufs.recvs_posted = true;
	}
	rps__srv_conn_reply(c, RPS__MSG_AUTH, 0, 0, &msg, sizeof(msg));
	return c->dead ? rps__seterr(-ECONNRESET, "%s: sending AUTH failed", uri) : 0;
}

void rps__srv_auth_dial_free(struct srv_conn *c)
{
	if (c->auth.dial) {
		rps__key_clear(&c->auth.dial->proven);
		free(c->auth.dial);
		c->auth.dial = NULL;
	}
}

/* Answer an AUTH with a refusal (status, and rep->why for its line),
 * then let the connection go once the answer has left: the refused
 * client reads why instead of a bare reset. */
#define REFUSAL_LINGER_NS 200000000ull

static void auth_refuse(struct rps__server *srv, struct srv_conn *c, uint64_t req_id, int status,
			const struct rps__auth_rep *rep)
{
	rps__srv_log_refusal(srv, c, rep->why);
	rps__srv_conn_reply(c, RPS__MSG_AUTH_REP, req_id, status, rep, sizeof(*rep));
	c->auth.refused = true;	/* read nothing more from it */
	c->auth.deadline_ns = rps__now_ns() + REFUSAL_LINGER_NS;
}

void rps__srv_auth_busy(struct rps__server *srv, struct srv_conn *c, const char *why)
{
	struct rps__auth_rep rep;

	if (c->auth.dial) {	/* (one we dialed: no dialer of ours waits for an answer) */
		rps__srv_log_refusal(srv, c, why);
		c->dead = true;
		return;
	}
	memset(&rep, 0, sizeof(rep));
	snprintf(rep.why, sizeof(rep.why), "%s", why);
	auth_refuse(srv, c, 0, -EBUSY, &rep);
}

/* Test hook (RPS_FAULT=auth-busy-N): the first N worker AUTHs this
 * process receives are answered "busy", as a burst's evicted ones are. */
static bool fault_auth_busy(const struct srv_conn *c)
{
	static _Atomic long left = -1;
	long n = atomic_load(&left);

	if (n < 0) {
		if (!rps__fault_arg("auth-busy-", &n) || n < 0)
			n = 0;
		atomic_store(&left, n);
	}
	while (c->role == CONN_WORKER && n > 0)
		if (atomic_compare_exchange_weak(&left, &n, n - 1))
			return true;
	return false;
}

void rps__srv_auth_on_message(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
			      const void *body)
{
	struct rps__auth_rep rep;
	enum rps__key_role role = RPS__KEY_NONE;
	char scope[RPS__SCOPE_MAX];
	const char *why = NULL;
	int ret;

	if (c->auth.refused)
		return;		/* it goes at its deadline: read nothing more */
	if (!srv->cfg.keys) {	/* (cannot be: without a key every connection is authed) */
		c->dead = true;
		return;
	}
	if (c->auth.dial) {	/* we dialed: the other server's proof */
		if (h->type != RPS__MSG_AUTH_REP) {
			rps__srv_log_refusal(srv, c, "sent something else before proving it holds the key");
			c->dead = true;
			return;
		}
		if (rps__auth_connect_check(&c->auth.dial->proven, &c->auth.dial->t, h, body,
					    rps__ep_peer(c->ep))) {
			rps__log(RPS__LOG_WARN, "%s", rps__errbuf());
			c->dead = true;
			return;
		}
		rps__srv_auth_dial_free(c);
		c->auth.authed = true;	/* the dial table hands it to its owner */
		return;
	}
	if (c->auth.proven) {	/* a server that dialed: it is ready once it says so */
		if (h->type != RPS__MSG_AUTH_DONE) {
			rps__srv_log_refusal(srv, c, "sent a request before AUTH_DONE");
			c->dead = true;
			return;
		}
		c->auth.authed = true;
		rps__srv_conn_authed(srv, c);
		return;
	}
	if (h->type != RPS__MSG_AUTH) {
		rps__srv_log_refusal(srv, c, "sent a request before AUTH");
		c->dead = true;
		return;
	}
	if (fault_auth_busy(c)) {
		rps__srv_auth_busy(srv, c, RPS__BUSY_REFUSAL " (test hook auth-busy)");
		return;
	}
	ret = rps__auth_accept(srv->cfg.keys, &c->auth.req, &c->auth.rep, body, rps__ep_local(c->ep),
			       rps__ep_peer(c->ep), &rep, &role, scope);
	if (!ret && (why = rps__srv_conn_over_budget(srv, c))) {
		/* it counts from now on: the budget is asked again (the
		 * accept's answer is old, others may have authenticated since) */
		ret = -ECONNREFUSED;
	} else if (!ret && (ret = rps__srv_conn_grow(srv, c))) {
		/* (body is read no more: its buffer went with the small ones) */
		rps__log(RPS__LOG_WARN, "%s %s: %s", rps__srv_role_name(c), rps__ep_peer(c->ep), rps__errbuf());
		why = ret == -ENOSPC ? RPS__SRV_WHY_CQ_FULL : "server out of memory: raise rdmapsd --memory-limit";
		ret = -ECONNREFUSED;
	}
	if (ret) {
		if (why) {
			memset(&rep, 0, sizeof(rep));	/* no proof of ours with it */
			snprintf(rep.why, sizeof(rep.why), "%s", why);
		}
		auth_refuse(srv, c, h->req_id, ret, &rep);
		return;
	}
	c->auth.key_role = (uint8_t)role;
	memcpy(c->auth.scope, scope, sizeof(c->auth.scope));
	rps__srv_conn_reply(c, RPS__MSG_AUTH_REP, h->req_id, 0, &rep, sizeof(rep));
	rps__log(RPS__LOG_DEBUG, "%s %s authenticated as %s%s%s", rps__srv_role_name(c), rps__ep_peer(c->ep),
		 rps__key_role_name(role), c->auth.scope[0] ? " of " : "", c->auth.scope);
	if (role == RPS__KEY_PEER) {
		/* a --threads that differs is said now (the connection goes
		 * once authed, rps__srv_conn_authed): the dialer, which says it
		 * too once our proof holds, may drop it before its AUTH_DONE
		 * reaches us */
		(void)rps__srv_peer_threads_ok(srv, c->peer_id, c->peer_threads);
		/* the dialing server hands the connection to its owner when it
		 * has checked our proof, and says so: nothing of ours may reach
		 * it before (it would find a connection no one owns yet) */
		c->auth.proven = true;
		return;
	}
	c->auth.authed = true;
	rps__srv_conn_authed(srv, c);
}

/* Accepted connections that did not authenticate in time, and refused
 * ones whose refusal had its time to leave. */
void rps__srv_auth_timers(struct rps__server *srv, uint64_t now)
{
	uint32_t i;

	if (!srv->cfg.keys)
		return;
	for (i = 0; i < srv->nconns; i++) {
		struct srv_conn *c = srv->conns[i];
		if (c->auth.authed || c->dead || now < c->auth.deadline_ns)
			continue;
		if (!c->auth.refused)
			rps__srv_log_refusal(srv, c, "no AUTH in time");
		c->dead = true;
	}
}

bool rps__srv_scope_str_allows(const struct rps__server *srv, const char *scope, size_t len, const char *name)
{
	return !srv->cfg.keys || !strncmp(name, scope, strnlen(scope, len));
}

bool rps__srv_scope_allows(const struct srv_conn *c, const char *name)
{
	return rps__srv_scope_str_allows(c->srv, c->auth.scope, sizeof(c->auth.scope), name);
}

bool rps__srv_same_scope(const struct srv_conn *a, const struct srv_conn *b)
{
	return !strncmp(a->auth.scope, b->auth.scope, sizeof(a->auth.scope));
}
