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
 */
#include "config.h"
#include "common.h"
#include "parse.h"
#include "ctl.h"
#include "proto.h"
#include "raft.h"
#include "smap.h"
#include "uri.h"
#include "rdmaps.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STATUS_MAX_MS 5000		/* connect and STATUS wait at most this (or --timeout) */
#define ADMIN_SLACK_MS 5000		/* the ADMIN call waits this much longer than the server may take */
#define REDIRECTS 6			/* -EPERM / -EAGAIN / unreachable leader: tries */
#define MAX_CONNS (2 * RPS__SMAP_MAX_MEMBERS + 8)

static struct {
	struct rps__uri *servers;
	int nservers;
	bool json;
	bool no_rebalance;
	bool force;
	int timeout_ms;		/* --timeout: what an operation may take */
	int rpc_ms;		/* connect / STATUS */
	int level;		/* checkpoint: igzip level, -1: not given */
} g;

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
"  transfer-leader [ID]        make ID (default: the server's choice) the leader\n"
"  checkpoint DIR              write a consistent checkpoint of every tensor to\n"
"                              DIR (a directory every server can write)\n"
"  restore DIR                 load the checkpoint in DIR into the servers\n"
"\n"
"Options:\n"
"  -s, --servers LIST   servers to ask first, tcp://HOST:PORT or verbs://ADDR:PORT,\n"
"                       comma-separated (default: $RPS_SERVERS)\n"
"      --json           one JSON object instead of the text (every command)\n"
"      --timeout SEC    how long an operation may take (default 30)\n"
"      --no-rebalance   add-server: add the member only\n"
"      --level N        checkpoint: igzip level 0 (store) to 3 (default 1)\n"
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
		"          remove-server ID | transfer-leader [ID] | checkpoint DIR | restore DIR\n"
		"          (psctl --help for more)\n");
	exit(2);
}

/* Print one error line and return 1 (the exit status of a failed operation). */
static int fail(const char *fmt, ...) RPS__PRINTF(1, 2);
static int fail(const char *fmt, ...)
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

static int fail_err(void)
{
	return fail("%s", rps__errbuf());
}

static const char *errtext(int err)
{
	if (err == RPS_ESTALE_EPOCH)
		return "stale epoch";
	if (err == RPS_ELEASE)
		return "shard lock lease expired";
	if (err < 0 && err > -4096)
		return strerror(-err);
	return "unknown error";
}

static uint64_t deadline_in(int ms)
{
	return rps__now_ns() + (uint64_t)ms * 1000000u;
}

static bool expired(uint64_t deadline)
{
	return rps__now_ns() >= deadline;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
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
static int conn_get(const struct rps__uri *u, struct rps__ctl **out, bool *cached)
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
	ret = rps__ctl_open(u, g.rpc_ms, out);
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

static bool id_in(const uint64_t *ids, uint32_t n, uint64_t id, uint32_t *at)
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
static int query_status(const struct rps__uri *u, struct rps__status_rep *st, struct rps__smap *map)
{
	struct rps__ctl *ctl;
	char name[300];
	size_t len = 0;
	int32_t status = 0;
	bool cached;
	int ret, tries;

	rps__uri_str(u, name, sizeof(name));
	for (tries = 0;; tries++) {
		ret = conn_get(u, &ctl, &cached);
		if (ret)
			return ret;
		ret = rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, rbuf, sizeof(rbuf), &len, &status, g.rpc_ms);
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
		return rps__seterr(status, "%s: STATUS refused: %s", name, errtext(status));
	if (len < sizeof(*st))
		return rps__seterr(-EBADMSG, "%s: STATUS reply of %zu bytes is too short", name, len);
	memcpy(st, rbuf, sizeof(*st));
	if (st->n_voters > RPS__SMAP_MAX_MEMBERS || st->n_learners > RPS__SMAP_MAX_MEMBERS ||
	    st->n_voters + st->n_learners > RPS__ARRAY_SIZE(st->match))
		return rps__seterr(-EBADMSG, "%s: STATUS reply names %u voters and %u learners, at most %zu in all",
				   name, st->n_voters, st->n_learners, RPS__ARRAY_SIZE(st->match));
	if (map) {
		ret = rps__smap_decode(rbuf + sizeof(*st), len - sizeof(*st), map);
		if (ret)
			return rps__preerr(ret, "%s: shard map in the STATUS reply", name);
	}
	return 0;
}

/* STATUS to the first of --servers that answers. */
static int query_any(struct rps__uri *from, struct rps__status_rep *st, struct rps__smap *map)
{
	char first[512] = "";
	int i, ret = -EINVAL;

	for (i = 0; i < g.nservers; i++) {
		ret = query_status(&g.servers[i], st, map);
		if (!ret) {
			if (from)
				*from = g.servers[i];
			return 0;
		}
		if (!first[0])
			snprintf(first, sizeof(first), "%s", rps__errbuf());
	}
	if (g.nservers == 1)
		return ret;
	return rps__seterr(ret, "none of the %d servers answered; first: %s", g.nservers, first);
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

/* The leader as it sees itself. */
struct leader {
	uint64_t id;
	struct rps__uri uri;
	struct rps__status_rep st;
	struct rps__smap map;
};

/* Find the leader: ask any server, follow its leader field, confirm with the
 * leader itself (which then also gives the freshest map).  Retries through
 * an election until deadline. */
static int find_leader(struct leader *L, uint64_t deadline)
{
	static struct rps__smap map;
	struct rps__status_rep st;
	uint64_t last_term = 0;
	unsigned pause = 100;
	int ret;

	for (;;) {
		uint64_t hint;
		int hops;

		ret = query_any(NULL, &st, &map);
		if (ret)
			return ret;
		last_term = st.term;
		hint = st.role == RPS__RAFT_LEADER ? st.id : st.leader;
		for (hops = 0; hint && hops < 4; hops++) {
			ret = member_uri(&map, hint, &L->uri);
			if (ret)
				break;
			ret = query_status(&L->uri, &L->st, &L->map);
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
			if (rps__uri_parse(map.members[i].uri, &L->uri) || query_status(&L->uri, &L->st, &L->map))
				continue;
			if (L->st.role == RPS__RAFT_LEADER) {
				L->id = L->st.id;
				return 0;
			}
		}
		if (expired(deadline)) {
			if (ret)
				return rps__preerr(ret, "no leader reachable");
			return rps__seterr(-EAGAIN, "no leader elected (term %" PRIu64 "): is a majority of the voters "
					   "up? see psctl status", last_term);
		}
		sleep_ms(pause);
		pause = RPS__MIN(pause * 2, 1000u);
	}
}

/* ---- ADMIN to the leader --------------------------------------------------- */

/* Send one ADMIN operation to the leader, following -EPERM redirections.
 * what: "move partition 3 to member 2" for messages.  Returns 0, or a
 * negative errno with the one line to print in rps__errbuf(). */
static int admin(uint32_t op, uint32_t part, uint64_t id, const char *uri, struct rps__admin_rep *rep,
		 const char *what)
{
	struct rps__admin a = { .op = op, .part = part, .id = id, .timeout_ms = (uint32_t)g.timeout_ms };
	uint64_t deadline = deadline_in(g.timeout_ms);
	struct leader *L;
	struct rps__uri target = { 0 };
	uint64_t target_id = 0;
	unsigned pause = 200;
	int ret, attempt;
	bool have_target = false;

	L = malloc(sizeof(*L));
	if (!L)
		return rps__seterr(-ENOMEM, "out of memory");
	if (uri)
		snprintf(a.uri, sizeof(a.uri), "%s", uri);
	for (attempt = 0; attempt < REDIRECTS; attempt++) {
		struct rps__ctl *ctl;
		size_t len = 0;
		int32_t status = 0;
		bool cached;

		if (attempt) {
			sleep_ms(pause);
			pause = RPS__MIN(pause * 2, 1000u);
		}
		/* A STATUS first, on the channel the ADMIN will use: it replaces a
		 * channel that died with an earlier server process, so a failure of
		 * the ADMIN itself means the outcome is unknown. */
		if (have_target && query_status(&target, &L->st, &L->map))
			have_target = false;
		if (!have_target) {
			ret = find_leader(L, deadline);
			if (ret)
				goto out;
			target = L->uri;
			target_id = L->id;
		}
		have_target = false;
		ret = conn_get(&target, &ctl, &cached);
		if (ret) {
			ret = rps__preerr(ret, "%s", what);
			goto out;
		}
		memset(rep, 0, sizeof(*rep));
		ret = rps__ctl_call(ctl, RPS__MSG_ADMIN, &a, sizeof(a), rep, sizeof(*rep), &len, &status,
				    g.timeout_ms + ADMIN_SLACK_MS);
		if (ret) {
			if (ret == -ECONNRESET)
				conn_drop(ctl);
			ret = rps__preerr(ret, "%s: outcome unknown, check with psctl status", what);
			goto out;
		}
		if (len < sizeof(*rep))
			memset(rep, 0, sizeof(*rep));
		rep->msg[sizeof(rep->msg) - 1] = '\0';
		if (status == -EPERM && op == RPS__ADMIN_TRANSFER_LEADER && rep->leader &&
		    rep->leader != target_id && (!id || rep->leader == id)) {
			/* it handed leadership over before answering: done (asking the
			 * new leader again would move leadership on once more) */
			ret = 0;
			goto out;
		}
		if (status == -EPERM) {
			/* not (any more) the leader: it names the one to ask */
			if (rep->leader && !member_uri(&L->map, rep->leader, &target)) {
				have_target = true;
				target_id = rep->leader;
			}
			ret = rps__seterr(-EPERM, "%s: %s", what, rep->msg[0] ? rep->msg : "not the leader");
			continue;
		}
		if (status == -EAGAIN) {
			/* a leader that has not committed in its term yet, a change in flight */
			have_target = true;
			ret = rps__seterr(-EAGAIN, "%s: %s", what, rep->msg[0] ? rep->msg : "busy, try again");
			continue;
		}
		if (status < 0) {
			if (rep->msg[0])
				ret = rps__seterr(status, "%s", rep->msg);
			else
				ret = rps__seterr(status, "%s: %s", what, errtext(status));
			goto out;
		}
		ret = 0;
		goto out;
	}
	if (ret == -EPERM)
		ret = rps__seterr(-EAGAIN, "%s: leadership kept changing: try again", what);
out:
	free(L);
	return ret;
}

/* ---- status -------------------------------------------------------------- */

struct row {
	uint64_t id;
	char uri[RPS__SMAP_URI_MAX];
	bool ok;
	char err[512];
	struct rps__status_rep st;
};

static const char *role_name(const struct rps__status_rep *st, const struct rps__status_rep *ld)
{
	if (st->role == RPS__RAFT_LEADER)
		return "leader";
	if (id_in(st->learners, st->n_learners, st->id, NULL) ||
	    (ld && id_in(ld->learners, ld->n_learners, st->id, NULL)))
		return "learner";
	if (st->role == RPS__RAFT_CANDIDATE || st->role == RPS__RAFT_PRE_CANDIDATE)
		return "candidate";
	return "follower";
}

/* Replication lag of id as the leader sees it; false if unknown. */
static bool lag_of(const struct rps__status_rep *ld, uint64_t id, uint64_t *lag)
{
	uint32_t k;
	uint64_t match;

	if (!ld)
		return false;
	if (id == ld->id) {
		*lag = 0;
		return true;
	}
	if (id_in(ld->voters, ld->n_voters, id, &k))
		match = ld->match[k];
	else if (id_in(ld->learners, ld->n_learners, id, &k))
		match = ld->match[ld->n_voters + k];
	else
		return false;
	*lag = ld->last_index > match ? ld->last_index - match : 0;
	return true;
}

static void json_str(const char *s)
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

static void json_ids(const uint64_t *ids, uint32_t n)
{
	uint32_t i;

	putchar('[');
	for (i = 0; i < n; i++)
		printf("%s%" PRIu64, i ? "," : "", ids[i]);
	putchar(']');
}

static void print_ids(const uint64_t *ids, uint32_t n)
{
	uint32_t i;

	if (!n)
		printf("none");
	for (i = 0; i < n; i++)
		printf("%s%" PRIu64, i ? "," : "", ids[i]);
}

/* --json: what a command did, printed as one object when it succeeds */
struct done_move {
	uint32_t part;
	uint64_t from, to, epoch;
};

static struct {
	struct done_move moves[2 * RPS__SMAP_MAX_PART + 2];
	unsigned nmoves;
	bool transferred;	/* remove-server: leadership moved away first */
	uint64_t leader, term, was;
} done;

static void json_moves(void)
{
	unsigned i;

	printf("\"moves\":[");
	for (i = 0; i < done.nmoves; i++)
		printf("%s{\"partition\":%" PRIu32 ",\"from\":%" PRIu64 ",\"to\":%" PRIu64 ",\"epoch\":%" PRIu64 "}",
		       i ? "," : "", done.moves[i].part, done.moves[i].from, done.moves[i].to, done.moves[i].epoch);
	putchar(']');
}

static int cmd_status(void)
{
	static struct rps__smap map, m2, lmap;
	static struct row rows[2 * RPS__SMAP_MAX_MEMBERS];
	struct rps__status_rep seed;
	const struct rps__status_rep *ld = NULL, *info;
	struct rps__uri seed_uri;
	char seed_name[300];
	uint64_t leader;
	uint32_t nrows = 0, i;
	bool have_lmap = false;
	size_t w = 3;
	int ret;

	ret = query_any(&seed_uri, &seed, &map);
	if (ret)
		return fail_err();
	rps__uri_str(&seed_uri, seed_name, sizeof(seed_name));
	for (i = 0; i < map.nmembers && i < RPS__SMAP_MAX_MEMBERS; i++) {
		struct row *r = &rows[nrows++];
		struct rps__uri u;

		r->id = map.members[i].id;
		snprintf(r->uri, sizeof(r->uri), "%s", map.members[i].uri);
		ret = rps__uri_parse(r->uri, &u);
		if (!ret)
			ret = query_status(&u, &r->st, &m2);
		if (ret) {
			snprintf(r->err, sizeof(r->err), "%s", rps__errbuf());
			continue;
		}
		if (r->st.id != r->id) {
			snprintf(r->err, sizeof(r->err), "%s answers as member %" PRIu64 ", not %" PRIu64,
				 r->uri, r->st.id, r->id);
			continue;
		}
		r->ok = true;
		if (r->st.role == RPS__RAFT_LEADER && (!ld || r->st.term > ld->term)) {
			ld = &r->st;
			lmap = m2;
			have_lmap = true;
		}
	}
	if (have_lmap)
		map = lmap;	/* the leader's map is the freshest */
	info = ld ? ld : &seed;
	/* Raft nodes the map does not name (being added or removed) */
	for (i = 0; i < info->n_voters + info->n_learners && nrows < RPS__ARRAY_SIZE(rows); i++) {
		uint64_t id = i < info->n_voters ? info->voters[i] : info->learners[i - info->n_voters];
		struct row *r;
		uint32_t k;
		bool known = false;

		for (k = 0; k < nrows; k++)
			known = known || rows[k].id == id;
		if (known)
			continue;
		r = &rows[nrows++];
		r->id = id;
		snprintf(r->err, sizeof(r->err), "a Raft %s not in the shard map",
			 i < info->n_voters ? "voter" : "learner");
	}
	leader = ld ? ld->id : seed.leader;

	if (g.json) {
		printf("{\"leader\":");
		if (leader)
			printf("%" PRIu64, leader);
		else
			printf("null");
		printf(",\"term\":%" PRIu64 ",\"voters\":", info->term);
		json_ids(info->voters, info->n_voters);
		printf(",\"learners\":");
		json_ids(info->learners, info->n_learners);
		printf(",\"fsync\":%s,\"members\":[", info->fsync ? "true" : "false");
		for (i = 0; i < nrows; i++) {
			const struct row *r = &rows[i];
			uint64_t lag;

			printf("%s{\"id\":%" PRIu64 ",\"uri\":", i ? "," : "", r->id);
			json_str(r->uri);
			if (!r->ok) {
				printf(",\"reachable\":false,\"error\":");
				json_str(r->err);
				putchar('}');
				continue;
			}
			printf(",\"reachable\":true,\"role\":\"%s\",\"term\":%" PRIu64 ",\"commit\":%" PRIu64
			       ",\"applied\":%" PRIu64 ",\"last_index\":%" PRIu64 ",\"lag\":",
			       role_name(&r->st, ld), r->st.term, r->st.commit, r->st.applied, r->st.last_index);
			if (lag_of(ld, r->id, &lag))
				printf("%" PRIu64, lag);
			else
				printf("null");
			printf(",\"conns\":%u,\"shards\":%" PRIu64 ",\"shard_bytes\":%" PRIu64 ",\"tensors\":%" PRIu64
			       ",\"partitions\":%u}", r->st.n_conns, r->st.shards, r->st.shard_bytes, r->st.tensors,
			       rps__smap_owned(&map, r->id));
		}
		printf("],\"map\":");
		rps__smap_print_json(&map, stdout);
		printf("}\n");
		return 0;
	}

	for (i = 0; i < nrows; i++)
		w = RPS__MAX(w, strlen(rows[i].uri));
	printf("%-4s %-*s %-9s %6s %8s %8s %6s %5s %5s %8s\n", "ID", (int)w, "URI", "ROLE", "TERM", "COMMIT",
	       "APPLIED", "LAG", "CONNS", "PARTS", "SHARDS");
	for (i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		char lagbuf[24] = "-";
		uint64_t lag;

		if (!r->ok) {
			const char *e = r->err;
			size_t ul = strlen(r->uri);

			/* the URI is in its column already */
			if (ul && !strncmp(e, r->uri, ul) && !strncmp(e + ul, ": ", 2))
				e += ul + 2;
			printf("%-4" PRIu64 " %-*s unreachable: %s\n", r->id, (int)w, r->uri[0] ? r->uri : "-", e);
			continue;
		}
		if (lag_of(ld, r->id, &lag))
			snprintf(lagbuf, sizeof(lagbuf), "%" PRIu64, lag);
		printf("%-4" PRIu64 " %-*s %-9s %6" PRIu64 " %8" PRIu64 " %8" PRIu64 " %6s %5u %5u %8" PRIu64 "\n",
		       r->id, (int)w, r->uri, role_name(&r->st, ld), r->st.term, r->st.commit, r->st.applied,
		       lagbuf, r->st.n_conns, rps__smap_owned(&map, r->id), r->st.shards);
	}
	printf("\ncluster: leader ");
	if (leader)
		printf("%" PRIu64, leader);
	else
		printf("none (election in progress?)");
	printf(", term %" PRIu64 ", voters ", info->term);
	print_ids(info->voters, info->n_voters);
	printf(", learners ");
	print_ids(info->learners, info->n_learners);
	printf(", fsync %s", info->fsync ? "on (durable)" : "off");
	if (!ld)
		printf(" (as %s sees it)", seed_name);
	printf("\n\n");
	rps__smap_print(&map, stdout);
	return 0;
}

/* ---- moves ------------------------------------------------------------------ */

/* One move, printed.  from: the owner before it (for the message). */
static int do_move(uint32_t part, uint64_t from, uint64_t to)
{
	struct rps__admin_rep rep;
	char what[96];
	int ret;

	snprintf(what, sizeof(what), "move partition %u to member %" PRIu64, part, to);
	ret = admin(RPS__ADMIN_MOVE, part, to, NULL, &rep, what);
	if (ret)
		return fail_err();
	if (g.json) {
		if (done.nmoves < RPS__ARRAY_SIZE(done.moves))
			done.moves[done.nmoves++] = (struct done_move){ part, from, to, rep.epoch };
		return 0;
	}
	printf("partition %u: member %" PRIu64 " -> member %" PRIu64 ", epoch %" PRIu64 "\n", part, from, to,
	       rep.epoch);
	fflush(stdout);
	return 0;
}

static int cmd_move(uint32_t part, uint64_t to)
{
	static struct leader L;
	int ret;

	ret = find_leader(&L, deadline_in(g.timeout_ms));
	if (ret)
		return fail_err();
	if (part >= L.map.npart)
		return fail("partition %u does not exist: the cluster has partitions 0..%u", part, L.map.npart - 1);
	if (!rps__smap_member(&L.map, to))
		return fail("member %" PRIu64 " is not in the shard map: add it with psctl add-server", to);
	if (L.map.parts[part].owner == to && !L.map.parts[part].moving_to) {
		if (g.json)
			printf("{\"partition\":%u,\"owner\":%" PRIu64 ",\"epoch\":%" PRIu64 ",\"moves\":[]}\n", part,
			       to, L.map.parts[part].epoch);
		else
			printf("partition %u: already on member %" PRIu64 ", epoch %" PRIu64 "\n", part, to,
			       L.map.parts[part].epoch);
		return 0;
	}
	ret = do_move(part, L.map.parts[part].owner, to);
	if (!ret && g.json) {
		printf("{\"partition\":%u,\"owner\":%" PRIu64 ",\"epoch\":%" PRIu64 ",", part, to,
		       done.moves[0].epoch);
		json_moves();
		printf("}\n");
	}
	return ret;
}

/* Most (most = true) or least loaded member other than skip; 0 if none.
 * Ties go to the lowest id. */
static uint64_t pick_member(const struct rps__smap *m, uint64_t skip, bool most, uint32_t *load)
{
	uint64_t best = 0;
	uint32_t best_n = 0, i;

	for (i = 0; i < m->nmembers; i++) {
		uint64_t id = m->members[i].id;
		uint32_t n = rps__smap_owned(m, id);

		if (id == skip)
			continue;
		if (!best || (most ? n > best_n : n < best_n)) {
			best = id;
			best_n = n;
		}
	}
	if (load)
		*load = best_n;
	return best;
}

/* A partition owned by id and not moving (the highest-numbered); -1 if none. */
static int pick_part(const struct rps__smap *m, uint64_t id)
{
	int p;

	for (p = (int)m->npart - 1; p >= 0; p--)
		if (m->parts[p].owner == id && !m->parts[p].moving_to)
			return p;
	return -1;
}

/* add-server --json; map: the leader's after the rebalancing, NULL without it */
static void json_added(uint64_t id, const char *uri, uint64_t index, const struct rps__smap *map)
{
	printf("{\"id\":%" PRIu64 ",\"uri\":", id);
	json_str(uri);
	printf(",\"log_index\":%" PRIu64 ",", index);
	json_moves();
	if (map)
		printf(",\"owned\":%u,\"partitions\":%u}\n", rps__smap_owned(map, id), map->npart);
	else
		printf(",\"owned\":null,\"partitions\":null}\n");
}

static int cmd_add_server(uint64_t id, const char *uri)
{
	static struct leader L;
	struct rps__admin_rep rep;
	char what[200];
	uint64_t deadline;
	unsigned moves = 0;
	int ret;

	snprintf(what, sizeof(what), "add member %" PRIu64 " at %s", id, uri);
	ret = admin(RPS__ADMIN_ADD_SERVER, 0, id, uri, &rep, what);
	if (ret)
		return fail_err();
	if (!g.json) {
		printf("member %" PRIu64 " added at %s (log index %" PRIu64 ")\n", id, uri, rep.index);
		fflush(stdout);
	}
	if (g.no_rebalance) {
		if (g.json)
			json_added(id, uri, rep.index, NULL);
		return 0;
	}

	deadline = deadline_in(g.timeout_ms);
	for (;;) {
		uint32_t most_n, mine;
		uint64_t most;
		int p;

		ret = find_leader(&L, deadline_in(g.timeout_ms));
		if (ret)
			return fail_err();
		if (!rps__smap_member(&L.map, id)) {
			if (expired(deadline))
				return fail("member %" PRIu64 " does not show in the leader's shard map: "
					    "rebalance with psctl move", id);
			sleep_ms(200);
			continue;
		}
		mine = rps__smap_owned(&L.map, id);
		most = pick_member(&L.map, id, true, &most_n);
		if (!most || most_n < mine + 2)
			break;
		p = pick_part(&L.map, most);
		if (p < 0) {
			/* all of its partitions are moving: let those finish */
			if (expired(deadline))
				return fail("member %" PRIu64 "'s partitions stay in motion: rebalance later", most);
			sleep_ms(200);
			continue;
		}
		if (moves++ > 2 * RPS__SMAP_MAX_PART)
			return fail("rebalancing does not converge: see psctl status");
		ret = do_move((uint32_t)p, most, id);
		if (ret)
			return ret;
		deadline = deadline_in(g.timeout_ms);
	}
	if (g.json)
		json_added(id, uri, rep.index, &L.map);
	else
		printf("member %" PRIu64 " owns %u of %u partitions\n", id, rps__smap_owned(&L.map, id), L.map.npart);
	return 0;
}

/* Wait until the leader is not `old` (want == 0) or is `want`. */
static int wait_leader(struct leader *L, uint64_t old, uint64_t want)
{
	uint64_t deadline = deadline_in(g.timeout_ms);
	int ret;

	for (;;) {
		ret = find_leader(L, deadline);
		if (!ret && (want ? L->id == want : L->id != old))
			return 0;
		if (expired(deadline)) {
			if (ret)
				return ret;
			if (want && L->id != old)
				return rps__seterr(-EAGAIN, "member %" PRIu64 " became the leader, not %" PRIu64,
						   L->id, want);
			return rps__seterr(-ETIMEDOUT, "member %" PRIu64 " is still the leader after %d s: "
					   "are the other voters caught up? see psctl status", old,
					   g.timeout_ms / 1000);
		}
		sleep_ms(200);
	}
}

static int transfer(struct leader *L, uint64_t to)
{
	struct rps__admin_rep rep;
	uint64_t old = L->id;
	char what[96];
	int ret;

	if (to)
		snprintf(what, sizeof(what), "transfer leadership to member %" PRIu64, to);
	else
		snprintf(what, sizeof(what), "transfer leadership away from member %" PRIu64, old);
	ret = admin(RPS__ADMIN_TRANSFER_LEADER, 0, to, NULL, &rep, what);
	if (!ret)
		ret = wait_leader(L, old, to);
	if (ret)
		return fail_err();
	if (g.json) {
		done.transferred = true;
		done.leader = L->id;
		done.term = L->st.term;
		done.was = old;
		return 0;
	}
	printf("leader: member %" PRIu64 " (term %" PRIu64 "), was member %" PRIu64 "\n", L->id, L->st.term, old);
	fflush(stdout);
	return 0;
}

/* A dead member goes at once: the leader aborts its moves, hands its
 * partitions to the others marked lost, and removes it. */
static int cmd_force_remove(uint64_t id)
{
	struct rps__admin_rep rep;
	char what[96];

	snprintf(what, sizeof(what), "force removal of member %" PRIu64, id);
	if (admin(RPS__ADMIN_FORCE_REMOVE, 0, id, NULL, &rep, what))
		return fail_err();
	if (g.json)
		printf("{\"id\":%" PRIu64 ",\"forced\":true}\n", id);
	else
		printf("member %" PRIu64 " removed; its partitions are lost: psctl restore DIR, or psctl forget-lost all\n",
		       id);
	return 0;
}

/* Accept lost partitions empty (their contents are gone for good). */
static int cmd_forget_lost(uint32_t part)
{
	struct rps__admin_rep rep;
	char what[96];

	if (part == UINT32_MAX)
		snprintf(what, sizeof(what), "forget every lost partition");
	else
		snprintf(what, sizeof(what), "forget lost partition %" PRIu32, part);
	if (admin(RPS__ADMIN_FORGET_LOST, part, 0, NULL, &rep, what))
		return fail_err();
	if (g.json && part == UINT32_MAX)
		printf("{\"partition\":null}\n");
	else if (g.json)
		printf("{\"partition\":%" PRIu32 "}\n", part);
	else
		printf("%s: done, served empty from now on\n", what);
	return 0;
}

static int cmd_remove_server(uint64_t id)
{
	static struct leader L;
	struct rps__admin_rep rep;
	char what[96];
	uint64_t deadline;
	unsigned moves = 0;
	int ret;

	ret = find_leader(&L, deadline_in(g.timeout_ms));
	if (ret)
		return fail_err();
	if (!rps__smap_member(&L.map, id) && !id_in(L.st.voters, L.st.n_voters, id, NULL) &&
	    !id_in(L.st.learners, L.st.n_learners, id, NULL))
		return fail("member %" PRIu64 " is not in the cluster: see psctl status", id);
	if (rps__smap_member(&L.map, id) && L.map.nmembers == 1)
		return fail("member %" PRIu64 " is the only member: there is nowhere to move its partitions", id);
	if (L.id == id) {
		ret = transfer(&L, 0);
		if (ret)
			return ret;
	}

	deadline = deadline_in(g.timeout_ms);
	for (;;) {
		uint64_t to;
		uint32_t p;
		int q;
		bool busy = false;

		ret = find_leader(&L, deadline_in(g.timeout_ms));
		if (ret)
			return fail_err();
		for (p = 0; p < L.map.npart; p++)
			busy = busy || (L.map.parts[p].moving_to == id ||
					(L.map.parts[p].owner == id && L.map.parts[p].moving_to));
		q = pick_part(&L.map, id);
		if (q < 0 && !busy)
			break;
		if (q < 0) {
			/* moves into or out of it are under way: let them finish */
			if (expired(deadline))
				return fail("partitions keep moving to or from member %" PRIu64 ": try again later", id);
			sleep_ms(200);
			continue;
		}
		to = pick_member(&L.map, id, false, NULL);
		if (!to)
			return fail("no other member to move partition %d to", q);
		if (moves++ > 2 * RPS__SMAP_MAX_PART)
			return fail("member %" PRIu64 " keeps getting partitions: see psctl status", id);
		ret = do_move((uint32_t)q, id, to);
		if (ret)
			return ret;
		deadline = deadline_in(g.timeout_ms);
	}

	snprintf(what, sizeof(what), "remove member %" PRIu64, id);
	ret = admin(RPS__ADMIN_REMOVE_SERVER, 0, id, NULL, &rep, what);
	if (ret)
		return fail_err();
	if (g.json) {
		printf("{\"id\":%" PRIu64 ",\"forced\":false,\"log_index\":%" PRIu64 ",\"transfer\":", id, rep.index);
		if (done.transferred)
			printf("{\"leader\":%" PRIu64 ",\"term\":%" PRIu64 ",\"was\":%" PRIu64 "}", done.leader,
			       done.term, done.was);
		else
			printf("null");
		putchar(',');
		json_moves();
		printf("}\n");
	} else {
		printf("member %" PRIu64 " removed (log index %" PRIu64 "): stop its rdmapsd now\n", id, rep.index);
	}
	return 0;
}

/* ---- checkpoint / restore --------------------------------------------------- */

struct ck_member {
	uint64_t id;
	struct rps__uri uri;
	struct rps__ctl *ctl;
	uint32_t nshards;	/* checkpoint: what TAKE said; restore: installed */
	uint64_t pause_ns;
	uint64_t raw;
	uint64_t bytes;		/* checkpoint: what FINISH said */
};

/* Every member of the map, each with its own admin channel. */
static int ck_members(struct ck_member *m, uint32_t *n)
{
	struct rps__status_rep st;
	struct rps__smap map;
	struct rps__uri from;
	uint32_t i;
	int ret;

	ret = query_any(&from, &st, &map);
	if (ret)
		return ret;
	for (i = 0; i < map.nmembers; i++) {
		bool cached;
		m[i].id = map.members[i].id;
		if (rps__uri_parse(map.members[i].uri, &m[i].uri))
			return rps__seterr(-EINVAL, "member %llu: bad address %s", (unsigned long long)m[i].id,
					   map.members[i].uri);
		ret = conn_get(&m[i].uri, &m[i].ctl, &cached);
		if (ret)
			return rps__preerr(ret, "member %llu: every member takes part in a checkpoint",
					   (unsigned long long)m[i].id);
	}
	*n = map.nmembers;
	return 0;
}

static char ckbuf[RPS__BIG_MSG_MAX];

/* One CKPT request; the reply (fixed part + targets) is left in ckbuf. */
static int ck_call(struct ck_member *m, const struct rps__ckpt_req *req, const struct rps__ckpt_target *t,
		   uint32_t nt, struct rps__ckpt_rep **rep)
{
	static char out[RPS__BIG_MSG_MAX];
	size_t len = sizeof(*req) + (size_t)nt * sizeof(*t), rlen = 0;
	int32_t status = 0;
	int ret;

	if (len + sizeof(struct rps__msg_hdr) > sizeof(out))
		return rps__seterr(-E2BIG, "too many sync tensors for one request");
	memcpy(out, req, sizeof(*req));
	((struct rps__ckpt_req *)out)->ntargets = nt;
	if (nt)
		memcpy(out + sizeof(*req), t, (size_t)nt * sizeof(*t));
	ret = rps__ctl_call(m->ctl, RPS__MSG_CKPT, out, len, ckbuf, sizeof(ckbuf), &rlen, &status, g.rpc_ms + g.timeout_ms);
	if (ret)
		return ret;
	*rep = (struct rps__ckpt_rep *)ckbuf;
	if (status) {
		if (rlen >= sizeof(**rep) && (*rep)->msg[0])
			return rps__seterr(status, "member %llu: %s", (unsigned long long)m->id, (*rep)->msg);
		return rps__seterr(status, "member %llu: %s", (unsigned long long)m->id, errtext(status));
	}
	if (rlen < sizeof(**rep))
		return rps__seterr(-EBADMSG, "member %llu: short checkpoint reply", (unsigned long long)m->id);
	return 0;
}

static int cmd_checkpoint(const char *dir)
{
	static struct ck_member m[RPS__SMAP_MAX_MEMBERS];
	static struct rps__ckpt_target tg[4096];
	struct rps__ckpt_req req;
	struct rps__ckpt_rep *rep;
	uint64_t bytes = 0, raw = 0, pause_max = 0;
	uint32_t n = 0, i, k, nt = 0, shards = 0;
	struct timespec ts;
	int ret;

	ret = ck_members(m, &n);
	if (ret)
		return fail_err();
	clock_gettime(CLOCK_REALTIME, &ts);
	memset(&req, 0, sizeof(req));
	req.ckpt_id = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	req.level = g.level >= 0 ? (uint32_t)g.level : 1;
	req.timeout_ms = (uint32_t)g.timeout_ms;
	if (strlen(dir) >= sizeof(req.path))
		return fail("checkpoint directory '%s': at most %zu characters", dir, sizeof(req.path) - 1);
	snprintf(req.path, sizeof(req.path), "%s", dir);
	/* 1. every server holds its sync tensors and says where they are */
	req.op = RPS__CKPT_PREPARE;
	for (i = 0; i < n && !ret; i++) {
		const struct rps__ckpt_target *got;
		ret = ck_call(&m[i], &req, NULL, 0, &rep);
		if (ret)
			break;
		got = (const void *)(ckbuf + sizeof(*rep));
		for (k = 0; k < rep->ntargets; k++) {
			uint32_t j;
			for (j = 0; j < nt && strcmp(tg[j].name, got[k].name); j++)
				;
			if (j == nt) {
				if (nt == RPS__ARRAY_SIZE(tg)) {
					ret = rps__seterr(-E2BIG, "more than %zu sync tensors", RPS__ARRAY_SIZE(tg));
					break;
				}
				tg[nt++] = got[k];
			} else if (got[k].step > tg[j].step) {
				tg[j].step = got[k].step;
			}
		}
	}
	/* 2. every sync tensor to the highest step any shard reached, copy
	 * (each server answers once its copy is done: the pause is over) */
	if (!ret) {
		req.op = RPS__CKPT_TAKE;
		for (i = 0; i < n && !ret; i++) {
			ret = ck_call(&m[i], &req, tg, nt, &rep);
			if (ret)
				break;
			m[i].nshards = rep->nshards;
			m[i].pause_ns = rep->pause_ns;
			m[i].raw = rep->raw_bytes;
		}
	}
	/* 3. the files, written meanwhile by the servers' threads */
	if (!ret) {
		req.op = RPS__CKPT_FINISH;
		for (i = 0; i < n && !ret; i++) {
			ret = ck_call(&m[i], &req, NULL, 0, &rep);
			if (ret)
				break;
			m[i].bytes = rep->bytes;
			bytes += rep->bytes;
			raw += m[i].raw;
			shards += m[i].nshards;
			pause_max = RPS__MAX(pause_max, m[i].pause_ns);
			if (!g.json)
				printf("member %llu: %u shards, %llu bytes (%.1f%% of %llu), training paused %.3f ms\n",
			       (unsigned long long)m[i].id, m[i].nshards, (unsigned long long)rep->bytes,
			       m[i].raw ? 100.0 * (double)rep->bytes / (double)m[i].raw : 0.0,
			       (unsigned long long)m[i].raw, (double)m[i].pause_ns / 1e6);
		}
	}
	if (ret) {
		char msg[512];
		snprintf(msg, sizeof(msg), "%s", rps__errbuf());
		req.op = RPS__CKPT_ABORT;
		for (i = 0; i < n; i++)
			ck_call(&m[i], &req, NULL, 0, &rep);
		return fail("checkpoint %s: %s", dir, msg);
	}
	if (g.json) {
		printf("{\"dir\":");
		json_str(dir);
		printf(",\"shards\":%u,\"bytes\":%llu,\"raw_bytes\":%llu,\"longest_pause_ns\":%llu,\"tensors\":[",
		       shards, (unsigned long long)bytes, (unsigned long long)raw, (unsigned long long)pause_max);
		for (k = 0; k < nt; k++) {
			printf("%s{\"name\":", k ? "," : "");
			json_str(tg[k].name);
			printf(",\"step\":%llu}", (unsigned long long)tg[k].step);
		}
		printf("],\"members\":[");
		for (i = 0; i < n; i++)
			printf("%s{\"id\":%llu,\"shards\":%u,\"bytes\":%llu,\"raw_bytes\":%llu,\"pause_ns\":%llu}",
			       i ? "," : "", (unsigned long long)m[i].id, m[i].nshards, (unsigned long long)m[i].bytes,
			       (unsigned long long)m[i].raw, (unsigned long long)m[i].pause_ns);
		printf("]}\n");
		return 0;
	}
	printf("checkpoint %s: %u shards of %u sync tensor(s) at", dir, shards, nt);
	for (k = 0; k < nt; k++)
		printf(" %s@%llu", tg[k].name, (unsigned long long)tg[k].step);
	printf("%s; %llu bytes written for %llu bytes of state; longest pause %.3f ms\n", nt ? "" : " -",
	       (unsigned long long)bytes, (unsigned long long)raw, (double)pause_max / 1e6);
	return 0;
}

static int cmd_restore(const char *dir)
{
	static struct ck_member m[RPS__SMAP_MAX_MEMBERS];
	struct rps__ckpt_req req;
	struct rps__ckpt_rep *rep;
	uint64_t seen = 0, total = 0;
	uint32_t n = 0, i;
	int ret;

	ret = ck_members(m, &n);
	if (ret)
		return fail_err();
	memset(&req, 0, sizeof(req));
	req.op = RPS__CKPT_RESTORE;
	if (strlen(dir) >= sizeof(req.path))
		return fail("checkpoint directory '%s': at most %zu characters", dir, sizeof(req.path) - 1);
	snprintf(req.path, sizeof(req.path), "%s", dir);
	for (i = 0; i < n; i++) {
		ret = ck_call(&m[i], &req, NULL, 0, &rep);
		if (ret)
			return fail("restore %s: %s", dir, rps__errbuf());
		if (i && rep->seen_shards != seen)
			return fail("restore %s: members read different checkpoints (%llu and %llu shards): is DIR the same place for every server?",
				    dir, (unsigned long long)seen, (unsigned long long)rep->seen_shards);
		seen = rep->seen_shards;
		total += rep->nshards;
		m[i].nshards = rep->nshards;
		if (!g.json)
			printf("member %llu: %u shards installed\n", (unsigned long long)m[i].id, rep->nshards);
	}
	if (total != seen)
		return fail("restore %s: %llu of the checkpoint's %llu shards installed: a partition without a serving owner (a move in progress?)",
			    dir, (unsigned long long)total, (unsigned long long)seen);
	if (g.json) {
		printf("{\"dir\":");
		json_str(dir);
		printf(",\"shards\":%llu,\"members\":[", (unsigned long long)seen);
		for (i = 0; i < n; i++)
			printf("%s{\"id\":%llu,\"shards\":%u}", i ? "," : "", (unsigned long long)m[i].id,
			       m[i].nshards);
		printf("]}\n");
		return 0;
	}
	printf("restore %s: all %llu shards installed\n", dir, (unsigned long long)seen);
	return 0;
}

static int cmd_transfer_leader(uint64_t to)
{
	static struct leader L;
	int ret;

	ret = find_leader(&L, deadline_in(g.timeout_ms));
	if (ret)
		return fail_err();
	if (to && L.id == to) {
		if (g.json)
			printf("{\"leader\":%" PRIu64 ",\"term\":%" PRIu64 ",\"was\":%" PRIu64 "}\n", L.id, L.st.term,
			       L.id);
		else
			printf("leader: member %" PRIu64 " (term %" PRIu64 "), already\n", L.id, L.st.term);
		return 0;
	}
	if (to && !id_in(L.st.voters, L.st.n_voters, to, NULL))
		return fail("member %" PRIu64 " is not a voter: only voters can lead (see psctl status)", to);
	ret = transfer(&L, to);
	if (!ret && g.json)
		printf("{\"leader\":%" PRIu64 ",\"term\":%" PRIu64 ",\"was\":%" PRIu64 "}\n", done.leader, done.term,
		       done.was);
	return ret;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	enum { OPT_JSON = 256, OPT_TIMEOUT, OPT_NO_REBALANCE, OPT_LEVEL, OPT_FORCE };
	static const struct option longopts[] = {
		{ "servers", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "no-rebalance", no_argument, NULL, OPT_NO_REBALANCE },
		{ "level", required_argument, NULL, OPT_LEVEL },
		{ "force", no_argument, NULL, OPT_FORCE },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *servers = NULL, *cmd;
	uint32_t part = 0;
	uint64_t id = 0;
	char **args;
	int nargs, c, ret;
	double sec;
	char *end;

	g.timeout_ms = 30000;
	g.level = -1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":s:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			servers = optarg;
			break;
		case OPT_JSON:
			g.json = true;
			break;
		case OPT_TIMEOUT:
			errno = 0;
			sec = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(sec >= 0.001 && sec <= 86400))
				die_usage("--timeout '%s': expected seconds, from 0.001 to 86400", optarg);
			g.timeout_ms = (int)(sec * 1000 + 0.5);
			break;
		case OPT_NO_REBALANCE:
			g.no_rebalance = true;
			break;
		case OPT_FORCE:
			g.force = true;
			break;
		case OPT_LEVEL:
			if (!strcmp(optarg, "0") || !strcmp(optarg, "1") || !strcmp(optarg, "2") || !strcmp(optarg, "3"))
				g.level = optarg[0] - '0';
			else
				die_usage("--level '%s': igzip levels are 0 (store) to 3", optarg);
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("psctl %s\n", PACKAGE_VERSION);
			return 0;
		case ':':
			die_usage("%s needs an argument", argv[optind - 1]);
			break;
		default:
			if (optopt)
				die_usage("unknown option -%c", optopt);
			die_usage("unknown option %s", argv[optind - 1]);
		}
	}
	g.rpc_ms = RPS__MIN(g.timeout_ms, STATUS_MAX_MS);
	args = argv + optind;
	nargs = argc - optind;
	if (nargs < 1)
		die_usage("no command given");
	cmd = args[0];
	args++;
	nargs--;
	/* with POSIXLY_CORRECT set, options after the command arrive here */
	{
		int i, n = 0;
		for (i = 0; i < nargs; i++) {
			if (!strcmp(args[i], "--no-rebalance"))
				g.no_rebalance = true;
			else if (!strcmp(args[i], "--force"))
				g.force = true;
			else if (!strcmp(args[i], "--json"))
				g.json = true;
			else if (args[i][0] == '-' && args[i][1])
				die_usage("%s: put options before the command", args[i]);
			else
				args[n++] = args[i];
		}
		nargs = n;
	}
	if (strcmp(cmd, "status") && strcmp(cmd, "move") && strcmp(cmd, "add-server") &&
	    strcmp(cmd, "remove-server") && strcmp(cmd, "transfer-leader") && strcmp(cmd, "checkpoint") &&
	    strcmp(cmd, "restore") && strcmp(cmd, "forget-lost"))
		die_usage("unknown command '%s'", cmd);
	if (g.force && strcmp(cmd, "remove-server"))
		die_usage("--force goes with remove-server");
	if (g.no_rebalance && strcmp(cmd, "add-server"))
		die_usage("--no-rebalance goes with add-server");
	if (g.level >= 0 && strcmp(cmd, "checkpoint"))
		die_usage("--level goes with checkpoint");

	/* arguments before servers: a usage error wins over a missing server list */
	{
		static const struct { const char *cmd; int min, max; const char *args; } shapes[] = {
			{ "status", 0, 0, "" },
			{ "move", 2, 2, " PART ID" },
			{ "add-server", 2, 2, " ID URI [--no-rebalance]" },
			{ "remove-server", 1, 1, " ID" },
			{ "transfer-leader", 0, 1, " [ID]" },
			{ "checkpoint", 1, 1, " DIR" },
			{ "restore", 1, 1, " DIR" },
			{ "forget-lost", 1, 1, " PART|all" },
		};
		size_t i;
		for (i = 0; i < RPS__ARRAY_SIZE(shapes); i++)
			if (!strcmp(cmd, shapes[i].cmd) && (nargs < shapes[i].min || nargs > shapes[i].max))
				die_usage("%s takes%s%s", cmd, *shapes[i].args ? "" : " no arguments", shapes[i].args);
	}
	if (!strcmp(cmd, "move")) {
		part = (uint32_t)parse_u64(args[0], "PART", 0, RPS__SMAP_MAX_PART - 1);
		id = parse_u64(args[1], "ID", 1, UINT64_MAX);
	} else if (!strcmp(cmd, "add-server")) {
		struct rps__uri u;
		id = parse_u64(args[0], "ID", 1, UINT64_MAX);
		if (rps__uri_parse(args[1], &u))
			die_usage("%s", rps__errbuf());
		if (strlen(args[1]) >= RPS__SMAP_URI_MAX)
			die_usage("URI '%s': at most %u characters", args[1], RPS__SMAP_URI_MAX - 1);
	} else if (!strcmp(cmd, "remove-server")) {
		id = parse_u64(args[0], "ID", 1, UINT64_MAX);
	} else if (!strcmp(cmd, "forget-lost")) {
		part = !strcmp(args[0], "all") ? UINT32_MAX :
		       (uint32_t)parse_u64(args[0], "PART", 0, RPS__SMAP_MAX_PART - 1);
	} else if (!strcmp(cmd, "transfer-leader") && nargs == 1) {
		id = parse_u64(args[0], "ID", 1, UINT64_MAX);
	}

	if (!servers || !*servers)
		servers = getenv("RPS_SERVERS");
	if (!servers || !*servers)
		die_usage("no servers: give -s URI[,URI...] or set RPS_SERVERS");
	if (rps__uri_list_parse(servers, &g.servers, &g.nservers))
		die_usage("%s", rps__errbuf());

	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(cmd, "status"))
		ret = cmd_status();
	else if (!strcmp(cmd, "move"))
		ret = cmd_move(part, id);
	else if (!strcmp(cmd, "add-server"))
		ret = cmd_add_server(id, args[1]);
	else if (!strcmp(cmd, "remove-server") && g.force)
		ret = cmd_force_remove(id);
	else if (!strcmp(cmd, "remove-server"))
		ret = cmd_remove_server(id);
	else if (!strcmp(cmd, "forget-lost"))
		ret = cmd_forget_lost(part);
	else if (!strcmp(cmd, "checkpoint"))
		ret = cmd_checkpoint(args[0]);
	else if (!strcmp(cmd, "restore"))
		ret = cmd_restore(args[0]);
	else
		ret = cmd_transfer_leader(id);
	conns_close();
	free(g.servers);
	if (fflush(stdout) || ferror(stdout))
		return fail("writing the output: %s", strerror(errno));
	return ret;
}
