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

/* The client's asserts are live in this build (no NDEBUG): a forked child
 * tells a request of no ops that one of its parts is done, more than it
 * issued, and must die of SIGABRT.  1 if it did, 0 if not (or no fork). */
int req_peek_asserts_live(void);

/* A request of two parts of cl, the first ended with status a, then the
 * second with b: the status the request ends with (what its waiter gets,
 * and whether it retries: rps__retryable).  Nothing is sent. */
int req_peek_two_parts(rps_client_t *cl, int a, int b);

#endif
