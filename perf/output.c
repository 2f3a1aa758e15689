/*
 * output.c - what psperf prints: the tables (one per test, then the raw
 * operations), CSV on stdout, and the JSON file perf/plot reads.
 */
#include "config.h"
#include "psperf_int.h"
#include "kernels/agg.h"
#include "proto/proto.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ---- output: tables ---------------------------------------------------------------------------- */

static bool show_raw(const struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (!psperf_in_process(r->rows[i].test) && r->rows[i].test != T_RESEED && (r->rows[i].raw_lat || r->rows[i].raw_bw))
			return true;
	return false;
}

/* push rows over verbs: the bare WRITE beside the WRITE_IMM ping-pong */
static bool show_ref(const struct run *r, enum test_id t)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (r->rows[i].test == t && r->rows[i].raw_ref)
			return true;
	return false;
}

static void fmt_num(char *buf, size_t len, double v, const char *fmt)
{
	if (isnan(v))
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, fmt, v);
}

static void print_header(const struct run *r, enum test_id t, bool raw, bool ref)
{
	const struct opts *o = r->o;
	char line[96];

	memset(line, '-', sizeof(line) - 1);
	line[sizeof(line) - 1] = '\0';
	printf("%s\n", line);
	switch (t) {
	case T_AGG:
		printf(" agg: rps__agg_add of %d %s gradients into an fp32 accumulator (%s code path), in-process\n",
		       r->W, rps__dtype_name(o->dtype), rps__agg_isa_name(rps__agg_best_isa()));
		printf(" BW = gradient bytes summed per second; raw = memcpy of the same bytes\n");
		break;
	case T_CRC:
		printf(" crc: CRC-32C (ISA-L crc32_iscsi, as checkpoint and log files use) of fp32\n"
		       " parameter-like data, in-process, one thread\n");
		printf(" BW = bytes checksummed per second; raw = memcpy of the same bytes\n");
		break;
	case T_IGZIP:
		printf(" igzip: ISA-L raw deflate, level 1 (isal_deflate_stateless, as checkpoint records use) of\n"
		       " fp32 parameter-like data (small normal-ish floats) and of zeros, in-process, one thread\n");
		printf(" BW = input bytes compressed per second; raw = memcpy of the same bytes;"
		       " ratio = input / output\n");
		break;
	case T_COMMIT:
		printf(" commit: ADMIN NOP to the Raft leader, answered once its log entry is applied (append to the\n"
		       " followers, their acks, commit, apply); %d voters, leader %llu, term %llu, fsync %s;\n"
		       " one admin connection, one call at a time.  admin round trip: STATUS on it (no log entry)\n",
		       r->commit_voters, (unsigned long long)r->commit_leader, (unsigned long long)r->commit_term,
		       r->commit_fsync < 0 ? "?" : r->commit_fsync ? "always" : "none");
		if (raw)
			printf(" raw: %s of the admin messages' sizes\n",
			       r->kind == RPS__KIND_VERBS ? "SEND ping-pong" : "socket request/response");
		break;
	case T_CONNECT:
		printf(" connect: an admin channel (connect, AUTH, its answer; then close) and a worker's client\n"
		       " (rps_client_connect + rps_client_close: fabric, buffers, handshake, HELLO, the shard map), to\n"
		       " a one-server cluster with a key and to one without, one connect at a time\n");
		break;
	case T_GROUP:
		printf(" group: rps_group_push of %d members of S bytes (one op), beside the same %d tensors pushed\n"
		       " one by one (%d rps_push calls an op); %s, %s, %d server(s), %d worker(s) at once.\n"
		       " tensors/s = %d x ops/s; x_sep = the group's tensors/s over the one-by-one pushes'\n",
		       o->group_n, o->group_n, o->group_n, psperf_mode_name(o->mode), rps__dtype_name(o->dtype),
		       r->nservers, r->W, o->group_n);
		break;
	case T_LOCK:
		printf(" lock: rps__tensor_lock + rps__tensor_unlock of shard 0 of an async tensor (RDMA CAS)\n");
		printf(" xN = N workers at once on the same lock; raw = %s\n",
		       r->kind == RPS__KIND_VERBS ? "CAS + completion" : "8-byte socket request/response");
		break;
	default:
		printf(" %s: %s, %s, %s; %d server(s), %d cop%s of each partition, %d worker(s) at once; window %d\n",
		       psperf_test_names[t], t == T_PUSH ? "rps_push" : t == T_PULL ? "rps_pull" : "rps_push + rps_pull",
		       psperf_mode_name(o->mode), rps__dtype_name(o->dtype), r->nservers, o->replicas,
		       o->replicas == 1 ? "y" : "ies", r->W, o->window);
		if (raw && ref)
			printf(" raw: RDMA WRITE_WITH_IMM of S bytes, a SEND of %zu back (PUSH_ACK's size); WRITE bw\n"
			       " ref: RDMA WRITE + completion\n",
			       sizeof(struct rps__msg_hdr) + sizeof(struct rps__push_ack));
		else if (raw)
			printf(" raw: %s\n", r->kind == RPS__KIND_VERBS
			       ? (t == T_PUSH ? "RDMA WRITE + completion; WRITE bw" : t == T_PULL ? "RDMA READ + completion; READ bw"
				  : "SEND ping-pong; WRITE bw")
			       : (t == T_PUSH ? "socket: S bytes there, 8 back; one-way stream of the same bytes"
				  : t == T_PULL ? "socket: 8 bytes there, S back; one-way stream"
				  : "socket: S bytes there, S back; one-way stream"));
		break;
	}
	if (o->role == ROLE_WORKER && !psperf_in_process(t) && t != T_COMMIT && t != T_CONNECT)
		printf(" figures of worker %d of %d only\n", o->rank, o->num_workers);
	printf("%s\n", line);
	printf(" %-*s %8s %10s %10s %10s %10s %11s %10s %11s",
	       t == T_COMMIT || t == T_CONNECT ? 22 : t == T_IGZIP ? 15 : t == T_GROUP ? 20 : 12,
	       t == T_LOCK || t == T_COMMIT || t == T_CONNECT ? "op" : "#bytes", "#iters",
	       "t_min[us]", "t_typ[us]", "t_avg[us]", "t_p99[us]", "t_p99.9[us]", "BW[GB/s]", "ops/s");
	if (t == T_PUSH || t == T_PUSHPULL)
		printf(" %6s", "tx/B");
	if (t == T_PUSH || t == T_PULL || t == T_PUSHPULL)
		printf(" %8s", "cpu_s/GB");
	if (raw)
		printf(" %10s %7s %10s %7s", "raw[us]", "x_lat", "raw[GB/s]", "x_bw");
	if (raw && ref)
		printf(" %10s %7s", "ref[us]", "x_ref");
	if (t == T_IGZIP)
		printf(" %8s", "ratio");
	if (t == T_GROUP)
		printf(" %11s %7s", "tensors/s", "x_sep");
	printf("\n");
}

static void print_row(const struct row *row, bool raw, bool ref)
{
	char first[32], b[4][32];
	const struct stats *s = &row->s_lat;
	bool no_bw = row->test == T_LOCK || row->test == T_COMMIT || row->test == T_CONNECT;
	int w = row->test == T_COMMIT || row->test == T_CONNECT ? 22 : row->test == T_IGZIP ? 15 :
		row->test == T_GROUP ? 20 : 12;

	if (row->label[0])
		snprintf(first, sizeof(first), "%s", row->label);
	else
		snprintf(first, sizeof(first), "%zu", row->bytes);
	if (!s->valid) {
		printf(" %-*s %8s   (%s)\n", w, first, "-", row->lock_alone ? "measured by worker 0" : "no samples");
		return;
	}
	fmt_num(b[0], sizeof(b[0]), no_bw ? NAN : row->s_bw.gbs, "%.3f");
	printf(" %-*s %8llu %10.2f %10.2f %10.2f %10.2f %11.2f %10s %11.0f", w, first, (unsigned long long)s->n, s->min,
	       s->typ, s->avg, s->p99, s->p999, b[0], no_bw ? s->ops : row->s_bw.ops);
	if (row->test == T_PUSH || row->test == T_PUSHPULL) {
		fmt_num(b[1], sizeof(b[1]), row->tx_per_byte, "%.3f");
		printf(" %6s", b[1]);
	}
	if (row->test == T_PUSH || row->test == T_PULL || row->test == T_PUSHPULL) {
		fmt_num(b[1], sizeof(b[1]), row->cpu_s_per_gb, "%.3f");
		printf(" %8s", b[1]);
	}
	if (raw) {
		fmt_num(b[1], sizeof(b[1]), row->raw_lat && row->raw_lat->st.valid ? row->raw_lat->st.typ : NAN, "%.2f");
		fmt_num(b[2], sizeof(b[2]), row->x_lat, "%.2f");
		fmt_num(b[3], sizeof(b[3]), row->raw_bw && row->raw_bw->st.valid && !no_bw
			? row->raw_bw->st.gbs : NAN, "%.3f");
		printf(" %10s %7s %10s", b[1], b[2], b[3]);
		fmt_num(b[0], sizeof(b[0]), row->x_bw, "%.2f");
		printf(" %7s", no_bw ? "-" : b[0]);
	}
	if (raw && ref) {
		fmt_num(b[1], sizeof(b[1]), row->raw_ref && row->raw_ref->st.valid ? row->raw_ref->st.typ : NAN, "%.2f");
		fmt_num(b[2], sizeof(b[2]), row->x_ref, "%.2f");
		printf(" %10s %7s", b[1], b[2]);
	}
	if (row->test == T_IGZIP)
		printf(" %8.2f", row->ratio);
	if (row->test == T_GROUP) {
		fmt_num(b[1], sizeof(b[1]), row->x_group, "%.1f");
		printf(" %11.0f %7s", s->ops * (row->moved / (double)row->bytes), row->group_separate ? "" : b[1]);
	}
	printf("\n");
}

/* reseed: times in ms, rates in MB/s (a raise takes seconds) */
static void print_reseed(const struct run *r)
{
	const struct opts *o = r->o;
	bool tcp = r->kind != RPS__KIND_VERBS;
	char line[120], b[6][32];
	size_t i;

	memset(line, '-', sizeof(line) - 1);
	line[sizeof(line) - 1] = '\0';
	printf("%s\n", line);
	printf(" reseed: psctl set-replicas %d on %d server(s) holding #bytes of fp32 parameters (from 1 copy),\n"
	       " timed from its commit until the leader's map shows %d copies of every partition; then\n"
	       " set-replicas 1 drops the backups again.  rate = #bytes * %d / t (MB/s = 1e6 B/s)\n",
	       o->replicas, o->nservers, o->replicas, o->replicas - 1);
	printf(" raw: %s\n", tcp ? "socket stream of the same bytes (x_bw); the tcp transport's READ (what a backup's"
	       " image READ takes), x_read" : "RDMA READ bw (what a backup's image READ takes)");
	printf("%s\n", line);
	printf(" %-12s %7s %6s %10s %10s %10s %11s %11s %9s", "#bytes", "#raises", "parts", "t_min[ms]", "t_typ[ms]",
	       "t_avg[ms]", "rate[MB/s]", "raw[MB/s]", "x_bw");
	if (tcp)
		printf(" %11s %9s", "read[MB/s]", "x_read");
	printf("\n");
	for (i = 0; i < r->nrows; i++) {
		const struct row *row = &r->rows[i];
		const struct stats *st = &row->s_lat;
		const struct raw_result *rd = row->raw_x[1];
		if (row->test != T_RESEED)
			continue;
		if (!st->valid) {
			printf(" %-12zu %7s   (not measured)\n", row->bytes, "-");
			continue;
		}
		fmt_num(b[0], sizeof(b[0]), row->raw_bw && row->raw_bw->st.valid ? row->raw_bw->st.gbs * 1e3 : NAN, "%.1f");
		fmt_num(b[1], sizeof(b[1]), row->x_bw, "%.3g");
		fmt_num(b[2], sizeof(b[2]), rd && rd->st.valid ? rd->st.gbs * 1e3 : NAN, "%.1f");
		fmt_num(b[3], sizeof(b[3]), rd && rd->st.valid && rd->st.gbs > 0 ? row->s_bw.gbs / rd->st.gbs : NAN, "%.3g");
		printf(" %-12zu %7llu %6u %10.1f %10.1f %10.1f %11.2f %11s %9s", row->bytes, (unsigned long long)st->n,
		       row->reseed_parts, st->min / 1e3, st->typ / 1e3, st->avg / 1e3, row->s_bw.gbs * 1e3, b[0], b[1]);
		if (tcp)
			printf(" %11s %9s", b[2], b[3]);
		printf("\n");
	}
}

static void raw_label(const struct raw_result *x, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s", x->transport_tcp ? "tcp-transport " : "", x->name);
}

static void print_raw_tables(const struct run *r)
{
	char name[80];
	int w = 32;
	size_t i;

	if (!r->nraws)
		return;
	for (i = 0; i < r->nraws; i++) {	/* the op column fits the longest name */
		raw_label(&r->raws[i], name, sizeof(name));
		w = RPS__MAX(w, (int)strlen(name));
	}
	printf("------------------------------------------------------------------------------------------------\n");
	printf(" baseline: raw operations on the same path (%s%s)\n", r->kind == RPS__KIND_VERBS ? "verbs, device " : "tcp",
	       r->kind == RPS__KIND_VERBS ? r->device : "");
	printf("------------------------------------------------------------------------------------------------\n");
	printf(" %-*s %8s %10s %10s %10s %10s %11s %10s %11s\n", w, "op", "#iters", "t_min[us]", "t_typ[us]",
	       "t_avg[us]", "t_p99[us]", "t_p99.9[us]", "BW[GB/s]", "ops/s");
	for (i = 0; i < r->nraws; i++) {
		const struct raw_result *x = &r->raws[i];
		raw_label(x, name, sizeof(name));
		if (!x->st.valid) {
			printf(" %-*s   (not measured)\n", w, name);
			continue;
		}
		printf(" %-*s %8llu %10.2f %10.2f %10.2f %10.2f %11.2f %10.3f %11.0f\n", w, name,
		       (unsigned long long)x->st.n, x->st.min, x->st.typ, x->st.avg, x->st.p99, x->st.p999, x->st.gbs,
		       x->st.ops);
	}
}

static void print_commit_ratio(struct run *r)
{
	const struct row *cr = psperf_plan_commit_row(r, false);
	char x[32];

	if (!cr)
		return;
	fmt_num(x, sizeof(x), cr->x_rtt, "%.2f");
	printf(" commit / admin round trip (t_typ): %s", x);
	if (cr->raw_lat && cr->raw_lat->st.valid) {
		fmt_num(x, sizeof(x), cr->x_lat, "%.2f");
		printf("; commit / raw %s (t_typ): %s", cr->raw_lat->name, x);
	}
	printf("\n");
	if (r->commit_sync.valid) {
		const struct stats *st = &r->commit_sync;

		printf(" fdatasync of a %zu B append beside the data dirs (a NOP's WAL batch), %llu times"
		       " between the NOPs: t_min %.2f  t_typ %.2f  t_p99 %.2f us\n", r->commit_sync_bytes,
		       (unsigned long long)st->n, st->min, st->typ, st->p99);
		fmt_num(x, sizeof(x), cr->s_lat.valid && st->typ > 0 ? cr->s_lat.typ / st->typ : NAN, "%.2f");
		printf(" commit / fdatasync (t_typ): %s\n", x);
	}
}

static void print_connect_ratio(struct run *r)
{
	const struct row *a = psperf_plan_connect_row(r, false, false), *w = psperf_plan_connect_row(r, false, true);
	char xa[32], xw[32];

	fmt_num(xa, sizeof(xa), a ? a->x_key : NAN, "%.2f");
	fmt_num(xw, sizeof(xw), w ? w->x_key : NAN, "%.2f");
	printf(" with a key / without (t_typ): admin %s, worker %s\n", xa, xw);
	if ((w = psperf_plan_connect_many_row(r))) {
		fmt_num(xw, sizeof(xw), w->x_many, "%.2f");
		printf(" a worker to %d servers / to one (t_typ): %s\n", w->connect_servers, xw);
	}
}

static void print_banner(const struct run *r)
{
	char host[256] = "", date[64];
	double load[3] = { 0, 0, 0 };
	time_t now = time(NULL);

	gethostname(host, sizeof(host) - 1);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	if (getloadavg(load, 3) < 0)
		load[0] = load[1] = load[2] = NAN;
	printf(" psperf %s (rdmaps %d.%d) on %s, %s: %s, device %s, %s; load %.2f %.2f %.2f\n", PACKAGE_VERSION,
	       RPS_VERSION_MAJOR, RPS_VERSION_MINOR, host, date, r->kind == RPS__KIND_VERBS ? "verbs" : "tcp",
	       r->device[0] ? r->device : "-", r->addr[0] ? r->addr : "-", load[0], load[1], load[2]);
}

static void print_tables(struct run *r)
{
	bool raw = show_raw(r), ref;
	int t;
	size_t i;

	print_banner(r);

	for (t = 0; t < T_NTESTS; t++) {
		bool any = false;
		for (i = 0; i < r->nrows; i++)
			any |= r->rows[i].test == (enum test_id)t;
		if (!any)
			continue;
		if (t == T_RESEED) {
			print_reseed(r);
			continue;
		}
		ref = show_ref(r, (enum test_id)t);
		print_header(r, (enum test_id)t, raw || psperf_in_process((enum test_id)t), ref);
		for (i = 0; i < r->nrows; i++)
			if (r->rows[i].test == (enum test_id)t)
				print_row(&r->rows[i], raw || psperf_in_process((enum test_id)t), ref);
		if (t == T_COMMIT)
			print_commit_ratio(r);
		if (t == T_CONNECT)
			print_connect_ratio(r);
	}
	print_raw_tables(r);
	printf("------------------------------------------------------------------------------------------------\n");
	fflush(stdout);
}

/* ---- output: CSV --------------------------------------------------------------------------------- */

static void csv_num(double v)
{
	if (isnan(v) || isinf(v))
		printf(",");
	else
		printf(",%.6g", v);
}

static void csv_stats(const struct stats *s)
{
	printf(",%llu", (unsigned long long)s->n);
	csv_num(s->valid ? s->min : NAN);
	csv_num(s->valid ? s->typ : NAN);
	csv_num(s->valid ? s->avg : NAN);
	csv_num(s->valid ? s->p99 : NAN);
	csv_num(s->valid ? s->p999 : NAN);
	csv_num(s->valid ? s->gbs : NAN);
	csv_num(s->valid ? s->ops : NAN);
}

static void print_csv(const struct run *r)
{
	size_t i;

	printf("test,label,bytes,moved_bytes,workers,iters,t_min_us,t_typ_us,t_avg_us,t_p99_us,t_p999_us,lat_gbs,lat_ops_s,"
	       "bw_iters,bw_t_min_us,bw_t_typ_us,bw_t_avg_us,bw_t_p99_us,bw_t_p999_us,bw_gbs,ops_s,"
	       "raw_lat_op,raw_t_typ_us,x_lat,raw_bw_op,raw_gbs,x_bw,tx_per_byte,raw_ref_op,raw_ref_t_typ_us,x_ref,"
	       "cpu_s_per_gb\n");
	for (i = 0; i < r->nrows; i++) {
		const struct row *row = &r->rows[i];
		printf("%s,%s,%zu,%.0f,%d", psperf_test_names[row->test], row->label, row->bytes, row->moved, row->workers);
		csv_stats(&row->s_lat);
		csv_stats(&row->s_bw);
		printf(",%s", row->raw_lat ? row->raw_lat->name : "");
		csv_num(row->raw_lat ? row->raw_lat->st.typ : NAN);
		csv_num(row->x_lat);
		printf(",%s", row->raw_bw ? row->raw_bw->name : "");
		csv_num(row->raw_bw ? row->raw_bw->st.gbs : NAN);
		csv_num(row->x_bw);
		csv_num(row->tx_per_byte);
		printf(",%s", row->raw_ref ? row->raw_ref->name : "");
		csv_num(row->raw_ref ? row->raw_ref->st.typ : NAN);
		csv_num(row->x_ref);
		csv_num(row->cpu_s_per_gb);
		printf("\n");
	}
	for (i = 0; i < r->nraws; i++) {
		const struct raw_result *x = &r->raws[i];
		printf("raw,%s%s,%zu,%zu,1", x->transport_tcp ? "tcp-transport " : "", x->name, x->a, x->b);
		csv_stats(&x->st);
		csv_stats(&x->st);
		printf(",,,,,,,,,,,\n");
	}
	fflush(stdout);
}

/* ---- output: JSON -------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static void json_num(FILE *f, double v)
{
	if (isnan(v) || isinf(v))
		fprintf(f, "null");
	else
		fprintf(f, "%.6g", v);
}

static void json_kv_str(FILE *f, const char *k, const char *v, bool comma)
{
	fprintf(f, "\"%s\": ", k);
	json_str(f, v);
	fprintf(f, comma ? ", " : "");
}

static void json_stats(FILE *f, const char *key, const struct stats *s)
{
	fprintf(f, "\"%s\": ", key);
	if (!s->valid) {
		fprintf(f, "null");
		return;
	}
	fprintf(f, "{\"n\": %llu, \"t_min_us\": ", (unsigned long long)s->n);
	json_num(f, s->min);
	fprintf(f, ", \"t_typical_us\": ");
	json_num(f, s->typ);
	fprintf(f, ", \"t_avg_us\": ");
	json_num(f, s->avg);
	fprintf(f, ", \"t_p99_us\": ");
	json_num(f, s->p99);
	fprintf(f, ", \"t_p999_us\": ");
	json_num(f, s->p999);
	fprintf(f, ", \"bw_gbs\": ");
	json_num(f, s->gbs);
	fprintf(f, ", \"ops_s\": ");
	json_num(f, s->ops);
	fprintf(f, "}");
}

static void json_raw(FILE *f, const char *key, const struct raw_result *x)
{
	fprintf(f, "\"%s\": ", key);
	if (!x) {
		fprintf(f, "null");
		return;
	}
	fprintf(f, "{");
	json_kv_str(f, "op", psperf_raw_op_name(x->op), true);
	json_kv_str(f, "name", x->name, true);
	fprintf(f, "\"a_bytes\": %zu, \"b_bytes\": %zu, \"iters\": %ld, \"count\": %ld, \"tcp_transport\": %s, ",
		x->a, x->b, x->iters, x->count, x->transport_tcp ? "true" : "false");
	json_stats(f, "stats", &x->st);
	fprintf(f, "}");
}

static void json_config(FILE *f, const struct run *r)
{
	const struct opts *o = r->o;
	struct utsname u;
	char host[256] = "", date[64], kern[600], ver[32];
	double load[3];
	time_t now = time(NULL);
	int i;

	gethostname(host, sizeof(host) - 1);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	if (uname(&u) == 0)
		snprintf(kern, sizeof(kern), "%s %s %s %s", u.sysname, u.release, u.version, u.machine);
	else
		snprintf(kern, sizeof(kern), "?");
	snprintf(ver, sizeof(ver), "%d.%d", RPS_VERSION_MAJOR, RPS_VERSION_MINOR);
	fprintf(f, "  \"config\": {");
	json_kv_str(f, "label", o->label ? o->label : "", true);
	json_kv_str(f, "host", host, true);
	json_kv_str(f, "date", date, true);
	json_kv_str(f, "kernel", kern, true);
	json_kv_str(f, "cpu", r->cpu, true);
	if (getloadavg(load, 3) == 3)
		fprintf(f, "\"loadavg\": [%.2f, %.2f, %.2f], \"ncpus\": %ld, ", load[0], load[1], load[2],
			sysconf(_SC_NPROCESSORS_ONLN));
	json_kv_str(f, "psperf_version", PACKAGE_VERSION, true);
	json_kv_str(f, "rdmaps_version", ver, true);
	json_kv_str(f, "role", o->role == ROLE_LOCAL ? "local" : "worker", true);
	json_kv_str(f, "transport", r->kind == RPS__KIND_VERBS ? "verbs" : "tcp", true);
	json_kv_str(f, "device", r->device, true);
	json_kv_str(f, "addr", r->addr, true);
	json_kv_str(f, "servers_uri", r->servers, true);
	fprintf(f, "\n    \"options\": {\"tests\": [");
	for (i = 0; i < T_NTESTS; i++)
		if (o->tests & (1u << i))
			fprintf(f, "%s\"%s\"", (o->tests & ((1u << i) - 1)) ? ", " : "", psperf_test_names[i]);
	fprintf(f, "], \"servers\": %d, \"replicas\": %d, \"workers\": %d, \"size_min\": %zu, \"size_max\": %zu, "
		"\"factor\": %u, \"iters\": %ld, \"warmup\": %ld, \"window\": %d, ",
		r->nservers, o->replicas, r->W, o->size_min, o->size_max, o->factor, o->iters, o->warmup,
		o->window);
	json_kv_str(f, "mode", psperf_mode_name(o->mode), true);
	fprintf(f, "\"staleness\": %u, ", o->staleness);
	json_kv_str(f, "dtype", rps__dtype_name(o->dtype), true);
	json_kv_str(f, "optimizer", psperf_optimizer_name(o->optimizer), true);
	fprintf(f, "\"shard_bytes\": %u, \"slots\": %u, \"spin_us\": %d, \"timeout_ms\": %d, \"baseline\": %s, "
		"\"rank\": %d, \"num_workers\": %d, ",
		o->shard_bytes, o->slots, o->spin_us, o->timeout_ms, o->baseline ? "true" : "false", o->rank,
		o->num_workers);
	json_kv_str(f, "tag", o->tag, true);
	json_kv_str(f, "fsync", o->fsync_none ? "none" : "always", true);
	fprintf(f, "\"partitions\": %u, ", o->partitions);
	if (r->commit_leader)
		fprintf(f, "\"commit_leader\": %llu, \"commit_term\": %llu, \"commit_voters\": %d, "
			"\"commit_fsync\": %s, ", (unsigned long long)r->commit_leader,
			(unsigned long long)r->commit_term, r->commit_voters, r->commit_fsync ? "true" : "false");
	if (r->commit_sync.valid)
		fprintf(f, "\"commit_fdatasync\": {\"bytes\": %zu, \"n\": %llu, \"t_min_us\": %.3f, "
			"\"t_typ_us\": %.3f, \"t_p99_us\": %.3f}, ", r->commit_sync_bytes,
			(unsigned long long)r->commit_sync.n, r->commit_sync.min, r->commit_sync.typ, r->commit_sync.p99);
	json_kv_str(f, "agg_isa", rps__agg_isa_name(rps__agg_best_isa()), false);
	fprintf(f, "},\n    \"argv\": [");
	for (i = 0; i < o->argc; i++) {
		if (i)
			fprintf(f, ", ");
		json_str(f, o->argv[i]);
	}
	fprintf(f, "]\n  },\n");
}

/* reseed: the rate and what it is shown beside, by name */
static void json_reseed(FILE *f, const struct row *row)
{
	const struct raw_result *rd = row->raw_x[1];

	fprintf(f, ",\n     \"reseed\": {\"seeded_bytes\": %.0f, \"partitions_seeded\": %u, \"raises\": %llu, "
		"\"t_typical_s\": ", row->moved, row->reseed_parts, (unsigned long long)row->s_lat.n);
	json_num(f, row->s_lat.valid ? row->s_lat.typ / 1e6 : NAN);
	fprintf(f, ", \"rate_gbs\": ");
	json_num(f, row->s_bw.valid ? row->s_bw.gbs : NAN);
	fprintf(f, ", \"raw_gbs\": ");
	json_num(f, row->raw_bw && row->raw_bw->st.valid ? row->raw_bw->st.gbs : NAN);
	fprintf(f, ", \"x_bw\": ");
	json_num(f, row->x_bw);
	fprintf(f, ",\n      ");
	json_raw(f, "raw_read_bandwidth", rd);
	fprintf(f, ", \"x_read\": ");
	json_num(f, rd && rd->st.valid && rd->st.gbs > 0 && row->s_bw.valid ? row->s_bw.gbs / rd->st.gbs : NAN);
	fprintf(f, "}");
}

static void json_row(FILE *f, const struct row *row)
{
	fprintf(f, "    {");
	json_kv_str(f, "test", psperf_test_names[row->test], true);
	json_kv_str(f, "label", row->label, true);
	fprintf(f, "\"bytes\": %zu, \"moved_bytes\": %.0f, \"workers\": %d, \"iters\": %ld, \"warmup\": %ld,\n     ",
		row->bytes, row->moved, row->workers, row->iters, row->warmup);
	json_stats(f, "latency", &row->s_lat);
	fprintf(f, ",\n     ");
	json_stats(f, "bandwidth", &row->s_bw);
	fprintf(f, ",\n     ");
	json_raw(f, "raw_latency", row->raw_lat);
	fprintf(f, ",\n     ");
	json_raw(f, "raw_bandwidth", row->raw_bw);
	if (row->raw_ref) {
		fprintf(f, ",\n     ");
		json_raw(f, "raw_reference", row->raw_ref);
	}
	fprintf(f, ",\n     \"x_lat\": ");
	json_num(f, row->x_lat);
	fprintf(f, ", \"x_bw\": ");
	json_num(f, row->x_bw);
	if (row->raw_ref) {
		fprintf(f, ", \"x_ref\": ");
		json_num(f, row->x_ref);
	}
	fprintf(f, ", \"tx_per_byte\": ");
	json_num(f, row->tx_per_byte);
	fprintf(f, ", \"cpu_s_per_gb\": ");
	json_num(f, row->cpu_s_per_gb);
	if (row->test == T_COMMIT && !row->commit_rtt) {
		fprintf(f, ", \"x_rtt\": ");
		json_num(f, row->x_rtt);
	}
	if (row->test == T_CONNECT && !row->connect_nokey && !row->connect_servers) {
		fprintf(f, ", \"x_key\": ");
		json_num(f, row->x_key);
	}
	if (row->test == T_CONNECT && row->connect_servers) {
		fprintf(f, ", \"servers\": %d, \"x_many\": ", row->connect_servers);
		json_num(f, row->x_many);
	}
	if (row->test == T_IGZIP) {
		fprintf(f, ", \"ratio\": ");
		json_num(f, row->ratio);
	}
	if (row->test == T_RESEED)
		json_reseed(f, row);
	if (row->test == T_GROUP) {
		fprintf(f, ", \"separate\": %s, \"x_sep\": ", row->group_separate ? "true" : "false");
		json_num(f, row->group_separate ? NAN : row->x_group);
	}
	fprintf(f, "}");
}

static int write_json(const struct run *r, const char *path)
{
	FILE *f = fopen(path, "w");
	size_t i;

	if (!f) {
		fprintf(stderr, "psperf: --json %s: %s: give a writable path\n", path, strerror(errno));
		return -errno;
	}
	fprintf(f, "{\n  \"format\": \"psperf-1\",\n");
	json_config(f, r);
	fprintf(f, "  \"rows\": [\n");
	for (i = 0; i < r->nrows; i++) {
		json_row(f, &r->rows[i]);
		fprintf(f, "%s\n", i + 1 < r->nrows ? "," : "");
	}
	fprintf(f, "  ],\n  \"baselines\": [\n");
	for (i = 0; i < r->nraws; i++) {
		fprintf(f, "    {");
		json_raw(f, "raw", &r->raws[i]);
		fprintf(f, "}%s\n", i + 1 < r->nraws ? "," : "");
	}
	fprintf(f, "  ]\n}\n");
	if (fclose(f)) {
		fprintf(stderr, "psperf: --json %s: %s\n", path, strerror(errno));
		return -EIO;
	}
	return 0;
}

/* Tables / CSV / JSON; returns the exit status. */
int psperf_report(struct run *r, int status)
{
	psperf_compute_figures(r);
	if (r->o->csv)
		print_csv(r);
	else
		print_tables(r);
	if (r->o->json && write_json(r, r->o->json))
		status = 1;
	return status;
}
