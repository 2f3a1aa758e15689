/*
 * req_peek.h - what a test may see of a worker's request before librdmaps
 * acts on it: rps_wait and rps_test retry a request a server refused as
 * stale, which hides the refusal from the caller.  In a file of its own
 * because client_int.h's struct conn is not the data plane's.
 */
#ifndef RPS_TEST_REQ_PEEK_H
#define RPS_TEST_REQ_PEEK_H

#include "rdmaps.h"

/* The status r (started, not yet waited for) finished with, before any
 * retry; -ETIMEDOUT if it is not done within timeout_ms. */
int req_peek_status(rps_request_t *r, int timeout_ms);

#endif
