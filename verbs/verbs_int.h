/*
 * verbs_int.h - what the files of the verbs provider share (verbs.c has the
 * overview).  Only verbs/ includes the verbs and rdma_cm headers.
 *
 * The files of verbs/ (tests/filemaps.sh checks that this names each):
 *   verbs.c         the overview, shared helpers, the ops table
 *   verbs_fabric.c  fabric, memory registration, QP state transitions, CQs
 *   verbs_conn.c    endpoints, listening, accepting, connecting
 *   verbs_post.c    posting, and the local CAS through a loopback QP
 */
#ifndef RPS_VERBS_INT_H
#define RPS_VERBS_INT_H

#include "transport/provider.h"
#include "common/common.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#define V_DEF_DEPTH		128
#define V_DEF_INLINE		64
#define V_DEF_CQ_DEPTH		1024
#define V_MAX_RD_ATOMIC		16	/* per-QP outstanding READs/atomics we ask for */
#define V_MIN_RNR_TIMER		12	/* 0.64 ms between RNR retries */
/*
 * A dead peer (its host gone: no reset, no CM DREQ) shows only as
 * transport retries running out, IBV_WC_RETRY_EXC_ERR, which the client
 * rides through like a TCP reset.  retry_cnt 7 must not be used: rdma_rxe
 * takes it as "retry for ever", so an operation towards a dead host would
 * never complete.  The local ACK timeout is 4.096 us * 2^V_ACK_TIMEOUT =
 * 268 ms; with 6 retries (7 transmissions) a dead peer errors ~1.9 s after
 * the last ACK.  Common choices: the perftest tools use 14 (67 ms) with 7
 * retries, UCX 1 s with 7; rdma_cm's own RoCE default is ~1 s.  268 ms sits
 * between them: well above any live fabric's round trip (and a
 * software-emulated RoCE VM's), and short next to the failover time.
 */
#define V_RETRY			6
#define V_ACK_TIMEOUT		16
#define V_RNR_RETRY		7	/* 7 = retry for ever: a slow receiver is not an error */
/* REP -> RTU, waited for inside rps__accept() so that a live initiator's QP
 * is in RTR before we send (else the first packets cost a transport retry).
 * Past it the endpoint is handed out anyway and the CM settles it later (an
 * initiator that died mid-handshake: CONNECT_ERROR, the endpoint fails):
 * a server accepting a peer waits inside its loop, and this stays well
 * under a lease (failover_ms / 2, renewed every failover_ms / 10). */
#define V_ACCEPT_WAIT_MS	250
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
	 * in order, on any device (see the misaligned atomic in rps__verbs_post) */
	uint64_t *trap_buf;
	struct ibv_mr *trap_mr;
	pthread_mutex_t cm_lock;
	/* local_cas: a loopback RC QP connected to itself, created lazily */
	pthread_mutex_t lcas_lock;
	struct ibv_cq *lcas_cq;
	struct ibv_qp *lcas_qp;
	struct ibv_mr *lcas_mr;
	uint64_t *lcas_buf;
	struct v_mr *lcas_mrs;		/* regions with a window on the loopback QP (lcas_lock) */
	/* memory windows (type 2, bound per QP): 0 when the device has none */
	int windows;
	pthread_mutex_t mw_lock;	/* every v_mw's two lists */
};

struct v_mw;

struct v_mr {
	struct rps__mr base;
	struct ibv_mr *mr;
	struct v_mw *mws;		/* windows on it (fab->mw_lock) */
	/* local_cas reaches a windowed region through a window of its own on
	 * the loopback QP (fab->lcas_lock) */
	struct ibv_mw *lcas_mw;
	uint32_t lcas_rkey;
	struct v_mr *lcas_next;
};

/* A type 2 memory window on one region, bound to one endpoint's QP: on two
 * lists, so that whichever of the two goes first takes it along. */
struct v_mw {
	struct ibv_mw *mw;
	struct v_mr *mr;
	struct v_ep *ep;
	struct v_mw *mr_next;
	struct v_mw *ep_next;
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
	struct v_mw *mws;		/* windows bound to this QP (fab->mw_lock) */
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

/* fault injection (verbs.c): v_fault("call") is 0, or the errno to inject */
extern int rps__verbs_fault_state;
int rps__verbs_fault_slow(const char *call);

static inline int v_errno(int fallback)
{
	return errno ? errno : fallback;
}

static inline int v_fault(const char *call)
{
	if (__builtin_expect(__atomic_load_n(&rps__verbs_fault_state, __ATOMIC_RELAXED) == 0, 1))
		return 0;
	return rps__verbs_fault_slow(call);
}

static inline uint64_t v_deadline(int timeout_ms)
{
	return timeout_ms < 0 ? UINT64_MAX : rps__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

static inline int v_ms_left(uint64_t deadline)
{
	uint64_t now = rps__now_ns();

	if (deadline == UINT64_MAX)
		return -1;
	if (now >= deadline)
		return 0;
	return (int)RPS__MIN((deadline - now + 999999) / 1000000, (uint64_t)INT32_MAX);
}

/* ---- shared between the files -------------------------------------------- */

/* verbs.c */
int rps__verbs_set_nonblock(int fd);
void rps__verbs_addr_str(const struct sockaddr *sa, char *buf, size_t len);
int rps__verbs_resolve(const char *host, uint16_t port, int passive, struct sockaddr_storage *ss);
struct rdma_event_channel *rps__verbs_channel(void);
int rps__verbs_get_event(struct rdma_event_channel *ch, uint64_t deadline, struct rdma_cm_event **ev);
void rps__verbs_req_encode(uint8_t *out, const void *data, size_t len);
size_t rps__verbs_req_decode(const uint8_t *in, size_t inlen, uint8_t *out);
size_t rps__verbs_lp_decode(const void *data, size_t inlen, void *out);

/* verbs_fabric.c */
int rps__verbs_fabric_open(const struct rps__fabric_attr *attr, struct rps__fabric **out);
void rps__verbs_lcas_teardown(struct v_fab *f);
void rps__verbs_fabric_close(struct rps__fabric *fab);
const char *rps__verbs_fabric_name(const struct rps__fabric *fab);
int rps__verbs_mr_reg(struct rps__fabric *fab, void *addr, size_t len, int access, struct rps__mr **out);
int rps__verbs_mr_dereg(struct rps__mr *mr);
int rps__verbs_fabric_windows(const struct rps__fabric *fab);
void rps__verbs_windows_link(struct v_fab *f, struct v_mw *w);
void rps__verbs_windows_release_ep(struct v_ep *ep);
int rps__verbs_gid_index(struct v_fab *f, union ibv_gid *gid);
int rps__verbs_qp_init(struct rdma_cm_id *id, struct ibv_qp *qp);
int rps__verbs_qp_rtr_rts(struct v_fab *f, struct rdma_cm_id *id, struct ibv_qp *qp, uint8_t resp_res,
			  uint8_t init_depth);
void rps__verbs_qp_error(struct ibv_qp *qp);
int rps__verbs_cq_create(struct rps__fabric *fab, uint32_t depth, struct rps__cq **out);
void rps__verbs_cq_destroy(struct rps__cq *cq);
int rps__verbs_cq_grow(struct rps__cq *cq, uint32_t depth);
int rps__verbs_cq_fd(struct rps__cq *cq);
int rps__verbs_cq_arm(struct rps__cq *cq);
void rps__verbs_table_add(struct v_cq *c, struct v_ep *ep);
void rps__verbs_table_del(struct v_cq *c, struct v_ep *ep);
void rps__verbs_ep_shutdown(struct v_ep *ep);
void rps__verbs_cm_progress(struct v_fab *f, int wait_lock);
int rps__verbs_cq_poll(struct rps__cq *cq, struct rps__wc *wc, int n);

/* verbs_conn.c */
void rps__verbs_ep_close(struct rps__ep *bep);
int rps__verbs_listen(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__listener **out);
int rps__verbs_listener_fd(struct rps__listener *bl);
int rps__verbs_listener_get_request(struct rps__listener *bl, struct rps__conn_req **out);
int rps__verbs_reject(struct rps__conn_req *breq, const void *data, size_t len);
int rps__verbs_accept(struct rps__conn_req *breq, struct rps__cq *bcq, const struct rps__ep_attr *attr,
		      const void *data, size_t len, struct rps__ep **out);
void rps__verbs_listener_close(struct rps__listener *bl);
int rps__verbs_connect(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *bcq,
		       const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		       void *reply, size_t *reply_len, struct rps__ep **out);
int rps__verbs_dial_start(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *bcq,
			  const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
			  struct rps__dial **out);
int rps__verbs_dial_fd(const struct rps__dial *d, short *events);
int rps__verbs_dial_step(struct rps__dial *d, void *reply, size_t *reply_len, struct rps__ep **out);
void rps__verbs_dial_cancel(struct rps__dial *d);

/* verbs_post.c */
int rps__verbs_post(struct rps__ep *bep, const struct rps__wr *wr, int n);
int rps__verbs_post_recv(struct rps__ep *bep, const struct rps__sge *sge, uint64_t wr_id);
int rps__verbs_mw_bind(struct rps__ep *bep, struct rps__mr *bmr, int access, uint32_t *rkey);
uint32_t rps__verbs_ep_sq_room(struct rps__ep *bep);
int rps__verbs_local_cas(struct rps__fabric *fab, struct rps__mr *mr, uint64_t *word, uint64_t compare,
			 uint64_t swap, uint64_t *old);

#endif
