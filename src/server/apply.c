/*
 * apply.c - applying an update to a shard, shared by the primary (push.c)
 * and its backups (repl_stream.c), so the two run the same code in the same order
 * and end bit-identical: the optimizer step, the applied-push-id set, the
 * bounded clocks.  Per-push functions; the per-element work is in
 * src/kernels.
 */
#include "config.h"
#include "common/common.h"
#include "kernels/agg.h"
#include "kernels/optim.h"
#include "server/server_int.h"

#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* Apply one fp32 gradient: version step+1, not yet published. */
void rps__srv_shard_apply(struct srv_tensor *t, struct shard *s, const float *g)
{
	s->step++;
	rps__optim_apply(&t->optim, s->params, g, s->state, s->elems, s->step);
}

/* Apply one fp32 gradient to the shard and publish version step+1. */
void rps__srv_shard_update(struct srv_tensor *t, struct shard *s, const float *g)
{
	rps__srv_publish_begin(s);
	rps__srv_shard_apply(t, s, g);
	rps__srv_publish_end(s);
}

bool rps__srv_dedup_seen(const struct shard *s, uint64_t client, uint64_t push_id)
{
	uint32_t i, k;

	for (i = 0; i < s->ndd; i++)
		if (s->dd[i].client == client) {
			for (k = 0; k < DEDUP_IDS; k++)
				if (s->dd[i].ids[k] == push_id)
					return true;
			return false;
		}
	return false;
}

/* Remember a push applied for a worker: its last DEDUP_IDS pushes to this
 * shard (a resend comes within a few of them). */
void rps__srv_dedup_note(struct shard *s, uint64_t client, uint64_t push_id)
{
	struct dedup *grown;
	uint32_t i;

	for (i = 0; i < s->ndd; i++)
		if (s->dd[i].client == client)
			break;
	if (i == s->ndd) {
		grown = realloc(s->dd, (s->ndd + 1) * sizeof(*grown));
		if (!grown)
			return;		/* then only the lock protocol guards it, as before */
		s->dd = grown;
		memset(&s->dd[s->ndd], 0, sizeof(*s->dd));
		s->dd[s->ndd].client = client;
		s->ndd++;
	}
	s->dd[i].ids[s->dd[i].next] = push_id;
	s->dd[i].next = (s->dd[i].next + 1) % DEDUP_IDS;
}

/* A gradient of the given dtype as fp32: itself, or converted into the
 * shard's scratch. */
const float *rps__srv_grad_fp32(struct shard *s, const void *data, uint16_t dtype)
{
	if (dtype == RPS_DTYPE_F32)
		return data;
	rps__agg_copy(s->scratch, data, (enum rps_dtype)dtype, s->elems);
	return s->scratch;
}

void rps__srv_update_min_clock(struct srv_tensor *t, struct shard *s)
{
	uint64_t m = UINT64_MAX;
	int r;

	/* removed ranks aside (psctl remove-rank; one always stays) */
	for (r = 0; r < t->spec.num_workers; r++)
		if (!rps__srv_rank_removed(t, r))
			m = RPS__MIN(m, s->clocks[r]);
	__atomic_store_n(&s->hdr->min_clock, m, __ATOMIC_RELEASE);
}

/* Bounded: a push of rank with this clock was applied. */
void rps__srv_clock_note(struct srv_tensor *t, struct shard *s, int rank, uint64_t clock)
{
	if (clock + 1 > s->clocks[rank])
		s->clocks[rank] = clock + 1;
	rps__srv_update_min_clock(t, s);
}
