/*
 * baselines.c - --baseline: which raw operation each row compares with,
 * and worker 0's baseline session that measures them right after the row,
 * under the same load.
 */
#include "config.h"
#include "psperf_int.h"
#include "proto/proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- baselines: which, and running them -------------------------------------------------- */

const char *psperf_raw_op_name(enum raw_op op)
{
	switch (op) {
	case RAW_SOCK_RR: return "socket req/resp";
	case RAW_SOCK_STREAM: return "socket stream";
	case RAW_WRITE: return "WRITE";
	case RAW_READ: return "READ";
	case RAW_CAS: return "CAS";
	case RAW_SEND_PP: return "SEND ping-pong";
	case RAW_WRITE_IMM_PP: return "WRITE_IMM ping-pong";
	case RAW_WRITE_BW: return "WRITE bw";
	case RAW_READ_BW: return "READ bw";
	case RAW_MEMCPY: return "memcpy";
	default: return "-";
	}
}

static bool raw_is_transport(enum raw_op op)
{
	return op >= RAW_WRITE && op <= RAW_READ_BW;
}

struct raw_result *psperf_raw_add(struct run *r, enum raw_op op, size_t a, size_t b, long iters, long count)
{
	struct raw_result *x;
	size_t i;

	for (i = 0; i < r->nraws; i++) {
		x = &r->raws[i];
		if (x->op == op && x->a == a && x->b == b && x->iters == iters && x->count == count)
			return x;
	}
	if (!r->raws)
		r->raws = psperf_xcalloc(8 * (r->nrows + 8), sizeof(*r->raws));
	x = &r->raws[r->nraws++];
	memset(x, 0, sizeof(*x));
	x->op = op;
	x->a = a;
	x->b = b;
	x->iters = iters;
	x->count = count;
	x->is_bw = op == RAW_SOCK_STREAM || op == RAW_WRITE_BW || op == RAW_READ_BW;
	if (op == RAW_SOCK_RR)
		snprintf(x->name, sizeof(x->name), "socket %zu->%zu", a, b);
	else if (op == RAW_SEND_PP)
		snprintf(x->name, sizeof(x->name), "SEND ping-pong %zu", a);
	else if (op == RAW_WRITE_IMM_PP)
		snprintf(x->name, sizeof(x->name), "WRITE_IMM ping-pong %zu->%zu", a, b);
	else
		snprintf(x->name, sizeof(x->name), "%s %zu", psperf_raw_op_name(op), a);
	return x;
}

/* The raw ops that match a row: latency and bandwidth. */
static void raw_plan_row(struct run *r, struct row *row, bool transport)
{
	size_t P = psperf_pull_bytes(r->o, row), S = row->bytes;
	size_t ack = sizeof(struct rps__msg_hdr) + sizeof(struct rps__push_ack);
	long n = row->iters, total = row->iters * row->workers;

	switch (row->test) {
	case T_PUSH:
		/* the least a server-applied push takes: the gradient with an
		 * immediate that wakes the server, and its PUSH_ACK back; the
		 * bare WRITE beside it for reference */
		row->raw_lat = transport ? psperf_raw_add(r, RAW_WRITE_IMM_PP, S, ack, n, n)
					 : psperf_raw_add(r, RAW_SOCK_RR, S, 8, n, n);
		row->raw_ref = transport ? psperf_raw_add(r, RAW_WRITE, S, 0, n, n) : NULL;
		row->raw_bw = transport ? psperf_raw_add(r, RAW_WRITE_BW, S, 0, n, total)
					: psperf_raw_add(r, RAW_SOCK_STREAM, S, 0, n, total);
		break;
	case T_PULL:
		row->raw_lat = transport ? psperf_raw_add(r, RAW_READ, P, 0, n, n) : psperf_raw_add(r, RAW_SOCK_RR, 8, P, n, n);
		row->raw_bw = transport ? psperf_raw_add(r, RAW_READ_BW, P, 0, n, total)
					: psperf_raw_add(r, RAW_SOCK_STREAM, P, 0, n, total);
		break;
	case T_PUSHPULL:
		row->raw_lat = transport ? psperf_raw_add(r, RAW_SEND_PP, RPS__MAX(S, P), 0, n, n)
					 : psperf_raw_add(r, RAW_SOCK_RR, S, P, n, n);
		row->raw_bw = transport ? psperf_raw_add(r, RAW_WRITE_BW, S, 0, n, total)
					: psperf_raw_add(r, RAW_SOCK_STREAM, S, 0, n, total);
		break;
	case T_LOCK:
		row->raw_lat = transport ? psperf_raw_add(r, RAW_CAS, 8, 0, n, n) : psperf_raw_add(r, RAW_SOCK_RR, 8, 8, n, n);
		break;
	case T_COMMIT: {
		/* the admin request and reply: the same bytes, raw */
		size_t q = sizeof(struct rps__msg_hdr) + sizeof(struct rps__admin);
		size_t a = sizeof(struct rps__msg_hdr) + sizeof(struct rps__admin_rep);
		row->raw_lat = transport ? psperf_raw_add(r, RAW_SEND_PP, RPS__MAX(q, a), 0, n, n)
					 : psperf_raw_add(r, RAW_SOCK_RR, q, a, n, n);
		break;
	}
	default:
		break;
	}
}

static long raw_warmup(const struct run *r, const struct raw_result *x)
{
	return psperf_row_warmup(r->o, x->iters);
}

static int raw_run_socket(struct run *r, int fd, struct raw_result *x, char *buf)
{
	struct pass p = { { NULL, 0, 0 }, 0, 0, 0, 0 };
	int ret;

	ret = psperf_sock_run(fd, x, raw_warmup(r, x), &p, buf);
	if (!ret)
		psperf_stats_compute(&x->st, &p, x->op == RAW_SOCK_RR ? (double)(x->a + x->b) : (double)x->a);
	psperf_samples_free(&p.s);
	return ret;
}

static int raw_run_transport(struct run *r, struct rawt_session *s, struct raw_result *x)
{
	struct pass p = { { NULL, 0, 0 }, 0, 0, 0, 0 };
	int ret;

	ret = x->is_bw ? psperf_rawt_bw(s, x, &p) : psperf_rawt_lat(s, x, raw_warmup(r, x), &p);
	if (!ret)
		psperf_stats_compute(&x->st, &p, x->op == RAW_SEND_PP ? 2.0 * (double)x->a
					     : x->op == RAW_WRITE_IMM_PP ? (double)(x->a + x->b) : (double)x->a);
	psperf_samples_free(&p.s);
	return ret;
}

static size_t raw_max_bytes(const struct run *r, bool transport)
{
	size_t i, m = 64;

	for (i = 0; i < r->nraws; i++)
		if (raw_is_transport(r->raws[i].op) == transport && r->raws[i].op != RAW_MEMCPY)
			m = RPS__MAX(m, RPS__MAX(r->raws[i].a, r->raws[i].b));
	return m;
}

/* Over tcp with --raw-transport: the transport's own ops too, for
 * reference (row->raw_x; they do not enter the ratios). */
static void raw_plan_transport_extra(struct run *r, struct row *row)
{
	struct raw_result *keep_l = row->raw_lat, *keep_b = row->raw_bw, *keep_r = row->raw_ref;
	int i;

	raw_plan_row(r, row, true);
	row->raw_x[0] = row->raw_lat;
	row->raw_x[1] = row->raw_bw;
	row->raw_x[2] = row->raw_ref;
	row->raw_lat = keep_l;
	row->raw_bw = keep_b;
	row->raw_ref = keep_r;
	for (i = 0; i < 3; i++)
		if (row->raw_x[i])
			row->raw_x[i]->transport_tcp = true;
}

/* Decide every row's raw operations before the run (--baseline). */
void psperf_raw_plan_all(struct run *r)
{
	bool transport = r->kind == RPS__KIND_VERBS;
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		if (psperf_in_process(r->rows[i].test) || r->rows[i].test == T_RESEED || r->rows[i].test == T_GROUP)
			continue;	/* (reseed plans its own: reseed.c; group compares its two rows) */
		raw_plan_row(r, &r->rows[i], transport);
		if (!transport && r->o->raw_transport)
			raw_plan_transport_extra(r, &r->rows[i]);
	}
}

/* Worker 0's baseline session, open for the whole run, so that each row's
 * raw operations run right after the row (while the other workers wait at
 * the barrier): a ratio then compares figures taken under the same load. */
struct baseline {
	struct sock_peer peer;
	bool peer_started;
	int fd;
	char *buf;
	struct rawt_session rs;
	bool rs_open;
	bool failed;
};

static bool raw_is_socket(enum raw_op op)
{
	return op == RAW_SOCK_RR || op == RAW_SOCK_STREAM;
}

static void baseline_fail(struct run *r, struct baseline *b, const char *fmt, ...) RPS__PRINTF(3, 4);

static void baseline_fail(struct run *r, struct baseline *b, const char *fmt, ...)
{
	va_list ap;

	b->failed = true;
	if (r->base_err[0])
		return;
	va_start(ap, fmt);
	vsnprintf(r->base_err, sizeof(r->base_err), fmt, ap);
	va_end(ap);
}

static int baseline_open_socket(struct run *r, struct baseline *b)
{
	uint16_t port = r->sock_port;

	b->buf = psperf_xalloc_aligned(raw_max_bytes(r, false));
	if (!r->remote_peer) {
		b->peer.lfd = psperf_sock_listen(r->addr, 0, &b->peer.port);
		if (b->peer.lfd < 0) {
			baseline_fail(r, b, "socket baseline: listening on %s: %s", r->addr, strerror(-b->peer.lfd));
			return -1;
		}
		b->peer_started = pthread_create(&b->peer.thread, NULL, psperf_sock_peer_main, &b->peer) == 0;
		port = b->peer.port;
	}
	b->fd = psperf_sock_connect(r->addr, port);
	if (b->fd < 0) {
		baseline_fail(r, b, "socket baseline: connecting to %s port %u: %s%s", r->addr, port, strerror(-b->fd),
			      r->remote_peer ? ": run server 0 as psperf --server --baseline" : "");
		return -1;
	}
	return 0;
}

static int baseline_open(struct run *r, struct baseline *b)
{
	bool any_sock = false, any_t = false;
	size_t i;

	memset(b, 0, sizeof(*b));
	b->fd = -1;
	b->peer.lfd = -1;
	for (i = 0; i < r->nraws; i++) {
		any_sock |= raw_is_socket(r->raws[i].op);
		any_t |= raw_is_transport(r->raws[i].op);
	}
	if (any_sock && baseline_open_socket(r, b))
		return -1;
	if (any_t) {
		b->rs_open = true;
		if (psperf_rawt_session_open(r, &b->rs, r->kind, raw_max_bytes(r, true))) {
			baseline_fail(r, b, "%s transport baseline: %s%s", r->kind == RPS__KIND_VERBS ? "verbs" : "tcp",
				      rps__errbuf(),
				      r->remote_peer ? " (is server 0 running psperf --server --baseline?)" : "");
			return -1;
		}
	}
	return 0;
}

static void baseline_close(struct baseline *b)
{
	if (b->fd >= 0) {
		struct sock_cmd q = { SOCK_MAGIC, SOCKOP_QUIT, 0, 0, 0 };
		psperf_io_all(b->fd, &q, sizeof(q), true);
		close(b->fd);
	}
	if (b->peer_started)
		pthread_join(b->peer.thread, NULL);
	if (b->peer.lfd >= 0)
		close(b->peer.lfd);
	if (b->rs_open)
		psperf_rawt_session_close(&b->rs);
	free(b->buf);
	memset(b, 0, sizeof(*b));
	b->fd = -1;
	b->peer.lfd = -1;
}

static void baseline_one(struct run *r, struct baseline *b, struct raw_result *x)
{
	int ret;

	if (!x || x->st.valid || b->failed)
		return;
	if (raw_is_socket(x->op)) {
		ret = raw_run_socket(r, b->fd, x, b->buf);
		if (ret)
			baseline_fail(r, b, "socket baseline %s: %s", x->name, strerror(-ret));
		return;
	}
	ret = raw_run_transport(r, &b->rs, x);
	if (ret)
		baseline_fail(r, b, "%s transport baseline %s: %s", r->kind == RPS__KIND_VERBS ? "verbs" : "tcp", x->name,
			      rps__errbuf());
}

/* NULL when the session could not open (the failure is recorded). */
struct baseline *psperf_baseline_new(struct run *r)
{
	struct baseline *b = psperf_xcalloc(1, sizeof(*b));

	if (baseline_open(r, b)) {
		baseline_close(b);
		free(b);
		return NULL;
	}
	return b;
}

void psperf_baseline_free(struct baseline *b)
{
	if (!b)
		return;
	baseline_close(b);
	free(b);
}

/* The raw operations of one row that are not measured yet. */
void psperf_baseline_row(struct run *r, struct baseline *b, const struct row *row)
{
	if (!b)
		return;
	baseline_one(r, b, row->raw_lat);
	baseline_one(r, b, row->raw_ref);
	baseline_one(r, b, row->raw_bw);
	baseline_one(r, b, row->raw_x[0]);
	baseline_one(r, b, row->raw_x[2]);
	baseline_one(r, b, row->raw_x[1]);
}
