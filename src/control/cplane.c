/*
 * cplane.c - the server's control plane: the Raft node that orders changes
 * of the shard map, the connections to the other servers it talks over, the
 * moves of partitions, and psctl's requests.
 *
 * Everything here runs on the serving thread, between completions: Raft
 * ticks and move duties are timers of the server loop, Raft messages arrive
 * as SEND/RECV on peer connections (verbs or TCP, the transport does not
 * matter here), and a moved partition travels as one RDMA READ by the new
 * owner from a buffer the old owner registered.
 *
 * A move (psctl move, add-server, remove-server) goes:
 *   leader        proposes MOVE_BEGIN(p, from, to, epoch e)
 *   from (owner)  on applying it: refuses pushes for p (workers get
 *                 RPS_ESTALE_EPOCH and retry elsewhere, nothing applied),
 *                 seals every lock word of p with the FENCE owner, publishes
 *                 epoch MOVED in every header, serialises p (parameters,
 *                 versions, optimizer state, sync accumulators, clocks,
 *                 applied push ids, parked pushes) with a crc32c, registers
 *                 it and sends MIGRATE to `to`
 *   to            READs it, checks the crc, installs it (not yet serving),
 *                 answers, and proposes MOVE_COMMIT(p, to, e)
 *   everyone      on applying COMMIT: owner = to, epoch e + 1; `to` serves;
 *                 `from` deregisters its copy (revoking remote access) after
 *                 a grace period.
 * Nothing is accepted for p between the fence and the commit, so no push is
 * applied twice or lost: a refused push was never applied, an acknowledged
 * one is in the shipped state.  If `to` does not install p in time, `from`
 * proposes MOVE_ABORT; whichever of COMMIT and ABORT is first in the log
 * wins on every server.
 *
 * Peer connections: the server with the higher member id connects, so two
 * servers never wait on each other's accept.
 */
#include "config.h"
#include "kernels/agg.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/fsutil.h"
#include "server/server_int.h"
#include "transport/uri.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "rdmaps.h"

#define MIG_MAGIC 0x47494d50u	/* "PMIG" */
#define MIG_VERSION 1u
#define PEER_CONNECT_TIMEOUT_MS 2000
#define PEER_RETRY_NS 1000000000ull
#define DUTY_NS 20000000ull

volatile int rps__cp_isolated;

static uint64_t ms_ns(uint64_t ms)
{
	return ms * 1000000ull;
}

/* ---- the map as workers see it -------------------------------------------- */

/* Workers READ the encoded map one-sidedly; its crc tells them a read that
 * raced with this copy (they read again). */
static void map_publish(struct rps__server *srv)
{
	char tmp[RPS__MAP_BUF];
	size_t len = 0;
	uint32_t len32;

	if (!srv->map.npart)
		return;
	/* [u32 length][encoded map]: the map's crc catches a torn read */
	if (rps__smap_encode(&srv->map, tmp + 4, sizeof(tmp) - 4, &len)) {
		rps__log(RPS__LOG_ERROR, "encoding the shard map: %s", rps__errbuf());
		return;
	}
	len32 = (uint32_t)len;
	memcpy(tmp, &len32, 4);
	memset(tmp + 4 + len, 0, sizeof(tmp) - 4 - len);
	memcpy(srv->mapbuf, tmp, sizeof(tmp));
}

/* ---- peers ------------------------------------------------------------------ */

static struct peer *peer_get(struct rps__server *srv, uint64_t id, bool add)
{
	uint32_t i;

	for (i = 0; i < srv->npeers; i++)
		if (srv->peers[i].id == id)
			return &srv->peers[i];
	if (!add || srv->npeers == RPS__SMAP_MAX_MEMBERS)
		return NULL;
	srv->peers[srv->npeers] = (struct peer){ .id = id };
	return &srv->peers[srv->npeers++];
}

static void peer_send(struct rps__server *srv, uint64_t to, unsigned type, uint64_t req_id,
		      int32_t status, const void *body, size_t len)
{
	struct peer *p = peer_get(srv, to, false);

	if (!p || !p->c || p->c->dead || rps__cp_isolated)
		return;
	rps__srv_conn_reply(p->c, type, req_id, status, body, len);
}

int rps__cp_accept_peer(struct rps__server *srv, uint64_t from_id, uint64_t to_id, const char **why)
{
	struct peer *p;

	if (rps__cp_isolated) {
		*why = "isolated (fault injection)";
		return -ENETUNREACH;
	}
	if (to_id && to_id != srv->my_id) {	/* 0: a joining server that knows only our address */
		*why = "wrong member id: this server has another id";
		return -EINVAL;
	}
	if (!from_id || from_id == srv->my_id) {
		*why = "bad peer id";
		return -EINVAL;
	}
	p = peer_get(srv, from_id, true);
	if (!p) {
		*why = "too many peers";
		return -ENOSPC;
	}
	if (p->c) {	/* it reconnected: the old connection is dead to it */
		rps__srv_conn_fail(p->c, "replaced by a new connection");
		p->c = NULL;
	}
	return 0;
}

void rps__cp_peer_attached(struct rps__server *srv, struct conn *c)
{
	struct peer *p = peer_get(srv, c->peer_id, true);

	if (p) {
		p->c = c;
		p->inflight = 0;
	}
	rps__log(RPS__LOG_INFO, "peer %llu connected from %s", (unsigned long long)c->peer_id,
		 rps__ep_peer(c->ep));
}

void rps__cp_on_send_done(struct rps__server *srv, struct conn *c)
{
	(void)srv;
	(void)c;
}

static void admin_conn_gone(struct rps__server *srv, struct conn *c);

void rps__cp_on_conn_gone(struct rps__server *srv, struct conn *c)
{
	uint32_t i;

	admin_conn_gone(srv, c);
	rps__ck_conn_gone(srv, c);
	if (c->role != CONN_PEER)
		return;
	for (i = 0; i < srv->npeers; i++)
		if (srv->peers[i].c == c) {
			srv->peers[i].c = NULL;
			srv->peers[i].next_connect = rps__now_ns() + PEER_RETRY_NS / 4;
			rps__log(RPS__LOG_INFO, "peer %llu disconnected", (unsigned long long)srv->peers[i].id);
		}
	/* a partition offered over it is offered again on the next connection */
	for (i = 0; i < srv->map.npart; i++)
		if (srv->parts[i].st == PART_SHIPPED && srv->parts[i].to == c->peer_id && !srv->parts[i].installed)
			srv->parts[i].offered = false;
}

static struct conn *peer_dial(struct rps__server *srv, const char *uri, uint64_t to_id, uint64_t *got_id)
{
	struct rps__conn_priv priv = {
		.magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .role = RPS__ROLE_PEER,
		.from_id = srv->my_id, .to_id = to_id,
	};
	struct rps__ep_attr attr = { 0 };
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t reply_len = RPS__PRIVDATA_MAX;
	struct rps__conn_priv rp;
	struct rps__uri u;
	struct conn *c;
	int ret;

	if (rps__uri_parse(uri, &u))
		return NULL;
	if (rps__srv_conn_new(srv, CONN_PEER, &c))
		return NULL;
	attr.sq_depth = c->nsend + 8;
	attr.rq_depth = c->nrecv;
	attr.max_inline = 64;
	memset(reply, 0, sizeof(reply));
	ret = rps__connect(srv->fab, u.host, u.port, srv->cq, &attr, &priv, sizeof(priv),
			   PEER_CONNECT_TIMEOUT_MS, reply, &reply_len, &c->ep);
	if (ret) {
		rps__log(RPS__LOG_DEBUG, "peer %llu (%s): %s", (unsigned long long)to_id, uri, rps__errbuf());
		rps__srv_conn_free(srv, c);
		return NULL;
	}
	memset(&rp, 0, sizeof(rp));
	memcpy(&rp, reply, RPS__MIN(reply_len, sizeof(rp)));
	if (reply_len < sizeof(rp) || !rp.from_id || rp.from_id == srv->my_id || (to_id && rp.from_id != to_id)) {
		rps__log(RPS__LOG_WARN, "peer at %s answered as member %llu: not the peer expected", uri,
			 (unsigned long long)rp.from_id);
		rps__srv_conn_free(srv, c);
		return NULL;
	}
	c->peer_id = rp.from_id;
	if (rps__srv_conn_attach(srv, c)) {
		rps__srv_conn_fail(c, rps__errbuf());
		return NULL;
	}
	*got_id = rp.from_id;
	return c;
}

/* A server started with --join knows no member ids yet: it dials the
 * addresses of --cluster and learns who answers. */
static void peers_connect_seeds(struct rps__server *srv, uint64_t now)
{
	int i;

	for (i = 0; i < srv->ncluster; i++) {
		char uri[300];
		uint64_t id = 0;
		struct conn *c;
		struct peer *p;
		uint32_t k;
		bool have = false;

		rps__uri_str(&srv->cluster[i], uri, sizeof(uri));
		for (k = 0; k < srv->npeers; k++)
			if (srv->peers[k].c && !srv->peers[k].c->dead && srv->peers[k].c->ep &&
			    !strcmp(rps__ep_peer(srv->peers[k].c->ep), uri + (strstr(uri, "://") ? strstr(uri, "://") - uri + 3 : 0)))
				have = true;
		if (have || now < srv->seed_next[i])
			continue;
		srv->seed_next[i] = now + PEER_RETRY_NS;
		c = peer_dial(srv, uri, 0, &id);
		if (!c)
			continue;
		p = peer_get(srv, id, true);
		if (!p) {
			rps__srv_conn_fail(c, "too many peers");
			continue;
		}
		if (p->c)
			rps__srv_conn_fail(p->c, "replaced by a new connection");
		p->c = c;
		rps__log(RPS__LOG_INFO, "joining: connected to member %llu at %s", (unsigned long long)id, uri);
	}
}

/* Connect to the members with lower ids (they connect to us otherwise). */
static void peers_connect(struct rps__server *srv, uint64_t now)
{
	uint32_t i;

	if (rps__cp_isolated) {
		for (i = 0; i < srv->npeers; i++)
			if (srv->peers[i].c && !srv->peers[i].c->dead)
				rps__srv_conn_fail(srv->peers[i].c, "isolated (fault injection)");
		return;
	}

	if (!srv->map.nmembers) {
		peers_connect_seeds(srv, now);
		return;
	}
	for (i = 0; i < srv->map.nmembers; i++) {
		const struct rps__smap_member *m = &srv->map.members[i];
		uint64_t id = 0;
		struct peer *p;
		struct conn *c;

		if (m->id >= srv->my_id)
			continue;
		p = peer_get(srv, m->id, true);
		if (!p || p->c || now < p->next_connect)
			continue;
		p->next_connect = now + PEER_RETRY_NS;
		c = peer_dial(srv, m->uri, m->id, &id);
		if (!c)
			continue;
		p->c = c;
		p->inflight = 0;
		rps__log(RPS__LOG_INFO, "connected to peer %llu at %s", (unsigned long long)m->id, m->uri);
	}
}

/* ---- partitions: fencing, shipping, installing ------------------------------ */

static uint64_t fenced_word(uint64_t w)
{
	return rps__lock_locked(rps__lock_version(w), RPS__LOCK_OWNER_FENCE);
}

static bool is_fenced(uint64_t w)
{
	return rps__lock_is_locked(w) && rps__lock_owner(w) == RPS__LOCK_OWNER_FENCE;
}

/* Refuse what waits for a partition that is leaving: held pushes (never
 * applied: the workers send them to the new owner) and WAITs. */
void rps__srv_refuse_partition(struct rps__server *srv, uint32_t part)
{
	uint32_t i = 0;

	while (i < srv->nwaiters) {
		struct waiter *w = &srv->waiters[i];
		struct tensor *t = w->tensor_id < srv->ntensors ? srv->tensors[w->tensor_id] : NULL;
		if (t && t->shards[w->local].part == part) {
			rps__srv_conn_reply(w->conn, RPS__MSG_WAIT_REP, w->req_id, RPS_ESTALE_EPOCH, NULL, 0);
			*w = srv->waiters[--srv->nwaiters];
			continue;
		}
		i++;
	}
	/* consume() refuses pushes of a partition that is not served */
	rps__srv_drain_held(srv);
}

/* Seal every lock word of the partition.  A word a worker holds is left
 * until its push is decided (or its lease broken): 1 when all are sealed. */
static bool fence_partition(struct rps__server *srv, uint32_t part)
{
	bool all = true;
	uint32_t i, j;

	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		struct region *r = t ? &t->regions[part] : NULL;
		if (!r || !r->mr)
			continue;
		for (j = 0; j < r->nsh; j++) {
			struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
			uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE), old = 0;
			if (is_fenced(w))
				continue;
			if (rps__lock_is_locked(w)) {
				all = false;
				continue;
			}
			if (rps__local_cas(srv->fab, r->mr, &s->hdr->lock, w, fenced_word(w), &old) || old != w)
				all = false;
		}
	}
	for (i = 0; i < srv->nheld; i++) {
		struct conn *c = srv->held[i].conn;
		const struct rps__push_desc *d = (const void *)(c->slots + (size_t)srv->held[i].slot * srv->slot_size);
		struct tensor *t = d->tensor_id < srv->ntensors ? srv->tensors[d->tensor_id] : NULL;
		if (t && d->shard < t->layout.nshards && t->shards[d->shard].part == part)
			all = false;
	}
	return all;
}

static void unfence_partition(struct rps__server *srv, uint32_t part, uint64_t epoch)
{
	uint32_t i, j;

	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		struct region *r = t ? &t->regions[part] : NULL;
		if (!r || !r->mr)
			continue;
		for (j = 0; j < r->nsh; j++) {
			struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
			uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE), old = 0;
			if (is_fenced(w))
				rps__local_cas(srv->fab, r->mr, &s->hdr->lock, w,
					       rps__lock_unlocked(rps__lock_version(w) + 1), &old);
			rps__srv_publish(s, epoch);
		}
	}
}

/* A growing byte buffer for the partition image. */
struct wbuf {
	char *p;
	size_t len, cap;
	int err;
};

static void put(struct wbuf *b, const void *v, size_t n)
{
	if (b->err)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *g;
		while (cap < b->len + n)
			cap *= 2;
		g = realloc(b->p, cap);
		if (!g) {
			b->err = -ENOMEM;
			return;
		}
		b->p = g;
		b->cap = cap;
	}
	memcpy(b->p + b->len, v, n);
	b->len += n;
}

static void put64(struct wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put32(struct wbuf *b, uint32_t v) { put(b, &v, 4); }

struct rbuf {
	const char *p;
	size_t len, off;
	bool bad;
};

static const void *get(struct rbuf *b, size_t n)
{
	const void *v;

	if (b->bad || n > b->len - b->off) {
		b->bad = true;
		return NULL;
	}
	v = b->p + b->off;
	b->off += n;
	return v;
}

static uint64_t get64(struct rbuf *b)
{
	const void *v = get(b, 8);
	uint64_t x = 0;

	if (v)
		memcpy(&x, v, 8);
	return x;
}

static uint32_t get32(struct rbuf *b)
{
	const void *v = get(b, 4);
	uint32_t x = 0;

	if (v)
		memcpy(&x, v, 4);
	return x;
}

/*
 * The image of a fenced partition (host byte order: both ends are rdmapsd
 * of the same build on one fabric; the crc covers all of it):
 *   magic, version, part, epoch, ntensors
 *   per tensor: name[64], spec, nshards here, then per shard:
 *     index, step, min_clock, lock version, ready, next_rank, elems,
 *     params, optimizer state, accumulator (sync), clocks (bounded),
 *     n applied-push-ids, (client, push id) pairs
 *   nparked, per parked push: tensor ordinal, shard, clock, rank, nbytes, data
 */
static int serialize_partition(struct rps__server *srv, uint32_t part, struct wbuf *b)
{
	uint32_t i, j, nt = 0, np = 0;

	put32(b, MIG_MAGIC);
	put32(b, MIG_VERSION);
	put32(b, part);
	put64(b, srv->parts[part].epoch);
	for (i = 0; i < srv->ntensors; i++)
		nt += srv->tensors[i] && srv->tensors[i]->regions[part].mr ? 1u : 0u;
	put32(b, nt);
	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		struct region *r = t ? &t->regions[part] : NULL;
		size_t nstate;
		if (!r || !r->mr)
			continue;
		put(b, t->name, sizeof(t->name));
		put(b, &t->spec, sizeof(t->spec));
		put32(b, r->nsh);
		for (j = 0; j < r->nsh; j++) {
			struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
			uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
			put32(b, s->index);
			put64(b, s->step);
			put64(b, __atomic_load_n(&s->hdr->min_clock, __ATOMIC_ACQUIRE));
			put64(b, rps__lock_version(w));
			put32(b, s->ready);
			put32(b, (uint32_t)s->next_rank);
			put32(b, s->elems);
			put(b, s->params, (size_t)s->elems * 4);
			nstate = rps__optim_state_len(t->optim.type, s->elems);
			if (nstate)
				put(b, s->state, nstate * 4);
			if (s->acc)
				put(b, s->acc, (size_t)s->elems * 4);
			if (s->clocks)
				put(b, s->clocks, (size_t)t->spec.num_workers * 8);
			put32(b, s->ndd);
			if (s->ndd)
				put(b, s->dd, (size_t)s->ndd * sizeof(*s->dd));
		}
	}
	for (i = 0; i < srv->nparked; i++)
		np += srv->parked[i].t->shards[srv->parked[i].local].part == part;
	put32(b, np);
	for (i = 0; i < srv->nparked; i++) {
		struct parked *pk = &srv->parked[i];
		if (pk->t->shards[pk->local].part != part)
			continue;
		put(b, pk->t->name, sizeof(pk->t->name));
		put32(b, pk->local);
		put64(b, pk->clock);
		put32(b, (uint32_t)pk->rank);
		put64(b, pk->nbytes);
		put(b, pk->data, pk->nbytes);
	}
	return b->err;
}

/* Parked pushes of a shipped partition now live in the image. */
static void drop_parked(struct rps__server *srv, uint32_t part)
{
	uint32_t i = 0;

	while (i < srv->nparked) {
		struct parked *pk = &srv->parked[i];
		if (pk->t->shards[pk->local].part == part) {
			free(pk->data);
			rps__srv_mem_give(srv, pk->nbytes);
			srv->parked_bytes -= pk->nbytes;
			*pk = srv->parked[--srv->nparked];
			continue;
		}
		i++;
	}
}

static void blob_free(struct part_local *pl)
{
	rps__mr_dereg(pl->blob_mr);
	free(pl->blob);
	pl->blob = NULL;
	pl->blob_mr = NULL;
	pl->blob_len = 0;
}

static int ship_partition(struct rps__server *srv, uint32_t part)
{
	struct part_local *pl = &srv->parts[part];
	struct wbuf b = { 0 };
	uint32_t i, j;
	int ret;

	/* readers of our copy now learn it moved */
	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		struct region *r = t ? &t->regions[part] : NULL;
		if (!r || !r->mr)
			continue;
		for (j = 0; j < r->nsh; j++)
			rps__srv_publish(&t->shards[rps__part_shard(&t->layout, part, j)], RPS__EPOCH_MOVED);
	}
	ret = serialize_partition(srv, part, &b);
	if (ret) {
		free(b.p);
		return rps__seterr(ret, "partition %u: out of memory serialising it", part);
	}
	pl->blob = b.p;
	pl->blob_len = b.len;
	pl->blob_crc = rps__crc32c_noinv(b.p, b.len);
	/* Test hook: a bit flipped after the crc, as a bad link or DIMM would */
	if (RPS__UNLIKELY(getenv("RPS_FAULT") && strstr(getenv("RPS_FAULT"), "corrupt-migration")))
		((unsigned char *)pl->blob)[pl->blob_len / 2] ^= 0x04;
	ret = rps__mr_reg(srv->fab, pl->blob, pl->blob_len, RPS__ACCESS_REMOTE_READ, &pl->blob_mr);
	if (ret) {
		free(pl->blob);
		pl->blob = NULL;
		return ret;
	}
	drop_parked(srv, part);
	pl->st = PART_SHIPPED;
	pl->offered = false;
	pl->installed = false;
	pl->next_try = 0;
	rps__log(RPS__LOG_INFO, "partition %u fenced (epoch %llu): %zu bytes for member %llu", part,
		 (unsigned long long)pl->epoch, pl->blob_len, (unsigned long long)pl->to);
	return 0;
}

static void offer_partition(struct rps__server *srv, uint32_t part, uint64_t now)
{
	struct part_local *pl = &srv->parts[part];
	struct peer *p = peer_get(srv, pl->to, false);
	struct rps__migrate m = {
		.part = part, .epoch = pl->epoch, .from = srv->my_id,
		.addr = (uint64_t)(uintptr_t)pl->blob, .rkey = rps__mr_rkey(pl->blob_mr),
		.crc = pl->blob_crc, .len = pl->blob_len,
	};

	if (!p || !p->c || p->c->dead || now < pl->next_try)
		return;
	pl->next_try = now + PEER_RETRY_NS;
	pl->offered = true;
	rps__srv_conn_reply(p->c, RPS__MSG_MIGRATE, part, 0, &m, sizeof(m));
}

static void regions_free_part(struct rps__server *srv, uint32_t part)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i])
			rps__srv_region_free(srv, srv->tensors[i], part);
}

/* What the validation pass keeps of each tensor of an image. */
struct img_tensor {
	const char *name;
	struct rps__tensor_spec spec;
	struct rps__layout layout;
	uint32_t nsh;
	uint64_t *steps;	/* per shard of the partition, in image order */
};

static void img_tensors_free(struct img_tensor *it, uint32_t n)
{
	if (!it)
		return;
	for (uint32_t i = 0; i < n; i++)
		free(it[i].steps);
	free(it);
}

/*
 * Walk a partition image and check every field against this server before
 * anything of it is installed (install_partition trusts what passes): the
 * crc only says the bytes arrived as sent, not that the sender (a buggy or
 * confused peer, or another build) sent something this server can use.
 * No side effect: 0, or -EBADMSG with a message naming the first bad field.
 */
static int check_partition_image(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img,
				 size_t len)
{
	struct rbuf b = { .p = img, .len = len };
	struct img_tensor *its = NULL;
	uint32_t nt, i, j, k, np;
	const char *why = NULL;
	char what[160] = "";
	int ret = 0;

#define BAD(...) do { snprintf(what, sizeof(what), __VA_ARGS__); goto bad; } while (0)
	if (get32(&b) != MIG_MAGIC || get32(&b) != MIG_VERSION || get32(&b) != part || get64(&b) != epoch)
		return rps__seterr(-EBADMSG, "partition %u: not the image of this move", part);
	nt = get32(&b);
	/* every tensor takes at least its name, spec and count */
	if (b.bad || nt > (b.len - b.off) / (RPS__NAME_MAX + sizeof(struct rps__tensor_spec) + 4))
		BAD("%u tensors cannot fit the image", nt);
	its = calloc(nt ? nt : 1, sizeof(*its));
	if (!its)
		return rps__seterr(-ENOMEM, "partition %u: out of memory checking its image", part);
	for (i = 0; i < nt; i++) {
		struct img_tensor *it = &its[i];
		const struct rps__tensor_spec *sp;
		struct tensor *t;
		bool sync, bounded;
		size_t nstate;

		it->name = get(&b, RPS__NAME_MAX);
		sp = get(&b, sizeof(*sp));
		if (!it->name || !sp)
			BAD("truncated in tensor %u of %u", i + 1, nt);
		if (!memchr(it->name, '\0', RPS__NAME_MAX) || !it->name[0])
			BAD("tensor %u has no valid name", i + 1);
		for (k = 0; k < i; k++)
			if (!strcmp(its[k].name, it->name))
				BAD("tensor '%s' comes twice", it->name);
		memcpy(&it->spec, sp, sizeof(it->spec));
		t = rps__srv_tensor_by_name(srv, it->name);
		if (t) {
			if (memcmp(&t->spec, &it->spec, sizeof(it->spec)))
				BAD("tensor '%s' exists here with other options", it->name);
			it->layout = t->layout;
		} else if (rps__srv_spec_valid(srv, it->name, &it->spec, &it->layout)) {
			BAD("%s", rps__errbuf());
		}
		sync = it->spec.mode == RPS_MODE_SYNC;
		bounded = it->spec.mode == RPS_MODE_BOUNDED;
		it->nsh = get32(&b);
		if (b.bad || it->nsh != rps__part_nshards(&it->layout, part))
			BAD("tensor '%s' has %u shards in the partition, this server expects %u", it->name, it->nsh,
			    rps__part_nshards(&it->layout, part));
		it->steps = calloc(it->nsh ? it->nsh : 1, sizeof(*it->steps));
		if (!it->steps) {
			ret = rps__seterr(-ENOMEM, "partition %u: out of memory checking its image", part);
			goto out;
		}
		for (j = 0; j < it->nsh; j++) {
			uint32_t index = get32(&b), ready, next_rank, elems, ndd;
			uint64_t step = get64(&b), min_clock = get64(&b), lockv = get64(&b);
			const struct dedup *dd;
			(void)min_clock;
			ready = get32(&b);
			next_rank = get32(&b);
			elems = get32(&b);
			if (b.bad)
				BAD("truncated in tensor '%s' shard %u", it->name, j);
			if (index != rps__part_shard(&it->layout, part, j))
				BAD("tensor '%s': shard %u where shard %u of the partition belongs", it->name, index,
				    rps__part_shard(&it->layout, part, j));
			/* the published seq is step * 2, the lock word keeps 48 bits of version */
			if (step > (UINT64_MAX >> 2) || lockv >= (1ull << 48) - 1)
				BAD("tensor '%s' shard %u: version %llu / lock version %llu out of range", it->name,
				    index, (unsigned long long)step, (unsigned long long)lockv);
			if (ready > 1)
				BAD("tensor '%s' shard %u: ready flag %u", it->name, index, ready);
			if (sync ? next_rank >= (uint32_t)it->spec.num_workers : next_rank != 0)
				BAD("tensor '%s' shard %u: next rank %u (%d workers)", it->name, index, next_rank,
				    it->spec.num_workers);
			if (elems != rps__shard_elems(&it->layout, index))
				BAD("tensor '%s' shard %u: %u elements, the shard has %u", it->name, index, elems,
				    rps__shard_elems(&it->layout, index));
			it->steps[j] = step;
			nstate = rps__optim_state_len((enum rps_optimizer)it->spec.optimizer, elems);
			if (!get(&b, (size_t)elems * 4) || (nstate && !get(&b, nstate * 4)) ||
			    (sync && !get(&b, (size_t)elems * 4)))
				BAD("tensor '%s' shard %u: truncated in its values", it->name, index);
			if (bounded) {
				const uint64_t *clocks = get(&b, (size_t)it->spec.num_workers * 8);
				uint64_t lo = UINT64_MAX, c;
				if (!clocks)
					BAD("tensor '%s' shard %u: truncated in its clocks", it->name, index);
				for (k = 0; k < (uint32_t)it->spec.num_workers; k++) {
					memcpy(&c, &clocks[k], 8);
					lo = RPS__MIN(lo, c);
				}
				if (lo != min_clock)
					BAD("tensor '%s' shard %u: minimum clock %llu, its clocks say %llu", it->name,
					    index, (unsigned long long)min_clock, (unsigned long long)lo);
			}
			ndd = get32(&b);
			if (b.bad || ndd > (b.len - b.off) / sizeof(*dd) || ndd > 1u << 20)
				BAD("tensor '%s' shard %u: %u applied-push sets cannot fit the image", it->name, index, ndd);
			dd = get(&b, (size_t)ndd * sizeof(*dd));
			for (k = 0; k < ndd; k++) {
				struct dedup d;
				memcpy(&d, &dd[k], sizeof(d));
				if (d.next >= DEDUP_IDS)
					BAD("tensor '%s' shard %u: applied-push set %u is malformed", it->name, index, k);
			}
		}
	}
	np = get32(&b);
	if (b.bad || np > (b.len - b.off) / (RPS__NAME_MAX + 4 + 8 + 4 + 8))
		BAD("%u parked pushes cannot fit the image", np);
	for (i = 0; i < np; i++) {
		const char *name = get(&b, RPS__NAME_MAX);
		uint32_t shard = get32(&b), rank;
		uint64_t clock = get64(&b), nbytes, want;
		struct img_tensor *it = NULL;
		rank = get32(&b);
		nbytes = get64(&b);
		if (b.bad || !memchr(name, '\0', RPS__NAME_MAX))
			BAD("truncated in parked push %u of %u", i + 1, np);
		for (k = 0; k < nt && !it; k++)
			if (!strcmp(its[k].name, name))
				it = &its[k];
		if (!it)
			BAD("parked push %u: tensor '%s' is not in the partition", i + 1, name);
		if (it->spec.mode != RPS_MODE_SYNC)
			BAD("parked push %u: tensor '%s' is not in sync mode", i + 1, it->name);
		if (shard >= it->layout.nshards || rps__shard_server(&it->layout, shard) != part)
			BAD("parked push %u: tensor '%s' shard %u is not in the partition", i + 1, it->name, shard);
		want = (uint64_t)rps__shard_elems(&it->layout, shard) * rps__dtype_size((enum rps_dtype)it->spec.dtype);
		if (nbytes != want)
			BAD("parked push %u: %llu bytes for tensor '%s' shard %u, which takes %llu", i + 1,
			    (unsigned long long)nbytes, it->name, shard, (unsigned long long)want);
		if (rank >= (uint32_t)it->spec.num_workers)
			BAD("parked push %u: rank %u of %d workers", i + 1, rank, it->spec.num_workers);
		if (clock < it->steps[rps__shard_local_index(&it->layout, shard)] || clock == UINT64_MAX)
			BAD("parked push %u: clock %llu of tensor '%s' shard %u is not ahead of its version", i + 1,
			    (unsigned long long)clock, it->name, shard);
		if (!get(&b, nbytes))
			BAD("parked push %u: truncated in its data", i + 1);
	}
	if (b.off != b.len)
		BAD("%zu bytes after its end", b.len - b.off);
	goto out;
#undef BAD
bad:
	why = what;
	ret = rps__seterr(-EBADMSG, "partition %u: image refused, nothing installed: %s (at byte %zu of %zu)", part,
			  why, b.off, b.len);
out:
	img_tensors_free(its, nt);
	return ret;
}

/* Install an image READ from the old owner: tensors it does not know yet
 * come with it.  The regions are filled before they are registered.  The
 * image passed check_partition_image first: nothing is changed for one
 * that fails. */
static int install_partition(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img,
			     size_t len)
{
	struct rbuf b = { .p = img, .len = len };
	uint32_t nt, i, j, np;
	int ret;

	ret = check_partition_image(srv, part, epoch, img, len);
	if (ret)
		return ret;
	if (get32(&b) != MIG_MAGIC || get32(&b) != MIG_VERSION || get32(&b) != part || get64(&b) != epoch)
		return rps__seterr(-EBADMSG, "partition %u: not the image of this move", part);
	regions_free_part(srv, part);
	nt = get32(&b);
	for (i = 0; i < nt && !b.bad; i++) {
		const char *name = get(&b, RPS__NAME_MAX);
		const struct rps__tensor_spec *sp = get(&b, sizeof(*sp));
		struct rps__tensor_spec spec;
		struct tensor *t;
		uint32_t nsh;
		if (!name || !sp || !memchr(name, '\0', RPS__NAME_MAX))
			goto bad;
		memcpy(&spec, sp, sizeof(spec));
		t = rps__srv_tensor_by_name(srv, name);
		if (!t && (ret = rps__srv_tensor_add(srv, name, &spec, &t)))
			goto fail;
		nsh = get32(&b);
		if (nsh != rps__part_nshards(&t->layout, part))
			goto bad;
		ret = rps__srv_region_alloc(srv, t, part, false, NULL);
		if (ret)
			goto fail;
		for (j = 0; j < nsh; j++) {
			struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
			size_t nstate = rps__optim_state_len(t->optim.type, s->elems);
			const void *v;
			if (get32(&b) != s->index)
				goto bad;
			s->step = get64(&b);
			s->hdr->min_clock = get64(&b);
			s->hdr->lock = rps__lock_unlocked(get64(&b) + 1);
			s->ready = get32(&b) != 0;
			s->next_rank = (int)get32(&b);
			if (get32(&b) != s->elems)
				goto bad;
			if (!(v = get(&b, (size_t)s->elems * 4)))
				goto bad;
			memcpy(s->params, v, (size_t)s->elems * 4);
			if (nstate) {
				if (!(v = get(&b, nstate * 4)))
					goto bad;
				memcpy(s->state, v, nstate * 4);
			}
			if (s->acc) {
				if (!(v = get(&b, (size_t)s->elems * 4)))
					goto bad;
				memcpy(s->acc, v, (size_t)s->elems * 4);
			}
			if (s->clocks) {
				if (!(v = get(&b, (size_t)t->spec.num_workers * 8)))
					goto bad;
				memcpy(s->clocks, v, (size_t)t->spec.num_workers * 8);
			}
			s->ndd = get32(&b);
			if (s->ndd > 1u << 20 || !(v = get(&b, (size_t)s->ndd * sizeof(*s->dd))))
				goto bad;
			if (s->ndd) {
				s->dd = malloc((size_t)s->ndd * sizeof(*s->dd));
				if (!s->dd) {
					ret = rps__seterr(-ENOMEM, "out of memory");
					goto fail;
				}
				memcpy(s->dd, v, (size_t)s->ndd * sizeof(*s->dd));
			}
			s->hdr->epoch = epoch + 1;
			s->hdr->seq = s->ready ? s->step * 2 : 1;
		}
		ret = rps__srv_region_register(srv, t, part);
		if (ret)
			goto fail;
	}
	np = get32(&b);
	for (i = 0; i < np && !b.bad; i++) {
		const char *name = get(&b, RPS__NAME_MAX);
		uint32_t shard = get32(&b);
		uint64_t clock = get64(&b);
		int rank = (int)get32(&b);
		uint64_t nbytes = get64(&b);
		const void *data = get(&b, nbytes);
		struct tensor *t = name && memchr(name, '\0', RPS__NAME_MAX) ? rps__srv_tensor_by_name(srv, name) : NULL;
		struct parked *pk;
		if (!data || !t || shard >= t->layout.nshards)
			goto bad;
		if (srv->nparked == srv->parked_cap) {
			uint32_t cap = srv->parked_cap ? srv->parked_cap * 2 : 64;
			struct parked *grown = realloc(srv->parked, cap * sizeof(*grown));
			if (!grown) {
				ret = rps__seterr(-ENOMEM, "out of memory");
				goto fail;
			}
			srv->parked = grown;
			srv->parked_cap = cap;
		}
		pk = &srv->parked[srv->nparked];
		pk->data = malloc(nbytes ? nbytes : 1);
		if (!pk->data) {
			ret = rps__seterr(-ENOMEM, "out of memory");
			goto fail;
		}
		memcpy(pk->data, data, nbytes);
		pk->t = t;
		pk->local = shard;
		pk->clock = clock;
		pk->rank = rank;
		pk->nbytes = nbytes;
		srv->nparked++;
		srv->parked_bytes += nbytes;
		srv->mem_used += nbytes;
	}
	if (b.bad || b.off != b.len)
		goto bad;
	return 0;
bad:
	ret = rps__seterr(-EBADMSG, "partition %u: malformed image at byte %zu of %zu", part, b.off, b.len);
fail:
	regions_free_part(srv, part);
	return ret;
}

int rps__cp_image_build(struct rps__server *srv, uint32_t part, void **img, size_t *len)
{
	struct wbuf b = { 0 };
	int ret = serialize_partition(srv, part, &b);

	if (ret) {
		free(b.p);
		return rps__seterr(ret, "partition %u: out of memory serialising it", part);
	}
	*img = b.p;
	*len = b.len;
	return 0;
}

int rps__cp_image_install(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img, size_t len)
{
	return install_partition(srv, part, epoch, img, len);
}

static void propose_cmd(struct rps__server *srv, const struct rps__smap_cmd *cmd);

void rps__cp_on_read_done(struct rps__server *srv, struct conn *c, bool ok)
{
	struct rps__migrate m = c->rd_mig;
	uint32_t crc;
	int ret;

	if (!c->rd_busy)
		return;
	c->rd_busy = false;
	if (!ok) {
		rps__log(RPS__LOG_WARN, "partition %u: reading it from member %llu failed", m.part,
			 (unsigned long long)m.from);
		return;
	}
	crc = rps__crc32c_noinv(c->rd_buf, m.len);
	if (crc != m.crc) {
		rps__log(RPS__LOG_ERROR, "partition %u from member %llu: crc32c %08x, expected %08x: corrupted in flight, refused",
			 m.part, (unsigned long long)m.from, crc, m.crc);
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, c->rd_req_id, -EILSEQ, NULL, 0);
		return;
	}
	if (srv->map.parts[m.part].moving_to != srv->my_id || srv->map.parts[m.part].epoch != m.epoch) {
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, c->rd_req_id, RPS_ESTALE_EPOCH, NULL, 0);
		return;
	}
	ret = install_partition(srv, m.part, m.epoch, c->rd_buf, m.len);
	if (ret) {
		rps__log(RPS__LOG_ERROR, "%s", rps__errbuf());
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, c->rd_req_id, ret, NULL, 0);
		return;
	}
	srv->parts[m.part].st = PART_INCOMING;
	srv->parts[m.part].epoch = m.epoch;
	srv->parts[m.part].next_try = 0;
	rps__log(RPS__LOG_INFO, "partition %u installed from member %llu (%llu bytes, crc ok)", m.part,
		 (unsigned long long)m.from, (unsigned long long)m.len);
	rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, c->rd_req_id, 0, NULL, 0);
}

static void on_migrate(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__migrate *m)
{
	struct rps__wr wr;
	int ret;

	if (m->part >= srv->map.npart || srv->map.parts[m->part].moving_to != srv->my_id ||
	    srv->map.parts[m->part].epoch != m->epoch) {
		/* our log may lag: the offer comes again */
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -EAGAIN, NULL, 0);
		return;
	}
	if (srv->parts[m->part].st == PART_INCOMING) {
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, 0, NULL, 0);
		return;
	}
	if (c->rd_busy || m->len > ((uint64_t)1 << 40)) {
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -EBUSY, NULL, 0);
		return;
	}
	if (c->rd_len < m->len) {
		rps__mr_dereg(c->rd_mr);
		free(c->rd_buf);
		c->rd_mr = NULL;
		c->rd_len = 0;
		c->rd_buf = malloc(m->len);
		if (!c->rd_buf) {
			rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -ENOMEM, NULL, 0);
			return;
		}
		ret = rps__mr_reg(srv->fab, c->rd_buf, m->len, RPS__ACCESS_LOCAL, &c->rd_mr);
		if (ret) {
			free(c->rd_buf);
			c->rd_buf = NULL;
			rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, ret, NULL, 0);
			return;
		}
		c->rd_len = m->len;
	}
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = ((uint64_t)WRID_READ << 32);
	wr.op = RPS__OP_READ;
	wr.flags = RPS__WR_SIGNALED;
	wr.sge.addr = c->rd_buf;
	wr.sge.len = (uint32_t)m->len;
	wr.sge.mr = c->rd_mr;
	wr.raddr = m->addr;
	wr.rkey = m->rkey;
	if (m->len > UINT32_MAX) {
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -EFBIG, NULL, 0);
		return;
	}
	ret = rps__post(c->ep, &wr, 1);
	if (ret) {
		rps__srv_conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, ret, NULL, 0);
		return;
	}
	c->rd_busy = true;
	c->rd_mig = *m;
	c->rd_req_id = req_id;
}

static void on_migrate_rep(struct rps__server *srv, struct conn *c, uint32_t part, int32_t status)
{
	struct part_local *pl;

	if (part >= srv->map.npart)
		return;
	pl = &srv->parts[part];
	if (pl->st != PART_SHIPPED || pl->to != c->peer_id)
		return;
	if (status == 0) {
		pl->installed = true;
		return;
	}
	rps__log(status == -EAGAIN ? RPS__LOG_DEBUG : RPS__LOG_WARN, "partition %u: member %llu did not install it: %s",
		 part, (unsigned long long)pl->to, rps_strerror(status));
	pl->offered = false;
}

/* ---- applying the map ----------------------------------------------------- */

static void admin_map_changed(struct rps__server *srv);

/* Bring what this server does with each partition in line with the map. */
static void reconcile(struct rps__server *srv)
{
	uint64_t now = rps__now_ns();
	uint32_t p;

	for (p = 0; p < srv->map.npart; p++) {
		const struct rps__smap_part *mp = &srv->map.parts[p];
		struct part_local *pl = &srv->parts[p];

		if (mp->owner == srv->my_id && !mp->moving_to) {
			if (pl->st == PART_LEAVING || pl->st == PART_SHIPPED) {
				rps__log(RPS__LOG_INFO, "partition %u: move aborted, serving it again", p);
				blob_free(pl);
				unfence_partition(srv, p, mp->epoch);
			} else if (pl->st == PART_INCOMING) {
				uint32_t i, j;
				for (i = 0; i < srv->ntensors; i++) {
					struct tensor *t = srv->tensors[i];
					struct region *r = t ? &t->regions[p] : NULL;
					if (!r || !r->mr)
						continue;
					for (j = 0; j < r->nsh; j++)
						rps__srv_publish(&t->shards[rps__part_shard(&t->layout, p, j)], mp->epoch);
				}
				rps__log(RPS__LOG_INFO, "partition %u is ours now (epoch %llu)", p,
					 (unsigned long long)mp->epoch);
			} else if (pl->st != PART_ACTIVE && (mp->lost || (srv->restarted && !pl->cleared))) {
				/* A restart took what was in memory: refuse it (never
				 * zeros) until restored or accepted empty. */
				if (!mp->lost && !pl->gone && srv->rnode)	/* (after replay: below) */
					rps__log(RPS__LOG_ERROR, "partition %u lost with member %llu (restarted): restore it"
						 " (psctl restore DIR) or accept it empty (psctl forget-lost %u)", p,
						 (unsigned long long)srv->my_id, p);
				pl->gone = !mp->lost;
				pl->st = PART_NONE;
				pl->epoch = mp->epoch;
				continue;
			} else if (pl->st != PART_ACTIVE) {
				uint32_t i;
				/* (bootstrap, or a lost partition accepted empty) */
				for (i = 0; i < srv->ntensors; i++)
					if (srv->tensors[i] && !rps__srv_region_alloc(srv, srv->tensors[i], p, false, NULL))
						rps__srv_region_register(srv, srv->tensors[i], p);
			}
			pl->st = PART_ACTIVE;
			pl->epoch = mp->epoch;
			continue;
		}
		if (mp->owner == srv->my_id && mp->moving_to) {
			if (pl->st == PART_ACTIVE || pl->st == PART_NONE) {
				pl->st = PART_LEAVING;
				pl->epoch = mp->epoch;
				pl->to = mp->moving_to;
				pl->give_up = now + ms_ns(srv->cfg.move_timeout_ms);
				rps__log(RPS__LOG_INFO, "partition %u: moving to member %llu (epoch %llu): fencing", p,
					 (unsigned long long)pl->to, (unsigned long long)pl->epoch);
				rps__srv_refuse_partition(srv, p);
			}
			continue;
		}
		/* not ours */
		pl->gone = false;
		pl->cleared = false;
		if (pl->st == PART_ACTIVE || pl->st == PART_LEAVING || pl->st == PART_SHIPPED) {
			rps__log(RPS__LOG_INFO, "partition %u now belongs to member %llu (epoch %llu)", p,
				 (unsigned long long)mp->owner, (unsigned long long)mp->epoch);
			blob_free(pl);
			if (pl->st == PART_ACTIVE)
				rps__srv_refuse_partition(srv, p);
			pl->st = PART_DRAINING;
			pl->free_at = now + ms_ns(srv->cfg.drain_ms);
		} else if (pl->st == PART_INCOMING && mp->moving_to != srv->my_id) {
			rps__log(RPS__LOG_INFO, "partition %u: move aborted, dropping what was installed", p);
			regions_free_part(srv, p);
			pl->st = PART_NONE;
		}
		pl->epoch = mp->epoch;
	}
	map_publish(srv);
	admin_map_changed(srv);
}

static void cb_apply(void *ctx, uint64_t index, uint64_t term, const void *data, size_t len)
{
	struct rps__server *srv = ctx;
	struct rps__smap_cmd cmd;
	char what[256];
	int ret;

	(void)term;
	if (rps__smap_cmd_decode(data, len, &cmd)) {
		rps__log(RPS__LOG_ERROR, "log entry %llu: %s", (unsigned long long)index, rps__errbuf());
		srv->map.applied = index;
		return;
	}
	ret = rps__smap_apply(&srv->map, index, &cmd);
	rps__smap_cmd_str(&cmd, what, sizeof(what));
	if (ret)
		rps__log(RPS__LOG_DEBUG, "log entry %llu: %s: refused: %s", (unsigned long long)index, what,
			 rps__errbuf());
	else
		rps__log(cmd.type == RPS__SMAP_NOP ? RPS__LOG_DEBUG : RPS__LOG_INFO, "log entry %llu: %s",
			 (unsigned long long)index, what);
	if (!ret && cmd.type == RPS__SMAP_CLEAR_LOST && srv->map.parts[cmd.part].owner == srv->my_id) {
		srv->parts[cmd.part].gone = false;
		srv->parts[cmd.part].cleared = true;
	}
	if (!ret && (cmd.type == RPS__SMAP_REMOVE_MEMBER || cmd.type == RPS__SMAP_FORCE_REMOVE) &&
	    cmd.id == srv->my_id)
		/* linger a moment: workers with operations on their way learn
		 * from refusals that the partitions moved, not from a reset */
		srv->removed_at = rps__now_ns() + ms_ns(srv->cfg.drain_ms);
	reconcile(srv);
}

static void cb_conf_change(void *ctx, uint64_t index, enum rps__raft_conf_op op, uint64_t node)
{
	struct rps__server *srv = ctx;
	static const char *names[] = { "?", "add voter", "add learner", "promote", "remove" };

	rps__log(RPS__LOG_INFO, "log entry %llu: membership: %s %llu", (unsigned long long)index,
		 names[op <= 4 ? op : 0], (unsigned long long)node);
	admin_map_changed(srv);
}

static int bootstrap_map(struct rps__server *srv)
{
	const char *uris[RPS__SMAP_MAX_MEMBERS];
	char bufs[RPS__SMAP_MAX_MEMBERS][300];
	int i;

	if (srv->ncluster > (int)RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-EINVAL, "--cluster lists %d servers; at most %u", srv->ncluster,
				   RPS__SMAP_MAX_MEMBERS);
	for (i = 0; i < srv->ncluster; i++)
		uris[i] = rps__uri_str(&srv->cluster[i], bufs[i], sizeof(bufs[i]));
	return rps__smap_init(&srv->map, uris, (uint32_t)srv->ncluster, srv->cfg.npart);
}

void rps__cp_restored(struct rps__server *srv)
{
	struct rps__smap_cmd cmd;
	bool local = false;
	uint32_t p;

	for (p = 0; p < srv->map.npart; p++) {
		struct part_local *pl = &srv->parts[p];
		if (srv->map.parts[p].owner != srv->my_id || !rps__cp_lost(srv, p))
			continue;
		rps__log(RPS__LOG_INFO, "partition %u restored from a checkpoint", p);
		pl->gone = false;
		pl->cleared = true;
		local = true;
		if (!srv->map.parts[p].lost)
			continue;
		memset(&cmd, 0, sizeof(cmd));
		cmd.type = RPS__SMAP_CLEAR_LOST;
		cmd.part = p;
		cmd.epoch = srv->map.parts[p].epoch;
		pl->next_try = rps__now_ns() + PEER_RETRY_NS / 2;	/* (move_duties retries) */
		propose_cmd(srv, &cmd);
	}
	if (local)
		reconcile(srv);
}

static int cb_restore(void *ctx, uint64_t index, const void *data, size_t len)
{
	struct rps__server *srv = ctx;
	int ret;

	(void)index;
	if (!len) {
		if (srv->cfg.join_id)
			return 0;	/* the leader's snapshot brings the map */
		ret = bootstrap_map(srv);
	} else {
		ret = rps__smap_decode(data, len, &srv->map);
	}
	if (ret)
		return ret;
	reconcile(srv);
	return 0;
}

static int cb_snapshot(void *ctx, void **data, size_t *len)
{
	struct rps__server *srv = ctx;
	size_t cap = rps__smap_encoded_size(&srv->map);
	void *buf = malloc(cap);
	int ret;

	if (!buf)
		return -ENOMEM;
	ret = rps__smap_encode(&srv->map, buf, cap, len);
	if (ret) {
		free(buf);
		return ret;
	}
	*data = buf;
	return 0;
}

static int cb_send(void *ctx, uint64_t to, const void *buf, size_t len)
{
	struct rps__server *srv = ctx;

	if (len + sizeof(struct rps__msg_hdr) > RPS__BIG_MSG_MAX) {
		rps__log(RPS__LOG_WARN, "a Raft message of %zu bytes to %llu is too large for a peer buffer; dropped",
			 len, (unsigned long long)to);
		return -EMSGSIZE;
	}
	peer_send(srv, to, RPS__MSG_RAFT, 0, 0, buf, len);
	return 0;
}

static void cb_read_ready(void *ctx, uint64_t read_ctx, uint64_t index)
{
	(void)ctx;
	(void)read_ctx;
	(void)index;
}

static void cb_role_change(void *ctx, enum rps__raft_role role, uint64_t leader, uint64_t term)
{
	struct rps__server *srv = ctx;

	(void)srv;
	if (role == RPS__RAFT_LEADER)
		rps__log(RPS__LOG_INFO, "raft: leader of term %llu", (unsigned long long)term);
	else if (leader)
		rps__log(RPS__LOG_INFO, "raft: member %llu leads term %llu", (unsigned long long)leader,
			 (unsigned long long)term);
}

/* ---- proposals ---------------------------------------------------------------- */

static void propose_cmd(struct rps__server *srv, const struct rps__smap_cmd *cmd)
{
	char buf[RPS__SMAP_CMD_MAX];
	size_t len;
	uint64_t leader;

	if (rps__smap_cmd_encode(cmd, buf, sizeof(buf), &len))
		return;
	if (rps__rnode_is_leader(srv->rnode)) {
		rps__rnode_propose(srv->rnode, buf, len, NULL, NULL);
		return;
	}
	leader = rps__rnode_leader(srv->rnode);
	if (leader)
		peer_send(srv, leader, RPS__MSG_PROPOSE, 0, 0, buf, len);
}

/* Propose on this node, which leads: 0 with the entry's index and term, or a
 * negative errno with the reason in rps__errbuf() (for an admin's answer). */
static int propose_here(struct rps__server *srv, const struct rps__smap_cmd *cmd, uint64_t *index, uint64_t *term)
{
	char buf[RPS__SMAP_CMD_MAX];
	size_t len;
	int ret = rps__smap_cmd_encode(cmd, buf, sizeof(buf), &len);

	return ret ? ret : rps__rnode_propose(srv->rnode, buf, len, index, term);
}

static void on_propose(struct rps__server *srv, struct conn *c, uint64_t req_id, const void *body, size_t len)
{
	struct rps__propose_rep rep = { 0 };
	struct rps__smap_cmd cmd;
	int ret;

	ret = rps__smap_cmd_decode(body, len, &cmd);
	if (!ret)
		ret = rps__rnode_propose(srv->rnode, body, len, &rep.index, NULL);
	rep.leader = rps__rnode_leader(srv->rnode);
	rps__srv_conn_reply(c, RPS__MSG_PROPOSE_REP, req_id, ret, &rep, sizeof(rep));
}

/* ---- psctl -------------------------------------------------------------------- */

static void admin_reply(struct rps__server *srv, struct conn *c, uint64_t req_id, int status,
			uint64_t index, uint64_t epoch, const char *msg)
{
	struct rps__admin_rep rep;

	memset(&rep, 0, sizeof(rep));
	rep.leader = rps__rnode_leader(srv->rnode);
	rep.index = index;
	rep.epoch = epoch;
	if (msg)
		snprintf(rep.msg, sizeof(rep.msg), "%s", msg);
	rps__srv_conn_reply(c, RPS__MSG_ADMIN_REP, req_id, status, &rep, sizeof(rep));
}

static void admin_done(struct rps__server *srv, uint32_t i, int status, uint64_t epoch, const char *msg)
{
	struct admin_wait *a = &srv->admin[i];

	admin_reply(srv, a->conn, a->req_id, status, srv->map.applied, epoch, msg);
	srv->admin[i] = srv->admin[--srv->nadmin];
}

static void admin_conn_gone(struct rps__server *srv, struct conn *c)
{
	uint32_t i = 0;

	while (i < srv->nadmin) {
		if (srv->admin[i].conn == c) {
			srv->admin[i] = srv->admin[--srv->nadmin];
			continue;
		}
		i++;
	}
}

static bool in_conf(const struct rps__raft_status *st, uint64_t id)
{
	return rps__raft_conf_is_voter(&st->conf, id) || rps__raft_conf_is_learner(&st->conf, id);
}

/* Settle the psctl requests that the log has now decided. */
static void admin_map_changed(struct rps__server *srv)
{
	struct rps__raft_status st;
	uint32_t i = 0;

	if (!srv->rnode)
		return;
	rps__rnode_status(srv->rnode, &st);
	while (i < srv->nadmin) {
		struct admin_wait *a = &srv->admin[i];
		const struct rps__smap_part *mp = a->op == RPS__ADMIN_MOVE ? &srv->map.parts[a->part] : NULL;
		char msg[200];

		switch (a->op) {
		case RPS__ADMIN_MOVE:
			if (mp->owner == a->id && mp->epoch > a->epoch) {
				admin_done(srv, i, 0, mp->epoch, NULL);
				continue;
			}
			if (!mp->moving_to && srv->map.applied >= a->index && mp->epoch == a->epoch) {
				snprintf(msg, sizeof(msg), "move of partition %u to member %llu was aborted: the destination did not install it in time (see its log)",
					 a->part, (unsigned long long)a->id);
				admin_done(srv, i, -ECANCELED, mp->epoch, msg);
				continue;
			}
			break;
		case RPS__ADMIN_ADD_SERVER:
			if (rps__smap_member(&srv->map, a->id) && in_conf(&st, a->id)) {
				admin_done(srv, i, 0, 0, NULL);
				continue;
			}
			break;
		case RPS__ADMIN_REMOVE_SERVER:
			if (!rps__smap_member(&srv->map, a->id) && !in_conf(&st, a->id)) {
				admin_done(srv, i, 0, 0, NULL);
				continue;
			}
			break;
		case RPS__ADMIN_FORCE_REMOVE:
			if (!rps__smap_member(&srv->map, a->id) && !in_conf(&st, a->id)) {
				admin_done(srv, i, 0, 0, NULL);
				continue;
			}
			break;
		case RPS__ADMIN_NOP:
		case RPS__ADMIN_FORGET_LOST:
			if (srv->map.applied >= a->index) {
				if (rps__rnode_term_at(srv->rnode, a->index) == a->term)
					admin_done(srv, i, 0, 0, NULL);
				else
					admin_done(srv, i, -ECANCELED, 0, "the entry was overwritten by a new leader: retry");
				continue;
			}
			break;
		case RPS__ADMIN_TRANSFER_LEADER:
			if (st.leader && st.leader != srv->my_id) {
				admin_done(srv, i, 0, st.leader, NULL);
				continue;
			}
			break;
		}
		i++;
	}
}

static int admin_wait_add(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__admin *a,
			  uint64_t epoch, uint64_t index)
{
	struct admin_wait *w;

	if (srv->nadmin == srv->admin_cap) {
		uint32_t cap = srv->admin_cap ? srv->admin_cap * 2 : 8;
		struct admin_wait *g = realloc(srv->admin, cap * sizeof(*g));
		if (!g)
			return -ENOMEM;
		srv->admin = g;
		srv->admin_cap = cap;
	}
	w = &srv->admin[srv->nadmin++];
	*w = (struct admin_wait){
		.conn = c, .req_id = req_id, .op = a->op, .part = a->part, .id = a->id, .epoch = epoch,
		.index = index, .deadline = rps__now_ns() + ms_ns(a->timeout_ms ? a->timeout_ms : 30000),
	};
	return 0;
}

/* A member's address goes to every client and server in the map: one that
 * does not parse (or holds control bytes) would be carried there for good.
 * Refuse it with a line; true if it is fine. */
static bool admin_uri_ok(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__admin *a)
{
	struct rps__uri u;
	size_t k, n = strlen(a->uri);
	bool ok = n < RPS__SMAP_URI_MAX && rps__uri_parse(a->uri, &u) == 0;
	char esc[4 * sizeof(a->uri)], msg[200];

	for (k = 0; ok && k < n; k++)
		ok = (unsigned char)a->uri[k] >= 0x21 && (unsigned char)a->uri[k] <= 0x7e;
	if (ok)
		return true;
	snprintf(msg, sizeof(msg), "bad address '%.100s' for member %llu: give tcp://HOST:PORT or verbs://ADDR:PORT",
		 rps__escape(a->uri, esc, sizeof(esc)), (unsigned long long)a->id);
	rps__log(RPS__LOG_WARN, "admin %s: add-server: %s", rps__ep_peer(c->ep), msg);
	admin_reply(srv, c, req_id, -EINVAL, 0, 0, msg);
	return false;
}

static void on_admin(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__admin *a)
{
	struct rps__smap_cmd cmd;
	struct rps__raft_status st;
	uint64_t index = 0, epoch = 0, term = 0;
	int ret;

	if (!rps__rnode_is_leader(srv->rnode)) {
		admin_reply(srv, c, req_id, -EPERM, 0, 0, "not the leader: ask the leader");
		return;
	}
	memset(&cmd, 0, sizeof(cmd));
	rps__rnode_status(srv->rnode, &st);
	switch (a->op) {
	case RPS__ADMIN_MOVE:
		if (a->part >= srv->map.npart) {
			admin_reply(srv, c, req_id, -EINVAL, 0, 0, "no such partition");
			return;
		}
		cmd.type = RPS__SMAP_MOVE_BEGIN;
		cmd.part = a->part;
		cmd.from = srv->map.parts[a->part].owner;
		cmd.to = a->id;
		cmd.epoch = epoch = srv->map.parts[a->part].epoch;
		if (cmd.from == cmd.to && !srv->map.parts[a->part].moving_to) {
			admin_reply(srv, c, req_id, 0, srv->map.applied, epoch, NULL);
			return;
		}
		break;
	case RPS__ADMIN_ADD_SERVER:
		if (!admin_uri_ok(srv, c, req_id, a))
			return;
		if (rps__smap_member(&srv->map, a->id) && !strcmp(rps__smap_member(&srv->map, a->id)->uri, a->uri)) {
			/* already a member: wait for the learner to be added */
			if (admin_wait_add(srv, c, req_id, a, 0, srv->map.applied))
				admin_reply(srv, c, req_id, -ENOMEM, 0, 0, "out of memory");
			admin_map_changed(srv);
			return;
		}
		cmd.type = RPS__SMAP_ADD_MEMBER;
		cmd.id = a->id;
		snprintf(cmd.uri, sizeof(cmd.uri), "%s", a->uri);
		break;
	case RPS__ADMIN_REMOVE_SERVER:
		if (a->id == srv->my_id) {
			admin_reply(srv, c, req_id, -EBUSY, 0, 0,
				    "this server leads the group: transfer leadership first (psctl transfer-leader)");
			return;
		}
		if (!rps__smap_member(&srv->map, a->id)) {
			if (in_conf(&st, a->id))
				rps__rnode_conf_change(srv->rnode, RPS__RAFT_CONF_REMOVE, a->id, NULL);
			if (admin_wait_add(srv, c, req_id, a, 0, srv->map.applied))
				admin_reply(srv, c, req_id, -ENOMEM, 0, 0, "out of memory");
			admin_map_changed(srv);
			return;
		}
		cmd.type = RPS__SMAP_REMOVE_MEMBER;
		cmd.id = a->id;
		break;
	case RPS__ADMIN_NOP:
		cmd.type = RPS__SMAP_NOP;
		break;
	case RPS__ADMIN_FORCE_REMOVE:
		if (a->id == srv->my_id) {
			admin_reply(srv, c, req_id, -EBUSY, 0, 0,
				    "this server leads the group: transfer leadership first (psctl transfer-leader)");
			return;
		}
		cmd.type = RPS__SMAP_FORCE_REMOVE;
		cmd.id = a->id;
		break;
	case RPS__ADMIN_FORGET_LOST: {
		uint32_t p, n = 0;
		/* one CLEAR_LOST per partition; the answer waits for the last */
		for (p = 0; p < srv->map.npart; p++) {
			if (!srv->map.parts[p].lost || (a->part != UINT32_MAX && a->part != p))
				continue;
			cmd.type = RPS__SMAP_CLEAR_LOST;
			cmd.part = p;
			cmd.epoch = srv->map.parts[p].epoch;
			ret = propose_here(srv, &cmd, &index, &term);
			if (ret) {
				admin_reply(srv, c, req_id, ret, 0, 0, rps__errbuf());
				return;
			}
			n++;
		}
		if (!n) {
			admin_reply(srv, c, req_id, -ENOENT, 0, 0, a->part == UINT32_MAX ? "no partition is lost" :
				    "that partition is not lost");
			return;
		}
		if (admin_wait_add(srv, c, req_id, a, 0, index))
			admin_reply(srv, c, req_id, -ENOMEM, 0, 0, "out of memory");
		else
			srv->admin[srv->nadmin - 1].term = term;
		rps__rnode_process(srv->rnode);
		return;
	}
	case RPS__ADMIN_TRANSFER_LEADER: {
		uint64_t to = a->id, best = 0;
		uint32_t i;
		if (!to) {
			for (i = 0; i < st.conf.n_voters; i++) {
				struct rps__raft_progress_info pi;
				uint64_t v = st.conf.voters[i];
				if (v == srv->my_id || rps__rnode_progress(srv->rnode, v, &pi))
					continue;
				if (!to || pi.match > best) {
					to = v;
					best = pi.match;
				}
			}
		}
		if (!to || to == srv->my_id || !rps__raft_conf_is_voter(&st.conf, to)) {
			admin_reply(srv, c, req_id, -EINVAL, 0, 0, "no other voter to hand leadership to");
			return;
		}
		ret = rps__rnode_transfer_leader(srv->rnode, to);
		if (ret) {
			admin_reply(srv, c, req_id, ret, 0, 0, rps__errbuf());
			return;
		}
		if (admin_wait_add(srv, c, req_id, a, 0, 0))
			admin_reply(srv, c, req_id, -ENOMEM, 0, 0, "out of memory");
		return;
	}
	default:
		admin_reply(srv, c, req_id, -EINVAL, 0, 0, "unknown admin operation");
		return;
	}
	ret = rps__smap_check(&srv->map, &cmd);
	if (!ret)
		ret = propose_here(srv, &cmd, &index, &term);
	if (ret) {
		admin_reply(srv, c, req_id, ret, 0, 0, rps__errbuf());
		return;
	}
	if (admin_wait_add(srv, c, req_id, a, epoch, index))
		admin_reply(srv, c, req_id, -ENOMEM, 0, 0, "out of memory");
	else
		srv->admin[srv->nadmin - 1].term = term;
	/* with fsync and one voter, it may be committed already */
	rps__rnode_process(srv->rnode);
}

static void on_status(struct rps__server *srv, struct conn *c, uint64_t req_id)
{
	static char buf[sizeof(struct rps__status_rep) + RPS__SMAP_ENC_MAX];
	struct rps__status_rep *rep = (void *)buf;
	struct rps__raft_status st;
	size_t len = 0;
	uint32_t i, j, k = 0;

	memset(buf, 0, sizeof(*rep));
	rps__rnode_status(srv->rnode, &st);
	rep->id = srv->my_id;
	rep->term = st.term;
	rep->vote = st.vote;
	rep->leader = st.leader;
	rep->commit = st.commit;
	rep->applied = st.applied;
	rep->last_index = st.last_index;
	rep->snapshot_index = st.snapshot_index;
	rep->role = st.role;
	rep->n_voters = st.conf.n_voters;
	rep->n_learners = st.conf.n_learners;
	for (i = 0; i < st.conf.n_voters && i < 16; i++) {
		struct rps__raft_progress_info pi = { 0 };
		rep->voters[i] = st.conf.voters[i];
		if (!rps__rnode_progress(srv->rnode, st.conf.voters[i], &pi))
			rep->match[k] = pi.match;
		k++;
	}
	for (i = 0; i < st.conf.n_learners && i < 16; i++) {
		struct rps__raft_progress_info pi = { 0 };
		rep->learners[i] = st.conf.learners[i];
		if (k < 16 && !rps__rnode_progress(srv->rnode, st.conf.learners[i], &pi))
			rep->match[k] = pi.match;
		k++;
	}
	for (i = 0; i < srv->nconns; i++)
		rep->n_conns += srv->conns[i]->role == CONN_WORKER;
	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		uint32_t n = 0;
		if (!t)
			continue;
		for (j = 0; j < srv->map.npart; j++)
			if (t->regions[j].mr && rps__cp_serving(srv, j)) {
				n += t->regions[j].nsh;
				rep->shard_bytes += (uint64_t)t->regions[j].nsh * t->stride;
			}
		rep->tensors++;
		rep->shards += n;
	}
	rep->fsync = !srv->cfg.fsync_none;
	if (srv->map.npart && rps__smap_encode(&srv->map, buf + sizeof(*rep), sizeof(buf) - sizeof(*rep), &len))
		len = 0;
	rps__srv_conn_reply(c, RPS__MSG_STATUS_REP, req_id, 0, buf, sizeof(*rep) + len);
}

void rps__cp_on_message(struct rps__server *srv, struct conn *c, const struct rps__msg_hdr *h,
			void *body, uint32_t body_len)
{
	switch (h->type) {
	case RPS__MSG_STATUS:
		on_status(srv, c, h->req_id);
		return;
	case RPS__MSG_CKPT:
		if (c->role == CONN_ADMIN) {
			rps__ck_on_message(srv, c, h, body, body_len);
			return;
		}
		break;
	case RPS__MSG_ADMIN:
		if (c->role == CONN_ADMIN) {
			on_admin(srv, c, h->req_id, body);
			return;
		}
		break;
	case RPS__MSG_RAFT:
		if (c->role == CONN_PEER && rps__cp_isolated)
			return;
		if (c->role == CONN_PEER) {
			if (rps__rnode_recv_from(srv->rnode, c->peer_id, body, body_len))
				rps__log(RPS__LOG_WARN, "peer %llu: %s", (unsigned long long)c->peer_id, rps__errbuf());
			return;
		}
		break;
	case RPS__MSG_PROPOSE:
		if (c->role == CONN_PEER) {
			on_propose(srv, c, h->req_id, body, body_len);
			return;
		}
		break;
	case RPS__MSG_PROPOSE_REP:
		if (c->role == CONN_PEER)
			return;
		break;
	case RPS__MSG_MIGRATE:
		if (c->role == CONN_PEER && body_len == sizeof(struct rps__migrate)) {
			on_migrate(srv, c, h->req_id, body);
			return;
		}
		break;
	case RPS__MSG_MIGRATE_REP:
		if (c->role == CONN_PEER) {
			on_migrate_rep(srv, c, (uint32_t)h->req_id, h->status);
			return;
		}
		break;
	default:
		break;
	}
	rps__srv_conn_fail(c, "sent a message type it may not send");
}

/* ---- timers ------------------------------------------------------------------- */

/* Leader: members of the map join the Raft group as learners, learners that
 * caught up become voters while there are fewer than 3 (5 from 5 members),
 * and servers that left the map leave the group.  One change at a time. */
static void leader_membership(struct rps__server *srv)
{
	struct rps__raft_status st;
	uint32_t i, target;

	if (!rps__rnode_is_leader(srv->rnode))
		return;
	rps__rnode_status(srv->rnode, &st);
	/* The bootstrap snapshot is empty (every founding member builds the
	 * map from --cluster); a member that joins later needs the map in the
	 * snapshot it is sent. */
	if (st.snapshot_index <= 1 && st.applied > 1 && rps__rnode_compact(srv->rnode))
		rps__log(RPS__LOG_WARN, "raft: %s", rps__errbuf());
	target = srv->map.nmembers >= 5 ? 5 : srv->map.nmembers >= 3 ? 3 : srv->map.nmembers;
	for (i = 0; i < srv->map.nmembers; i++) {
		uint64_t id = srv->map.members[i].id;
		if (!in_conf(&st, id)) {
			rps__rnode_conf_change(srv->rnode, RPS__RAFT_CONF_ADD_LEARNER, id, NULL);
			return;
		}
	}
	for (i = 0; i < st.conf.n_voters; i++)
		if (!rps__smap_member(&srv->map, st.conf.voters[i]) && st.conf.voters[i] != srv->my_id) {
			rps__rnode_conf_change(srv->rnode, RPS__RAFT_CONF_REMOVE, st.conf.voters[i], NULL);
			return;
		}
	for (i = 0; i < st.conf.n_learners; i++)
		if (!rps__smap_member(&srv->map, st.conf.learners[i])) {
			rps__rnode_conf_change(srv->rnode, RPS__RAFT_CONF_REMOVE, st.conf.learners[i], NULL);
			return;
		}
	if (st.conf.n_voters < target)
		for (i = 0; i < st.conf.n_learners; i++) {
			struct rps__raft_progress_info pi;
			if (!rps__rnode_progress(srv->rnode, st.conf.learners[i], &pi) && pi.match >= st.commit) {
				rps__rnode_conf_change(srv->rnode, RPS__RAFT_CONF_PROMOTE, st.conf.learners[i], NULL);
				return;
			}
		}
}

static void move_duties(struct rps__server *srv, uint64_t now)
{
	uint32_t p;

	for (p = 0; p < srv->map.npart; p++) {
		struct part_local *pl = &srv->parts[p];
		struct rps__smap_cmd cmd;

		memset(&cmd, 0, sizeof(cmd));
		/* Its contents are here again (restored, or accepted empty, since
		 * the restart) yet the map says lost: a MARK_LOST proposed before
		 * that (or a CLEAR_LOST dropped with a leader) was ordered after
		 * it.  Clear it again: the restore wins, whatever the order. */
		if (pl->cleared && !pl->gone && srv->map.parts[p].lost && srv->map.parts[p].owner == srv->my_id &&
		    !srv->map.parts[p].moving_to && now >= pl->next_try) {
			pl->next_try = now + PEER_RETRY_NS / 2;
			cmd.type = RPS__SMAP_CLEAR_LOST;
			cmd.part = p;
			cmd.epoch = srv->map.parts[p].epoch;
			propose_cmd(srv, &cmd);
			continue;
		}
		switch (pl->st) {
		case PART_LEAVING:
			if (fence_partition(srv, p) && ship_partition(srv, p))
				rps__log(RPS__LOG_ERROR, "%s", rps__errbuf());
			if (pl->st == PART_SHIPPED)
				offer_partition(srv, p, now);
			break;
		case PART_SHIPPED:
			if (!pl->installed && (!pl->offered || now >= pl->next_try))
				offer_partition(srv, p, now);
			if (!pl->installed && now >= pl->give_up && now + PEER_RETRY_NS / 2 >= pl->next_try) {
				cmd.type = RPS__SMAP_MOVE_ABORT;
				cmd.part = p;
				cmd.epoch = pl->epoch;
				rps__log(RPS__LOG_WARN, "partition %u: member %llu did not take it in time: aborting the move",
					 p, (unsigned long long)pl->to);
				propose_cmd(srv, &cmd);
			}
			break;
		case PART_INCOMING:
			if (srv->map.parts[p].moving_to == srv->my_id && now >= pl->next_try) {
				pl->next_try = now + PEER_RETRY_NS / 2;
				cmd.type = RPS__SMAP_MOVE_COMMIT;
				cmd.part = p;
				cmd.to = srv->my_id;
				cmd.epoch = pl->epoch;
				propose_cmd(srv, &cmd);
			}
			break;
		case PART_NONE:
			/* restarted without it: the cluster must learn it is lost */
			if (pl->gone && !srv->map.parts[p].lost && srv->map.parts[p].owner == srv->my_id &&
			    !srv->map.parts[p].moving_to && now >= pl->next_try) {
				pl->next_try = now + PEER_RETRY_NS / 2;
				cmd.type = RPS__SMAP_MARK_LOST;
				cmd.part = p;
				cmd.from = srv->my_id;
				cmd.epoch = srv->map.parts[p].epoch;
				propose_cmd(srv, &cmd);
			}
			break;
		case PART_DRAINING:
			if (now >= pl->free_at) {
				regions_free_part(srv, p);
				pl->st = PART_NONE;
			}
			break;
		default:
			break;
		}
	}
}

int rps__cp_run_timers(struct rps__server *srv, uint64_t now)
{
	uint64_t tick = ms_ns(srv->cfg.tick_ms);
	uint32_t i;
	int ret;

	rps__ck_timers(srv, now);	/* every turn: a checkpoint's hold ends as soon as it can */
	if (now >= srv->next_tick) {
		srv->next_tick = now + tick;
		rps__rnode_tick(srv->rnode);
	}
	if (now >= srv->next_duty) {
		srv->next_duty = now + DUTY_NS;
		peers_connect(srv, now);
		move_duties(srv, now);
		leader_membership(srv);
		for (i = 0; i < srv->nadmin;) {
			if (now >= srv->admin[i].deadline) {
				admin_done(srv, i, -ETIMEDOUT, 0, "timed out waiting for the cluster: the operation may still complete; check psctl status");
				continue;
			}
			i++;
		}
		admin_map_changed(srv);
	}
	ret = rps__rnode_process(srv->rnode);
	if (ret) {
		rps__log(RPS__LOG_ERROR, "raft: %s", rps__errbuf());
		return ret;
	}
	now = rps__now_ns();
	{
		uint64_t next = RPS__MIN(srv->next_tick, srv->next_duty);
		return next > now ? (int)((next - now) / 1000000ull) + 1 : 0;
	}
}

/* ---- start and stop ------------------------------------------------------------- */

static int make_temp_dir(struct rps__server *srv)
{
	char tmpl[] = "/tmp/rdmapsd-XXXXXX";

	if (!mkdtemp(tmpl))
		return rps__seterr(-errno, "mkdtemp: %s: give rdmapsd --data-dir", strerror(errno));
	srv->data_dir = strdup(tmpl);
	srv->data_dir_temp = true;
	return srv->data_dir ? 0 : -ENOMEM;
}

/* A data dir with anything in it: this server ran before, and whatever it
 * held in memory then is gone. */
static bool dir_has_state(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool any = false;

	if (!d)
		return false;
	while (!any && (e = readdir(d)))
		any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return any;
}

int rps__cp_init(struct rps__server *srv)
{
	struct rps__rnode_config rc;
	uint64_t voters[5];
	size_t nvoters = 0;
	int ret, i;

	srv->my_id = srv->cfg.join_id ? srv->cfg.join_id : (uint64_t)srv->index + 1;
	/* listening on port 0: the map must carry the port we got */
	if (!srv->cfg.join_id && srv->ncluster == 1 && !srv->cluster[0].port)
		srv->cluster[0].port = rps__listener_port(srv->listener);
	srv->mapbuf = calloc(1, RPS__MAP_BUF);
	if (!srv->mapbuf)
		return rps__seterr(-ENOMEM, "out of memory");
	ret = rps__mr_reg(srv->fab, srv->mapbuf, RPS__MAP_BUF, RPS__ACCESS_REMOTE_READ, &srv->mapbuf_mr);
	if (ret)
		goto err_buf;
	if (srv->cfg.data_dir) {
		srv->data_dir = strdup(srv->cfg.data_dir);
		ret = srv->data_dir ? 0 : -ENOMEM;
	} else {
		ret = make_temp_dir(srv);
		if (!ret)
			rps__log(RPS__LOG_INFO, "no --data-dir: the Raft log lives in %s and goes away at exit",
				 srv->data_dir);
	}
	if (ret)
		goto err_mr;
	srv->restarted = dir_has_state(srv->data_dir);
	if (!srv->cfg.join_id) {
		int n = srv->ncluster >= 5 ? 5 : srv->ncluster >= 3 ? 3 : srv->ncluster;
		for (i = 0; i < n; i++)
			voters[nvoters++] = (uint64_t)i + 1;
	}
	memset(&rc, 0, sizeof(rc));
	rc.id = srv->my_id;
	rc.peers = voters;
	rc.n_peers = nvoters;
	rc.dir = srv->data_dir;
	rc.fsync = srv->cfg.fsync_none ? RPS__WAL_FSYNC_NONE : RPS__WAL_FSYNC_ALWAYS;
	rc.election_ticks = srv->cfg.election_ticks;
	rc.heartbeat_ticks = 1;
	rc.seed = srv->my_id * 0x9e3779b97f4a7c15ull ^ rps__now_ns();
	rc.cb = (struct rps__rnode_callbacks){
		.send = cb_send, .apply = cb_apply, .conf_change = cb_conf_change, .restore = cb_restore,
		.snapshot = cb_snapshot, .read_ready = cb_read_ready, .role_change = cb_role_change, .ctx = srv,
	};
	ret = rps__rnode_open(&rc, &srv->rnode);
	if (ret) {
		rps__preerr(ret, "raft log in %s", srv->data_dir);
		goto err_dir;
	}
	if (*rps__rnode_recovery_note(srv->rnode))
		rps__log(RPS__LOG_WARN, "raft log: %s", rps__rnode_recovery_note(srv->rnode));
	ret = rps__rnode_process(srv->rnode);
	if (ret)
		goto err_rnode;
	if (!srv->cfg.join_id && !srv->map.npart) {
		/* a restart whose log had no snapshot yet: the bootstrap state */
		ret = bootstrap_map(srv);
		if (ret)
			goto err_rnode;
		reconcile(srv);
	}
	for (i = 0; i < (int)srv->map.npart; i++)
		if (srv->parts[i].gone)
			rps__log(RPS__LOG_ERROR, "partition %d lost with member %llu (restarted): restore it"
				 " (psctl restore DIR) or accept it empty (psctl forget-lost %d)", i,
				 (unsigned long long)srv->my_id, i);
	if (nvoters == 1 && srv->ncluster == 1)
		rps__rnode_campaign(srv->rnode);
	map_publish(srv);
	return 0;
err_rnode:
	rps__rnode_close(srv->rnode);
	srv->rnode = NULL;
err_dir:
	if (srv->data_dir_temp)
		(void)rps__remove_tree(srv->data_dir);
	free(srv->data_dir);
	srv->data_dir = NULL;
err_mr:
	rps__mr_dereg(srv->mapbuf_mr);
err_buf:
	free(srv->mapbuf);
	srv->mapbuf = NULL;
	return ret;
}

void rps__cp_fini(struct rps__server *srv)
{
	uint32_t p;

	rps__ck_fini(srv);
	for (p = 0; p < RPS__SMAP_MAX_PART; p++)
		blob_free(&srv->parts[p]);
	rps__rnode_close(srv->rnode);
	srv->rnode = NULL;
	if (srv->data_dir_temp && srv->data_dir)
		(void)rps__remove_tree(srv->data_dir);
	free(srv->data_dir);
	free(srv->admin);
	rps__mr_dereg(srv->mapbuf_mr);
	free(srv->mapbuf);
}
