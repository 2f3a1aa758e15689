/*
 * rdmapsd.c - the rdmaps server daemon: parses options, runs a server node
 * (control/daemon.h: the data plane and the control plane) until SIGTERM or
 * SIGINT, and shuts down cleanly.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "control/cplane.h"
#include "control/daemon.h"
#include "server/server.h"
#include "common/parse.h"
#include "proto/auth.h"
#include "proto/smap.h"
#include "transport/uri.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static struct rps__daemon *the_server;

static void on_signal(int sig)
{
	(void)sig;
	if (the_server)
		rps__daemon_stop(the_server);
}

/* (the test hook RPS_FAULT=isolate-signals: control/cplane.h) */
static void on_isolate(int sig)
{
	rps__cp_isolated = sig == SIGUSR1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: rdmapsd [options]\n"
		"  -l, --listen URI          tcp://HOST:PORT or verbs://ADDR:PORT (default tcp://127.0.0.1:7000)\n"
		"  -c, --cluster LIST        comma-separated URIs of every server, in the same order everywhere\n"
		"  -i, --index N             this server's place in --cluster (default: found by --listen)\n"
		"  -s, --shard-size BYTES    parameter bytes per shard, same on every server (default 1M)\n"
		"  -S, --slots N             staging slots per worker connection (default 8)\n"
		"  -L, --lease-ms MS         break a shard lock held longer than this (default 5000)\n"
		"  -m, --memory-limit BYTES  cap on shard + staging memory (default: none)\n"
		"      --park-limit BYTES    out-of-turn sync pushes set aside (default 256M)\n"
		"  -C, --max-connections N   worker connections at once, 1..4096 (default 64)\n"
		"      --idle-timeout-ms MS  drop a worker that sent nothing for MS (default 0: never)\n"
		"  -T, --threads N           serving threads, 1..16, each on port + its index with its share of\n"
		"                            the partitions, same on every server (default 1)\n"
		"      --spin-us US          busy-poll this long before sleeping, up to 1000000 (default 0)\n"
		"      --numa-node N         shards and staging slots on NUMA node N (default: the HCA's)\n"
		"      --cpus LIST           pin the serving thread to these cpus, e.g. 0-3,8 (default: the HCA's)\n"
		"      --no-pin              bind no memory and pin no thread\n"
		"      --show-topology       print the NUMA nodes, RDMA devices and the placement chosen, and exit\n"
		"      --topology FILE       read the machine from an hwloc XML file (lstopo --of xml), to debug placement\n"
		"  -d, --data-dir DIR        the Raft log and snapshots (default: a temporary dir removed at exit)\n"
		"      --fsync always|none   sync the log before answering (default always)\n"
		"      --partitions N        partitions of a new cluster, 1..256 (default 64, or\n"
		"                            4 a server up to 256 past 16 servers)\n"
		"      --join ID             start empty as member ID of a running cluster whose servers (some or\n"
		"                            all) --cluster lists; then: psctl add-server ID URI\n"
		"      --tick-ms MS          Raft tick (default 50)\n"
		"      --election-ticks N    ticks without a leader before an election (default 10)\n"
		"      --move-timeout-ms MS  abort a partition move not installed by then (default 30000)\n"
		"      --failover-ms MS      a server silent this long is failed; its leases last MS/2\n"
		"                            (default 1000 or 10 x --tick-ms if more; at least that)\n"
		"      --replicas R          copies of every partition, 1-3: the Raft leader makes it the\n"
		"                            cluster's target and seeds or drops backups (default: the\n"
		"                            cluster's target stands; a new cluster starts at 2 from\n"
		"                            2 servers on, else 1)\n"
		"      --rebalance auto|off  the Raft leader spreads primaries evenly again after a\n"
		"                            failover, a server's return or a server added (default\n"
		"                            auto; off: psctl rebalance does it when asked)\n"
		"      --zone NAME           this server's zone: replicas spread over zones (up to 15\n"
		"                            printable characters)\n"
		"      --witness             a Raft voter that holds no data: 2 servers + a witness fail\n"
		"                            over like 3 (list it in --cluster; workers do not use it)\n"
		"      --checkpoint-dir DIR  psctl checkpoint NAME and restore NAME use DIR/NAME, and nothing\n"
		"                            outside DIR (default: none, they are refused)\n"
		"      --restore DIR         load the checkpoint in the directory DIR (a path, e.g.\n"
		"                            CKDIR/NAME of psctl checkpoint NAME) before serving\n"
		"      --key FILE            the cluster key (psctl keygen FILE; default $RDMAPS_KEY_FILE): every\n"
		"                            connection proves it holds it; SIGHUP reloads it (rotation).\n"
		"                            Without it: this user's ~/.rdmaps/loopback.key (made if none)\n"
		"      --insecure            without a key, take anyone: beyond loopback, or every local user\n"
		"  -p, --port-file PATH      write the listening port here once ready\n"
		"  -v, --log-level LEVEL     error, warn, info or debug (default info)\n"
		"  -h, --help                this text\n"
		"  -V, --version             print the version\n");
}

/* A zone label the shard map takes (SET_ZONE's check). */
static bool zone_ok(const char *z)
{
	size_t i, n = strlen(z);

	if (!n || n >= RPS__SMAP_ZONE_MAX)
		return false;
	for (i = 0; i < n; i++)
		if (z[i] <= ' ' || z[i] > '~')
			return false;
	return true;
}

/* Every bad option value: one line naming the option and what is allowed,
 * exit status 2 (bad usage, as for an unknown option; rdmapsd(8)). */
static int opt_u32(const char *what, const char *s, uint64_t min, uint64_t max, uint32_t *out)
{
	uint64_t v;

	if (rps__parse_u64(what, s, min, max, &v)) {
		fprintf(stderr, "rdmapsd: %s\n", rps__errbuf());
		return -EINVAL;
	}
	*out = (uint32_t)v;
	return 0;
}

static int opt_size(const char *what, const char *s, uint64_t min, uint64_t max, size_t *out)
{
	uint64_t v;

	if (rps__parse_size(what, s, min, max, &v)) {
		fprintf(stderr, "rdmapsd: %s\n", rps__errbuf());
		return -EINVAL;
	}
	*out = (size_t)v;
	return 0;
}

/* Test hook (RPS_FAULT=exit-delay): linger after the server is destroyed,
 * so that a test can signal the process then (rdmapsd(8) ENVIRONMENT). */
static void exit_delay(void)
{
	struct timespec ts = { 0, 300 * 1000000L };

	if (rps__fault("exit-delay"))
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
}

/* A SIGTERM from now on must not reach on_signal: it would stop a server
 * that is being freed.  Blocked, it stays pending until we exit. */
static void server_destroy(void)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, NULL);
	rps__daemon_destroy(the_server);
	the_server = NULL;
	exit_delay();
}

/* What the command line asks for. */
struct opts {
	struct rps__server_config cfg;
	const char *port_file, *restore_dir, *mem_arg, *key_file;
	int show_topology;
};

/* The long options without a short one (getopt_long returns these; above
 * every char, as perf/options.c does). */
enum {
	OPT_SPIN_US = 256, OPT_NUMA_NODE, OPT_CPUS, OPT_NO_PIN, OPT_SHOW_TOPOLOGY, OPT_TOPOLOGY,
	OPT_PARK_LIMIT, OPT_IDLE_TIMEOUT, OPT_FSYNC, OPT_PARTITIONS, OPT_JOIN, OPT_TICK_MS,
	OPT_ELECTION_TICKS, OPT_MOVE_TIMEOUT, OPT_RESTORE, OPT_FAILOVER_MS, OPT_REPLICAS, OPT_ZONE,
	OPT_CKPT_DIR, OPT_INSECURE, OPT_KEY, OPT_WITNESS, OPT_REBALANCE,
};

/* One option: -1 to go on, or the exit status (0 after --help/--version,
 * 2 for a bad value). */
static int parse_one(int c, struct opts *o)
{
	struct rps__server_config *cfg = &o->cfg;
	size_t sz;
	uint32_t u;

	switch (c) {
	case 'l':
		if (rps__uri_parse(optarg, &cfg->listen)) {
			fprintf(stderr, "rdmapsd: --listen: %s\n", rps__errbuf());
			return 2;
		}
		break;
	case 'c':
		cfg->cluster = optarg;
		break;
	case 'd':
		cfg->data_dir = optarg;
		break;
	case OPT_FSYNC:
		if (!strcmp(optarg, "always")) {
			cfg->fsync_none = 0;
		} else if (!strcmp(optarg, "none")) {
			cfg->fsync_none = 1;
		} else {
			fprintf(stderr, "rdmapsd: --fsync: '%s': say always or none\n", optarg);
			return 2;
		}
		break;
	case OPT_REBALANCE:
		if (!strcmp(optarg, "auto")) {
			cfg->rebalance_off = 0;
		} else if (!strcmp(optarg, "off")) {
			cfg->rebalance_off = 1;
		} else {
			fprintf(stderr, "rdmapsd: --rebalance: '%s': say auto or off\n", optarg);
			return 2;
		}
		break;
	case OPT_PARTITIONS:
		if (opt_u32("--partitions", optarg, 1, 256, &cfg->npart))
			return 2;
		break;
	case OPT_JOIN:
		if (opt_u32("--join", optarg, 1, UINT32_MAX, &u))
			return 2;
		cfg->join_id = u;
		break;
	case OPT_TICK_MS:
		if (opt_u32("--tick-ms", optarg, 1, 60000, &cfg->tick_ms))
			return 2;
		break;
	case OPT_ELECTION_TICKS:
		if (opt_u32("--election-ticks", optarg, 3, 100000, &cfg->election_ticks))
			return 2;
		break;
	case OPT_MOVE_TIMEOUT:
		if (opt_u32("--move-timeout-ms", optarg, 1, 86400000, &cfg->move_timeout_ms))
			return 2;
		break;
	case OPT_RESTORE:
		o->restore_dir = optarg;
		break;
	case OPT_FAILOVER_MS:
		if (opt_u32("--failover-ms", optarg, 1, 86400000, &cfg->failover_ms))
			return 2;
		break;
	case OPT_REPLICAS:
		if (opt_u32("--replicas", optarg, 1, RPS__SMAP_MAX_REPLICAS, &cfg->replicas))
			return 2;
		break;
	case OPT_CKPT_DIR:
		cfg->ckpt_dir = optarg;
		break;
	case OPT_WITNESS:
		cfg->witness = 1;
		break;
	case OPT_KEY:
		o->key_file = optarg;
		break;
	case OPT_INSECURE:
		cfg->insecure = 1;
		break;
	case OPT_ZONE:
		if (!zone_ok(optarg)) {
			fprintf(stderr, "rdmapsd: --zone '%s': 1 to %u printable characters, no spaces\n", optarg,
				RPS__SMAP_ZONE_MAX - 1);
			return 2;
		}
		cfg->zone = optarg;
		break;
	case 'i':
		if (opt_u32("--index", optarg, 0, RPS__SMAP_MAX_MEMBERS - 1, &u))
			return 2;
		cfg->index = (int)u;
		break;
	case 's':
		if (opt_size("--shard-size", optarg, 64, 1u << 30, &sz))
			return 2;
		if (sz % 4) {
			fprintf(stderr, "rdmapsd: --shard-size '%s': must be a multiple of 4 (fp32 elements)\n",
				optarg);
			return 2;
		}
		cfg->shard_bytes = (uint32_t)sz;
		break;
	case 'S':
		if (opt_u32("--slots", optarg, 1, 64, &cfg->nslots))
			return 2;
		break;
	case 'L':
		if (opt_u32("--lease-ms", optarg, 1, 86400000, &cfg->lease_ms))
			return 2;
		break;
	case 'm':
		if (opt_size("--memory-limit", optarg, 1, RPS__SERVER_MEM_MAX, &cfg->mem_limit))
			return 2;
		o->mem_arg = optarg;
		break;
	case 'C':
		if (opt_u32("--max-connections", optarg, 1, RPS__SERVER_CONNS_MAX, &cfg->max_conns))
			return 2;
		break;
	case OPT_IDLE_TIMEOUT:
		if (opt_u32("--idle-timeout-ms", optarg, 0, 86400000, &cfg->idle_timeout_ms))
			return 2;
		break;
	case OPT_PARK_LIMIT:
		if (opt_size("--park-limit", optarg, 0, RPS__SERVER_MEM_MAX, &cfg->park_limit))
			return 2;
		break;
	case 'T':
		if (opt_u32("--threads", optarg, 1, RPS__SERVER_THREADS_MAX, &cfg->nthreads))
			return 2;
		break;
	case OPT_SPIN_US:
		if (opt_u32("--spin-us", optarg, 0, RPS__SERVER_SPIN_US_MAX, &u))
			return 2;
		cfg->spin_us = (int)u;
		break;
	case OPT_NUMA_NODE:
		if (opt_u32("--numa-node", optarg, 0, 4095, &u))
			return 2;
		cfg->numa_node = (int)u;
		break;
	case OPT_CPUS:
		cfg->cpus = optarg;
		break;
	case OPT_NO_PIN:
		cfg->no_pin = 1;
		break;
	case OPT_SHOW_TOPOLOGY:
		o->show_topology = 1;
		break;
	case OPT_TOPOLOGY:
		cfg->topology = optarg;
		break;
	case 'p':
		o->port_file = optarg;
		break;
	case 'v':
		if (rps__log_level_parse(optarg) >= 0) {
			rps__log_level = rps__log_level_parse(optarg);
		} else {
			fprintf(stderr, "rdmapsd: --log-level: say error, warn, info or debug\n");
			return 2;
		}
		break;
	case 'h':
		usage(stdout);
		return 0;
	case 'V':
		printf("rdmapsd %s\n", PACKAGE_VERSION);
		return 0;
	default:
		usage(stderr);
		return 2;
	}
	return -1;
}

/* The command line: -1 to go on, or the exit status. */
static int parse_options(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "cluster", required_argument, NULL, 'c' },
		{ "index", required_argument, NULL, 'i' },
		{ "shard-size", required_argument, NULL, 's' },
		{ "slots", required_argument, NULL, 'S' },
		{ "lease-ms", required_argument, NULL, 'L' },
		{ "memory-limit", required_argument, NULL, 'm' },
		{ "max-connections", required_argument, NULL, 'C' },
		{ "threads", required_argument, NULL, 'T' },
		{ "spin-us", required_argument, NULL, OPT_SPIN_US },
		{ "idle-timeout-ms", required_argument, NULL, OPT_IDLE_TIMEOUT },
		{ "park-limit", required_argument, NULL, OPT_PARK_LIMIT },
		{ "numa-node", required_argument, NULL, OPT_NUMA_NODE },
		{ "cpus", required_argument, NULL, OPT_CPUS },
		{ "no-pin", no_argument, NULL, OPT_NO_PIN },
		{ "show-topology", no_argument, NULL, OPT_SHOW_TOPOLOGY },
		{ "topology", required_argument, NULL, OPT_TOPOLOGY },
		{ "port-file", required_argument, NULL, 'p' },
		{ "data-dir", required_argument, NULL, 'd' },
		{ "fsync", required_argument, NULL, OPT_FSYNC },
		{ "partitions", required_argument, NULL, OPT_PARTITIONS },
		{ "join", required_argument, NULL, OPT_JOIN },
		{ "tick-ms", required_argument, NULL, OPT_TICK_MS },
		{ "election-ticks", required_argument, NULL, OPT_ELECTION_TICKS },
		{ "move-timeout-ms", required_argument, NULL, OPT_MOVE_TIMEOUT },
		{ "restore", required_argument, NULL, OPT_RESTORE },
		{ "failover-ms", required_argument, NULL, OPT_FAILOVER_MS },
		{ "replicas", required_argument, NULL, OPT_REPLICAS },
		{ "zone", required_argument, NULL, OPT_ZONE },
		{ "rebalance", required_argument, NULL, OPT_REBALANCE },
		{ "checkpoint-dir", required_argument, NULL, OPT_CKPT_DIR },
		{ "key", required_argument, NULL, OPT_KEY },
		{ "insecure", no_argument, NULL, OPT_INSECURE },
		{ "witness", no_argument, NULL, OPT_WITNESS },
		{ "log-level", required_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int c, ret;

	memset(o, 0, sizeof(*o));
	rps__server_config_init(&o->cfg);
	rps__log_level = RPS__LOG_INFO;
	while ((c = getopt_long(argc, argv, "l:c:i:s:S:L:m:C:T:p:d:v:hV", longopts, NULL)) != -1) {
		ret = parse_one(c, o);
		if (ret >= 0)
			return ret;
	}
	if (optind < argc) {
		fprintf(stderr, "rdmapsd: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	return -1;
}

/* What the options mean together: -1 to go on, or the exit status. */
static int validate(const struct opts *o)
{
	if (!o->key_file && !o->cfg.insecure && !o->show_topology && !rps__host_is_loopback(o->cfg.listen.host)) {
		fprintf(stderr, "rdmapsd: listening on %s without a key lets anyone who reaches it own the cluster: "
			"make one (psctl keygen FILE) and give --key FILE, or --insecure on a network you trust\n",
			o->cfg.listen.host);
		return 2;
	}
	if (o->cfg.witness && o->restore_dir) {
		fprintf(stderr, "rdmapsd: --witness holds no partitions: --restore is for the servers that do\n");
		return 2;
	}
	if (o->cfg.failover_ms && (uint64_t)o->cfg.failover_ms < 10ull * o->cfg.tick_ms) {
		fprintf(stderr, "rdmapsd: --failover-ms %u: at least 10 x --tick-ms (%u): a lease is renewed every"
			" failover-ms/10 and must outlast a Raft round\n", o->cfg.failover_ms, o->cfg.tick_ms);
		return 2;
	}
	if (o->cfg.mem_limit && o->cfg.mem_limit < rps__server_min_memory(&o->cfg)) {
		char need[24];
		fprintf(stderr, "rdmapsd: --memory-limit '%s': below the %s bytes that one worker connection "
			"(--slots x --shard-size) and one shard need: raise it\n", o->mem_arg,
			rps__size_str(rps__server_min_memory(&o->cfg), need, sizeof(need)));
		return 2;
	}
	return -1;
}

/* SIGHUP: read the key file again (a rotation starts or ends).  A thread
 * of its own takes the signal, so the reload may read files and lock. */
static void *reload_keys(void *arg)
{
	struct rps__keyring *ring = arg;
	sigset_t set;
	int sig, ret;

	sigemptyset(&set);
	sigaddset(&set, SIGHUP);
	for (;;) {
		if (sigwait(&set, &sig))
			continue;
		ret = rps__keyring_reload(ring);
		if (ret < 0)
			rps__log(RPS__LOG_ERROR, "SIGHUP: %s", rps__errbuf());
		else if (ret)
			rps__log(RPS__LOG_WARN, "SIGHUP: a new cluster key (id %016llx); the previous one is still "
				 "taken until the next SIGHUP with this key", (unsigned long long)ring->cur.id);
		else
			rps__log(RPS__LOG_WARN, "SIGHUP: the key is unchanged; only it is taken now (id %016llx)",
				 (unsigned long long)ring->cur.id);
	}
	return NULL;
}

static int keys_open(struct opts *o)
{
	const char *path = rps__key_path(o->key_file);
	static char local[PATH_MAX];
	bool made = false;
	sigset_t all, old;
	pthread_t t;
	int ret;

	if (!path && o->cfg.insecure)
		return 0;	/* (on loopback: every local user gets in) */
	if (!path) {	/* this user's loopback key (validate: we listen on loopback) */
		ret = rps__local_key_ensure(local, sizeof(local), &made);
		if (ret) {
			fprintf(stderr, "rdmapsd: no --key: %s\n", rps__errbuf());
			return -1;
		}
		path = local;
	}
	ret = rps__keyring_open(path, true, &o->cfg.keys);
	if (ret) {
		fprintf(stderr, "rdmapsd: %s: %s\n", path == local ? "no --key" : "--key", rps__errbuf());
		return -1;
	}
	/* The reload thread takes every signal blocked, so SIGTERM and SIGINT
	 * still run their handler on a thread of the server's (one that
	 * stopped it may then destroy it: run on the reload thread, the
	 * handler raced with the main thread closing what it writes to).
	 * SIGHUP stays blocked everywhere else, before any other thread
	 * exists: they all inherit that mask, and sigwait takes it. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = pthread_create(&t, NULL, reload_keys, o->cfg.keys);
	sigaddset(&old, SIGHUP);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		fprintf(stderr, "rdmapsd: pthread_create: %s\n", strerror(ret));
		return -1;
	}
	pthread_detach(t);
	if (path == local)
		rps__log(RPS__LOG_INFO, "no --key: this user's loopback key %016llx (%s, %s): only clients of this "
			 "user get in (--insecure: every local user)", (unsigned long long)o->cfg.keys->cur.id, path,
			 made ? "made now" : "found");
	else
		rps__log(RPS__LOG_INFO, "cluster key %016llx from %s: every connection authenticates",
			 (unsigned long long)o->cfg.keys->cur.id, path);
	return 0;
}

static void install_signals(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (rps__fault("isolate-signals")) {
		sa.sa_handler = on_isolate;
		sigaction(SIGUSR1, &sa, NULL);
		sigaction(SIGUSR2, &sa, NULL);
	}
}

/* Say where we serve, and write --port-file: 0, or -1 (said why). */
static int announce(struct opts *o)
{
	char uri[300];

	o->cfg.listen.port = rps__daemon_port(the_server);
	rps__log(RPS__LOG_INFO, "rdmapsd %s serving on %s (device %s), shards of %u bytes, %u staging slots per worker",
		 PACKAGE_VERSION, rps__uri_str(&o->cfg.listen, uri, sizeof(uri)),
		 rps__daemon_fabric_name(the_server), o->cfg.shard_bytes, o->cfg.nslots);
	if (rps__daemon_windows(the_server))
		rps__log(RPS__LOG_INFO, "remote access is scoped to one connection: every key a peer gets is a "
			 "memory window bound to its connection alone");
	else
		rps__log(RPS__LOG_WARN, "device %s has no type 2 memory windows (or RPS_VERBS_NO_WINDOWS is set): "
			 "a region's key works on every connection of this server, not only the one it was given to",
			 rps__daemon_fabric_name(the_server));
	if (o->port_file) {
		char tmp[4096];
		FILE *f;
		snprintf(tmp, sizeof(tmp), "%s.tmp", o->port_file);
		f = fopen(tmp, "w");
		if (!f || fprintf(f, "%u\n", o->cfg.listen.port) < 0 || fclose(f) || rename(tmp, o->port_file)) {
			fprintf(stderr, "rdmapsd: writing --port-file %s: %s\n", o->port_file, strerror(errno));
			return -1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int ret;

	ret = parse_options(argc, argv, &o);
	if (ret < 0 && !o.key_file)
		o.key_file = rps__key_path(NULL);	/* $RDMAPS_KEY_FILE */
	if (ret < 0)
		ret = validate(&o);
	if (ret >= 0)
		return ret;
	if (o.cfg.witness && o.cfg.nthreads > 1) {
		/* (the flags every server of a cluster is given may say more) */
		fprintf(stderr, "rdmapsd: --witness holds no partitions: serving with one thread, not %u\n",
			o.cfg.nthreads);
		o.cfg.nthreads = 1;
	}
	if (!o.show_topology && keys_open(&o))
		return 1;
	if (o.show_topology) {
		ret = rps__server_show_topology(&o.cfg, stdout);
		if (ret)
			fprintf(stderr, "rdmapsd: %s\n", rps__errbuf());
		return ret ? 1 : 0;
	}
	ret = rps__daemon_create(&o.cfg, &the_server);
	if (ret) {
		fprintf(stderr, "rdmapsd: %s\n", rps__errbuf());
		return 1;
	}
	if (o.restore_dir && (ret = rps__daemon_restore(the_server, o.restore_dir))) {
		fprintf(stderr, "rdmapsd: --restore %s: %s\n", o.restore_dir, rps__errbuf());
		server_destroy();
		return 1;
	}
	install_signals();
	if (announce(&o)) {
		server_destroy();
		return 1;
	}
	ret = rps__daemon_run(the_server);
	if (ret)
		fprintf(stderr, "rdmapsd: %s\n", rps__errbuf());
	server_destroy();
	rps__log(RPS__LOG_INFO, "rdmapsd stopped");
	return ret ? 1 : 0;
}
