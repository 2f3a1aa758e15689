/*
 * wal_replay.c - reading the Raft log back: replay of segments, record by
 * record and batch by batch, into the live log, telling a torn tail (dropped)
 * from damage to an acknowledged save (refused).  Format: the top of wal.c.
 */
#include "config.h"
#include "control/wal_int.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/le.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- replay ------------------------------------------------------------- */

uint64_t rps__wal_replay_last(const struct replay *r)
{
	return r->base + r->n;
}

bool rps__wal_replay_term_at(const struct replay *r, uint64_t index, uint64_t *term)
{
	if (index == r->base) {
		*term = r->base_term;
		return r->base_term_known;
	}
	if (index < r->base || index > rps__wal_replay_last(r))
		return false;
	*term = r->ents[index - r->base - 1].term;
	return true;
}

static int replay_damaged(const struct replay *r, size_t off, const char *what)
{
	return rps__seterr(-EBADMSG, "wal: %.150s/%s: offset %zu: %s: " RESTORE_HINT,
			   r->dir, r->name, off, what, r->dir);
}

static int replay_apply_entry(struct replay *r, const struct pending_rec *pr)
{
	struct replay_ent e;
	uint64_t prev_term;
	char what[160];
	int err;

	e.term = rps__le_get64(pr->payload);
	e.index = rps__le_get64(pr->payload + 8);
	e.type = pr->payload[16];
	e.data = pr->payload + ENTRY_FIXED;
	e.len = pr->len - ENTRY_FIXED;
	if (e.index == 0)
		return replay_damaged(r, pr->off, "entry with index 0");
	if (e.index > rps__wal_replay_last(r) + 1) {
		snprintf(what, sizeof(what), "entry %" PRIu64 " follows entry %" PRIu64
			 " (index gap)", e.index, rps__wal_replay_last(r));
		return replay_damaged(r, pr->off, what);
	}
	if (e.index <= r->base) {
		/* A conflict reaching below the oldest kept segment: what was
		 * before it is covered by a snapshot (compaction only drops
		 * segments whose base is at or below a kept snapshot). */
		r->base = e.index - 1;
		r->base_term_known = false;
		r->n = 0;
	} else {
		r->n = (size_t)(e.index - r->base - 1);	/* conflict truncation */
	}
	if (rps__wal_replay_term_at(r, e.index - 1, &prev_term) && e.term < prev_term) {
		snprintf(what, sizeof(what), "entry %" PRIu64 " has term %" PRIu64
			 " after term %" PRIu64 " (terms go down)", e.index, e.term, prev_term);
		return replay_damaged(r, pr->off, what);
	}
	err = rps__wal_grow((void **)&r->ents, &r->cap, r->n + 1, sizeof(*r->ents));
	if (err)
		return err;
	r->ents[r->n++] = e;
	return 0;
}

static int replay_apply_marker(struct replay *r, const struct pending_rec *pr)
{
	uint64_t index = rps__le_get64(pr->payload), term = rps__le_get64(pr->payload + 8), t;
	int err;

	/* Markers need not go up: after falling back to an older snapshot,
	 * Raft snapshots again below the damaged one's marker. */
	err = rps__wal_grow((void **)&r->markers, &r->cap_markers, r->n_markers + 1, sizeof(*r->markers));
	if (err)
		return err;
	r->markers[r->n_markers++] = index;
	if (rps__wal_replay_term_at(r, index, &t)) {
		if (t == term)
			return 0;	/* local snapshot: the log goes on after it */
	} else if (index <= rps__wal_replay_last(r)) {
		/* Older than what this replay can check (its entries were in
		 * compacted segments); entries written after it, if any,
		 * arrive as overwrites and fix the log up. */
		return 0;
	}
	/* installed snapshot: the log restarts after it (as save_snapshot did) */
	r->base = index;
	r->base_term = term;
	r->base_term_known = true;
	r->n = 0;
	return 0;
}

bool rps__wal_replay_has_marker(const struct replay *r, uint64_t index)
{
	for (size_t i = 0; i < r->n_markers; i++)
		if (r->markers[i] == index)
			return true;
	return false;
}

static int replay_apply_batch(struct replay *r)
{
	int err = 0;

	for (size_t i = 0; i < r->n_pend && !err; i++) {
		const struct pending_rec *pr = &r->pend[i];
		struct rps__wal_hard_state hs;

		switch (pr->kind) {
		case REC_ENTRY:
			err = replay_apply_entry(r, pr);
			break;
		case REC_HARD_STATE:
			hs.term = rps__le_get64(pr->payload);
			hs.vote = rps__le_get64(pr->payload + 8);
			hs.commit = rps__le_get64(pr->payload + 16);
			if (hs.term < r->hs.term)
				err = replay_damaged(r, pr->off, "hard state term goes down");
			r->hs = hs;
			break;
		case REC_SNAPSHOT:
			err = replay_apply_marker(r, pr);
			break;
		}
	}
	r->n_pend = 0;
	r->in_batch = false;
	r->next_batch++;
	return err;
}

/*
 * The record at off is not intact.  In the last segment that is a torn tail
 * if nothing intact follows except records of the same, unfinished batch;
 * anything else means acknowledged data was damaged.
 */
static int replay_bad_record(struct replay *r, const uint8_t *buf, size_t size,
			     size_t off, const char *why, bool last_segment)
{
	/* the batch being read when the damage starts (next_batch moves on
	 * only once a batch is complete) */
	uint64_t open_batch = r->next_batch;
	char what[200];

	if (!last_segment) {
		snprintf(what, sizeof(what), "%s in a segment that is not the last one", why);
		return replay_damaged(r, off, what);
	}
	for (size_t p = off + 8; p + REC_HDR_SIZE <= size;) {
		struct rec_view v;

		if (rps__wal_rec_parse(buf, size, p, &v) != NULL) {
			p += 8;
			continue;
		}
		if (v.batch != open_batch) {
			snprintf(what, sizeof(what), "%s, yet intact records follow (at offset %zu),"
				 " so this is damage, not a torn write", why, p);
			return replay_damaged(r, off, what);
		}
		p += v.size;
	}
	r->keep_size = r->in_batch ? r->batch_start : off;
	r->torn_bytes = size - r->keep_size;
	r->n_pend = 0;
	r->in_batch = false;
	return 0;
}

int rps__wal_replay_segment(struct replay *r, const char *name, uint64_t name_seq,
			    uint64_t name_base, const uint8_t *buf, size_t size,
			    bool first, bool last)
{
	uint64_t base_index, base_term, first_batch, t;
	size_t off;
	int err;

	r->name = name;
	r->keep_size = size;
	r->torn_bytes = 0;
	if (size < SEG_HDR_SIZE || memcmp(buf, SEG_MAGIC, MAGIC_LEN) != 0 ||
	    rps__crc32c(0, buf, 60) != rps__le_get32(buf + 60))
		return replay_damaged(r, 0, "bad segment header");
	if (rps__le_get32(buf + 8) != FORMAT_VERSION || rps__le_get32(buf + 12) != SEG_HDR_SIZE)
		return rps__seterr(-EBADMSG, "wal: %.150s/%s: format version %u, this build reads %u:"
				   " run a matching rdmapsd", r->dir, name, rps__le_get32(buf + 8), FORMAT_VERSION);
	base_index = rps__le_get64(buf + 24);
	base_term = rps__le_get64(buf + 32);
	first_batch = rps__le_get64(buf + 40);
	if (rps__le_get64(buf + 16) != name_seq || base_index != name_base)
		return replay_damaged(r, 0, "segment header does not match the file name");
	if (first) {
		r->base = base_index;
		r->base_term = base_term;
		r->base_term_known = true;
		r->next_batch = first_batch;
	} else if (base_index != rps__wal_replay_last(r) || first_batch != r->next_batch ||
		   (rps__wal_replay_term_at(r, base_index, &t) && t != base_term)) {
		return replay_damaged(r, 0, "segment does not continue the previous one");
	}

	for (off = SEG_HDR_SIZE; off < size;) {
		struct rec_view v;
		const char *why = rps__wal_rec_parse(buf, size, off, &v);

		if (why)
			return replay_bad_record(r, buf, size, off, why, last);
		if (r->in_batch ? v.batch != r->next_batch || v.left != r->batch_left - 1
				: v.batch != r->next_batch)
			return replay_damaged(r, off, "record out of batch sequence");
		if (!r->in_batch) {
			r->in_batch = true;
			r->batch_start = off;
		}
		r->batch_left = v.left;
		err = rps__wal_grow((void **)&r->pend, &r->cap_pend, r->n_pend + 1, sizeof(*r->pend));
		if (err)
			return err;
		r->pend[r->n_pend++] = (struct pending_rec){ off, v.kind, v.payload, v.len };
		off += v.size;
		if (v.left == 0) {
			err = replay_apply_batch(r);
			if (err)
				return err;
		}
	}
	if (r->in_batch) {
		/* ends cleanly between records, but inside a save */
		if (!last)
			return replay_damaged(r, off, "segment ends inside a save and is not the last one");
		r->keep_size = r->batch_start;
		r->torn_bytes = size - r->keep_size;
		r->n_pend = 0;
		r->in_batch = false;
	}
	return 0;
}

