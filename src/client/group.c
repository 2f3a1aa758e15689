/*
 * group.c - many small tensors pushed and pulled as one (rps_group_*).
 *
 * A model has hundreds of small tensors (biases, norms); pushed one by one,
 * each costs a round trip for a few hundred bytes.  A group stores its
 * members back to back as one tensor on the servers, and a group push is
 * one push of that tensor: the members are gathered into a staging buffer,
 * and its shards go out as every push's do, pipelined, a few members to a
 * shard.  (The staging buffer is not registered for zero-copy: a push that
 * timed out may leave ops reading registered memory, and the next push
 * must be free to refill it; unregistered, tcp sends from it and copies
 * what a timed-out push left unsent, verbs copies into its slots.)  A group pull reads the tensor into the staging
 * buffer and scatters it.  This is tensor fusion as Horovod and BytePS
 * do it; the optimizers are elementwise, so fused members are updated
 * exactly as separate tensors would be.
 *
 * The servers' tensor is named NAME#HHHHHHHH, a hash of the member
 * counts: workers whose groups disagree on their members never share it
 * (the servers only see the total).
 */
#include "config.h"
#include "common/common.h"
#include "kernels/agg.h"
#include "client/client_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rps_group {
	rps_tensor_t *t;
	uint32_t n;
	uint64_t *offset;	/* member i's first element in the tensor */
	uint64_t *count;
	size_t esize;		/* the gradient's element size */
	uint64_t total;
	/* gathered gradients (esize each) or pulled parameters (4 bytes each) */
	void *staging;
	pthread_mutex_t lock;	/* one push or pull at a time uses staging */
};

#define GROUP_HASH_CHARS 9	/* "#" and 8 hex digits */

/* FNV-1a over the member counts (little-endian bytes), folded to 32 bits. */
static uint32_t layout_hash(uint32_t n, const uint64_t *counts)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (uint32_t i = 0; i < n; i++)
		for (int b = 0; b < 8; b++) {
			h ^= (counts[i] >> (8 * b)) & 0xff;
			h *= 0x100000001b3ull;
		}
	return (uint32_t)(h ^ (h >> 32));
}

static void group_free(struct rps_group *g)
{
	if (g->t)
		rps_tensor_close(g->t);
	pthread_mutex_destroy(&g->lock);
	free(g->staging);
	free(g->offset);
	free(g->count);
	free(g);
}

RPS_EXPORT int rps_group_create(rps_client_t *cl, const char *name, const struct rps_tensor_opts *opts,
				uint32_t n, const uint64_t *counts, rps_group_t **out)
{
	char tname[RPS__NAME_MAX];
	struct rps_tensor_opts o;
	struct rps_group *g;
	size_t nlen;
	int ret;

	rps__clearerr();
	if (!cl || !name || !opts || !counts || !out)
		return rps__seterr(-EINVAL, "rps_group_create: NULL argument");
	*out = NULL;
	if (!n)
		return rps__seterr(-EINVAL, "rps_group_create: group '%s' has no members", name);
	nlen = strnlen(name, RPS__NAME_MAX);
	if (nlen + GROUP_HASH_CHARS >= RPS__NAME_MAX)
		return rps__seterr(-ENAMETOOLONG, "rps_group_create: group name of %zu bytes: give at most %u (the "
				   "servers' tensor adds '#' and 8 hex digits)", nlen, RPS__NAME_MAX - 1 - GROUP_HASH_CHARS);
	if (opts->size < offsetof(struct rps_tensor_opts, init) || !rps__dtype_size(opts->dtype))
		return rps__seterr(-EINVAL, "rps_group_create: options not initialised (rps_tensor_opts_init) or "
				   "an unknown dtype");
	g = calloc(1, sizeof(*g));
	if (!g)
		return rps__seterr(-ENOMEM, "rps_group_create: out of memory");
	pthread_mutex_init(&g->lock, NULL);
	g->n = n;
	g->offset = calloc(n, sizeof(*g->offset));
	g->count = calloc(n, sizeof(*g->count));
	if (!g->offset || !g->count) {
		ret = rps__seterr(-ENOMEM, "rps_group_create: out of memory for %u members", n);
		goto err_free;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!counts[i] || counts[i] > UINT64_MAX / 4 - g->total) {
			ret = rps__seterr(-EINVAL, "rps_group_create: member %u of '%s' has %llu elements: give 1 or "
					  "more, %llu in all at most", i, name, (unsigned long long)counts[i],
					  (unsigned long long)(UINT64_MAX / 4));
			goto err_free;
		}
		g->offset[i] = g->total;
		g->count[i] = counts[i];
		g->total += counts[i];
	}
	if (opts->count && opts->count != g->total) {
		ret = rps__seterr(-EINVAL, "rps_group_create: opts->count is %llu, but the members of '%s' add up to "
				  "%llu: leave it 0", (unsigned long long)opts->count, name,
				  (unsigned long long)g->total);
		goto err_free;
	}
	if (g->total > SIZE_MAX / 4) {
		ret = rps__seterr(-ENOMEM, "rps_group_create: %llu elements do not fit this process",
				  (unsigned long long)g->total);
		goto err_free;
	}
	g->esize = rps__dtype_size(opts->dtype);
	g->staging = malloc((size_t)g->total * 4);
	if (!g->staging) {
		ret = rps__seterr(-ENOMEM, "rps_group_create: out of memory for a staging buffer of %llu bytes",
				  (unsigned long long)g->total * 4);
		goto err_free;
	}
	o = *opts;
	o.size = RPS__MIN(opts->size, sizeof(o));
	o.count = g->total;
	snprintf(tname, sizeof(tname), "%s#%08x", name, layout_hash(n, counts));
	ret = rps_tensor_create(cl, tname, &o, &g->t);
	if (ret)
		goto err_free;
	*out = g;
	return 0;

err_free:
	group_free(g);
	return ret;
}

/* Every member's size against its count; the first mismatch named. */
static int sizes_check(const struct rps_group *g, const char *fn, const size_t *nbytes, size_t esize,
		       const void *const *bufs)
{
	for (uint32_t i = 0; i < g->n; i++) {
		if (!bufs[i])
			return rps__seterr(-EINVAL, "%s: member %u of '%s': NULL buffer", fn, i, g->t->name);
		if (nbytes[i] != g->count[i] * esize)
			return rps__seterr(-EINVAL, "%s: member %u of '%s' is %zu bytes, expected %llu (%llu elements "
					   "of %zu bytes)", fn, i, g->t->name, nbytes[i],
					   (unsigned long long)(g->count[i] * esize), (unsigned long long)g->count[i],
					   esize);
	}
	return 0;
}

RPS_EXPORT int rps_group_push(rps_group_t *g, const void *const *grads, const size_t *nbytes)
{
	uint8_t *s;
	int ret;

	rps__clearerr();
	if (!g || !grads || !nbytes)
		return rps__seterr(-EINVAL, "rps_group_push: NULL argument");
	ret = sizes_check(g, "rps_group_push", nbytes, g->esize, grads);
	if (ret)
		return ret;
	pthread_mutex_lock(&g->lock);
	s = g->staging;
	for (uint32_t i = 0; i < g->n; i++)
		memcpy(s + g->offset[i] * g->esize, grads[i], nbytes[i]);
	ret = rps_push(g->t, g->staging, (size_t)g->total * g->esize);
	pthread_mutex_unlock(&g->lock);
	return ret;
}

RPS_EXPORT int rps_group_pull(rps_group_t *g, float *const *outs, const size_t *nbytes, uint64_t *version)
{
	const float *s;
	int ret;

	rps__clearerr();
	if (!g || !outs || !nbytes)
		return rps__seterr(-EINVAL, "rps_group_pull: NULL argument");
	ret = sizes_check(g, "rps_group_pull", nbytes, 4, (const void *const *)outs);
	if (ret)
		return ret;
	pthread_mutex_lock(&g->lock);
	ret = rps_pull(g->t, g->staging, (size_t)g->total * 4, version);
	if (!ret) {
		s = g->staging;
		for (uint32_t i = 0; i < g->n; i++)
			memcpy(outs[i], s + g->offset[i], nbytes[i]);
	}
	pthread_mutex_unlock(&g->lock);
	return ret;
}

RPS_EXPORT rps_tensor_t *rps_group_tensor(const rps_group_t *g)
{
	return g ? g->t : NULL;
}

RPS_EXPORT void rps_group_close(rps_group_t *g)
{
	if (g)
		group_free(g);
}
