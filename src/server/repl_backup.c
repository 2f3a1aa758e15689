/*
 * repl_backup.c - the backup's side of the replication stream (repl_stream.c has
 * the primary's): it registers slots for a primary server, pairs only with
 * the same kernel fingerprint, and applies entries in order with the
 * primary's own code (apply.c), checking the stream's continuity, the
 * partition's epoch (older: REPL_NACK) and seq, and the resulting version;
 * credits go back in one cumulative REPL_ACK per loop turn.  Backups never
 * publish to workers: their regions are announced to nobody.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "common/topo.h"
#include "kernels/agg.h"
#include "proto/proto.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

int rps__srv_repl_accepted(struct rps__server *srv, struct srv_conn *c)
{
	size_t len = (size_t)REPL_SLOTS * rps__srv_repl_slot_size(srv);

	if (rps__srv_mem_take(srv, len, "replication slots"))
		return -ENOMEM;
	c->bufs.slots = rps__topo_alloc(srv->topo, &srv->place, len);
	if (!c->bufs.slots) {
		rps__srv_mem_give(srv, len);
		return -ENOMEM;
	}
	c->bufs.slots_len = len;
	c->repl.nslots = REPL_SLOTS;
	c->repl.slot_size = rps__srv_repl_slot_size(srv);
	srv->repl.active = true;
	return rps__mr_reg(srv->fab, c->bufs.slots, len, RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_WINDOWED,
			   &c->bufs.slots_mr);
}

void rps__srv_repl_on_hello(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
			    const struct rps__repl_hello *hello)
{
	struct rps__repl_hello_rep rep;
	int ret;

	memset(&rep, 0, sizeof(rep));
	snprintf(rep.fingerprint, sizeof(rep.fingerprint), "%s", rps__srv_repl_fingerprint(srv));
	if (c->repl.ready || hello->from_id != c->peer_id) {
		rps__srv_conn_fail(c, "sent a second or forged REPL_HELLO");
		return;
	}
	if (strncmp(hello->fingerprint, rps__srv_repl_fingerprint(srv), sizeof(hello->fingerprint))) {
		rps__log(RPS__LOG_ERROR, "replication from member %llu refused: its kernel fingerprint is \"%.*s\", "
			 "ours \"%s\": run the same rdmapsd build on every server",
			 (unsigned long long)c->peer_id, (int)sizeof(hello->fingerprint), hello->fingerprint,
			 rps__srv_repl_fingerprint(srv));
		rps__srv_conn_reply(c, RPS__MSG_REPL_HELLO_REP, h->req_id, -EPROTO, &rep, sizeof(rep));
		c->repl.refused = true;
		srv->repl.stats.pairings_refused++;
		return;
	}
	/* the primary writes our slots through a window of this stream alone */
	ret = rps__srv_conn_window(c, c->bufs.slots_mr, RPS__ACCESS_REMOTE_WRITE, &rep.slot_rkey);
	if (ret) {
		rps__srv_conn_fail(c, rps__errbuf());
		return;
	}
	rep.slot_addr = (uint64_t)(uintptr_t)c->bufs.slots;
	rep.nslots = c->repl.nslots;
	rep.slot_size = c->repl.slot_size;
	c->repl.ready = true;
	rps__srv_conn_reply(c, RPS__MSG_REPL_HELLO_REP, h->req_id, 0, &rep, sizeof(rep));
}

/* Refuse the entry after c->repl.cseq: the primary breaks the stream. */
static int refuse(struct rps__server *srv, struct srv_conn *c, const struct rps__repl_desc *d, int status)
{
	struct rps__repl_ack a = { .cseq = c->repl.cseq, .part = d->part };

	srv->repl.stats.refused++;
	c->repl.refused = true;
	rps__srv_conn_reply(c, RPS__MSG_REPL_NACK, 0, status, &a, sizeof(a));
	return -EPROTO;
}

static int broken(struct srv_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int broken(struct srv_conn *c, const char *fmt, ...)
{
	char why[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	rps__srv_conn_fail(c, why);
	return -EPROTO;
}

/* REPL_TENSOR: know the tensor (created if unknown, as a restore does),
 * with regions for the partitions backed here. */
static int bind_tensor(struct rps__server *srv, struct srv_conn *c, const struct rps__repl_desc *d, const void *payload)
{
	struct rps__repl_tensor bt;
	struct srv_tensor *t;
	uint32_t p;

	if (d->nbytes != sizeof(bt))
		return broken(c, "sent a malformed tensor binding");
	memcpy(&bt, payload, sizeof(bt));
	bt.name[sizeof(bt.name) - 1] = '\0';
	if (rps__name_check(bt.name))
		return broken(c, "sent a tensor binding with a bad name");
	t = rps__srv_tensor_by_name(srv, bt.name);
	if (t && !rps__srv_spec_equal(&t->spec, &bt.spec)) {
		rps__log(RPS__LOG_ERROR, "tensor '%s' exists here with other options than on member %llu", bt.name,
			 (unsigned long long)c->peer_id);
		return broken(c, "replicates a tensor that differs here");
	}
	if (!t && rps__srv_tensor_add(srv, bt.name, &bt.spec, &t))
		return broken(c, "%s", rps__errbuf());
	for (p = 0; p < t->layout.nservers && p < srv->npart; p++)
		if (srv->parts[p].backup && !t->regions[p].mem &&
		    (rps__srv_region_alloc(srv, t, p, bt.spec.flags & RPS__CREATE_HAS_INIT, NULL) ||
		     rps__srv_region_register(srv, t, p)))
			return broken(c, "%s", rps__errbuf());
	if (d->tensor_id >= c->repl.ntmap) {
		uint32_t *grown = realloc(c->repl.tmap, (d->tensor_id + 1u) * sizeof(*grown));
		if (!grown)
			return broken(c, "out of memory binding a tensor");
		memset(grown + c->repl.ntmap, 0, (d->tensor_id + 1u - c->repl.ntmap) * sizeof(*grown));
		c->repl.tmap = grown;
		c->repl.ntmap = d->tensor_id + 1u;
	}
	c->repl.tmap[d->tensor_id] = t->id + 1u;
	return 0;
}

/* Apply d with the primary's code: 0, 1 (skipped: not ours to apply),
 * -EAGAIN (the map is behind: later), or a negative errno (the connection
 * failed). */
static int apply_entry(struct rps__server *srv, struct srv_conn *c, const struct rps__repl_desc *d,
		       const void *payload)
{
	const struct rps__dp_part *v;
	struct srv_tensor *t;
	struct shard *s;

	if (d->kind == RPS__REPL_TENSOR)
		return bind_tensor(srv, c, d, payload);
	if (d->part >= srv->npart)
		return broken(c, "replicates partition %u of %u", d->part, srv->npart);
	v = &srv->parts[d->part];
	/* Older than the map's epoch: refused if it predates the primary's
	 * (a FAILOVER or a move: the old primary must not complete an
	 * acknowledgement through us), applied if the same primary stamped
	 * it before it applied a change of the replica set (REPLICA_DROP:
	 * epoch + 1, primary unchanged) that we applied first. */
	if (d->epoch < v->map_epoch && (d->epoch < srv->repl.primary_since[d->part] || c->peer_id != v->primary)) {
		rps__log(RPS__LOG_WARN, "partition %u: refusing replication from member %llu under epoch %llu, "
			 "older than the map's %llu", d->part, (unsigned long long)c->peer_id,
			 (unsigned long long)d->epoch, (unsigned long long)v->map_epoch);
		return refuse(srv, c, d, RPS_ESTALE_EPOCH);
	}
	if (d->epoch > v->map_epoch)
		return -EAGAIN;		/* our map is behind */
	if (!v->backup)
		return 1;	/* dropped from the set since (the primary stamped it
				 * before it applied that): nobody waits for us, and
				 * the entries after it, of partitions we still back,
				 * must not wait behind it */
	if (v->joining == srv->my_id && !v->seeded)
		return 1;	/* joining, the image not here yet: its cut comes
				 * after every entry the primary shipped before its
				 * fence (the fence waits for their confirmation), so
				 * the image holds this one; acknowledged, not applied.
				 * Breaking the stream instead would stall every
				 * partition it carries (repl_stream.c: a broken stream) */
	if (d->seq != srv->repl.seq[d->part] + 1)
		return broken(c, "partition %u: replication entry %llu after %llu", d->part,
			      (unsigned long long)d->seq, (unsigned long long)srv->repl.seq[d->part]);
	t = d->tensor_id < c->repl.ntmap && c->repl.tmap[d->tensor_id] ? srv->tensors[c->repl.tmap[d->tensor_id] - 1]
								       : NULL;
	if (!t || d->shard >= t->layout.nshards)
		return broken(c, "replicates an unknown tensor or shard");
	s = &t->shards[d->shard];
	if (s->part != d->part || !s->hdr)
		return broken(c, "replicates shard %u of '%s', which has no region here", d->shard, t->name);
	switch (d->kind) {
	case RPS__REPL_INIT:
		if (d->nbytes != s->elems * 4u || s->ready)
			return broken(c, "sent initial values that do not fit");
		rps__srv_publish_begin(s);
		memcpy(s->params, payload, d->nbytes);
		s->ready = true;
		rps__srv_publish_end(s);
		break;
	case RPS__REPL_PUSH:
		if (t->spec.mode == RPS_MODE_SYNC || d->dtype != t->spec.dtype || !s->ready ||
		    d->nbytes != s->elems * rps__dtype_size(t->spec.dtype) ||
		    (t->spec.mode == RPS_MODE_BOUNDED && (d->rank < 0 || d->rank >= t->spec.num_workers)))
			return broken(c, "sent a push that does not fit");
		rps__srv_shard_update(t, s, rps__srv_grad_fp32(s, payload, d->dtype));
		rps__srv_dedup_note(s, d->client_id, d->push_id);
		if (t->spec.mode == RPS_MODE_BOUNDED)
			rps__srv_clock_note(t, s, d->rank, d->clock);
		break;
	case RPS__REPL_STEP:
		if (t->spec.mode != RPS_MODE_SYNC || d->dtype != RPS_DTYPE_F32 || !s->ready ||
		    d->nbytes != s->elems * 4u || d->clock != s->step)
			return broken(c, "sent a step that does not fit");
		rps__srv_shard_update(t, s, payload);
		/* the step a seeding image carried is in this sum */
		rps__srv_sync_step_replicated(srv, t, d->shard);
		break;
	case RPS__REPL_PARTIAL:
		/* the step in progress, as a seeding image carries it
		 * (partition.c, promote_shard): kept for a promotion */
		if (t->spec.mode != RPS_MODE_SYNC || !s->acc || d->dtype != RPS_DTYPE_F32 || !s->ready ||
		    d->nbytes != s->elems * 4u || d->clock != s->step || d->rank < 0 ||
		    d->rank >= t->spec.num_workers || d->nsummed > (uint32_t)d->rank)
			return broken(c, "sent a step in progress that does not fit");
		memcpy(s->acc, payload, d->nbytes);
		s->next_rank = d->rank;
		s->nsummed = d->nsummed;
		s->early_rank = -1;
		rps__srv_sync_partial_replicated(srv, t, d->shard);
		break;
	case RPS__REPL_PARKED:
		if (t->spec.mode != RPS_MODE_SYNC || d->dtype != t->spec.dtype || !s->ready ||
		    d->nbytes != s->elems * rps__dtype_size(t->spec.dtype) || d->rank < 0 ||
		    d->rank >= t->spec.num_workers || d->clock < s->step)
			return broken(c, "sent a parked push that does not fit");
		if ((d->clock > s->step || d->rank >= s->next_rank) &&
		    rps__srv_parked_keep(srv, t, d->shard, d->clock, d->rank, payload, d->nbytes))
			return broken(c, "out of memory keeping its parked push");
		break;
	default:
		return broken(c, "sent a replication entry of unknown kind %u", d->kind);
	}
	if (s->step != d->version) {
		rps__log(RPS__LOG_ERROR, "tensor '%s' shard %u: version %llu after replication, the primary has %llu: diverged",
			 t->name, s->index, (unsigned long long)s->step, (unsigned long long)d->version);
		return refuse(srv, c, d, -EIO);
	}
	assert(d->seq == srv->repl.seq[d->part] + 1);	/* each partition's entries in order, none twice */
	srv->repl.seq[d->part] = d->seq;
	return 0;
}

/* Test hook (RPS_FAULT=repl-break-at-N): once, when this backup has
 * applied N entries, break the stream it came on, as a network fault
 * would, with the backup alive and the primary's later entries unconfirmed
 * (tests/it_replica.c). */
static bool fault_break(const struct rps__server *srv)
{
	static _Atomic long at = -1;	/* (serving threads share it) */
	long n = atomic_load(&at);

	if (!RPS__FAULT_INJECTION || RPS__LIKELY(n == 0))
		return false;
	if (n < 0) {
		if (!rps__fault_arg("repl-break-at-", &n) || n <= 0)
			n = 0;
		atomic_store(&at, n);
		if (!n)
			return false;
	}
	if (srv->repl.stats.entries_applied < (uint64_t)n)
		return false;
	return atomic_compare_exchange_strong(&at, &n, 0);	/* once */
}

/* The entry in the next slot in turn. */
static int apply_next(struct rps__server *srv, struct srv_conn *c)
{
	const char *buf = c->bufs.slots + (size_t)(c->repl.cseq % c->repl.nslots) * c->repl.slot_size;
	struct rps__repl_desc d;
	int ret;

	if (RPS__UNLIKELY(fault_break(srv)))
		return broken(c, "test hook: replication stream broken");
	memcpy(&d, buf, sizeof(d));
	if (d.magic != RPS__REPL_MAGIC || d.nbytes > c->repl.slot_size - RPS__REPL_DESC_SIZE)
		return broken(c, "wrote a malformed replication entry");
	if (d.cseq != c->repl.cseq + 1)
		return broken(c, "replication stream out of order: entry %llu after %llu",
			      (unsigned long long)d.cseq, (unsigned long long)c->repl.cseq);
	ret = apply_entry(srv, c, &d, buf + RPS__REPL_DESC_SIZE);
	if (ret < 0)
		return ret;
	assert(d.cseq == c->repl.cseq + 1);	/* applied strictly in stream order */
	c->repl.cseq++;
	c->repl.credits_owed++;
	srv->repl.stats.entries_applied++;
	return 0;
}

void rps__srv_repl_on_entry(struct rps__server *srv, struct srv_conn *c, uint32_t slot)
{
	if (c->repl.refused)
		return;		/* the primary closes on our NACK */
	if (!c->repl.ready || slot != (c->repl.cseq + c->repl.npending) % c->repl.nslots) {
		rps__srv_conn_fail(c, "wrote a replication entry out of turn");
		return;
	}
	if (c->repl.npending || apply_next(srv, c) == -EAGAIN)
		c->repl.npending++;
}

/* Once per loop turn: entries the map held back, then the ack. */
void rps__srv_repl_backup_turn(struct rps__server *srv, struct srv_conn *c)
{
	struct rps__repl_ack a;

	while (c->repl.npending && !apply_next(srv, c))
		c->repl.npending--;
	/* one cumulative ack per turn; no send buffer free: next turn */
	if (c->repl.credits_owed && c->bufs.nsfree && !c->repl.refused && !c->dead) {
		a = (struct rps__repl_ack){ .cseq = c->repl.cseq, .credits = c->repl.credits_owed };
		rps__srv_conn_reply(c, RPS__MSG_REPL_ACK, 0, 0, &a, sizeof(a));
		c->repl.credits_owed = 0;
		srv->repl.stats.acks_sent++;
	}
}
