/*
 * dataplane.c - the data plane as the control plane sees it (dataplane.h):
 * the ops table over the server's connections, partitions and checkpoint
 * holds, and the registration of the layer above.
 */
#include "config.h"
#include "common/common.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

#define PEER_CONNECT_TIMEOUT_MS 2000

void rps__dp_set_hooks(struct rps__server *srv, const struct rps__dp_hooks *hooks)
{
	srv->hooks = *hooks;
}

/* ---- the server as a whole -------------------------------------------- */

static void set_member_id(struct rps__server *srv, uint64_t id)
{
	srv->my_id = id;
}

static void set_lease(struct rps__server *srv, uint64_t until_ns)
{
	srv->lease_until = until_ns;
	rps__srv_read_fence(srv);
	if (srv->repl.nrwaits)
		rps__srv_repl_confirm(srv);	/* STEP_DONEs held while it had run out */
}

static void set_map(struct rps__server *srv, uint32_t npart, uint64_t applied)
{
	srv->npart = npart;
	srv->map_applied = applied;
}

static int map_register(struct rps__server *srv, void *buf, size_t len)
{
	int ret = rps__mr_reg(srv->fab, buf, len, RPS__ACCESS_REMOTE_READ | RPS__ACCESS_WINDOWED, &srv->mapbuf_mr);

	if (!ret)
		srv->mapbuf = buf;
	return ret;
}

static void map_deregister(struct rps__server *srv)
{
	rps__mr_dereg(srv->mapbuf_mr);
	srv->mapbuf_mr = NULL;
	srv->mapbuf = NULL;
}

static int mem_register(struct rps__server *srv, void *buf, size_t len, struct rps__mr **mr)
{
	return rps__mr_reg(srv->fab, buf, len, RPS__ACCESS_REMOTE_READ | RPS__ACCESS_WINDOWED, mr);
}

static void mem_deregister(struct rps__mr *mr)
{
	rps__mr_dereg(mr);
}

static int mem_window(struct srv_conn *c, struct rps__mr *mr, uint32_t *rkey)
{
	return rps__srv_conn_window(c, mr, RPS__ACCESS_REMOTE_READ, rkey);
}

static uint32_t shard_elems(const struct rps__server *srv)
{
	return srv->shard_elems;
}

static void stats(struct rps__server *srv, struct rps__dp_stats *st)
{
	uint32_t i, j;

	memset(st, 0, sizeof(*st));
	for (i = 0; i < srv->nconns; i++)
		st->n_conns += srv->conns[i]->role == CONN_WORKER && srv->conns[i]->auth.authed;
	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		uint32_t n = 0;
		if (!t)
			continue;
		for (j = 0; j < srv->npart; j++)
			if (t->regions[j].mr && rps__srv_part_serving(srv, j)) {
				n += t->regions[j].nsh;
				st->shard_bytes += (uint64_t)t->regions[j].nsh * t->stride;
			}
		st->tensors++;
		st->shards += n;
	}
}

/* ---- connections -------------------------------------------------------- */

static enum conn_role_kind conn_role(const struct srv_conn *c)
{
	return c->role;
}

static uint64_t conn_peer_id(const struct srv_conn *c)
{
	return c->peer_id;
}

static bool conn_dead(const struct srv_conn *c)
{
	return c->dead;
}

static const char *conn_name(const struct srv_conn *c)
{
	return c->ep ? rps__ep_peer(c->ep) : "";
}

static size_t conn_msg_max(const struct srv_conn *c)
{
	return c->bufs.msg_max;
}

/* A move's destination READs the partition image into a buffer of the
 * connection, registered once and kept for the next move. */
static int conn_read(struct srv_conn *c, uint64_t raddr, uint32_t rkey, uint64_t len)
{
	struct rps__wr wr;
	int ret;

	if (c->rd.len < len) {
		rps__mr_dereg(c->rd.mr);
		free(c->rd.buf);
		c->rd.mr = NULL;
		c->rd.len = 0;
		c->rd.buf = malloc(len);
		if (!c->rd.buf)
			return -ENOMEM;
		ret = rps__mr_reg(c->srv->fab, c->rd.buf, len, RPS__ACCESS_LOCAL, &c->rd.mr);
		if (ret) {
			free(c->rd.buf);
			c->rd.buf = NULL;
			return ret;
		}
		c->rd.len = len;
	}
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = ((uint64_t)WRID_READ << 32);
	wr.op = RPS__OP_READ;
	wr.flags = RPS__WR_SIGNALED;
	wr.sge.addr = c->rd.buf;
	wr.sge.len = (uint32_t)len;
	wr.sge.mr = c->rd.mr;
	wr.raddr = raddr;
	wr.rkey = rkey;
	if (len > UINT32_MAX)
		return -EFBIG;
	return rps__post(c->ep, &wr, 1);
}

/* Dial a peer (to_id 0: a --join seed): the loop goes on meanwhile
 * (dial.c), and the layer above hears how it went (peer_dialed). */
static int peer_dial(struct rps__server *srv, const char *uri, uint64_t to_id)
{
	struct rps__conn_priv priv = {
		.magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .role = RPS__ROLE_PEER,
		.from_id = srv->my_id, .to_id = to_id, .nthreads = srv->cfg.witness ? 0 : (uint16_t)srv->thr.nthreads,
	};
	struct rps__ep_attr attr = { 0 };
	struct srv_conn *c;
	int ret;

	ret = rps__srv_conn_new(srv, CONN_PEER, &c);
	if (ret)
		return ret;
	attr.sq_depth = c->bufs.nsend + 8 + RPS__BIND_RESERVE;
	attr.rq_depth = c->bufs.nrecv;
	attr.max_inline = 64;
	ret = rps__srv_dial(srv, c, SRV_DIAL_PEER, to_id, uri, &priv, &attr, PEER_CONNECT_TIMEOUT_MS);
	if (ret) {
		rps__log(RPS__LOG_DEBUG, "peer %llu (%s): %s", (unsigned long long)to_id, uri, rps__errbuf());
		rps__srv_conn_free(srv, c);
	}
	return ret;
}

void rps__srv_peer_dialed(struct rps__server *srv, struct srv_conn *c, int ret, uint64_t to_id, const char *uri,
			  const struct rps__conn_priv *rp)
{
	if (ret) {
		rps__log(RPS__LOG_DEBUG, "peer %llu (%s): %s", (unsigned long long)to_id, uri, rps__errbuf());
		goto fail;
	}
	if (!rp->from_id || rp->from_id == srv->my_id || (to_id && rp->from_id != to_id)) {
		rps__log(RPS__LOG_WARN, "peer at %s answered as member %llu: not the peer expected", uri,
			 (unsigned long long)rp->from_id);
		goto fail;
	}
	if (!rps__srv_peer_threads_ok(srv, rp->from_id, rp->nthreads))
		goto fail;
	c->peer_id = rp->from_id;
	if (rps__srv_conn_attach(srv, c)) {	/* in no table yet when it fails */
		rps__log(RPS__LOG_WARN, "peer at %s: %s", uri, rps__errbuf());
		goto fail;
	}
	if (srv->hooks.peer_dialed)
		srv->hooks.peer_dialed(srv->hooks.ctx, uri, to_id, c);
	return;
fail:
	if (c)
		rps__srv_conn_free(srv, c);
	if (srv->hooks.peer_dialed)
		srv->hooks.peer_dialed(srv->hooks.ctx, uri, to_id, NULL);
}

/* ---- partitions -------------------------------------------------------- */

static void part_set(struct rps__server *srv, uint32_t part, const struct rps__dp_part *view)
{
	bool was_replicated = part < RPS__SMAP_MAX_PART && rps__srv_repl_part(srv, part);
	bool was_serving = part < RPS__SMAP_MAX_PART && rps__srv_part_serving(srv, part);

	if (part < RPS__SMAP_MAX_PART) {
		if (view->primary != srv->parts[part].primary || !srv->repl.primary_since[part])
			srv->repl.primary_since[part] = view->map_epoch;
		srv->parts[part] = *view;
		/* a diverged replica the map dropped (or a partition no longer
		 * ours) is forgotten at once, before a seeding may name the
		 * same member again */
		rps__srv_repl_diverged(srv, part);
	}
	srv->rfence.dirty = true;	/* served or replicated now, or no longer */
	if (view->backup)
		srv->repl.active = true;	/* the repl turn dials its primary when our id is the higher */
	/* a replica the map dropped is no longer waited for */
	if (srv->repl.nrwaits && part < RPS__SMAP_MAX_PART)
		rps__srv_repl_view_changed(srv, part);
	else if (srv->repl.nrwaits)
		rps__srv_repl_confirm(srv);
	/* nor are its credits: pushes held for them may go now */
	if (was_replicated && srv->push.nheld)
		rps__srv_drain_held(srv);
	/* served here from now on (promoted, unfenced): parked pushes in
	 * their turn (a promoted backup's, from its seeding image) are taken
	 * now, not at the next push, which may well be parked behind them */
	else if (view->serving && !was_serving && srv->push.nparked)
		rps__srv_drain_held(srv);
}

static void flush(struct rps__server *srv)
{
	(void)rps__cq_flush(srv->cq);
}

static const struct rps__dp_ops ops = {
	.set_member_id = set_member_id,
	.set_lease = set_lease,
	.set_map = set_map,
	.map_register = map_register,
	.map_deregister = map_deregister,
	.mem_register = mem_register,
	.mem_deregister = mem_deregister,
	.mem_window = mem_window,
	.port = rps__server_port,
	.shard_elems = shard_elems,
	.stats = stats,
	.conn_reply = rps__srv_conn_reply,
	.conn_fail = rps__srv_conn_fail,
	.conn_role = conn_role,
	.conn_peer_id = conn_peer_id,
	.conn_dead = conn_dead,
	.conn_name = conn_name,
	.conn_msg_max = conn_msg_max,
	.conn_read = conn_read,
	.flush = flush,
	.peer_dial = peer_dial,
	.repl_peer = rps__srv_repl_set_peer,
	.part_set = part_set,
	.part_create = rps__srv_part_create,
	.part_promote = rps__srv_part_promote,
	.part_publish = rps__srv_part_publish,
	.part_refuse = rps__srv_refuse_partition,
	.part_fence = rps__srv_part_fence,
	.part_unfence = rps__srv_part_unfence,
	.part_serialize = rps__srv_image_build,
	.part_forget_parked = rps__srv_part_forget_parked,
	.part_install = rps__srv_image_install,
	.part_drop = rps__srv_regions_free_part,
	.repl_seq = rps__srv_repl_seq,
	.part_repl_seq_set = rps__srv_repl_seq_set,
	.part_install_backup = rps__srv_image_install_backup,
	.part_diverged = rps__srv_repl_diverged,
	.part_stream_up = rps__srv_repl_stream_up,
	.part_digest = rps__srv_part_digest,
	.rank_remove = rps__srv_rank_remove,
	.hold_steps = rps__srv_hold_steps,
	.hold_tensor = rps__srv_hold_tensor,
	.hold_release = rps__srv_hold_release,
	.hold_reached = rps__srv_hold_reached,
	.drain = rps__srv_drain_held,
	.take = rps__srv_take,
	.copy_free = rps__srv_copy_free,
	.restore_tensor = rps__srv_restore_tensor,
	.restore_shard = rps__srv_restore_shard,
};

const struct rps__dp_ops *rps__dataplane_ops(void)
{
	return &ops;
}
