/*
 * verbs_post.c - posting work requests on a verbs endpoint, and the local
 * CAS through a loopback QP (verbs.c has the overview).
 */
#include "config.h"
#include "common/common.h"
#include "transport/transport.h"
#include "verbs/verbs_int.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- posting ------------------------------------------------------------- */

/* The send queue is full.  If no signaled WR is in flight, polling would
 * never free the unsignaled ones: send a signaled zero-length WRITE (needs
 * no rkey, IBA C9-88) so that it does.  sq_lock held. */
static void post_unstick(struct v_ep *ep, uint64_t done, uint64_t outstanding)
{
	struct ibv_send_wr *bad = NULL, *w;
	uint64_t seq;

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
		assert(ep->sq_head - done <= ep->sq_depth);
	}
}

/* The remote side of atomic WR i (u) in w and sg. */
static int build_atomic(struct v_ep *ep, const struct rps__wr *u, int i, struct ibv_send_wr *w, struct ibv_sge *sg)
{
	if (!u->sge.mr || ((uintptr_t)u->sge.addr & 7))
		return rps__seterr(-EINVAL, "verbs: post: atomic WR %d needs an 8-byte aligned result word in a registered region", i);
	sg->length = 8;
	w->num_sge = 1;
	if (u->raddr & 7) {
		/* Some providers (rxe) refuse a misaligned atomic at
		 * post time; the contract wants a remote access
		 * error completion and the endpoint in error, in
		 * order.  An 8-byte READ into the trap region fails
		 * exactly so on any device and changes nothing at
		 * the target; verbs_fabric.c's translate() reports it as
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
	return 0;
}

/* ep->swr[i] (and its sge) for WR i of n, u; *unsig counts the unsignaled
 * WRs since the last signaled one.  sq_lock held. */
static int build_swr(struct v_ep *ep, const struct rps__wr *u, int i, int n, uint32_t *unsig)
{
	struct ibv_send_wr *w = &ep->swr[i];
	struct ibv_sge *sg = &ep->ssge[(size_t)i * RPS__WR_MAX_SGE];
	uint64_t seq = ep->sq_head + (uint64_t)i;
	uint64_t len = rps__wr_len(u);
	int inl = 0, ret, sig, k, nsge = rps__wr_nsge(u);
	bool unreg = false;

	if (u->num_sge < 0 || u->num_sge > RPS__WR_MAX_SGE)
		return rps__seterr(-EINVAL, "verbs: post: WR %d has %d scatter/gather entries, at most %d", i,
				   u->num_sge, RPS__WR_MAX_SGE);
	memset(w, 0, sizeof(*w));
	w->wr_id = seq;
	w->next = i + 1 < n ? &ep->swr[i + 1] : NULL;
	w->sg_list = sg;
	/* empty entries are left out: a zero-length WRITE carries no SGE */
	for (k = 0; k < nsge; k++) {
		const struct rps__mr *mr = u->sgl[k].mr;
		uintptr_t a = (uintptr_t)u->sgl[k].addr;

		if (!u->sgl[k].len)
			continue;
		/* the contract's check, at post time as on tcp (the HCA would
		 * fail it later, and the QP with it) */
		if (mr && !(u->flags & RPS__WR_INLINE) &&
		    (a < (uintptr_t)mr->addr || u->sgl[k].len > mr->len || a - (uintptr_t)mr->addr > mr->len - u->sgl[k].len))
			return rps__seterr(-EINVAL, "verbs: post: WR %d entry %d (%p+%u) lies outside its region %p+%zu: "
					   "pass the region that holds it", i, k, u->sgl[k].addr, u->sgl[k].len, mr->addr, mr->len);
		sg[w->num_sge].addr = (uintptr_t)u->sgl[k].addr;
		sg[w->num_sge].length = u->sgl[k].len;
		sg[w->num_sge].lkey = u->sgl[k].mr ? u->sgl[k].mr->lkey : 0;
		unreg |= !u->sgl[k].mr;
		w->num_sge++;
	}
	if (!w->num_sge) {	/* (an atomic's result word is filled in below) */
		sg->addr = (uintptr_t)u->sge.addr;
		sg->length = 0;
		sg->lkey = u->sge.mr ? u->sge.mr->lkey : 0;
	}
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
		return rps__seterr(-EINVAL, "verbs: post: unknown op %d in WR %d", (int)u->op, i);
	}
	if (u->op == RPS__OP_WRITE || u->op == RPS__OP_WRITE_IMM || u->op == RPS__OP_READ) {
		w->wr.rdma.remote_addr = u->raddr;
		w->wr.rdma.rkey = u->rkey;
	} else if (u->op == RPS__OP_CAS || u->op == RPS__OP_FADD) {
		ret = build_atomic(ep, u, i, w, sg);
		if (ret)
			return ret;
	}
	if ((u->flags & RPS__WR_INLINE) && inl && len <= ep->max_inline) {
		w->send_flags |= IBV_SEND_INLINE;
	} else if (unreg && u->op != RPS__OP_CAS && u->op != RPS__OP_FADD) {
		return rps__seterr(-EINVAL, "verbs: post: WR %d has %llu bytes outside any registered region%s", i,
				   (unsigned long long)len,
				   (u->flags & RPS__WR_INLINE) ? " and too many to inline (see ep_attr.max_inline)" : "");
	}
	if (u->flags & RPS__WR_FENCE)
		w->send_flags |= IBV_SEND_FENCE;
	/* selective signalling: at least one WR in every sq_depth/2 */
	sig = (u->flags & RPS__WR_SIGNALED) || ++*unsig >= ep->sig_every;
	if (sig) {
		w->send_flags |= IBV_SEND_SIGNALED;
		*unsig = 0;
	}
	return 0;
}

/* The ring slots of the n WRs about to be posted, written before they are:
 * another thread polling the CQ may see a WR's completion before
 * ibv_post_send() has even returned here, and verbs_fabric.c's translate() reads
 * the slot to know whose it is and whether the caller asked for it (a slot
 * written after would be read stale, and a signaled completion swallowed as
 * one of ours).  Slots past what the device takes are never read.
 * sq_lock held. */
static void fill_sring(struct v_ep *ep, const struct rps__wr *wr, int n)
{
	uint64_t seq;
	int i;

	for (i = 0; i < n; i++) {
		seq = ep->sq_head + (uint64_t)i;
		ep->sring[seq % ep->sq_depth] = (struct v_sslot){
			.wr_id = wr[i].wr_id, .op = (uint8_t)wr[i].op,
			.user_sig = (wr[i].flags & RPS__WR_SIGNALED) ? 1 : 0,
			.force = ((wr[i].op == RPS__OP_CAS || wr[i].op == RPS__OP_FADD) && (wr[i].raddr & 7)) ?
				 RPS__WC_REM_ACCESS_ERR : 0 };
	}
}

/* Commit the ring for the first `posted` WRs, which the device took. */
static void commit_sring(struct v_ep *ep, int posted)
{
	uint64_t seq;
	int i;

	for (i = 0; i < posted; i++) {
		seq = ep->sq_head + (uint64_t)i;
		if (ep->swr[i].send_flags & IBV_SEND_SIGNALED) {
			ep->sig_end = seq + 1;
			ep->unsig = 0;
		} else {
			ep->unsig++;
		}
	}
	ep->sq_head += (uint64_t)posted;
	/* selective signalling: fewer than sig_every unsignaled WRs since the
	 * last signaled one, so polling always frees the send queue */
	assert(ep->unsig < ep->sig_every);
}

int rps__verbs_post(struct rps__ep *bep, const struct rps__wr *wr, int n)
{
	struct v_ep *ep = VEP(bep);
	struct ibv_send_wr *bad = NULL;
	uint64_t done, outstanding;
	uint32_t unsig;
	int i, ret, posted;

	if (n <= 0)
		return n == 0 ? 0 : rps__seterr(-EINVAL, "verbs: post: negative count %d", n);
	if ((uint32_t)n > ep->sq_depth)
		return rps__seterr(-EINVAL, "verbs: post: %d WRs exceed the endpoint's sq_depth %u", n, ep->sq_depth);

	pthread_mutex_lock(&ep->sq_lock);
	done = atomic_load_explicit(&ep->sq_done, memory_order_acquire);
	outstanding = ep->sq_head - done;
	if (outstanding + (uint64_t)n > ep->sq_depth) {
		post_unstick(ep, done, outstanding);
		pthread_mutex_unlock(&ep->sq_lock);
		return rps__seterr(-EAGAIN, "verbs: send queue of %s full (%u outstanding): poll the CQ and retry",
				   ep->base.peer, (unsigned)outstanding);
	}

	unsig = ep->unsig;
	for (i = 0; i < n; i++) {
		ret = build_swr(ep, &wr[i], i, n, &unsig);
		if (ret)
			goto err_unlock;
	}

	fill_sring(ep, wr, n);
	bad = ep->swr;
	ret = v_fault("ibv_post_send");
	if (!ret)
		ret = ibv_post_send(ep->qp, ep->swr, &bad);
	/* the WR that failed, and those before it were taken; a provider
	 * whose doorbell failed names none (rxe: NULL): count none taken,
	 * the endpoint is failed by its caller anyway */
	posted = !ret ? n : (bad >= ep->swr && bad < ep->swr + n) ? (int)(bad - ep->swr) : 0;
	commit_sring(ep, posted);
	/* never more send WRs outstanding than the QP's depth (checked
	 * above against the completions seen then; they only grow) */
	assert(posted >= 0 && posted <= n && ep->sq_head - done <= ep->sq_depth);
	pthread_mutex_unlock(&ep->sq_lock);
	if (ret)
		return rps__seterr(-ret, "ibv_post_send(%s): %s (%d of %d WRs posted)", ep->base.peer, strerror(ret), posted, n);
	return 0;

err_unlock:
	pthread_mutex_unlock(&ep->sq_lock);
	return ret;
}

static unsigned v_mw_access(int access)
{
	return ((access & RPS__ACCESS_REMOTE_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       ((access & RPS__ACCESS_REMOTE_READ) ? IBV_ACCESS_REMOTE_READ : 0) |
	       ((access & RPS__ACCESS_REMOTE_ATOMIC) ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

/* A type 2 window over the whole region (rxe checks a window's accesses
 * against its region's bounds, so a narrower window buys nothing there),
 * bound by a WR on the endpoint's QP: the device honours its key on that
 * QP alone.  The bind takes a send-queue slot like any WR (V_OP_NOP in the
 * ring: it completes silently, or fails the endpoint). */
int rps__verbs_mw_bind(struct rps__ep *bep, struct rps__mr *bmr, int access, uint32_t *rkey)
{
	struct v_ep *ep = VEP(bep);
	struct v_mr *m = rps__container_of(bmr, struct v_mr, base);
	struct ibv_send_wr w, *bad = NULL;
	uint64_t done, outstanding, seq;
	struct v_mw *vw;
	uint32_t key;
	int ret, e;

	if (!ep->fab->windows) {	/* registered with its rights: its own key */
		*rkey = bmr->rkey;
		return 0;
	}
	vw = calloc(1, sizeof(*vw));
	if (!vw)
		return rps__seterr(-ENOMEM, "ibv_alloc_mw: out of memory");
	errno = 0;
	vw->mw = v_fault("ibv_alloc_mw") ? NULL : ibv_alloc_mw(ep->fab->pd, IBV_MW_TYPE_2);
	if (!vw->mw) {
		e = v_errno(ENOMEM);
		free(vw);
		return rps__seterr(-e, "ibv_alloc_mw(%s): %s: the device's memory windows ran out "
				   "(max_mw %d): fewer connections or tensors per server", ep->fab->name, strerror(e),
				   ep->fab->dattr.max_mw);
	}
	vw->mr = m;
	vw->ep = ep;
	key = ibv_inc_rkey(vw->mw->rkey);

	pthread_mutex_lock(&ep->sq_lock);
	done = atomic_load_explicit(&ep->sq_done, memory_order_acquire);
	outstanding = ep->sq_head - done;
	if (outstanding + 1 > ep->sq_depth) {
		post_unstick(ep, done, outstanding);
		pthread_mutex_unlock(&ep->sq_lock);
		ibv_dealloc_mw(vw->mw);
		free(vw);
		return rps__seterr(-EAGAIN, "verbs: mw_bind: send queue of %s full (%u outstanding): poll the CQ and retry",
				   ep->base.peer, (unsigned)outstanding);
	}
	seq = ep->sq_head;
	memset(&w, 0, sizeof(w));
	w.wr_id = seq;
	w.opcode = IBV_WR_BIND_MW;
	w.bind_mw.mw = vw->mw;
	w.bind_mw.rkey = key;
	w.bind_mw.bind_info.mr = m->mr;
	w.bind_mw.bind_info.addr = (uintptr_t)bmr->addr;
	w.bind_mw.bind_info.length = bmr->len;
	w.bind_mw.bind_info.mw_access_flags = v_mw_access(access);
	if (ep->unsig + 1 >= ep->sig_every)
		w.send_flags = IBV_SEND_SIGNALED;
	/* (the slot first: see fill_sring) */
	ep->sring[seq % ep->sq_depth] = (struct v_sslot){ .wr_id = 0, .op = V_OP_NOP, .user_sig = 0 };
	ret = v_fault("ibv_post_send");
	if (!ret)
		ret = ibv_post_send(ep->qp, &w, &bad);
	if (!ret) {
		ep->sq_head++;
		if (w.send_flags & IBV_SEND_SIGNALED) {
			ep->sig_end = ep->sq_head;
			ep->unsig = 0;
		} else {
			ep->unsig++;
		}
	}
	assert(ep->sq_head - done <= ep->sq_depth && ep->unsig < ep->sig_every);
	pthread_mutex_unlock(&ep->sq_lock);
	if (ret) {
		ibv_dealloc_mw(vw->mw);
		free(vw);
		return rps__seterr(-ret, "ibv_post_send(%s): binding a memory window: %s", ep->base.peer, strerror(ret));
	}
	rps__verbs_windows_link(ep->fab, vw);
	*rkey = key;
	return 0;
}

uint32_t rps__verbs_ep_sq_room(struct rps__ep *bep)
{
	struct v_ep *ep = VEP(bep);
	uint64_t outstanding;

	pthread_mutex_lock(&ep->sq_lock);
	outstanding = ep->sq_head - atomic_load_explicit(&ep->sq_done, memory_order_acquire);
	pthread_mutex_unlock(&ep->sq_lock);
	return outstanding >= ep->sq_depth ? 0 : (uint32_t)(ep->sq_depth - outstanding);
}

int rps__verbs_post_recv(struct rps__ep *bep, const struct rps__sge *sge, uint64_t wr_id)
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
	assert(ep->rq_head - done <= ep->rq_depth);	/* never more receives posted than the RQ holds */
	pthread_mutex_unlock(&ep->rq_lock);
	if (ret)
		return rps__seterr(-ret, "ibv_post_recv(%s): %s", ep->base.peer, strerror(ret));
	/* posted to a QP in error: make the device flush it (see verbs_fabric.c, ep_set_error) */
	if (__atomic_load_n(&ep->base.error, __ATOMIC_SEQ_CST))
		rps__verbs_qp_error(ep->qp);
	return 0;
}

/* ---- local CAS through a loopback QP ------------------------------------- */

/* A self-connected RC QP: its atomics go through the HCA like the remote
 * workers' do, so they are atomic with respect to them (a CPU CAS is not,
 * under IBV_ATOMIC_HCA). */
/* The loopback QP's CQ, its result word's MR, and the QP. */
static int lcas_create(struct v_fab *f)
{
	struct ibv_qp_init_attr ia;
	int ret, e;

	f->lcas_cq = v_fault("ibv_create_cq") ? NULL : ibv_create_cq(f->ctx, 4, NULL, NULL, 0);
	if (!f->lcas_cq) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "local_cas: ibv_create_cq: %s", strerror(e));
		return ret;
	}
	f->lcas_mr = v_fault("ibv_reg_mr") ? NULL : ibv_reg_mr(f->pd, f->lcas_buf, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!f->lcas_mr) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "local_cas: ibv_reg_mr(64 bytes): %s", strerror(e));
		return ret;
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
		return ret;
	}
	return 0;
}

static int lcas_to_init(struct v_fab *f)
{
	struct ibv_qp_attr a;
	int ret;

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
		return ret;
	}
	return 0;
}

/* RTR, connected to itself. */
static int lcas_to_rtr(struct v_fab *f)
{
	struct ibv_qp_attr a;
	union ibv_gid gid;
	int ret, gidx;

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
		gidx = rps__verbs_gid_index(f, &gid);
		if (gidx < 0) {
			ret = rps__seterr(-EADDRNOTAVAIL, "local_cas: port %u of %s has no GID: is its netdev up with an address?",
					  f->port, f->name);
			return ret;
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
		return ret;
	}
	return 0;
}

static int lcas_to_rts(struct v_fab *f)
{
	struct ibv_qp_attr a;
	int ret;

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
		return ret;
	}
	return 0;
}

static int v_lcas_setup(struct v_fab *f)
{
	int ret;

	f->lcas_buf = v_fault("aligned_alloc") ? NULL : aligned_alloc(64, 64);
	if (!f->lcas_buf)
		return rps__seterr(-ENOMEM, "local_cas: out of memory");
	ret = lcas_create(f);
	if (!ret)
		ret = lcas_to_init(f);
	if (!ret)
		ret = lcas_to_rtr(f);
	if (!ret)
		ret = lcas_to_rts(f);
	if (ret)
		rps__verbs_lcas_teardown(f);
	return ret;
}

/* Post w on the loopback QP and wait for its completion.  On failure the
 * QP is torn down (in error, or its outcome unknown): the next call
 * recreates it.  lcas_lock held. */
static int lcas_post_wait(struct v_fab *f, struct ibv_send_wr *w, const char *what)
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	uint64_t deadline;
	unsigned spins = 0;
	int ret, k;

	ret = v_fault("ibv_post_send");
	if (!ret)
		ret = ibv_post_send(f->lcas_qp, w, &bad);
	if (ret) {
		ret = rps__seterr(-ret, "local_cas: ibv_post_send: %s (%s)", strerror(ret), what);
		rps__verbs_lcas_teardown(f);
		return ret;
	}
	deadline = v_deadline(V_LCAS_WAIT_MS);
	while ((k = v_fault("ibv_poll_cq") ? -1 : ibv_poll_cq(f->lcas_cq, 1, &wc)) == 0) {
		if ((++spins & 1023) == 0) {
			if (rps__now_ns() > deadline) {
				/* outcome unknown: destroying the QP cancels it if not done */
				ret = rps__seterr(-ETIMEDOUT, "local_cas: no completion from the loopback QP in %d ms (%s)",
						  V_LCAS_WAIT_MS, what);
				rps__verbs_lcas_teardown(f);
				return ret;
			}
			sched_yield();
		}
	}
	if (k < 0 || wc.status != IBV_WC_SUCCESS) {
		ret = rps__seterr(k >= 0 && wc.status == IBV_WC_REM_ACCESS_ERR ? -EACCES : -EIO,
				  "local_cas: loopback %s failed: %s", what,
				  k < 0 ? "ibv_poll_cq error" : ibv_wc_status_str(wc.status));
		rps__verbs_lcas_teardown(f);	/* the QP is in error now; recreate next time */
		return ret;
	}
	return 0;
}

/* A windowed region's key reaches nothing: the loopback QP gets a window
 * of its own on it, kept until the region or the QP goes.  lcas_lock held. */
static int lcas_window(struct v_fab *f, struct v_mr *m)
{
	struct ibv_send_wr w;
	struct ibv_mw *mw;
	uint32_t key;
	int ret, e;

	errno = 0;
	mw = v_fault("ibv_alloc_mw") ? NULL : ibv_alloc_mw(f->pd, IBV_MW_TYPE_2);
	if (!mw) {
		e = v_errno(ENOMEM);
		return rps__seterr(-e, "local_cas: ibv_alloc_mw: %s", strerror(e));
	}
	key = ibv_inc_rkey(mw->rkey);
	memset(&w, 0, sizeof(w));
	w.wr_id = 2;
	w.opcode = IBV_WR_BIND_MW;
	w.send_flags = IBV_SEND_SIGNALED;
	w.bind_mw.mw = mw;
	w.bind_mw.rkey = key;
	w.bind_mw.bind_info.mr = m->mr;
	w.bind_mw.bind_info.addr = (uintptr_t)m->base.addr;
	w.bind_mw.bind_info.length = m->base.len;
	w.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_ATOMIC;
	ret = lcas_post_wait(f, &w, "window bind");
	if (ret) {
		ibv_dealloc_mw(mw);
		return ret;
	}
	m->lcas_mw = mw;
	m->lcas_rkey = key;
	m->lcas_next = f->lcas_mrs;
	f->lcas_mrs = m;
	return 0;
}

int rps__verbs_local_cas(struct rps__fabric *fab, struct rps__mr *mr, uint64_t *word, uint64_t compare,
			 uint64_t swap, uint64_t *old)
{
	struct v_fab *f = VFAB(fab);
	struct v_mr *m = rps__container_of(mr, struct v_mr, base);
	struct ibv_send_wr w;
	struct ibv_sge sg;
	uint32_t rkey = mr->rkey;
	int ret;

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
	if ((mr->access & RPS__ACCESS_WINDOWED) && f->windows) {
		if (!m->lcas_mw && (ret = lcas_window(f, m)))
			goto out;
		rkey = m->lcas_rkey;
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
	w.wr.atomic.rkey = rkey;
	w.wr.atomic.compare_add = compare;
	w.wr.atomic.swap = swap;
	ret = lcas_post_wait(f, &w, "CAS");
	if (ret)
		goto out;
	*old = *(volatile uint64_t *)f->lcas_buf;
	ret = 0;
out:
	pthread_mutex_unlock(&f->lcas_lock);
	return ret;
}
