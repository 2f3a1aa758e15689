/*
 * verbs_fabric.c - the verbs provider's fabric (device, PD, the fabric's CM
 * channel), memory registration, QP state transitions and completion queues
 * with their CM housekeeping (verbs.c has the overview).
 */
#include "config.h"
#include "common/common.h"
#include "transport/transport.h"
#include "verbs/verbs_int.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

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
	ret = rps__verbs_resolve(host, 0, 0, &ss);
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

/*
 * librdmacm opens every RDMA device once per process, on first use, and
 * keeps those contexts until exit; a child forked after that inherits them,
 * but their files were opened by the parent, and the kernel refuses its
 * verbs commands on them ("changed security contexts after opening file
 * descriptor"): a post whose doorbell is refused that way even reports no
 * failed WR.  librdmacm cannot open them again for the child, so a forked
 * child is told so, at once, in one line.
 */
static _Atomic pid_t v_rdmacm_pid;

static int v_check_fork(void)
{
	pid_t me = getpid(), first = 0;

	if (atomic_compare_exchange_strong(&v_rdmacm_pid, &first, me) || first == me)
		return 0;
	return rps__seterr(-EPERM, "verbs: process %ld was forked after process %ld opened the RDMA devices, and "
			   "their handles are not this process's: open librdmaps only after fork(), or exec() a "
			   "new program", (long)me, (long)first);
}

int rps__verbs_fabric_open(const struct rps__fabric_attr *attr, struct rps__fabric **out)
{
	struct ibv_context *want = NULL;
	struct v_fab *f;
	uint8_t port = 1;
	int n = 0, i, ret, e;

	if ((ret = v_check_fork()))
		return ret;
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
	f->cm_ch = rps__verbs_channel();
	if (!f->cm_ch) {
		e = v_errno(ENODEV);
		ret = rps__seterr(-e, "verbs: rdma_create_event_channel: %s: is rdma_ucm loaded and /dev/infiniband/rdma_cm accessible?",
				  strerror(e));
		goto err_trap_mr;
	}
	pthread_mutex_init(&f->cm_lock, NULL);
	pthread_mutex_init(&f->lcas_lock, NULL);
	pthread_mutex_init(&f->mw_lock, NULL);
	/* Type 2 windows (bound by a WR on one QP, honoured on that QP alone)
	 * scope remote access to a connection; without them a windowed region
	 * is registered with its rights, reachable from every QP of the PD. */
	f->windows = (f->dattr.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) &&
		     f->dattr.max_mw > 0;
	{
		const char *no = getenv("RPS_VERBS_NO_WINDOWS");
		if (no && strcmp(no, "0") && *no)
			f->windows = 0;
	}
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

void rps__verbs_lcas_teardown(struct v_fab *f)
{
	struct v_mr *m;

	/* the loopback QP's windows go first: a bound window holds its QP */
	while ((m = f->lcas_mrs)) {
		f->lcas_mrs = m->lcas_next;
		ibv_dealloc_mw(m->lcas_mw);
		m->lcas_mw = NULL;
		m->lcas_rkey = 0;
		m->lcas_next = NULL;
	}
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

void rps__verbs_fabric_close(struct rps__fabric *fab)
{
	struct v_fab *f = VFAB(fab);

	rps__verbs_lcas_teardown(f);
	pthread_mutex_destroy(&f->lcas_lock);
	pthread_mutex_destroy(&f->mw_lock);
	pthread_mutex_destroy(&f->cm_lock);
	rdma_destroy_event_channel(f->cm_ch);
	ibv_dereg_mr(f->trap_mr);
	free(f->trap_buf);
	ibv_dealloc_pd(f->pd);
	rdma_free_devices(f->devs);
	free(f);
}

const char *rps__verbs_fabric_name(const struct rps__fabric *fab)
{
	return VFAB((struct rps__fabric *)fab)->name;
}

/* ---- memory registration -------------------------------------------------- */

static int v_access(const struct v_fab *f, int access)
{
	int a = IBV_ACCESS_LOCAL_WRITE;	/* remote write/atomic need it, and READ targets */

	/* a windowed region grants nothing remotely itself: windows do */
	if ((access & RPS__ACCESS_WINDOWED) && f->windows)
		return a | IBV_ACCESS_MW_BIND;

	if (access & RPS__ACCESS_REMOTE_WRITE)
		a |= IBV_ACCESS_REMOTE_WRITE;
	if (access & RPS__ACCESS_REMOTE_READ)
		a |= IBV_ACCESS_REMOTE_READ;
	if (access & RPS__ACCESS_REMOTE_ATOMIC)
		a |= IBV_ACCESS_REMOTE_ATOMIC;
	return a;
}

int rps__verbs_mr_reg(struct rps__fabric *fab, void *addr, size_t len, int access, struct rps__mr **out)
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
	m->mr = v_fault("ibv_reg_mr") ? NULL : ibv_reg_mr(f->pd, addr, len, v_access(f, access));
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

int rps__verbs_fabric_windows(const struct rps__fabric *fab)
{
	return VFAB((struct rps__fabric *)fab)->windows;
}

/* A window just bound: on its region's list and its endpoint's. */
void rps__verbs_windows_link(struct v_fab *f, struct v_mw *w)
{
	/* one window of a region, bound to a QP of the same fabric, linked once */
	assert(w->mw && w->mr && w->ep && w->ep->fab == f && w->mr_next == NULL && w->ep_next == NULL);
	pthread_mutex_lock(&f->mw_lock);
	w->mr_next = w->mr->mws;
	w->mr->mws = w;
	w->ep_next = w->ep->mws;
	w->ep->mws = w;
	pthread_mutex_unlock(&f->mw_lock);
}

/* Deallocating a type 2 window invalidates it: its key fails from then on. */
static void window_free(struct v_mw *w)
{
	ibv_dealloc_mw(w->mw);
	free(w);
}

/* The windows of an endpoint, before its QP goes. */
void rps__verbs_windows_release_ep(struct v_ep *ep)
{
	struct v_mw *w, **pp;

	pthread_mutex_lock(&ep->fab->mw_lock);
	while ((w = ep->mws)) {
		ep->mws = w->ep_next;
		for (pp = &w->mr->mws; *pp != w; pp = &(*pp)->mr_next)
			;
		*pp = w->mr_next;
		window_free(w);
	}
	pthread_mutex_unlock(&ep->fab->mw_lock);
}

/* The windows on a region (a device refuses to deregister a region that
 * windows are bound to), and its window on the loopback QP. */
static void windows_release_mr(struct v_fab *f, struct v_mr *m)
{
	struct v_mw *w, **pp;
	struct v_mr **mp;

	pthread_mutex_lock(&f->mw_lock);
	while ((w = m->mws)) {
		m->mws = w->mr_next;
		for (pp = &w->ep->mws; *pp != w; pp = &(*pp)->ep_next)
			;
		*pp = w->ep_next;
		window_free(w);
	}
	pthread_mutex_unlock(&f->mw_lock);
	pthread_mutex_lock(&f->lcas_lock);
	if (m->lcas_mw) {
		for (mp = &f->lcas_mrs; *mp != m; mp = &(*mp)->lcas_next)
			;
		*mp = m->lcas_next;
		ibv_dealloc_mw(m->lcas_mw);
		m->lcas_mw = NULL;
	}
	pthread_mutex_unlock(&f->lcas_lock);
}

int rps__verbs_mr_dereg(struct rps__mr *mr)
{
	struct v_mr *m = rps__container_of(mr, struct v_mr, base);
	int ret;

	windows_release_mr(VFAB(mr->fab), m);
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

int rps__verbs_gid_index(struct v_fab *f, union ibv_gid *gid)
{
	static const union ibv_gid zero;
	int i;

	for (i = 0; i < RPS__MAX(f->pattr.gid_tbl_len, 1); i++)
		if (!v_fault("ibv_query_gid") && ibv_query_gid(f->ctx, f->port, i, gid) == 0 && memcmp(gid, &zero, sizeof(zero)))
			return i;
	return -1;
}

/* INIT with every remote right on the QP: the MR's rights are what limit. */
int rps__verbs_qp_init(struct rdma_cm_id *id, struct ibv_qp *qp)
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

int rps__verbs_qp_rtr_rts(struct v_fab *f, struct rdma_cm_id *id, struct ibv_qp *qp, uint8_t resp_res,
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
	a.timeout = V_ACK_TIMEOUT;
	a.retry_cnt = V_RETRY;
	a.rnr_retry = V_RNR_RETRY;
	mask |= IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
	ret = v_fault("ibv_modify_qp");
	return -(ret ? ret : ibv_modify_qp(qp, &a, mask));
}

void rps__verbs_qp_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* ---- completion queues --------------------------------------------------- */

int rps__verbs_cq_create(struct rps__fabric *fab, uint32_t depth, struct rps__cq **out)
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
	ret = rps__verbs_set_nonblock(c->ch->fd);
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

void rps__verbs_cq_destroy(struct rps__cq *cq)
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

/* At least twice the entries each time (a client adding endpoints one by
 * one resizes a few times, not once per endpoint), within max_cqe.  The
 * provider serializes a resize against polls (mlx5 and rxe hold the CQ's
 * lock), and c->lock one grow against another. */
int rps__verbs_cq_grow(struct rps__cq *cq, uint32_t depth)
{
	struct v_cq *c = VCQ(cq);
	uint32_t max = (uint32_t)c->fab->dattr.max_cqe, want;
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	if (depth <= (uint32_t)c->cq->cqe)
		goto out;
	if (depth > max) {
		ret = rps__seterr(-ENOSPC, "verbs: a completion queue of %u entries is needed and %s allows %u "
				  "(max_cqe): connect to fewer endpoints (servers x serving threads)",
				  depth, c->fab->name, max);
		goto out;
	}
	want = RPS__MIN(RPS__MAX(depth, 2 * (uint32_t)c->cq->cqe), max);
	ret = v_fault("ibv_resize_cq");
	if (!ret)
		ret = ibv_resize_cq(c->cq, (int)want);
	if (ret) {
		ret = rps__seterr(-ret, "ibv_resize_cq(%s, %u entries): %s", c->fab->name, want, strerror(ret));
		goto out;
	}
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int rps__verbs_cq_fd(struct rps__cq *cq)
{
	return VCQ(cq)->epfd;
}

int rps__verbs_cq_arm(struct rps__cq *cq)
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

void rps__verbs_table_add(struct v_cq *c, struct v_ep *ep)
{
	struct v_ep **b = &c->table[ep->qpn % V_CQ_BUCKETS];

	pthread_mutex_lock(&c->lock);
	ep->hnext = *b;
	*b = ep;
	ep->in_table = 1;
	c->nep++;
	pthread_mutex_unlock(&c->lock);
}

void rps__verbs_table_del(struct v_cq *c, struct v_ep *ep)
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

/* A WC error means the QP is in ERR already; the first time, move it to ERR
 * once more anyway: rxe flushes the receive queue only when its responder
 * runs, and a receive posted around the error would otherwise never
 * complete.  rps__verbs_post_recv does the same for receives posted later. */
static void ep_set_error(struct v_ep *ep)
{
	if (!__atomic_exchange_n(&ep->base.error, 1, __ATOMIC_SEQ_CST))
		rps__verbs_qp_error(ep->qp);
}

/* Under f->cm_lock: QP to ERR (flushes posted receives and outstanding ops)
 * and tell the peer, once. */
void rps__verbs_ep_shutdown(struct v_ep *ep)
{
	if (ep->disconnected)
		return;
	ep->disconnected = 1;
	rps__verbs_qp_error(ep->qp);
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
		 * flushed by this ERR or kicked by rps__verbs_post_recv */
		__atomic_store_n(&ep->base.error, 1, __ATOMIC_SEQ_CST);
		rps__verbs_ep_shutdown(ep);
		break;
	default:		/* ESTABLISHED (already waited for), TIMEWAIT_EXIT, ADDR_CHANGE */
		break;
	}
}

/* Drain the fabric's CM channel.  Non-blocking; if another thread is at it,
 * leave it to that thread. */
void rps__verbs_cm_progress(struct v_fab *f, int wait_lock)
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
	rps__verbs_cm_progress(c->fab, 0);
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
static int translate(struct v_cq *c, const struct ibv_wc *iw, struct rps__wc *out)
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
			ep_set_error(ep);
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
			ep_set_error(ep);
		} else if (force) {
			/* a substitute that was meant to fail; make sure the
			 * endpoint is in error even if it did not */
			if (iw->status == IBV_WC_SUCCESS)
				rps__verbs_qp_error(ep->qp);
			ep_set_error(ep);
		} else if (iw->status == IBV_WC_SUCCESS) {
			if (!user_sig)
				return 0;	/* our selective-signalling completion */
		} else {
			ep_set_error(ep);
			if (op == V_OP_NOP)
				return 0;
		}
		out->status = force ? (enum rps__wc_status)force : v_status(iw->status, op);
		out->opcode = v_opcode(op);
		out->byte_len = iw->byte_len;
	}
	return 1;
}

int rps__verbs_cq_poll(struct rps__cq *cq, struct rps__wc *wc, int n)
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
			got += translate(c, &iw[i], &wc[got]);
		pthread_mutex_unlock(&c->lock);
		if (k < want)
			break;
	}
	return got;
}
