/*
 * tensor_handle.c - tensors on the client, the rps_tensor_t handle: create
 * or open one (where do its shards live, at which epoch), its options, close.
 */
#include "config.h"
#include "common/common.h"
#include "kernels/agg.h"
#include "kernels/optim.h"
#include "client/client_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmaps.h"

static int spec_from_opts(const char *name, const struct rps_tensor_opts *o, int num_workers,
			  struct rps__tensor_spec *sp)
{
	if (!o || o->size < offsetof(struct rps_tensor_opts, init) + sizeof(void *))
		return rps__seterr(-EINVAL, "tensor '%s': options not initialised with rps_tensor_opts_init()", name);
	if (!o->count)
		return rps__seterr(-EINVAL, "tensor '%s': count must be at least 1", name);
	if (!rps__dtype_size(o->dtype))
		return rps__seterr(-EINVAL, "tensor '%s': unknown dtype %d", name, (int)o->dtype);
	if (o->mode < RPS_MODE_SYNC || o->mode > RPS_MODE_ASYNC)
		return rps__seterr(-EINVAL, "tensor '%s': unknown consistency mode %d", name, (int)o->mode);
	if (o->optimizer < RPS_OPT_SUM || o->optimizer > RPS_OPT_ADAM)
		return rps__seterr(-EINVAL, "tensor '%s': unknown optimizer %d", name, (int)o->optimizer);
	{	/* say what is wrong here rather than learn it from a server */
		struct rps__optim opt = { .type = o->optimizer, .lr = o->lr, .momentum = o->momentum,
					  .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
					  .weight_decay = o->weight_decay, .rescale = o->rescale };
		int ret = rps__optim_validate(&opt);
		if (ret)
			return rps__preerr(ret, "tensor '%s'", name);
	}
	memset(sp, 0, sizeof(*sp));
	sp->count = o->count;
	sp->dtype = (uint32_t)o->dtype;
	sp->mode = (uint32_t)o->mode;
	sp->staleness = o->mode == RPS_MODE_BOUNDED ? o->staleness : 0;
	sp->optimizer = (uint32_t)o->optimizer;
	sp->lr = o->lr;
	sp->momentum = o->momentum;
	sp->beta1 = o->beta1;
	sp->beta2 = o->beta2;
	sp->eps = o->eps;
	sp->weight_decay = o->weight_decay;
	sp->rescale = o->rescale;
	sp->num_workers = o->mode == RPS_MODE_ASYNC ? 0 : num_workers;
	sp->flags = o->init ? RPS__CREATE_HAS_INIT : 0;
	return 0;
}

/*
 * Send msg (CREATE, or CREATE with OPEN_ONLY) to the servers marked in to,
 * page through their region lists, and rebuild t->part and t->at from what
 * they serve.  reps/rstatus: first replies per connection.  With
 * tolerate, a server that fails (gone, or does not know the tensor) is
 * skipped; otherwise its error is returned.
 */
/* Empty pages in a row a server may answer before we give up on it. */
#define CREATE_EMPTY_PAGES 1000u

static int tensor_regions(struct rps_client *cl, struct rps_tensor *t, const struct rps__create *msg,
			  bool *to, struct rps__create_rep *reps, int32_t *rstatus, bool tolerate)
{
	struct rps__create_rep *page = calloc(MAX_CONNS, sizeof(*page));
	int32_t *pst = calloc(MAX_CONNS, sizeof(*pst));
	bool *one = calloc(MAX_CONNS, sizeof(*one));
	struct rps__create m = *msg;
	uint32_t p, k, empty = 0;
	int i, ret;

	if (!page || !pst || !one) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	ret = rps__ctrl_call(cl, RPS__MSG_CREATE, msg, sizeof(*msg), to, sizeof(*reps), reps, rstatus);
	if (ret && !tolerate && (msg->flags & RPS__CREATE_OPEN_ONLY)) {
		/* a server that does not know the tensor holds none of it (a
		 * member restarted since, or a serving thread no shard of it
		 * reached; ENODATA: and it owns lost partitions: the ops on
		 * shards in them are refused, -ENODATA, ops.c): an open needs
		 * one that knows it and no other error */
		bool known = false, other = false;
		for (i = 0; i < cl->nservers; i++) {
			if (!to[i])
				continue;
			known |= rstatus[i] == 0;
			other |= rstatus[i] != 0 && rstatus[i] != -ENOENT && rstatus[i] != -ENODATA;
		}
		if (known && !other) {
			ret = 0;
			rps__clearerr();
		}
	}
	for (i = 0; ret && !tolerate && i < cl->nservers; i++)
		if (to[i] && rstatus[i] == -ENODATA) {
			/* a lost partition says more than another server's "I
			 * do not know it" (one that owns none of the lost
			 * ones): the caller names it (explain_lost) */
			ret = rps__seterr(-ENODATA, "a server holds a lost partition of it");
			break;
		}
	if (ret && !tolerate)
		goto out;
	ret = 0;
	pthread_mutex_lock(&cl->lock);
	/* forget what the servers asked serve; a server we could not ask
	 * (gone) keeps its partitions, so their ops fail with its error */
	for (p = 0; p < t->layout.nservers; p++)
		if (t->part[p].conn < 0 || to[t->part[p].conn])
			t->part[p].conn = -1;
	pthread_mutex_unlock(&cl->lock);
	m.flags |= RPS__CREATE_OPEN_ONLY;
	for (i = 0; i < cl->nservers; i++) {
		struct rps__create_rep *rp = &reps[i];
		if (!to[i] || rstatus[i])
			continue;
		for (;;) {
			pthread_mutex_lock(&cl->lock);
			t->at[i].id = rp->tensor_id;
			t->at[i].known = true;
			for (k = 0; k < rp->nregions && k < RPS__CREATE_MAX_REGIONS; k++) {
				const struct rps__region_ref *ref = &rp->regions[k];
				if (ref->part >= t->layout.nservers)
					continue;
				if (t->part[ref->part].conn >= 0 && t->part[ref->part].epoch > ref->epoch)
					continue;
				/* a server behind our map (cut off, or slow to
				 * apply) offers a copy that is no longer the
				 * primary's: never read it */
				if (ref->part < cl->map.npart && ref->epoch < cl->map.parts[ref->part].epoch)
					continue;
				t->part[ref->part].conn = i;
				t->part[ref->part].addr = ref->addr;
				t->part[ref->part].rkey = ref->rkey;
				t->part[ref->part].epoch = ref->epoch;
				t->part[ref->part].gen = cl->conns[i].gen;
			}
			pthread_mutex_unlock(&cl->lock);
			if (rp->first + rp->nregions >= rp->total)
				break;
			/* An empty page: the server had no send-queue room to
			 * bind our windows; it has after its next replies. */
			if (!rp->nregions) {
				if (++empty > CREATE_EMPTY_PAGES) {
					ret = rps__seterr(-EBUSY, "tensor '%s': %s gave no region for %u tries (its send "
							  "queue had no room for our memory windows): try again",
							  t->name, cl->conns[i].name, CREATE_EMPTY_PAGES);
					if (!tolerate)
						goto out;
					ret = 0;
					break;
				}
				usleep(1000);
			}
			memset(one, 0, MAX_CONNS * sizeof(*one));
			one[i] = true;
			m.first = rp->first + rp->nregions;
			ret = rps__ctrl_call(cl, RPS__MSG_CREATE, &m, sizeof(m), one, sizeof(*page), page, pst);
			if (ret || pst[i]) {
				if (!tolerate)
					goto out;
				ret = 0;
				break;
			}
			rp = &page[i];
		}
	}
	/* partitions of a member we never reached: route them to its dead
	 * connection, so their ops fail naming it (not as "moved") */
	pthread_mutex_lock(&cl->lock);
	for (p = 0; p < t->layout.nservers && p < cl->map.npart; p++) {
		if (t->part[p].conn >= 0)
			continue;
		for (i = 0; i < cl->nservers; i++)
			if (cl->conns[i].dead && !cl->conns[i].ep && cl->conns[i].member_id == cl->map.parts[p].owner)
				t->part[p].conn = i;
	}
	pthread_mutex_unlock(&cl->lock);
out:
	free(page);
	free(pst);
	free(one);
	return ret;
}

static bool *live_conns(struct rps_client *cl)
{
	bool *to = calloc(MAX_CONNS, sizeof(*to));
	int i;

	if (!to)
		return NULL;
	pthread_mutex_lock(&cl->lock);
	for (i = 0; i < cl->nservers; i++)
		to[i] = cl->conns[i].ep && !cl->conns[i].dead;
	pthread_mutex_unlock(&cl->lock);
	return to;
}

/* After a stale epoch: where does the tensor live now? */
int rps__tensor_refresh(struct rps_client *cl, struct rps_tensor *t)
{
	struct rps__create_rep *reps = calloc(MAX_CONNS, sizeof(*reps));
	int32_t *rstatus = calloc(MAX_CONNS, sizeof(*rstatus));
	bool *to = live_conns(cl);
	struct rps__create msg;
	int ret;

	if (!reps || !rstatus || !to) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	memset(&msg, 0, sizeof(msg));
	snprintf(msg.name, sizeof(msg.name), "%s", t->name);
	msg.flags = RPS__CREATE_OPEN_ONLY;
	ret = tensor_regions(cl, t, &msg, to, reps, rstatus, true);
out:
	free(reps);
	free(rstatus);
	free(to);
	return ret;
}

/* A tensor laid out for what msg says about it (an open: one element, until
 * a server tells its size). */
static int tensor_new(struct rps_client *cl, const char *name, const struct rps__create *msg,
		      struct rps_tensor **out)
{
	struct rps_tensor *t;
	int ret;

	t = calloc(1, sizeof(*t));
	if (!t || !(t->at = calloc(MAX_CONNS, sizeof(*t->at))) ||
	    !(t->part = calloc(cl->map.npart, sizeof(*t->part)))) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto err;
	}
	t->cl = cl;
	snprintf(t->name, sizeof(t->name), "%s", name);
	/* the layout needs the count: from the request, or (open) a reply */
	t->spec = msg->spec;
	if (msg->flags & RPS__CREATE_OPEN_ONLY)
		t->spec.count = 1;
	ret = rps__layout_init(&t->layout, name, t->spec.count, cl->shard_elems, cl->map.npart);
	if (ret)
		goto err;
	*out = t;
	return 0;
err:
	if (t)
		rps__tensor_free(t);
	return ret;
}

/* A server refused the tensor with -ENODATA: name the lost partition that
 * holds some of its shards and say what to do. */
static void explain_lost(const struct rps_client *cl, const struct rps_tensor *t)
{
	uint32_t p, nlost = 0, any = UINT32_MAX;

	for (p = 0; p < cl->map.npart; p++)
		if (cl->map.parts[p].lost) {
			nlost++;
			any = any == UINT32_MAX ? p : any;
		}
	if (nlost && nlost == cl->map.npart) {
		/* a whole cluster restarted: memory was the only copy */
		rps__seterr(-ENODATA, "every partition is lost (its servers restarted): the parameters are gone:"
			    " restore a checkpoint (psctl restore NAME, or rdmapsd --restore DIR) or start over"
			    " empty (psctl forget-lost)");
		return;
	}
	for (p = 0; p < cl->map.npart && p < t->layout.nservers; p++)
		if (cl->map.parts[p].lost && rps__part_nshards(&t->layout, p)) {
			any = p;	/* (one of its own, rather than any) */
			break;
		}
	/* (an open does not know the size yet: a server that does not know
	 * the tensor refused it because it lost partitions) */
	if (any != UINT32_MAX)
		rps__seterr(-ENODATA, "partition %u lost with member %llu: restore it (psctl restore NAME)"
			    " or accept it empty (psctl forget-lost %u)", any,
			    (unsigned long long)cl->map.parts[any].lost, any);
}

/*
 * Ask the servers in `to` where t's shards live (tensor_regions) and check
 * they agree on its options; an open learns the size from the replies, lays
 * the tensor out again and asks again.  *first: a server whose reply counts.
 */
static int tensor_locate(struct rps_client *cl, struct rps_tensor *t, const char *name,
			 const struct rps__create *msg, bool *to, struct rps__create_rep *reps,
			 int32_t *rstatus, int *first)
{
	int i, ret;

	ret = tensor_regions(cl, t, msg, to, reps, rstatus, false);
	if (ret == -ENODATA)	/* a server refused it: some of its shards are in a lost partition */
		explain_lost(cl, t);
	if (ret) {
		rps__preerr(ret, "tensor '%s'", name);
		return ret;
	}
	*first = -1;
	for (i = 0; i < cl->nservers; i++) {
		if (!to[i] || rstatus[i])	/* (an open: one that does not know it, tensor_regions) */
			continue;
		if (*first < 0)
			*first = i;
		else if (memcmp(&reps[i].spec, &reps[*first].spec, sizeof(reps[0].spec)))
			return rps__seterr(-EEXIST, "tensor '%s': servers disagree about its options (a stale tensor on one of them?)", name);
	}
	if (*first < 0)
		return rps__seterr(-ECONNRESET, "tensor '%s': no server reachable", name);
	if (msg->flags & RPS__CREATE_OPEN_ONLY) {
		/* now we know its size: lay it out again and ask again */
		t->spec = reps[*first].spec;
		ret = rps__layout_init(&t->layout, name, t->spec.count, cl->shard_elems, cl->map.npart);
		if (!ret)
			ret = tensor_regions(cl, t, msg, to, reps, rstatus, false);
	}
	return ret;
}

/*
 * Initial values go to the shards whose server this call created the
 * tensor on; the others got them from whoever created it there.
 */
static int tensor_send_init(struct rps_client *cl, struct rps_tensor *t, const char *name, const float *init,
			    const struct rps__create_rep *reps)
{
	uint32_t n = 0, k = 0, s;
	struct rps_request *r;
	int ret;

	for (s = 0; s < t->layout.nshards; s++) {
		int c = t->part[rps__shard_server(&t->layout, s)].conn;
		n += c >= 0 && reps[c].created ? 1u : 0u;
	}
	if (!n)
		return 0;
	r = rps__req_new(cl, n);
	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_SHARDS;
	for (s = 0; s < t->layout.nshards; s++) {
		struct shard_op *op;
		int c = t->part[rps__shard_server(&t->layout, s)].conn;
		if (c < 0 || !reps[c].created)
			continue;
		op = rps__op_init(&r->ops[k++], r, t, OP_INIT, s);
		op->src = init + rps__shard_first(&t->layout, s);
	}
	ret = rps__submit_and_wait(cl, r, NULL);
	if (ret)
		rps__preerr(ret, "tensor '%s': sending initial values", name);
	return ret;
}

/*
 * Where this worker's clock starts: 0 for a new job; for a process that
 * takes over a rank, the first step the rank has not contributed to on
 * some shard (the lowest of the servers' answers), so its first push
 * counts for the step its predecessor did not complete.  Shards that
 * already have that step from the predecessor answer -EALREADY up to the
 * highest answer, which counts as done (rps__op_report).
 */
static void resume_rank(struct rps_client *cl, struct rps_tensor *t, const bool *to,
			const struct rps__create_rep *reps)
{
	uint64_t lo = UINT64_MAX, hi = 0;
	int i;

	for (i = 0; i < cl->nservers; i++) {
		if (!to[i] || !reps[i].total)
			continue;
		lo = RPS__MIN(lo, reps[i].resume_clock);
		hi = RPS__MAX(hi, reps[i].resume_until);
	}
	if (lo == UINT64_MAX)
		return;
	t->clock = lo;
	t->resume_until = hi;
}

/* Create (msg without OPEN_ONLY) or open the tensor `name` on every server we reach. */
static int tensor_setup(struct rps_client *cl, const char *name, struct rps__create *msg,
			const struct rps_tensor_opts *o, rps_tensor_t **out)
{
	struct rps__create_rep *reps;
	int32_t *rstatus;
	bool *to;
	struct rps_tensor *t = NULL;
	uint64_t deadline = rps__now_ns() + (uint64_t)cl->timeout_ms * 1000000ull;
	uint32_t pause_ms = 10;
	int i, first, ret;

	reps = calloc(MAX_CONNS, sizeof(*reps));
	rstatus = calloc(MAX_CONNS, sizeof(*rstatus));
	to = calloc(MAX_CONNS, sizeof(*to));
	if (!reps || !rstatus || !to) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	for (;;) {
		for (i = 0; i < cl->nservers; i++)
			to[i] = !cl->conns[i].dead && cl->conns[i].ep;
		ret = tensor_new(cl, name, msg, &t);
		if (ret)
			goto out;
		ret = tensor_locate(cl, t, name, msg, to, reps, rstatus, &first);
		if (!ret)
			break;
		/* A server was lost while we asked (a stopped one is found out
		 * by the unanswered CREATE, progress.c process_silent): in a
		 * replicated cluster its partitions fail over, so ride through
		 * as a push does, with the map read again, until timeout_ms. */
		if (ret != -ECONNRESET || !rps__replicated(cl) || rps__now_ns() >= deadline)
			goto out;
		rps__log(RPS__LOG_DEBUG, "%s: asking again once the map has moved on", rps__errbuf());
		rps__tensor_free(t);
		t = NULL;
		usleep(pause_ms * 1000);
		pause_ms = RPS__MIN(pause_ms * 2, 200u);
		rps__map_refresh(cl);
	}
	t->spec = reps[first].spec;
	t->stride = reps[first].stride;
	resume_rank(cl, t, to, reps);
	t->lock_guess = calloc(t->layout.nshards, sizeof(uint64_t));
	t->lock_held = calloc(t->layout.nshards, sizeof(uint64_t));
	t->shard_busy = calloc(t->layout.nshards, sizeof(*t->shard_busy));
	if (!t->lock_guess || !t->lock_held || !t->shard_busy) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	if (o && o->init) {
		ret = tensor_send_init(cl, t, name, o->init, reps);
		if (ret)
			goto out;
	}
	*out = t;
	t = NULL;
out:
	if (t)
		rps__tensor_free(t);
	free(reps);
	free(rstatus);
	free(to);
	return ret;
}

RPS_EXPORT int rps_tensor_create(rps_client_t *cl, const char *name, const struct rps_tensor_opts *opts,
				 rps_tensor_t **out)
{
	struct rps__create msg;
	int ret;

	rps__clearerr();
	if (!cl || !name || !out)
		return rps__seterr(-EINVAL, "rps_tensor_create: NULL argument");
	ret = rps__name_check(name);
	if (ret)
		return ret;
	memset(&msg, 0, sizeof(msg));
	snprintf(msg.name, sizeof(msg.name), "%s", name);
	ret = spec_from_opts(name, opts, cl->num_workers, &msg.spec);
	if (ret)
		return ret;
	msg.flags = msg.spec.flags;
	return tensor_setup(cl, name, &msg, opts, out);
}

RPS_EXPORT int rps_tensor_open(rps_client_t *cl, const char *name, rps_tensor_t **out)
{
	struct rps__create msg;
	int ret;

	rps__clearerr();
	if (!cl || !name || !out)
		return rps__seterr(-EINVAL, "rps_tensor_open: NULL argument");
	ret = rps__name_check(name);
	if (ret)
		return ret;
	memset(&msg, 0, sizeof(msg));
	snprintf(msg.name, sizeof(msg.name), "%s", name);
	msg.flags = RPS__CREATE_OPEN_ONLY;
	return tensor_setup(cl, name, &msg, NULL, out);
}

RPS_EXPORT int rps_tensor_info(const rps_tensor_t *t, struct rps_tensor_opts *o)
{
	struct rps_tensor_opts d;
	size_t size;

	if (!t || !o || o->size < offsetof(struct rps_tensor_opts, init))
		return rps__seterr(-EINVAL, "rps_tensor_info: NULL argument or options not initialised");
	/* filled in a struct of our own: an older caller's is smaller */
	size = o->size;
	rps__tensor_opts_defaults(&d);
	d.size = RPS__MIN(size, sizeof(d));
	d.count = t->spec.count;
	d.dtype = (enum rps_dtype)t->spec.dtype;
	d.mode = (enum rps_mode)t->spec.mode;
	d.staleness = t->spec.staleness;
	d.optimizer = (enum rps_optimizer)t->spec.optimizer;
	d.lr = t->spec.lr;
	d.momentum = t->spec.momentum;
	d.beta1 = t->spec.beta1;
	d.beta2 = t->spec.beta2;
	d.eps = t->spec.eps;
	d.weight_decay = t->spec.weight_decay;
	d.rescale = t->spec.rescale;
	memcpy(o, &d, d.size);
	return 0;
}

RPS_EXPORT uint32_t rps_tensor_shards(const rps_tensor_t *t)
{
	return t ? t->layout.nshards : 0;
}

RPS_EXPORT int rps_tensor_clock(const rps_tensor_t *t, uint64_t *clock)
{
	if (!t || !clock)
		return rps__seterr(-EINVAL, "rps_tensor_clock: NULL argument");
	pthread_mutex_lock(&t->cl->lock);	/* (pushes of other threads move it) */
	*clock = t->clock;
	pthread_mutex_unlock(&t->cl->lock);
	return 0;
}

void rps__tensor_free(struct rps_tensor *t)
{
	free(t->at);
	free(t->part);
	free(t->lock_guess);
	free(t->lock_held);
	free(t->shard_busy);
	free(t);
}

RPS_EXPORT void rps_tensor_close(rps_tensor_t *t)
{
	struct rps_client *cl;

	if (!t)
		return;
	/* An op of a request that timed out may still be running; it frees
	 * the tensor when it ends (or when the client closes). */
	cl = t->cl;
	pthread_mutex_lock(&cl->lock);
	if (t->live_ops) {
		t->closing = true;
		t = NULL;
	}
	pthread_mutex_unlock(&cl->lock);
	if (t)
		rps__tensor_free(t);
}
