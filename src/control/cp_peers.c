/*
 * cp_peers.c - the control plane's connections to the other servers: who
 * dials whom (the server with the higher member id connects, so two servers
 * never wait on each other's accept), a --join server's first dials, and
 * best-effort sends over them.
 *
 * A --join server has no map until the leader sends it the log, and the
 * leader sends nothing to a member it has no connection to: when the
 * joiner's id is the higher, only the joiner can make that connection, and
 * its --cluster may name any member but the leader ("one is enough, in any
 * order", rdmapsd(8)).  So the joiner asks each seed it reached for its map
 * (STATUS over the peer connection) and dials the members that map names
 * as its own map will have it dial them: those with lower ids, by id.  The
 * rule of who dials whom stays the same, so no pair ever holds two
 * connections that each side would pick differently.
 */
#include "config.h"
#include "common/common.h"
#include "transport/uri.h"
#include "common/fault.h"
#include "control/cplane_int.h"
#include "proto/auth.h"

#include <arpa/inet.h>
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

/* Does a member's address in the map name the host a peer connected from?
 * Numeric addresses are compared; a host name is taken as it is (the map
 * is written by key holders only). */
static bool member_addr_matches(const char *uri, const char *addr)
{
	struct rps__uri u;
	struct in6_addr a6;
	struct in_addr a4;
	char host[64];

	if (rps__uri_parse(uri, &u))
		return false;
	if (inet_pton(AF_INET, u.host, &a4) != 1 && inet_pton(AF_INET6, u.host, &a6) != 1)
		return true;
	rps__auth_host(addr, host, sizeof(host));
	return !strcmp(host, u.host);
}

int rps__cp_accept_peer(void *ctx, uint64_t from_id, uint64_t to_id, const char *addr, const char **why)
{
	struct rps__cplane *cp = ctx;
	const struct rps__smap_member *m;
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
	/* (a member not in the map yet may join: it holds the cluster key) */
	m = addr ? rps__smap_member(&cp->map, from_id) : NULL;
	if (m && !member_addr_matches(m->uri, addr)) {
		rps__log(RPS__LOG_WARN, "a peer at %s says it is member %llu, whose address is %s: refused", addr,
			 (unsigned long long)from_id, m->uri);
		*why = "not the address the map gives that member";
		return -EACCES;
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

void rps__cp_peer_attached(void *ctx, struct srv_conn *c)
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

void rps__cp_on_send_done(void *ctx, struct srv_conn *c)
{
	(void)ctx;
	(void)c;
}

/* A connection went: a peer's is dialled again. */
void rps__cp_peers_gone(struct rps__cplane *cp, struct srv_conn *c)
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

static void seed_uri(const struct rps__cplane *cp, int i, char *uri, size_t len)
{
	rps__uri_str(&cp->cluster[i], uri, len);
}

/* Is a --join seed dial to this member's address under way?  (Its
 * connection, once made, counts for that member: no second one.) */
static bool seed_dial_to(const struct rps__cplane *cp, const char *member_uri)
{
	struct rps__uri u;
	char a[300], b[300];
	int i;

	if (rps__uri_parse(member_uri, &u))
		return false;
	rps__uri_str(&u, a, sizeof(a));
	for (i = 0; i < cp->ncluster; i++) {
		seed_uri(cp, i, b, sizeof(b));
		if (cp->seed_dialing[i] && !strcmp(a, b))
			return true;
	}
	return false;
}

/* A seed answered our STATUS: its map names every member and its address. */
void rps__cp_on_seed_status(struct rps__cplane *cp, struct srv_conn *c, int32_t status, const void *body, size_t len)
{
	struct rps__smap *m;
	uint32_t i;
	bool first;

	if (cp->map.nmembers || status || len <= sizeof(struct rps__status_rep))
		return;	/* (we have a map of our own now, or it has none yet) */
	m = malloc(sizeof(*m));
	if (!m)
		return;
	if (rps__smap_decode((const char *)body + sizeof(struct rps__status_rep),
			     len - sizeof(struct rps__status_rep), m)) {
		rps__log(RPS__LOG_WARN, "joining: the map from peer %llu does not decode: %s",
			 (unsigned long long)cp->dp->conn_peer_id(c), rps__errbuf());
		free(m);
		return;
	}
	first = !cp->nlearned;
	cp->nlearned = 0;	/* (a later answer is as good: the same members, or newer) */
	for (i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++)
		if (m->members[i].id != cp->my_id)
			cp->learned[cp->nlearned++] = m->members[i];
	if (first && cp->nlearned)
		rps__log(RPS__LOG_INFO, "joining: member %llu says the cluster has %u other members: dialing those "
			 "with lower ids than ours (%llu)", (unsigned long long)cp->dp->conn_peer_id(c), cp->nlearned,
			 (unsigned long long)cp->my_id);
	free(m);
}

/* Dial member m (a lower id: the higher id dials) unless connected, dialing
 * or not due again yet. */
static void peer_dial_due(struct rps__cplane *cp, const struct rps__smap_member *m, uint64_t now)
{
	struct peer *p = rps__cp_peer_get(cp, m->id, true);

	if (!p || p->c || p->dialing || now < p->next_connect)
		return;
	p->next_connect = now + PEER_RETRY_NS;
	if (!cp->dp->peer_dial(cp->srv, m->uri, m->id))
		p->dialing = true;
}

/* --join: dial each --cluster address we have no connection to, ask the
 * seeds we reached for their map, and dial the members it names (the
 * lower ids: the others dial us once we are in their map). */
static void peers_connect_seeds(struct rps__cplane *cp, uint64_t now)
{
	uint32_t j;
	int i;

	for (i = 0; i < cp->ncluster; i++) {
		char uri[300];
		uint32_t k;
		bool have = false;

		seed_uri(cp, i, uri, sizeof(uri));
		for (k = 0; k < cp->npeers; k++)
			if (cp->peers[k].c && !cp->dp->conn_dead(cp->peers[k].c) && *cp->dp->conn_name(cp->peers[k].c) &&
			    !strcmp(cp->dp->conn_name(cp->peers[k].c), uri + (strstr(uri, "://") ? strstr(uri, "://") - uri + 3 : 0)))
				have = true;
		if (have || cp->seed_dialing[i] || now < cp->seed_next[i])
			continue;
		cp->seed_next[i] = now + PEER_RETRY_NS;
		if (!cp->dp->peer_dial(cp->srv, uri, 0))
			cp->seed_dialing[i] = true;
	}
	if (!cp->nlearned && now >= cp->learn_next) {
		/* every peer we reached (one may have no map yet: another
		 * joiner), again each PEER_RETRY_NS until one had */
		for (j = 0; j < cp->npeers; j++)
			if (cp->peers[j].c && !cp->dp->conn_dead(cp->peers[j].c)) {
				cp->learn_next = now + PEER_RETRY_NS;
				cp->dp->conn_reply(cp->peers[j].c, RPS__MSG_STATUS, 0, 0, NULL, 0);
			}
	}
	for (j = 0; j < cp->nlearned; j++) {
		const struct rps__smap_member *m = &cp->learned[j];

		if (m->id < cp->my_id && !seed_dial_to(cp, m->uri))
			peer_dial_due(cp, m, now);
	}
}

/* A --join seed's dial is over. */
static void seed_dialed(struct rps__cplane *cp, const char *uri, struct srv_conn *c)
{
	char s[300];
	uint64_t id;
	struct peer *p;
	int i;

	for (i = 0; i < cp->ncluster; i++) {
		seed_uri(cp, i, s, sizeof(s));
		if (!strcmp(s, uri) && cp->seed_dialing[i]) {
			cp->seed_dialing[i] = false;
			cp->seed_next[i] = rps__now_ns() + PEER_RETRY_NS;
			break;
		}
	}
	if (!c)
		return;
	id = cp->dp->conn_peer_id(c);
	p = rps__cp_peer_get(cp, id, true);
	if (!p) {
		cp->dp->conn_fail(c, "too many peers");
		return;
	}
	if (p->c)
		cp->dp->conn_fail(p->c, "replaced by a new connection");
	p->c = c;
	rps__cp_failover_heard(cp, id);
	rps__log(RPS__LOG_INFO, "joining: connected to member %llu at %s", (unsigned long long)id, uri);
}

/* A dial the data plane ran for us is over (c NULL: it failed).  A member
 * that does not answer is dialed again PEER_RETRY_NS after its dial ended:
 * a dial no longer stops the loop, so no backing off is needed to keep a
 * dead member's dials from stalling it. */
void rps__cp_peer_dialed(void *ctx, const char *uri, uint64_t to_id, struct srv_conn *c)
{
	struct rps__cplane *cp = ctx;
	struct peer *p;

	if (c && rps__cp_isolated) {
		cp->dp->conn_fail(c, "isolated (fault injection)");
		c = NULL;
	}
	if (!to_id) {
		seed_dialed(cp, uri, c);
		return;
	}
	p = rps__cp_peer_get(cp, to_id, true);
	if (!p) {
		if (c)
			cp->dp->conn_fail(c, "too many peers");
		return;
	}
	p->dialing = false;
	p->next_connect = rps__now_ns() + PEER_RETRY_NS;
	if (!c)
		return;
	if (p->c)	/* it dialed us meanwhile: ours is the newer */
		cp->dp->conn_fail(p->c, "replaced by a new connection");
	p->c = c;
	p->inflight = 0;
	rps__cp_failover_heard(cp, to_id);
	rps__log(RPS__LOG_INFO, "connected to peer %llu at %s", (unsigned long long)to_id, uri);
}

/* Is id in one of partition p's roles (owner, backup, joiner, target)? */
static bool in_part(const struct rps__smap *m, uint32_t p, uint64_t id)
{
	return rps__smap_role(m, p, id) != RPS__SMAP_ROLE_NONE || m->parts[p].moving_to == id;
}

/*
 * Which members this server needs a peer connection with (needed[i] for
 * the map's i-th member).  Raft and leases run between each voter and
 * everybody: any voter may come to lead, and the leader reaches every
 * member.  Moves and seeds (MIGRATE, SEED, the READ of the image) run
 * between a partition's owner and the member it goes to, a planned switch
 * between it and its backups: members that share a partition need each
 * other.  Two learners that share none have nothing to say, and do not
 * hold 2 MiB of buffers each for it: with 5 voters a learner's
 * connections are the voters and its partitions' other replicas, not
 * every member (doc/scale.md).  With no configuration known yet (a joiner
 * before the log reached it), every member is needed.  Both ends compute
 * the same from the same map, and the higher id dials.
 */
static void peers_needed(const struct rps__cplane *cp, bool needed[RPS__SMAP_MAX_MEMBERS])
{
	struct rps__raft_status *st = malloc(sizeof(*st));
	bool all;
	uint32_t i, p;

	if (st)
		rps__rnode_status(cp->rnode, st);
	all = !st || !st->conf.n_voters || rps__raft_conf_is_voter(&st->conf, cp->my_id);
	for (i = 0; i < cp->map.nmembers; i++)
		needed[i] = all || rps__raft_conf_is_voter(&st->conf, cp->map.members[i].id);
	free(st);
	if (all)
		return;
	for (p = 0; p < cp->map.npart; p++) {
		if (!in_part(&cp->map, p, cp->my_id))
			continue;
		for (i = 0; i < cp->map.nmembers; i++)
			needed[i] |= in_part(&cp->map, p, cp->map.members[i].id);
	}
}

/* Connect to the members with lower ids that we need (they connect to us
 * otherwise); close, as the one that dialed, what has not been needed for
 * PEER_UNNEEDED_NS. */
void rps__cp_peers_connect(struct rps__cplane *cp, uint64_t now)
{
	bool needed[RPS__SMAP_MAX_MEMBERS];
	uint64_t unneeded_ns = PEER_UNNEEDED_NS;
	long ms;
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
	peers_needed(cp, needed);
	/* (a test closes them sooner: RPS_FAULT=peer-unneeded-ms-N) */
	if (RPS__UNLIKELY(rps__fault_arg("peer-unneeded-ms-", &ms)) && ms >= 0)
		unneeded_ns = (uint64_t)ms * 1000000ull;
	for (i = 0; i < cp->map.nmembers; i++) {
		const struct rps__smap_member *m = &cp->map.members[i];
		struct peer *p;

		if (m->id < cp->my_id && needed[i])
			peer_dial_due(cp, m, now);
		p = rps__cp_peer_get(cp, m->id, false);
		if (!p || !p->c || cp->dp->conn_dead(p->c) || needed[i]) {
			if (p)
				p->unneeded_since = 0;
			continue;
		}
		if (!p->unneeded_since)
			p->unneeded_since = now;
		else if (m->id < cp->my_id && now - p->unneeded_since >= unneeded_ns && !p->inflight)
			cp->dp->conn_fail(p->c, "closed: no longer needed (neither of us is a Raft voter, and we "
					  "share no partition)");
	}
}
