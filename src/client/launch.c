/*
 * launch.c - rps_client_opts_from_env(): a worker's servers, rank and world
 * size from the variables its launcher sets (torchrun, Slurm, Open MPI,
 * PMI), so a trainer started by any of them needs no glue of its own to
 * find its place, and every language binding finds it the same way.
 *
 * It only reads the environment: it never connects, allocates or writes a
 * member the caller set.  A member counts as unset when servers is NULL,
 * rank < 0 or num_workers < 1 (rps_client_opts_init() sets rank 0 and
 * num_workers 1, both meaningful, so the caller asks for them with -1).
 */
#include "config.h"
#include "common/common.h"
#include "client/client_int.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* In the order they are tried: the first launcher with either variable set wins. */
static const struct launcher {
	const char *source, *rank, *size;
} launchers[] = {
	{ "rdmaps", "RDMAPS_RANK", "RDMAPS_WORLD_SIZE" },
	{ "torchrun", "RANK", "WORLD_SIZE" },
	{ "slurm", "SLURM_PROCID", "SLURM_NTASKS" },
	{ "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
	{ "pmi", "PMI_RANK", "PMI_SIZE" },
};

static const char *env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

/* A decimal number in [min, INT_MAX], nothing else (no sign, no spaces). */
static int parse_int(const char *name, const char *s, int min, int *out)
{
	char tmp[64];
	long v = 0;
	const char *p;

	for (p = s; *p >= '0' && *p <= '9'; p++) {
		v = v * 10 + (*p - '0');
		if (v > INT_MAX)
			break;
	}
	if (p == s || *p || v < min)
		return rps__seterr(-EINVAL, "rps_client_opts_from_env: %s='%s' is not a %s",
				   name, rps__escape(s, tmp, sizeof(tmp)),
				   min ? "world size (a whole number from 1)" : "rank (a whole number from 0)");
	*out = (int)v;
	return 0;
}

RPS_EXPORT int rps_client_opts_from_env(struct rps_client_opts *opts, const char **source)
{
	const struct launcher *l = NULL;
	const char *servers, *src = "caller", *rs, *ws;
	int rank, world, ret;
	size_t i;

	rps__clearerr();
	if (source)
		*source = "none";
	if (!opts || opts->size < offsetof(struct rps_client_opts, num_workers) + sizeof(int))
		return rps__seterr(-EINVAL, "rps_client_opts_from_env: options not initialised with "
				   "rps_client_opts_init()");
	rank = opts->rank;
	world = opts->num_workers;
	if (rank < 0 || world < 1) {
		src = "none";
		for (i = 0; i < RPS__ARRAY_SIZE(launchers) && !l; i++)
			if (env(launchers[i].rank) || env(launchers[i].size))
				l = &launchers[i];
	}
	if (l) {
		int r, w;

		src = l->source;
		if (source)
			*source = src;
		rs = env(l->rank);
		ws = env(l->size);
		if (!rs || !ws)
			return rps__seterr(-EINVAL, "rps_client_opts_from_env: %s is set but %s is not: "
					   "a %s launch sets both", rs ? l->rank : l->size,
					   rs ? l->size : l->rank, l->source);
		if ((ret = parse_int(l->rank, rs, 0, &r)) || (ret = parse_int(l->size, ws, 1, &w)))
			return ret;
		if (rank < 0)
			rank = r;
		if (world < 1)
			world = w;
		if (rank >= world) {
			if (opts->rank < 0 && opts->num_workers < 1)
				return rps__seterr(-EINVAL, "rps_client_opts_from_env: %s=%d is not below %s=%d: "
						   "ranks run from 0 to the world size - 1", l->rank, rank, l->size, world);
			if (opts->rank >= 0)
				return rps__seterr(-EINVAL, "rps_client_opts_from_env: the caller's rank %d is not "
						   "below %s=%d", rank, l->size, world);
			return rps__seterr(-EINVAL, "rps_client_opts_from_env: %s=%d is not below the caller's "
					   "num_workers %d", l->rank, rank, world);
		}
	} else if (rank >= 0 && world >= 1 && rank >= world) {
		return rps__seterr(-EINVAL, "rps_client_opts_from_env: the caller's rank %d is not below its "
				   "num_workers %d", rank, world);
	}
	servers = opts->servers;
	if (!servers && !(servers = env("RDMAPS_SERVERS")))
		return rps__seterr(-ENOENT, "rps_client_opts_from_env: no servers: set opts.servers or "
				   "RDMAPS_SERVERS (e.g. tcp://10.0.0.1:7000,tcp://10.0.0.2:7000)");
	opts->servers = servers;
	if (l) {
		opts->rank = rank;
		opts->num_workers = world;
	}
	if (source)
		*source = src;
	return 0;
}
