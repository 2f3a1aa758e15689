/*
 * psctl_moves.c - the commands that change the cluster one ADMIN at a time:
 * move, add-server (then rebalance), remove-server (drain, hand leadership
 * on, remove; or --force), forget-lost, transfer-leader.
 */
#include "config.h"
#include "programs/psctl_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

/* ---- moves ------------------------------------------------------------------ */

/* One move, printed.  from: the owner before it (for the message). */
static int do_move(uint32_t part, uint64_t from, uint64_t to)
{
	struct rps__admin_rep rep;
	char what[96];
	int ret;

	snprintf(what, sizeof(what), "move partition %u to member %" PRIu64, part, to);
	ret = psctl_admin(RPS__ADMIN_MOVE, part, to, NULL, &rep, what);
	if (ret)
		return psctl_fail_err();
	printf("partition %u: member %" PRIu64 " -> member %" PRIu64 ", epoch %" PRIu64 "\n", part, from, to,
	       rep.epoch);
	fflush(stdout);
	return 0;
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
		printf("partition %u: already on member %" PRIu64 ", epoch %" PRIu64 "\n", part, to,
		       L.map.parts[part].epoch);
		return 0;
	}
	return do_move(part, L.map.parts[part].owner, to);
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
	printf("member %" PRIu64 " added at %s (log index %" PRIu64 ")\n", id, uri, rep.index);
	fflush(stdout);
	if (psctl_opt.no_rebalance)
		return 0;

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
		ret = do_move((uint32_t)p, most, id);
		if (ret)
			return ret;
		deadline = psctl_deadline_in(psctl_opt.timeout_ms);
	}
	printf("member %" PRIu64 " owns %u of %u partitions\n", id, rps__smap_owned(&L.map, id), L.map.npart);
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
	printf("member %" PRIu64 " removed; its partitions are lost: psctl restore DIR, or psctl forget-lost all\n", id);
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
	printf("%s: done, served empty from now on\n", what);
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
	printf("member %" PRIu64 " removed (log index %" PRIu64 "): stop its rdmapsd now\n", id, rep.index);
	return 0;
}


int psctl_cmd_transfer_leader(uint64_t to)
{
	static struct leader L;
	int ret;

	ret = psctl_find_leader(&L, psctl_deadline_in(psctl_opt.timeout_ms));
	if (ret)
		return psctl_fail_err();
	if (to && L.id == to) {
		printf("leader: member %" PRIu64 " (term %" PRIu64 "), already\n", L.id, L.st.term);
		return 0;
	}
	if (to && !psctl_id_in(L.st.voters, L.st.n_voters, to, NULL))
		return psctl_fail("member %" PRIu64 " is not a voter: only voters can lead (see psctl status)", to);
	return transfer(&L, to);
}
