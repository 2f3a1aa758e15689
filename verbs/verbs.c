/*
 * verbs.c - the libibverbs + librdmacm transport (see transport.h).
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
 *    most V_ACCEPT_WAIT_MS; rps__connect() until the REP, within timeout_ms
 *    (negative: no limit).
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
 */
#include "config.h"
#include "transport/transport.h"
#include "common/common.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define V_DEF_DEPTH		128
#define V_DEF_INLINE		64
#define V_DEF_CQ_DEPTH		1024
#define V_MAX_RD_ATOMIC		16	/* per-QP outstanding READs/atomics we ask for */
#define V_MIN_RNR_TIMER		12	/* 0.64 ms between RNR retries */
#define V_RETRY			7
#define V_RNR_RETRY		7	/* 7 = retry for ever: a slow receiver is not an error */
#define V_ACCEPT_WAIT_MS	20000	/* REP -> RTU; only a dead initiator makes it long */
#define V_LCAS_WAIT_MS		10000
#define V_HOUSEKEEP_NS		1000000ull	/* check CM events at least every 1 ms of polling */
#define V_ACK_BATCH		64
#define V_CQ_BUCKETS		256
#define V_POLL_BATCH		32
#define V_RECV_TAG		(1ull << 63)
#define V_REQ_PRIV		56	/* IB CM REQ private data left by rdma_cm's header */
#define V_REJ_CONSUMER		28	/* IB_CM_REJ_CONSUMER_DEFINED */
#define V_REJ_INVALID_SID	8	/* IB_CM_REJ_INVALID_SERVICE_ID: nobody listens there */
#define V_OP_NOP		0	/* transport-internal zero-length signaled WRITE */

struct v_fab {
	struct rps__fabric base;
	struct ibv_context **devs;	/* rdma_get_devices() list: keeps librdmacm's ref */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr dattr;
	struct ibv_port_attr pattr;
	uint8_t port;
	uint8_t max_rd;			/* responder resources we offer */
	uint8_t max_init;		/* initiator depth we ask for */
	char name[IBV_SYSFS_NAME_MAX];
	struct rdma_event_channel *cm_ch;	/* established endpoints */
	/* 8 bytes registered without LOCAL_WRITE: a READ into it fails locally,
	 * in order, on any device (see the misaligned atomic in v_post) */
	uint64_t *trap_buf;
	struct ibv_mr *trap_mr;
	pthread_mutex_t cm_lock;
	/* local_cas: a loopback RC QP connected to itself, created lazily */
	pthread_mutex_t lcas_lock;
	struct ibv_cq *lcas_cq;
	struct ibv_qp *lcas_qp;
	struct ibv_mr *lcas_mr;
	uint64_t *lcas_buf;
};

struct v_mr {
	struct rps__mr base;
	struct ibv_mr *mr;
};

struct v_ep;

struct v_cq {
	struct rps__cq base;
	struct v_fab *fab;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	int epfd;
	int armed;			/* a comp event may be waiting on ch */
	unsigned unacked;
	uint64_t next_house;
	pthread_mutex_t lock;		/* table */
	int nep;
	struct v_ep *table[V_CQ_BUCKETS];	/* qp_num -> ep */
};

struct v_sslot {
	uint64_t wr_id;
	uint8_t op;			/* enum rps__op, or V_OP_NOP */
	uint8_t user_sig;		/* the caller asked for a completion */
	uint8_t force;			/* status to report instead (misaligned atomic) */
};

struct v_ep {
	struct rps__ep base;
	struct v_fab *fab;
	struct v_cq *cq;
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	uint32_t qpn;
	struct v_ep *hnext;
	uint32_t sq_depth, rq_depth, max_inline, sig_every;
	int in_table;
	int disconnected;		/* under fab->cm_lock */
	/* send queue, under sq_lock except sq_done (written by cq_poll) */
	pthread_mutex_t sq_lock;
	uint64_t sq_head;
	uint64_t sig_end;		/* seq + 1 of the last signaled WR posted */
	uint32_t unsig;
	_Atomic uint64_t sq_done;
	struct v_sslot *sring;
	struct ibv_send_wr *swr;
	struct ibv_sge *ssge;
	/* receive queue */
	pthread_mutex_t rq_lock;
	uint64_t rq_head;
	_Atomic uint64_t rq_done;
	uint64_t *rring;
};

struct v_lis {
	struct rps__listener base;
	struct v_fab *fab;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
};

struct v_req {
	struct rps__conn_req base;
	struct v_fab *fab;
	struct rdma_cm_id *id;
	uint8_t peer_init_depth;
	uint8_t peer_resp_res;
	char peer[64];
};

#define VFAB(p) rps__container_of((p), struct v_fab, base)
#define VCQ(p) rps__container_of((p), struct v_cq, base)
#define VEP(p) rps__container_of((p), struct v_ep, base)
#define VLIS(p) rps__container_of((p), struct v_lis, base)
#define VREQ(p) rps__container_of((p), struct v_req, base)

/* ---- small helpers ------------------------------------------------------ */

static int v_errno(int fallback)
{
	return errno ? errno : fallback;
}

/* Fault injection, see the top of the file.  v_fault() returns 0, or the
 * errno to inject (errno is set to it too). */
static int v_fault_state = -1;		/* -1: not read yet, 0: off, 1: armed */
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
	__atomic_store_n(&v_fault_state, env && *env ? 1 : 0, __ATOMIC_RELEASE);
}

static int v_fault_slow(const char *call)
{
	pthread_once(&v_fault_once, v_fault_read);
	if (__atomic_load_n(&v_fault_state, __ATOMIC_ACQUIRE) != 1 || strcmp(call, v_fault_call))
		return 0;
	if (v_fault_nth && __atomic_add_fetch(&v_fault_count, 1, __ATOMIC_RELAXED) != v_fault_nth)
		return 0;
	errno = (int)v_fault_err;
	return (int)v_fault_err;
}

static inline int v_fault(const char *call)
{
	if (__builtin_expect(__atomic_load_n(&v_fault_state, __ATOMIC_RELAXED) == 0, 1))
		return 0;
	return v_fault_slow(call);
}

static int v_set_nonblock(int fd)
{
	int fl = v_fault("fcntl") ? -1 : fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static uint64_t v_deadline(int timeout_ms)
{
	return timeout_ms < 0 ? UINT64_MAX : rps__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

static int v_ms_left(uint64_t deadline)
{
	uint64_t now = rps__now_ns();

	if (deadline == UINT64_MAX)
		return -1;
	if (now >= deadline)
		return 0;
	return (int)RPS__MIN((deadline - now + 999999) / 1000000, (uint64_t)INT32_MAX);
}

static void v_addr_str(const struct sockaddr *sa, char *buf, size_t len)
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
static int v_resolve(const char *host, uint16_t port, int passive, struct sockaddr_storage *ss)
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

static struct rdma_event_channel *v_channel(void)
{
	struct rdma_event_channel *ch = v_fault("rdma_create_event_channel") ? NULL : rdma_create_event_channel();

	if (!ch)
		return NULL;
	if (v_set_nonblock(ch->fd) < 0) {
		rdma_destroy_event_channel(ch);
		return NULL;
	}
	return ch;
}

/* Next event of a non-blocking channel, waiting until deadline. */
static int v_get_event(struct rdma_event_channel *ch, uint64_t deadline, struct rdma_cm_event **ev)
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
static void v_req_encode(uint8_t *out, const void *data, size_t len)
{
	memset(out, 0, V_REQ_PRIV);
	if (len)
		memcpy(out, data, len);
	if (len < V_REQ_PRIV)
		out[V_REQ_PRIV - 1] = (uint8_t)len;
}

static size_t v_req_decode(const uint8_t *in, size_t inlen, uint8_t *out)
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
static size_t v_lp_decode(const void *data, size_t inlen, void *out)
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

/* ---- fabric -------------------------------------------------------------- */

int rps__verbs_available(void)
{
	struct ibv_device **list;
	int n = 0;

	list = ibv_get_device_list(&n);
	if (list)
		ibv_free_device_list(list);
	return n > 0;
}

/* The verbs context that rdma_cm associates with host: bound if it is a local
 * address, resolved if remote.  NULL (no error) for wildcard/loopback. */
static int v_ctx_for_host(const char *host, struct ibv_context **ctx, uint8_t *port)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	int ret;

	*ctx = NULL;
	ret = v_resolve(host, 0, 0, &ss);
	if (ret)
		return ret;
	/* NULL channel: synchronous id, rdma_resolve_addr waits for its event */
	if (v_fault("rdma_create_id") || rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
		return rps__seterr(-v_errno(ENODEV), "verbs: rdma_create_id: %s: is rdma_ucm loaded?", strerror(v_errno(ENODEV)));
	if (rdma_bind_addr(id, (struct sockaddr *)&ss) &&
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, 2000)) {
		ret = rps__seterr(-v_errno(EADDRNOTAVAIL), "verbs: address %s is neither local to nor reachable through an RDMA device: %s",
				  host, strerror(v_errno(EADDRNOTAVAIL)));
		goto out;
	}
	*ctx = id->verbs;
	*port = id->port_num;
out:
	rdma_destroy_id(id);
	return ret;
}

static int v_fabric_open(const struct rps__fabric_attr *attr, struct rps__fabric **out)
{
	struct ibv_context *want = NULL;
	struct v_fab *f;
	uint8_t port = 1;
	int n = 0, i, ret, e;

	f = calloc(1, sizeof(*f));
	if (!f)
		return rps__seterr(-ENOMEM, "verbs: out of memory opening the fabric");
	f->base.ops = &rps__verbs_ops;
	f->base.kind = RPS__KIND_VERBS;

	f->devs = v_fault("rdma_get_devices") ? NULL : rdma_get_devices(&n);
	if (!f->devs || n == 0) {
		ret = rps__seterr(-ENODEV, "verbs: no RDMA device found: load a driver (Soft-RoCE: `rdma link add rxe0 type rxe netdev eth0`) or use the tcp transport");
		goto err_free;
	}
	if (attr->device && *attr->device) {
		for (i = 0; i < n; i++)
			if (!strcmp(ibv_get_device_name(f->devs[i]->device), attr->device))
				want = f->devs[i];
		if (!want) {
			ret = rps__seterr(-ENODEV, "verbs: RDMA device '%s' not found (first device is %s): see `ibv_devices`",
					  attr->device, ibv_get_device_name(f->devs[0]->device));
			goto err_devs;
		}
	} else if (attr->host && *attr->host) {
		ret = v_ctx_for_host(attr->host, &want, &port);
		if (ret)
			goto err_devs;
	}
	if (!want) {
		want = f->devs[0];
		port = 1;
	}
	f->ctx = want;
	f->port = port ? port : 1;
	snprintf(f->name, sizeof(f->name), "%s", ibv_get_device_name(want->device));

	ret = v_fault("ibv_query_device");
	if (!ret)
		ret = ibv_query_device(f->ctx, &f->dattr);
	if (ret) {
		ret = rps__seterr(-ret, "verbs: ibv_query_device(%s): %s", f->name, strerror(ret));
		goto err_devs;
	}
	ret = v_fault("ibv_query_port");
	if (!ret)
		ret = ibv_query_port(f->ctx, f->port, &f->pattr);
	if (ret) {
		ret = rps__seterr(-ret, "verbs: ibv_query_port(%s, %u): %s", f->name, f->port, strerror(ret));
		goto err_devs;
	}
	f->max_rd = (uint8_t)RPS__MIN(f->dattr.max_qp_rd_atom, V_MAX_RD_ATOMIC);
	f->max_init = (uint8_t)RPS__MIN(f->dattr.max_qp_init_rd_atom, V_MAX_RD_ATOMIC);

	f->pd = v_fault("ibv_alloc_pd") ? NULL : ibv_alloc_pd(f->ctx);
	if (!f->pd) {
		ret = rps__seterr(-v_errno(ENOMEM), "verbs: ibv_alloc_pd(%s): %s", f->name, strerror(v_errno(ENOMEM)));
		goto err_devs;
	}
	f->trap_buf = v_fault("aligned_alloc") ? NULL : aligned_alloc(64, 64);
	if (!f->trap_buf) {
		ret = rps__seterr(-ENOMEM, "verbs: out of memory opening the fabric");
		goto err_pd;
	}
	f->trap_mr = v_fault("ibv_reg_mr") ? NULL : ibv_reg_mr(f->pd, f->trap_buf, 64, 0);
	if (!f->trap_mr) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "verbs: ibv_reg_mr(64 bytes): %s", strerror(e));
		goto err_trap_buf;
	}
	f->cm_ch = v_channel();
	if (!f->cm_ch) {
		e = v_errno(ENODEV);
		ret = rps__seterr(-e, "verbs: rdma_create_event_channel: %s: is rdma_ucm loaded and /dev/infiniband/rdma_cm accessible?",
				  strerror(e));
		goto err_trap_mr;
	}
	pthread_mutex_init(&f->cm_lock, NULL);
	pthread_mutex_init(&f->lcas_lock, NULL);
	*out = &f->base;
	return 0;

err_trap_mr:
	ibv_dereg_mr(f->trap_mr);
err_trap_buf:
	free(f->trap_buf);
err_pd:
	ibv_dealloc_pd(f->pd);
err_devs:
	if (f->devs)
		rdma_free_devices(f->devs);
err_free:
	free(f);
	return ret;
}

static void v_lcas_teardown(struct v_fab *f)
{
	if (f->lcas_qp)
		ibv_destroy_qp(f->lcas_qp);
	if (f->lcas_mr)
		ibv_dereg_mr(f->lcas_mr);
	if (f->lcas_cq)
		ibv_destroy_cq(f->lcas_cq);
	free(f->lcas_buf);
	f->lcas_qp = NULL;
	f->lcas_mr = NULL;
	f->lcas_cq = NULL;
	f->lcas_buf = NULL;
}

static void v_fabric_close(struct rps__fabric *fab)
{
	struct v_fab *f = VFAB(fab);

	v_lcas_teardown(f);
	pthread_mutex_destroy(&f->lcas_lock);
	pthread_mutex_destroy(&f->cm_lock);
	rdma_destroy_event_channel(f->cm_ch);
	ibv_dereg_mr(f->trap_mr);
	free(f->trap_buf);
	ibv_dealloc_pd(f->pd);
	rdma_free_devices(f->devs);
	free(f);
}

static const char *v_fabric_name(const struct rps__fabric *fab)
{
	return VFAB((struct rps__fabric *)fab)->name;
}

/* ---- memory registration -------------------------------------------------- */

static int v_access(int access)
{
	int a = IBV_ACCESS_LOCAL_WRITE;	/* remote write/atomic need it, and READ targets */

	if (access & RPS__ACCESS_REMOTE_WRITE)
		a |= IBV_ACCESS_REMOTE_WRITE;
	if (access & RPS__ACCESS_REMOTE_READ)
		a |= IBV_ACCESS_REMOTE_READ;
	if (access & RPS__ACCESS_REMOTE_ATOMIC)
		a |= IBV_ACCESS_REMOTE_ATOMIC;
	return a;
}

static int v_mr_reg(struct rps__fabric *fab, void *addr, size_t len, int access, struct rps__mr **out)
{
	struct v_fab *f = VFAB(fab);
	struct v_mr *m;
	struct rlimit rl;
	int e;

	if (!addr || !len)
		return rps__seterr(-EINVAL, "ibv_reg_mr: empty region (addr %p, %zu bytes)", addr, len);
	m = calloc(1, sizeof(*m));
	if (!m)
		return rps__seterr(-ENOMEM, "ibv_reg_mr: out of memory");
	errno = 0;
	m->mr = v_fault("ibv_reg_mr") ? NULL : ibv_reg_mr(f->pd, addr, len, v_access(access));
	if (!m->mr) {
		e = v_errno(ENOMEM);
		free(m);
		/* Pinning is charged to RLIMIT_MEMLOCK: the usual cause, say so. */
		if ((e == ENOMEM || e == EPERM || e == EFAULT) && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
		    rl.rlim_cur != RLIM_INFINITY)
			return rps__seterr(-e, "ibv_reg_mr(%zu bytes): %s: %sraise `ulimit -l` (memlock limit is %llu KiB)",
					   len, strerror(e),
					   e == EFAULT ? "check the range is mapped memory, or " : "",
					   (unsigned long long)(rl.rlim_cur / 1024));
		return rps__seterr(-e, "ibv_reg_mr(%zu bytes at %p): %s", len, addr, strerror(e));
	}
	m->base.fab = fab;
	m->base.addr = addr;
	m->base.len = len;
	m->base.lkey = m->mr->lkey;
	m->base.rkey = m->mr->rkey;
	m->base.access = access;
	*out = &m->base;
	return 0;
}

static int v_mr_dereg(struct rps__mr *mr)
{
	struct v_mr *m = rps__container_of(mr, struct v_mr, base);
	int ret;

	/* the HCA stops honouring the rkey when this returns */
	ret = v_fault("ibv_dereg_mr");
	if (!ret)
		ret = ibv_dereg_mr(m->mr);
	if (ret)
		return rps__seterr(-ret, "ibv_dereg_mr(%zu bytes): %s", mr->len, strerror(ret));
	free(m);
	return 0;
}

/* ---- QP state transitions ----------------------------------------------- */

static int v_gid_index(struct v_fab *f, union ibv_gid *gid)
{
	static const union ibv_gid zero;
	int i;

	for (i = 0; i < RPS__MAX(f->pattr.gid_tbl_len, 1); i++)
		if (!v_fault("ibv_query_gid") && ibv_query_gid(f->ctx, f->port, i, gid) == 0 && memcmp(gid, &zero, sizeof(zero)))
			return i;
	return -1;
}

/* INIT with every remote right on the QP: the MR's rights are what limit. */
static int v_qp_init(struct rdma_cm_id *id, struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	int mask, ret;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	if (rdma_init_qp_attr(id, &a, &mask))
		return -v_errno(EINVAL);
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	mask |= IBV_QP_ACCESS_FLAGS;
	ret = v_fault("ibv_modify_qp");
	if (!ret)
		ret = ibv_modify_qp(qp, &a, mask);
	return -ret;
}

static int v_qp_rtr_rts(struct v_fab *f, struct rdma_cm_id *id, struct ibv_qp *qp, uint8_t resp_res,
			uint8_t init_depth)
{
	struct ibv_port_attr pa;
	struct ibv_qp_attr a;
	int mask, ret;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	if (rdma_init_qp_attr(id, &a, &mask))
		return -v_errno(EINVAL);
	/* rdma_ucm sets RoCE-only mask bits that IB ports refuse (as librdmacm does) */
	if (ibv_query_port(f->ctx, id->port_num, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_INFINIBAND)
		mask &= ~0xe00000;
	a.max_dest_rd_atomic = resp_res;
	a.min_rnr_timer = V_MIN_RNR_TIMER;
	mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	ret = v_fault("ibv_modify_qp");
	if (!ret)
		ret = ibv_modify_qp(qp, &a, mask);
	if (ret)
		return -ret;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	if (rdma_init_qp_attr(id, &a, &mask))
		return -v_errno(EINVAL);
	a.max_rd_atomic = init_depth;
	a.retry_cnt = V_RETRY;
	a.rnr_retry = V_RNR_RETRY;
	mask |= IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
	ret = v_fault("ibv_modify_qp");
	return -(ret ? ret : ibv_modify_qp(qp, &a, mask));
}

static void v_qp_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* ---- completion queues --------------------------------------------------- */

static int v_cq_create(struct rps__fabric *fab, uint32_t depth, struct rps__cq **out)
{
	struct v_fab *f = VFAB(fab);
	struct epoll_event ev;
	struct v_cq *c;
	int ret, e;

	if (!depth)
		depth = V_DEF_CQ_DEPTH;
	if (depth > (uint32_t)f->dattr.max_cqe)
		return rps__seterr(-EINVAL, "verbs: CQ depth %u exceeds %s's max_cqe %d", depth, f->name, f->dattr.max_cqe);
	c = calloc(1, sizeof(*c));
	if (!c)
		return rps__seterr(-ENOMEM, "verbs: out of memory creating a CQ");
	c->base.fab = fab;
	c->fab = f;
	c->ch = v_fault("ibv_create_comp_channel") ? NULL : ibv_create_comp_channel(f->ctx);
	if (!c->ch) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "ibv_create_comp_channel(%s): %s", f->name, strerror(e));
		goto err_free;
	}
	ret = v_set_nonblock(c->ch->fd);
	if (ret) {
		rps__seterr(ret, "verbs: O_NONBLOCK on the completion channel: %s", strerror(-ret));
		goto err_ch;
	}
	c->cq = v_fault("ibv_create_cq") ? NULL : ibv_create_cq(f->ctx, (int)depth, c, c->ch, 0);
	if (!c->cq) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "ibv_create_cq(%s, %u entries): %s", f->name, depth, strerror(e));
		goto err_ch;
	}
	/* one fd to sleep on: completions of this CQ and the fabric's CM events */
	c->epfd = v_fault("epoll_create1") ? -1 : epoll_create1(EPOLL_CLOEXEC);
	if (c->epfd < 0) {
		ret = rps__seterr(-errno, "verbs: epoll_create1: %s", strerror(errno));
		goto err_cq;
	}
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.fd = c->ch->fd;
	if (v_fault("epoll_ctl") || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->ch->fd, &ev) < 0) {
		ret = rps__seterr(-errno, "verbs: epoll_ctl(completion channel): %s", strerror(errno));
		goto err_ep;
	}
	ev.data.fd = f->cm_ch->fd;
	if (v_fault("epoll_ctl") || epoll_ctl(c->epfd, EPOLL_CTL_ADD, f->cm_ch->fd, &ev) < 0) {
		ret = rps__seterr(-errno, "verbs: epoll_ctl(CM channel): %s", strerror(errno));
		goto err_ep;
	}
	pthread_mutex_init(&c->lock, NULL);
	*out = &c->base;
	return 0;

err_ep:
	close(c->epfd);
err_cq:
	ibv_destroy_cq(c->cq);
err_ch:
	ibv_destroy_comp_channel(c->ch);
err_free:
	free(c);
	return ret;
}

static void v_cq_destroy(struct rps__cq *cq)
{
	struct v_cq *c = VCQ(cq);

	if (c->unacked)
		ibv_ack_cq_events(c->cq, c->unacked);
	ibv_destroy_cq(c->cq);	/* EBUSY if endpoints still use it: caller's bug */
	ibv_destroy_comp_channel(c->ch);
	close(c->epfd);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static int v_cq_fd(struct rps__cq *cq)
{
	return VCQ(cq)->epfd;
}

static int v_cq_arm(struct rps__cq *cq)
{
	struct v_cq *c = VCQ(cq);
	int ret;

	ret = v_fault("ibv_req_notify_cq");
	if (!ret)
		ret = ibv_req_notify_cq(c->cq, 0);
	if (ret)
		return rps__seterr(-ret, "ibv_req_notify_cq: %s", strerror(ret));
	/* a completion may have arrived before the notification was armed */
	c->armed = 1;
	return 1;
}

static void v_table_add(struct v_cq *c, struct v_ep *ep)
{
	struct v_ep **b = &c->table[ep->qpn % V_CQ_BUCKETS];

	pthread_mutex_lock(&c->lock);
	ep->hnext = *b;
	*b = ep;
	ep->in_table = 1;
	c->nep++;
	pthread_mutex_unlock(&c->lock);
}

static void v_table_del(struct v_cq *c, struct v_ep *ep)
{
	struct v_ep **p;

	pthread_mutex_lock(&c->lock);
	for (p = &c->table[ep->qpn % V_CQ_BUCKETS]; *p; p = &(*p)->hnext)
		if (*p == ep) {
			*p = ep->hnext;
			c->nep--;
			break;
		}
	ep->in_table = 0;
	pthread_mutex_unlock(&c->lock);
}

static struct v_ep *v_table_find(struct v_cq *c, uint32_t qpn)
{
	struct v_ep *ep;

	for (ep = c->table[qpn % V_CQ_BUCKETS]; ep; ep = ep->hnext)
		if (ep->qpn == qpn)
			return ep;
	return NULL;
}

static void v_qp_error(struct ibv_qp *qp);

/* A WC error means the QP is in ERR already; the first time, move it to ERR
 * once more anyway: rxe flushes the receive queue only when its responder
 * runs, and a receive posted around the error would otherwise never
 * complete.  v_post_recv does the same for receives posted later. */
static void v_ep_set_error(struct v_ep *ep)
{
	if (!__atomic_exchange_n(&ep->base.error, 1, __ATOMIC_SEQ_CST))
		v_qp_error(ep->qp);
}

/* Under f->cm_lock: QP to ERR (flushes posted receives and outstanding ops)
 * and tell the peer, once. */
static void v_ep_shutdown(struct v_ep *ep)
{
	if (ep->disconnected)
		return;
	ep->disconnected = 1;
	v_qp_error(ep->qp);
	rdma_disconnect(ep->id);
}

static void v_cm_handle(struct rdma_cm_event *ev)
{
	struct v_ep *ep = ev->id->context;

	if (!ep)
		return;		/* endpoint being closed */
	switch (ev->event) {
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
		/* flag first, then ERR: a receive posted meanwhile is either
		 * flushed by this ERR or kicked by v_post_recv */
		__atomic_store_n(&ep->base.error, 1, __ATOMIC_SEQ_CST);
		v_ep_shutdown(ep);
		break;
	default:		/* ESTABLISHED (already waited for), TIMEWAIT_EXIT, ADDR_CHANGE */
		break;
	}
}

/* Drain the fabric's CM channel.  Non-blocking; if another thread is at it,
 * leave it to that thread. */
static void v_cm_progress(struct v_fab *f, int wait_lock)
{
	struct rdma_cm_event *ev;

	if (wait_lock)
		pthread_mutex_lock(&f->cm_lock);
	else if (pthread_mutex_trylock(&f->cm_lock))
		return;
	while (rdma_get_cm_event(f->cm_ch, &ev) == 0) {
		v_cm_handle(ev);
		rdma_ack_cm_event(ev);
	}
	pthread_mutex_unlock(&f->cm_lock);
}

static void v_housekeep(struct v_cq *c)
{
	struct ibv_cq *ecq;
	void *ectx;

	if (c->armed) {
		while (ibv_get_cq_event(c->ch, &ecq, &ectx) == 0) {
			c->armed = 0;
			if (++c->unacked >= V_ACK_BATCH) {
				ibv_ack_cq_events(c->cq, c->unacked);
				c->unacked = 0;
			}
		}
	}
	v_cm_progress(c->fab, 0);
}

static enum rps__wc_status v_status(enum ibv_wc_status s, int op)
{
	switch (s) {
	case IBV_WC_SUCCESS:
		return RPS__WC_SUCCESS;
	case IBV_WC_WR_FLUSH_ERR:
		return RPS__WC_FLUSH_ERR;
	case IBV_WC_REM_ACCESS_ERR:
		return RPS__WC_REM_ACCESS_ERR;
	case IBV_WC_REM_INV_REQ_ERR:
		/* a misaligned atomic is reported as an invalid request */
		return (op == RPS__OP_CAS || op == RPS__OP_FADD) ? RPS__WC_REM_ACCESS_ERR : RPS__WC_REM_OP_ERR;
	case IBV_WC_REM_OP_ERR:
		return RPS__WC_REM_OP_ERR;
	case IBV_WC_RETRY_EXC_ERR:
		return RPS__WC_RETRY_EXC_ERR;
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return RPS__WC_RNR_RETRY_EXC_ERR;
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_LOC_QP_OP_ERR:
	case IBV_WC_LOC_EEC_OP_ERR:
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_LOC_RDD_VIOL_ERR:
	case IBV_WC_MW_BIND_ERR:
		return RPS__WC_LOC_ERR;
	default:
		return RPS__WC_GENERAL_ERR;
	}
}

static enum rps__wc_opcode v_opcode(int op)
{
	switch (op) {
	case RPS__OP_SEND: return RPS__WC_SEND;
	case RPS__OP_WRITE:
	case RPS__OP_WRITE_IMM: return RPS__WC_WRITE;
	case RPS__OP_READ: return RPS__WC_READ;
	case RPS__OP_CAS: return RPS__WC_CAS;
	case RPS__OP_FADD: return RPS__WC_FADD;
	}
	return RPS__WC_WRITE;
}

/* Under c->lock.  Returns 1 if *out is a completion for the consumer. */
static int v_translate(struct v_cq *c, const struct ibv_wc *iw, struct rps__wc *out)
{
	struct v_ep *ep = v_table_find(c, iw->qp_num);
	uint64_t seq;

	if (!ep)
		return 0;	/* closed endpoint */
	memset(out, 0, sizeof(*out));
	out->ep = &ep->base;
	if (iw->wr_id & V_RECV_TAG) {
		seq = iw->wr_id & ~V_RECV_TAG;
		out->wr_id = ep->rring[seq % ep->rq_depth];
		atomic_fetch_add_explicit(&ep->rq_done, 1, memory_order_release);
		out->opcode = RPS__WC_RECV;
		if (iw->status != IBV_WC_SUCCESS) {
			v_ep_set_error(ep);
			out->status = v_status(iw->status, 0);
			return 1;
		}
		if (iw->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			out->opcode = RPS__WC_RECV_IMM;
			out->imm = ntohl(iw->imm_data);
			out->byte_len = iw->byte_len;	/* the WRITE's length, as tcp reports it */
		} else {
			out->byte_len = iw->byte_len;
			if (iw->wc_flags & IBV_WC_WITH_IMM)
				out->imm = ntohl(iw->imm_data);
		}
		return 1;
	}
	seq = iw->wr_id;
	{
		const struct v_sslot *s = &ep->sring[seq % ep->sq_depth];
		int op = s->op, user_sig = s->user_sig, force = s->force;

		out->wr_id = s->wr_id;
		/* RC: this completion retires every earlier WR of the SQ too */
		atomic_store_explicit(&ep->sq_done, seq + 1, memory_order_release);
		if (force && iw->status == IBV_WC_WR_FLUSH_ERR) {
			force = 0;	/* never executed: an earlier error flushed it */
			v_ep_set_error(ep);
		} else if (force) {
			/* a substitute that was meant to fail; make sure the
			 * endpoint is in error even if it did not */
			if (iw->status == IBV_WC_SUCCESS)
				v_qp_error(ep->qp);
			v_ep_set_error(ep);
		} else if (iw->status == IBV_WC_SUCCESS) {
			if (!user_sig)
				return 0;	/* our selective-signalling completion */
		} else {
			v_ep_set_error(ep);
			if (op == V_OP_NOP)
				return 0;
		}
		out->status = force ? (enum rps__wc_status)force : v_status(iw->status, op);
		out->opcode = v_opcode(op);
		out->byte_len = iw->byte_len;
	}
	return 1;
}

static int v_cq_poll(struct rps__cq *cq, struct rps__wc *wc, int n)
{
	struct v_cq *c = VCQ(cq);
	struct ibv_wc iw[V_POLL_BATCH];
	int got = 0, k, i, want;

	if (n <= 0)
		return 0;
	/* CM events and comp-channel events cost syscalls: look when the
	 * consumer armed (it may be about to sleep) or every millisecond. */
	if (c->armed || rps__now_ns() >= c->next_house) {
		v_housekeep(c);
		c->next_house = rps__now_ns() + V_HOUSEKEEP_NS;
	}
	while (got < n) {
		want = RPS__MIN(n - got, V_POLL_BATCH);
		k = v_fault("ibv_poll_cq") ? -1 : ibv_poll_cq(c->cq, want, iw);
		if (k < 0) {
			if (got)
				break;
			return rps__seterr(-EIO, "ibv_poll_cq failed on %s (CQ overrun? size the CQ for every endpoint's sq_depth + rq_depth)",
					   c->fab->name);
		}
		if (k == 0)
			break;
		pthread_mutex_lock(&c->lock);
		for (i = 0; i < k; i++)
			got += v_translate(c, &iw[i], &wc[got]);
		pthread_mutex_unlock(&c->lock);
		if (k < want)
			break;
	}
	return got;
}

/* ---- endpoints ----------------------------------------------------------- */

static void v_ep_free(struct v_ep *ep)
{
	pthread_mutex_destroy(&ep->sq_lock);
	pthread_mutex_destroy(&ep->rq_lock);
	free(ep->rring);
	free(ep->ssge);
	free(ep->swr);
	free(ep->sring);
	free(ep);
}

/* Allocates the endpoint and its QP (RESET state), not yet in the CQ table. */
static int v_ep_create(struct v_fab *f, struct v_cq *c, const struct rps__ep_attr *attr, const char *peer,
		       struct v_ep **out)
{
	struct ibv_qp_init_attr ia, qia;
	struct ibv_qp_attr qa;
	struct v_ep *ep;
	int ret, e;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return rps__seterr(-ENOMEM, "verbs: out of memory creating an endpoint");
	ep->base.fab = &f->base;
	ep->base.cq = &c->base;
	snprintf(ep->base.peer, sizeof(ep->base.peer), "%s", peer);
	ep->fab = f;
	ep->cq = c;
	ep->sq_depth = attr && attr->sq_depth ? attr->sq_depth : V_DEF_DEPTH;
	ep->rq_depth = attr && attr->rq_depth ? attr->rq_depth : V_DEF_DEPTH;
	ep->max_inline = attr && attr->max_inline ? attr->max_inline : V_DEF_INLINE;
	ep->sig_every = RPS__MAX(ep->sq_depth / 2, 1u);
	pthread_mutex_init(&ep->sq_lock, NULL);
	pthread_mutex_init(&ep->rq_lock, NULL);
	if (ep->sq_depth > (uint32_t)f->dattr.max_qp_wr || ep->rq_depth > (uint32_t)f->dattr.max_qp_wr) {
		ret = rps__seterr(-EINVAL, "verbs: sq_depth %u / rq_depth %u exceed %s's max_qp_wr %d",
				  ep->sq_depth, ep->rq_depth, f->name, f->dattr.max_qp_wr);
		goto err_free;
	}
	ep->sring = calloc(ep->sq_depth, sizeof(*ep->sring));
	ep->swr = calloc(ep->sq_depth + 1, sizeof(*ep->swr));
	ep->ssge = calloc(ep->sq_depth + 1, sizeof(*ep->ssge));
	ep->rring = calloc(ep->rq_depth, sizeof(*ep->rring));
	if (!ep->sring || !ep->swr || !ep->ssge || !ep->rring) {
		ret = rps__seterr(-ENOMEM, "verbs: out of memory for endpoint rings (sq %u, rq %u)", ep->sq_depth, ep->rq_depth);
		goto err_free;
	}

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = c->cq;
	ia.recv_cq = c->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.sq_sig_all = 0;
	ia.cap.max_send_wr = ep->sq_depth;
	ia.cap.max_recv_wr = ep->rq_depth;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = ep->max_inline;
	ep->qp = v_fault("ibv_create_qp") ? NULL : ibv_create_qp(f->pd, &ia);
	if (!ep->qp) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "ibv_create_qp(%s, sq %u, rq %u, inline %u): %s", f->name, ep->sq_depth,
				  ep->rq_depth, ep->max_inline, strerror(e));
		goto err_free;
	}
	ep->qpn = ep->qp->qp_num;
	/* the device may give more inline room than asked (or round): use what it has */
	if (ibv_query_qp(ep->qp, &qa, IBV_QP_CAP, &qia) == 0)
		ep->max_inline = qia.cap.max_inline_data;
	else
		ep->max_inline = ia.cap.max_inline_data;
	*out = ep;
	return 0;

err_free:
	v_ep_free(ep);
	return ret;
}

static void v_ep_close(struct rps__ep *bep)
{
	struct v_ep *ep = VEP(bep);
	struct v_fab *f = ep->fab;

	pthread_mutex_lock(&f->cm_lock);
	ep->id->context = NULL;	/* CM events of this id are now ignored */
	v_ep_shutdown(ep);
	pthread_mutex_unlock(&f->cm_lock);
	if (ep->in_table)
		v_table_del(ep->cq, ep);	/* its queued completions are now dropped */
	ibv_destroy_qp(ep->qp);
	rdma_destroy_id(ep->id);
	v_ep_free(ep);
}

/* ---- listening and accepting ------------------------------------------- */

/* Can an id bind this address with some free port? */
static int v_addr_ok(const struct sockaddr_storage *ss)
{
	struct sockaddr_storage any = *ss;
	struct rdma_cm_id *id;
	int ok;

	if (any.ss_family == AF_INET)
		((struct sockaddr_in *)&any)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&any)->sin6_port = 0;
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
		return 0;
	ok = rdma_bind_addr(id, (struct sockaddr *)&any) == 0;
	rdma_destroy_id(id);
	return ok;
}

static int v_is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
	return ss->ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
}

static int v_listen(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__listener **out)
{
	struct v_fab *f = VFAB(fab);
	struct sockaddr_storage ss;
	struct v_lis *l;
	char where[80];
	int ret, e;

	ret = v_resolve(host, port, 1, &ss);
	if (ret)
		return ret;
	v_addr_str((struct sockaddr *)&ss, where, sizeof(where));
	l = calloc(1, sizeof(*l));
	if (!l)
		return rps__seterr(-ENOMEM, "verbs: out of memory creating a listener");
	l->base.fab = fab;
	l->fab = f;
	l->ch = v_channel();
	if (!l->ch) {
		e = v_errno(ENODEV);
		ret = rps__seterr(-e, "verbs: rdma_create_event_channel: %s", strerror(e));
		goto err_free;
	}
	if (v_fault("rdma_create_id") || rdma_create_id(l->ch, &l->id, l, RDMA_PS_TCP)) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "verbs: rdma_create_id: %s", strerror(e));
		goto err_ch;
	}
	if (v_fault("rdma_bind_addr") || rdma_bind_addr(l->id, (struct sockaddr *)&ss)) {
		e = v_errno(EADDRNOTAVAIL);
		/* the kernel CM says EADDRNOTAVAIL for a taken port too */
		if (e == EADDRNOTAVAIL && port && v_addr_ok(&ss))
			e = EADDRINUSE;
		ret = rps__seterr(-e, "verbs: rdma_bind_addr(%s): %s%s", where, strerror(e),
				  e == EADDRINUSE ? ": another listener has that port" :
				  e == EADDRNOTAVAIL ? ": not an address of an RDMA-capable interface" : "");
		goto err_id;
	}
	if (l->id->verbs && l->id->verbs != f->ctx) {
		ret = rps__seterr(-EXDEV, "verbs: %s belongs to RDMA device %s, but the fabric is on %s: open the fabric with that device",
				  where, ibv_get_device_name(l->id->verbs->device), f->name);
		goto err_id;
	}
	if (v_fault("rdma_listen") || rdma_listen(l->id, 128)) {
		e = v_errno(EINVAL);
		ret = rps__seterr(-e, "verbs: rdma_listen(%s): %s", where, strerror(e));
		goto err_id;
	}
	l->base.port = ntohs(rdma_get_src_port(l->id));
	*out = &l->base;
	return 0;

err_id:
	rdma_destroy_id(l->id);
err_ch:
	rdma_destroy_event_channel(l->ch);
err_free:
	free(l);
	return ret;
}

static int v_listener_fd(struct rps__listener *bl)
{
	return VLIS(bl)->ch->fd;
}

static int v_listener_get_request(struct rps__listener *bl, struct rps__conn_req **out)
{
	struct v_lis *l = VLIS(bl);
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct v_req *r;
	int e;

	/* a server loop may sit on its listener a while: keep endpoints' CM
	 * events (disconnects) moving from here too */
	v_cm_progress(l->fab, 0);
	for (;;) {
		if (v_fault("rdma_get_cm_event@listener") || rdma_get_cm_event(l->ch, &ev)) {
			e = v_errno(EIO);
			if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
				return rps__seterr(-EAGAIN, "verbs: no connection request waiting");
			return rps__seterr(-e, "verbs: rdma_get_cm_event(listener): %s", strerror(e));
		}
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			rdma_ack_cm_event(ev);	/* nothing else concerns a listener */
			continue;
		}
		id = ev->id;
		if (id->verbs != l->fab->ctx) {
			/* came in through another device: our PD cannot serve it */
			rdma_reject(id, NULL, 0);
			rdma_ack_cm_event(ev);
			rdma_destroy_id(id);
			continue;
		}
		r = calloc(1, sizeof(*r));
		if (!r) {
			rdma_reject(id, NULL, 0);
			rdma_ack_cm_event(ev);
			rdma_destroy_id(id);
			return rps__seterr(-ENOMEM, "verbs: out of memory for a connection request");
		}
		r->base.fab = bl->fab;
		r->fab = l->fab;
		r->id = id;
		id->context = NULL;	/* inherited the listener's; nothing owns it yet */
		r->base.len = v_req_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, r->base.data);
		r->peer_init_depth = ev->param.conn.initiator_depth;
		r->peer_resp_res = ev->param.conn.responder_resources;
		v_addr_str(rdma_get_peer_addr(id), r->peer, sizeof(r->peer));
		/* ack now: the private data is copied, and rdma_migrate_id would
		 * otherwise wait for this ack */
		rdma_ack_cm_event(ev);
		*out = &r->base;
		return 0;
	}
}

static int v_reject(struct rps__conn_req *breq, const void *data, size_t len)
{
	struct v_req *r = VREQ(breq);
	uint8_t buf[1 + RPS__PRIVDATA_MAX];
	int ret = 0, e;

	buf[0] = (uint8_t)len;
	if (len)
		memcpy(buf + 1, data, len);
	if (v_fault("rdma_reject") || rdma_reject(r->id, buf, (uint8_t)(1 + len))) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: rdma_reject(%s): %s", r->peer, strerror(e));
	}
	rdma_destroy_id(r->id);
	free(r);
	return ret;
}

static int v_accept(struct rps__conn_req *breq, struct rps__cq *bcq, const struct rps__ep_attr *attr,
		    const void *data, size_t len, struct rps__ep **out)
{
	struct v_req *r = VREQ(breq);
	struct v_fab *f = r->fab;
	struct v_cq *c = VCQ(bcq);
	struct rdma_event_channel *tmp;
	struct rdma_conn_param param;
	struct rdma_cm_event *ev;
	uint8_t buf[1 + RPS__PRIVDATA_MAX];
	uint8_t resp_res, init_depth;
	struct v_ep *ep;
	uint64_t deadline;
	int ret, e, done;

	if (c->fab != f) {
		ret = rps__seterr(-EINVAL, "verbs: accept: the CQ belongs to another fabric");
		goto err_reject;
	}
	ret = v_ep_create(f, c, attr, r->peer, &ep);
	if (ret)
		goto err_reject;
	ep->id = r->id;
	/* what the peer asked for, within what this device can do */
	resp_res = (uint8_t)RPS__MIN(r->peer_init_depth, f->max_rd);
	init_depth = (uint8_t)RPS__MIN(r->peer_resp_res, f->max_init);
	ret = v_qp_init(ep->id, ep->qp);
	if (!ret)
		ret = v_qp_rtr_rts(f, ep->id, ep->qp, resp_res, init_depth);
	if (ret) {
		rps__seterr(ret, "verbs: accept %s: QP to RTS: %s", r->peer, strerror(-ret));
		goto err_ep;
	}
	tmp = v_channel();
	if (!tmp) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "verbs: accept %s: rdma_create_event_channel: %s", r->peer, strerror(e));
		goto err_ep;
	}
	/* a private channel until ESTABLISHED, so the wait sees only this id */
	if (v_fault("rdma_migrate_id") || rdma_migrate_id(ep->id, tmp)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: accept %s: rdma_migrate_id: %s", r->peer, strerror(e));
		goto err_tmp;
	}

	buf[0] = (uint8_t)len;
	if (len)
		memcpy(buf + 1, data, len);
	memset(&param, 0, sizeof(param));
	param.private_data = buf;
	param.private_data_len = (uint8_t)(1 + len);
	param.responder_resources = resp_res;
	param.initiator_depth = init_depth;
	param.retry_count = V_RETRY;
	param.rnr_retry_count = V_RNR_RETRY;
	param.qp_num = ep->qpn;
	v_table_add(c, ep);
	if (v_fault("rdma_accept") || rdma_accept(ep->id, &param)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: rdma_accept(%s): %s: the peer may have given up", r->peer, strerror(e));
		goto err_table;
	}
	deadline = v_deadline(V_ACCEPT_WAIT_MS);
	for (done = 0; !done;) {
		ret = v_get_event(tmp, deadline, &ev);
		if (ret) {
			rps__seterr(ret, "verbs: accept %s: no RTU from the peer: %s", r->peer, strerror(-ret));
			goto err_disc;
		}
		switch (ev->event) {
		case RDMA_CM_EVENT_ESTABLISHED:
			done = 1;
			break;
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_DEVICE_REMOVAL:
			ret = rps__seterr(-ECONNABORTED, "verbs: accept %s: %s before the connection was established",
					  r->peer, rdma_event_str(ev->event));
			rdma_ack_cm_event(ev);
			goto err_disc;
		default:
			break;
		}
		rdma_ack_cm_event(ev);
	}
	pthread_mutex_lock(&f->cm_lock);
	ep->id->context = ep;
	pthread_mutex_unlock(&f->cm_lock);
	if (v_fault("rdma_migrate_id") || rdma_migrate_id(ep->id, f->cm_ch)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: accept %s: rdma_migrate_id: %s", r->peer, strerror(e));
		goto err_ctx;
	}
	rdma_destroy_event_channel(tmp);
	free(r);
	*out = &ep->base;
	return 0;

err_ctx:
	pthread_mutex_lock(&f->cm_lock);
	ep->id->context = NULL;
	pthread_mutex_unlock(&f->cm_lock);
err_disc:
	v_qp_error(ep->qp);
	rdma_disconnect(ep->id);
err_table:
	v_table_del(c, ep);
	ibv_destroy_qp(ep->qp);
	rdma_destroy_id(r->id);	/* before its channel */
	v_ep_free(ep);
	rdma_destroy_event_channel(tmp);
	free(r);
	return ret;
err_tmp:
	rdma_destroy_event_channel(tmp);
err_ep:
	ibv_destroy_qp(ep->qp);
	v_ep_free(ep);
err_reject:
	rdma_reject(r->id, NULL, 0);
	rdma_destroy_id(r->id);
	free(r);
	return ret;
}

static void v_listener_close(struct rps__listener *bl)
{
	struct v_lis *l = VLIS(bl);

	rdma_destroy_id(l->id);
	rdma_destroy_event_channel(l->ch);
	free(l);
}

/* ---- connecting ---------------------------------------------------------- */

static int v_connect(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *bcq,
		     const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		     void *reply, size_t *reply_len, struct rps__ep **out)
{
	struct v_fab *f = VFAB(fab);
	struct v_cq *c = VCQ(bcq);
	uint64_t deadline = v_deadline(timeout_ms);
	struct rdma_event_channel *ch;
	struct rdma_conn_param param;
	struct rdma_cm_event *ev;
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	uint8_t req[V_REQ_PRIV], rep[RPS__PRIVDATA_MAX];
	struct v_ep *ep;
	char peer[80];
	size_t rlen = 0;
	int ret, e, left, peer_resp;

	if (reply_len)
		*reply_len = 0;
	if (c->fab != f)
		return rps__seterr(-EINVAL, "verbs: connect: the CQ belongs to another fabric");
	ret = v_resolve(host, port, 0, &ss);
	if (ret)
		return ret;
	v_addr_str((struct sockaddr *)&ss, peer, sizeof(peer));
	ch = v_channel();
	if (!ch) {
		e = v_errno(ENODEV);
		return rps__seterr(-e, "verbs: rdma_create_event_channel: %s: is rdma_ucm loaded?", strerror(e));
	}
	if (v_fault("rdma_create_id") || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "verbs: rdma_create_id: %s", strerror(e));
		goto err_ch;
	}

	left = v_ms_left(deadline);
	if (v_fault("rdma_resolve_addr") || rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, left < 0 ? 2000 : RPS__MAX(left, 1))) {
		e = v_errno(EHOSTUNREACH);
		ret = rps__seterr(-e, "verbs: rdma_resolve_addr(%s): %s", peer, strerror(e));
		goto err_id;
	}
	ret = v_get_event(ch, deadline, &ev);
	if (ret) {
		rps__seterr(ret, "verbs: resolving %s: %s", peer, strerror(-ret));
		goto err_id;
	}
	if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
		ret = rps__seterr(-EHOSTUNREACH, "verbs: %s: %s (status %d): no route to it through an RDMA device",
				  peer, rdma_event_str(ev->event), ev->status);
		rdma_ack_cm_event(ev);
		goto err_id;
	}
	rdma_ack_cm_event(ev);
	if (id->verbs != f->ctx) {
		ret = rps__seterr(-EXDEV, "verbs: %s is reached through RDMA device %s, but the fabric is on %s: open the fabric with that device",
				  peer, id->verbs ? ibv_get_device_name(id->verbs->device) : "?", f->name);
		goto err_id;
	}
	left = v_ms_left(deadline);
	if (v_fault("rdma_resolve_route") || rdma_resolve_route(id, left < 0 ? 2000 : RPS__MAX(left, 1))) {
		e = v_errno(EHOSTUNREACH);
		ret = rps__seterr(-e, "verbs: rdma_resolve_route(%s): %s%s", peer, strerror(e),
				  v_is_loopback(&ss) ? ": RoCE cannot route the loopback address; use the address of the RDMA device's netdev" : "");
		goto err_id;
	}
	ret = v_get_event(ch, deadline, &ev);
	if (ret) {
		rps__seterr(ret, "verbs: route to %s: %s", peer, strerror(-ret));
		goto err_id;
	}
	if (ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
		ret = rps__seterr(-EHOSTUNREACH, "verbs: route to %s: %s (status %d)", peer, rdma_event_str(ev->event), ev->status);
		rdma_ack_cm_event(ev);
		goto err_id;
	}
	rdma_ack_cm_event(ev);

	ret = v_ep_create(f, c, attr, peer, &ep);
	if (ret)
		goto err_id;
	ep->id = id;
	ret = v_qp_init(id, ep->qp);
	if (ret) {
		rps__seterr(ret, "verbs: connect %s: QP to INIT: %s", peer, strerror(-ret));
		goto err_ep;
	}
	v_req_encode(req, data, len);
	memset(&param, 0, sizeof(param));
	param.private_data = req;
	param.private_data_len = V_REQ_PRIV;
	param.responder_resources = f->max_rd;
	param.initiator_depth = f->max_init;
	param.retry_count = V_RETRY;
	param.rnr_retry_count = V_RNR_RETRY;
	param.qp_num = ep->qpn;
	if (v_fault("rdma_connect") || rdma_connect(id, &param)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: rdma_connect(%s): %s", peer, strerror(e));
		goto err_ep;
	}
	for (;;) {
		ret = v_get_event(ch, deadline, &ev);
		if (ret) {
			rps__seterr(ret, "verbs: connect %s: %s", peer,
				    ret == -ETIMEDOUT ? "timed out waiting for the peer's answer" : strerror(-ret));
			goto err_ep;
		}
		if (ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE)
			break;
		switch (ev->event) {
		case RDMA_CM_EVENT_REJECTED:
			if (ev->status == V_REJ_CONSUMER) {
				rlen = v_lp_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, rep);
				ret = rps__seterr(-ECONNREFUSED, "verbs: connect %s: rejected by the peer%s%.*s", peer,
						  rlen ? ": " : "", (int)strnlen((char *)rep, rlen), (char *)rep);
			} else {
				ret = rps__seterr(-ECONNREFUSED, "verbs: connect %s: refused (%s, IB CM reason %d)", peer,
						  ev->status == V_REJ_INVALID_SID ? "nobody listens on that port" : "rejected by the CM",
						  ev->status);
			}
			break;
		case RDMA_CM_EVENT_UNREACHABLE:
			ret = ev->status == -ETIMEDOUT ?
				rps__seterr(-ETIMEDOUT, "verbs: connect %s: no answer from the peer's CM", peer) :
				rps__seterr(-EHOSTUNREACH, "verbs: connect %s: unreachable (status %d)", peer, ev->status);
			break;
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_DEVICE_REMOVAL:
			ret = rps__seterr(-ECONNABORTED, "verbs: connect %s: %s (status %d)", peer,
					  rdma_event_str(ev->event), ev->status);
			break;
		default:
			rdma_ack_cm_event(ev);
			continue;
		}
		rdma_ack_cm_event(ev);
		if (ret == -ECONNREFUSED && reply && rlen)
			memcpy(reply, rep, rlen);
		if (ret == -ECONNREFUSED && reply_len)
			*reply_len = rlen;
		goto err_ep;
	}
	/* CONNECT_RESPONSE (we own the QP): RTR/RTS, then RTU via rdma_establish */
	rlen = v_lp_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, rep);
	peer_resp = ev->param.conn.responder_resources;
	rdma_ack_cm_event(ev);
	ret = v_qp_rtr_rts(f, id, ep->qp, f->max_rd, (uint8_t)RPS__MIN(f->max_init, peer_resp));
	if (ret) {
		rps__seterr(ret, "verbs: connect %s: QP to RTS: %s", peer, strerror(-ret));
		goto err_rej;
	}
	v_table_add(c, ep);
	if (v_fault("rdma_establish") || rdma_establish(id)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: connect %s: rdma_establish: %s", peer, strerror(e));
		goto err_table;
	}
	pthread_mutex_lock(&f->cm_lock);
	id->context = ep;
	pthread_mutex_unlock(&f->cm_lock);
	if (v_fault("rdma_migrate_id") || rdma_migrate_id(id, f->cm_ch)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: connect %s: rdma_migrate_id: %s", peer, strerror(e));
		goto err_ctx;
	}
	rdma_destroy_event_channel(ch);
	if (reply && rlen)
		memcpy(reply, rep, rlen);
	if (reply_len)
		*reply_len = rlen;
	*out = &ep->base;
	return 0;

err_ctx:
	pthread_mutex_lock(&f->cm_lock);
	id->context = NULL;
	pthread_mutex_unlock(&f->cm_lock);
	v_qp_error(ep->qp);
	rdma_disconnect(id);
err_table:
	v_table_del(c, ep);
	goto err_ep;
err_rej:
	rdma_reject(id, NULL, 0);
err_ep:
	ibv_destroy_qp(ep->qp);
	v_ep_free(ep);
err_id:
	rdma_destroy_id(id);
err_ch:
	rdma_destroy_event_channel(ch);
	return ret;
}

/* ---- posting ------------------------------------------------------------- */

static int v_post(struct rps__ep *bep, const struct rps__wr *wr, int n)
{
	struct v_ep *ep = VEP(bep);
	struct ibv_send_wr *bad = NULL, *w;
	struct ibv_sge *sg;
	uint64_t done, outstanding, seq;
	uint32_t unsig;
	int i, ret, posted, sig;

	if (n <= 0)
		return n == 0 ? 0 : rps__seterr(-EINVAL, "verbs: post: negative count %d", n);
	if ((uint32_t)n > ep->sq_depth)
		return rps__seterr(-EINVAL, "verbs: post: %d WRs exceed the endpoint's sq_depth %u", n, ep->sq_depth);

	pthread_mutex_lock(&ep->sq_lock);
	done = atomic_load_explicit(&ep->sq_done, memory_order_acquire);
	outstanding = ep->sq_head - done;
	if (outstanding + (uint64_t)n > ep->sq_depth) {
		/* Full.  If no signaled WR is in flight, polling would never
		 * free the unsignaled ones: send a signaled zero-length WRITE
		 * (needs no rkey, IBA C9-88) so that it does. */
		if (ep->sig_end <= done && outstanding < ep->sq_depth) {
			seq = ep->sq_head;
			w = &ep->swr[0];
			memset(w, 0, sizeof(*w));
			w->wr_id = seq;
			w->opcode = IBV_WR_RDMA_WRITE;
			w->send_flags = IBV_SEND_SIGNALED;
			ep->sring[seq % ep->sq_depth] = (struct v_sslot){ .wr_id = 0, .op = V_OP_NOP, .user_sig = 0 };
			if (ibv_post_send(ep->qp, w, &bad) == 0) {
				ep->sq_head++;
				ep->sig_end = ep->sq_head;
				ep->unsig = 0;
			}
		}
		pthread_mutex_unlock(&ep->sq_lock);
		return rps__seterr(-EAGAIN, "verbs: send queue of %s full (%u outstanding): poll the CQ and retry",
				   ep->base.peer, (unsigned)outstanding);
	}

	unsig = ep->unsig;
	for (i = 0; i < n; i++) {
		const struct rps__wr *u = &wr[i];
		int inl = 0;

		seq = ep->sq_head + (uint64_t)i;
		w = &ep->swr[i];
		sg = &ep->ssge[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = seq;
		w->next = i + 1 < n ? &ep->swr[i + 1] : NULL;
		sg->addr = (uintptr_t)u->sge.addr;
		sg->length = u->sge.len;
		sg->lkey = u->sge.mr ? u->sge.mr->lkey : 0;
		w->sg_list = sg;
		w->num_sge = u->sge.len ? 1 : 0;
		switch (u->op) {
		case RPS__OP_SEND:
			w->opcode = IBV_WR_SEND;
			inl = 1;
			break;
		case RPS__OP_WRITE:
			w->opcode = IBV_WR_RDMA_WRITE;
			inl = 1;
			break;
		case RPS__OP_WRITE_IMM:
			w->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			w->imm_data = htonl(u->imm);
			inl = 1;
			break;
		case RPS__OP_READ:
			w->opcode = IBV_WR_RDMA_READ;
			break;
		case RPS__OP_CAS:
			w->opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
			break;
		case RPS__OP_FADD:
			w->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
			break;
		default:
			ret = rps__seterr(-EINVAL, "verbs: post: unknown op %d in WR %d", (int)u->op, i);
			goto err_unlock;
		}
		if (u->op == RPS__OP_WRITE || u->op == RPS__OP_WRITE_IMM || u->op == RPS__OP_READ) {
			w->wr.rdma.remote_addr = u->raddr;
			w->wr.rdma.rkey = u->rkey;
		} else if (u->op == RPS__OP_CAS || u->op == RPS__OP_FADD) {
			if (!u->sge.mr || ((uintptr_t)u->sge.addr & 7)) {
				ret = rps__seterr(-EINVAL, "verbs: post: atomic WR %d needs an 8-byte aligned result word in a registered region", i);
				goto err_unlock;
			}
			sg->length = 8;
			w->num_sge = 1;
			if (u->raddr & 7) {
				/* Some providers (rxe) refuse a misaligned atomic at
				 * post time; the contract wants a remote access
				 * error completion and the endpoint in error, in
				 * order.  An 8-byte READ into the trap region fails
				 * exactly so on any device and changes nothing at
				 * the target; v_translate reports it as
				 * RPS__WC_REM_ACCESS_ERR. */
				w->opcode = IBV_WR_RDMA_READ;
				w->wr.rdma.remote_addr = u->raddr & ~7ull;
				w->wr.rdma.rkey = u->rkey;
				sg->addr = (uintptr_t)ep->fab->trap_buf;
				sg->lkey = ep->fab->trap_mr->lkey;
				w->send_flags |= IBV_SEND_SIGNALED;
			} else {
				w->wr.atomic.remote_addr = u->raddr;
				w->wr.atomic.rkey = u->rkey;
				w->wr.atomic.compare_add = u->compare_add;
				w->wr.atomic.swap = u->swap;
			}
		}
		if ((u->flags & RPS__WR_INLINE) && inl && u->sge.len <= ep->max_inline) {
			w->send_flags |= IBV_SEND_INLINE;
		} else if (u->sge.len && !u->sge.mr) {
			ret = rps__seterr(-EINVAL, "verbs: post: WR %d has %u bytes outside any registered region%s", i, u->sge.len,
					  (u->flags & RPS__WR_INLINE) ? " and too many to inline (see ep_attr.max_inline)" : "");
			goto err_unlock;
		}
		if (u->flags & RPS__WR_FENCE)
			w->send_flags |= IBV_SEND_FENCE;
		/* selective signalling: at least one WR in every sq_depth/2 */
		sig = (u->flags & RPS__WR_SIGNALED) || ++unsig >= ep->sig_every;
		if (sig) {
			w->send_flags |= IBV_SEND_SIGNALED;
			unsig = 0;
		}
	}

	bad = ep->swr;
	ret = v_fault("ibv_post_send");
	if (!ret)
		ret = ibv_post_send(ep->qp, ep->swr, &bad);
	posted = ret ? (int)(bad - ep->swr) : n;
	/* commit the ring for what the device took */
	for (i = 0; i < posted; i++) {
		seq = ep->sq_head + (uint64_t)i;
		ep->sring[seq % ep->sq_depth] = (struct v_sslot){
			.wr_id = wr[i].wr_id, .op = (uint8_t)wr[i].op,
			.user_sig = (wr[i].flags & RPS__WR_SIGNALED) ? 1 : 0,
			.force = ((wr[i].op == RPS__OP_CAS || wr[i].op == RPS__OP_FADD) && (wr[i].raddr & 7)) ?
				 RPS__WC_REM_ACCESS_ERR : 0 };
		if (ep->swr[i].send_flags & IBV_SEND_SIGNALED) {
			ep->sig_end = seq + 1;
			ep->unsig = 0;
		} else {
			ep->unsig++;
		}
	}
	ep->sq_head += (uint64_t)posted;
	pthread_mutex_unlock(&ep->sq_lock);
	if (ret)
		return rps__seterr(-ret, "ibv_post_send(%s): %s (%d of %d WRs posted)", ep->base.peer, strerror(ret), posted, n);
	return 0;

err_unlock:
	pthread_mutex_unlock(&ep->sq_lock);
	return ret;
}

static int v_post_recv(struct rps__ep *bep, const struct rps__sge *sge, uint64_t wr_id)
{
	struct v_ep *ep = VEP(bep);
	struct ibv_recv_wr w, *bad;
	struct ibv_sge sg;
	uint64_t done;
	int ret;

	if (sge->len && !sge->mr)
		return rps__seterr(-EINVAL, "verbs: post_recv: the buffer must be in a registered region");
	sg.addr = (uintptr_t)sge->addr;
	sg.length = sge->len;
	sg.lkey = sge->mr ? sge->mr->lkey : 0;
	memset(&w, 0, sizeof(w));
	w.sg_list = &sg;
	w.num_sge = sge->len ? 1 : 0;

	pthread_mutex_lock(&ep->rq_lock);
	done = atomic_load_explicit(&ep->rq_done, memory_order_acquire);
	if (ep->rq_head - done >= ep->rq_depth) {
		pthread_mutex_unlock(&ep->rq_lock);
		return rps__seterr(-EAGAIN, "verbs: receive queue of %s full (%u posted): poll the CQ or raise rq_depth",
				   ep->base.peer, ep->rq_depth);
	}
	ep->rring[ep->rq_head % ep->rq_depth] = wr_id;
	w.wr_id = V_RECV_TAG | ep->rq_head;
	ret = v_fault("ibv_post_recv");
	if (!ret)
		ret = ibv_post_recv(ep->qp, &w, &bad);
	if (!ret)
		ep->rq_head++;
	pthread_mutex_unlock(&ep->rq_lock);
	if (ret)
		return rps__seterr(-ret, "ibv_post_recv(%s): %s", ep->base.peer, strerror(ret));
	/* posted to a QP in error: make the device flush it (see v_ep_set_error) */
	if (__atomic_load_n(&ep->base.error, __ATOMIC_SEQ_CST))
		v_qp_error(ep->qp);
	return 0;
}

/* ---- local CAS through a loopback QP ------------------------------------- */

/* A self-connected RC QP: its atomics go through the HCA like the remote
 * workers' do, so they are atomic with respect to them (a CPU CAS is not,
 * under IBV_ATOMIC_HCA). */
static int v_lcas_setup(struct v_fab *f)
{
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;
	union ibv_gid gid;
	int ret, e, gidx;

	f->lcas_buf = v_fault("aligned_alloc") ? NULL : aligned_alloc(64, 64);
	if (!f->lcas_buf)
		return rps__seterr(-ENOMEM, "local_cas: out of memory");
	f->lcas_cq = v_fault("ibv_create_cq") ? NULL : ibv_create_cq(f->ctx, 4, NULL, NULL, 0);
	if (!f->lcas_cq) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "local_cas: ibv_create_cq: %s", strerror(e));
		goto err;
	}
	f->lcas_mr = v_fault("ibv_reg_mr") ? NULL : ibv_reg_mr(f->pd, f->lcas_buf, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!f->lcas_mr) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "local_cas: ibv_reg_mr(64 bytes): %s", strerror(e));
		goto err;
	}
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = f->lcas_cq;
	ia.recv_cq = f->lcas_cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 2;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	f->lcas_qp = v_fault("ibv_create_qp") ? NULL : ibv_create_qp(f->pd, &ia);
	if (!f->lcas_qp) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "local_cas: ibv_create_qp: %s", strerror(e));
		goto err;
	}

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = f->port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_ATOMIC;
	ret = v_fault("ibv_modify_qp");
	if (!ret)
		ret = ibv_modify_qp(f->lcas_qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (ret) {
		ret = rps__seterr(-ret, "local_cas: loopback QP to INIT: %s", strerror(ret));
		goto err;
	}

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = f->pattr.active_mtu;
	a.dest_qp_num = f->lcas_qp->qp_num;	/* itself */
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = V_MIN_RNR_TIMER;
	a.ah_attr.port_num = f->port;
	if (f->pattr.link_layer == IBV_LINK_LAYER_INFINIBAND && f->pattr.lid) {
		a.ah_attr.dlid = f->pattr.lid;
	} else {
		/* RoCE has no LIDs: address ourselves by GID */
		gidx = v_gid_index(f, &gid);
		if (gidx < 0) {
			ret = rps__seterr(-EADDRNOTAVAIL, "local_cas: port %u of %s has no GID: is its netdev up with an address?",
					  f->port, f->name);
			goto err;
		}
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.sgid_index = (uint8_t)gidx;
		a.ah_attr.grh.hop_limit = 64;
	}
	ret = v_fault("ibv_modify_qp");
	if (!ret)
		ret = ibv_modify_qp(f->lcas_qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (ret) {
		ret = rps__seterr(-ret, "local_cas: loopback QP to RTR: %s", strerror(ret));
		goto err;
	}

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = V_RETRY;
	a.rnr_retry = V_RNR_RETRY;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	ret = v_fault("ibv_modify_qp");
	if (!ret)
		ret = ibv_modify_qp(f->lcas_qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (ret) {
		ret = rps__seterr(-ret, "local_cas: loopback QP to RTS: %s", strerror(ret));
		goto err;
	}
	return 0;
err:
	v_lcas_teardown(f);
	return ret;
}

static int v_local_cas(struct rps__fabric *fab, struct rps__mr *mr, uint64_t *word, uint64_t compare,
		       uint64_t swap, uint64_t *old)
{
	struct v_fab *f = VFAB(fab);
	struct ibv_send_wr w, *bad;
	struct ibv_sge sg;
	struct ibv_wc wc;
	uint64_t deadline;
	unsigned spins = 0;
	int ret, k;

	if (((uintptr_t)word & 7) || (char *)word < (char *)mr->addr ||
	    (char *)word + 8 > (char *)mr->addr + mr->len)
		return rps__seterr(-EINVAL, "local_cas: the word must be 8-byte aligned and inside the region");
	if (!(mr->access & RPS__ACCESS_REMOTE_ATOMIC))
		return rps__seterr(-EINVAL, "local_cas: register the region with RPS__ACCESS_REMOTE_ATOMIC (the loopback QP reaches it by rkey)");

	pthread_mutex_lock(&f->lcas_lock);
	if (!f->lcas_qp) {
		ret = v_lcas_setup(f);
		if (ret)
			goto out;
	}
	sg.addr = (uintptr_t)f->lcas_buf;
	sg.length = 8;
	sg.lkey = f->lcas_mr->lkey;
	memset(&w, 0, sizeof(w));
	w.wr_id = 1;
	w.sg_list = &sg;
	w.num_sge = 1;
	w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	w.send_flags = IBV_SEND_SIGNALED;
	w.wr.atomic.remote_addr = (uintptr_t)word;
	w.wr.atomic.rkey = mr->rkey;
	w.wr.atomic.compare_add = compare;
	w.wr.atomic.swap = swap;
	ret = v_fault("ibv_post_send");
	if (!ret)
		ret = ibv_post_send(f->lcas_qp, &w, &bad);
	if (ret) {
		ret = rps__seterr(-ret, "local_cas: ibv_post_send: %s", strerror(ret));
		v_lcas_teardown(f);
		goto out;
	}
	deadline = v_deadline(V_LCAS_WAIT_MS);
	while ((k = v_fault("ibv_poll_cq") ? -1 : ibv_poll_cq(f->lcas_cq, 1, &wc)) == 0) {
		if ((++spins & 1023) == 0) {
			if (rps__now_ns() > deadline) {
				/* outcome unknown: destroying the QP cancels it if not done */
				ret = rps__seterr(-ETIMEDOUT, "local_cas: no completion from the loopback QP in %d ms", V_LCAS_WAIT_MS);
				v_lcas_teardown(f);
				goto out;
			}
			sched_yield();
		}
	}
	if (k < 0 || wc.status != IBV_WC_SUCCESS) {
		ret = rps__seterr(k >= 0 && wc.status == IBV_WC_REM_ACCESS_ERR ? -EACCES : -EIO,
				  "local_cas: loopback CAS failed: %s", k < 0 ? "ibv_poll_cq error" : ibv_wc_status_str(wc.status));
		v_lcas_teardown(f);	/* the QP is in error now; recreate next time */
		goto out;
	}
	*old = *(volatile uint64_t *)f->lcas_buf;
	ret = 0;
out:
	pthread_mutex_unlock(&f->lcas_lock);
	return ret;
}

const struct rps__transport_ops rps__verbs_ops = {
	.name = "verbs",
	.fabric_open = v_fabric_open,
	.fabric_close = v_fabric_close,
	.fabric_name = v_fabric_name,
	.mr_reg = v_mr_reg,
	.mr_dereg = v_mr_dereg,
	.local_cas = v_local_cas,
	.cq_create = v_cq_create,
	.cq_destroy = v_cq_destroy,
	.cq_poll = v_cq_poll,
	.cq_fd = v_cq_fd,
	.cq_arm = v_cq_arm,
	.listen = v_listen,
	.listener_fd = v_listener_fd,
	.listener_get_request = v_listener_get_request,
	.accept = v_accept,
	.reject = v_reject,
	.listener_close = v_listener_close,
	.connect = v_connect,
	.ep_close = v_ep_close,
	.post = v_post,
	.post_recv = v_post_recv,
};
