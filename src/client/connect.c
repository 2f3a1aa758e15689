/*
 * connect.c - the client's connections: buffers registered near the HCA,
 * connect + HELLO, reading the shard map, connecting to its members.
 */
#include "config.h"
#include "common/common.h"
#include "client/client_int.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- connection setup ------------------------------------------------- */

int rps__alloc_reg(struct rps_client *cl, size_t len, int access, char **buf, struct rps__mr **mr)
{
	void *p = NULL;
	int ret;

	p = rps__topo_alloc(cl->topo, &cl->place, len);
	if (!p)
		return rps__seterr(-ENOMEM, "out of memory for %zu bytes of buffers", len);
	ret = rps__mr_reg(cl->fab, p, len, access, mr);
	if (ret) {
		rps__topo_free(cl->topo, p, len);
		return ret;
	}
	*buf = p;
	return 0;
}

void rps__free_reg(struct rps_client *cl, char **buf, struct rps__mr **mr, size_t len)
{
	rps__mr_dereg(*mr);
	*mr = NULL;
	if (*buf)
		rps__topo_free(cl->topo, *buf, len);
	*buf = NULL;
}

static void conn_unstage(struct conn *c);

void rps__conn_free(struct conn *c)
{
	if (c->ep)
		rps__ep_close(c->ep);
	c->ep = NULL;
	conn_unstage(c);
	rps__free_reg(c->cl, &c->rbufs, &c->rbufs_mr, (size_t)c->nrecv * RPS__MSG_MAX);
	rps__free_reg(c->cl, &c->sbufs, &c->sbufs_mr, (size_t)CTRL_CREDITS * RPS__MSG_MAX);
	free(c->lost_epochs);
	c->lost_epochs = NULL;
	c->nlost_epochs = 0;
}

void rps__conn_note_lost(struct rps_client *cl, struct conn *c)
{
	uint32_t p, n = cl->map.npart;

	c->lost_ns = rps__now_ns();
	if (c->nlost_epochs != n) {
		free(c->lost_epochs);
		c->nlost_epochs = 0;
		/* (no memory: no evidence either way, FAILOVER_WAIT_MS decides) */
		if (!n || !(c->lost_epochs = calloc(n, sizeof(*c->lost_epochs))))
			return;
		c->nlost_epochs = n;
	}
	for (p = 0; p < n; p++)
		c->lost_epochs[p] = cl->map.parts[p].owner == c->member_id ? cl->map.parts[p].epoch : 0;
}

/* One request before the progress thread takes the connection (AUTH,
 * HELLO): send it and poll the CQ here for its reply, of type rep_type,
 * whose body (len bytes) goes to rep.  A refusal's status is returned
 * with the header in *h (the body is copied too: AUTH_REP says why). */
static int call_sync(struct rps_client *cl, struct conn *c, unsigned type, const void *body, size_t len,
		     unsigned rep_type, void *rep, size_t rep_len, struct rps__msg_hdr *hout)
{
	uint64_t deadline = rps__now_ns() + (uint64_t)cl->dial_ms * 1000000ull;
	struct rps__wc wc;
	int ret;

	ret = rps__send_ctrl(c, 0, type, body, len);
	if (ret)
		return rps__preerr(ret, "%s: sending %s", c->name, rps__msg_type_name(type));
	while (rps__now_ns() < deadline) {
		struct rps__msg_hdr mh;
		char *buf;
		uint32_t i;

		ret = rps__cq_wait(cl->cq, &wc, 1, 100);
		if (ret < 0)
			return ret;
		if (ret == 0)
			continue;
		if (wc.status != RPS__WC_SUCCESS && rps__ep_context(wc.ep) == c)
			return rps__seterr(-ECONNRESET, "%s: connection failed during %s: %s", c->name,
					   rps__msg_type_name(type), rps__wc_status_str(wc.status));
		if ((wc.wr_id & 7u) != TAG_RECV || rps__ep_context(wc.ep) != c) {
			if (cl->thread_started)
				rps__on_completion(cl, &wc);	/* we hold the poller role: theirs */
			continue;
		}
		i = (uint32_t)(wc.wr_id >> 3);
		buf = c->rbufs + (size_t)i * RPS__MSG_MAX;
		ret = rps__msg_check(buf, wc.byte_len);
		if (ret)
			return rps__preerr(ret, "%s", c->name);
		memcpy(&mh, buf, sizeof(mh));
		if (mh.type != rep_type)
			return rps__seterr(-EPROTO, "%s: expected %s, got %s", c->name, rps__msg_type_name(rep_type),
					   rps__msg_type_name(mh.type));
		memset(rep, 0, rep_len);
		memcpy(rep, rps__msg_body(buf), RPS__MIN(rep_len, wc.byte_len - sizeof(mh)));
		if (hout)
			*hout = mh;
		{
			struct rps__sge sge = { .addr = buf, .len = RPS__MSG_MAX, .mr = c->rbufs_mr };
			ret = rps__post_recv(c->ep, &sge, wc.wr_id);
			if (ret)
				return ret;
		}
		if (mh.status && !hout)
			return rps__seterr(mh.status, "%s: %s", c->name, rps__status_text(mh.status));
		return 0;
	}
	return rps__seterr(-ETIMEDOUT, "%s: no %s within %d ms: is it an rdmapsd?", c->name,
			   rps__msg_type_name(rep_type), cl->dial_ms);
}

/* The HELLO that opens a worker's session. */
void rps__conn_hello_msg(const struct rps_client *cl, struct rps__hello *h)
{
	memset(h, 0, sizeof(*h));
	h->magic = RPS__HELLO_MAGIC;
	h->version = RPS__PROTO_VERSION;
	h->rank = cl->rank;
	h->num_workers = cl->num_workers;
	h->client_id = cl->client_id;
	h->flags = cl->takeover ? RPS__HELLO_TAKEOVER : 0;
}

/* HELLO before the progress thread runs. */
static int hello_sync(struct rps_client *cl, struct conn *c)
{
	struct rps__hello h;

	rps__conn_hello_msg(cl, &h);
	return call_sync(cl, c, RPS__MSG_HELLO, &h, sizeof(h), RPS__MSG_HELLO_REP, &c->hello, sizeof(c->hello),
			 NULL);
}

int rps__conn_auth_msg(struct rps_client *cl, struct conn *c, const struct rps__conn_priv *req,
		       const struct rps__conn_priv *rep, struct rps__auth *msg, struct rps__auth_transcript *t,
		       struct rps__key *proven)
{
	struct rps__key cur;
	int ret;

	rps__keyring_get(cl->keys, &cur, NULL);
	ret = rps__auth_connect(&cur, NULL, cur.role == RPS__KEY_READER ? RPS__KEY_READER : RPS__KEY_WORKER,
				cur.scope, req, rep, rps__ep_local(c->ep), rps__ep_peer(c->ep), c->name, msg, t,
				proven);
	rps__key_clear(&cur);
	return ret;
}

/* Both sides prove they hold the key (proto/auth.h), before anything else. */
static int auth_sync(struct rps_client *cl, struct conn *c, const struct rps__conn_priv *req,
		     const struct rps__conn_priv *rep)
{
	struct rps__key proven;
	struct rps__auth msg;
	struct rps__auth_rep ar;
	struct rps__auth_transcript t;
	struct rps__msg_hdr h;
	int ret;

	ret = rps__conn_auth_msg(cl, c, req, rep, &msg, &t, &proven);
	if (!ret)
		ret = call_sync(cl, c, RPS__MSG_AUTH, &msg, sizeof(msg), RPS__MSG_AUTH_REP, &ar, sizeof(ar), &h);
	if (!ret)
		ret = rps__auth_connect_check(&proven, &t, &h, &ar, c->name);
	rps__key_clear(&proven);
	return ret;
}

int rps__conn_begin(struct rps_client *cl, struct conn *c, const struct rps__uri *u, int index,
		    struct rps__conn_priv *priv, struct rps__ep_attr *attr)
{
	struct rps__key cur;
	uint32_t need;
	int ret;

	memset(priv, 0, sizeof(*priv));
	priv->magic = RPS__DESC_MAGIC;
	priv->version = RPS__PROTO_VERSION;
	priv->role = 1;
	memset(attr, 0, sizeof(*attr));
	c->cl = cl;
	c->index = index;
	c->uri = *u;
	rps__uri_str(u, c->name, sizeof(c->name));
	c->nrecv = CONN_RQ_DEPTH;	/* (the server's send window) */
	/* room on the shared CQ for every endpoint's queues (indexes are
	 * dense: a dead connection's is reused for its member and thread),
	 * twice over where the device allows, as a server's (a closed
	 * endpoint's flushed completions may wait beside its successor's);
	 * once over is the least */
	need = (uint32_t)(index + 1) * CONN_CQ_SHARE;
	ret = rps__cq_grow(cl->cq, 2 * need);
	if (ret == -ENOSPC && !(ret = rps__cq_grow(cl->cq, need)))
		rps__clearerr();
	if (ret)
		return ret;
	ret = rps__alloc_reg(cl, (size_t)c->nrecv * RPS__MSG_MAX, RPS__ACCESS_LOCAL, &c->rbufs, &c->rbufs_mr);
	if (ret)
		return ret;
	ret = rps__alloc_reg(cl, (size_t)CTRL_CREDITS * RPS__MSG_MAX, RPS__ACCESS_LOCAL, &c->sbufs, &c->sbufs_mr);
	if (ret)
		return ret;
	attr->sq_depth = CONN_SQ_DEPTH;
	attr->rq_depth = c->nrecv;
	attr->max_inline = 64;
	if ((!cl->keys || cl->keys_local) && !cl->insecure && !rps__host_is_loopback(u->host))
		return rps__seterr(-EACCES, "connecting to %s without a key: give a key file (RDMAPS_KEY_FILE, made "
				   "by psctl keygen), or set insecure on a trusted network", c->name);
	if (cl->keys) {
		rps__keyring_get(cl->keys, &cur, NULL);
		rps__auth_priv_init(priv, &cur);
		rps__key_clear(&cur);
	}
	return 0;
}

int rps__conn_dialed(struct rps_client *cl, struct conn *c, int ret, const char *reply, size_t reply_len,
		     struct rps__conn_priv *rp)
{
	uint32_t i;

	/* (a witness refusing us is no live data server either: at bootstrap
	 * the map names it owner until its own SET_WITNESS hands its
	 * partitions to their backups, so its ops wait for that map) */
	c->answered = !ret || (ret == -ECONNREFUSED && reply_len > 0 && reply[0] >= ' ' &&
			       strncmp(reply, RPS__WITNESS_REFUSAL, strlen(RPS__WITNESS_REFUSAL)));
	if (ret == -ECONNREFUSED && reply_len > 0 && reply[0] >= ' ' && !cl->keys &&
	    !strncmp(reply, "key required", 12)) {
		char local[PATH_MAX] = "~/.rdmaps/" RPS__LOCAL_KEY_NAME;

		rps__local_key_path(local, sizeof(local));
		rps__clearerr();
		return rps__seterr(ret, "%s refused the connection: %.*s (a server started without --key takes "
				   "its user's %s)", c->name, (int)reply_len, reply, local);
	}
	/* a burst of handshakes from our address (a job's ranks starting at
	 * once): the caller dials again in a moment (dialer.c, job_busy) */
	if (ret == -ECONNREFUSED && reply_len > 0 && !strncmp(reply, RPS__BUSY_REFUSAL, strlen(RPS__BUSY_REFUSAL)))
		return rps__seterr(-EBUSY, "%s refused the connection for now: %.*s (too many connections "
				   "authenticating at once: try again, or give the client a longer timeout_ms)",
				   c->name, (int)strnlen(reply, reply_len), reply);
	if (ret == -ECONNREFUSED && reply_len > 0 && reply[0] >= ' ')
		return rps__seterr(ret, "%s refused the connection: %.*s", c->name, (int)reply_len, reply);
	if (ret)
		return rps__preerr(ret, "connecting to %s", c->name);
	memset(rp, 0, sizeof(*rp));
	memcpy(rp, reply, RPS__MIN(reply_len, sizeof(*rp)));
	rps__ep_set_context(c->ep, c);
	for (i = 0; i < c->nrecv; i++) {
		struct rps__sge sge = { .addr = c->rbufs + (size_t)i * RPS__MSG_MAX, .len = RPS__MSG_MAX, .mr = c->rbufs_mr };
		ret = rps__post_recv(c->ep, &sge, wrid_idx(i, TAG_RECV));
		if (ret)
			return ret;
	}
	if (cl->keys && cl->keys_local && !rp->key_id)
		return rps__seterr(-EACCES, "%s takes no key (rdmapsd --insecure: every local user gets in): "
				   "not trusted with this user's loopback key; set insecure (RDMAPS_INSECURE=1) to "
				   "talk to it anyway", c->name);
	return 0;
}

/*
 * How many push slots and pull buffers an endpoint stages in: all the
 * server offers (at most MAX_SLOTS) and NBOUNCE, while every endpoint the
 * map names (data members x serving threads) fits the client's staging
 * budget at that; past it, each endpoint's share of the budget, split as
 * the full sizes are, and never less than one of each.  Our slots mirror
 * the server's (a push's copy and its descriptor go from there), so using
 * fewer than it offers costs nothing but window; at one slot a push
 * waits for the previous one's acknowledgement, no more.
 */
static void staging_share(const struct rps_client *cl, const struct conn *c, uint32_t *nslots, uint32_t *nbounce)
{
	uint64_t members = cl->map.nmembers > rps__smap_nwitnesses(&cl->map) ?
				   cl->map.nmembers - rps__smap_nwitnesses(&cl->map) : 1;
	uint64_t endpoints = members * (c->hello.nthreads ? c->hello.nthreads : 1);
	uint64_t full_slots = RPS__MIN(c->hello.nslots, MAX_SLOTS);
	uint64_t full = full_slots * c->hello.slot_size + NBOUNCE * (uint64_t)c->bsize;
	uint64_t share = cl->staging_bytes / RPS__MAX(endpoints, 1);

	if (full <= share) {
		*nslots = (uint32_t)full_slots;
		*nbounce = NBOUNCE;
		return;
	}
	/* the share, split in the proportion of the full sizes */
	*nslots = (uint32_t)RPS__MAX(1, RPS__MIN(full_slots, share * full_slots / full));
	*nbounce = (uint32_t)RPS__MAX(1, RPS__MIN(NBOUNCE, share * NBOUNCE / full));
}

/* Free what conn_stage allocated (the slots' mirror, the bounce buffers,
 * the atomics' results and the free lists). */
static void conn_unstage(struct conn *c)
{
	__atomic_sub_fetch(&c->cl->staging_used, c->staged, __ATOMIC_RELAXED);
	c->staged = 0;
	rps__free_reg(c->cl, &c->pbufs, &c->pbufs_mr, (size_t)c->nslots * c->hello.slot_size);
	rps__free_reg(c->cl, &c->bbufs, &c->bbufs_mr, (size_t)c->nbounce * c->bsize);
	rps__free_reg(c->cl, (char **)&c->atomics, &c->atomics_mr, (size_t)c->nslots * 8);
	free(c->free_slots);
	free(c->free_bounce);
	c->free_slots = c->free_bounce = NULL;
}

/* The connection's staging, sized by staging_share, every slot and
 * bounce buffer free. */
static int conn_stage(struct rps_client *cl, struct conn *c)
{
	uint32_t i;
	int ret;

	c->bsize = rps__shard_stride(c->hello.shard_elems) + 64;
	staging_share(cl, c, &c->nslots, &c->nbounce);
	ret = rps__alloc_reg(cl, (size_t)c->nslots * c->hello.slot_size, RPS__ACCESS_LOCAL, &c->pbufs, &c->pbufs_mr);
	if (!ret)
		ret = rps__alloc_reg(cl, (size_t)c->nbounce * c->bsize, RPS__ACCESS_LOCAL, &c->bbufs, &c->bbufs_mr);
	if (!ret) {
		c->staged = (uint64_t)c->nslots * c->hello.slot_size + (uint64_t)c->nbounce * c->bsize;
		__atomic_add_fetch(&cl->staging_used, c->staged, __ATOMIC_RELAXED);
	}
	if (!ret)
		ret = rps__alloc_reg(cl, (size_t)c->nslots * 8, RPS__ACCESS_LOCAL, (char **)&c->atomics, &c->atomics_mr);
	if (ret)
		return ret;
	c->free_slots = calloc(c->nslots, sizeof(uint32_t));
	c->free_bounce = calloc(c->nbounce, sizeof(uint32_t));
	if (!c->free_slots || !c->free_bounce)
		return rps__seterr(-ENOMEM, "out of memory");
	for (i = 0; i < c->nslots; i++)
		c->free_slots[i] = c->nslots - 1 - i;
	c->nfree_slots = c->nslots;
	for (i = 0; i < c->nbounce; i++)
		c->free_bounce[i] = c->nbounce - 1 - i;
	c->nfree_bounce = c->nbounce;
	return 0;
}

int rps__conn_finish(struct rps_client *cl, struct conn *c)
{
	int ret;

	/* (it sizes our connections to the member: MAX_CONNS holds them) */
	if (c->hello.nthreads > RPS__PROTO_THREADS_MAX)
		return rps__seterr(-EPROTO, "%s says %u serving threads: at most %u exist (a server of another version?)",
				   c->name, c->hello.nthreads, RPS__PROTO_THREADS_MAX);
	ret = conn_stage(cl, c);
	if (ret)
		return ret;
	c->nfree_ctrl = CTRL_CREDITS;
	c->gen = ++cl->conn_gen;
	return 0;
}

int rps__conn_restage(struct rps_client *cl, struct conn *c)
{
	uint32_t nslots, nbounce;

	staging_share(cl, c, &nslots, &nbounce);
	if (nslots == c->nslots && nbounce == c->nbounce)
		return 0;
	assert(!c->active && c->nfree_slots == c->nslots && c->nfree_bounce == c->nbounce);
	conn_unstage(c);
	return conn_stage(cl, c);
}

/* One connection, made in turn: the seed list's, before the map names
 * the members (rps__connect_members dials those all at once). */
int rps__conn_setup(struct rps_client *cl, struct conn *c, const struct rps__uri *u, int index)
{
	struct rps__conn_priv priv, rp;
	struct rps__ep_attr attr;
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t reply_len = RPS__PRIVDATA_MAX;
	int ret;

	ret = rps__conn_begin(cl, c, u, index, &priv, &attr);
	if (ret)
		return ret;
	memset(reply, 0, sizeof(reply));
	ret = rps__connect(cl->fab, u->host, u->port, cl->cq, &attr, &priv, sizeof(priv), cl->dial_ms, reply,
			   &reply_len, &c->ep);
	ret = rps__conn_dialed(cl, c, ret, reply, reply_len, &rp);
	if (!ret && cl->keys)
		ret = auth_sync(cl, c, &priv, &rp);
	if (!ret)
		ret = hello_sync(cl, c);
	if (!ret)
		ret = rps__conn_finish(cl, c);
	return ret;
}

/*
 * Read the shard map from c's server with one RDMA READ (it crc-checks
 * itself: a read that raced with the server rewriting it is read again).
 * The caller holds the poller role (or the progress thread is not running).
 */
int rps__map_read_sync(struct rps_client *cl, struct conn *c)
{
	/* no longer than a liveness probe waits: a refresh tries the members
	 * in turn, and one whose host died silently (nothing of ours waited
	 * on it, so no probe found it out) must not hold the client's lock
	 * for the whole timeout while the others have the map */
	int wait_ms = RPS__MIN(cl->dial_ms, PROBE_DEAD_MS);
	uint64_t deadline = rps__now_ns() + (uint64_t)wait_ms * 1000000ull;
	struct rps__smap m;
	int tries, ret = -EIO;

	for (tries = 0; tries < 8; tries++) {
		struct rps__wr wr;
		struct rps__wc wc;
		bool done = false;

		memset(&wr, 0, sizeof(wr));
		wr.wr_id = TAG_READ;	/* no op: recognised below */
		wr.op = RPS__OP_READ;
		wr.flags = RPS__WR_SIGNALED;
		wr.sge.addr = cl->mapbuf;
		wr.sge.len = RPS__MIN(c->hello.map_len, RPS__MAP_BUF);
		wr.sge.mr = cl->mapbuf_mr;
		wr.raddr = c->hello.map_addr;
		wr.rkey = c->hello.map_rkey;
		ret = rps__post(c->ep, &wr, 1);
		if (ret)
			return rps__preerr(ret, "%s: reading the shard map", c->name);
		while (!done) {
			if (rps__now_ns() > deadline) {
				if (cl->thread_started) {	/* as a probe's verdict: lost */
					c->dead = true;
					c->err = -ECONNRESET;
				}
				return rps__seterr(-ETIMEDOUT, "%s: the shard map did not arrive within %d ms", c->name,
						   wait_ms);
			}
			ret = rps__cq_wait(cl->cq, &wc, 1, 100);
			if (ret < 0)
				return ret;
			if (ret == 0)
				continue;
			if (wc.wr_id == TAG_READ && rps__ep_context(wc.ep) == c) {
				if (wc.status != RPS__WC_SUCCESS)
					return rps__seterr(-ECONNRESET, "%s: reading the shard map: %s", c->name,
							   rps__wc_status_str(wc.status));
				done = true;
			} else if (cl->thread_started) {
				rps__on_completion(cl, &wc);
			}
		}
		{	/* [u32 length][encoded map] */
			uint32_t len;
			memcpy(&len, cl->mapbuf, 4);
			ret = len <= RPS__MIN(c->hello.map_len, RPS__MAP_BUF) - 4 ?
				rps__smap_decode(cl->mapbuf + 4, len, &m) :
				rps__seterr(-EBADMSG, "shard map: length %u does not fit", len);
		}
		if (!ret) {
			rps__log(RPS__LOG_DEBUG, "%s: shard map read: entry %llu, %s entry %llu", c->name,
				 (unsigned long long)m.applied,
				 m.applied >= cl->map.applied || !cl->map.npart ? "taken over" : "older than ours,",
				 (unsigned long long)cl->map.applied);
			if (m.applied >= cl->map.applied || !cl->map.npart)
				cl->map = m;
			cl->map_from = c->index;
			if (c->hello.map_len == RPS__MAP_BUF)
				rps__note_take(cl, c, cl->mapbuf + RPS__MAP_BUF - sizeof(struct rps__quorum_note));
			return 0;
		}
	}
	return rps__preerr(ret, "%s: reading the shard map", c->name);
}

/*
 * Is a member whose connection we lost worth dialing again now?  Only if
 * the map gives it something to serve us: a partition it owns or is
 * receiving.  And not, for FAILOVER_WAIT_MS after the loss, while every
 * partition it owns has a backup and was its already when we lost it: it
 * is being failed over, ops on it ride through to the new primary without
 * it.  A partition given to it since (another epoch than the one we
 * noted, c->lost_epochs) says it lives: a server restarted after its
 * partitions failed over, then given some back (psctl rebalance, the
 * leader's own balancing, a move) is dialed at once, not after the wait.  Why it matters: when a whole
 * host dies nothing answers a dial (no reset, unlike a dead process on a
 * live host), so the dial blocks for its whole timeout, and a map refresh
 * dials with the client's lock held: every thread of the client would
 * stall that long in the middle of the failover.
 */
static bool redial_wanted(const struct rps_client *cl, const struct conn *c)
{
	bool owns = false, unbacked = false, given = false;
	uint32_t p;

	for (p = 0; p < cl->map.npart; p++) {
		const struct rps__smap_part *pp = &cl->map.parts[p];
		if (pp->moving_to == c->member_id)
			return true;
		if (pp->owner == c->member_id) {
			owns = true;
			unbacked |= !pp->backups[0] || pp->lost;
			given |= c->lost_epochs && (p >= c->nlost_epochs || c->lost_epochs[p] != pp->epoch);
		}
	}
	/* a remote access error came from a server that lives (it answered):
	 * nothing to fail over, dial it again now; a connection its peer
	 * closed, once at once too (struct conn.peer_closed): a server that
	 * lives answers (ops resent to it: worth_resending), one that died
	 * refuses at once, and its failover is waited for as before */
	return owns && (unbacked || given || c->err == -EFAULT || c->peer_closed ||
			rps__now_ns() - c->lost_ns >= FAILOVER_WAIT_MS * 1000000ull);
}

/* Does member id own partitions, every one of them with a backup (and
 * none lost)?  Then its death is failed over: ops on it can wait for that. */
static bool owns_backed(const struct rps_client *cl, uint64_t id)
{
	bool owns = false;
	uint32_t p;

	for (p = 0; p < cl->map.npart; p++) {
		const struct rps__smap_part *pp = &cl->map.parts[p];
		if (pp->owner != id)
			continue;
		if (!pp->backups[0] || pp->lost)
			return false;
		owns = true;
	}
	return owns;
}

/* A connection to one serving thread of a member, to be made. */
struct endpoint_want {
	const struct rps__smap_member *m;
	uint32_t thread;
	int k;		/* its slot in cl->conns */
	bool fresh;	/* a new slot (not one of a connection we had) */
	int dial_err;	/* the slot's: why its member could not be reached */
	int job;	/* its job in the batch; -1: not dialed (a bad address) */
};

/*
 * The connection to serving thread `thread` of member m (its URI's port
 * + thread): to be made if we have none, or made again if it was lost and
 * is wanted (any: even if not wanted, a map read with nobody else left to
 * ask).  1: to be made, *w says where (a new slot is *next, moved on; a
 * dead one of it is freed); 0: not (*conn: the live connection, a dead one
 * not wanted again, or -1: no room).
 */
static int endpoint_plan(struct rps_client *cl, const struct rps__smap_member *m, uint32_t thread, bool any,
			 int *next, int *conn, struct endpoint_want *w)
{
	int k;

	*conn = -1;
	for (k = 0; k < cl->nservers; k++)
		if (cl->conns[k].member_id == m->id && cl->conns[k].thread == thread && cl->conns[k].ep) {
			*conn = k;
			return 0;
		}
	for (k = 0; k < cl->nservers; k++)	/* a slot of a dead connection to it */
		if (cl->conns[k].member_id == m->id && cl->conns[k].thread == thread)
			break;
	if (k == cl->nservers) {
		if (*next == (int)MAX_CONNS) {
			/* (members x threads fit; members replaced many times
			 * over leave dead slots behind) */
			rps__log(RPS__LOG_WARN, "member %llu thread %u: no room for another connection (%u held): "
				 "its shards fail until the client is made again",
				 (unsigned long long)m->id, thread, MAX_CONNS);
			return 0;
		}
		k = (*next)++;
	}
	*conn = k;
	if (cl->taken_over)	/* (a server said another process has our rank now) */
		return 0;
	if (k < cl->nservers && cl->conns[k].lost_ns && !any && !redial_wanted(cl, &cl->conns[k]))
		return 0;
	memset(w, 0, sizeof(*w));
	w->m = m;
	w->thread = thread;
	w->k = k;
	w->fresh = k >= cl->nservers;
	if (!w->fresh) {
		w->dial_err = cl->conns[k].dial_err;
		rps__conn_free(&cl->conns[k]);
	}
	memset(&cl->conns[k], 0, sizeof(cl->conns[k]));
	return 1;
}

/*
 * A wanted connection, made or not (j: its job, NULL for a bad address).
 * A member that cannot be reached is not an error here: its connection is
 * left dead with the reason and its address, so ops on its shards fail
 * naming it while the others work.  Only a server that disagrees on the
 * cluster's configuration is: that is returned, or 0.
 */
static int endpoint_settle(struct rps_client *cl, const struct endpoint_want *w, const struct rps__dial_job *j)
{
	struct conn *c = &cl->conns[w->k];
	int ret = j ? j->ret : -EHOSTUNREACH;

	if (ret == -ESTALE) {
		/* our rank was taken over: nothing to dial again, ever; its
		 * ops fail saying so (rps__status_text) */
		rps__conn_free(c);
		c->cl = cl;
		c->index = w->k;
		c->dead = true;
		c->err = -ESTALE;
		c->member_id = w->m->id;
		c->thread = w->thread;
		cl->taken_over = true;
		return 0;
	}
	if (ret) {
		char reason[sizeof(c->refused)];
		/* (busy: refused still, its dials again within timeout_ms in vain) */
		bool refused = ret == -ECONNREFUSED || ret == -EBUSY;
		int why = refused ? -ECONNREFUSED : -EHOSTUNREACH;
		/* (no answer at all: what a dead server or host gives) */
		bool silent = j && !c->answered &&
			      (ret == -ECONNREFUSED || ret == -ETIMEDOUT || ret == -EHOSTUNREACH ||
			       ret == -ENETUNREACH || ret == -ECONNRESET);

		/* the server's reason, for the ops that fail for want of it */
		snprintf(reason, sizeof(reason), "%s", refused && w->fresh && j ? j->err : "");
		rps__conn_free(c);
		memcpy(c->refused, reason, sizeof(reason));
		c->cl = cl;
		c->index = w->k;
		c->dead = true;
		/* to its ops: a server we had is gone (as before the
		 * attempt); one we never reached refused or is unreachable,
		 * and, if nothing answered and its partitions have backups,
		 * it may just have died with a failover under way (a client
		 * that arrives during one): its ops wait for that
		 * as if we had lost our connection to it now (client.c,
		 * ride-through).  (One that answered to refuse us lives: no
		 * failover is coming.) */
		if (!w->fresh || (silent && owns_backed(cl, w->m->id))) {
			c->err = -ECONNRESET;
			c->member_id = w->m->id;
			rps__conn_note_lost(cl, c);
			c->dial_err = !w->fresh ? w->dial_err : why;
		} else {
			c->err = why;
		}
		c->member_id = w->m->id;
		c->thread = w->thread;
		return 0;
	}
	c->member_id = c->hello.member_id;
	c->thread = w->thread;
	if (c->hello.shard_elems != cl->shard_elems)
		ret = rps__seterr(-EINVAL, "%s uses --shard-size %u but the cluster uses %u: give every rdmapsd the same",
				  c->name, c->hello.shard_elems * 4, cl->shard_elems * 4);
	else if (c->hello.thread_index != w->thread || c->hello.member_id != w->m->id)
		ret = rps__seterr(-EINVAL, "%s is not serving thread %u of member %llu (it says thread %u of member %llu): "
				  "is another server listening there?", c->name, w->thread,
				  (unsigned long long)w->m->id, c->hello.thread_index,
				  (unsigned long long)c->hello.member_id);
	if (ret) {
		c->dead = true;
		c->err = -EINVAL;
	}
	return ret;
}

/* Make w[0..n) at once (dialer.c) and settle each; next: the slots in use
 * after them.  The first configuration error, with its line, or 0. */
static int connect_wanted(struct rps_client *cl, struct endpoint_want *w, uint32_t n, int next)
{
	struct rps__dial_job *jobs = calloc(n ? n : 1, sizeof(*jobs));
	char first_msg[512] = "";
	uint32_t i, nj = 0;
	int first_err = 0, ret;

	for (i = 0; i < n; i++) {
		struct conn *c = &cl->conns[w[i].k];
		struct rps__uri u;

		w[i].job = -1;
		if (rps__uri_parse(w[i].m->uri, &u) || (uint32_t)u.port + w[i].thread > 65535) {
			char esc[4 * RPS__SMAP_URI_MAX];
			snprintf(c->name, sizeof(c->name), "member %llu at '%s'", (unsigned long long)w[i].m->id,
				 rps__escape(w[i].m->uri, esc, sizeof(esc)));
			continue;
		}
		u.port = (uint16_t)(u.port + w[i].thread);
		rps__uri_str(&u, c->name, sizeof(c->name));
		if (!jobs) {
			c->answered = false;
			continue;	/* (settled as unreachable below) */
		}
		jobs[nj].k = w[i].k;
		jobs[nj].u = u;
		w[i].job = (int)nj++;
	}
	if (jobs)
		rps__dial_batch(cl, jobs, nj);
	for (i = 0; i < n; i++) {
		ret = endpoint_settle(cl, &w[i], w[i].job >= 0 ? &jobs[w[i].job] : NULL);
		rps__log(RPS__LOG_DEBUG, "%s: member %llu thread %u %s%s: %s", cl->conns[w[i].k].name,
			 (unsigned long long)w[i].m->id, w[i].thread, w[i].fresh ? "dialed" : "dialed again",
			 w[i].fresh ? "" : w[i].dial_err ? " (after a failed dial)" : "",
			 cl->conns[w[i].k].ep && !cl->conns[w[i].k].dead ? "connected" : rps_strerror(cl->conns[w[i].k].err));
		if (ret && !first_err) {
			first_err = ret;
			snprintf(first_msg, sizeof(first_msg), "%s", rps__errbuf());
		}
	}
	cl->nservers = RPS__MAX(cl->nservers, next);
	free(jobs);
	if (first_err)
		rps__seterr(first_err, "%s", first_msg);
	return first_err;
}

/* One connection (connect_endpoint_how's rule), made now.  *conn: its
 * slot, or -1. */
static int connect_endpoint_how(struct rps_client *cl, const struct rps__smap_member *m, uint32_t thread, int *conn,
				bool any)
{
	struct endpoint_want w;
	int next = cl->nservers;

	if (!endpoint_plan(cl, m, thread, any, &next, conn, &w))
		return 0;
	return connect_wanted(cl, &w, 1, next);
}

/* A live connection to thread 0 of member id (one this call did not find
 * misconfigured), or -1. */
static int first_thread_conn(const struct rps_client *cl, uint64_t id)
{
	for (int k = 0; k < cl->nservers; k++)
		if (cl->conns[k].member_id == id && cl->conns[k].thread == 0 && cl->conns[k].ep &&
		    !(cl->conns[k].dead && cl->conns[k].err == -EINVAL))
			return k;
	return -1;
}

/*
 * Connect to the members of the map we have no connection to, and to
 * each serving thread of theirs (rdmapsd --threads: the first one's HELLO
 * says how many): every member's first thread at once, then every other
 * thread at once (dialer.c), so a worker's connect to many servers takes
 * about two connects' time.  Only a member that disagrees on the
 * cluster's configuration fails the whole call.
 */
int rps__connect_members(struct rps_client *cl)
{
	struct endpoint_want *w = calloc(MAX_CONNS, sizeof(*w));
	char first_msg[512] = "";
	uint32_t i, t, n = 0;
	int first_err = 0, ret, next, k;

	if (!w)
		return rps__seterr(-ENOMEM, "out of memory");
	next = cl->nservers;
	for (i = 0; i < cl->map.nmembers; i++) {
		const struct rps__smap_member *m = &cl->map.members[i];
		if (m->flags & RPS__SMAP_WITNESS)
			continue;	/* it holds nothing and takes no worker (rdmapsd --witness) */
		n += (uint32_t)endpoint_plan(cl, m, 0, false, &next, &k, &w[n]);
	}
	if ((first_err = connect_wanted(cl, w, n, next)))
		snprintf(first_msg, sizeof(first_msg), "%s", rps__errbuf());
	n = 0;
	next = cl->nservers;
	for (i = 0; i < cl->map.nmembers; i++) {
		const struct rps__smap_member *m = &cl->map.members[i];
		int k0 = (m->flags & RPS__SMAP_WITNESS) ? -1 : first_thread_conn(cl, m->id);
		for (t = 1; k0 >= 0 && t < RPS__MAX(cl->conns[k0].hello.nthreads, 1u); t++)
			n += (uint32_t)endpoint_plan(cl, m, t, false, &next, &k, &w[n]);
	}
	if ((ret = connect_wanted(cl, w, n, next)) && !first_err) {
		first_err = ret;
		snprintf(first_msg, sizeof(first_msg), "%s", rps__errbuf());
	}
	for (i = 0; i < cl->map.nmembers; i++) {
		const struct rps__smap_member *m = &cl->map.members[i];
		int k0 = (m->flags & RPS__SMAP_WITNESS) ? -1 : first_thread_conn(cl, m->id);
		uint32_t nthreads = k0 >= 0 ? RPS__MAX(cl->conns[k0].hello.nthreads, 1u) : 0;

		for (k = 0; k < cl->nservers; k++) {
			struct conn *c = &cl->conns[k];
			if (k0 < 0 || c->member_id != m->id || !c->thread || c->thread >= nthreads || !c->ep || c->dead ||
			    RPS__MAX(c->hello.nthreads, 1u) == nthreads)
				continue;
			ret = rps__seterr(-EINVAL, "%s says %u serving threads, its first port %u", c->name,
					  c->hello.nthreads, nthreads);
			c->dead = true;
			c->err = -EINVAL;
			if (!first_err) {
				first_err = ret;
				snprintf(first_msg, sizeof(first_msg), "%s", rps__errbuf());
			}
		}
	}
	free(w);
	if (first_err)
		rps__seterr(first_err, "%s", first_msg);
	else
		rps__clearerr();
	return first_err;
}

/* Take the poller role from a user thread (the progress thread stands by). */
static void poll_claim(struct rps_client *cl)
{
	cl->waiters++;
	if (cl->progress_polling)
		wake_progress(cl);
	while (cl->polling)
		pthread_cond_wait(&cl->cond, &cl->lock);
	cl->polling = true;
}

static void poll_release(struct rps_client *cl)
{
	cl->polling = false;
	cl->waiters--;
	pthread_cond_broadcast(&cl->cond);
	if (!cl->waiters && cl->nactive)
		pthread_cond_signal(&cl->pcond);
}

/* Which members a refresh asks, in turn (pass 0, 1, 2): the one that
 * answered the last map read; the others with no liveness probe
 * outstanding; those with one (slow to answer, or their host is gone:
 * each costs up to PROBE_DEAD_MS).  A member whose host died silently
 * must not be asked before those that answer. */
static bool map_ask_in_pass(const struct rps_client *cl, const struct conn *c, int pass)
{
	if (!c->ep || c->dead || c->thread)	/* (a serving thread past the first has no map) */
		return false;
	if (pass == 0)
		return c->index == cl->map_from && !c->probing;
	if (c->index == cl->map_from && !c->probing)
		return false;	/* asked in pass 0 */
	return pass == 1 ? !c->probing : c->probing;
}

/*
 * No connection we hold could give the map: every member we used is gone.
 * A member that restarted is not dialed again while the map gives it
 * nothing to serve us (redial_wanted), yet it may hold the backups the
 * failover promotes (rolling restarts: each member in turn killed and
 * restarted, the last one we used killed at last).  Dial the members we
 * have no connection to for the map, and read it from the first that
 * answers.  (A process whose connections a takeover closed finds them
 * gone: its dials are refused while its replacement is connected, and
 * then it dials no more.)  0, or the last error.
 */
static bool owns_any(const struct rps_client *cl, uint64_t id)
{
	for (uint32_t p = 0; p < cl->map.npart; p++)
		if (cl->map.parts[p].owner == id || cl->map.parts[p].moving_to == id)
			return true;
	return false;
}

/* Is our lost connection to member id one to dial again by the usual rule
 * (redial_wanted: lost to a remote access error, from a server that lives;
 * or its partitions not failed over in time)? */
static bool redial_due(const struct rps_client *cl, uint64_t id)
{
	for (int k = 0; k < cl->nservers; k++)
		if (cl->conns[k].member_id == id && cl->conns[k].thread == 0 && !cl->conns[k].ep &&
		    cl->conns[k].err != -ESTALE && redial_wanted(cl, &cl->conns[k]))
			return true;
	return false;
}

static int map_from_any_member(struct rps_client *cl)
{
	int ret = -ECONNRESET, k, pass;

	if (cl->taken_over)
		return ret;
	/* first the members likely to answer: owning nothing in our map (a
	 * restarted one), or owners the usual rule would dial again (lost to
	 * a remote access error: they live); then every other owner, though
	 * the usual rule would wait for its failover: nobody else is left
	 * to ask, so the wait would be for a map nobody gives us (a worker
	 * that lost its connection to a live owner, a blip, then the other
	 * data server died: it waited out its whole timeout).  A dial to a
	 * dead host blocks here, but nothing could move on meanwhile anyway. */
	for (pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < cl->map.nmembers; i++) {
			const struct rps__smap_member *m = &cl->map.members[i];
			bool live = false, likely;

			for (k = 0; k < cl->nservers; k++)
				live |= cl->conns[k].member_id == m->id && cl->conns[k].thread == 0 &&
					cl->conns[k].ep && !cl->conns[k].dead;
			/* (asked already; a witness takes no worker) */
			if (live || (m->flags & RPS__SMAP_WITNESS))
				continue;
			likely = !owns_any(cl, m->id) || redial_due(cl, m->id);
			if (likely != (pass == 0))
				continue;
			if (connect_endpoint_how(cl, m, 0, &k, true) || k < 0 || !cl->conns[k].ep ||
			    cl->conns[k].dead)
				continue;
			ret = rps__map_read_sync(cl, &cl->conns[k]);
			if (!ret)
				return 0;
		}
	}
	return ret;
}

/* Read the map again (from any server we reach) and connect to new members. */
int rps__map_refresh(struct rps_client *cl)
{
	int k, pass, ret = -ECONNRESET;

	pthread_mutex_lock(&cl->lock);
	poll_claim(cl);
	for (pass = 0; pass < 3; pass++) {
		for (k = 0; k < cl->nservers; k++) {
			struct conn *c = &cl->conns[k];
			/* (a read that failed marks its connection dead: not asked again) */
			if (!map_ask_in_pass(cl, c, pass))
				continue;
			ret = rps__map_read_sync(cl, c);
			if (!ret)
				break;
		}
		if (!ret)
			break;
	}
	if (ret && cl->map.nmembers)
		ret = map_from_any_member(cl);
	if (!ret)
		rps__connect_members(cl);
	poll_release(cl);
	pthread_mutex_unlock(&cl->lock);
	if (ret)
		rps__preerr(ret, "refreshing the shard map");
	return ret;
}
