/*
 * req_peek.c - a look at a worker's request before librdmaps retries it
 * (see req_peek.h).
 */
#include "config.h"
#include "client/client_int.h"
#include "req_peek.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

int req_peek_status(rps_request_t *r, int timeout_ms)
{
	struct timespec ms = { 0, 1000000L };

	for (int waited = 0; waited <= timeout_ms; waited++) {
		bool done;
		int status;

		/* the progress thread finishes it under the client's lock */
		pthread_mutex_lock(&r->cl->lock);
		done = r->done;
		status = r->status;
		pthread_mutex_unlock(&r->cl->lock);
		if (done)
			return status;
		nanosleep(&ms, NULL);
	}
	return -ETIMEDOUT;
}
