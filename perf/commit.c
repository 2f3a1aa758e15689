/*
 * commit.c - the commit test: the latency of one Raft log entry (ADMIN NOP
 * to the leader) against the STATUS round trip on the same admin
 * connection; in local mode on a cluster of its own with data dirs.
 */
#include "config.h"
#include "psperf_int.h"
#include "client/ctl.h"
#include "common/fsutil.h"
#include "proto/proto.h"
#include "proto/smap.h"
#include "control/raft.h"
#include "transport/uri.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COMMIT_SERVERS 3		/* commit test, local mode: a Raft group of three */

/* ---- commit: one Raft entry against the admin round trip --------------------------------------- */

#define COMMIT_POLL_MS 20		/* leader search: between rounds of STATUS */
#define COMMIT_RPC_MS 2000		/* leader search: one connect / STATUS at most */

/* Admin channels to every server of the cluster under test. */
struct commit_target {
	struct rps__uri *uris;
	int n;
	struct rps__ctl **ctl;	/* per server; NULL until opened */
	char *buf;		/* RPS__BIG_MSG_MAX: a STATUS reply */
	char name[300];		/* the leader's URI, for messages */
	int spin_us;		/* --spin-us for the admin connections */
};

static int ms_left(uint64_t deadline, int cap)
{
	uint64_t now = rps__now_ns();
	uint64_t ms = now >= deadline ? 1 : (deadline - now) / 1000000u + 1;

	return (int)RPS__MIN(ms, (uint64_t)cap);
}

/* STATUS to server i (connecting first if need be). */
static int commit_status(struct commit_target *t, int i, int timeout_ms, struct rps__status_rep *st)
{
	char name[300];
	size_t len = 0;
	int32_t status = 0;
	int ret;

	rps__uri_str(&t->uris[i], name, sizeof(name));
	if (!t->ctl[i]) {
		ret = rps__ctl_open(&t->uris[i], timeout_ms, &t->ctl[i]);
		if (ret) {
			t->ctl[i] = NULL;
			return ret;
		}
		rps__ctl_set_spin(t->ctl[i], t->spin_us);	/* --spin-us: like the workers */
	}
	ret = rps__ctl_call(t->ctl[i], RPS__MSG_STATUS, NULL, 0, t->buf, RPS__BIG_MSG_MAX, &len, &status, timeout_ms);
	if (ret == -ECONNRESET) {
		rps__ctl_close(t->ctl[i]);
		t->ctl[i] = NULL;
	}
	if (ret)
		return ret;
	if (status < 0)
		return rps__seterr(status, "%s: STATUS refused: %s", name, rps_strerror(status));
	if (len < sizeof(*st))
		return rps__seterr(-EBADMSG, "%s: STATUS reply of %zu bytes is too short: is it an rdmapsd of this release?",
				   name, len);
	memcpy(st, t->buf, sizeof(*st));
	return 0;
}

/* Poll STATUS on every server until one says it leads (the highest term
 * wins); its index, or < 0 with r->err set at the deadline. */
static int commit_find_leader(struct run *r, struct commit_target *t, uint64_t deadline, struct rps__status_rep *out)
{
	struct rps__status_rep st;
	char last[512] = "";
	int i, best;

	for (;;) {
		best = -1;
		for (i = 0; i < t->n; i++) {
			if (commit_status(t, i, ms_left(deadline, COMMIT_RPC_MS), &st)) {
				snprintf(last, sizeof(last), "%s", rps__errbuf());
				continue;
			}
			if (st.role == RPS__RAFT_LEADER && (best < 0 || st.term > out->term)) {
				best = i;
				*out = st;
			}
		}
		if (best >= 0) {
			rps__uri_str(&t->uris[best], t->name, sizeof(t->name));
			return best;
		}
		if (rps__now_ns() >= deadline)
			return psperf_run_fail(r, "commit: no server of %d reported itself leader within --timeout-ms %d%s%s",
					   t->n, r->o->timeout_ms, last[0] ? "; last error: " : " (an election in progress?)",
					   last);
		psperf_sleep_ms(COMMIT_POLL_MS);
	}
}

/* One ADMIN NOP: 0 when a reply came (*status says how it went). */
static int commit_nop(struct run *r, struct rps__ctl *ctl, int32_t *status, struct rps__admin_rep *rep)
{
	struct rps__admin a;
	size_t len = 0;
	int ret;

	memset(&a, 0, sizeof(a));
	a.op = RPS__ADMIN_NOP;
	a.timeout_ms = (uint32_t)r->o->timeout_ms;
	ret = rps__ctl_call(ctl, RPS__MSG_ADMIN, &a, sizeof(a), rep, sizeof(*rep), &len, status, r->o->timeout_ms + 5000);
	if (!ret && len < sizeof(*rep))
		memset(rep, 0, sizeof(*rep));
	rep->msg[sizeof(rep->msg) - 1] = '\0';
	return ret;
}

static void commit_progress(struct run *r, const struct row *row, int ph, long total)
{
	psperf_progress_set(r, (long)(row - r->rows), ph, total);
	psperf_progress_print(r);
}

static void commit_tick(struct run *r, long done)
{
	atomic_store_explicit(&r->prog_done, done, memory_order_relaxed);
	if ((done & 63) == 0)
		psperf_progress_print(r);
}

static void commit_label(struct run *r, struct row *cr, const struct rps__status_rep *st)
{
	r->commit_leader = st->id;
	r->commit_term = st->term;
	r->commit_voters = (int)st->n_voters;
	r->commit_fsync = st->fsync ? 1 : 0;
	snprintf(cr->label, sizeof(cr->label), "commit (fsync %s)", st->fsync ? "always" : "none");
}

/* Warm-up: NOPs until `want` have succeeded.  A leader fresh from its
 * election answers -EAGAIN until it has committed in its term; -EPERM:
 * leadership moved, find the new leader. */
static int commit_warmup(struct run *r, struct commit_target *t, int *L, long want, uint64_t deadline)
{
	struct row *cr = psperf_plan_commit_row(r, false);
	struct rps__status_rep st;
	struct rps__admin_rep rep;
	int32_t status;
	long done = 0;

	commit_progress(r, cr, 1, want);
	while (done < want) {
		if (commit_nop(r, t->ctl[*L], &status, &rep))
			return psperf_run_fail(r, "commit warm-up: ADMIN NOP to %s: %s", t->name, rps__errbuf());
		if (status == -EAGAIN || status == -EPERM) {
			if (rps__now_ns() >= deadline)
				return psperf_run_fail(r, "commit warm-up: %s kept answering %s to ADMIN NOP: %s", t->name,
						   rps_strerror(status), rep.msg[0] ? rep.msg : "no message");
			if (status == -EPERM) {
				*L = commit_find_leader(r, t, deadline, &st);
				if (*L < 0)
					return -EIO;
				commit_label(r, cr, &st);
			}
			psperf_sleep_ms(10);
			continue;
		}
		if (status)
			return psperf_run_fail(r, "commit warm-up: %s refused ADMIN NOP: %s", t->name,
					   rep.msg[0] ? rep.msg : rps_strerror(status));
		commit_tick(r, ++done);
	}
	return 0;
}

/* What one NOP adds to a server's WAL in one batch (the format at the top
 * of src/control/wal.c): its entry record (24-byte header, then term, index,
 * type and the encoded command, padded to 8 bytes) and a hard state record
 * (24 + 24) carrying the commit index of the entry before. */
static size_t nop_batch_bytes(void)
{
	struct rps__smap_cmd cmd;
	uint8_t buf[512];
	size_t len = 0;

	memset(&cmd, 0, sizeof(cmd));
	cmd.type = RPS__SMAP_NOP;
	if (rps__smap_cmd_encode(&cmd, buf, sizeof(buf), &len))
		len = 48;
	return 24 + RPS__ALIGN_UP(17 + len, 8) + 24 + 24;
}

/* The durable commit's yardstick: appends of a NOP's WAL batch to a file
 * beside the data dirs, each followed by fdatasync, one at a time (what
 * each server does once per entry).  Taken in blocks between blocks of
 * NOPs, so that both see the same disk (others' load on it comes and
 * goes).  Not fatal: a word and no figure if the file system refuses. */
struct sync_yardstick {
	int fd;
	char path[PATH_MAX];
	uint64_t off;
	size_t bytes;
	uint8_t buf[512];
	struct pass p;
	uint64_t spent;		/* ns taken between the NOPs */
};

#define SYNC_BLOCK 50		/* NOPs, then as many syncs */
#define SYNC_WARMUP 20

static int sync_one(struct sync_yardstick *y, bool keep)
{
	uint64_t t0 = rps__now_ns();

	if (pwrite(y->fd, y->buf, y->bytes, (off_t)y->off) != (ssize_t)y->bytes || fdatasync(y->fd)) {
		fprintf(stderr, "psperf: commit: fdatasync yardstick: %s: %s\n", y->path, strerror(errno));
		close(y->fd);
		unlink(y->path);
		y->fd = -1;
		return -1;
	}
	y->off += y->bytes;
	if (keep)
		psperf_samples_add(&y->p.s, rps__now_ns() - t0);
	y->spent += rps__now_ns() - t0;
	return 0;
}

static void sync_open(struct sync_yardstick *y, const char *root, long n)
{
	memset(y, 0, sizeof(*y));
	y->fd = -1;
	if (!root)
		return;
	y->bytes = nop_batch_bytes();
	memset(y->buf, 0x5a, sizeof(y->buf));
	snprintf(y->path, sizeof(y->path), "%s/fdatasync.bin", root);
	y->fd = open(y->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (y->fd < 0) {
		fprintf(stderr, "psperf: commit: fdatasync yardstick: %s: %s\n", y->path, strerror(errno));
		return;
	}
	psperf_samples_reserve(&y->p.s, (size_t)n);
	for (int i = 0; i < SYNC_WARMUP && y->fd >= 0; i++)
		sync_one(y, false);
	y->spent = 0;
}

static void sync_block(struct sync_yardstick *y, long k)
{
	for (long i = 0; i < k && y->fd >= 0; i++)
		sync_one(y, true);
}

static void sync_close(struct run *r, struct sync_yardstick *y)
{
	if (y->fd >= 0) {
		close(y->fd);
		unlink(y->path);
		if (y->p.s.n) {
			y->p.t0 = 0;
			y->p.t1 = y->spent;
			psperf_stats_compute(&r->commit_sync, &y->p, (double)y->bytes);
			r->commit_sync_bytes = y->bytes;
		}
	}
	psperf_samples_free(&y->p.s);
}

/* The timed passes: NOPs (each answered once its entry is applied, at a
 * log index past the previous one's; with sync_root, blocks of them between
 * blocks of the fdatasync yardstick), then STATUS round trips. */
static int commit_passes(struct run *r, struct rps__ctl *ctl, const char *name, char *buf, const char *sync_root)
{
	struct row *cr = psperf_plan_commit_row(r, false), *rr = psperf_plan_commit_row(r, true);
	struct rps__admin_rep rep;
	struct sync_yardstick y;
	uint64_t last = 0, t0;
	int32_t status;
	size_t len;
	long i;
	int ret;

	sync_open(&y, sync_root, cr->iters);
	commit_progress(r, cr, 2, cr->iters);
	psperf_samples_reserve(&cr->lat.s, (size_t)cr->iters);
	cr->lat.t0 = rps__now_ns();
	for (i = 0; i < cr->iters; i++) {
		if (i && i % SYNC_BLOCK == 0)
			sync_block(&y, SYNC_BLOCK);
		t0 = rps__now_ns();
		ret = commit_nop(r, ctl, &status, &rep);
		psperf_samples_add(&cr->lat.s, rps__now_ns() - t0);
		if (ret) {
			sync_close(r, &y);
			return psperf_run_fail(r, "commit %ld of %ld: ADMIN NOP to %s: %s", i + 1, cr->iters, name,
					   rps__errbuf());
		}
		if (status || rep.index <= last)
			sync_close(r, &y);
		if (status)
			return psperf_run_fail(r, "commit %ld of %ld: %s answered ADMIN NOP with %s: %s", i + 1, cr->iters,
					   name, rps_strerror(status), rep.msg[0] ? rep.msg : "no message");
		if (rep.index <= last)
			return psperf_run_fail(r, "commit %ld of %ld: %s answered at applied index %llu, not past the "
					   "previous NOP's %llu: a NOP was not committed", i + 1, cr->iters, name,
					   (unsigned long long)rep.index, (unsigned long long)last);
		last = rep.index;
		commit_tick(r, i + 1);
	}
	sync_block(&y, cr->iters - (long)y.p.s.n);
	cr->lat.t1 = rps__now_ns() - y.spent;	/* (ops/s: the NOPs' time alone) */
	sync_close(r, &y);
	commit_progress(r, rr, 1, rr->warmup + rr->iters);
	psperf_samples_reserve(&rr->lat.s, (size_t)rr->iters);
	for (i = -rr->warmup; i < rr->iters; i++) {
		if (i == 0)
			rr->lat.t0 = rps__now_ns();
		t0 = rps__now_ns();
		ret = rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, buf, RPS__BIG_MSG_MAX, &len, &status, 0);
		if (i >= 0)
			psperf_samples_add(&rr->lat.s, rps__now_ns() - t0);
		if (ret || status)
			return psperf_run_fail(r, "admin round trip %ld: STATUS to %s: %s", i + 1, name,
					   ret ? rps__errbuf() : rps_strerror(status));
		commit_tick(r, i + rr->warmup + 1);
	}
	rr->lat.t1 = rps__now_ns();
	return 0;
}

/* Find the leader of the cluster at list, warm up, time, and measure the
 * raw SEND/RECV baseline; r->err says what failed. */
int psperf_commit_measure(struct run *r, const char *list, const char *sync_root)
{
	struct row *cr = psperf_plan_commit_row(r, false);
	uint64_t deadline = rps__now_ns() + (uint64_t)r->o->timeout_ms * 1000000ull;
	struct commit_target t;
	struct rps__status_rep st;
	int i, L, ret;

	memset(&t, 0, sizeof(t));
	if (rps__uri_list_parse(list, &t.uris, &t.n))
		return psperf_run_fail(r, "commit: %s", rps__errbuf());
	t.ctl = psperf_xcalloc((size_t)t.n, sizeof(*t.ctl));
	t.spin_us = r->o->spin_us;
	t.buf = psperf_xalloc_aligned(RPS__BIG_MSG_MAX);
	commit_progress(r, cr, 0, 0);
	L = commit_find_leader(r, &t, deadline, &st);
	ret = L < 0 ? -EIO : 0;
	if (!ret) {
		commit_label(r, cr, &st);
		for (i = 0; i < t.n; i++)	/* only the leader's channel is used from here */
			if (i != L) {
				rps__ctl_close(t.ctl[i]);
				t.ctl[i] = NULL;
			}
		ret = commit_warmup(r, &t, &L, RPS__MAX(cr->warmup, 1L), deadline);
	}
	if (!ret)
		ret = commit_passes(r, t.ctl[L], t.name, t.buf, sync_root);
	psperf_progress_clear(r);
	for (i = 0; i < t.n; i++)
		rps__ctl_close(t.ctl[i]);
	free(t.ctl);
	free(t.buf);
	free(t.uris);
	if (!ret && r->o->baseline && cr->raw_lat) {
		struct baseline *b;
		commit_progress(r, cr, 4, 0);
		b = psperf_baseline_new(r);
		psperf_baseline_row(r, b, cr);
		psperf_baseline_free(b);
		psperf_progress_clear(r);
	}
	return ret;
}

/* The product's rps__remove_tree; a word when something is left behind. */
static void remove_tree(const char *dir)
{
	rps__remove_tree(dir);
	if (access(dir, F_OK) == 0)
		fprintf(stderr, "psperf: could not remove %s: remove it by hand\n", dir);
}

/* Local mode: a cluster of its own (3 servers, or --servers), each with a
 * data dir under $TMPDIR (default /tmp) and --fsync, removed after. */
int psperf_run_commit_local(struct run *r)
{
	struct lcluster *c = psperf_xcalloc(1, sizeof(*c));
	const char *tmp = getenv("TMPDIR");
	char root[PATH_MAX - 32];
	int n = r->o->nservers_set ? r->o->nservers : COMMIT_SERVERS;
	int i, ret;

	snprintf(root, sizeof(root), "%s/psperf-commit.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(root)) {
		ret = psperf_run_fail(r, "commit: mkdtemp %s: %s: set TMPDIR to a writable directory", root, strerror(errno));
		free(c);
		return ret;
	}
	for (i = 0; i < n; i++) {
		snprintf(c->dirs[i], sizeof(c->dirs[i]), "%s/s%d", root, i);
		if (mkdir(c->dirs[i], 0700)) {
			ret = psperf_run_fail(r, "commit: mkdir %s: %s", c->dirs[i], strerror(errno));
			remove_tree(root);
			free(c);
			return ret;
		}
	}
	if (!psperf_plan_has_cluster_rows(r))
		r->nservers = n;
	ret = psperf_cluster_start(r, c, n, r->commit_servers, sizeof(r->commit_servers));
	if (ret)
		psperf_run_fail(r, "commit: the cluster of %d servers could not start (see above)", n);
	else
		ret = psperf_commit_measure(r, r->commit_servers, r->o->baseline && !r->o->fsync_none ? root : NULL);
	if (!r->servers[0])
		snprintf(r->servers, sizeof(r->servers), "%s", r->commit_servers);
	psperf_cluster_destroy(c);
	if (psperf_cluster_errors(c) && !ret)
		ret = psperf_run_fail(r, "commit: a server stopped with an error (see above)");
	remove_tree(root);
	free(c);
	return ret;
}
