/*
 * tcp_codec.c - the TCP provider's wire format (tcp.c has the overview):
 * host-order images of the handshake hello and the frame header to and
 * from their little-endian wire bytes, and the hello check.
 *
 * Wire format.  Every integer is little-endian, whatever the host.
 *
 *   Handshake: the connector sends a 72-byte hello, the listener answers with
 *   one of the same size:
 *     u32 magic "RPSt" | u16 version | u8 type (CONNECT, ACCEPT, REJECT,
 *     BAD_PROTOCOL) | u8 data_len | u32 sq_depth | u32 rq_depth |
 *     u8 private_data[56]
 *   sq_depth is how many requests the sender may have outstanding: the peer
 *   sizes its pool of responses by it.  A listener that cannot parse a hello
 *   answers BAD_PROTOCOL (with its own version) and hangs up.
 *
 *   Then each direction carries frames: a 48-byte header, followed by len
 *   payload bytes for SEND, WRITE, WRITE_IMM and READ_RESP only:
 *     u8 type | u8 status | u16 flags (0) | u32 len | u32 seq | u32 rkey |
 *     u64 raddr | u64 arg0 | u64 arg1 | u32 imm | u32 reserved (0)
 *
 *   Requests (initiator -> target).  seq numbers the initiator's ops, 1, 2,
 *   3...; the target executes them in that order.
 *     SEND        len, payload
 *     WRITE       rkey, raddr, len, payload          (WRITE_IMM: + imm)
 *     READ        rkey, raddr, len = bytes asked
 *     CAS         rkey, raddr, arg0 = compare, arg1 = swap  (8 bytes)
 *     FADD        rkey, raddr, arg0 = addend                (8 bytes)
 *   Responses (target -> initiator), in the order the target executed the
 *   requests they answer:
 *     ACK         seq = W: every request up to W is executed (cumulative,
 *                 one per batch read; a SEND or WRITE_IMM counts once it has
 *                 a posted receive - at most rq_depth wait for one)
 *     READ_RESP   seq, len, payload
 *     ATOMIC_RESP seq, arg0 = the old value
 *     NAK         seq = the refused request, status = enum rps__wc_status,
 *                 arg0 = W as in ACK.  The target's last frame: both
 *                 endpoints are in the error state afterwards.
 *   FENCE never reaches the wire: the initiator holds a fenced request
 *   until its earlier READs and atomics are answered.
 */
#include "config.h"
#include "common/common.h"
#include "transport/tcp/tcp_int.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* the codec                                                                */

void rps__tcp_hello_put(uint8_t *out, const struct wire_hello *h)
{
	struct wire_hello w = *h;

	w.magic = htole32(h->magic);
	w.version = htole16(h->version);
	w.sq_depth = htole32(h->sq_depth);
	w.rq_depth = htole32(h->rq_depth);
	memcpy(out, &w, sizeof(w));
}

void rps__tcp_hello_get(struct wire_hello *h, const uint8_t *in)
{
	memcpy(h, in, sizeof(*h));
	h->magic = le32toh(h->magic);
	h->version = le16toh(h->version);
	h->sq_depth = le32toh(h->sq_depth);
	h->rq_depth = le32toh(h->rq_depth);
}

/* Check a received hello: ours, same version, sane sizes.  0 or -EPROTO. */
int rps__tcp_hello_check(const struct wire_hello *h, const char *peer)
{
	if (h->magic != TCP_MAGIC) {
		if (__builtin_bswap32(h->magic) == TCP_MAGIC)
			return rps__seterr(-EPROTO, "tcp handshake with %s: peer encodes its integers big-endian, "
					   "not the little-endian this protocol requires: upgrade its rdmaps", peer);
		return rps__seterr(-EPROTO, "tcp handshake with %s: not an rdmaps tcp transport (magic 0x%08x): "
				   "check the host and port", peer, h->magic);
	}
	if (h->version != TCP_VERSION)
		return rps__seterr(-EPROTO, "tcp handshake with %s: peer speaks protocol version %u, we speak %u: "
				   "run the same rdmaps release on both sides", peer, h->version, TCP_VERSION);
	if (h->data_len > RPS__PRIVDATA_MAX || h->sq_depth == 0 || h->sq_depth > TCP_MAX_DEPTH)
		return rps__seterr(-EPROTO, "tcp handshake with %s: malformed hello (data_len %u, sq_depth %u): "
				   "the peer is broken or not rdmaps", peer, h->data_len, h->sq_depth);
	return 0;
}
