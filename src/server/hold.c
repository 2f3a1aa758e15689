/*
 * hold.c - the data plane's side of checkpoints (dataplane.h): hold sync
 * tensors at a step, copy every shard served here at the cut, and install
 * the shards of a checkpoint being restored.  The files themselves are the
 * control plane's (control/ckpt_srv.c, control/ckpt.c).
 */
#include "config.h"
#include "common/common.h"
#include "server/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* Highest step of each sync tensor's shards served here. */
uint32_t rps__srv_hold_steps(struct rps__server *srv, struct rps__ckpt_target **out)
{
	struct rps__ckpt_target *t = calloc(srv->ntensors ? srv->ntensors : 1, sizeof(*t));
	uint32_t i, j, n = 0;

	*out = t;
	if (!t)
		return 0;
	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *x = srv->tensors[i];
		uint64_t m = 0;
		bool any = false;
		if (!x || x->spec.mode != RPS_MODE_SYNC)
			continue;
		for (j = 0; j < x->layout.nshards; j++) {
			struct shard *s = &x->shards[j];
			if (!s->hdr || !rps__srv_part_serving(srv, s->part))
				continue;
			any = true;
			m = RPS__MAX(m, s->step);
		}
		if (!any)
			continue;
		snprintf(t[n].name, sizeof(t[n].name), "%s", x->name);
		t[n].step = m;
		n++;
	}
	return n;
}

void rps__srv_hold_tensor(struct rps__server *srv, const char *name, uint64_t step)
{
	struct srv_tensor *x = rps__srv_tensor_by_name(srv, name);

	if (x && x->spec.mode == RPS_MODE_SYNC)
		x->hold_limit = step;
}

void rps__srv_hold_release(struct rps__server *srv)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i])
			srv->tensors[i]->hold_limit = UINT64_MAX;
	rps__srv_drain_held(srv);	/* the pushes that waited */
}

bool rps__srv_hold_reached(struct rps__server *srv)
{
	uint32_t i, j;

	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *x = srv->tensors[i];
		if (!x || x->spec.mode != RPS_MODE_SYNC || x->hold_limit == UINT64_MAX)
			continue;
		for (j = 0; j < x->layout.nshards; j++) {
			struct shard *s = &x->shards[j];
			if (s->hdr && rps__srv_part_serving(srv, s->part) && s->step < x->hold_limit)
				return false;
		}
	}
	return true;
}

void rps__srv_copy_free(struct rps__dp_copy *ck)
{
	uint32_t i;

	for (i = 0; i < ck->nshards; i++) {
		free(ck->shards[i].params);
		free(ck->shards[i].state);
		free(ck->shards[i].clocks);
	}
	free(ck->shards);
	free(ck->tensors);
	ck->shards = NULL;
	ck->tensors = NULL;
	ck->nshards = ck->ntensors = 0;
	ck->raw_bytes = 0;
}

int rps__srv_take(struct rps__server *srv, struct rps__dp_copy *ck)
{
	uint32_t i, j, n = 0, nt = 0;

	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *x = srv->tensors[i];
		for (j = 0; x && j < x->layout.nshards; j++)
			n += x->shards[j].hdr && rps__srv_part_serving(srv, x->shards[j].part);
	}
	ck->tensors = calloc(srv->ntensors ? srv->ntensors : 1, sizeof(*ck->tensors));
	ck->shards = calloc(n ? n : 1, sizeof(*ck->shards));
	if (!ck->tensors || !ck->shards)
		return -ENOMEM;
	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *x = srv->tensors[i];
		bool any = false;
		if (!x)
			continue;
		for (j = 0; j < x->layout.nshards; j++) {
			struct shard *s = &x->shards[j];
			struct rps__dp_shard_copy *sc;
			size_t nstate;
			if (!s->hdr || !rps__srv_part_serving(srv, s->part))
				continue;
			any = true;
			sc = &ck->shards[ck->nshards++];
			nstate = rps__optim_state_len(x->optim.type, s->elems);
			sc->tensor = nt;
			sc->meta.index = s->index;
			sc->meta.elems = s->elems;
			sc->meta.version = s->step;
			sc->meta.min_clock = s->hdr->min_clock;
			sc->meta.ready = s->ready;
			sc->meta.nstate = (uint32_t)nstate;
			sc->meta.nclocks = s->clocks ? (uint32_t)x->spec.num_workers : 0;
			sc->params = malloc((size_t)s->elems * 4);
			sc->state = nstate ? malloc(nstate * 4) : NULL;
			sc->clocks = sc->meta.nclocks ? malloc((size_t)sc->meta.nclocks * 8) : NULL;
			if (!sc->params || (nstate && !sc->state) || (sc->meta.nclocks && !sc->clocks))
				return -ENOMEM;
			memcpy(sc->params, s->params, (size_t)s->elems * 4);
			if (nstate)
				memcpy(sc->state, s->state, nstate * 4);
			if (sc->meta.nclocks)
				memcpy(sc->clocks, s->clocks, (size_t)sc->meta.nclocks * 8);
			sc->meta.params = sc->params;
			sc->meta.state = sc->state;
			sc->meta.clocks = sc->clocks;
			ck->raw_bytes += (size_t)s->elems * 4 + nstate * 4;
		}
		if (any) {
			snprintf(ck->tensors[nt].name, sizeof(ck->tensors[nt].name), "%s", x->name);
			ck->tensors[nt].spec = x->spec;
			nt++;
		}
	}
	ck->ntensors = nt;
	return 0;
}

/* ---- restore ---------------------------------------------------------- */

int rps__srv_restore_tensor(struct rps__server *srv, const char *file, const char *name,
			    const struct rps__tensor_spec *spec, struct srv_tensor **out)
{
	struct srv_tensor *t = rps__srv_tensor_by_name(srv, name);

	*out = t;
	if (t && memcmp(&t->spec, spec, sizeof(*spec)))
		return rps__seterr(-EEXIST, "%s: tensor '%s' exists here with other options", file, name);
	if (!t)
		return rps__srv_tensor_add(srv, name, spec, out);
	return 0;
}

int rps__srv_restore_shard(struct rps__server *srv, const char *file, struct srv_tensor *t,
			   const struct rps__dp_shard *cs)
{
	struct shard *s;
	uint32_t p;
	size_t nstate;
	bool primary, backup;
	int ret;

	if (!t || cs->index >= t->layout.nshards || cs->elems != t->shards[cs->index].elems)
		return rps__seterr(-EBADMSG, "%s: shard %u does not fit its tensor", file, cs->index);
	s = &t->shards[cs->index];
	p = s->part;
	/* and lost partitions it owns: a restore is what brings them back */
	primary = rps__srv_part_serving(srv, p) || srv->parts[p].owned_lost;
	/* A backup installs it too (not counted: its primary does): the
	 * stream carries only what is applied after, and a failover must
	 * promote what the primary holds, not what the backup had before the
	 * restore.  (A joiner being seeded gets the primary's image.) */
	backup = srv->parts[p].backup && srv->parts[p].joining != srv->my_id;
	if (!primary && !backup)
		return 0;
	if (!t->regions[p].mem) {
		ret = rps__srv_region_alloc(srv, t, p, false, NULL);
		if (!ret)
			ret = rps__srv_region_register(srv, t, p);
		if (ret)
			return ret;
	}
	nstate = rps__optim_state_len(t->optim.type, s->elems);
	if (cs->nstate != nstate || cs->nclocks != (s->clocks ? (uint32_t)t->spec.num_workers : 0))
		return rps__seterr(-EBADMSG, "%s: tensor '%s' shard %u: optimizer state or clocks do not match its options",
				   file, t->name, cs->index);
	/* the shard is idle (no workers yet): write it under the seqlock */
	__atomic_store_n(&s->hdr->seq, s->step * 2 + 1, __ATOMIC_RELEASE);
	memcpy(s->params, cs->params, (size_t)cs->elems * 4);
	if (nstate)
		memcpy(s->state, cs->state, nstate * 4);
	if (cs->nclocks)
		memcpy(s->clocks, cs->clocks, (size_t)cs->nclocks * 8);
	s->step = cs->version;
	s->next_rank = 0;
	s->nsummed = 0;
	s->early_rank = -1;
	s->ready = cs->ready;
	s->init_conn = NULL;
	__atomic_store_n(&s->hdr->min_clock, cs->min_clock, __ATOMIC_RELEASE);
	__atomic_store_n(&s->hdr->seq, s->ready ? s->step * 2 : s->step * 2 + 1, __ATOMIC_RELEASE);
	return primary ? 1 : 0;
}
