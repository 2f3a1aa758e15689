/*
 * ctl.h - a blocking request/reply channel from an administration tool
 * (psctl) to one rdmapsd.
 *
 * One connection with the role RPS__ROLE_ADMIN, a few receive buffers of
 * RPS__BIG_MSG_MAX bytes kept posted, one send buffer, and one request in
 * flight at a time: rps__ctl_call() sends a message with a fresh req_id and
 * polls the completion queue until the reply carrying that req_id arrives
 * (a late reply to an earlier, timed-out call is dropped).  Nothing runs in
 * the background; the TCP transport progresses only inside the call.
 *
 * Errors are negative errno values with one line in rps__errbuf() naming the
 * server, what failed and what to do:
 *   -ECONNREFUSED / -EHOSTUNREACH / -ETIMEDOUT ...  rps__ctl_open
 *   -ETIMEDOUT    no reply within the timeout (the channel stays usable)
 *   -ECONNRESET   the connection failed; the channel is dead, close it
 *   -EBADMSG      the reply did not validate, or was not the reply type
 *   -EMSGSIZE     a request or reply larger than the buffers
 * Not thread-safe: one channel is used by one thread.
 */
#ifndef RPS_CTL_H
#define RPS_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "transport/uri.h"

struct rps__ctl;

/* Connect to the server at u (the fabric of u's kind; verbs picks the device
 * that routes to u->host).  timeout_ms bounds the connect (<= 0: 30 s) and
 * is the default for calls that pass timeout_ms 0. */
int rps__ctl_open(const struct rps__uri *u, int timeout_ms, struct rps__ctl **out);

/* Send a message of `type` with body[0..len) and wait for its reply (type
 * + 1: STATUS -> STATUS_REP, ADMIN -> ADMIN_REP).  The reply's body is
 * copied to reply (cap bytes; reply may be NULL when cap is 0), its length
 * to *reply_len (may be NULL), and the header's status to *status (may be
 * NULL): 0, a negative errno or RPS_E* that the server answered with.  An
 * error reply may have no body (*reply_len 0).  timeout_ms: 0 = the
 * channel's default, < 0 = forever.  Returns 0 when a reply arrived,
 * whatever its status. */
int rps__ctl_call(struct rps__ctl *ctl, unsigned type, const void *body, size_t len,
		  void *reply, size_t cap, size_t *reply_len, int32_t *status, int timeout_ms);

/* Disconnect and free (NULL is fine). */
void rps__ctl_close(struct rps__ctl *ctl);
/* Busy-poll this long for each reply before sleeping (benchmarks). */
void rps__ctl_set_spin(struct rps__ctl *ctl, int spin_us);

#endif
