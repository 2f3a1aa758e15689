/*
 * conn.c - the server's connections: accepting workers, peers and psctl,
 * their staging slots and message buffers (counted against
 * --memory-limit; with a key, given only once the connection
 * authenticated, and only then counted against --max-connections or the
 * admin slots), sending replies on them, and tearing one down with
 * everything that waited on it.
 */
#include "config.h"
#include "common/common.h"
#include "common/topo.h"
#include "proto/proto.h"
#include "transport/transport.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define conn_fail rps__srv_conn_fail
#define conn_reply rps__srv_conn_reply
#define post_recv_buf rps__srv_post_recv

/* ---- sending replies -------------------------------------------------- */

static char *sbuf(struct srv_conn *c, uint32_t i)
{
	return c->bufs.sbufs + (size_t)i * c->bufs.msg_max;
}

const char *rps__srv_role_name(const struct srv_conn *c)
{
	return c->role == CONN_PEER ? "peer" : c->role == CONN_ADMIN ? "admin" : c->role == CONN_REPL ? "replication"
											      : "worker";
}

void rps__srv_conn_fail(struct srv_conn *c, const char *why)
{
	if (!c->dead) {
		if (c->role == CONN_WORKER)
			rps__log(RPS__LOG_INFO, "worker %s (rank %d): %s", rps__ep_peer(c->ep), c->rank, why);
		else
			rps__log(RPS__LOG_INFO, "%s %s: %s", rps__srv_role_name(c), rps__ep_peer(c->ep), why);
	}
	c->dead = true;
}

static void send_msg(struct srv_conn *c, unsigned type, uint8_t flags, uint32_t kind, uint64_t req_id,
		     int32_t status, const void *body, size_t len)
{
	struct rps__wr wr;
	uint32_t i;
	int ret;

	if (c->dead)
		return;
	if (!c->bufs.nsfree) {
		if (c->role == CONN_PEER)
			return;		/* best effort: Raft and the move duties retry */
		conn_fail(c, "exceeded its control credits");
		return;
	}
	if (sizeof(struct rps__msg_hdr) + (body ? len : 0) > c->bufs.msg_max) {
		rps__log(RPS__LOG_ERROR, "%s reply of %zu bytes does not fit a %zu-byte buffer",
			 rps__msg_type_name(type), len, c->bufs.msg_max);
		return;
	}
	i = c->bufs.sfree[--c->bufs.nsfree];
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = ((uint64_t)kind << 32) | i;
	wr.op = RPS__OP_SEND;
	wr.flags = RPS__WR_SIGNALED;
	wr.sge.addr = sbuf(c, i);
	wr.sge.len = (uint32_t)rps__msg_build(wr.sge.addr, type, req_id, status, body, body ? len : 0);
	if (flags)
		rps__msg_set_flags(wr.sge.addr, flags);
	if (kind == WRID_STEP_DONE)
		c->sd.inflight++;
	if (c->role == CONN_WORKER && type < RPS__MSG_TYPE_MAX) {
		c->srv->worker_msgs[type]++;
		c->srv->worker_acks_flagged += flags != 0;
	}
	wr.sge.mr = c->bufs.sbufs_mr;
	ret = rps__post(c->ep, &wr, 1);
	if (ret) {
		c->bufs.sfree[c->bufs.nsfree++] = i;
		c->sd.inflight -= kind == WRID_STEP_DONE;
		conn_fail(c, rps__errbuf());
	}
}

void rps__srv_conn_reply(struct srv_conn *c, unsigned type, uint64_t req_id, int32_t status,
			 const void *body, size_t len)
{
	send_msg(c, type, 0, WRID_SEND, req_id, status, body, len);
}

void rps__srv_conn_reply_flags(struct srv_conn *c, unsigned type, uint8_t flags, uint64_t req_id, int32_t status,
			       const void *body, size_t len)
{
	send_msg(c, type, flags, WRID_SEND, req_id, status, body, len);
}

void rps__srv_conn_send_step_done(struct srv_conn *c, const struct rps__step_done *sd)
{
	send_msg(c, RPS__MSG_STEP_DONE, 0, WRID_STEP_DONE, 0, 0, sd, sizeof(*sd));
}

/* ---- connections ------------------------------------------------------- */

int rps__srv_post_recv(struct srv_conn *c, uint32_t i)
{
	struct rps__sge sge = { .addr = rps__srv_rbuf(c, i), .len = (uint32_t)c->bufs.msg_max, .mr = c->bufs.rbufs_mr };

	return rps__post_recv(c->ep, &sge, ((uint64_t)WRID_RECV << 32) | i);
}

/* Give back a connection's buffers (and its lock owner): the endpoint must
 * be closed, or have none of them posted. */
static void conn_release_bufs(struct rps__server *srv, struct srv_conn *c)
{
	rps__mr_dereg(c->bufs.slots_mr);
	rps__mr_dereg(c->bufs.rbufs_mr);
	rps__mr_dereg(c->bufs.sbufs_mr);
	if (c->bufs.slots) {
		rps__topo_free(srv->topo, c->bufs.slots, c->bufs.slots_len);
		rps__srv_mem_give(srv, c->bufs.slots_len);
	}
	if (c->bufs.rbufs)
		rps__topo_free(srv->topo, c->bufs.rbufs, (size_t)c->bufs.nrecv * c->bufs.msg_max);
	if (c->bufs.sbufs)
		rps__topo_free(srv->topo, c->bufs.sbufs, (size_t)c->bufs.nsend * c->bufs.msg_max);
	free(c->bufs.sfree);
	free(c->bufs.slot_state);
	rps__srv_mem_give(srv, c->bufs.charged);
	if (c->owner)
		srv->owner_used[c->owner] = 0;
	c->bufs.slots_mr = c->bufs.rbufs_mr = c->bufs.sbufs_mr = NULL;
	c->bufs.slots = c->bufs.rbufs = c->bufs.sbufs = NULL;
	c->bufs.slots_len = c->bufs.charged = 0;
	c->bufs.sfree = NULL;
	c->bufs.slot_state = NULL;
	c->owner = 0;
	c->bufs.nsfree = 0;
}

int rps__srv_cq_charge(struct rps__server *srv, struct srv_conn *c, uint32_t entries)
{
	uint64_t total = srv->cq_charged - c->cq_charged + entries;
	int ret;

	if (entries > c->cq_charged) {
		ret = rps__cq_grow(srv->cq, (uint32_t)RPS__MIN(CQ_SPARE + 2 * total, UINT32_MAX));
		if (ret)
			return ret;
	}
	srv->cq_charged = total;
	c->cq_charged = entries;
	return 0;
}

/* c leaves the preauth queue (authed, refused, gone). */
static void preauth_leave(struct rps__server *srv, struct srv_conn *c)
{
	uint32_t i;

	if (!c->auth.waiting)
		return;
	c->auth.waiting = false;
	for (i = 0; i < srv->preauth.n; i++)
		if (srv->preauth.q[i] == c) {
			memmove(&srv->preauth.q[i], &srv->preauth.q[i + 1],
				(srv->preauth.n - i - 1) * sizeof(srv->preauth.q[0]));
			srv->preauth.n--;
			return;
		}
}

void rps__srv_conn_free(struct rps__server *srv, struct srv_conn *c)
{
	if (!c)
		return;
	preauth_leave(srv, c);
	rps__srv_auth_dial_free(c);
	rps__ep_close(c->ep);
	srv->cq_charged -= c->cq_charged;
	c->cq_charged = 0;
	conn_release_bufs(srv, c);
	rps__mr_dereg(c->rd.mr);
	free(c->rd.buf);
	free(c->repl.tmap);
	free(c->repl.bound);
	free(c->sd.ent);
	free(c->wins.w);
	free(c);
}
#define conn_free rps__srv_conn_free

int rps__srv_conn_window(struct srv_conn *c, struct rps__mr *mr, int access, uint32_t *rkey)
{
	uint64_t serial = rps__mr_serial(mr);
	uint32_t i;
	int ret;

	for (i = 0; i < c->wins.n; i++)
		if (c->wins.w[i].serial == serial && c->wins.w[i].access == access) {
			*rkey = c->wins.w[i].rkey;
			return 0;
		}
	if (!c->ep)
		return rps__seterr(-ENOTCONN, "no connection to bind a memory window to");
	/* a reply must always find its slot: binds take only what is left */
	if (rps__ep_sq_room(c->ep) <= c->bufs.nsfree + 1)
		return rps__seterr(-EAGAIN, "send queue of %s too full to bind a memory window now",
				   rps__ep_peer(c->ep));
	if (rps__grow(&c->wins.w, &c->wins.cap, c->wins.n + 1, sizeof(*c->wins.w), 8))
		return rps__seterr(-ENOMEM, "out of memory for the windows of %s", rps__ep_peer(c->ep));
	ret = rps__mw_bind(c->ep, mr, access, rkey);
	if (ret)
		return ret;
	c->wins.w[c->wins.n++] = (struct conn_window){ .serial = serial, .access = access, .rkey = *rkey };
	return 0;
}

static uint32_t owner_alloc(struct rps__server *srv);

/* The buffers of a connection of role, once it may use them: workers get
 * staging slots and small control buffers, peers and psctl big message
 * buffers.  The queue depths an endpoint needs for them are nrecv and
 * nsend (accept_one sizes a lean connection's endpoint by them too). */
static void full_sizes(const struct rps__server *srv, enum conn_role_kind role, size_t *msg_max, uint32_t *nrecv,
		       uint32_t *nsend)
{
	if (role == CONN_WORKER) {
		*msg_max = RPS__MSG_MAX;
		*nrecv = CTRL_CREDITS + srv->cfg.nslots + 4;
		/* + STEP_DONE's own window: it never takes an ack's buffer */
		*nsend = CTRL_CREDITS + srv->cfg.nslots + 4 + RPS__STEP_DONE_WINDOW;
	} else if (role == CONN_REPL) {
		/* entries come as WRITE_IMM into slots (repl_stream.c): each takes a receive */
		*msg_max = RPS__MSG_MAX;
		*nrecv = REPL_SLOTS + 8;
		*nsend = 16;
	} else {
		*msg_max = RPS__BIG_MSG_MAX;
		*nrecv = PEER_RECV;
		*nsend = PEER_SEND;
	}
}

_Static_assert(sizeof(struct rps__msg_hdr) + sizeof(struct rps__auth) <= PREAUTH_MSG_MAX &&
	       sizeof(struct rps__msg_hdr) + sizeof(struct rps__auth_rep) <= PREAUTH_MSG_MAX,
	       "the handshake fits a lean connection's buffers");

/* Allocate and register c's buffers: the full set of its role, or (lean)
 * what the handshake needs: one receive (AUTH, then a peer's AUTH_DONE)
 * and two sends (AUTH_REP), so that a connection that proved nothing
 * holds next to no memory.  On failure the caller releases what was got. */
static int conn_bufs(struct rps__server *srv, struct srv_conn *c, bool lean)
{
	size_t slots_len = (size_t)srv->cfg.nslots * srv->slot_size;
	uint32_t i;
	int ret;

	if (lean) {
		c->bufs.msg_max = PREAUTH_MSG_MAX;
		c->bufs.nrecv = 1;
		c->bufs.nsend = 2;
	} else {
		full_sizes(srv, c->role, &c->bufs.msg_max, &c->bufs.nrecv, &c->bufs.nsend);
	}
	if (!lean && c->role == CONN_WORKER) {
		ret = rps__srv_mem_take(srv, slots_len, "staging slots");
		if (ret)
			return ret;
		c->bufs.slots = rps__topo_alloc(srv->topo, &srv->place, slots_len);
		if (!c->bufs.slots) {
			rps__srv_mem_give(srv, slots_len);
			goto err_nomem;
		}
		c->bufs.slots_len = slots_len;
		c->bufs.slot_state = calloc(srv->cfg.nslots, 1);
		c->owner = owner_alloc(srv);
		if (!c->bufs.slot_state || !c->owner)
			goto err_nomem;
	} else if (!lean && c->role != CONN_REPL) {
		/* 2 MiB each: counted like staging slots, or many psctl
		 * connections could take what --memory-limit promises to cap */
		ret = rps__srv_mem_take(srv, (size_t)(c->bufs.nrecv + c->bufs.nsend) * c->bufs.msg_max,
					c->role == CONN_PEER ? "peer connection buffers" : "admin connection buffers");
		if (ret)
			return ret;
		c->bufs.charged = (size_t)(c->bufs.nrecv + c->bufs.nsend) * c->bufs.msg_max;
	}
	c->bufs.rbufs = rps__topo_alloc(srv->topo, &srv->place, (size_t)c->bufs.nrecv * c->bufs.msg_max);
	c->bufs.sbufs = rps__topo_alloc(srv->topo, &srv->place, (size_t)c->bufs.nsend * c->bufs.msg_max);
	c->bufs.sfree = calloc(c->bufs.nsend, sizeof(*c->bufs.sfree));
	if (!c->bufs.rbufs || !c->bufs.sbufs || !c->bufs.sfree)
		goto err_nomem;
	for (i = 0; i < c->bufs.nsend; i++)
		c->bufs.sfree[i] = c->bufs.nsend - 1 - i;
	c->bufs.nsfree = c->bufs.nsend;
	ret = c->bufs.slots ? rps__mr_reg(srv->fab, c->bufs.slots, c->bufs.slots_len,
					  RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_WINDOWED, &c->bufs.slots_mr) : 0;
	if (!ret)
		ret = rps__mr_reg(srv->fab, c->bufs.rbufs, (size_t)c->bufs.nrecv * c->bufs.msg_max, RPS__ACCESS_LOCAL,
				  &c->bufs.rbufs_mr);
	if (!ret)
		ret = rps__mr_reg(srv->fab, c->bufs.sbufs, (size_t)c->bufs.nsend * c->bufs.msg_max, RPS__ACCESS_LOCAL,
				  &c->bufs.sbufs_mr);
	return ret;
err_nomem:
	return rps__seterr(-ENOMEM, "out of memory for a connection");
}

static int conn_create(struct rps__server *srv, enum conn_role_kind role, bool lean, struct srv_conn **out)
{
	struct srv_conn *c;
	int ret;

	c = calloc(1, sizeof(*c));
	if (!c)
		return rps__seterr(-ENOMEM, "out of memory");
	c->srv = srv;
	c->rank = -1;
	c->role = role;
	c->bufs.lean = lean;
	ret = conn_bufs(srv, c, lean);
	if (ret) {
		conn_free(srv, c);
		return ret;
	}
	*out = c;
	return 0;
}

/* A connection's buffers (before the endpoint exists), in full: the ones
 * we dial.  Accepted ones start lean while they authenticate. */
int rps__srv_conn_new(struct rps__server *srv, enum conn_role_kind role, struct srv_conn **out)
{
	return conn_create(srv, role, false, out);
}

int rps__srv_conn_grow(struct rps__server *srv, struct srv_conn *c)
{
	struct srv_conn n;
	uint32_t i, gen;
	bool posted;
	int ret;

	if (!c->bufs.lean)
		return 0;
	ret = rps__srv_cq_charge(srv, c, c->cq_full);
	if (ret)
		return ret;
	/* (nothing of the small buffers is posted or in flight: the AUTH
	 * that leads here was its one receive, and nothing was sent yet) */
	memset(&n, 0, sizeof(n));
	n.role = c->role;
	ret = conn_bufs(srv, &n, false);
	if (ret) {
		conn_release_bufs(srv, &n);
		return ret;
	}
	conn_release_bufs(srv, c);
	/* the new buffers whole; the generation and whether receives are
	 * posted stay the connection's */
	gen = c->bufs.gen;
	posted = c->bufs.recvs_posted;
	c->bufs = n.bufs;
	c->bufs.lean = false;
	c->bufs.gen = gen + 1;
	c->bufs.recvs_posted = posted;
	c->owner = n.owner;
	for (i = 0; i < c->bufs.nrecv; i++) {
		ret = post_recv_buf(c, i);
		if (ret)
			return ret;
	}
	return 0;
}

/* Add to the connection table (workers are capped by --max-connections;
 * peers and psctl are not: they are few and the cluster needs them). */
static int conn_table_add(struct rps__server *srv, struct srv_conn *c)
{
	if (rps__grow(&srv->conns, &srv->conns_cap, srv->nconns + 1, sizeof(*srv->conns), 16))
		return -ENOMEM;
	srv->conns[srv->nconns++] = c;
	return 0;
}

/* Authenticated connections of role: the ones --max-connections and the
 * admin slots count (one still proving its key takes no place). */
static uint32_t count_role(const struct rps__server *srv, enum conn_role_kind role)
{
	uint32_t i, n = 0;

	for (i = 0; i < srv->nconns; i++)
		n += srv->conns[i]->role == role && srv->conns[i]->auth.authed && !srv->conns[i]->dead;
	return n;
}

#define WHY_FULL "server full: raise rdmapsd --max-connections"
#define WHY_ADMIN_FULL "too many admin connections (16): close psctl sessions"

const char *rps__srv_conn_over_budget(const struct rps__server *srv, const struct srv_conn *c)
{
	if (c->role == CONN_WORKER && count_role(srv, CONN_WORKER) >= srv->cfg.max_conns)
		return WHY_FULL;
	if (c->role == CONN_ADMIN && count_role(srv, CONN_ADMIN) >= ADMIN_CONNS_MAX)
		return WHY_ADMIN_FULL;
	return NULL;
}

/*
 * Room for one more connection waiting to authenticate, from host: NULL,
 * or the line to refuse it with (in why).  Past the budget (PREAUTH_*)
 * the oldest waiting one of that host, or else of all, makes room if it
 * has had PREAUTH_FAIR_MS to send its AUTH: silent sockets opened ahead of
 * a worker keep it out that long at most, and a burst of them costs the
 * flooder its own older ones.  An evicted connection is told why first,
 * with an AUTH_REP of -EBUSY.  One younger than that is a handshake under
 * way (a job's start: hundreds of ranks dialing at once from one host),
 * and closing it would only make it dial again: the newcomer is refused
 * at connect instead, busy, which costs no queue pair and no descriptor
 * past the refusal.  librdmaps dials either again a moment later
 * (client/dialer.c), and the burst gets in as handshakes complete.  The
 * walk is of the queue (PREAUTH_MAX at most), whatever the connections.
 */
static const char *preauth_room(struct rps__server *srv, const char *host, char *why, size_t len)
{
	struct srv_conn *victim = NULL, *oldest_host = NULL;
	uint32_t i, k, n_host = 0;
	bool per_host;

	for (i = k = 0; i < srv->preauth.n; i++) {	/* (the ones settled since leave it) */
		struct srv_conn *o = srv->preauth.q[i];
		if (o->auth.authed || o->auth.refused || o->dead) {
			o->auth.waiting = false;
			continue;
		}
		srv->preauth.q[k++] = o;
		if (!strcmp(o->auth.host, host) && n_host++ == 0)
			oldest_host = o;
	}
	srv->preauth.n = k;
	per_host = n_host >= PREAUTH_PER_HOST;
	if (per_host)
		victim = oldest_host;
	else if (k >= PREAUTH_MAX)
		victim = srv->preauth.q[0];	/* (maybe of this host too: the line says all) */
	else
		return NULL;
	snprintf(why, len, RPS__BUSY_REFUSAL " %u handshakes%s wait", per_host ? n_host : k,
		 per_host ? " from your address" : "");
	if (rps__now_ns() - victim->auth.accepted_ns < PREAUTH_FAIR_MS * 1000000ull)
		return why;
	rps__srv_auth_busy(srv, victim, why);
	preauth_leave(srv, victim);
	return NULL;
}

void rps__srv_conn_destroy(struct rps__server *srv, struct srv_conn *c)
{
	uint32_t i;

	if (c->role == CONN_WORKER)
		rps__log(RPS__LOG_INFO, "worker %s (rank %d) gone", rps__ep_peer(c->ep), c->rank);
	if (srv->hooks.on_conn_gone && c->role != CONN_REPL)
		srv->hooks.on_conn_gone(srv->hooks.ctx, c);
	rps__srv_repl_conn_gone(srv, c);
	if (c->owner)
		rps__srv_scan_locks(srv, c->owner);
	for (i = 0; i < srv->push.nheld;) {
		if (srv->push.held[i].conn == c)
			srv->push.held[i] = srv->push.held[--srv->push.nheld];
		else
			i++;
	}
	for (i = 0; i < srv->req.nwaiters;) {
		if (srv->req.waiters[i].conn == c)
			srv->req.waiters[i] = srv->req.waiters[--srv->req.nwaiters];
		else
			i++;
	}
	for (i = 0; i < srv->req.narrivals;) {
		if (srv->req.arrivals[i].conn == c)
			srv->req.arrivals[i] = srv->req.arrivals[--srv->req.narrivals];
		else
			i++;
	}
	/* A creator that vanished before sending initial values: the shards
	 * stay unreadable, so say so rather than publish zeros. */
	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		uint32_t j;
		for (j = 0; t && j < t->layout.nshards; j++)
			if (t->shards[j].init_conn == c) {
				t->shards[j].init_conn = NULL;
				rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: creator left before sending initial values",
					 t->name, t->shards[j].index);
			}
	}
	rps__srv_rank_left(srv, c);
	for (i = 0; i < srv->nconns; i++)
		if (srv->conns[i] == c) {
			srv->conns[i] = srv->conns[--srv->nconns];
			break;
		}
	conn_free(srv, c);
	/* Pushes held behind the departed worker (sync) stay held: the step
	 * cannot complete without it, and applying a partial sum would break
	 * the sync invariant. */
	rps__srv_drain_held(srv);
}

static uint32_t owner_alloc(struct rps__server *srv)
{
	uint32_t i;

	for (i = 0; i < RPS__LOCK_OWNER_MAX; i++) {
		uint32_t o = 1 + (srv->next_owner + i) % RPS__LOCK_OWNER_MAX;
		if (!srv->owner_used[o]) {
			srv->owner_used[o] = 1;
			srv->next_owner = o;
			return o;
		}
	}
	return 0;
}

static void reject_with(struct rps__conn_req *req, const char *why)
{
	size_t len = strlen(why) + 1;

	rps__log(RPS__LOG_WARN, "rejecting a connection: %s", why);
	rps__reject(req, why, len > RPS__PRIVDATA_MAX ? RPS__PRIVDATA_MAX : len);
}

static bool peer_is_loopback(struct rps__conn_req *req)
{
	char host[64];

	rps__auth_host(rps__conn_req_peer(req), host, sizeof(host));
	return rps__host_is_loopback(host);
}

static void accept_one(struct rps__server *srv, struct rps__conn_req *req_)
{
	struct rps__conn_priv priv, req;
	struct rps__ep_attr attr = { 0 };
	struct srv_conn *c = NULL;
	size_t len;
	const void *data = rps__conn_req_data(req_, &len);
	const char *why = NULL;
	char host[sizeof(((struct srv_conn_auth *)0)->host)] = "";
	bool rev;
	uint32_t i;
	int ret;

	memset(&priv, 0, sizeof(priv));
	memcpy(&priv, data, RPS__MIN(len, sizeof(priv)));
	if (len < offsetof(struct rps__conn_priv, from_id) || priv.magic != RPS__DESC_MAGIC)
		why = "not an rdmaps worker";
	else if (priv.version != RPS__PROTO_VERSION)
		why = "protocol version mismatch: upgrade librdmaps or rdmapsd";
	else if (priv.role < RPS__ROLE_WORKER || priv.role > RPS__ROLE_REPL_REV)
		why = "unknown connection role";
	else if (rps__conn_req_peer_sq_depth(req_) > ANNOUNCED_SQ_MAX)
		why = "announced send queue depth over 1024";
	else if (priv.role == RPS__ROLE_WORKER && count_role(srv, CONN_WORKER) >= srv->cfg.max_conns)
		why = WHY_FULL;	/* (asked again once it authenticated: rps__srv_conn_over_budget) */
	else if (priv.role == RPS__ROLE_ADMIN && count_role(srv, CONN_ADMIN) >= ADMIN_CONNS_MAX)
		why = WHY_ADMIN_FULL;
	if (!why && srv->cfg.witness && priv.role != RPS__ROLE_PEER && priv.role != RPS__ROLE_ADMIN)
		why = RPS__WITNESS_REFUSAL ": give workers the data servers";	/* (56 bytes at most) */
	if (!why && srv->thr.index && (priv.role == RPS__ROLE_PEER || priv.role == RPS__ROLE_ADMIN))
		why = "a serving thread's port: use the first port";	/* (56 bytes at most) */
	if (!why && srv->cfg.keys && !priv.key_id)
		why = "key required: --key FILE or RDMAPS_KEY_FILE";
	if (!why && !srv->cfg.keys && !srv->cfg.insecure && !peer_is_loopback(req_))
		why = "no key: loopback only (rdmapsd --key or --insecure)";
	if (!why && priv.role == RPS__ROLE_PEER && !srv->cfg.keys) {
		/* (with a key: once it proved it holds it, rps__srv_conn_authed) */
		if (srv->hooks.accept_peer)
			srv->hooks.accept_peer(srv->hooks.ctx, priv.from_id, priv.to_id, NULL, &why);
		else
			why = "this server takes no peers";
	}
	if (!why && (priv.role == RPS__ROLE_REPL || priv.role == RPS__ROLE_REPL_REV) &&
	    (!priv.from_id || priv.from_id == srv->my_id || priv.to_id != srv->my_id))
		why = "replication stream meant for another member";
	if (!why && priv.role == RPS__ROLE_REPL_REV && priv.from_id < srv->my_id)
		why = "replication stream dialed by the lower member id (the higher one dials)";
	if (why) {
		reject_with(req_, why);
		return;
	}
	rev = priv.role == RPS__ROLE_REPL_REV;	/* we are its primary */
	if (srv->cfg.keys) {	/* (without a key it is authed at once) */
		char busy[RPS__PRIVDATA_MAX];
		rps__auth_host(rps__conn_req_peer(req_), host, sizeof(host));
		if (preauth_room(srv, host, busy, sizeof(busy))) {
			char who[96];
			snprintf(who, sizeof(who), "connection from %s", rps__conn_req_peer(req_));
			rps__srv_log_refusal_line(srv, who, busy);
			rps__reject(req_, busy, strlen(busy) + 1);
			return;
		}
	}
	/* with a key: lean until it proved it (rps__srv_conn_grow) */
	ret = conn_create(srv, rev ? CONN_REPL : (enum conn_role_kind)priv.role, srv->cfg.keys != NULL, &c);
	/* (with a key the backup's slots wait for the proof) */
	if (!ret && priv.role == RPS__ROLE_REPL && !srv->cfg.keys && (ret = rps__srv_repl_accepted(srv, c)))
		conn_free(srv, c);
	if (ret) {
		rps__log(RPS__LOG_WARN, "connection refused: %s", rps__errbuf());
		reject_with(req_, ret == -ENOMEM ? "server out of memory: raise rdmapsd --memory-limit"
						: "server out of resources");
		return;
	}
	c->repl.rev_in = rev;
	c->peer_id = priv.role >= RPS__ROLE_PEER && priv.role != RPS__ROLE_ADMIN ? priv.from_id : 0;
	c->peer_threads = priv.role == RPS__ROLE_PEER ? priv.nthreads : 0;
	c->last_active_ns = c->auth.accepted_ns = rps__now_ns();
	{	/* the queues its full buffers need, lean or not: a QP's depths are for good */
		size_t mm;
		uint32_t nr, ns;
		full_sizes(srv, c->role, &mm, &nr, &ns);
		attr.sq_depth = ns + 8 + RPS__BIND_RESERVE + (rev ? REPL_SLOTS : 0);
		attr.rq_depth = nr;
	}
	/* (lean: one receive, two sends until it proved its key) */
	c->cq_full = attr.sq_depth + attr.rq_depth;
	ret = rps__srv_cq_charge(srv, c, c->bufs.lean ? 3 : c->cq_full);
	if (ret) {
		rps__log(RPS__LOG_WARN, "connection refused: %s", rps__errbuf());
		reject_with(req_, ret == -ENOSPC ? RPS__SRV_WHY_CQ_FULL : "server out of resources");
		goto err_free;
	}
	attr.max_inline = 64;
	req = priv;
	priv.role = 0;
	priv.from_id = srv->my_id;
	priv.to_id = 0;
	priv.nthreads = srv->cfg.witness ? 0 : (uint16_t)srv->thr.nthreads;	/* (a witness has none to match) */
	priv.reserved16 = 0;
	priv.reserved = 0;
	rps__srv_auth_accepted(srv, c, &req, &priv);
	ret = rps__accept(req_, srv->cq, &attr, &priv, sizeof(priv), &c->ep);
	if (ret) {
		rps__log(RPS__LOG_WARN, "accept failed: %s", rps__errbuf());
		goto err_free;
	}
	rps__ep_set_context(c->ep, c);
	for (i = 0; i < c->bufs.nrecv; i++)
		if (post_recv_buf(c, i)) {
			rps__log(RPS__LOG_WARN, "posting receives for %s: %s", rps__ep_peer(c->ep), rps__errbuf());
			goto err_free;
		}
	c->bufs.recvs_posted = true;
	if (conn_table_add(srv, c))
		goto err_free;
	if (c->auth.authed) {
		rps__srv_conn_authed(srv, c);
	} else {	/* (room was made above) */
		memcpy(c->auth.host, host, sizeof(c->auth.host));
		c->auth.waiting = true;
		srv->preauth.q[srv->preauth.n++] = c;
	}
	return;
err_free:
	conn_free(srv, c);
}

bool rps__srv_peer_threads_ok(struct rps__server *srv, uint64_t peer_id, unsigned theirs)
{
	uint64_t now = rps__now_ns();

	if (!theirs || theirs == srv->thr.nthreads || srv->cfg.witness)
		return true;
	/* partition p's replication stream runs between the two members'
	 * threads p % --threads: with different counts, a thread would dial
	 * one the other member does not have, or the wrong one */
	if (!srv->threads_log_ns || now - srv->threads_log_ns >= 30000000000ull) {
		rps__log(RPS__LOG_ERROR,
			 "member %llu runs --threads %u, this member (%llu) --threads %u: its peer connection "
			 "is refused; start every member with the same --threads",
			 (unsigned long long)peer_id, theirs, (unsigned long long)srv->my_id, srv->thr.nthreads);
		srv->threads_log_ns = now;
	}
	return false;
}

/* What a connection does once it is authed (at once on a server without a
 * key): a peer is taken by the control plane, a replication stream starts. */
void rps__srv_conn_authed(struct rps__server *srv, struct srv_conn *c)
{
	const char *why = NULL;

	if (c->role == CONN_PEER && !rps__srv_peer_threads_ok(srv, c->peer_id, c->peer_threads)) {
		conn_fail(c, "--threads differs from this member's");
		return;
	}
	if (c->role == CONN_PEER && srv->cfg.keys) {
		/* (without a key it was asked before the accept) */
		if (!srv->hooks.accept_peer)
			why = "this server takes no peers";
		else
			srv->hooks.accept_peer(srv->hooks.ctx, c->auth.req.from_id, c->auth.req.to_id,
					       rps__ep_peer(c->ep), &why);
		if (why) {
			conn_fail(c, why);
			return;
		}
	}
	if (c->role == CONN_REPL && srv->cfg.keys && !c->repl.rev_in && rps__srv_repl_accepted(srv, c)) {
		conn_fail(c, rps__errbuf());
		return;
	}
	if (c->repl.rev_in)
		rps__srv_repl_rev_accepted(srv, c);
	if (c->role == CONN_PEER && srv->hooks.peer_attached)
		srv->hooks.peer_attached(srv->hooks.ctx, c);
	else
		rps__log(c->role == CONN_WORKER ? RPS__LOG_INFO : RPS__LOG_DEBUG, "%s connected from %s",
			 rps__srv_role_name(c), rps__ep_peer(c->ep));
}

/* peer_dial: an outgoing peer connection joins the table. */
int rps__srv_conn_attach(struct rps__server *srv, struct srv_conn *c)
{
	uint32_t i;
	int ret;

	rps__ep_set_context(c->ep, c);
	for (i = 0; !c->bufs.recvs_posted && i < c->bufs.nrecv; i++) {	/* (the handshake posted them) */
		ret = post_recv_buf(c, i);
		if (ret)
			return ret;
	}
	c->bufs.recvs_posted = true;
	c->auth.authed = true;
	return conn_table_add(srv, c) ? rps__seterr(-ENOMEM, "out of memory") : 0;
}

void rps__srv_accept_pending(struct rps__server *srv)
{
	struct rps__conn_req *req;

	while (rps__listener_get_request(srv->listener, &req) == 0)
		accept_one(srv, req);
}
