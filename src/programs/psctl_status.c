/*
 * psctl_status.c - psctl status: every member's Raft state, the cluster as
 * the leader sees it, and the partition map, as tables or one JSON object.
 */
#include "config.h"
#include "programs/psctl_int.h"
#include "control/raft.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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
	if (psctl_id_in(st->learners, st->n_learners, st->id, NULL) ||
	    (ld && psctl_id_in(ld->learners, ld->n_learners, st->id, NULL)))
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
	if (psctl_id_in(ld->voters, ld->n_voters, id, &k))
		match = ld->match[k];
	else if (psctl_id_in(ld->learners, ld->n_learners, id, &k))
		match = ld->match[ld->n_voters + k];
	else
		return false;
	*lag = ld->last_index > match ? ld->last_index - match : 0;
	return true;
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

/* What status shows: every member's answer, and the view of the cluster. */
struct status_view {
	struct rps__smap *map;		/* the leader's if it answered, else the seed's */
	struct row rows[2 * RPS__SMAP_MAX_MEMBERS];
	uint32_t nrows;
	struct rps__status_rep seed;	/* the first of --servers that answered */
	char seed_name[300];
	const struct rps__status_rep *ld;	/* the leader's STATUS, NULL if none answered */
	const struct rps__status_rep *info;	/* ld, else seed */
	uint64_t leader;
};

/* STATUS to every member of the seed's map; the leader's map wins. */
static int status_ask_members(struct status_view *v)
{
	static struct rps__smap m2, lmap;
	struct rps__uri seed_uri;
	bool have_lmap = false;
	uint32_t i;
	int ret;

	ret = psctl_query_any(&seed_uri, &v->seed, v->map);
	if (ret)
		return ret;
	rps__uri_str(&seed_uri, v->seed_name, sizeof(v->seed_name));
	for (i = 0; i < v->map->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++) {
		struct row *r = &v->rows[v->nrows++];
		struct rps__uri u;

		r->id = v->map->members[i].id;
		snprintf(r->uri, sizeof(r->uri), "%s", v->map->members[i].uri);
		ret = rps__uri_parse(r->uri, &u);
		if (!ret)
			ret = psctl_query_status(&u, &r->st, &m2);
		if (ret) {
			snprintf(r->err, sizeof(r->err), "%s", rps__errbuf());
			continue;
		}
		if (r->st.id != r->id) {
			/* (the map's copy of the URI: gcc's -Wrestrict cannot tell
			 * r->uri from r->err inside the one static view) */
			snprintf(r->err, sizeof(r->err), "%s answers as member %" PRIu64 ", not %" PRIu64,
				 v->map->members[i].uri, r->st.id, r->id);
			continue;
		}
		r->ok = true;
		if (r->st.role == RPS__RAFT_LEADER && (!v->ld || r->st.term > v->ld->term)) {
			v->ld = &r->st;
			lmap = m2;
			have_lmap = true;
		}
	}
	if (have_lmap)
		*v->map = lmap;	/* the leader's map is the freshest */
	v->info = v->ld ? v->ld : &v->seed;
	v->leader = v->ld ? v->ld->id : v->seed.leader;
	return 0;
}

/* Raft nodes the map does not name (being added or removed) */
static void status_add_unmapped(struct status_view *v)
{
	const struct rps__status_rep *info = v->info;
	uint32_t i;

	for (i = 0; i < info->n_voters + info->n_learners && v->nrows < RPS__ARRAY_SIZE(v->rows); i++) {
		uint64_t id = i < info->n_voters ? info->voters[i] : info->learners[i - info->n_voters];
		struct row *r;
		uint32_t k;
		bool known = false;

		for (k = 0; k < v->nrows; k++)
			known = known || v->rows[k].id == id;
		if (known)
			continue;
		r = &v->rows[v->nrows++];
		r->id = id;
		snprintf(r->err, sizeof(r->err), "a Raft %s not in the shard map",
			 i < info->n_voters ? "voter" : "learner");
	}
}

static void status_print_json(const struct status_view *v)
{
	const struct rps__status_rep *ld = v->ld, *info = v->info;
	uint32_t i;

	printf("{\"leader\":");
	if (v->leader)
		printf("%" PRIu64, v->leader);
	else
		printf("null");
	printf(",\"term\":%" PRIu64 ",\"voters\":", info->term);
	json_ids(info->voters, info->n_voters);
	printf(",\"learners\":");
	json_ids(info->learners, info->n_learners);
	printf(",\"fsync\":%s,\"rebalancing\":%s,\"members\":[", info->fsync ? "true" : "false",
	       ld && (ld->flags & RPS__STATUS_BALANCING) ? "true" : "false");
	for (i = 0; i < v->nrows; i++) {
		const struct row *r = &v->rows[i];
		uint64_t lag;

		printf("%s{\"id\":%" PRIu64 ",\"uri\":", i ? "," : "", r->id);
		psctl_json_str(r->uri);
		if (!r->ok) {
			printf(",\"reachable\":false,\"error\":");
			psctl_json_str(r->err);
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
		printf(",\"conns\":%u,\"peers\":%u,\"shards\":%" PRIu64 ",\"shard_bytes\":%" PRIu64 ",\"tensors\":%" PRIu64
		       ",\"partitions\":%u,\"witness\":%s}", r->st.n_conns, r->st.n_peers, r->st.shards, r->st.shard_bytes,
		       r->st.tensors, rps__smap_owned(v->map, r->id),
		       rps__smap_is_witness(v->map, r->id) ? "true" : "false");
	}
	printf("],\"map\":");
	rps__smap_print_json(v->map, stdout);
	printf("}\n");
}

static void status_print_table(const struct status_view *v)
{
	const struct rps__status_rep *ld = v->ld, *info = v->info;
	uint32_t i;
	size_t w = 3;

	for (i = 0; i < v->nrows; i++)
		w = RPS__MAX(w, strlen(v->rows[i].uri));
	printf("%-4s %-*s %-9s %6s %8s %8s %6s %5s %5s %5s %8s\n", "ID", (int)w, "URI", "ROLE", "TERM", "COMMIT",
	       "APPLIED", "LAG", "CONNS", "PEERS", "PARTS", "SHARDS");
	for (i = 0; i < v->nrows; i++) {
		const struct row *r = &v->rows[i];
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
		printf("%-4" PRIu64 " %-*s %-9s %6" PRIu64 " %8" PRIu64 " %8" PRIu64 " %6s %5u %5u %5u %8" PRIu64 "%s\n",
		       r->id, (int)w, r->uri, role_name(&r->st, ld), r->st.term, r->st.commit, r->st.applied,
		       lagbuf, r->st.n_conns, r->st.n_peers, rps__smap_owned(v->map, r->id), r->st.shards,
		       rps__smap_is_witness(v->map, r->id) ? "  witness: votes, holds no data" : "");
	}
	printf("\ncluster: leader ");
	if (v->leader)
		printf("%" PRIu64, v->leader);
	else
		printf("none (election in progress?)");
	printf(", term %" PRIu64 ", voters ", info->term);
	print_ids(info->voters, info->n_voters);
	printf(", learners ");
	print_ids(info->learners, info->n_learners);
	printf(", fsync %s", info->fsync ? "on (durable)" : "off");
	if (ld && (ld->flags & RPS__STATUS_BALANCING))
		printf(", rebalancing (the leader moves primaries until each member owns its share)");
	if (!ld)
		printf(" (as %s sees it)", v->seed_name);
	printf("\n\n");
	rps__smap_print(v->map, stdout);
}

int psctl_cmd_status(void)
{
	static struct rps__smap map;
	static struct status_view v = { .map = &map };

	if (status_ask_members(&v))
		return psctl_fail_err();
	status_add_unmapped(&v);
	if (psctl_opt.json)
		status_print_json(&v);
	else
		status_print_table(&v);
	return 0;
}
