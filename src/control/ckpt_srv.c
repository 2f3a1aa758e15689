/*
 * ckpt_srv.c - checkpoints and restores on the server side (psctl
 * checkpoint / restore, rdmapsd --restore).
 *
 * A consistent cut without stopping the world for long:
 *   PREPARE  every server holds its sync tensors: no step past the highest
 *            step any of its shards has reached is applied (pushes for
 *            later steps wait, parked or in their slots) and it answers
 *            tensor -> that step
 *   TAKE     psctl sends the highest step per tensor over all servers; a
 *            server lets its lagging shards reach it (their pushes are
 *            already on their way: a worker pushes every shard of a step
 *            before it pulls), then copies every shard it serves
 *            (parameters, optimizer state, version, clocks) in memory,
 *            releases the hold and answers; a thread writes the copies to
 *            DIR/member-<id>.rpsck (ckpt.h: crc32c, igzip)
 *   FINISH   answers once that file is durable
 * So every sync tensor is cut at the same step on every shard, and
 * training pauses for the catch-up of lagging shards plus a memory copy;
 * async and bounded tensors are copied as they are at the copy (each shard
 * is consistent: the serving thread makes the copy between updates).
 *
 * RESTORE reads every file of the checkpoint and installs the shards whose
 * partitions this server serves now (the cluster may have another number of
 * servers or partitions: placement is recomputed), creating tensors it does
 * not know.  It is meant for a cluster whose workers have not started.
 */
#include "config.h"
#include "control/ckpt.h"
#include "common/common.h"
#include "server/server_int.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdmaps.h"

struct shard_copy {
	uint32_t tensor;	/* index in copies' tensor table */
	struct rps__ckpt_shard meta;
	float *params;
	float *state;
	uint64_t *clocks;
};

struct tensor_copy {
	char name[RPS__NAME_MAX];
	struct rps__tensor_spec spec;
};

struct ckpt_state {
	bool holding;
	uint64_t hold_start;
	uint64_t hold_until;
	/* TAKE in progress (conn: whom to answer), then FINISH */
	struct conn *conn;
	uint64_t req_id;
	struct conn *fin_conn;
	uint64_t fin_req_id;
	bool have_result;	/* the last write ended: result, bytes, msg */
	bool taking;		/* waiting for the targets */
	bool writing;		/* the thread runs */
	uint64_t ckpt_id;
	int level;
	char path[256];
	uint64_t pause_ns;
	uint64_t raw_bytes;
	/* the copies, handed to the writer thread */
	struct tensor_copy *tensors;
	uint32_t ntensors;
	struct shard_copy *shards;
	uint32_t nshards;
	pthread_t thread;
	volatile int done;	/* set by the thread */
	int result;
	uint64_t bytes;
	char msg[256];
};

static struct ckpt_state *state(struct rps__server *srv)
{
	if (!srv->ckpt)
		srv->ckpt = calloc(1, sizeof(*srv->ckpt));
	return srv->ckpt;
}

static void reply(struct conn *c, uint64_t req_id, int status, const struct rps__ckpt_rep *rep0,
		  const struct rps__ckpt_target *t, uint32_t nt, const char *msg)
{
	size_t len = sizeof(struct rps__ckpt_rep) + (size_t)nt * sizeof(*t);
	char *buf = calloc(1, len);
	struct rps__ckpt_rep *rep = (void *)buf;

	if (!buf)
		return;
	if (rep0)
		*rep = *rep0;
	rep->ntargets = nt;
	if (msg)
		snprintf(rep->msg, sizeof(rep->msg), "%s", msg);
	if (nt)
		memcpy(buf + sizeof(*rep), t, (size_t)nt * sizeof(*t));
	rps__srv_conn_reply(c, RPS__MSG_CKPT_REP, req_id, status, buf, len);
	free(buf);
}

static void release_hold(struct rps__server *srv)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i])
			srv->tensors[i]->hold_limit = UINT64_MAX;
	if (srv->ckpt)
		srv->ckpt->holding = false;
	rps__srv_drain_held(srv);	/* the pushes that waited */
}

static void free_copies(struct ckpt_state *ck)
{
	uint32_t i;

	for (i = 0; i < ck->nshards; i++) {
		free(ck->shards[i].params);
		free(ck->shards[i].state);
		free(ck->shards[i].clocks);
	}
	free(ck->shards);
	free(ck->tensors);
	ck->shards = NULL;
	ck->tensors = NULL;
	ck->nshards = ck->ntensors = 0;
}

/* Highest step of each sync tensor's shards served here. */
static uint32_t local_steps(struct rps__server *srv, struct rps__ckpt_target **out)
{
	struct rps__ckpt_target *t = calloc(srv->ntensors ? srv->ntensors : 1, sizeof(*t));
	uint32_t i, j, n = 0;

	*out = t;
	if (!t)
		return 0;
	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *x = srv->tensors[i];
		uint64_t m = 0;
		bool any = false;
		if (!x || x->spec.mode != RPS_MODE_SYNC)
			continue;
		for (j = 0; j < x->layout.nshards; j++) {
			struct shard *s = &x->shards[j];
			if (!s->hdr || !rps__cp_serving(srv, s->part))
				continue;
			any = true;
			m = RPS__MAX(m, s->step);
		}
		if (!any)
			continue;
		snprintf(t[n].name, sizeof(t[n].name), "%s", x->name);
		t[n].step = m;
		n++;
	}
	return n;
}

static int copy_all(struct rps__server *srv, struct ckpt_state *ck)
{
	uint32_t i, j, n = 0, nt = 0;

	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *x = srv->tensors[i];
		for (j = 0; x && j < x->layout.nshards; j++)
			n += x->shards[j].hdr && rps__cp_serving(srv, x->shards[j].part);
	}
	ck->tensors = calloc(srv->ntensors ? srv->ntensors : 1, sizeof(*ck->tensors));
	ck->shards = calloc(n ? n : 1, sizeof(*ck->shards));
	if (!ck->tensors || !ck->shards)
		return -ENOMEM;
	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *x = srv->tensors[i];
		bool any = false;
		if (!x)
			continue;
		for (j = 0; j < x->layout.nshards; j++) {
			struct shard *s = &x->shards[j];
			struct shard_copy *sc;
			size_t nstate;
			if (!s->hdr || !rps__cp_serving(srv, s->part))
				continue;
			any = true;
			sc = &ck->shards[ck->nshards++];
			nstate = rps__optim_state_len(x->optim.type, s->elems);
			sc->tensor = nt;
			sc->meta.index = s->index;
			sc->meta.elems = s->elems;
			sc->meta.version = s->step;
			sc->meta.min_clock = s->hdr->min_clock;
			sc->meta.flags = s->ready ? RPS__CKPT_SHARD_READY : 0;
			sc->meta.nstate = (uint32_t)nstate;
			sc->meta.nclocks = s->clocks ? (uint32_t)x->spec.num_workers : 0;
			sc->params = malloc((size_t)s->elems * 4);
			sc->state = nstate ? malloc(nstate * 4) : NULL;
			sc->clocks = sc->meta.nclocks ? malloc((size_t)sc->meta.nclocks * 8) : NULL;
			if (!sc->params || (nstate && !sc->state) || (sc->meta.nclocks && !sc->clocks))
				return -ENOMEM;
			memcpy(sc->params, s->params, (size_t)s->elems * 4);
			if (nstate)
				memcpy(sc->state, s->state, nstate * 4);
			if (sc->meta.nclocks)
				memcpy(sc->clocks, s->clocks, (size_t)sc->meta.nclocks * 8);
			sc->meta.params = sc->params;
			sc->meta.state = sc->state;
			sc->meta.clocks = sc->clocks;
			ck->raw_bytes += (size_t)s->elems * 4 + nstate * 4;
		}
		if (any) {
			snprintf(ck->tensors[nt].name, sizeof(ck->tensors[nt].name), "%s", x->name);
			ck->tensors[nt].spec = x->spec;
			nt++;
		}
	}
	ck->ntensors = nt;
	return 0;
}

static void *writer_main(void *arg)
{
	struct rps__server *srv = arg;
	struct ckpt_state *ck = srv->ckpt;
	struct rps__ckpt_header h = {
		.member_id = srv->my_id, .npart = srv->map.npart, .shard_elems = srv->shard_elems,
		.ckpt_id = ck->ckpt_id,
	};
	struct rps__ckpt_writer *w = NULL;
	struct timespec ts;
	sigset_t all;
	uint32_t t, i;
	int ret;

	/* SIGTERM/SIGINT belong to the serving thread (rdmapsd blocks them
	 * there before tearing the server down): never run their handler here */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	clock_gettime(CLOCK_REALTIME, &ts);
	h.time_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	ret = rps__ckpt_create(ck->path, &h, ck->level, &w);
	for (t = 0; !ret && t < ck->ntensors; t++) {
		ret = rps__ckpt_put_tensor(w, ck->tensors[t].name, &ck->tensors[t].spec);
		for (i = 0; !ret && i < ck->nshards; i++)
			if (ck->shards[i].tensor == t)
				ret = rps__ckpt_put_shard(w, &ck->shards[i].meta);
	}
	if (!ret) {
		ret = rps__ckpt_finish(w, &ck->bytes);
		w = NULL;
	}
	if (ret) {
		snprintf(ck->msg, sizeof(ck->msg), "%s", rps__errbuf());
		rps__ckpt_abort(w);
	}
	ck->result = ret;
	__atomic_store_n(&ck->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static bool targets_reached(struct rps__server *srv)
{
	uint32_t i, j;

	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *x = srv->tensors[i];
		if (!x || x->spec.mode != RPS_MODE_SYNC || x->hold_limit == UINT64_MAX)
			continue;
		for (j = 0; j < x->layout.nshards; j++) {
			struct shard *s = &x->shards[j];
			if (s->hdr && rps__cp_serving(srv, s->part) && s->step < x->hold_limit)
				return false;
		}
	}
	return true;
}

void rps__ck_timers(struct rps__server *srv, uint64_t now)
{
	struct ckpt_state *ck = srv->ckpt;
	struct rps__ckpt_rep rep;
	int ret;

	if (!ck)
		return;
	if (ck->holding && !ck->taking && now >= ck->hold_until) {
		rps__log(RPS__LOG_WARN, "checkpoint: no TAKE within the hold timeout: training resumes");
		release_hold(srv);
	}
	if (ck->taking && targets_reached(srv)) {
		uint64_t c0 = rps__now_ns();
		ck->taking = false;
		ret = copy_all(srv, ck);
		ck->pause_ns = rps__now_ns() - ck->hold_start;
		rps__log(RPS__LOG_DEBUG, "checkpoint: held %.3f ms, copied in %.3f ms", (double)(c0 - ck->hold_start) / 1e6,
			 (double)(rps__now_ns() - c0) / 1e6);
		release_hold(srv);
		if (!ret) {
			ck->done = 0;
			ret = -pthread_create(&ck->thread, NULL, writer_main, srv);
		}
		if (ret) {
			free_copies(ck);
			if (ck->conn)
				reply(ck->conn, ck->req_id, ret, NULL, NULL, 0, "checkpoint: out of memory copying the shards");
			ck->conn = NULL;
			return;
		}
		ck->writing = true;
		ck->have_result = false;
		rps__log(RPS__LOG_INFO, "checkpoint %llu: %u shards copied, training paused %.3f ms",
			 (unsigned long long)ck->ckpt_id, ck->nshards, (double)ck->pause_ns / 1e6);
		memset(&rep, 0, sizeof(rep));
		rep.pause_ns = ck->pause_ns;
		rep.raw_bytes = ck->raw_bytes;
		rep.nshards = ck->nshards;
		if (ck->conn)
			reply(ck->conn, ck->req_id, 0, &rep, NULL, 0, NULL);
		ck->conn = NULL;
	}
	if (ck->writing && __atomic_load_n(&ck->done, __ATOMIC_ACQUIRE)) {
		pthread_join(ck->thread, NULL);
		ck->writing = false;
		memset(&rep, 0, sizeof(rep));
		rep.pause_ns = ck->pause_ns;
		rep.bytes = ck->bytes;
		rep.raw_bytes = ck->raw_bytes;
		rep.nshards = ck->nshards;
		if (ck->result)
			rps__log(RPS__LOG_ERROR, "checkpoint %llu: %s", (unsigned long long)ck->ckpt_id, ck->msg);
		else
			rps__log(RPS__LOG_INFO, "checkpoint %llu: %llu bytes written to %s",
				 (unsigned long long)ck->ckpt_id, (unsigned long long)ck->bytes, ck->path);
		ck->have_result = true;
		if (ck->fin_conn)
			reply(ck->fin_conn, ck->fin_req_id, ck->result, &rep, NULL, 0, ck->result ? ck->msg : NULL);
		ck->fin_conn = NULL;
		free_copies(ck);
	}
}

void rps__ck_conn_gone(struct rps__server *srv, struct conn *c)
{
	if (srv->ckpt && srv->ckpt->conn == c)
		srv->ckpt->conn = NULL;	/* the work goes on; nobody to tell */
	if (srv->ckpt && srv->ckpt->fin_conn == c)
		srv->ckpt->fin_conn = NULL;
}

/* ---- restore ---------------------------------------------------------- */

static int restore_file(struct rps__server *srv, const char *file, uint32_t *installed, uint64_t *seen,
			uint64_t *bytes)
{
	struct rps__ckpt_reader *r;
	struct rps__ckpt_header h;
	struct rps__ckpt_item it;
	struct tensor *t = NULL;
	int ret;

	ret = rps__ckpt_open(file, &r, &h);
	if (ret)
		return ret;
	if (h.shard_elems != srv->shard_elems) {
		rps__ckpt_close(r);
		return rps__seterr(-EINVAL, "%s: written with shards of %u bytes; this server uses %u: restore with the same --shard-size",
				   file, h.shard_elems * 4, srv->shard_elems * 4);
	}
	while ((ret = rps__ckpt_next(r, &it)) > 0) {
		if (it.type == RPS__CKPT_TENSOR) {
			t = rps__srv_tensor_by_name(srv, it.name);
			if (t && memcmp(&t->spec, &it.spec, sizeof(it.spec))) {
				ret = rps__seterr(-EEXIST, "%s: tensor '%s' exists here with other options", file, it.name);
				break;
			}
			if (!t && (ret = rps__srv_tensor_add(srv, it.name, &it.spec, &t)))
				break;
			continue;
		}
		{
			const struct rps__ckpt_shard *cs = &it.shard;
			struct shard *s;
			uint32_t p;
			size_t nstate;
			(*seen)++;
			*bytes += (uint64_t)cs->elems * 4;
			if (!t || cs->index >= t->layout.nshards || cs->elems != t->shards[cs->index].elems) {
				ret = rps__seterr(-EBADMSG, "%s: shard %u does not fit its tensor", file, cs->index);
				break;
			}
			s = &t->shards[cs->index];
			p = s->part;
			/* and lost partitions it owns: a restore is what brings them back */
			if (!rps__cp_serving(srv, p) && !(srv->map.parts[p].owner == srv->my_id && rps__cp_lost(srv, p)))
				continue;
			if (!t->regions[p].mem) {
				ret = rps__srv_region_alloc(srv, t, p, false, NULL);
				if (!ret)
					ret = rps__srv_region_register(srv, t, p);
				if (ret)
					break;
			}
			nstate = rps__optim_state_len(t->optim.type, s->elems);
			if (cs->nstate != nstate || cs->nclocks != (s->clocks ? (uint32_t)t->spec.num_workers : 0)) {
				ret = rps__seterr(-EBADMSG, "%s: tensor '%s' shard %u: optimizer state or clocks do not match its options",
						  file, t->name, cs->index);
				break;
			}
			/* the shard is idle (no workers yet): write it under the seqlock */
			__atomic_store_n(&s->hdr->seq, s->step * 2 + 1, __ATOMIC_RELEASE);
			memcpy(s->params, cs->params, (size_t)cs->elems * 4);
			if (nstate)
				memcpy(s->state, cs->state, nstate * 4);
			if (cs->nclocks)
				memcpy(s->clocks, cs->clocks, (size_t)cs->nclocks * 8);
			s->step = cs->version;
			s->next_rank = 0;
			s->ready = cs->flags & RPS__CKPT_SHARD_READY;
			s->init_conn = NULL;
			__atomic_store_n(&s->hdr->min_clock, cs->min_clock, __ATOMIC_RELEASE);
			__atomic_store_n(&s->hdr->seq, s->ready ? s->step * 2 : s->step * 2 + 1, __ATOMIC_RELEASE);
			(*installed)++;
		}
	}
	rps__ckpt_close(r);
	return ret < 0 ? ret : 0;
}

int rps__ck_restore(struct rps__server *srv, const char *dir, uint32_t *installed, uint64_t *seen, uint64_t *bytes)
{
	char **files = NULL;
	size_t n = 0, i;
	int ret;

	*installed = 0;
	*seen = 0;
	*bytes = 0;
	ret = rps__ckpt_list(dir, &files, &n);
	if (ret)
		return ret;
	for (i = 0; i < n && !ret; i++)
		ret = restore_file(srv, files[i], installed, seen, bytes);
	rps__ckpt_free_list(files, n);
	if (!ret)
		rps__log(RPS__LOG_INFO, "restored %u of the %llu shards of %s (the rest belong to other servers)",
			 *installed, (unsigned long long)*seen, dir);
	return ret;
}

/* ---- requests ------------------------------------------------------------ */

void rps__ck_on_message(struct rps__server *srv, struct conn *c, const struct rps__msg_hdr *h,
			const void *body, uint32_t body_len)
{
	const struct rps__ckpt_req *req = body;
	const struct rps__ckpt_target *tg = (const void *)((const char *)body + sizeof(*req));
	struct ckpt_state *ck = state(srv);
	struct rps__ckpt_rep rep;
	uint32_t i;

	(void)body_len;
	memset(&rep, 0, sizeof(rep));
	if (!ck) {
		reply(c, h->req_id, -ENOMEM, NULL, NULL, 0, "out of memory");
		return;
	}
	switch (req->op) {
	case RPS__CKPT_PREPARE: {
		struct rps__ckpt_target *mine = NULL;
		uint32_t n;
		if (ck->taking || ck->writing) {
			reply(c, h->req_id, -EBUSY, NULL, NULL, 0, "a checkpoint is in progress on this server");
			return;
		}
		n = local_steps(srv, &mine);
		if (n * sizeof(*mine) + sizeof(rep) + sizeof(struct rps__msg_hdr) > c->msg_max) {
			free(mine);
			reply(c, h->req_id, -E2BIG, NULL, NULL, 0, "too many sync tensors for one reply");
			return;
		}
		/* hold each at what it reached here */
		for (i = 0; i < n; i++) {
			struct tensor *x = rps__srv_tensor_by_name(srv, mine[i].name);
			if (x)
				x->hold_limit = mine[i].step;
		}
		ck->holding = n > 0;	/* (nothing to hold: the pause is the copy) */
		ck->hold_start = rps__now_ns();
		ck->hold_until = ck->hold_start + (uint64_t)(req->timeout_ms ? req->timeout_ms : 30000) * 1000000ull;
		reply(c, h->req_id, 0, &rep, mine, n, NULL);
		free(mine);
		return;
	}
	case RPS__CKPT_TAKE:
		if (ck->taking || ck->writing) {
			reply(c, h->req_id, -EBUSY, NULL, NULL, 0, "a checkpoint is in progress on this server");
			return;
		}
		for (i = 0; i < req->ntargets; i++) {
			struct tensor *x;
			if (!memchr(tg[i].name, '\0', sizeof(tg[i].name)))
				continue;
			x = rps__srv_tensor_by_name(srv, tg[i].name);
			if (x && x->spec.mode == RPS_MODE_SYNC)
				x->hold_limit = tg[i].step;
		}
		/* a sync tensor PREPARE did not see here (no shards then): as it is */
		if (!ck->holding)
			ck->hold_start = rps__now_ns();
		ck->holding = true;
		rps__srv_drain_held(srv);	/* lagging shards may go on to the target */
		ck->taking = true;
		ck->conn = c;
		ck->req_id = h->req_id;
		ck->ckpt_id = req->ckpt_id;
		ck->level = (int)RPS__MIN(req->level, 3u);
		ck->raw_bytes = 0;
		snprintf(ck->path, sizeof(ck->path), "%s", req->path);
		rps__ck_timers(srv, rps__now_ns());
		return;
	case RPS__CKPT_FINISH:
		if (ck->writing) {
			ck->fin_conn = c;
			ck->fin_req_id = h->req_id;
			return;
		}
		if (!ck->have_result) {
			reply(c, h->req_id, -ENOENT, NULL, NULL, 0, "no checkpoint was taken here");
			return;
		}
		rep.bytes = ck->bytes;
		rep.pause_ns = ck->pause_ns;
		rep.raw_bytes = ck->raw_bytes;
		reply(c, h->req_id, ck->result, &rep, NULL, 0, ck->result ? ck->msg : NULL);
		return;
	case RPS__CKPT_ABORT:
		if (!ck->writing) {
			ck->taking = false;
			release_hold(srv);
		}
		reply(c, h->req_id, 0, NULL, NULL, 0, NULL);
		return;
	case RPS__CKPT_RESTORE: {
		uint32_t installed;
		uint64_t seen, bytes;
		int ret = rps__ck_restore(srv, req->path, &installed, &seen, &bytes);
		if (!ret)
			rps__cp_restored(srv);
		rep.nshards = installed;
		rep.seen_shards = seen;
		rep.bytes = bytes;
		reply(c, h->req_id, ret, &rep, NULL, 0, ret ? rps__errbuf() : NULL);
		return;
	}
	default:
		reply(c, h->req_id, -EINVAL, NULL, NULL, 0, "unknown checkpoint operation");
	}
}

void rps__ck_fini(struct rps__server *srv)
{
	struct ckpt_state *ck = srv->ckpt;

	if (!ck)
		return;
	if (ck->writing)
		pthread_join(ck->thread, NULL);
	free_copies(ck);
	free(ck);
	srv->ckpt = NULL;
}
