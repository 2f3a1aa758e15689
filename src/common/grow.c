/*
 * grow.c - the one way an array of the tree grows.
 *
 * Tables that grow as peers come (connections, waiters, held pushes,
 * replication waits, dials...) keep (pointer, count, capacity) and double
 * the capacity when the count reaches it.  rps__grow is that step, written
 * once: the overflow checks and the failure path (the old array and its
 * capacity stay as they were) cannot differ from one table to the next.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

int rps__grow(void *arrp, uint32_t *cap, uint32_t need, size_t elem, uint32_t first)
{
	uint32_t n = *cap ? *cap : (first ? first : 1);
	void *old, *grown;

	if (need <= *cap)
		return 0;
	while (n < need) {
		if (n > UINT32_MAX / 2)
			return -ENOMEM;
		n *= 2;
	}
	if (elem && (size_t)n > SIZE_MAX / elem)
		return -ENOMEM;
	/* *arrp is a `T *` of the caller's type: copied as bytes, never read
	 * or written as a void * (object pointers share one representation on
	 * every POSIX system; memcpy keeps that clear of aliasing rules) */
	memcpy(&old, arrp, sizeof(old));
	grown = realloc(old, (size_t)n * elem);
	if (!grown)
		return -ENOMEM;
	memcpy(arrp, &grown, sizeof(grown));
	*cap = n;
	return 0;
}
