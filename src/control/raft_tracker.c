/*
 * raft_tracker.c - what a leader knows of each follower: match and next
 * index, the probe / replicate / snapshot flow states and the in-flight window
 * of a follower in replicate state (etcd-raft's tracker package).
 */
#include "config.h"
#include "control/raft_int.h"
#include "common/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>


bool rps__raft_inflights_full(const struct inflights *in)
{
	return in->count == in->cap;
}

void rps__raft_inflights_add(struct inflights *in, uint64_t last)
{
	in->buf[(in->start + in->count) % in->cap] = last;
	in->count++;
}

void rps__raft_inflights_free_le(struct inflights *in, uint64_t to)
{
	while (in->count && in->buf[in->start] <= to) {
		in->start = (in->start + 1) % in->cap;
		in->count--;
	}
}

void rps__raft_inflights_free_first(struct inflights *in)
{
	if (in->count)
		rps__raft_inflights_free_le(in, in->buf[in->start]);
}

static void inflights_reset(struct inflights *in)
{
	in->start = 0;
	in->count = 0;
}

struct progress *rps__raft_progress_find(struct rps__raft *r, uint64_t id)
{
	for (unsigned i = 0; i < r->n_prs; i++)
		if (r->prs[i].id == id)
			return &r->prs[i];
	return NULL;
}

void rps__raft_pr_reset_state(struct progress *pr, enum rps__raft_progress_state state)
{
	pr->state = state;
	pr->probe_sent = false;
	pr->pending_snapshot = 0;
	pr->snapshot_ticks = 0;
	inflights_reset(&pr->ins);
}

void rps__raft_pr_become_probe(struct progress *pr)
{
	/* After a snapshot was acknowledged, continue after it. */
	uint64_t after = pr->state == RPS__RAFT_PROGRESS_SNAPSHOT ? pr->pending_snapshot + 1 : 0;

	rps__raft_pr_reset_state(pr, RPS__RAFT_PROGRESS_PROBE);
	pr->next = RPS__MAX(pr->match + 1, after);
}

/* The in-flight window is allocated here, when a leader first pipelines to
 * the follower, not when its progress is made: every node tracks every
 * member, and windows for a thousand members would weigh on followers that
 * never use them.  Without memory it stays probing, which needs no window,
 * and the core is broken (raft.c). */
void rps__raft_pr_become_replicate(struct rps__raft *r, struct progress *pr)
{
	if (!pr->ins.buf) {
		pr->ins.buf = calloc(pr->ins.cap, sizeof(*pr->ins.buf));
		if (!pr->ins.buf) {
			rps__seterr(-ENOMEM, "raft %llu: no memory for the in-flight window of %llu",
				    (unsigned long long)r->id, (unsigned long long)pr->id);
			rps__raft_fail(r, -ENOMEM);
			return;
		}
	}
	rps__raft_pr_reset_state(pr, RPS__RAFT_PROGRESS_REPLICATE);
	pr->next = pr->match + 1;
}

void rps__raft_pr_become_snapshot(struct progress *pr, uint64_t index)
{
	rps__raft_pr_reset_state(pr, RPS__RAFT_PROGRESS_SNAPSHOT);
	pr->pending_snapshot = index;
}

bool rps__raft_pr_maybe_update(struct progress *pr, uint64_t n)
{
	bool updated = false;

	if (pr->match < n) {
		pr->match = n;
		pr->probe_sent = false;
		updated = true;
	}
	if (pr->next < n + 1)
		pr->next = n + 1;
	return updated;
}

/* A rejection of the append after `rejected`; match_hint: where the
 * follower's log may match.  False if the rejection is stale. */
bool rps__raft_pr_maybe_decr_to(struct progress *pr, uint64_t rejected, uint64_t match_hint)
{
	if (pr->state == RPS__RAFT_PROGRESS_REPLICATE) {
		if (rejected <= pr->match)
			return false;
		pr->next = pr->match + 1;
		return true;
	}
	if (pr->next - 1 != rejected)
		return false;
	pr->next = RPS__MAX(RPS__MIN(rejected, match_hint + 1), pr->match + 1);
	pr->probe_sent = false;
	return true;
}

bool rps__raft_pr_paused(const struct progress *pr)
{
	switch (pr->state) {
	case RPS__RAFT_PROGRESS_PROBE:
		return pr->probe_sent;
	case RPS__RAFT_PROGRESS_REPLICATE:
		return rps__raft_inflights_full(&pr->ins);
	case RPS__RAFT_PROGRESS_SNAPSHOT:
		return true;
	}
	return true;
}

/* A fresh progress, without a window until it replicates: a role change
 * starts every progress afresh, so only a leader's followers hold one. */
void rps__raft_progress_init(struct rps__raft *r, struct progress *pr, uint64_t id)
{
	rps__raft_progress_free(pr);
	memset(pr, 0, sizeof(*pr));
	pr->ins.cap = r->cfg.max_inflight_msgs;
	pr->id = id;
	pr->next = rps__raft_log_last(&r->log) + 1;
	pr->state = RPS__RAFT_PROGRESS_PROBE;
	if (id == r->id)
		pr->match = rps__raft_log_last(&r->log);
}

void rps__raft_progress_free(struct progress *pr)
{
	free(pr->ins.buf);
	pr->ins.buf = NULL;
}

void rps__raft_progress_reset_all(struct rps__raft *r)
{
	for (unsigned i = 0; i < r->n_prs; i++) {
		bool learner = r->prs[i].is_learner;

		rps__raft_progress_init(r, &r->prs[i], r->prs[i].id);
		r->prs[i].is_learner = learner;
	}
}
