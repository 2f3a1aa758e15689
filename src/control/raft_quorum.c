/*
 * raft_quorum.c - what a quorum of voters decides: the commit index from the
 * match indexes, the tally of an election, whether a quorum is still active
 * (etcd-raft's quorum package; there are no joint configurations here:
 * membership changes one server at a time, see raft.h).
 */
#include "config.h"
#include "control/raft_int.h"

#include <stdlib.h>

unsigned rps__raft_quorum(const struct rps__raft *r)
{
	return r->conf.n_voters / 2 + 1;
}

enum vote_result rps__raft_poll(struct rps__raft *r, uint64_t id, bool granted)
{
	unsigned yes = 0, no = 0, q = rps__raft_quorum(r);
	unsigned k;

	for (k = 0; k < r->n_votes; k++)
		if (r->vote_from[k] == id)
			break;
	if (k == r->n_votes && k < RPS__RAFT_MAX_VOTERS && rps__raft_conf_is_voter(&r->conf, id)) {
		r->vote_from[k] = id;
		r->vote_granted[k] = granted;
		r->n_votes++;
	}
	for (k = 0; k < r->n_votes; k++) {
		if (!rps__raft_conf_is_voter(&r->conf, r->vote_from[k]))
			continue;
		if (r->vote_granted[k])
			yes++;
		else
			no++;
	}
	if (yes >= q)
		return VOTE_WON;
	if (no > r->conf.n_voters - q)
		return VOTE_LOST;
	return VOTE_PENDING;
}

int rps__raft_cmp_u64_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* Commit what a quorum of voters holds, if it is of our term: an entry of
 * an older term may still be overwritten even when a majority stores it
 * (Raft figure 8); it commits along with the first one of ours. */
bool rps__raft_maybe_commit(struct rps__raft *r)
{
	uint64_t matches[RPS__RAFT_MAX_VOTERS], mci;	/* n_voters <= MAX_VOTERS: see raft.h */
	uint32_t n = r->conf.n_voters;

	if (!n)
		return false;
	for (uint32_t i = 0; i < n; i++) {
		struct progress *pr = rps__raft_progress_find(r, r->conf.voters[i]);

		matches[i] = pr ? pr->match : 0;
	}
	qsort(matches, n, sizeof(matches[0]), rps__raft_cmp_u64_desc);
	mci = matches[rps__raft_quorum(r) - 1];
	if (mci > r->log.committed && rps__raft_log_term_or0(&r->log, mci) == r->term) {
		r->log.committed = mci;
		return true;
	}
	return false;
}

bool rps__raft_quorum_active(struct rps__raft *r)
{
	unsigned active = 0;

	for (unsigned i = 0; i < r->n_prs; i++) {
		struct progress *pr = &r->prs[i];

		if (pr->is_learner)
			continue;
		if ((pr->id == r->id || pr->recent_active) && rps__raft_conf_is_voter(&r->conf, pr->id))
			active++;
	}
	for (unsigned i = 0; i < r->n_prs; i++)
		if (r->prs[i].id != r->id)
			r->prs[i].recent_active = false;
	return active >= rps__raft_quorum(r);
}
