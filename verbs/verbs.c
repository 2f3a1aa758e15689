/*
 * verbs.c - the libibverbs + librdmacm transport (see transport.h): the
 * overview, small helpers shared by the pieces, and the ops table.
 *
 * One device context and protection domain per fabric; RC queue pairs
 * connected with rdma_cm.  The only file of rdmaps that sees verbs types.
 *
 * Choices worth knowing before editing:
 *  - We create the QPs ourselves (ibv_create_qp, not rdma_create_qp) and drive
 *    INIT/RTR/RTS with rdma_init_qp_attr().  That lets us override what
 *    rdma_cm gets wrong for us: min_rnr_timer (the kernel CM programs 0, which
 *    means 655 ms per RNR NAK), retry counts and access flags.  The price is
 *    rdma_establish() on the active side and moving the QP to ERR ourselves on
 *    disconnect.
 *  - connect and accept each run on a temporary event channel and wait for the
 *    connection to be established before returning, so no peer ever sends to
 *    a QP that is not yet in RTR (that would cost a full transport retry).
 *    A dial (rps__dial_start) is the same connect stepped by the caller's
 *    loop on that channel's descriptor: no step waits.
 *    Established ids then migrate to the fabric's event channel, which any
 *    rps__cq_poll() drains, so DISCONNECTED moves the QP to ERR and the posted
 *    receives flush: a consumer with receives posted learns that a peer died.
 *  - Every send-queue WR is posted with wr_id = its sequence number on the
 *    endpoint and its user wr_id kept in a ring.  Completions of one SQ come in
 *    order, so a completion of sequence s retires everything up to s: the
 *    transport knows exactly how full the SQ is, signals an unsignaled WR
 *    itself every sq_depth/2 (and swallows that completion), and knows the
 *    op of an error completion whose wc.opcode is undefined.  Receives get a
 *    tag bit and a ring of their own for the same reason.
 *  - Private data: an IB CM REQ leaves us exactly 56 bytes after rdma_cm's
 *    header and the kernel always reports all 56, so the REQ carries its
 *    length in its last byte when it is shorter than 56 (see v_req_encode).
 *    REP and REJ have room for a one-byte length prefix.
 *  - rps__accept() blocks until the initiator's RTU arrives (ESTABLISHED), at
 *    most V_ACCEPT_WAIT_MS (then the fabric's channel settles it); rps__connect() until the REP, within timeout_ms
 *    (negative: no limit); rps__dial_step() never.
 *  - A misaligned atomic goes out as an 8-byte READ into a region without
 *    LOCAL_WRITE: it fails in order on every device and is reported as
 *    RPS__WC_REM_ACCESS_ERR, as the contract says, where some providers (rxe)
 *    would refuse the post instead.
 *
 * Fault injection (for tests/test_verbs.c): RPS_VERBS_FAULT=call[:nth[:errno]]
 * makes the nth call (default 1; 0 means every call) of the library function
 * `call` (e.g. ibv_create_cq, rdma_migrate_id) fail as if it had failed with
 * errno (default ENOMEM), so that the error paths and their unwinding that no
 * device produces on demand can be tested.  Each failure check starts with
 * v_fault("call"); calls are counted per process, and only the named call's
 * (v_get_event counts once per wait).  A site whose calls cannot be counted
 * (a polling loop) has a name of its own: rdma_get_cm_event@listener.
 * The variable is read once, at the first v_fault() of the process; unset, a
 * check costs one predictable branch.
 *
 * The pieces (verbs_int.h has what they share):
 *   verbs_fabric.c  fabric, memory registration, QP state transitions, CQs
 *   verbs_conn.c    endpoints, listening, accepting, connecting
 *   verbs_post.c    posting, and the local CAS through a loopback QP
 */
#include "config.h"
#include "common/common.h"
#include "transport/transport.h"
#include "verbs/verbs_int.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------ */

/* Fault injection, see the top of the file.  v_fault() returns 0, or the
 * errno to inject (errno is set to it too). */
int rps__verbs_fault_state = -1;		/* -1: not read yet, 0: off, 1: armed */
static pthread_once_t v_fault_once = PTHREAD_ONCE_INIT;
static char v_fault_call[64];
static long v_fault_nth, v_fault_err;
static long v_fault_count;

static void v_fault_read(void)
{
	const char *env = getenv("RPS_VERBS_FAULT");
	const char *c;
	size_t n;

	if (env && *env) {
		c = strchr(env, ':');
		n = c ? (size_t)(c - env) : strlen(env);
		if (n >= sizeof(v_fault_call))
			n = sizeof(v_fault_call) - 1;
		memcpy(v_fault_call, env, n);
		v_fault_call[n] = 0;
		v_fault_nth = c ? strtol(c + 1, NULL, 10) : 1;
		c = c ? strchr(c + 1, ':') : NULL;
		v_fault_err = c ? strtol(c + 1, NULL, 10) : ENOMEM;
		if (v_fault_err <= 0)
			v_fault_err = ENOMEM;
	}
	__atomic_store_n(&rps__verbs_fault_state, env && *env ? 1 : 0, __ATOMIC_RELEASE);
}

int rps__verbs_fault_slow(const char *call)
{
	pthread_once(&v_fault_once, v_fault_read);
	if (__atomic_load_n(&rps__verbs_fault_state, __ATOMIC_ACQUIRE) != 1 || strcmp(call, v_fault_call))
		return 0;
	if (v_fault_nth && __atomic_add_fetch(&v_fault_count, 1, __ATOMIC_RELAXED) != v_fault_nth)
		return 0;
	errno = (int)v_fault_err;
	return (int)v_fault_err;
}

int rps__verbs_set_nonblock(int fd)
{
	int fl = v_fault("fcntl") ? -1 : fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

void rps__verbs_addr_str(const struct sockaddr *sa, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		snprintf(buf, len, "%s:%u", ip, ntohs(in->sin_port));
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		snprintf(buf, len, "[%s]:%u", ip, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "?");
	}
}

/* host NULL, "" or "*" on the passive side means every address. */
int rps__verbs_resolve(const char *host, uint16_t port, int passive, struct sockaddr_storage *ss)
{
	struct addrinfo hints, *res;
	char svc[8];
	int rc;

	memset(ss, 0, sizeof(*ss));
	if (passive && (!host || !*host || !strcmp(host, "*"))) {
		struct sockaddr_in *in = (void *)ss;

		in->sin_family = AF_INET;
		in->sin_addr.s_addr = htonl(INADDR_ANY);
		in->sin_port = htons(port);
		return 0;
	}
	if (!host || !*host)
		return rps__seterr(-EINVAL, "verbs: no host given");
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
	snprintf(svc, sizeof(svc), "%u", port);
	rc = v_fault("getaddrinfo") ? EAI_NONAME : getaddrinfo(host, svc, &hints, &res);
	if (rc)
		return rps__seterr(-EHOSTUNREACH, "verbs: cannot resolve host '%s': %s", host, gai_strerror(rc));
	memcpy(ss, res->ai_addr, RPS__MIN((size_t)res->ai_addrlen, sizeof(*ss)));
	freeaddrinfo(res);
	return 0;
}

struct rdma_event_channel *rps__verbs_channel(void)
{
	struct rdma_event_channel *ch = v_fault("rdma_create_event_channel") ? NULL : rdma_create_event_channel();

	if (!ch)
		return NULL;
	if (rps__verbs_set_nonblock(ch->fd) < 0) {
		rdma_destroy_event_channel(ch);
		return NULL;
	}
	return ch;
}

/* Next event of a non-blocking channel, waiting until deadline. */
int rps__verbs_get_event(struct rdma_event_channel *ch, uint64_t deadline, struct rdma_cm_event **ev)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };

	if (v_fault("rdma_get_cm_event"))
		return -v_errno(EIO);
	for (;;) {
		if (rdma_get_cm_event(ch, ev) == 0)
			return 0;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -v_errno(EIO);
		int left = v_ms_left(deadline);
		if (left == 0)
			return -ETIMEDOUT;
		if (poll(&pfd, 1, left) < 0 && errno != EINTR)
			return -errno;
	}
}

/* REQ private data: always reported as 56 bytes, so a shorter payload puts
 * its length in byte 55 (the bytes between are zero).  A 56-byte payload goes
 * as is; it is read back shorter only if its last byte is a small number k
 * preceded by zeros from k on, and then the bytes the reader sees are the same. */
void rps__verbs_req_encode(uint8_t *out, const void *data, size_t len)
{
	memset(out, 0, V_REQ_PRIV);
	if (len)
		memcpy(out, data, len);
	if (len < V_REQ_PRIV)
		out[V_REQ_PRIV - 1] = (uint8_t)len;
}

size_t rps__verbs_req_decode(const uint8_t *in, size_t inlen, uint8_t *out)
{
	size_t k, i;

	if (!in)
		return 0;
	if (inlen < V_REQ_PRIV) {	/* a CM that reports the real length (iWARP) */
		memcpy(out, in, inlen);
		return inlen;
	}
	memcpy(out, in, V_REQ_PRIV);
	k = in[V_REQ_PRIV - 1];
	if (k >= V_REQ_PRIV)
		return V_REQ_PRIV;
	for (i = k; i < V_REQ_PRIV - 1; i++)
		if (in[i])
			return V_REQ_PRIV;
	memset(out + k, 0, V_REQ_PRIV - k);
	return k;
}

/* REP/REJ private data: one length byte, then the payload. */
size_t rps__verbs_lp_decode(const void *data, size_t inlen, void *out)
{
	const uint8_t *in = data;
	size_t len;

	if (!in || inlen < 1)
		return 0;
	len = in[0];
	if (len > RPS__PRIVDATA_MAX || len + 1 > inlen)
		return 0;
	if (out && len)
		memcpy(out, in + 1, len);
	return len;
}

const struct rps__transport_ops rps__verbs_ops = {
	.name = "verbs",
	.fabric_open = rps__verbs_fabric_open,
	.fabric_close = rps__verbs_fabric_close,
	.fabric_name = rps__verbs_fabric_name,
	.mr_reg = rps__verbs_mr_reg,
	.mr_dereg = rps__verbs_mr_dereg,
	.mw_bind = rps__verbs_mw_bind,
	.fabric_windows = rps__verbs_fabric_windows,
	.ep_sq_room = rps__verbs_ep_sq_room,
	.local_cas = rps__verbs_local_cas,
	.cq_create = rps__verbs_cq_create,
	.cq_destroy = rps__verbs_cq_destroy,
	.cq_grow = rps__verbs_cq_grow,
	.cq_poll = rps__verbs_cq_poll,
	.cq_fd = rps__verbs_cq_fd,
	.cq_arm = rps__verbs_cq_arm,
	.listen = rps__verbs_listen,
	.listener_fd = rps__verbs_listener_fd,
	.listener_get_request = rps__verbs_listener_get_request,
	.accept = rps__verbs_accept,
	.reject = rps__verbs_reject,
	.listener_close = rps__verbs_listener_close,
	.connect = rps__verbs_connect,
	.dial_start = rps__verbs_dial_start,
	.dial_fd = rps__verbs_dial_fd,
	.dial_step = rps__verbs_dial_step,
	.dial_cancel = rps__verbs_dial_cancel,
	.ep_close = rps__verbs_ep_close,
	.post = rps__verbs_post,
	.post_recv = rps__verbs_post_recv,
};
