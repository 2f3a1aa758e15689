/*
 * shard.c - tensor placement and shard layout (see shard.h).
 */
#include "config.h"
#include "proto/shard.h"
#include "common/common.h"

#include <errno.h>

_Static_assert(sizeof(struct rps__shard_hdr) == RPS__SHARD_HDR_SIZE, "shard header is one cache line");

uint32_t rps__name_hash(const char *name)
{
	uint32_t h = 2166136261u;

	for (; *name; name++) {
		h ^= (uint8_t)*name;
		h *= 16777619u;
	}
	return h;
}

int rps__layout_init(struct rps__layout *l, const char *name, uint64_t count,
		     uint32_t shard_elems, uint32_t nservers)
{
	uint64_t nshards;

	if (!count)
		return rps__seterr(-EINVAL, "tensor '%s': count must be at least 1", name);
	if (!shard_elems || !nservers)
		return rps__seterr(-EINVAL, "tensor '%s': no servers or zero shard size", name);
	/* not (count + shard_elems - 1) / shard_elems: that wraps near 2^64 */
	nshards = count / shard_elems + (count % shard_elems != 0);
	if (nshards > UINT32_MAX)
		return rps__seterr(-EFBIG, "tensor '%s': %llu elements need too many shards: raise rdmapsd --shard-size",
				   name, (unsigned long long)count);
	l->count = count;
	l->shard_elems = shard_elems;
	l->nshards = (uint32_t)nshards;
	l->nservers = nservers;
	l->seed = rps__name_hash(name);
	return 0;
}

uint32_t rps__shard_elems(const struct rps__layout *l, uint32_t shard)
{
	uint64_t first = rps__shard_first(l, shard);
	uint64_t left = l->count - first;

	return left < l->shard_elems ? (uint32_t)left : l->shard_elems;
}

/* Server s holds shards i with (seed + i) % n == s, i.e. i = r + j*n where
 * r = (s - seed) mod n. */
static uint32_t first_shard_of(const struct rps__layout *l, uint32_t server)
{
	uint64_t n = l->nservers;

	return (uint32_t)((server + n - (l->seed % n)) % n);
}

uint32_t rps__part_nshards(const struct rps__layout *l, uint32_t server)
{
	uint32_t r = first_shard_of(l, server);

	if (r >= l->nshards)
		return 0;
	return (l->nshards - r + l->nservers - 1) / l->nservers;
}

uint32_t rps__part_shard(const struct rps__layout *l, uint32_t server, uint32_t j)
{
	return first_shard_of(l, server) + j * l->nservers;
}

size_t rps__shard_stride(uint32_t shard_elems)
{
	return RPS__SHARD_HDR_SIZE + RPS__ALIGN_UP((size_t)shard_elems * 4u, 64u);
}
