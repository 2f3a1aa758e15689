/*
 * shard.h - how tensors are cut into shards, where shards live, and the
 * layout of a shard in a server's registered memory.  Shared by the client
 * (which computes placement and reads shards one-sidedly) and the server.
 *
 * A tensor of `count` elements is cut into shards of `shard_elems` fp32
 * elements (the last may be shorter).  Shard i belongs to partition
 * (hash(name) + i) mod npart, as its local shard i / npart; the shard map
 * (smap.h) says which server owns a partition.  On that server a tensor's
 * shards of one partition sit in one registered region, each `stride`
 * bytes: a 64-byte header, then the fp32 parameters.  (The layout's
 * "servers" below are partitions: the arithmetic is the same.)
 *
 * The header's lock word is touched ONLY by atomics through the transport
 * (workers' RDMA CAS, the server's rps__local_cas): an HCA that reports
 * IBV_ATOMIC_HCA makes its atomics atomic only against other HCA atomics, so
 * a CPU store to it could be lost.  The publish counter is written only by
 * the server CPU (seqlock: odd while it writes the parameters) and only read
 * remotely.
 */
#ifndef RPS_SHARD_H
#define RPS_SHARD_H

#include <stdint.h>
#include <stddef.h>

#define RPS__SHARD_HDR_SIZE 64u

struct rps__shard_hdr {
	uint64_t lock;		/* lock word, see below; atomics only */
	uint64_t seq;		/* publish counter: version = seq / 2, odd = being written */
	uint64_t min_clock;	/* bounded mode: all workers' pushes below it are applied */
	uint64_t epoch;		/* ownership epoch of this copy; RPS__EPOCH_MOVED once fenced */
	uint32_t shard;		/* global shard index */
	uint32_t elems;		/* parameters in this shard */
	uint64_t reserved[3];
};

/*
 * Lock word: bit 0 = locked, bits 1..15 = owner id (1..32767, the server
 * gives each connection one), bits 16..63 = lock version (how many times
 * the lock was released).  Acquire: CAS(unlocked(v), locked(v, me)).
 * Release: CAS(locked(v, me), unlocked(v + 1)) -- by the server, through
 * rps__local_cas, once it has decided the push that names locked(v, me); or
 * when it breaks the lock (lease expired, holder gone); or by a worker that
 * took the lock without pushing (psperf's lock test).  The version moves on
 * with every release, so a word never comes back (no ABA for a slow holder).
 *
 * A shard whose partition moves away is fenced: its lock word becomes
 * locked(v, RPS__LOCK_OWNER_FENCE), which no worker holds, so every later
 * CAS fails and shows the worker the fence (refresh the map, go to the new
 * owner).
 */
#define RPS__LOCK_OWNER_MAX 32766u
#define RPS__LOCK_OWNER_FENCE 32767u

static inline uint64_t rps__lock_unlocked(uint64_t version)
{
	return version << 16;
}

static inline uint64_t rps__lock_locked(uint64_t version, uint32_t owner)
{
	return (version << 16) | ((uint64_t)(owner & 0x7fff) << 1) | 1u;
}

static inline int rps__lock_is_locked(uint64_t w) { return (int)(w & 1u); }
static inline uint32_t rps__lock_owner(uint64_t w) { return (uint32_t)((w >> 1) & 0x7fff); }
static inline uint64_t rps__lock_version(uint64_t w) { return w >> 16; }

/* FNV-1a of the tensor name: the placement seed, the same everywhere. */
uint32_t rps__name_hash(const char *name);

struct rps__layout {
	uint64_t count;		/* tensor elements */
	uint32_t shard_elems;	/* elements per full shard */
	uint32_t nshards;	/* shards of the tensor */
	uint32_t nservers;
	uint32_t seed;		/* rps__name_hash(name) */
};

int rps__layout_init(struct rps__layout *l, const char *name, uint64_t count,
		     uint32_t shard_elems, uint32_t nservers);
static inline uint32_t rps__shard_server(const struct rps__layout *l, uint32_t shard)
{
	return (uint32_t)(((uint64_t)l->seed + shard) % l->nservers);
}
static inline uint32_t rps__shard_local_index(const struct rps__layout *l, uint32_t shard)
{
	return shard / l->nservers;
}
/* First element and element count of a shard. */
static inline uint64_t rps__shard_first(const struct rps__layout *l, uint32_t shard)
{
	return (uint64_t)shard * l->shard_elems;
}
uint32_t rps__shard_elems(const struct rps__layout *l, uint32_t shard);
/* How many shards partition (layout "server") p holds, and the global
 * index of its j-th one. */
uint32_t rps__part_nshards(const struct rps__layout *l, uint32_t server);
uint32_t rps__part_shard(const struct rps__layout *l, uint32_t server, uint32_t j);
/* Bytes between consecutive shards in a server's tensor region. */
size_t rps__shard_stride(uint32_t shard_elems);

#endif
