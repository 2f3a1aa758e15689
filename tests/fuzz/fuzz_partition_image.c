/*
 * fuzz_partition_image.c - libFuzzer harness of the partition image a move
 * ships (server/partition.c), structure-aware: an in-process data plane (TCP
 * on loopback, nothing served) holds a sync, a bounded and an async tensor
 * and parked sync pushes; the harness builds the valid image of partition 0
 * once, and each input is a list of edits to it, so the fuzzer spends its
 * runs on images that get past the header and the counts.  Each edited
 * image goes through the real validation and install path
 * (rps__srv_image_install, what a move's destination runs), and one that is
 * taken is drained as the server would (rps__srv_drain_held: where a bad
 * parked push used to crash).
 *
 * Input: a sequence of 8-byte records { u32 offset, u8 op, u8 value[3] }:
 *   op % 4 == 0  xor value[0] into the byte at offset % len
 *   op % 4 == 1  write value[0..2] and a zero as a u32 at offset % len
 *   op % 4 == 2  write UINT64 max at offset % len (counts, sizes, clocks)
 *   op % 4 == 3  cut the image at offset % (len + 1)
 * An input shorter than one record installs the valid image itself.
 */
#include "config.h"
#include "common/common.h"
#include "server/server_int.h"
#include "fuzz_common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

#define SHARD_BYTES 256u
#define NPART 2u

static struct rps__server *srv;
static unsigned char *valid;
static size_t valid_len;

/* What the control plane of a one-member cluster tells its data plane:
 * NPART partitions, every one of them served here. */
static void serve_all(void)
{
	const struct rps__dp_ops *dp = rps__dataplane_ops();
	uint32_t p;

	dp->set_map(srv, NPART, 1);
	for (p = 0; p < NPART; p++)
		dp->part_set(srv, p, &(struct rps__dp_part){ .epoch = 1, .map_epoch = 1, .serving = true });
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_partition_image: %s: %s\n", what, rps__errbuf());
	abort();
}

static struct srv_tensor *tensor_new(const char *name, enum rps_mode mode, enum rps_optimizer opt, int nworkers)
{
	struct rps__tensor_spec sp;
	struct srv_tensor *t = NULL;
	uint32_t p;

	memset(&sp, 0, sizeof(sp));
	sp.count = 3 * NPART * (SHARD_BYTES / 4) - 5;	/* a short last shard */
	sp.dtype = RPS_DTYPE_F32;
	sp.mode = mode;
	sp.staleness = mode == RPS_MODE_BOUNDED ? 2 : 0;
	sp.optimizer = opt;
	sp.lr = 0.1f;
	sp.momentum = 0.9f;
	sp.beta1 = 0.9f;
	sp.beta2 = 0.999f;
	sp.eps = 1e-8f;
	sp.rescale = 1.0f;
	sp.num_workers = nworkers;
	if (rps__srv_tensor_add(srv, name, &sp, &t))
		die(name);
	for (p = 0; p < NPART; p++)
		if (rps__srv_region_alloc(srv, t, p, false, NULL) || rps__srv_region_register(srv, t, p))
			die(name);
	return t;
}

static void park(struct srv_tensor *t, uint32_t j, uint64_t clock, int rank)
{
	struct parked *pk;

	if (rps__srv_parked_slot(srv, &pk))
		abort();
	srv->push.nparked++;
	pk->t = t;
	pk->local = rps__part_shard(&t->layout, 0, j);
	pk->clock = clock;
	pk->rank = rank;
	pk->nbytes = (size_t)t->shards[pk->local].elems * 4;
	pk->data = calloc(1, pk->nbytes);
	if (!pk->data)
		abort();
	pk->cap = pk->nbytes;
	srv->push.parked_bytes += pk->nbytes;
}

/* Tensors an image with an edited name brought along go (the run would
 * otherwise grow without bound). */
static void drop_new_tensors(uint32_t keep)
{
	while (srv->ntensors > keep) {
		struct srv_tensor *t = srv->tensors[--srv->ntensors];
		for (uint32_t p = 0; p < NPART; p++)
			rps__srv_region_free(srv, t, p);
		free(t->regions);
		free(t->shards);
		free(t);
		srv->tensors[srv->ntensors] = NULL;
	}
}

/* Parked pushes an install added go, as a move would take them on. */
static void unpark_all(void)
{
	while (srv->push.nparked) {
		struct parked *pk = &srv->push.parked[--srv->push.nparked];
		srv->push.parked_bytes -= pk->nbytes;
		free(pk->data);
	}
}

static void setup(void)
{
	struct rps__server_config cfg;
	struct srv_tensor *s, *b, *a;
	void *img;
	uint32_t j;

	rps__log_level = -1;	/* refusals are the point: keep the output for crashes */
	rps__server_config_init(&cfg);
	cfg.listen.kind = RPS__KIND_TCP;
	snprintf(cfg.listen.host, sizeof(cfg.listen.host), "127.0.0.1");
	cfg.shard_bytes = SHARD_BYTES;
	cfg.npart = NPART;
	cfg.fsync_none = 1;
	cfg.no_pin = 1;
	cfg.topology = fuzz_topology();
	if (rps__server_create(&cfg, &srv))
		die("starting the server");
	serve_all();
	s = tensor_new("sync", RPS_MODE_SYNC, RPS_OPT_ADAM, 3);
	b = tensor_new("bounded", RPS_MODE_BOUNDED, RPS_OPT_MOMENTUM, 2);
	a = tensor_new("async", RPS_MODE_ASYNC, RPS_OPT_SGD, 0);
	(void)a;
	for (j = 0; j < rps__part_nshards(&s->layout, 0); j++) {
		struct shard *sh = &s->shards[rps__part_shard(&s->layout, 0, j)];
		sh->step = 4;
		sh->next_rank = 1;
		sh->params[0] = 1.5f;
		park(s, j, 4, 2);
		park(s, j, 5, 0);
	}
	for (j = 0; j < rps__part_nshards(&b->layout, 0); j++) {
		struct shard *sh = &b->shards[rps__part_shard(&b->layout, 0, j)];
		sh->clocks[0] = 3;
		sh->clocks[1] = 2;
		sh->hdr->min_clock = 2;
		sh->step = 5;
	}
	if (rps__srv_image_build(srv, 0, srv->parts[0].epoch, &img, &valid_len))
		die("building the image");
	valid = img;
	unpark_all();
	if (rps__srv_image_install(srv, 0, srv->parts[0].epoch, valid, valid_len))
		die("the valid image is refused");
	unpark_all();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char *m;
	size_t len, i;

	if (!srv)
		setup();
	len = valid_len;
	m = malloc(len);
	if (!m)
		return 0;
	memcpy(m, valid, len);
	for (i = 0; i + 8 <= size; i += 8) {
		uint32_t off;
		uint8_t op = data[i + 4];
		memcpy(&off, data + i, 4);
		switch (op % 4) {
		case 0:
			if (len)
				m[off % len] ^= data[i + 5];
			break;
		case 1:
			if (len) {
				size_t at = off % len;
				uint8_t v[4] = { data[i + 5], data[i + 6], data[i + 7], 0 };
				memcpy(m + at, v, RPS__MIN((size_t)4, len - at));
			}
			break;
		case 2:
			if (len) {
				size_t at = off % len;
				memset(m + at, 0xff, RPS__MIN((size_t)8, len - at));
			}
			break;
		default:
			len = off % (len + 1);
			break;
		}
	}
	if (rps__srv_image_install(srv, 0, srv->parts[0].epoch, m, len) == 0)
		rps__srv_drain_held(srv);
	unpark_all();
	drop_new_tensors(3);
	free(m);
	return 0;
}
