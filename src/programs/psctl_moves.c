/*
 * psctl_moves.c - the commands that change the cluster one ADMIN at a time:
 * move, add-server (then rebalance), rebalance, remove-server (drain, hand
 * leadership on, remove; or --force), forget-lost, transfer-leader.
 */
#include "config.h"
#include "programs/psctl_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

/* ---- moves ------------------------------------------------------------------ */

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

/* move --json: the partition where it is now, and the moves that took it there */
static void json_moved(uint32_t part, uint64_t owner, uint64_t epoch)
{
	printf("{\"partition\":%u,\"owner\":%" PRIu64 ",\"epoch\":%" PRIu64 ",", part, owner, epoch);
	json_moves();
	printf("}\n");
}

/* One move, printed.  from: the owner before it (for the message).
 * 0, or 1 (the exit status: said why).  raced: a move the map overtook
 * (the partition moving already, or moved: the leader's own balancing,
 * rps__cp_balance_duty) is no failure: -EAGAIN, and the caller reads the
 * map again. */
static int do_move_how(uint32_t part, uint64_t from, uint64_t to, bool raced)
{
	struct rps__admin_rep rep;
	char what[96];
	int ret;

	snprintf(what, sizeof(what), "move partition %u to member %" PRIu64, part, to);
	ret = psctl_admin(RPS__ADMIN_MOVE, part, to, NULL, &rep, what);
	if (raced && (ret == -EBUSY || ret == -ESTALE)) {
		rps__clearerr();
		return -EAGAIN;
	}
	if (ret)
		return psctl_fail_err();
	if (psctl_opt.json) {
		if (done.nmoves < RPS__ARRAY_SIZE(done.moves))
			done.moves[done.nmoves++] = (struct done_move){ part, from, to, rep.epoch };
		return 0;
	}
	printf("partition %u: member %" PRIu64 " -> member %" PRIu64 ", epoch %" PRIu64 "\n", part, from, to,
	       rep.epoch);
	fflush(stdout);
	return 0;
}

static int do_move(uint32_t part, uint64_t from, uint64_t to)
{
	return do_move_how(part, from, to, false);
}

int psctl_cmd_move(uint32_t part, uint64_t to)
{
	static struct leader L;
	int ret;

	ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
	if (ret)
		return psctl_fail_err();
	if (part >= L.map.npart)
		return psctl_fail("partition %u does not exist: the cluster has partitions 0..%u", part, L.map.npart - 1);
	if (!rps__smap_member(&L.map, to))
		return psctl_fail("member %" PRIu64 " is not in the shard map: add it with psctl add-server", to);
	if (L.map.parts[part].owner == to && !L.map.parts[part].moving_to) {
		if (psctl_opt.json)
			json_moved(part, to, L.map.parts[part].epoch);
		else
			printf("partition %u: already on member %" PRIu64 ", epoch %" PRIu64 "\n", part, to,
			       L.map.parts[part].epoch);
		return 0;
	}
	ret = do_move(part, L.map.parts[part].owner, to);
	if (!ret && psctl_opt.json)
		json_moved(part, to, done.moves[0].epoch);
	return ret;
}

/* Most (most = true) or least loaded member other than skip, never a
 * witness (it holds no partitions); 0 if none.  Ties go to the lowest id. */
static uint64_t pick_member(const struct rps__smap *m, uint64_t skip, bool most, uint32_t *load)
{
	uint64_t best = 0;
	uint32_t best_n = 0, i;

	for (i = 0; i < m->nmembers; i++) {
		uint64_t id = m->members[i].id;
		uint32_t n = rps__smap_owned(m, id);

		if (id == skip || (m->members[i].flags & RPS__SMAP_WITNESS))
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

/* add-server's last word; map: the leader's after the rebalancing, NULL without it */
static int added_print(uint64_t id, const char *uri, uint64_t index, const struct rps__smap *map)
{
	if (!psctl_opt.json) {
		if (map)
			printf("member %" PRIu64 " owns %u of %u partitions\n", id, rps__smap_owned(map, id),
			       map->npart);
		return 0;
	}
	printf("{\"id\":%" PRIu64 ",\"uri\":", id);
	psctl_json_str(uri);
	printf(",\"log_index\":%" PRIu64 ",", index);
	json_moves();
	if (map)
		printf(",\"owned\":%u,\"partitions\":%u}\n", rps__smap_owned(map, id), map->npart);
	else
		printf(",\"owned\":null,\"partitions\":null}\n");
	return 0;
}

int psctl_cmd_add_server(uint64_t id, const char *uri)
{
	static struct leader L;
	struct rps__admin_rep rep;
	char what[200];
	uint64_t deadline;
	unsigned moves = 0;
	int ret;

	snprintf(what, sizeof(what), "add member %" PRIu64 " at %s", id, uri);
	ret = psctl_admin(RPS__ADMIN_ADD_SERVER, 0, id, uri, &rep, what);
	if (ret)
		return psctl_fail_err();
	if (!psctl_opt.json) {
		printf("member %" PRIu64 " added at %s (log index %" PRIu64 ")\n", id, uri, rep.index);
		fflush(stdout);
	}
	if (psctl_opt.no_rebalance)
		return added_print(id, uri, rep.index, NULL);

	deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	for (;;) {
		uint32_t most_n, mine;
		uint64_t most;
		int p;

		ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
		if (ret)
			return psctl_fail_err();
		if (!rps__smap_member(&L.map, id)) {
			if (psctl_expired(deadline))
				return psctl_fail("member %" PRIu64 " does not show in the leader's shard map: "
					    "rebalance with psctl move", id);
			psctl_sleep_ms(200);
			continue;
		}
		mine = rps__smap_owned(&L.map, id);
		most = pick_member(&L.map, id, true, &most_n);
		if (!most || most_n < mine + 2)
			break;
		p = pick_part(&L.map, most);
		if (p < 0) {
			/* all of its partitions are moving: let those finish */
			if (psctl_expired(deadline))
				return psctl_fail("member %" PRIu64 "'s partitions stay in motion: rebalance later", most);
			psctl_sleep_ms(200);
			continue;
		}
		if (moves++ > 2 * RPS__SMAP_MAX_PART)
			return psctl_fail("rebalancing does not converge: see psctl status");
		ret = do_move_how((uint32_t)p, most, id, true);
		if (ret > 0)
			return ret;
		deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	}
	return added_print(id, uri, rep.index, &L.map);
}

/* ---- rebalance --------------------------------------------------------------- */

/*
 * Primaries spread evenly over the members that hold data and answer now
 * (a restarted or added server owns nothing until partitions move to it).
 * The way redis-cli's cluster rebalance works: one move at a time
 * (rps__smap_balance_move chooses it), from the member that owns most to
 * the one that owns fewest, while they differ by two or more.  A dead
 * member's partitions are not moved (they fail over to their backups); a
 * lost partition cannot move (restore it or forget it first).  The
 * backups follow by themselves: the leader keeps every partition at the
 * target R, placing each new backup on the member that holds fewest
 * copies (rps__smap_pick_backup).
 */

/* Members of m that hold data (not witnesses) and answer STATUS as
 * themselves, into ids; how many. */
static uint32_t live_data_members(const struct rps__smap *m, uint64_t *ids)
{
	uint32_t i, n = 0;

	for (i = 0; i < m->nmembers; i++) {
		const struct rps__smap_member *mb = &m->members[i];
		struct rps__status_rep st;
		struct rps__uri u;

		if (mb->flags & RPS__SMAP_WITNESS)
			continue;
		if (rps__uri_parse(mb->uri, &u) || psctl_query_status(&u, &st, NULL) || st.id != mb->id) {
			rps__clearerr();
			continue;
		}
		ids[n++] = mb->id;
	}
	return n;
}

/* psctl's view: a member answered STATUS just now. */
static bool answered(void *ctx, uint64_t id)
{
	const uint64_t *live = ctx;

	for (uint32_t i = 0; live[i]; i++)
		if (live[i] == id)
			return true;
	return false;
}

int psctl_cmd_rebalance(void)
{
	static struct leader L;
	uint64_t live[RPS__SMAP_MAX_MEMBERS + 1] = { 0 }, from, to, deadline;
	uint32_t nlive, part = 0, i;
	unsigned moves = 0;
	int ret, next;

	ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
	if (ret)
		return psctl_fail_err();
	nlive = live_data_members(&L.map, live);
	if (!nlive)
		return psctl_fail("no member that holds data answers: see psctl status");
	deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	for (;;) {
		next = rps__smap_balance_move(&L.map, answered, live, &part, &from, &to);
		if (next <= 0) {
			if (!next)
				break;
			/* its partitions are moving or seeding: let those finish */
			if (psctl_expired(deadline))
				return psctl_fail("member %" PRIu64 "'s partitions stay in motion: rebalance later", from);
			psctl_sleep_ms(200);
		} else {
			if (moves++ > 2 * RPS__SMAP_MAX_PART)
				return psctl_fail("rebalancing does not converge: see psctl status");
			ret = do_move_how(part, from, to, true);
			if (ret > 0)
				return ret;
			deadline = psctl_deadline_in(psctl_opt.timeout_ms);
		}
		ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
		if (ret)
			return psctl_fail_err();
	}
	if (psctl_opt.json) {
		printf("{");
		json_moves();
		printf(",\"owned\":{");
		for (i = 0; i < nlive; i++)
			printf("%s\"%" PRIu64 "\":%u", i ? "," : "", live[i], rps__smap_owned(&L.map, live[i]));
		printf("},\"partitions\":%u}\n", L.map.npart);
		return 0;
	}
	printf("balanced after %u move%s:", moves, moves == 1 ? "" : "s");
	for (i = 0; i < nlive; i++)
		printf("%s member %" PRIu64 " owns %u", i ? "," : "", live[i], rps__smap_owned(&L.map, live[i]));
	printf(" of %u partitions\n", L.map.npart);
	return 0;
}

/* Wait until the leader is not `old` (want == 0) or is `want`. */
static int wait_leader(struct leader *L, uint64_t old, uint64_t want)
{
	uint64_t deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	int ret;

	for (;;) {
		ret = psctl_find_leader(L, deadline);
		if (!ret && (want ? L->id == want : L->id != old))
			return 0;
		if (psctl_expired(deadline)) {
			if (ret)
				return ret;
			if (want && L->id != old)
				return rps__seterr(-EAGAIN, "member %" PRIu64 " became the leader, not %" PRIu64,
						   L->id, want);
			return rps__seterr(-ETIMEDOUT, "member %" PRIu64 " is still the leader after %d s: "
					   "are the other voters caught up? see psctl status", old,
					   psctl_opt.timeout_ms / 1000);
		}
		psctl_sleep_ms(200);
	}
}

static void json_leader(uint64_t leader, uint64_t term, uint64_t was)
{
	printf("{\"leader\":%" PRIu64 ",\"term\":%" PRIu64 ",\"was\":%" PRIu64 "}", leader, term, was);
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
	ret = psctl_admin(RPS__ADMIN_TRANSFER_LEADER, 0, to, NULL, &rep, what);
	if (!ret)
		ret = wait_leader(L, old, to);
	if (ret)
		return psctl_fail_err();
	if (psctl_opt.json) {
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
int psctl_cmd_force_remove(uint64_t id)
{
	struct rps__admin_rep rep;
	char what[96];

	snprintf(what, sizeof(what), "force removal of member %" PRIu64, id);
	if (psctl_admin(RPS__ADMIN_FORCE_REMOVE, 0, id, NULL, &rep, what))
		return psctl_fail_err();
	if (psctl_opt.json)
		printf("{\"id\":%" PRIu64 ",\"forced\":true}\n", id);
	else
		printf("member %" PRIu64 " removed; its partitions are lost: psctl restore NAME, or psctl forget-lost all\n",
		       id);
	return 0;
}

/* The replication target: the leader seeds or drops backups until every
 * partition has r copies (psctl status shows how far it got). */
int psctl_cmd_set_replicas(uint32_t r)
{
	struct rps__admin_rep rep;
	char what[96];

	snprintf(what, sizeof(what), "set the replication target to %" PRIu32, r);
	if (psctl_admin(RPS__ADMIN_SET_REPLICAS, 0, r, NULL, &rep, what))
		return psctl_fail_err();
	if (psctl_opt.json)
		printf("{\"replicas\":%" PRIu32 "}\n", r);
	else
		printf("replication target: %" PRIu32 " cop%s of every partition; the leader %s backups now"
		       " (psctl status shows the under-replicated)\n", r, r == 1 ? "y" : "ies",
		       r == 1 ? "drops the" : "seeds or drops");
	return 0;
}

/* Accept lost partitions empty (their contents are gone for good). */
int psctl_cmd_forget_lost(uint32_t part)
{
	struct rps__admin_rep rep;
	char what[96];

	if (part == UINT32_MAX)
		snprintf(what, sizeof(what), "forget every lost partition");
	else
		snprintf(what, sizeof(what), "forget lost partition %" PRIu32, part);
	if (psctl_admin(RPS__ADMIN_FORGET_LOST, part, 0, NULL, &rep, what))
		return psctl_fail_err();
	if (psctl_opt.json && part == UINT32_MAX)
		printf("{\"partition\":null}\n");
	else if (psctl_opt.json)
		printf("{\"partition\":%" PRIu32 "}\n", part);
	else
		printf("%s: done, served empty from now on\n", what);
	return 0;
}

/* remove-server's last word */
static int removed_print(uint64_t id, uint64_t index)
{
	if (!psctl_opt.json) {
		printf("member %" PRIu64 " removed (log index %" PRIu64 "): stop its rdmapsd now\n", id, index);
		return 0;
	}
	printf("{\"id\":%" PRIu64 ",\"forced\":false,\"log_index\":%" PRIu64 ",\"transfer\":", id, index);
	if (done.transferred)
		json_leader(done.leader, done.term, done.was);
	else
		printf("null");
	putchar(',');
	json_moves();
	printf("}\n");
	return 0;
}

int psctl_cmd_remove_server(uint64_t id)
{
	static struct leader L;
	struct rps__admin_rep rep;
	char what[96];
	uint64_t deadline;
	unsigned moves = 0;
	int ret;

	ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
	if (ret)
		return psctl_fail_err();
	if (!rps__smap_member(&L.map, id) && !psctl_id_in(L.st.voters, L.st.n_voters, id, NULL) &&
	    !psctl_id_in(L.st.learners, L.st.n_learners, id, NULL))
		return psctl_fail("member %" PRIu64 " is not in the cluster: see psctl status", id);
	if (rps__smap_member(&L.map, id) && L.map.nmembers == 1)
		return psctl_fail("member %" PRIu64 " is the only member: there is nowhere to move its partitions", id);
	if (L.id == id) {
		ret = transfer(&L, 0);
		if (ret)
			return ret;
	}

	deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	for (;;) {
		uint64_t to;
		uint32_t p;
		int q;
		bool busy = false;

		ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
		if (ret)
			return psctl_fail_err();
		for (p = 0; p < L.map.npart; p++)
			busy = busy || (L.map.parts[p].moving_to == id ||
					(L.map.parts[p].owner == id && L.map.parts[p].moving_to));
		q = pick_part(&L.map, id);
		if (q < 0 && !busy)
			break;
		if (q < 0) {
			/* moves into or out of it are under way: let them finish */
			if (psctl_expired(deadline))
				return psctl_fail("partitions keep moving to or from member %" PRIu64 ": try again later", id);
			psctl_sleep_ms(200);
			continue;
		}
		/* a backup takes over where there is one (a planned switch:
		 * nothing to copy); else the least loaded member */
		to = L.map.parts[q].backups[0];
		if (!to)
			to = pick_member(&L.map, id, false, NULL);
		if (!to)
			return psctl_fail("no other member to move partition %d to", q);
		if (moves++ > 2 * RPS__SMAP_MAX_PART)
			return psctl_fail("member %" PRIu64 " keeps getting partitions: see psctl status", id);
		ret = do_move((uint32_t)q, id, to);
		if (ret)
			return ret;
		deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	}

	snprintf(what, sizeof(what), "remove member %" PRIu64, id);
	ret = psctl_admin(RPS__ADMIN_REMOVE_SERVER, 0, id, NULL, &rep, what);
	if (ret)
		return psctl_fail_err();
	return removed_print(id, rep.index);
}


int psctl_cmd_transfer_leader(uint64_t to)
{
	static struct leader L;
	int ret;

	ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
	if (ret)
		return psctl_fail_err();
	if (to && L.id == to) {
		if (psctl_opt.json) {
			json_leader(L.id, L.st.term, L.id);
			putchar('\n');
		} else {
			printf("leader: member %" PRIu64 " (term %" PRIu64 "), already\n", L.id, L.st.term);
		}
		return 0;
	}
	if (to && !psctl_id_in(L.st.voters, L.st.n_voters, to, NULL))
		return psctl_fail("member %" PRIu64 " is not a voter: only voters can lead (see psctl status)", to);
	ret = transfer(&L, to);
	if (!ret && psctl_opt.json) {
		json_leader(done.leader, done.term, done.was);
		putchar('\n');
	}
	return ret;
}
