/*
 * psctl.c - administration of an rdmaps cluster: show the Raft group and the
 * shard map, move partitions, add and remove servers, transfer leadership.
 *
 * Every operation is a sequence of synchronous request/replies over
 * rps__ctl (ctl.h) with role ADMIN: STATUS to learn a server's Raft state
 * and its copy of the shard map, ADMIN to the leader to change something.
 * The leader is found from a STATUS reply (its leader field, its URI from
 * the map) and confirmed by asking it; a leader that lost its role answers
 * -EPERM with the new leader's id, and we follow it a few times.
 *
 * Multi-step commands (rebalancing after add-server, draining before
 * remove-server) take one decision at a time from the leader's current map
 * and carry out one move at a time, so an interrupted command leaves a valid
 * cluster that the next command continues from.
 *
 * Output: stdout for results, one line per error on stderr prefixed
 * "psctl: ".  Exit status 0 success, 1 a failed operation, 2 bad usage.
 *
 * This file: errors and helpers, the connections, STATUS and ADMIN, and
 * main.  The commands: psctl_status.c, psctl_moves.c, psctl_ckpt.c.
 */
#include "config.h"
#include "programs/psctl_int.h"
#include "common/parse.h"
#include "proto/auth.h"
#include "control/raft.h"
#include "rdmaps.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STATUS_MAX_MS 5000		/* connect and STATUS wait at most this (or --timeout) */
#define ADMIN_SLACK_MS 5000		/* the ADMIN call waits this much longer than the server may take */
#define REDIRECTS 6			/* -EPERM / -EAGAIN / unreachable leader: tries */
#define MAX_CONNS (2 * RPS__SMAP_MAX_MEMBERS + 8)

struct psctl_opt psctl_opt;

/* ---- errors and small helpers -------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
"usage: psctl [-s URI[,URI...]] [--json] [--timeout SEC] COMMAND [ARGS]\n"
"\n"
"Commands:\n"
"  status                      every member's Raft state, the cluster and the\n"
"                              partition map\n"
"  move PART ID                move partition PART to member ID\n"
"  add-server ID URI [--no-rebalance]\n"
"                              add member ID listening at URI, then move\n"
"                              partitions to it until the members are balanced\n"
"  remove-server ID            move member ID's partitions to the others, take\n"
"                              leadership away from it, remove it\n"
"  remove-server --force ID    member ID is dead: abort its moves, give its\n"
"                              partitions to the others marked lost, remove it\n"
"  forget-lost PART|all        accept a lost partition empty\n"
"  set-replicas R              keep R copies (1-3) of every partition: the\n"
"                              leader seeds or drops backups\n"
"  transfer-leader [ID]        make ID (default: the server's choice) the leader\n"
"  rebalance                   move primaries from the members that own most to\n"
"                              those that own fewest until every live member\n"
"                              that holds data owns its share (within one)\n"
"  checkpoint NAME             write a consistent checkpoint of every tensor as\n"
"                              NAME under every server's --checkpoint-dir\n"
"  restore NAME                load the checkpoint NAME into the servers\n"
"  remove-rank RANK [TENSOR]   a dead worker's rank leaves the sync and bounded\n"
"                              tensors (or TENSOR) for good; the others go on\n"
"  keygen FILE                 write a new cluster key to FILE (mode 0600); with\n"
"                              --role admin|worker|reader [--scope PREFIX], a key\n"
"                              derived from the cluster key that --key names\n"
"\n"
"Options:\n"
"  -s, --servers LIST   servers to ask first, tcp://HOST:PORT or verbs://ADDR:PORT,\n"
"                       comma-separated (default: $RPS_SERVERS)\n"
"      --json           one JSON object instead of the text (every command)\n"
"      --timeout SEC    how long an operation may take (default 30)\n"
"      --no-rebalance   add-server: add the member only\n"
"      --level N        checkpoint: igzip level 0 (store) to 3 (default 1)\n"
"      --key FILE       the admin (or cluster) key (default: $RDMAPS_KEY_FILE; to loopback\n"
"                       servers, else this user's ~/.rdmaps/loopback.key)\n"
"      --insecure       without a key, talk to servers beyond loopback anyway, and use no\n"
"                       loopback key (for a loopback rdmapsd --insecure)\n"
"      --role ROLE      keygen: admin, worker or reader (default: a cluster key)\n"
"      --scope PREFIX   keygen: the tensor-name prefix a worker or reader key covers\n"
"  -h, --help           this text\n"
"  -V, --version        print the version\n"
"\n"
"Exit status: 0 success, 1 the operation failed, 2 bad usage.  See psctl(8).\n");
}

static void die_usage(const char *fmt, ...) RPS__PRINTF(1, 2);
static void die_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "psctl: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n"
		"usage: psctl [-s URI[,URI...]] [--json] [--timeout SEC] COMMAND [ARGS]\n"
		"commands: status | move PART ID | add-server ID URI [--no-rebalance] |\n"
		"          remove-server ID | transfer-leader [ID] | rebalance | checkpoint NAME | restore NAME |\n"
		"          remove-rank RANK [TENSOR] | set-replicas R\n"
		"          (psctl --help for more)\n");
	exit(2);
}

/* Print one error line and return 1 (the exit status of a failed operation). */
int psctl_fail(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fprintf(stderr, "psctl: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

int psctl_fail_err(void)
{
	return psctl_fail("%s", rps__errbuf());
}

const char *psctl_errtext(int err)
{
	if (err == RPS_ESTALE_EPOCH)
		return "stale epoch";
	if (err == RPS_ELEASE)
		return "shard lock lease expired";
	if (err < 0 && err > -4096)
		return strerror(-err);
	return "unknown error";
}

uint64_t psctl_deadline_in(int ms)
{
	return rps__now_ns() + (uint64_t)ms * 1000000u;
}

bool psctl_expired(uint64_t deadline)
{
	return rps__now_ns() >= deadline;
}

void psctl_sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* A JSON string (--json output); the names and URIs psctl prints are UTF-8. */
void psctl_json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static uint64_t parse_u64(const char *s, const char *what, uint64_t min, uint64_t max)
{
	uint64_t v;

	if (rps__parse_u64(what, s, min, max, &v)) {
		if (max == UINT64_MAX)
			die_usage("%s '%s': expected a member id (a positive integer)", what, s);
		die_usage("%s", rps__errbuf());
	}
	return v;
}

/* ---- connections, cached per server ----------------------------------- */

static struct {
	char name[300];
	struct rps__ctl *ctl;
} conns[MAX_CONNS];
static int nconns;

static void conn_drop(struct rps__ctl *ctl)
{
	int i;

	for (i = 0; i < nconns; i++) {
		if (conns[i].ctl == ctl) {
			rps__ctl_close(ctl);
			conns[i] = conns[--nconns];
			return;
		}
	}
	rps__ctl_close(ctl);
}

static void conns_close(void)
{
	while (nconns > 0)
		conn_drop(conns[nconns - 1].ctl);
}

/* *cached says whether the channel was open already (it may have gone stale). */
static int psctl_conn_get(const struct rps__uri *u, struct rps__ctl **out, bool *cached)
{
	char name[300];
	int i, ret;

	rps__uri_str(u, name, sizeof(name));
	for (i = 0; i < nconns; i++) {
		if (!strcmp(conns[i].name, name)) {
			*out = conns[i].ctl;
			*cached = true;
			return 0;
		}
	}
	*cached = false;
	ret = rps__ctl_open(u, psctl_opt.rpc_ms, out);
	if (ret)
		return ret;
	if (nconns == MAX_CONNS)
		conn_drop(conns[0].ctl);
	snprintf(conns[nconns].name, sizeof(conns[nconns].name), "%s", name);
	conns[nconns].ctl = *out;
	nconns++;
	return 0;
}

/* ---- STATUS --------------------------------------------------------------- */

static char rbuf[RPS__BIG_MSG_MAX];

bool psctl_id_in(const uint64_t *ids, uint32_t n, uint64_t id, uint32_t *at)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		if (ids[i] == id) {
			if (at)
				*at = i;
			return true;
		}
	}
	return false;
}

/* STATUS to u: its Raft state and (map non-NULL) its shard map. */
int psctl_query_status(const struct rps__uri *u, struct rps__status_rep *st, struct rps__smap *map)
{
	struct rps__ctl *ctl;
	char name[300];
	size_t len = 0;
	int32_t status = 0;
	bool cached;
	int ret, tries;

	rps__uri_str(u, name, sizeof(name));
	for (tries = 0;; tries++) {
		ret = psctl_conn_get(u, &ctl, &cached);
		if (ret)
			return ret;
		ret = rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, rbuf, sizeof(rbuf), &len, &status, psctl_opt.rpc_ms);
		if (ret == -ECONNRESET)
			conn_drop(ctl);
		/* a cached connection may have died with an earlier server process */
		if (ret == -ECONNRESET && cached && tries == 0)
			continue;
		if (ret)
			return ret;
		break;
	}
	if (status < 0)
		return rps__seterr(status, "%s: STATUS refused: %s", name, psctl_errtext(status));
	if (len < sizeof(*st))
		return rps__seterr(-EBADMSG, "%s: STATUS reply of %zu bytes is too short", name, len);
	memcpy(st, rbuf, sizeof(*st));
	if (st->n_voters > RPS__SMAP_MAX_MEMBERS || st->n_learners > RPS__SMAP_MAX_MEMBERS ||
	    st->n_voters + st->n_learners > RPS__ARRAY_SIZE(st->match))
		return rps__seterr(-EBADMSG, "%s: STATUS reply names %u voters and %u learners, at most %zu in all",
				   name, st->n_voters, st->n_learners, RPS__ARRAY_SIZE(st->match));
	if (map && len == sizeof(*st))	/* (a server with no map sends none) */
		return rps__seterr(-EAGAIN, "%s: no shard map yet: a server started with --join that the leader has "
				   "not brought in (psctl add-server ID URI; its log says whom it reached)", name);
	if (map) {
		ret = rps__smap_decode(rbuf + sizeof(*st), len - sizeof(*st), map);
		if (ret)
			return rps__preerr(ret, "%s: shard map in the STATUS reply", name);
	}
	return 0;
}

/* STATUS to the first of --servers that answers. */
int psctl_query_any(struct rps__uri *from, struct rps__status_rep *st, struct rps__smap *map)
{
	char first[512] = "";
	int i, ret = -EINVAL;

	for (i = 0; i < psctl_opt.nservers; i++) {
		ret = psctl_query_status(&psctl_opt.servers[i], st, map);
		if (!ret) {
			if (from)
				*from = psctl_opt.servers[i];
			return 0;
		}
		if (!first[0])
			snprintf(first, sizeof(first), "%s", rps__errbuf());
	}
	if (psctl_opt.nservers == 1)
		return ret;
	return rps__seterr(ret, "none of the %d servers answered; first: %s", psctl_opt.nservers, first);
}

int psctl_members(struct psctl_member *m, uint32_t *n, const char *why)
{
	struct rps__status_rep st;
	struct rps__smap map;
	struct rps__uri from;
	uint32_t i;
	int ret;

	ret = psctl_query_any(&from, &st, &map);
	if (ret)
		return ret;
	for (i = 0; i < map.nmembers; i++) {
		bool cached;
		m[i].id = map.members[i].id;
		if (rps__uri_parse(map.members[i].uri, &m[i].uri))
			return rps__seterr(-EINVAL, "member %llu: bad address %s", (unsigned long long)m[i].id,
					   map.members[i].uri);
		ret = psctl_conn_get(&m[i].uri, &m[i].ctl, &cached);
		if (ret)
			return rps__preerr(ret, "member %llu: %s", (unsigned long long)m[i].id, why);
	}
	*n = map.nmembers;
	return 0;
}

static int member_uri(const struct rps__smap *map, uint64_t id, struct rps__uri *u)
{
	const struct rps__smap_member *m = rps__smap_member(map, id);
	int ret;

	if (!m)
		return rps__seterr(-ENOENT, "member %" PRIu64 " is not in the shard map", id);
	ret = rps__uri_parse(m->uri, u);
	if (ret)
		return rps__preerr(ret, "member %" PRIu64 " in the shard map", id);
	return 0;
}

/* Find the leader: ask any server, follow its leader field, confirm with the
 * leader itself (which then also gives the freshest map).  Retries through
 * an election until deadline. */
int psctl_find_leader(struct leader *L, uint64_t deadline)
{
	static struct rps__smap map;
	struct rps__status_rep st;
	uint64_t last_term = 0;
	unsigned pause = 100;
	int ret;

	for (;;) {
		uint64_t hint;
		int hops;

		ret = psctl_query_any(NULL, &st, &map);
		if (ret)
			return ret;
		last_term = st.term;
		hint = st.role == RPS__RAFT_LEADER ? st.id : st.leader;
		for (hops = 0; hint && hops < 4; hops++) {
			ret = member_uri(&map, hint, &L->uri);
			if (ret)
				break;
			ret = psctl_query_status(&L->uri, &L->st, &L->map);
			if (ret)
				break;
			if (L->st.role == RPS__RAFT_LEADER) {
				L->id = L->st.id;
				return 0;
			}
			hint = L->st.leader;
			last_term = L->st.term;
			map = L->map;
		}
		/* the server that answered knows no leader (it may be cut off
		 * from the group): ask every member of its map */
		for (uint32_t i = 0; i < map.nmembers; i++) {
			if (rps__uri_parse(map.members[i].uri, &L->uri) || psctl_query_status(&L->uri, &L->st, &L->map))
				continue;
			if (L->st.role == RPS__RAFT_LEADER) {
				L->id = L->st.id;
				return 0;
			}
		}
		if (psctl_expired(deadline)) {
			if (ret)
				return rps__preerr(ret, "no leader reachable");
			return rps__seterr(-EAGAIN, "no leader elected (term %" PRIu64 "): is a majority of the voters "
					   "up? see psctl status", last_term);
		}
		psctl_sleep_ms(pause);
		pause = RPS__MIN(pause * 2, 1000u);
	}
}

/* ---- ADMIN to the leader --------------------------------------------------- */

/* Where an ADMIN goes next: the leader, or the member the last answer named. */
struct admin_try {
	struct leader *L;
	struct rps__uri target;
	uint64_t target_id;
	bool have_target;
};

/* Pick the server to ask this time.  A STATUS first, on the channel the
 * ADMIN will use: it replaces a channel that died with an earlier server
 * process, so a failure of the ADMIN itself means the outcome is unknown. */
static int admin_pick_target(struct admin_try *t, uint64_t deadline)
{
	struct leader *L = t->L;
	int ret;

	if (t->have_target && psctl_query_status(&t->target, &L->st, &L->map))
		t->have_target = false;
	if (!t->have_target) {
		ret = psctl_find_leader(L, deadline);
		if (ret)
			return ret;
		t->target = L->uri;
		t->target_id = L->id;
	}
	t->have_target = false;
	return 0;
}

/* One ADMIN exchange with target: 0 and the server's *status, or a negative
 * errno if the outcome is unknown. */
static int admin_call(const struct rps__uri *target, const struct rps__admin *a, struct rps__admin_rep *rep,
		      int32_t *status, const char *what)
{
	struct rps__ctl *ctl;
	size_t len = 0;
	bool cached;
	int ret;

	ret = psctl_conn_get(target, &ctl, &cached);
	if (ret)
		return rps__preerr(ret, "%s", what);
	memset(rep, 0, sizeof(*rep));
	ret = rps__ctl_call(ctl, RPS__MSG_ADMIN, a, sizeof(*a), rep, sizeof(*rep), &len, status,
			    psctl_opt.timeout_ms + ADMIN_SLACK_MS);
	if (ret) {
		if (ret == -ECONNRESET)
			conn_drop(ctl);
		return rps__preerr(ret, "%s: outcome unknown, check with psctl status", what);
	}
	if (len < sizeof(*rep))
		memset(rep, 0, sizeof(*rep));
	rep->msg[sizeof(rep->msg) - 1] = '\0';
	return 0;
}

/* What the answer means: true if the operation is over (*ret its result),
 * false to ask again (*ret the error to report if no try is left). */
static bool admin_answered(struct admin_try *t, const struct rps__admin *a, int32_t status,
			   const struct rps__admin_rep *rep, const char *what, int *ret)
{
	if (status == -EPERM && a->op == RPS__ADMIN_TRANSFER_LEADER && rep->leader &&
	    rep->leader != t->target_id && (!a->id || rep->leader == a->id)) {
		/* it handed leadership over before answering: done (asking the
		 * new leader again would move leadership on once more) */
		*ret = 0;
		return true;
	}
	if (status == -EPERM) {
		/* not (any more) the leader: it names the one to ask */
		if (rep->leader && !member_uri(&t->L->map, rep->leader, &t->target)) {
			t->have_target = true;
			t->target_id = rep->leader;
		}
		*ret = rps__seterr(-EPERM, "%s: %s", what, rep->msg[0] ? rep->msg : "not the leader");
		return false;
	}
	if (status == -EAGAIN) {
		/* a leader that has not committed in its term yet, a change in flight */
		t->have_target = true;
		*ret = rps__seterr(-EAGAIN, "%s: %s", what, rep->msg[0] ? rep->msg : "busy, try again");
		return false;
	}
	if (status < 0) {
		if (rep->msg[0])
			*ret = rps__seterr(status, "%s", rep->msg);
		else
			*ret = rps__seterr(status, "%s: %s", what, psctl_errtext(status));
		return true;
	}
	*ret = 0;
	return true;
}

/* Send one ADMIN operation to the leader, following -EPERM redirections.
 * what: "move partition 3 to member 2" for messages.  Returns 0, or a
 * negative errno with the one line to print in rps__errbuf(). */
int psctl_admin(uint32_t op, uint32_t part, uint64_t id, const char *uri, struct rps__admin_rep *rep,
		const char *what)
{
	struct rps__admin a = { .op = op, .part = part, .id = id, .timeout_ms = (uint32_t)psctl_opt.timeout_ms };
	uint64_t deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	struct admin_try t = { 0 };
	unsigned pause = 200;
	int ret, attempt;

	t.L = malloc(sizeof(*t.L));
	if (!t.L)
		return rps__seterr(-ENOMEM, "out of memory");
	if (uri)
		snprintf(a.uri, sizeof(a.uri), "%s", uri);
	for (attempt = 0; attempt < REDIRECTS; attempt++) {
		int32_t status = 0;

		if (attempt) {
			psctl_sleep_ms(pause);
			pause = RPS__MIN(pause * 2, 1000u);
		}
		ret = admin_pick_target(&t, deadline);
		if (ret)
			goto out;
		ret = admin_call(&t.target, &a, rep, &status, what);
		if (ret || admin_answered(&t, &a, status, rep, what, &ret))
			goto out;
	}
	if (ret == -EPERM)
		ret = rps__seterr(-EAGAIN, "%s: leadership kept changing: try again", what);
out:
	free(t.L);
	return ret;
}

/* ---- keygen ---------------------------------------------------------------- */

/* psctl keygen FILE: a new cluster key, or (--role) a key derived from the
 * cluster key that --key / $RDMAPS_KEY_FILE names. */
static int keygen(const char *path)
{
	enum rps__key_role role = RPS__KEY_CLUSTER;
	struct rps__key cluster;
	const char *from = rps__key_path(NULL);
	int ret;

	if (psctl_opt.role && rps__key_role_parse(psctl_opt.role, &role))
		die_usage("--role: %s", rps__errbuf());
	if (psctl_opt.scope && role != RPS__KEY_WORKER && role != RPS__KEY_READER)
		die_usage("--scope goes with --role worker or reader");
	if (role == RPS__KEY_CLUSTER) {
		ret = rps__key_write(path, role, NULL, NULL);
	} else {
		if (!from)
			return psctl_fail("keygen --role %s: give the cluster key to derive it from (--key FILE)",
					  psctl_opt.role);
		ret = rps__key_load(from, &cluster);
		if (!ret)
			ret = rps__key_write(path, role, psctl_opt.scope ? psctl_opt.scope : "", &cluster);
		rps__key_clear(&cluster);
	}
	if (ret)
		return psctl_fail("keygen: %s", rps__errbuf());
	if (!psctl_opt.json)
		printf("wrote a key of role %s%s%s%s to %s (mode 0600)\n", rps__key_role_name(role),
		       psctl_opt.scope ? " for tensors under '" : "", psctl_opt.scope ? psctl_opt.scope : "",
		       psctl_opt.scope ? "'" : "", path);
	else
		printf("{\"key_file\":\"%s\",\"role\":\"%s\"}\n", path, rps__key_role_name(role));
	return 0;
}

/* ---- main ------------------------------------------------------------------ */

/* The options before the command into g (and *servers); false once --help
 * or --version printed what they print. */
static bool parse_options(int argc, char **argv, const char **servers)
{
	enum { OPT_JSON = 256, OPT_TIMEOUT, OPT_NO_REBALANCE, OPT_LEVEL, OPT_FORCE, OPT_KEY, OPT_INSECURE, OPT_ROLE,
	       OPT_SCOPE };
	static const struct option longopts[] = {
		{ "servers", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "no-rebalance", no_argument, NULL, OPT_NO_REBALANCE },
		{ "level", required_argument, NULL, OPT_LEVEL },
		{ "force", no_argument, NULL, OPT_FORCE },
		{ "key", required_argument, NULL, OPT_KEY },
		{ "insecure", no_argument, NULL, OPT_INSECURE },
		{ "role", required_argument, NULL, OPT_ROLE },
		{ "scope", required_argument, NULL, OPT_SCOPE },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	double sec;
	char *end;
	int c;

	psctl_opt.timeout_ms = 30000;
	psctl_opt.level = -1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":s:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			*servers = optarg;
			break;
		case OPT_JSON:
			psctl_opt.json = true;
			break;
		case OPT_TIMEOUT:
			errno = 0;
			sec = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(sec >= 0.001 && sec <= 86400))
				die_usage("--timeout '%s': expected seconds, from 0.001 to 86400", optarg);
			psctl_opt.timeout_ms = (int)(sec * 1000 + 0.5);
			break;
		case OPT_NO_REBALANCE:
			psctl_opt.no_rebalance = true;
			break;
		case OPT_FORCE:
			psctl_opt.force = true;
			break;
		case OPT_KEY:	/* (the library reads them from the environment) */
			setenv("RDMAPS_KEY_FILE", optarg, 1);
			break;
		case OPT_INSECURE:
			setenv("RDMAPS_INSECURE", "1", 1);
			break;
		case OPT_ROLE:
			psctl_opt.role = optarg;
			break;
		case OPT_SCOPE:
			psctl_opt.scope = optarg;
			break;
		case OPT_LEVEL:
			if (!strcmp(optarg, "0") || !strcmp(optarg, "1") || !strcmp(optarg, "2") || !strcmp(optarg, "3"))
				psctl_opt.level = optarg[0] - '0';
			else
				die_usage("--level '%s': igzip levels are 0 (store) to 3", optarg);
			break;
		case 'h':
			usage(stdout);
			return false;
		case 'V':
			printf("psctl %s\n", PACKAGE_VERSION);
			return false;
		case ':':
			die_usage("%s needs an argument", argv[optind - 1]);
			break;
		default:
			if (optopt)
				die_usage("unknown option -%c", optopt);
			die_usage("unknown option %s", argv[optind - 1]);
		}
	}
	psctl_opt.rpc_ms = RPS__MIN(psctl_opt.timeout_ms, STATUS_MAX_MS);
	return true;
}

/* With POSIXLY_CORRECT set, options after the command arrive among its
 * arguments: take them out.  Returns how many arguments remain. */
static int take_trailing_options(char **args, int nargs)
{
	int i, n = 0;
	for (i = 0; i < nargs; i++) {
		if (!strcmp(args[i], "--no-rebalance"))
			psctl_opt.no_rebalance = true;
		else if (!strcmp(args[i], "--force"))
			psctl_opt.force = true;
		else if (!strcmp(args[i], "--json"))
			psctl_opt.json = true;
		else if ((!strcmp(args[i], "--role") || !strcmp(args[i], "--scope")) && i + 1 < nargs) {
			if (args[i][2] == 'r')
				psctl_opt.role = args[++i];
			else
				psctl_opt.scope = args[++i];
		}
		else if (args[i][0] == '-' && args[i][1])
			die_usage("%s: put options before the command", args[i]);
		else
			args[n++] = args[i];
	}
	return n;
}

/* The command exists, its options go with it and it has as many arguments
 * as it takes; else a usage error (before the servers: a usage error wins
 * over a missing server list). */
static void check_command(const char *cmd, int nargs)
{
	static const struct { const char *cmd; int min, max; const char *args; } shapes[] = {
		{ "status", 0, 0, "" },
		{ "move", 2, 2, " PART ID" },
		{ "add-server", 2, 2, " ID URI [--no-rebalance]" },
		{ "remove-server", 1, 1, " ID" },
		{ "transfer-leader", 0, 1, " [ID]" },
		{ "checkpoint", 1, 1, " NAME" },
		{ "restore", 1, 1, " NAME" },
		{ "forget-lost", 1, 1, " PART|all" },
		{ "remove-rank", 1, 2, " RANK [TENSOR]" },
		{ "set-replicas", 1, 1, " R" },
		{ "rebalance", 0, 0, "" },
		{ "keygen", 1, 1, " FILE [--role ROLE] [--scope PREFIX]" },
	};
	size_t i;

	if (strcmp(cmd, "status") && strcmp(cmd, "move") && strcmp(cmd, "add-server") &&
	    strcmp(cmd, "remove-server") && strcmp(cmd, "transfer-leader") && strcmp(cmd, "checkpoint") &&
	    strcmp(cmd, "restore") && strcmp(cmd, "forget-lost") && strcmp(cmd, "remove-rank") &&
	    strcmp(cmd, "set-replicas") && strcmp(cmd, "rebalance") && strcmp(cmd, "keygen"))
		die_usage("unknown command '%s'", cmd);
	if ((psctl_opt.role || psctl_opt.scope) && strcmp(cmd, "keygen"))
		die_usage("--role and --scope go with keygen");
	if (psctl_opt.force && strcmp(cmd, "remove-server"))
		die_usage("--force goes with remove-server");
	if (psctl_opt.no_rebalance && strcmp(cmd, "add-server"))
		die_usage("--no-rebalance goes with add-server");
	if (psctl_opt.level >= 0 && strcmp(cmd, "checkpoint"))
		die_usage("--level goes with checkpoint");
	for (i = 0; i < RPS__ARRAY_SIZE(shapes); i++)
		if (!strcmp(cmd, shapes[i].cmd) && (nargs < shapes[i].min || nargs > shapes[i].max))
			die_usage("%s takes%s%s", cmd, *shapes[i].args ? "" : " no arguments", shapes[i].args);
}

/* The command's arguments: *part and *id where it takes them. */
static void parse_command_args(const char *cmd, char **args, int nargs, uint32_t *part, uint64_t *id)
{
	if (!strcmp(cmd, "move")) {
		*part = (uint32_t)parse_u64(args[0], "PART", 0, RPS__SMAP_MAX_PART - 1);
		*id = parse_u64(args[1], "ID", 1, UINT64_MAX);
	} else if (!strcmp(cmd, "add-server")) {
		struct rps__uri u;
		*id = parse_u64(args[0], "ID", 1, UINT64_MAX);
		if (rps__uri_parse(args[1], &u))
			die_usage("%s", rps__errbuf());
		if (strlen(args[1]) >= RPS__SMAP_URI_MAX)
			die_usage("URI '%s': at most %u characters", args[1], RPS__SMAP_URI_MAX - 1);
	} else if (!strcmp(cmd, "remove-server")) {
		*id = parse_u64(args[0], "ID", 1, UINT64_MAX);
	} else if (!strcmp(cmd, "forget-lost")) {
		*part = !strcmp(args[0], "all") ? UINT32_MAX :
		       (uint32_t)parse_u64(args[0], "PART", 0, RPS__SMAP_MAX_PART - 1);
	} else if (!strcmp(cmd, "set-replicas")) {
		*id = parse_u64(args[0], "R", 1, RPS__SMAP_MAX_REPLICAS);
	} else if (!strcmp(cmd, "transfer-leader") && nargs == 1) {
		*id = parse_u64(args[0], "ID", 1, UINT64_MAX);
	} else if (!strcmp(cmd, "remove-rank")) {
		*id = parse_u64(args[0], "RANK", 0, INT32_MAX);
		if (nargs == 1)
			args[1] = NULL;		/* (within argv: at worst its NULL end) */
		else if (rps__name_check(args[1]))
			die_usage("%s", rps__errbuf());
	}
}

/* -s, else $RPS_SERVERS, into psctl_opt.servers. */
static void parse_servers(const char *servers)
{
	if (!servers || !*servers)
		servers = getenv("RPS_SERVERS");
	if (!servers || !*servers)
		die_usage("no servers: give -s URI[,URI...] or set RPS_SERVERS");
	if (rps__uri_list_parse(servers, &psctl_opt.servers, &psctl_opt.nservers))
		die_usage("%s", rps__errbuf());
}

static int run_command(const char *cmd, char **args, uint32_t part, uint64_t id)
{
	if (!strcmp(cmd, "status"))
		return psctl_cmd_status();
	else if (!strcmp(cmd, "move"))
		return psctl_cmd_move(part, id);
	else if (!strcmp(cmd, "add-server"))
		return psctl_cmd_add_server(id, args[1]);
	else if (!strcmp(cmd, "remove-server") && psctl_opt.force)
		return psctl_cmd_force_remove(id);
	else if (!strcmp(cmd, "remove-server"))
		return psctl_cmd_remove_server(id);
	else if (!strcmp(cmd, "forget-lost"))
		return psctl_cmd_forget_lost(part);
	else if (!strcmp(cmd, "checkpoint"))
		return psctl_cmd_checkpoint(args[0]);
	else if (!strcmp(cmd, "restore"))
		return psctl_cmd_restore(args[0]);
	else if (!strcmp(cmd, "remove-rank"))
		return psctl_cmd_remove_rank((int)id, args[1]);
	else if (!strcmp(cmd, "set-replicas"))
		return psctl_cmd_set_replicas((uint32_t)id);
	else if (!strcmp(cmd, "rebalance"))
		return psctl_cmd_rebalance();
	else
		return psctl_cmd_transfer_leader(id);
}

int main(int argc, char **argv)
{
	const char *servers = NULL, *cmd;
	uint32_t part = 0;
	uint64_t id = 0;
	char **args;
	int nargs, ret;

	if (!parse_options(argc, argv, &servers))
		return 0;
	args = argv + optind;
	nargs = argc - optind;
	if (nargs < 1)
		die_usage("no command given");
	cmd = args[0];
	args++;
	nargs--;
	nargs = take_trailing_options(args, nargs);
	check_command(cmd, nargs);
	parse_command_args(cmd, args, nargs, &part, &id);
	if (!strcmp(cmd, "keygen"))
		return keygen(args[0]);
	parse_servers(servers);

	signal(SIGPIPE, SIG_IGN);
	ret = run_command(cmd, args, part, id);
	conns_close();
	free(psctl_opt.servers);
	if (fflush(stdout) || ferror(stdout))
		return psctl_fail("writing the output: %s", strerror(errno));
	return ret;
}
