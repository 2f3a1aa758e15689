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
 *            DIR/NAME/member-<id>.rpsck (ckpt.h: crc32c, igzip), DIR the
 *            operator's --checkpoint-dir, NAME the request's
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
 *
 * A request from the network names a checkpoint, never a path: without
 * --checkpoint-dir every one is refused (-EPERM), a name that could leave
 * the directory is refused (-EINVAL), and no symbolic link under it is
 * followed (-ELOOP).  Only rdmapsd --restore, from the operator's command
 * line, takes a path.
 */
#include "config.h"
#include "control/ckpt.h"
#include "common/common.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"

struct ckpt_state {
	bool holding;
	uint64_t hold_start;
	uint64_t hold_until;
	/* TAKE in progress (conn: whom to answer), then FINISH */
	struct srv_conn *conn;
	uint64_t req_id;
	struct srv_conn *fin_conn;
	uint64_t fin_req_id;
	bool have_result;	/* the last write ended: result, bytes, msg */
	bool taking;		/* waiting for the targets */
	bool writing;		/* the thread runs */
	uint64_t ckpt_id;
	int level;
	int base_fd;		/* --checkpoint-dir, open; -1: none given */
	char *base;		/* its path, for messages */
	char name[RPS__CKPT_NAME_MAX + 1];	/* the TAKE's checkpoint, under base */
	uint64_t pause_ns;
	uint64_t raw_bytes;
	/* the copies, handed to the writer thread */
	struct rps__dp_copy copy;
	const struct rps__dp_ops *dp;
	pthread_t thread;
	volatile int done;	/* set by the thread */
	int result;
	uint64_t bytes;
	char msg[256];
};

static struct ckpt_state *state(struct rps__cplane *cp)
{
	if (!cp->ckpt) {
		cp->ckpt = calloc(1, sizeof(*cp->ckpt));
		if (cp->ckpt) {
			cp->ckpt->dp = cp->dp;
			cp->ckpt->base_fd = -1;
		}
	}
	return cp->ckpt;
}

int rps__ck_init(struct rps__cplane *cp)
{
	struct ckpt_state *ck = state(cp);
	int fd;

	if (!ck)
		return rps__seterr(-ENOMEM, "out of memory");
	if (!cp->cfg.ckpt_dir) {
		rps__log(RPS__LOG_INFO, "no --checkpoint-dir: psctl checkpoint and restore are refused");
		return 0;
	}
	ck->base = strdup(cp->cfg.ckpt_dir);
	if (!ck->base)
		return rps__seterr(-ENOMEM, "out of memory");
	fd = rps__ckpt_dir_open(ck->base);
	if (fd < 0)
		return fd;
	ck->base_fd = fd;
	if (access(ck->base, W_OK | X_OK) < 0)
		rps__log(RPS__LOG_WARN, "--checkpoint-dir %s: not writable by this server (%s): checkpoints will fail",
			 ck->base, strerror(errno));
	return 0;
}

/* May a request name this checkpoint here?  0, or a refusal (the reason
 * in rps__errbuf, logged: someone may be probing). */
static int name_ok(const struct ckpt_state *ck, const char *name)
{
	int ret;

	if (ck->base_fd < 0)
		ret = rps__seterr(-EPERM, "rdmapsd has no --checkpoint-dir: checkpoints are off (start it"
				  " with --checkpoint-dir DIR)");
	else
		ret = rps__ckpt_name_check(name);
	if (ret)
		rps__log(RPS__LOG_WARN, "checkpoint request refused: %s", rps__errbuf());
	return ret;
}

static void reply(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, int status,
		  const struct rps__ckpt_rep *rep0, const struct rps__ckpt_target *t, uint32_t nt, const char *msg)
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
	cp->dp->conn_reply(c, RPS__MSG_CKPT_REP, req_id, status, buf, len);
	free(buf);
}

static void release_hold(struct rps__cplane *cp)
{
	if (cp->ckpt)
		cp->ckpt->holding = false;
	cp->dp->hold_release(cp->srv);	/* and the pushes that waited go on */
}

static void free_copies(struct ckpt_state *ck)
{
	ck->dp->copy_free(&ck->copy);
}

/* A shard as the file holds it. */
static struct rps__ckpt_shard file_shard(const struct rps__dp_shard *s)
{
	return (struct rps__ckpt_shard){
		.index = s->index, .elems = s->elems, .version = s->version, .min_clock = s->min_clock,
		.flags = s->ready ? RPS__CKPT_SHARD_READY : 0, .nclocks = s->nclocks, .clocks = s->clocks,
		.params = s->params, .nstate = s->nstate, .state = s->state,
	};
}

static void *writer_main(void *arg)
{
	struct rps__cplane *cp = arg;
	struct ckpt_state *ck = cp->ckpt;
	struct rps__ckpt_header h = {
		.member_id = cp->my_id, .npart = cp->map.npart, .shard_elems = cp->dp->shard_elems(cp->srv),
		.ckpt_id = ck->ckpt_id,
	};
	struct rps__dp_copy *cc = &ck->copy;
	struct rps__ckpt_writer *w = NULL;
	char label[4096];
	struct timespec ts;
	sigset_t all;
	uint32_t t, i;
	int ret, dfd;

	/* SIGTERM/SIGINT belong to the serving thread (rdmapsd blocks them
	 * there before tearing the server down): never run their handler here */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	clock_gettime(CLOCK_REALTIME, &ts);
	h.time_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	/* DIR/NAME, made as needed, never through a link */
	snprintf(label, sizeof(label), "%s/%s", ck->base, ck->name);
	dfd = rps__ckpt_name_open(ck->base_fd, ck->name, true);
	ret = dfd < 0 ? dfd : rps__ckpt_create_at(dfd, label, &h, ck->level, &w);
	if (dfd >= 0)
		close(dfd);
	for (t = 0; !ret && t < cc->ntensors; t++) {
		ret = rps__ckpt_put_tensor(w, cc->tensors[t].name, &cc->tensors[t].spec);
		for (i = 0; !ret && i < cc->nshards; i++)
			if (cc->shards[i].tensor == t) {
				struct rps__ckpt_shard fs = file_shard(&cc->shards[i].meta);
				ret = rps__ckpt_put_shard(w, &fs);
			}
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

void rps__ck_timers(struct rps__cplane *cp, uint64_t now)
{
	struct ckpt_state *ck = cp->ckpt;
	struct rps__ckpt_rep rep;
	int ret;

	if (!ck)
		return;
	if (ck->holding && !ck->taking && now >= ck->hold_until) {
		rps__log(RPS__LOG_WARN, "checkpoint: no TAKE within the hold timeout: training resumes");
		release_hold(cp);
	}
	if (ck->taking && cp->dp->hold_reached(cp->srv)) {
		uint64_t c0 = rps__now_ns();
		ck->taking = false;
		ret = cp->dp->take(cp->srv, &ck->copy);
		ck->raw_bytes += ck->copy.raw_bytes;
		ck->pause_ns = rps__now_ns() - ck->hold_start;
		rps__log(RPS__LOG_DEBUG, "checkpoint: held %.3f ms, copied in %.3f ms", (double)(c0 - ck->hold_start) / 1e6,
			 (double)(rps__now_ns() - c0) / 1e6);
		release_hold(cp);
		if (!ret) {
			ck->done = 0;
			ret = -pthread_create(&ck->thread, NULL, writer_main, cp);
		}
		if (ret) {
			free_copies(ck);
			if (ck->conn)
				reply(cp, ck->conn, ck->req_id, ret, NULL, NULL, 0, "checkpoint: out of memory copying the shards");
			ck->conn = NULL;
			return;
		}
		ck->writing = true;
		ck->have_result = false;
		rps__log(RPS__LOG_INFO, "checkpoint %llu: %u shards copied, training paused %.3f ms",
			 (unsigned long long)ck->ckpt_id, ck->copy.nshards, (double)ck->pause_ns / 1e6);
		memset(&rep, 0, sizeof(rep));
		rep.pause_ns = ck->pause_ns;
		rep.raw_bytes = ck->raw_bytes;
		rep.nshards = ck->copy.nshards;
		if (ck->conn)
			reply(cp, ck->conn, ck->req_id, 0, &rep, NULL, 0, NULL);
		ck->conn = NULL;
	}
	if (ck->writing && __atomic_load_n(&ck->done, __ATOMIC_ACQUIRE)) {
		pthread_join(ck->thread, NULL);
		ck->writing = false;
		memset(&rep, 0, sizeof(rep));
		rep.pause_ns = ck->pause_ns;
		rep.bytes = ck->bytes;
		rep.raw_bytes = ck->raw_bytes;
		rep.nshards = ck->copy.nshards;
		if (ck->result)
			rps__log(RPS__LOG_ERROR, "checkpoint %llu: %s", (unsigned long long)ck->ckpt_id, ck->msg);
		else
			rps__log(RPS__LOG_INFO, "checkpoint %llu: %llu bytes written to %s/%s",
				 (unsigned long long)ck->ckpt_id, (unsigned long long)ck->bytes, ck->base, ck->name);
		ck->have_result = true;
		if (ck->fin_conn)
			reply(cp, ck->fin_conn, ck->fin_req_id, ck->result, &rep, NULL, 0, ck->result ? ck->msg : NULL);
		ck->fin_conn = NULL;
		free_copies(ck);
	}
}

void rps__ck_conn_gone(struct rps__cplane *cp, struct srv_conn *c)
{
	if (cp->ckpt && cp->ckpt->conn == c)
		cp->ckpt->conn = NULL;	/* the work goes on; nobody to tell */
	if (cp->ckpt && cp->ckpt->fin_conn == c)
		cp->ckpt->fin_conn = NULL;
}

/* ---- restore ---------------------------------------------------------- */

/* One file: name in dfd (AT_FDCWD: file is a path), file its name in
 * messages. */
static int restore_file(struct rps__cplane *cp, int dfd, const char *name, const char *file, uint32_t *installed,
			uint64_t *seen, uint64_t *bytes)
{
	uint32_t shard_elems = cp->dp->shard_elems(cp->srv);
	struct rps__ckpt_reader *r;
	struct rps__ckpt_header h;
	struct rps__ckpt_item it;
	struct srv_tensor *t = NULL;
	int ret;

	ret = dfd == AT_FDCWD ? rps__ckpt_open(file, &r, &h) : rps__ckpt_open_at(dfd, name, file, &r, &h);
	if (ret)
		return ret;
	if (h.shard_elems != shard_elems) {
		rps__ckpt_close(r);
		return rps__seterr(-EINVAL, "%s: written with shards of %u bytes; this server uses %u: restore with the same --shard-size",
				   file, h.shard_elems * 4, shard_elems * 4);
	}
	while ((ret = rps__ckpt_next(r, &it)) > 0) {
		if (it.type == RPS__CKPT_TENSOR) {
			ret = cp->dp->restore_tensor(cp->srv, file, it.name, &it.spec, &t);
			if (ret)
				break;
			continue;
		}
		{
			const struct rps__ckpt_shard *cs = &it.shard;
			struct rps__dp_shard ds = {
				.index = cs->index, .elems = cs->elems, .version = cs->version,
				.min_clock = cs->min_clock, .ready = cs->flags & RPS__CKPT_SHARD_READY,
				.nclocks = cs->nclocks, .clocks = cs->clocks, .params = cs->params,
				.nstate = cs->nstate, .state = cs->state,
			};
			(*seen)++;
			*bytes += (uint64_t)cs->elems * 4;
			ret = cp->dp->restore_shard(cp->srv, file, t, &ds);
			if (ret < 0)
				break;
			*installed += (uint32_t)ret;
		}
	}
	rps__ckpt_close(r);
	return ret < 0 ? ret : 0;
}

/* Every member file of the directory dfd (AT_FDCWD: the path dir); dir
 * names it in messages. */
static int restore_dir(struct rps__cplane *cp, int dfd, const char *dir, uint32_t *installed, uint64_t *seen,
		       uint64_t *bytes)
{
	char **files = NULL, file[4096];
	size_t n = 0, i;
	int ret;

	*installed = 0;
	*seen = 0;
	*bytes = 0;
	ret = dfd == AT_FDCWD ? rps__ckpt_list(dir, &files, &n) : rps__ckpt_list_at(dfd, dir, &files, &n);
	if (ret)
		return ret;
	for (i = 0; i < n && !ret; i++) {
		if (dfd == AT_FDCWD) {
			ret = restore_file(cp, dfd, files[i], files[i], installed, seen, bytes);
		} else {
			snprintf(file, sizeof(file), "%s/%s", dir, files[i]);
			ret = restore_file(cp, dfd, files[i], file, installed, seen, bytes);
		}
	}
	rps__ckpt_free_list(files, n);
	if (!ret)
		rps__log(RPS__LOG_INFO, "restored %u of the %llu shards of %s (the rest belong to other servers)",
			 *installed, (unsigned long long)*seen, dir);
	return ret;
}

int rps__ck_restore(struct rps__cplane *cp, const char *dir, uint32_t *installed, uint64_t *seen, uint64_t *bytes)
{
	return restore_dir(cp, AT_FDCWD, dir, installed, seen, bytes);
}

/* psctl restore NAME: the checkpoint NAME under --checkpoint-dir. */
static int restore_name(struct rps__cplane *cp, const struct ckpt_state *ck, const char *name, uint32_t *installed,
			uint64_t *seen, uint64_t *bytes)
{
	char label[4096];
	int dfd, ret;

	*installed = 0;
	*seen = 0;
	*bytes = 0;
	ret = name_ok(ck, name);
	if (ret)
		return ret;
	dfd = rps__ckpt_name_open(ck->base_fd, name, false);
	if (dfd < 0)
		return dfd;
	snprintf(label, sizeof(label), "%s/%s", ck->base, name);
	ret = restore_dir(cp, dfd, label, installed, seen, bytes);
	close(dfd);
	return ret;
}

/* ---- requests ------------------------------------------------------------ */

/* PREPARE's and TAKE's first checks: a name this server may take and no
 * checkpoint under way.  True if refused (the refusal sent). */
static bool refused(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct ckpt_state *ck,
		    const struct rps__ckpt_req *req)
{
	int ret = name_ok(ck, req->name);

	if (ret) {
		reply(cp, c, req_id, ret, NULL, NULL, 0, rps__errbuf());
		return true;
	}
	if (ck->taking || ck->writing) {
		reply(cp, c, req_id, -EBUSY, NULL, NULL, 0, "a checkpoint is in progress on this server");
		return true;
	}
	return false;
}

/* PREPARE: hold every sync tensor at the step it reached here, and say
 * which steps those are. */
static void on_prepare(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, struct ckpt_state *ck,
		       const struct rps__ckpt_req *req)
{
	struct rps__ckpt_target *mine = NULL;
	struct rps__ckpt_rep rep;
	uint32_t i, n;

	memset(&rep, 0, sizeof(rep));
	if (refused(cp, c, req_id, ck, req))
		return;
	n = cp->dp->hold_steps(cp->srv, &mine);
	if (n * sizeof(*mine) + sizeof(rep) + sizeof(struct rps__msg_hdr) > cp->dp->conn_msg_max(c)) {
		free(mine);
		cp->dp->hold_release(cp->srv);	/* (serving threads hold as they answer) */
		reply(cp, c, req_id, -E2BIG, NULL, NULL, 0, "too many sync tensors for one reply");
		return;
	}
	/* hold each at what it reached here */
	for (i = 0; i < n; i++)
		cp->dp->hold_tensor(cp->srv, mine[i].name, mine[i].step);
	ck->holding = n > 0;	/* (nothing to hold: the pause is the copy) */
	ck->hold_start = rps__now_ns();
	ck->hold_until = ck->hold_start + (uint64_t)(req->timeout_ms ? req->timeout_ms : 30000) * 1000000ull;
	reply(cp, c, req_id, 0, &rep, mine, n, NULL);
	free(mine);
}

/* TAKE: hold at the targets, let lagging shards reach them, then copy
 * (rps__ck_timers answers once the copy is made). */
static void on_take(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, struct ckpt_state *ck,
		    const struct rps__ckpt_req *req, const struct rps__ckpt_target *tg)
{
	uint32_t i;

	if (refused(cp, c, req_id, ck, req))
		return;
	for (i = 0; i < req->ntargets; i++)
		if (memchr(tg[i].name, '\0', sizeof(tg[i].name)))
			cp->dp->hold_tensor(cp->srv, tg[i].name, tg[i].step);
	/* a sync tensor PREPARE did not see here (no shards then): as it is */
	if (!ck->holding)
		ck->hold_start = rps__now_ns();
	ck->holding = true;
	cp->dp->drain(cp->srv);	/* lagging shards may go on to the target */
	ck->taking = true;
	ck->conn = c;
	ck->req_id = req_id;
	ck->ckpt_id = req->ckpt_id;
	ck->level = (int)RPS__MIN(req->level, 3u);
	ck->raw_bytes = 0;
	{
		size_t len = strnlen(req->name, sizeof(ck->name) - 1);	/* (name_ok: it fits) */

		memcpy(ck->name, req->name, len);
		ck->name[len] = '\0';
	}
	rps__ck_timers(cp, rps__now_ns());
}

/* FINISH: answers once the file is durable (now, if it is). */
static void on_finish(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, struct ckpt_state *ck)
{
	struct rps__ckpt_rep rep;

	memset(&rep, 0, sizeof(rep));
	if (ck->writing) {
		ck->fin_conn = c;
		ck->fin_req_id = req_id;
		return;
	}
	if (!ck->have_result) {
		reply(cp, c, req_id, -ENOENT, NULL, NULL, 0, "no checkpoint was taken here");
		return;
	}
	rep.bytes = ck->bytes;
	rep.pause_ns = ck->pause_ns;
	rep.raw_bytes = ck->raw_bytes;
	reply(cp, c, req_id, ck->result, &rep, NULL, 0, ck->result ? ck->msg : NULL);
}

/* RESTORE: install what of the checkpoint this server serves. */
static void on_restore(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct ckpt_state *ck,
		       const struct rps__ckpt_req *req)
{
	struct rps__ckpt_rep rep;
	uint32_t installed;
	uint64_t seen, bytes;
	int ret = restore_name(cp, ck, req->name, &installed, &seen, &bytes);

	memset(&rep, 0, sizeof(rep));
	if (!ret)
		rps__cp_restored(cp);
	rep.nshards = installed;
	rep.seen_shards = seen;
	rep.bytes = bytes;
	reply(cp, c, req_id, ret, &rep, NULL, 0, ret ? rps__errbuf() : NULL);
}

void rps__ck_on_message(struct rps__cplane *cp, struct srv_conn *c, const struct rps__msg_hdr *h,
			const void *body, uint32_t body_len)
{
	const struct rps__ckpt_req *req = body;
	const struct rps__ckpt_target *tg = (const void *)((const char *)body + sizeof(*req));
	struct ckpt_state *ck = state(cp);

	(void)body_len;
	if (!ck) {
		reply(cp, c, h->req_id, -ENOMEM, NULL, NULL, 0, "out of memory");
		return;
	}
	switch (req->op) {
	case RPS__CKPT_PREPARE:
		on_prepare(cp, c, h->req_id, ck, req);
		return;
	case RPS__CKPT_TAKE:
		on_take(cp, c, h->req_id, ck, req, tg);
		return;
	case RPS__CKPT_FINISH:
		on_finish(cp, c, h->req_id, ck);
		return;
	case RPS__CKPT_ABORT:
		if (!ck->writing) {
			ck->taking = false;
			release_hold(cp);
		}
		reply(cp, c, h->req_id, 0, NULL, NULL, 0, NULL);
		return;
	case RPS__CKPT_RESTORE:
		on_restore(cp, c, h->req_id, ck, req);
		return;
	default:
		reply(cp, c, h->req_id, -EINVAL, NULL, NULL, 0, "unknown checkpoint operation");
	}
}

void rps__ck_fini(struct rps__cplane *cp)
{
	struct ckpt_state *ck = cp->ckpt;

	if (!ck)
		return;
	if (ck->writing)
		pthread_join(ck->thread, NULL);
	free_copies(ck);
	if (ck->base_fd >= 0)
		close(ck->base_fd);
	free(ck->base);
	free(ck);
	cp->ckpt = NULL;
}
