/*
 * raft_confchange.c - the configuration: voters and learners, conf entries
 * and how they apply, and the core following a change (its progress set and
 * its role) (etcd-raft's confchange package and switchToConfig).
 */
#include "config.h"
#include "control/raft_int.h"
#include "common/le.h"

#include <errno.h>
#include <string.h>

bool rps__raft_id_in(const uint64_t *ids, uint32_t n, uint64_t id)
{
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

static void id_remove(uint64_t *ids, uint32_t *n, uint64_t id)
{
	for (uint32_t i = 0; i < *n; i++)
		if (ids[i] == id) {
			memmove(&ids[i], &ids[i + 1], (*n - i - 1) * sizeof(*ids));
			(*n)--;
			return;
		}
}

bool rps__raft_conf_is_voter(const struct rps__raft_conf_state *cs, uint64_t id)
{
	return rps__raft_id_in(cs->voters, cs->n_voters, id);
}

bool rps__raft_conf_is_learner(const struct rps__raft_conf_state *cs, uint64_t id)
{
	return rps__raft_id_in(cs->learners, cs->n_learners, id);
}

bool rps__raft_conf_fits(uint64_t n_voters, uint64_t n_learners)
{
	return n_voters <= RPS__RAFT_MAX_VOTERS && n_learners <= RPS__RAFT_MAX_NODES &&
	       n_voters + n_learners <= RPS__RAFT_MAX_NODES;
}

void rps__raft_conf_copy(struct rps__raft_conf_state *dst, const struct rps__raft_conf_state *src)
{
	dst->n_voters = src->n_voters;
	dst->n_learners = src->n_learners;
	memcpy(dst->voters, src->voters, src->n_voters * sizeof(src->voters[0]));
	memcpy(dst->learners, src->learners, src->n_learners * sizeof(src->learners[0]));
}

bool rps__raft_conf_has_room(const struct rps__raft_conf_state *cs)
{
	return cs->n_voters + cs->n_learners < RPS__RAFT_MAX_NODES;
}

bool rps__raft_conf_has_voter_room(const struct rps__raft_conf_state *cs)
{
	return cs->n_voters < RPS__RAFT_MAX_VOTERS;
}

/* Total and deterministic: every node applies the same entry the same way,
 * whatever it contains (proposals were validated at the leader). */
static void conf_apply(struct rps__raft_conf_state *cs, enum rps__raft_conf_op op, uint64_t id)
{
	bool voter = rps__raft_conf_is_voter(cs, id), learner = rps__raft_conf_is_learner(cs, id);

	if (id == RPS__RAFT_NONE)
		return;
	switch (op) {
	case RPS__RAFT_CONF_ADD_VOTER:
		if (voter || !rps__raft_conf_has_voter_room(cs) || (!learner && !rps__raft_conf_has_room(cs)))
			return;
		if (learner)
			id_remove(cs->learners, &cs->n_learners, id);
		cs->voters[cs->n_voters++] = id;
		return;
	case RPS__RAFT_CONF_ADD_LEARNER:
		if (voter || learner || !rps__raft_conf_has_room(cs))
			return;
		cs->learners[cs->n_learners++] = id;
		return;
	case RPS__RAFT_CONF_PROMOTE:
		if (!learner || !rps__raft_conf_has_voter_room(cs))
			return;
		id_remove(cs->learners, &cs->n_learners, id);
		cs->voters[cs->n_voters++] = id;
		return;
	case RPS__RAFT_CONF_REMOVE:
		id_remove(cs->voters, &cs->n_voters, id);
		id_remove(cs->learners, &cs->n_learners, id);
		return;
	}
}

int rps__raft_conf_change_decode(const struct rps__raft_entry *e, enum rps__raft_conf_op *op,
				 uint64_t *node)
{
	const uint8_t *p = e->data;

	if (e->type != RPS__RAFT_ENTRY_CONF || e->len != CONF_DATA_LEN || p[0] < RPS__RAFT_CONF_ADD_VOTER ||
	    p[0] > RPS__RAFT_CONF_REMOVE)
		return -EINVAL;
	*op = (enum rps__raft_conf_op)p[0];
	*node = rps__le_get64(p + 1);
	return 0;
}

void rps__raft_conf_apply_entry(struct rps__raft_conf_state *cs, const struct rps__raft_entry *e)
{
	enum rps__raft_conf_op op;
	uint64_t node;

	if (rps__raft_conf_change_decode(e, &op, &node) == 0)
		conf_apply(cs, op, node);
}

bool rps__raft_promotable(const struct rps__raft *r)
{
	return rps__raft_conf_is_voter(&r->conf, r->id);
}

/* The configuration changed: follow it with the progress set and the role. */
void rps__raft_conf_changed(struct rps__raft *r)
{
	unsigned i = 0;

	while (i < r->n_prs) {
		struct progress *pr = &r->prs[i];

		if (!rps__raft_conf_is_voter(&r->conf, pr->id) && !rps__raft_conf_is_learner(&r->conf, pr->id)) {
			rps__raft_progress_free(pr);
			*pr = r->prs[--r->n_prs];
			r->prs[r->n_prs].ins.buf = NULL;	/* moved to pr, or freed above */
			continue;
		}
		pr->is_learner = rps__raft_conf_is_learner(&r->conf, pr->id);
		i++;
	}
	for (uint32_t k = 0; k < r->conf.n_voters + r->conf.n_learners; k++) {
		uint64_t id = k < r->conf.n_voters ? r->conf.voters[k] : r->conf.learners[k - r->conf.n_voters];

		if (!rps__raft_progress_find(r, id)) {
			struct progress *pr = &r->prs[r->n_prs++];

			rps__raft_progress_init(r, pr, id);
			pr->is_learner = rps__raft_conf_is_learner(&r->conf, id);
			/* a new member gets an election timeout to answer before
			 * CheckQuorum counts it */
			pr->recent_active = true;
		}
	}
	if (r->role == RPS__RAFT_LEADER) {
		if (r->lead_transferee != RPS__RAFT_NONE && !rps__raft_conf_is_voter(&r->conf, r->lead_transferee))
			r->lead_transferee = RPS__RAFT_NONE;
	} else if (r->role != RPS__RAFT_FOLLOWER && !rps__raft_promotable(r)) {
		rps__raft_become_follower(r, r->term, RPS__RAFT_NONE);
	}
}

/* Rebuild the configuration from the snapshot's and the log's conf entries,
 * after the log lost a suffix or was replaced. */
void rps__raft_conf_recompute(struct rps__raft *r)
{
	r->conf = r->snap.conf;
	r->conf_index = 0;
	for (size_t i = 0; i < r->log.n; i++)
		if (r->log.ents[i].type == RPS__RAFT_ENTRY_CONF) {
			rps__raft_conf_apply_entry(&r->conf, &r->log.ents[i]);
			r->conf_index = r->log.ents[i].index;
		}
	rps__raft_conf_changed(r);
}

void rps__raft_conf_at(const struct rps__raft *r, uint64_t index, struct rps__raft_conf_state *cs)
{
	*cs = r->snap.conf;
	for (uint64_t i = r->log.snap_index + 1; i <= index; i++) {
		const struct rps__raft_entry *e = rps__raft_log_entry(&r->log, i);

		if (e->type == RPS__RAFT_ENTRY_CONF)
			rps__raft_conf_apply_entry(cs, e);
	}
}
