/*
 * client.h - internal hooks of librdmaps for psperf and the tests; not part
 * of the public API (rdmaps.h) and not exported from the shared library.
 */
#ifndef RPS_CLIENT_H
#define RPS_CLIENT_H

#include "rdmaps.h"

/* Take / release the version lock of one shard of an async or bounded
 * tensor, with RDMA compare-and-swap, as a push does (for benchmarks of the
 * lock alone).  Unlock moves the lock version on, as every release does. */
int rps__tensor_lock(rps_tensor_t *t, uint32_t shard);
int rps__tensor_unlock(rps_tensor_t *t, uint32_t shard);
/* "tcp", "rxe0", "mlx5_0" */
const char *rps__client_fabric_name(const rps_client_t *cl);
/* Payload bytes the client's work requests put on the wire so far
 * (rps__fabric_tx_bytes): psperf's bytes per payload byte. */
uint64_t rps__client_tx_bytes(const rps_client_t *cl);
/* copy 1: every push is copied to a staging slot and every pull from a
 * bounce buffer, registered buffers or not (the path before zero-copy):
 * for benchmarks that compare the two in one run. */
void rps__client_set_copy(rps_client_t *cl, int copy);
/* Shard pushes sent from the caller's memory (no copy to a staging slot),
 * and in *pulls if given, shard pulls read straight into it. */
uint64_t rps__client_zcopy(const rps_client_t *cl, uint64_t *pulls);
/* Shard pushes a server refused unapplied with RPS_ESTALE_EPOCH (moved,
 * or fenced while its lease was out): each goes again, gradient and all,
 * to the partition's owner. */
uint64_t rps__client_pushes_fenced(const rps_client_t *cl);
/* Pushes posted as members of a chain (a window's pushes to one shard
 * pipelined under their head's lock word, ops.c), and, in *requeued if
 * given, those of them refused because the head's word was not ours and
 * queued again. */
uint64_t rps__client_pushes_chained(const rps_client_t *cl, uint64_t *requeued);
/* Registered memory the client stages pushes and pulls in now, over all its
 * endpoints; *budget (may be NULL): what it may use (opts.staging_bytes). */
uint64_t rps__client_staging_bytes(const rps_client_t *cl, uint64_t *budget);

#endif
