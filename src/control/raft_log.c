/*
 * raft_log.c - the Raft core's log, in memory: the entries after the
 * snapshot point, term look-ups, conflict search, append, truncation and
 * compaction (etcd-raft's log.go; there is no Storage interface, see raft.c).
 */
#include "config.h"
#include "common/common.h"
#include "control/raft_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint64_t rps__raft_log_last(const struct raft_log *l)
{
	return l->snap_index + l->n;
}

bool rps__raft_log_term(const struct raft_log *l, uint64_t i, uint64_t *t)
{
	if (i == l->snap_index) {
		*t = l->snap_term;
		return true;
	}
	if (i < l->snap_index || i > rps__raft_log_last(l))
		return false;
	*t = l->ents[i - l->snap_index - 1].term;
	return true;
}

uint64_t rps__raft_log_term_or0(const struct raft_log *l, uint64_t i)
{
	uint64_t t;

	return rps__raft_log_term(l, i, &t) ? t : 0;
}

uint64_t rps__raft_log_last_term(const struct raft_log *l)
{
	return rps__raft_log_term_or0(l, rps__raft_log_last(l));
}

bool rps__raft_log_match_term(const struct raft_log *l, uint64_t i, uint64_t t)
{
	uint64_t x;

	return rps__raft_log_term(l, i, &x) && x == t;
}

/* i in (snap_index, last] */
struct rps__raft_entry *rps__raft_log_entry(const struct raft_log *l, uint64_t i)
{
	return &l->ents[i - l->snap_index - 1];
}

bool rps__raft_log_up_to_date(const struct raft_log *l, uint64_t last_index, uint64_t last_term)
{
	uint64_t my_term = rps__raft_log_last_term(l);

	return last_term > my_term || (last_term == my_term && last_index >= rps__raft_log_last(l));
}

/* The largest index <= index whose term is <= term: all entries after it
 * conflict with a log whose entry at index has that term.  An index we no
 * longer know (compacted) may match, so it is returned as is. */
uint64_t rps__raft_log_find_conflict_by_term(const struct raft_log *l, uint64_t index, uint64_t term,
					     uint64_t *found_term)
{
	uint64_t t;

	for (; index > 0; index--) {
		if (!rps__raft_log_term(l, index, &t)) {
			*found_term = 0;
			return index;
		}
		if (t <= term) {
			*found_term = t;
			return index;
		}
	}
	*found_term = 0;
	return 0;
}

int rps__raft_log_append(struct raft_log *l, const struct rps__raft_entry *src)
{
	struct rps__raft_entry *e;
	void *data = NULL;

	if (rps__grow(&l->ents, &l->cap, l->n + 1, sizeof(*l->ents), 64))
		return -ENOMEM;
	if (src->len) {
		data = malloc(src->len);
		if (!data)
			return -ENOMEM;
		memcpy(data, src->data, src->len);
	}
	e = &l->ents[l->n++];
	*e = *src;
	e->index = rps__raft_log_last(l);
	e->data = data;
	return 0;
}

/* Drop entries >= from. */
void rps__raft_log_truncate(struct raft_log *l, uint64_t from)
{
	while (rps__raft_log_last(l) >= from && l->n) {
		free((void *)l->ents[l->n - 1].data);
		l->n--;
	}
	if (l->unstable > from)
		l->unstable = from;
}

/* Drop entries <= index, which becomes the snapshot point. */
void rps__raft_log_compact(struct raft_log *l, uint64_t index, uint64_t term)
{
	size_t drop = (size_t)(index - l->snap_index);

	if (drop > l->n)
		drop = l->n;
	for (size_t i = 0; i < drop; i++)
		free((void *)l->ents[i].data);
	memmove(l->ents, l->ents + drop, (l->n - drop) * sizeof(*l->ents));
	l->n -= drop;
	l->snap_index = index;
	l->snap_term = term;
	if (l->unstable <= index)
		l->unstable = index + 1;
}

void rps__raft_log_free(struct raft_log *l)
{
	rps__raft_log_truncate(l, l->snap_index + 1);
	free(l->ents);
	l->ents = NULL;
	l->cap = 0;
}
