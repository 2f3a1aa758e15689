/*
 * cp_peers.c - the control plane's connections to the other servers: who
 * dials whom (the server with the higher member id connects, so two servers
 * never wait on each other's accept), a --join server's first dials, and
 * best-effort sends over them.
 */
#include "config.h"
#include "common/common.h"
#include "transport/uri.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

struct peer *rps__cp_peer_get(struct rps__cplane *cp, uint64_t id, bool add)
{
	uint32_t i;

	for (i = 0; i < cp->npeers; i++)
		if (cp->peers[i].id == id)
			return &cp->peers[i];
	if (!add || cp->npeers == RPS__SMAP_MAX_MEMBERS)
		return NULL;
	cp->peers[cp->npeers] = (struct peer){ .id = id };
	return &cp->peers[cp->npeers++];
}

void rps__cp_peer_send(struct rps__cplane *cp, uint64_t to, unsigned type, uint64_t req_id,
		       int32_t status, const void *body, size_t len)
{
	struct peer *p = rps__cp_peer_get(cp, to, false);

	if (!p || !p->c || cp->dp->conn_dead(p->c) || rps__cp_isolated)
		return;
	cp->dp->conn_reply(p->c, type, req_id, status, body, len);
}

int rps__cp_accept_peer(void *ctx, uint64_t from_id, uint64_t to_id, const char **why)
{
	struct rps__cplane *cp = ctx;
	struct peer *p;

	if (rps__cp_isolated) {
		*why = "isolated (fault injection)";
		return -ENETUNREACH;
	}
	if (to_id && to_id != cp->my_id) {	/* 0: a joining server that knows only our address */
		*why = "wrong member id: this server has another id";
		return -EINVAL;
	}
	if (!from_id || from_id == cp->my_id) {
		*why = "bad peer id";
		return -EINVAL;
	}
	p = rps__cp_peer_get(cp, from_id, true);
	if (!p) {
		*why = "too many peers";
		return -ENOSPC;
	}
	if (p->c) {	/* it reconnected: the old connection is dead to it */
		cp->dp->conn_fail(p->c, "replaced by a new connection");
		p->c = NULL;
	}
	return 0;
}

void rps__cp_peer_attached(void *ctx, struct conn *c)
{
	struct rps__cplane *cp = ctx;
	struct peer *p = rps__cp_peer_get(cp, cp->dp->conn_peer_id(c), true);

	if (p) {
		p->c = c;
		p->inflight = 0;
	}
	rps__cp_failover_heard(cp, cp->dp->conn_peer_id(c));
	rps__log(RPS__LOG_INFO, "peer %llu connected from %s", (unsigned long long)cp->dp->conn_peer_id(c),
		 cp->dp->conn_name(c));
}

void rps__cp_on_send_done(void *ctx, struct conn *c)
{
	(void)ctx;
	(void)c;
}

/* A connection went: a peer's is dialled again. */
void rps__cp_peers_gone(struct rps__cplane *cp, struct conn *c)
{
	uint32_t i;

	if (cp->dp->conn_role(c) != CONN_PEER)
		return;
	for (i = 0; i < cp->npeers; i++)
		if (cp->peers[i].c == c) {
			cp->peers[i].c = NULL;
			cp->peers[i].next_connect = rps__now_ns() + PEER_RETRY_NS / 4;
			rps__log(RPS__LOG_INFO, "peer %llu disconnected", (unsigned long long)cp->peers[i].id);
		}
	/* a partition offered over it is offered again on the next connection */
	for (i = 0; i < cp->map.npart; i++)
		if ((cp->parts[i].st == PART_SHIPPED || cp->parts[i].st == PART_SEED_SHIPPED) && cp->parts[i].to == cp->dp->conn_peer_id(c) &&
		    !cp->parts[i].installed)
			cp->parts[i].offered = false;
}

static void peers_connect_seeds(struct rps__cplane *cp, uint64_t now)
{
	int i;

	for (i = 0; i < cp->ncluster; i++) {
		char uri[300];
		uint64_t id = 0;
		struct conn *c;
		struct peer *p;
		uint32_t k;
		bool have = false;

		rps__uri_str(&cp->cluster[i], uri, sizeof(uri));
		for (k = 0; k < cp->npeers; k++)
			if (cp->peers[k].c && !cp->dp->conn_dead(cp->peers[k].c) && *cp->dp->conn_name(cp->peers[k].c) &&
			    !strcmp(cp->dp->conn_name(cp->peers[k].c), uri + (strstr(uri, "://") ? strstr(uri, "://") - uri + 3 : 0)))
				have = true;
		if (have || now < cp->seed_next[i])
			continue;
		cp->seed_next[i] = now + PEER_RETRY_NS;
		c = cp->dp->peer_dial(cp->srv, uri, 0, &id);
		if (!c)
			continue;
		p = rps__cp_peer_get(cp, id, true);
		if (!p) {
			cp->dp->conn_fail(c, "too many peers");
			continue;
		}
		if (p->c)
			cp->dp->conn_fail(p->c, "replaced by a new connection");
		p->c = c;
		rps__cp_failover_heard(cp, id);
		rps__log(RPS__LOG_INFO, "joining: connected to member %llu at %s", (unsigned long long)id, uri);
	}
}

/* Connect to the members with lower ids (they connect to us otherwise). */
void rps__cp_peers_connect(struct rps__cplane *cp, uint64_t now)
{
	uint32_t i;

	if (rps__cp_isolated) {
		for (i = 0; i < cp->npeers; i++)
			if (cp->peers[i].c && !cp->dp->conn_dead(cp->peers[i].c))
				cp->dp->conn_fail(cp->peers[i].c, "isolated (fault injection)");
		return;
	}

	if (!cp->map.nmembers) {
		peers_connect_seeds(cp, now);
		return;
	}
	for (i = 0; i < cp->map.nmembers; i++) {
		const struct rps__smap_member *m = &cp->map.members[i];
		uint64_t id = 0;
		struct peer *p;
		struct conn *c;

		if (m->id >= cp->my_id)
			continue;
		p = rps__cp_peer_get(cp, m->id, true);
		if (!p || p->c || now < p->next_connect)
			continue;
		/* The dial blocks this loop for up to its timeout when the
		 * member's host is dead (no reset, no CM reject), so a member
		 * that keeps failing is dialed less and less often (1 s,
		 * doubling up to PEER_DIAL_BACKOFF_MAX_NS) rather than every
		 * second for as long as it stays in the map. */
		if (!p->dial_backoff)
			p->dial_backoff = PEER_RETRY_NS;
		p->next_connect = now + p->dial_backoff;
		c = cp->dp->peer_dial(cp->srv, m->uri, m->id, &id);
		if (!c) {
			p->dial_backoff = RPS__MIN(p->dial_backoff * 2, PEER_DIAL_BACKOFF_MAX_NS);
			continue;
		}
		p->dial_backoff = 0;
		p->c = c;
		p->inflight = 0;
		rps__cp_failover_heard(cp, m->id);
		rps__log(RPS__LOG_INFO, "connected to peer %llu at %s", (unsigned long long)m->id, m->uri);
	}
}
