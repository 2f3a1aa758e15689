/*
 * buffer.c - user memory registered for zero-copy (rps_buffer_register).
 *
 * A push normally copies each shard's gradient behind its descriptor in a
 * staging slot and sends both with one WRITE_IMM.  A gradient that lies in
 * a registered buffer goes out as the second entry of that WRITE_IMM,
 * straight from the user's memory; a pull into one has its READ scatter
 * the parameters there (ops.c does both).  The server sees the same bytes
 * either way.  A buffer is in use while a shard op that reads or writes it
 * is live (users), and cannot be deregistered then: the fabric may still
 * be reading it.
 */
#include "config.h"
#include "common/common.h"
#include "client/client_int.h"

#include <errno.h>
#include <stdlib.h>

/* The buffer of cl that holds [addr, addr + len), if any.  Lock held.
 * A few buffers per client are the use: a list will do. */
struct rps_buffer *rps__buffer_find(struct rps_client *cl, const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	struct rps_buffer *b;

	for (b = cl->buffers; b; b = b->next)
		if (a >= (uintptr_t)b->addr && len <= b->len && a - (uintptr_t)b->addr <= b->len - len)
			return b;
	return NULL;
}

RPS_EXPORT int rps_buffer_register(rps_client_t *cl, void *addr, size_t len, rps_buffer_t **out)
{
	struct rps_buffer *b;
	int ret;

	rps__clearerr();
	if (!cl || !out)
		return rps__seterr(-EINVAL, "rps_buffer_register: NULL %s", cl ? "out pointer" : "client");
	if (!addr || !len)
		return rps__seterr(-EINVAL, "rps_buffer_register: empty buffer (%p, %zu bytes): register the memory "
				   "the pushes and pulls use", addr, len);
	if ((uintptr_t)addr + len < (uintptr_t)addr)
		return rps__seterr(-EINVAL, "rps_buffer_register: %p + %zu bytes wraps around", addr, len);
	b = calloc(1, sizeof(*b));
	if (!b)
		return rps__seterr(-ENOMEM, "rps_buffer_register: out of memory");
	b->cl = cl;
	b->addr = addr;
	b->len = len;
	/* local access only: the fabric reads it for pushes and writes it for
	 * pulls, no peer ever reaches it */
	ret = rps__mr_reg(cl->fab, addr, len, RPS__ACCESS_LOCAL, &b->mr);
	if (ret)
		goto err_free;
	pthread_mutex_lock(&cl->lock);
	b->next = cl->buffers;
	if (cl->buffers)
		cl->buffers->prev = b;
	cl->buffers = b;
	pthread_mutex_unlock(&cl->lock);
	*out = b;
	return 0;

err_free:
	free(b);
	return rps__preerr(ret, "rps_buffer_register(%zu bytes at %p)", len, addr);
}

static void buffer_unlink(struct rps_client *cl, struct rps_buffer *b)
{
	if (b->prev)
		b->prev->next = b->next;
	else
		cl->buffers = b->next;
	if (b->next)
		b->next->prev = b->prev;
}

RPS_EXPORT int rps_buffer_deregister(rps_buffer_t *b)
{
	struct rps_client *cl;
	uint32_t users;

	rps__clearerr();
	if (!b)
		return 0;
	cl = b->cl;
	pthread_mutex_lock(&cl->lock);
	users = b->users;
	if (!users)
		buffer_unlink(cl, b);
	pthread_mutex_unlock(&cl->lock);
	if (users)
		return rps__seterr(-EBUSY, "rps_buffer_deregister(%zu bytes at %p): %u shard operations of pushes or "
				   "pulls still use it: wait for their requests first", b->len, (void *)b->addr, users);
	rps__mr_dereg(b->mr);
	free(b);
	return 0;
}

/* rps_client_close: the buffers the user left registered (no op is live). */
void rps__buffers_free(struct rps_client *cl)
{
	struct rps_buffer *b;

	while ((b = cl->buffers) != NULL) {
		buffer_unlink(cl, b);
		rps__mr_dereg(b->mr);
		free(b);
	}
}
