/*
 * options.c - psperf's command line: the usage text, option parsing and
 * checks, and (local mode) the transport and the RDMA device's address to
 * run on.
 */
#include "config.h"
#include "psperf_int.h"
#include "kernels/agg.h"
#include "common/parse.h"
#include "server/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

const char *const psperf_test_names[T_NTESTS] = { "push", "pull", "pushpull", "lock", "agg", "commit", "crc",
						  "igzip", "reseed", "group", "connect" };
/* all = the data-plane tests; commit and reseed (clusters of their own),
 * crc and igzip (checkpoint kernels, in-process) only when named */
#define DEFAULT_TESTS ((1u << T_COMMIT) - 1)

/* ---- usage ---------------------------------------------------------------- */

/* psperf --help, a section a function: the tests and what they vary */
static void usage_tests(FILE *f)
{
	fprintf(f,
"Tests:\n"
"  -t, --test LIST        comma-separated: push, pull, pushpull, lock, agg, commit,\n"
"                         crc, igzip, reseed, group, connect, or all (default all:\n"
"                         every test but commit, crc, igzip, reseed, group and\n"
"                         connect).  push:\n"
"                         rps_push of the gradient; pull: rps_pull of the\n"
"                         parameters; pushpull: one training step\n"
"                         (push then pull); lock: rps__tensor_lock + unlock of one\n"
"                         shard, by 1 worker alone and by all workers contending;\n"
"                         agg: rps__agg_add of W gradients into an fp32\n"
"                         accumulator vs memcpy of the same bytes (in-process);\n"
"                         commit: the latency of one Raft log entry (ADMIN NOP to\n"
"                         the leader: append to followers, acks, commit, apply)\n"
"                         against the STATUS round trip on the same admin\n"
"                         connection.  Local mode: a cluster of its own, 3 servers\n"
"                         (or --servers N) with data dirs in $TMPDIR or /tmp,\n"
"                         removed after; --connect: that cluster's leader.\n"
"                         crc: CRC-32C (ISA-L crc32_iscsi) of fp32 parameter-like\n"
"                         data vs memcpy of the same bytes; igzip: ISA-L raw\n"
"                         deflate, level 1, of fp32 parameter-like data (small\n"
"                         normal-ish floats) and of zeros, vs memcpy, with the\n"
"                         compression ratio (in-process, one thread: what a\n"
"                         checkpoint costs per byte)\n"
"                         connect: what the handshake costs: an admin channel and\n"
"                         a worker's client connected and closed, to a server\n"
"                         with a key and to one without (local mode, -n each,\n"
"                         default 200); with --servers N > 1, a worker's client\n"
"                         to N servers too, and its ratio to one\n"
"                         reseed: the re-replication rate.  Local mode, --servers\n"
"                         N >= 2, --replicas R >= 2, a cluster of its own: per\n"
"                         size S the cluster holds S bytes of fp32 parameters;\n"
"                         set-replicas R is timed from its commit until every\n"
"                         partition has R copies, then set-replicas 1 drops the\n"
"                         backups again (-n cycles per size, default 1).  Rate =\n"
"                         S * (R-1) / that time, beside the raw bandwidth of the\n"
"                         same path (tcp: socket stream and the tcp transport's\n"
"                         READ; verbs: RDMA READ), always measured\n"
"                         group: per size S, rps_group_push of a group of\n"
"                         --group N members of S bytes each, beside the same N\n"
"                         tensors pushed one by one (N rps_push calls); both\n"
"                         rows move N * S bytes an op, and the group row's\n"
"                         x_sep is its tensors per second over theirs\n"
"      --group N          members of the group test's group (default 256)\n"
"  -s, --size BYTES       one size (K, M suffixes: 4K, 1M; at most 64M)\n"
"  -S, --sweep MIN:MAX[:F]  every power of two from MIN to MAX, multiplying by F\n"
"                         (a power of two, default 2); default 4:1M:8\n"
"  -n, --iters N          timed iterations per row (default: 1000, fewer for big\n"
"                         sizes: about 256 MiB a pass, at least 20)\n"
"  -w, --warmup N         untimed iterations first (default iters/10, 2..100)\n"
"  -W, --window N         requests in flight per worker in the bandwidth pass\n"
"                         (default 8; 1 = no separate pass: bandwidth from the\n"
"                         latency pass)\n"
"  -m, --mode MODE        sync, bounded or async (default async: a push returns\n"
"                         once applied, so its latency is the push's own; in sync\n"
"                         mode every worker pushes every iteration; a push that\n"
"                         comes before its rank's turn is set aside).  The lock test\n"
"                         always uses an async tensor.\n"
"      --staleness K      bounded mode's k (default 4)\n"
"  -d, --dtype T          gradient type f32, bf16 or f16 (default f32)\n"
"      --optimizer O      sum, sgd, momentum or adam (default sum)\n"
"      --fsync always|none  commit test (and --server): sync the Raft log before\n"
"                         acknowledging an entry, or not (default always)\n"
"      --key FILE         the key every connection proves (default $RDMAPS_KEY_FILE;\n"
"                         the local cluster makes one for the run if none is given)\n"
"      --insecure         --server / --connect without a key beyond loopback\n"
"\n");
}

/* the local cluster, and separate processes or hosts */
static void usage_cluster(FILE *f)
{
	fprintf(f,
"Cluster (local mode):\n"
"      --servers N        in-process servers (default 1; commit: 3)\n"
"      --replicas R       copies of every partition, 1 to 3, on that many of\n"
"                         --servers (default 1): timing starts once the leader\n"
"                         placed and seeded every backup\n"
"      --partitions N     partitions of the local clusters, 1..256 (default 64)\n"
"      --workers N        worker threads, each its own client (default 2)\n"
"      --transport T      tcp or verbs (default verbs if a device is found)\n"
"      --device NAME      RDMA device (default: the first with an IPv4 address)\n"
"      --addr ADDR        address to listen on / reach the device by\n"
"                         (default: the device's address; tcp: 127.0.0.1)\n"
"      --shard-size BYTES parameter bytes per shard (default 1M)\n"
"      --slots N          staging slots per worker connection (default 8)\n"
"      --threads N        serving threads of each server (rdmapsd --threads;\n"
"                         default 1)\n"
"      --spin-us US       servers and workers busy-poll this long before\n"
"                         sleeping (default 0; perftest always busy-polls)\n"
"      --timeout-ms MS    give up on one operation after this (default 30000)\n"
"      --registered       workers push from and pull into buffers registered\n"
"                         with rps_buffer_register (zero-copy)\n"
"      --copy             workers copy every push to a staging slot and every\n"
"                         pull from a bounce buffer (the path before zero-copy;\n"
"                         by default tcp pushes from the caller's memory)\n"
"\n"
"Separate processes / hosts:\n"
"      --server           run one server until SIGINT/SIGTERM\n"
"      --listen URI       its address: tcp://HOST:PORT or verbs://ADDR:PORT\n"
"      --cluster LIST     every server's URI, same order everywhere\n"
"      --index I          this server's place in LIST (default: found by --listen)\n"
"      --connect LIST     run as one worker of that cluster (servers' URIs);\n"
"                         -t commit alone needs no --rank / --num-workers\n"
"      --rank R           this worker's rank, 0..N-1\n"
"      --num-workers N    workers taking part (all run psperf --connect with the\n"
"                         same test options; they start together with\n"
"                         rps_barrier; each prints its own figures)\n"
"      --tag STR          tensor name prefix (default psperf; use a new one for\n"
"                         each run against a long-running cluster)\n"
"\n");
}

/* the baseline, the output and the columns */
static void usage_output(FILE *f)
{
	fprintf(f,
"Baseline and output:\n"
"  -b, --baseline         also measure the raw transport on the same path and\n"
"                         print our figure / raw figure on every row.  tcp: plain\n"
"                         sockets (TCP_NODELAY): request/response of the same\n"
"                         sizes, and a one-way stream of the same bytes.  verbs:\n"
"                         RDMA WRITE, READ, CAS, SEND ping-pong and WRITE/READ\n"
"                         bandwidth through transport.h on the same device;\n"
"                         push: a WRITE_WITH_IMM answered by a SEND of the\n"
"                         PUSH_ACK's size (x_lat), and the WRITE (x_ref).\n"
"                         agg is always compared with memcpy.  commit: a SEND\n"
"                         ping-pong of the admin messages' sizes (tcp: socket\n"
"                         request/response).  With --connect,\n"
"                         worker 0 runs it against server 0, which must run\n"
"                         psperf --server --baseline (ports +1 and +2)\n"
"      --raw-transport    over tcp, also run the raw ops of the rdmaps tcp\n"
"                         transport (WRITE, READ, CAS, SEND, WRITE_IMM) for\n"
"                         reference\n"
"  -j, --json FILE        write every figure and the configuration as JSON\n"
"      --csv              CSV on stdout instead of the tables\n"
"      --label STR        name of this run in the JSON (perf/plot uses it)\n"
"  -q, --quiet            no progress line\n"
"  -h, --help             this text\n"
"  -V, --version          print the version\n"
"\n"
"Columns: #bytes (the --size of the row: gradient bytes), #iters (timed\n"
"operations, all workers), t_min / t_typ (median) / t_avg / t_p99 / t_p99.9 in\n"
"microseconds per blocking operation, BW (payload bytes moved per second, in\n"
"GB/s = 1e9 B/s, all workers), ops/s, tx/B (push rows: bytes our clients put\n"
"on the wire per gradient byte).  With --baseline: raw[us] (the raw op's\n"
"median), x_lat (our t_typ / raw t_typ: 1.0 is the wire, 2.0 twice as slow),\n"
"raw[GB/s], x_bw (our BW / raw BW: 1.0 is the wire, 0.5 half of it);\n"
"push over verbs also ref[us] (the bare WRITE) and x_ref (our t_typ / it).\n"
"The commit table ends with commit t_typ / admin round trip t_typ.\n"
"Progress goes to stderr when it is a terminal.  Exit status: 0 ok, 1 a test\n"
"failed, 2 bad usage.  See psperf(1).\n");
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: psperf [options]                         local cluster: servers + workers in this process\n"
"       psperf --server --listen URI [--cluster LIST --index I] [--baseline]\n"
"       psperf --connect LIST --rank R --num-workers N [options]\n"
"\n"
"Measures rdmaps the way perftest measures verbs.  With no option it starts\n"
"1 server and 2 workers on the best transport here (verbs if an RDMA device is\n"
"present, on that device's address; else TCP on 127.0.0.1), runs a short sweep\n"
"of every test and prints one table per test.\n"
"\n");
	usage_tests(f);
	usage_cluster(f);
	usage_output(f);
}

/* ---- option parsing ---------------------------------------------------------- */

static bool is_pow2(size_t x)
{
	return x && !(x & (x - 1));
}

static int parse_size(const char *s, size_t *out)
{
	uint64_t v;

	if (rps__parse_size("size", s, 0, SIZE_MAX, &v))
		return -EINVAL;
	*out = (size_t)v;
	return 0;
}

static long parse_long(const char *s, const char *what, long min, long max)
{
	uint64_t v;

	if (rps__parse_u64(what, s, (uint64_t)min, (uint64_t)max, &v))
		psperf_die_usage("%s", rps__errbuf());
	return (long)v;
}

static void parse_sweep(struct opts *o, const char *s)
{
	char buf[128], *a, *b, *c;
	size_t f = 2;

	snprintf(buf, sizeof(buf), "%s", s);
	a = buf;
	b = strchr(a, ':');
	if (!b)
		psperf_die_usage("--sweep '%s': expected MIN:MAX[:FACTOR], e.g. 4:64M", s);
	*b++ = '\0';
	c = strchr(b, ':');
	if (c)
		*c++ = '\0';
	if (parse_size(a, &o->size_min) || parse_size(b, &o->size_max) || (c && parse_size(c, &f)))
		psperf_die_usage("--sweep '%s': MIN, MAX and FACTOR are sizes such as 8, 4K, 1M", s);
	if (!is_pow2(o->size_min) || !is_pow2(o->size_max) || o->size_min > o->size_max)
		psperf_die_usage("--sweep '%s': MIN and MAX must be powers of two, MIN <= MAX", s);
	if (!is_pow2(f) || f < 2 || f > (1u << 20))
		psperf_die_usage("--sweep '%s': FACTOR must be a power of two >= 2", s);
	o->factor = (unsigned)f;
}

static unsigned parse_tests(const char *s)
{
	char buf[256], *tok, *save = NULL;
	unsigned mask = 0;
	int i;

	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcasecmp(tok, "all")) {
			mask |= DEFAULT_TESTS;
			continue;
		}
		for (i = 0; i < T_NTESTS; i++)
			if (!strcasecmp(tok, psperf_test_names[i]))
				break;
		if (i == T_NTESTS)
			psperf_die_usage("--test: unknown test '%s' (push, pull, pushpull, lock, agg, commit, crc, igzip,"
				  " reseed, group, all)", tok);
		mask |= 1u << i;
	}
	if (!mask)
		psperf_die_usage("--test: give at least one test");
	return mask;
}

static enum rps_mode parse_mode(const char *s)
{
	if (!strcasecmp(s, "sync") || !strcasecmp(s, "bsp"))
		return RPS_MODE_SYNC;
	if (!strcasecmp(s, "bounded") || !strcasecmp(s, "ssp"))
		return RPS_MODE_BOUNDED;
	if (!strcasecmp(s, "async") || !strcasecmp(s, "asp"))
		return RPS_MODE_ASYNC;
	psperf_die_usage("--mode: say sync, bounded or async, not '%s'", s);
	return RPS_MODE_ASYNC;
}

static enum rps_optimizer parse_optimizer(const char *s)
{
	static const char *const names[] = { "sum", "sgd", "momentum", "adam" };
	int i;

	for (i = 0; i < 4; i++)
		if (!strcasecmp(s, names[i]))
			return (enum rps_optimizer)(RPS_OPT_SUM + i);
	psperf_die_usage("--optimizer: say sum, sgd, momentum or adam, not '%s'", s);
	return RPS_OPT_SUM;
}

const char *psperf_mode_name(enum rps_mode m)
{
	return m == RPS_MODE_SYNC ? "sync" : m == RPS_MODE_BOUNDED ? "bounded" : "async";
}

const char *psperf_optimizer_name(enum rps_optimizer p)
{
	static const char *const names[] = { "sum", "sgd", "momentum", "adam" };

	return p >= RPS_OPT_SUM && p <= RPS_OPT_ADAM ? names[p - RPS_OPT_SUM] : "?";
}

static void opts_init(struct opts *o, int argc, char **argv)
{
	memset(o, 0, sizeof(*o));
	o->role = ROLE_LOCAL;
	o->tests = DEFAULT_TESTS;
	o->nservers = 1;
	o->replicas = 1;
	o->nworkers = 2;
	o->size_min = 4;
	o->size_max = 1u << 20;
	o->factor = 8;
	o->iters = -1;
	o->warmup = -1;
	o->window = 8;
	o->mode = RPS_MODE_ASYNC;
	o->staleness = 4;
	o->dtype = RPS_DTYPE_F32;
	o->optimizer = RPS_OPT_SUM;
	o->kind = RPS__KIND_TCP;
	o->tag = "psperf";
	o->index = -1;
	o->rank = -1;
	o->num_workers = -1;
	o->shard_bytes = 1u << 20;
	o->slots = 8;
	o->timeout_ms = 30000;
	o->group_n = 256;
	o->argc = argc;
	o->argv = argv;
}

enum {
	OPT_STALENESS = 256, OPT_OPTIMIZER, OPT_REPLICAS, OPT_SERVERS, OPT_WORKERS, OPT_TRANSPORT,
	OPT_DEVICE, OPT_ADDR, OPT_SHARD, OPT_SLOTS, OPT_SPIN, OPT_THREADS, OPT_TIMEOUT, OPT_SERVER,
	OPT_LISTEN, OPT_CLUSTER, OPT_INDEX, OPT_CONNECT, OPT_RANK, OPT_NUMW, OPT_TAG,
	OPT_KEY, OPT_INSECURE, OPT_RAWT, OPT_CSV, OPT_LABEL, OPT_FSYNC, OPT_PARTITIONS, OPT_REGISTERED, OPT_COPY, OPT_GROUP,
};

static const struct option longopts[] = {
	{ "test", required_argument, NULL, 't' },
	{ "size", required_argument, NULL, 's' },
	{ "sweep", required_argument, NULL, 'S' },
	{ "iters", required_argument, NULL, 'n' },
	{ "warmup", required_argument, NULL, 'w' },
	{ "window", required_argument, NULL, 'W' },
	{ "mode", required_argument, NULL, 'm' },
	{ "staleness", required_argument, NULL, OPT_STALENESS },
	{ "dtype", required_argument, NULL, 'd' },
	{ "optimizer", required_argument, NULL, OPT_OPTIMIZER },
	{ "servers", required_argument, NULL, OPT_SERVERS },
	{ "replicas", required_argument, NULL, OPT_REPLICAS },
	{ "partitions", required_argument, NULL, OPT_PARTITIONS },
	{ "workers", required_argument, NULL, OPT_WORKERS },
	{ "transport", required_argument, NULL, OPT_TRANSPORT },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "addr", required_argument, NULL, OPT_ADDR },
	{ "shard-size", required_argument, NULL, OPT_SHARD },
	{ "slots", required_argument, NULL, OPT_SLOTS },
	{ "threads", required_argument, NULL, OPT_THREADS },
	{ "spin-us", required_argument, NULL, OPT_SPIN },
	{ "timeout-ms", required_argument, NULL, OPT_TIMEOUT },
	{ "server", no_argument, NULL, OPT_SERVER },
	{ "listen", required_argument, NULL, OPT_LISTEN },
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "index", required_argument, NULL, OPT_INDEX },
	{ "connect", required_argument, NULL, OPT_CONNECT },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "num-workers", required_argument, NULL, OPT_NUMW },
	{ "tag", required_argument, NULL, OPT_TAG },
	{ "baseline", no_argument, NULL, 'b' },
	{ "raw-transport", no_argument, NULL, OPT_RAWT },
	{ "registered", no_argument, NULL, OPT_REGISTERED },
	{ "copy", no_argument, NULL, OPT_COPY },
	{ "group", required_argument, NULL, OPT_GROUP },
	{ "json", required_argument, NULL, 'j' },
	{ "csv", no_argument, NULL, OPT_CSV },
	{ "label", required_argument, NULL, OPT_LABEL },
	{ "fsync", required_argument, NULL, OPT_FSYNC },
	{ "key", required_argument, NULL, OPT_KEY },
	{ "insecure", no_argument, NULL, OPT_INSECURE },
	{ "quiet", no_argument, NULL, 'q' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

static void parse_one_size(struct opts *o, const char *arg)
{
	size_t sz;

	if (parse_size(arg, &sz) || !sz)
		psperf_die_usage("--size '%s': expected a size such as 8, 4K or 1M", arg);
	o->size_min = o->size_max = sz;
	o->factor = 2;
}

static void parse_transport(struct opts *o, const char *arg)
{
	if (!strcasecmp(arg, "tcp"))
		o->kind = RPS__KIND_TCP;
	else if (!strcasecmp(arg, "verbs") || !strcasecmp(arg, "rdma"))
		o->kind = RPS__KIND_VERBS;
	else
		psperf_die_usage("--transport: say tcp or verbs, not '%s'", arg);
	o->kind_set = true;
}

static void parse_option(struct opts *o, int c, const char *arg)
{
	size_t sz;

	switch (c) {
	case 't': o->tests = parse_tests(arg); break;
	case 's': parse_one_size(o, arg); break;
	case OPT_KEY: setenv("RDMAPS_KEY_FILE", arg, 1); break;	/* (servers and library read it there) */
	case OPT_INSECURE: setenv("RDMAPS_INSECURE", "1", 1); break;
	case 'S': parse_sweep(o, arg); break;
	case 'n': o->iters = parse_long(arg, "--iters", 1, 100000000); break;
	case 'w': o->warmup = parse_long(arg, "--warmup", 0, 100000000); break;
	case 'W': o->window = (int)parse_long(arg, "--window", 1, 1024); break;
	case OPT_GROUP: o->group_n = (int)parse_long(arg, "--group", 1, 65536); break;
	case 'm': o->mode = parse_mode(arg); break;
	case OPT_STALENESS: o->staleness = (uint32_t)parse_long(arg, "--staleness", 0, 1000000); break;
	case 'd':
		if (rps__dtype_parse(arg, &o->dtype))
			psperf_die_usage("--dtype: say f32, bf16 or f16, not '%s'", arg);
		break;
	case OPT_OPTIMIZER: o->optimizer = parse_optimizer(arg); break;
	case OPT_SERVERS:
		o->nservers = (int)parse_long(arg, "--servers", 1, MAX_LOCAL);
		o->nservers_set = true;
		break;
	case OPT_REPLICAS: o->replicas = (int)parse_long(arg, "--replicas", 1, 3); break;
	case OPT_PARTITIONS: o->partitions = (uint32_t)parse_long(arg, "--partitions", 1, 256); break;
	case OPT_WORKERS: o->nworkers = (int)parse_long(arg, "--workers", 1, MAX_LOCAL); break;
	case OPT_TRANSPORT: parse_transport(o, arg); break;
	case OPT_DEVICE: o->device = arg; break;
	case OPT_ADDR: o->addr = arg; break;
	case OPT_SHARD:
		if (parse_size(arg, &sz) || sz < 64 || sz % 4 || sz > (1u << 30))
			psperf_die_usage("--shard-size '%s': a multiple of 4 between 64 and 1G", arg);
		o->shard_bytes = (uint32_t)sz;
		break;
	case OPT_SLOTS: o->slots = (uint32_t)parse_long(arg, "--slots", 1, 1024); break;
	case OPT_SPIN: o->spin_us = (int)parse_long(arg, "--spin-us", 0, RPS__SERVER_SPIN_US_MAX); break;
	case OPT_THREADS: o->threads = (uint32_t)parse_long(arg, "--threads", 1, RPS__SERVER_THREADS_MAX); break;
	case OPT_TIMEOUT: o->timeout_ms = (int)parse_long(arg, "--timeout-ms", 1, 3600000); break;
	case OPT_SERVER: o->role = ROLE_SERVER; break;
	case OPT_LISTEN: o->listen = arg; break;
	case OPT_CLUSTER: o->cluster = arg; break;
	case OPT_INDEX: o->index = (int)parse_long(arg, "--index", 0, 4096); break;
	case OPT_CONNECT: o->connect = arg; o->role = ROLE_WORKER; break;
	case OPT_RANK: o->rank = (int)parse_long(arg, "--rank", 0, 1000000); break;
	case OPT_NUMW: o->num_workers = (int)parse_long(arg, "--num-workers", 1, 1000000); break;
	case OPT_TAG: o->tag = arg; break;
	case 'b': o->baseline = true; break;
	case OPT_RAWT: o->raw_transport = true; break;
	case OPT_REGISTERED: o->zcopy = 1; break;
	case OPT_COPY: o->zcopy = -1; break;
	case 'j': o->json = arg; break;
	case OPT_CSV: o->csv = true; break;
	case OPT_LABEL: o->label = arg; break;
	case OPT_FSYNC:
		if (!strcasecmp(arg, "always"))
			o->fsync_none = false;
		else if (!strcasecmp(arg, "none"))
			o->fsync_none = true;
		else
			psperf_die_usage("--fsync: say always or none, not '%s'", arg);
		break;
	case 'q': o->quiet = true; break;
	default: break;
	}
}

static void check_sizes(const struct opts *o)
{
	size_t dt = rps__dtype_size(o->dtype);

	if (o->size_max > MAX_BYTES)
		psperf_die_usage("sizes are at most 64M (%zu asked)", o->size_max);
	if (o->size_min < dt || o->size_min % dt)
		psperf_die_usage("--size/--sweep: %zu bytes is not a whole number of %s elements (%zu bytes each)",
			  o->size_min, rps__dtype_name(o->dtype), dt);
}

static void check_roles(struct opts *o)
{
	if (o->role == ROLE_SERVER && !o->listen)
		psperf_die_usage("--server needs --listen tcp://HOST:PORT or verbs://ADDR:PORT");
	if (o->role == ROLE_SERVER && o->connect)
		psperf_die_usage("--server and --connect exclude each other");
	if (o->role != ROLE_WORKER && (o->rank >= 0 || o->num_workers > 0))
		psperf_die_usage("--rank and --num-workers go with --connect (local mode: --workers N)");
	if (o->role != ROLE_SERVER && (o->listen || o->cluster || o->index >= 0))
		psperf_die_usage("--listen, --cluster and --index go with --server");
	if (o->role == ROLE_WORKER && o->tests == (1u << T_COMMIT) && o->rank < 0 && o->num_workers < 1) {
		o->rank = 0;	/* the commit test alone: one admin client, no workers */
		o->num_workers = 1;
	}
	if (o->role == ROLE_WORKER) {
		if (o->rank < 0 || o->num_workers < 1)
			psperf_die_usage("--connect needs --rank R and --num-workers N");
		if (o->rank >= o->num_workers)
			psperf_die_usage("--rank %d is not below --num-workers %d", o->rank, o->num_workers);
	}
	if (o->replicas > 1 && (o->role != ROLE_LOCAL || o->nservers < o->replicas))
		psperf_die_usage("--replicas %d needs local mode with --servers %d or more", o->replicas, o->replicas);
	if ((o->tests & (1u << T_RESEED)) && (o->role != ROLE_LOCAL || o->nservers < 2 || o->replicas < 2))
		psperf_die_usage("-t reseed needs local mode with --servers 2 or more and --replicas 2 or 3 "
				 "(e.g. --servers 2 --replicas 2)");
	if ((o->tests & (1u << T_CONNECT)) && o->role != ROLE_LOCAL)
		psperf_die_usage("-t connect needs local mode (it starts the servers it connects to)");
	if ((o->tests & (1u << T_RESEED)) && o->size_min < 4)
		psperf_die_usage("-t reseed: sizes are fp32 parameter bytes, 4 or more");
	if (o->partitions && o->role != ROLE_LOCAL)
		psperf_die_usage("--partitions goes with local mode (rdmapsd --partitions for a cluster of your own)");
	if (strlen(o->tag) > 24)
		psperf_die_usage("--tag '%s': at most 24 characters", o->tag);
}

void psperf_parse_args(struct opts *o, int argc, char **argv)
{
	int c;

	opts_init(o, argc, argv);
	while ((c = getopt_long(argc, argv, "t:s:S:n:w:W:m:d:bj:qhV", longopts, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			exit(0);
		}
		if (c == 'V') {
			printf("psperf %s (rdmaps %d.%d)\n", PACKAGE_VERSION, RPS_VERSION_MAJOR, RPS_VERSION_MINOR);
			exit(0);
		}
		if (c == '?' || c == ':')
			psperf_die_usage("bad option");
		parse_option(o, c, optarg);
	}
	if (optind < argc)
		psperf_die_usage("unexpected argument '%s'", argv[optind]);
	check_sizes(o);
	check_roles(o);
}

/* ---- finding the RDMA device's address ------------------------------------------ */

static bool read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	bool ok;

	if (!f)
		return false;
	ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok && buf[0];
}

static bool netdev_ipv4(const char *ifname, char *addr, size_t len)
{
	struct ifaddrs *ifa, *p;
	bool found = false;

	if (getifaddrs(&ifa))
		return false;
	for (p = ifa; p && !found; p = p->ifa_next) {
		if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET || strcmp(p->ifa_name, ifname))
			continue;
		found = inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)p->ifa_addr)->sin_addr, addr,
				  (socklen_t)len) != NULL;
	}
	freeifaddrs(ifa);
	return found;
}

/* The net device of an RDMA device: RoCE/rxe through its GID table, IPoIB
 * through /sys/class/net/X/device/infiniband/DEV. */
static bool rdma_netdev(const char *dev, char *ifname, size_t len)
{
	char path[1024];
	struct dirent *e;
	DIR *d;
	int i;

	for (i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/%d", dev, i);
		if (read_line(path, ifname, len))
			return true;
	}
	d = opendir("/sys/class/net");
	if (!d)
		return false;
	while ((e = readdir(d))) {
		snprintf(path, sizeof(path), "/sys/class/net/%.255s/device/infiniband/%.255s", e->d_name, dev);
		if (e->d_name[0] != '.' && access(path, F_OK) == 0) {
			snprintf(ifname, len, "%.63s", e->d_name);
			closedir(d);
			return true;
		}
	}
	closedir(d);
	return false;
}

/* First RDMA device (or `want`) with an IPv4 address. */
static bool rdma_device_addr(const char *want, char *dev, size_t dlen, char *addr, size_t alen)
{
	char ifname[64];
	struct dirent *e;
	bool found = false;
	DIR *d = opendir("/sys/class/infiniband");

	if (!d)
		return false;
	while (!found && (e = readdir(d))) {
		if (e->d_name[0] == '.' || (want && strcmp(want, e->d_name)))
			continue;
		if (rdma_netdev(e->d_name, ifname, sizeof(ifname)) && netdev_ipv4(ifname, addr, alen)) {
			snprintf(dev, dlen, "%.63s", e->d_name);
			found = true;
		}
	}
	closedir(d);
	return found;
}

/* Local mode: pick the transport and the address to run on. */
int psperf_choose_fabric(struct run *r)
{
	struct opts *o = r->o;
	char dev[64] = "";

	if (!o->kind_set)
		o->kind = rps__verbs_available() ? RPS__KIND_VERBS : RPS__KIND_TCP;
	r->kind = o->kind;
	if (o->kind == RPS__KIND_TCP) {
		snprintf(r->addr, sizeof(r->addr), "%s", o->addr ? o->addr : "127.0.0.1");
		return 0;
	}
	if (!rps__verbs_available()) {
		fprintf(stderr, "psperf: --transport verbs: no RDMA device found (ibv_get_device_list): load a driver (e.g. modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0) or use --transport tcp\n");
		return -ENODEV;
	}
	if (o->addr) {
		snprintf(r->addr, sizeof(r->addr), "%s", o->addr);
		return 0;
	}
	if (!rdma_device_addr(o->device, dev, sizeof(dev), r->addr, sizeof(r->addr))) {
		fprintf(stderr, "psperf: cannot find an IPv4 address of RDMA device %s (looked in /sys/class/infiniband): give --addr ADDR\n",
			o->device ? o->device : "(any)");
		return -EADDRNOTAVAIL;
	}
	return 0;
}
