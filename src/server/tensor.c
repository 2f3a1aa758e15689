/*
 * tensor.c - the tensors a server knows and their regions: a tensor's
 * spec and layout, and per partition held here one registered region with
 * the shards' parameters, optimizer state and accumulators.
 */
#include "config.h"
#include "common/common.h"
#include "common/topo.h"
#include "kernels/optim.h"
#include "proto/shard.h"
#include "server/server_int.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* ---- tensors and their regions ------------------------------------------ */

static void shard_free_mem(struct shard *s)
{
	free(s->state);
	free(s->acc);
	free(s->scratch);
	free(s->clocks);
	free(s->dd);
	s->state = s->acc = s->scratch = NULL;
	s->clocks = NULL;
	s->dd = NULL;
	s->ndd = 0;
	s->hdr = NULL;
	s->params = NULL;
}

/* Give up a tensor's region of a partition: deregistering revokes every
 * worker's remote access to those shards at once. */
void rps__srv_region_free(struct rps__server *srv, struct srv_tensor *t, uint32_t part)
{
	struct region *r = &t->regions[part];
	uint32_t j;

	if (!r->mem)
		return;
	for (j = 0; j < r->nsh; j++)
		shard_free_mem(&t->shards[rps__part_shard(&t->layout, part, j)]);
	rps__mr_dereg(r->mr);
	rps__topo_free(srv->topo, r->mem, r->len);
	rps__srv_mem_give(srv, r->mem_charged);
	memset(r, 0, sizeof(*r));
}

/*
 * Give up a tensor's region of a partition that workers may still name by
 * an older map: the copy an image replaces (a member seeded as a backup of
 * a partition it served or backed up until then, a planned switch's old
 * primary among them).  Deregistering it at once would turn every such
 * worker's CAS or READ into a remote access error, and on RDMA that takes
 * the worker's whole connection down, with every op on it (a sync rank's
 * among them: its step would be orphaned).  So its lock words are sealed
 * and its headers say the shards moved, as a drained partition's do, and
 * its memory stays registered for --drain-ms: what such a worker reads
 * there sends it to the map.  Then it goes (rps__srv_retired_reap).
 */
void rps__srv_region_retire(struct rps__server *srv, struct srv_tensor *t, uint32_t part)
{
	struct region *r = &t->regions[part];
	struct retired_region *v;
	uint32_t j;

	if (!r->mem)
		return;
	if (srv->retired.n == srv->retired.cap) {
		uint32_t cap = srv->retired.cap ? 2 * srv->retired.cap : 8;
		v = realloc(srv->retired.v, cap * sizeof(*v));
		if (!v) {	/* (no memory to wait with: revoked at once, as before) */
			rps__srv_region_free(srv, t, part);
			return;
		}
		srv->retired.v = v;
		srv->retired.cap = cap;
	}
	for (j = 0; j < r->nsh; j++) {
		struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
		uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE), old = 0;
		/* (a word a worker holds stays its own: it releases it here,
		 * and its push, under the old epoch, is refused) */
		if (!rps__lock_is_locked(w))
			rps__local_cas(srv->fab, r->mr, &s->hdr->lock, w,
				       rps__lock_locked(rps__lock_version(w), RPS__LOCK_OWNER_FENCE), &old);
		__atomic_store_n(&s->hdr->epoch, RPS__EPOCH_MOVED, __ATOMIC_RELEASE);
		shard_free_mem(s);
	}
	v = &srv->retired.v[srv->retired.n++];
	v->mem = r->mem;
	v->len = r->len;
	v->mr = r->mr;
	v->mem_charged = r->mem_charged;
	v->free_at = rps__now_ns() + (uint64_t)srv->cfg.drain_ms * 1000000ull;
	memset(r, 0, sizeof(*r));
}

uint32_t rps__srv_retired_reap(struct rps__server *srv, uint64_t now, bool all)
{
	uint32_t i = 0;

	while (i < srv->retired.n) {
		struct retired_region *v = &srv->retired.v[i];
		if (!all && now < v->free_at) {
			i++;
			continue;
		}
		rps__mr_dereg(v->mr);
		rps__topo_free(srv->topo, v->mem, v->len);
		rps__srv_mem_give(srv, v->mem_charged);
		*v = srv->retired.v[--srv->retired.n];
	}
	if (all) {
		free(srv->retired.v);
		memset(&srv->retired, 0, sizeof(srv->retired));
	}
	return srv->retired.n;
}

void rps__srv_tensor_free(struct rps__server *srv, struct srv_tensor *t)
{
	uint32_t p;

	if (!t)
		return;
	for (p = 0; t->regions && p < t->layout.nservers; p++)
		rps__srv_region_free(srv, t, p);
	free(t->regions);
	free(t->shards);
	free(t->ranks);
	rps__srv_mem_give(srv, t->meta_charged);
	free(t);
}

static int spec_check(const char *name, const struct rps__tensor_spec *sp)
{
	if (sp->dtype < RPS_DTYPE_F32 || sp->dtype > RPS_DTYPE_F16)
		return rps__seterr(-EINVAL, "tensor '%s': unknown dtype %u", name, sp->dtype);
	if (sp->mode < RPS_MODE_SYNC || sp->mode > RPS_MODE_ASYNC)
		return rps__seterr(-EINVAL, "tensor '%s': unknown consistency mode %u", name, sp->mode);
	if (sp->mode != RPS_MODE_ASYNC && (sp->num_workers < 1 || sp->num_workers > 4096))
		return rps__seterr(-EINVAL, "tensor '%s': sync and bounded modes need num_workers in 1..4096 (got %d)",
				   name, sp->num_workers);
	return 0;
}

/* What rps__srv_tensor_add would check of a tensor it is told about, with
 * no side effect: a partition image is validated whole before anything of
 * it is installed.  *l: the tensor's layout on this server. */
int rps__srv_spec_valid(struct rps__server *srv, const char *name, const struct rps__tensor_spec *sp,
			struct rps__layout *l)
{
	struct rps__optim o = {
		.type = (enum rps_optimizer)sp->optimizer, .lr = sp->lr, .momentum = sp->momentum,
		.beta1 = sp->beta1, .beta2 = sp->beta2, .eps = sp->eps,
		.weight_decay = sp->weight_decay, .rescale = sp->rescale,
	};
	int ret = spec_check(name, sp);

	if (ret)
		return ret;
	ret = rps__optim_validate(&o);
	if (ret)
		return rps__preerr(ret, "tensor '%s'", name);
	if (sp->count > UINT64_MAX - srv->shard_elems)
		return rps__seterr(-EFBIG, "tensor '%s': %llu elements is beyond any layout", name,
				   (unsigned long long)sp->count);
	return rps__layout_init(l, name, sp->count, srv->shard_elems, srv->npart);
}

/* Know a tensor (its spec and layout) without holding any of its shards:
 * regions come with the partitions this server owns or receives. */
int rps__srv_tensor_add(struct rps__server *srv, const char *name, const struct rps__tensor_spec *sp,
			struct srv_tensor **out)
{
	struct srv_tensor *t, **grown;
	size_t meta;
	uint32_t i;
	int ret;

	ret = spec_check(name, sp);
	if (ret)
		return ret;
	grown = realloc(srv->tensors, (srv->ntensors + 1) * sizeof(*srv->tensors));
	if (!grown)
		return rps__seterr(-ENOMEM, "out of memory");
	srv->tensors = grown;
	t = calloc(1, sizeof(*t));
	if (!t)
		return rps__seterr(-ENOMEM, "out of memory");
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->spec = *sp;
	t->optim = (struct rps__optim){
		.type = (enum rps_optimizer)sp->optimizer, .lr = sp->lr, .momentum = sp->momentum,
		.beta1 = sp->beta1, .beta2 = sp->beta2, .eps = sp->eps,
		.weight_decay = sp->weight_decay, .rescale = sp->rescale,
	};
	ret = rps__optim_validate(&t->optim);
	if (ret) {
		rps__preerr(ret, "tensor '%s'", name);
		goto err_free;
	}
	ret = rps__layout_init(&t->layout, name, sp->count, srv->shard_elems, srv->npart);
	if (ret)
		goto err_free;
	t->stride = rps__shard_stride(srv->shard_elems);
	/* Every server keeps the whole shard table of every tensor: charge it
	 * before allocating it, or one CREATE with a huge count could take
	 * gigabytes past --memory-limit.  Without a limit, cap the table. */
	meta = sizeof(*t) + (size_t)t->layout.nshards * sizeof(*t->shards) +
	       (size_t)srv->npart * sizeof(*t->regions);
	if (t->layout.nshards > RPS__TENSOR_SHARDS_MAX) {
		ret = rps__seterr(-EFBIG, "tensor '%s': %llu elements make %u shards, more than %u: raise rdmapsd --shard-size",
				  name, (unsigned long long)sp->count, t->layout.nshards, RPS__TENSOR_SHARDS_MAX);
		goto err_free;
	}
	ret = rps__srv_mem_take(srv, meta, "shard table");
	if (ret) {
		rps__preerr(ret, "tensor '%s' (%llu elements)", name, (unsigned long long)sp->count);
		goto err_free;
	}
	t->meta_charged = meta;
	t->shards = calloc(t->layout.nshards, sizeof(*t->shards));
	t->regions = calloc(srv->npart, sizeof(*t->regions));
	if (!t->shards || !t->regions) {
		ret = rps__seterr(-ENOMEM, "tensor '%s': out of memory", name);
		goto err_free;
	}
	for (i = 0; i < t->layout.nshards; i++) {
		t->shards[i].index = i;
		t->shards[i].part = rps__shard_server(&t->layout, i);
		t->shards[i].early_rank = -1;
		t->shards[i].elems = rps__shard_elems(&t->layout, i);
	}
	t->hold_limit = UINT64_MAX;
	t->id = srv->ntensors;
	srv->tensors[srv->ntensors++] = t;
	*out = t;
	return 0;
err_free:
	rps__srv_tensor_free(srv, t);
	return ret;
}

/*
 * Allocate (not yet register) a tensor's region of one partition, on the
 * HCA's NUMA node, with the optimizer state and accumulators of its shards.
 * The caller fills it (fresh: zeros, or a move's data) and registers it
 * with rps__srv_region_register, so the lock words are written by this CPU
 * only before any HCA atomic can reach them.
 */
int rps__srv_region_alloc(struct rps__server *srv, struct srv_tensor *t, uint32_t part, bool has_init,
			  struct srv_conn *init_conn)
{
	const struct rps__tensor_spec *sp = &t->spec;
	struct region *r = &t->regions[part];
	size_t per_elem, charge;
	uint32_t j;
	int ret;

	if (r->mem)
		return 0;
	r->nsh = rps__part_nshards(&t->layout, part);
	if (!r->nsh)
		return 0;
	r->len = t->stride * r->nsh;
	/* optimizer state, the sync accumulator and conversion scratch: fp32 each */
	per_elem = 4u * (rps__optim_state_len(t->optim.type, 1) + (sp->mode == RPS_MODE_SYNC) +
			 (sp->dtype != RPS_DTYPE_F32));
	charge = r->len + per_elem * (size_t)r->nsh * srv->shard_elems;
	ret = rps__srv_mem_take(srv, charge, t->name);
	if (ret) {
		r->nsh = 0;
		return ret;
	}
	r->mem_charged = charge;
	r->mem = rps__topo_alloc(srv->topo, &srv->place, r->len);
	if (!r->mem)
		goto err_nomem;
	memset(r->mem, 0, r->len);
	for (j = 0; j < r->nsh; j++) {
		struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
		size_t n;
		s->hdr = (struct rps__shard_hdr *)((char *)r->mem + j * t->stride);
		s->params = (float *)((char *)s->hdr + RPS__SHARD_HDR_SIZE);
		s->hdr->shard = s->index;
		s->hdr->elems = s->elems;
		/* (a region made while the read fence is up starts behind it) */
		s->hdr->epoch = srv->rfence.fenced[part] ? RPS__EPOCH_MOVED : srv->parts[part].map_epoch;
		s->ready = !has_init;
		s->init_conn = s->ready ? NULL : init_conn;
		s->hdr->seq = s->ready ? 0 : 1;	/* odd: not readable until INIT */
		s->step = 0;
		s->next_rank = 0;
		s->early_rank = -1;
		n = rps__optim_state_len(t->optim.type, s->elems);
		if (n && !(s->state = calloc(n, sizeof(float))))
			goto err_nomem;
		if (sp->mode == RPS_MODE_SYNC && !(s->acc = calloc(s->elems, sizeof(float))))
			goto err_nomem;
		if (sp->dtype != RPS_DTYPE_F32 && !(s->scratch = calloc(s->elems, sizeof(float))))
			goto err_nomem;
		if (sp->mode == RPS_MODE_BOUNDED &&
		    !(s->clocks = calloc((size_t)sp->num_workers, sizeof(uint64_t))))
			goto err_nomem;
	}
	return 0;
err_nomem:
	ret = rps__seterr(-ENOMEM, "tensor '%s': out of memory for partition %u", t->name, part);
	rps__srv_region_free(srv, t, part);
	return ret;
}

int rps__srv_region_register(struct rps__server *srv, struct srv_tensor *t, uint32_t part)
{
	struct region *r = &t->regions[part];
	int ret;

	if (!r->mem || r->mr)
		return 0;
	ret = rps__mr_reg(srv->fab, r->mem, r->len, RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC |
			  RPS__ACCESS_WINDOWED, &r->mr);
	if (ret)
		rps__srv_region_free(srv, t, part);
	return ret;
}

struct srv_tensor *rps__srv_tensor_by_name(struct rps__server *srv, const char *name)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i] && !strcmp(srv->tensors[i]->name, name))
			return srv->tensors[i];
	return NULL;
}
