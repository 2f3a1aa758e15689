/*
 * wal_snap.c - snapshot files (load, check, write durably) and compaction:
 * saving a snapshot, then deleting the segments and older snapshots it
 * covers.  Format and crash ordering: the top of wal.c.
 */
#include "config.h"
#include "control/wal_int.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/fsutil.h"
#include "common/le.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- snapshots files ------------------------------------------------------ */

/* Load and check a snapshot file.  On success *buf owns the memory that
 * s points into.  -EBADMSG (message says why) if it is damaged. */
int rps__wal_snap_load(int dir_fd, const char *dir, const char *name, uint64_t index,
		       uint64_t term, uint8_t **bufp, struct rps__wal_snapshot *s)
{
	uint8_t *buf;
	size_t size, members;
	uint64_t nv, nl, len;
	const char *why = NULL;
	int err;

	err = rps__wal_read_file(dir_fd, name, &buf, &size);
	if (err)
		return rps__seterr(err, "wal: reading snapshot %.150s/%s: %s", dir, name, strerror(-err));
	if (size < SNAP_HDR_SIZE + SNAP_TRAILER_SIZE || memcmp(buf, SNAP_MAGIC, MAGIC_LEN) != 0 ||
	    rps__crc32c(0, buf, 60) != rps__le_get32(buf + 60)) {
		why = "bad header";
		goto bad;
	}
	if (rps__le_get32(buf + 8) != FORMAT_VERSION || rps__le_get32(buf + 12) != SNAP_HDR_SIZE) {
		why = "unknown format version";
		goto bad;
	}
	nv = rps__le_get32(buf + 32);
	nl = rps__le_get32(buf + 36);
	len = rps__le_get64(buf + 40);
	if (rps__le_get64(buf + 16) != index || rps__le_get64(buf + 24) != term) {
		why = "header does not match the file name";
		goto bad;
	}
	if (nv > SNAP_MAX_MEMBERS || nl > SNAP_MAX_MEMBERS ||
	    len != size - SNAP_HDR_SIZE - SNAP_TRAILER_SIZE - 8 * (nv + nl) ||
	    len > size) {
		why = "wrong size (truncated?)";
		goto bad;
	}
	if (rps__crc32c(0, buf, size - SNAP_TRAILER_SIZE) != rps__le_get32(buf + size - SNAP_TRAILER_SIZE)) {
		why = "checksum mismatch";
		goto bad;
	}
	/* ids are little-endian on disk: decode in place, the buffer is ours */
	members = (size_t)(nv + nl);
	for (size_t i = 0; i < members; i++) {
		uint64_t id = rps__le_get64(buf + SNAP_HDR_SIZE + 8 * i);

		memcpy(buf + SNAP_HDR_SIZE + 8 * i, &id, sizeof(id));
	}
	s->index = index;
	s->term = term;
	s->voters = (const uint64_t *)(void *)(buf + SNAP_HDR_SIZE);
	s->n_voters = (size_t)nv;
	s->learners = s->voters + nv;
	s->n_learners = (size_t)nl;
	s->data = buf + SNAP_HDR_SIZE + 8 * members;
	s->len = (size_t)len;
	*bufp = buf;
	return 0;

bad:
	free(buf);
	return rps__seterr(-EBADMSG, "wal: snapshot %.150s/%s is damaged: %s", dir, name, why);
}

static int snap_write(struct rps__wal *w, const struct rps__wal_snapshot *s)
{
	char name[NAME_BUF], tmp[NAME_BUF + 4];
	uint8_t hdr[SNAP_HDR_SIZE], trailer[SNAP_TRAILER_SIZE];
	size_t members = s->n_voters + s->n_learners, ids_len = 8 * members;
	uint64_t off = 0;
	uint32_t crc;
	int fd, err;

	rps__wal_snap_name(name, s->index, s->term);
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	err = rps__wal_grow((void **)&w->buf, &w->cap_buf, ids_len + 1, 1);
	if (err)
		return err;
	for (size_t i = 0; i < members; i++)
		rps__le_put64(w->buf + 8 * i, i < s->n_voters ? s->voters[i] : s->learners[i - s->n_voters]);
	memset(hdr, 0, sizeof(hdr));
	memcpy(hdr, SNAP_MAGIC, MAGIC_LEN);
	rps__le_put32(hdr + 8, FORMAT_VERSION);
	rps__le_put32(hdr + 12, SNAP_HDR_SIZE);
	rps__le_put64(hdr + 16, s->index);
	rps__le_put64(hdr + 24, s->term);
	rps__le_put32(hdr + 32, (uint32_t)s->n_voters);
	rps__le_put32(hdr + 36, (uint32_t)s->n_learners);
	rps__le_put64(hdr + 40, s->len);
	rps__le_put32(hdr + 60, rps__crc32c(0, hdr, 60));
	crc = rps__crc32c(0, hdr, sizeof(hdr));
	crc = rps__crc32c(crc, w->buf, ids_len);
	crc = rps__crc32c(crc, s->data, s->len);
	rps__le_put32(trailer, crc);

	fd = openat(w->dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		err = -errno;
		return rps__seterr(err, "wal: creating %.150s/%s: %s", w->dir, tmp, strerror(-err));
	}
	err = rps__pwrite_all(fd, hdr, sizeof(hdr), off);
	off += sizeof(hdr);
	if (!err)
		err = rps__pwrite_all(fd, w->buf, ids_len, off);
	off += ids_len;
	if (!err)
		err = rps__pwrite_all(fd, s->data, s->len, off);
	off += s->len;
	if (!err)
		err = rps__pwrite_all(fd, trailer, sizeof(trailer), off);
	if (err) {
		rps__seterr(err, "wal: writing %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	err = rps__wal_publish(w, fd, tmp, name);
	close(fd);
	return err;

out_unlink:
	close(fd);
	unlinkat(w->dir_fd, tmp, 0);
	return err;
}

/* ---- compaction ---------------------------------------------------------- */

int rps__wal_snapref_cmp(const void *a, const void *b)
{
	const struct wal_snapref *x = a, *y = b;

	return x->index < y->index ? -1 : x->index > y->index;
}

/*
 * Keep the newest keep_snapshots snapshots and the log from the oldest of
 * them on.  Segment j can go once a later segment k has base <= that
 * snapshot: an entry after the snapshot written before k started would have
 * been live when k started, i.e. <= k's base.  So the largest such k keeps
 * everything needed.
 */
static int wal_compact(struct rps__wal *w)
{
	size_t keep = RPS__MIN((size_t)w->opts.keep_snapshots, w->n_snaps), drop_snaps, drop_segs = 0;
	uint64_t oldest;
	char name[NAME_BUF];
	int err;

	if (keep == 0)
		return 0;
	drop_snaps = w->n_snaps - keep;
	oldest = w->snaps[drop_snaps].index;
	for (size_t k = 1; k < w->n_segs; k++)
		if (w->segs[k].base_index <= oldest)
			drop_segs = k;
	while (drop_segs > 0) {
		rps__wal_seg_name(name, w->segs[0].seq, w->segs[0].base_index);
		if (unlinkat(w->dir_fd, name, 0) < 0 && errno != ENOENT) {
			err = -errno;
			return rps__seterr(err, "wal: removing %.150s/%s: %s (the snapshot is durable;"
					   " the next one retries)", w->dir, name, strerror(-err));
		}
		/* oldest first, each durable before the next: a crash never
		 * leaves a hole in the sequence of segments */
		err = rps__wal_do_sync(&w->opts, w->dir_fd, false);
		if (err) {
			w->broken = -EIO;
			return rps__seterr(-EIO, "wal: syncing directory %.150s: %s: the node must"
					   " stop; restart it", w->dir, strerror(-err));
		}
		memmove(w->segs, w->segs + 1, (w->n_segs - 1) * sizeof(*w->segs));
		w->n_segs--;
		drop_segs--;
	}
	/* An old snapshot that a crash resurrects is harmless: no sync. */
	while (drop_snaps > 0) {
		rps__wal_snap_name(name, w->snaps[0].index, w->snaps[0].term);
		if (unlinkat(w->dir_fd, name, 0) < 0 && errno != ENOENT) {
			err = -errno;
			return rps__seterr(err, "wal: removing %.150s/%s: %s (the snapshot is durable;"
					   " the next one retries)", w->dir, name, strerror(-err));
		}
		memmove(w->snaps, w->snaps + 1, (w->n_snaps - 1) * sizeof(*w->snaps));
		w->n_snaps--;
		drop_snaps--;
	}
	return 0;
}

int rps__wal_save_snapshot(struct rps__wal *w, const struct rps__wal_snapshot *s)
{
	uint64_t last = rps__wal_last_index(w);
	bool log_matches;
	size_t i;
	int err;

	if (w->broken)
		return rps__seterr(w->broken, "wal: %.150s: an earlier write or sync failed;"
				   " restart the node", w->dir);
	if (s->index <= w->snap_index)
		return rps__seterr(-EINVAL, "wal: snapshot at %" PRIu64 " is not past the current"
				   " one at %" PRIu64, s->index, w->snap_index);
	if (s->n_voters > SNAP_MAX_MEMBERS || s->n_learners > SNAP_MAX_MEMBERS ||
	    (s->n_voters && !s->voters) || (s->n_learners && !s->learners) || (s->len && !s->data))
		return rps__seterr(-EINVAL, "wal: snapshot configuration or data missing or too big");
	log_matches = s->index <= last && rps__wal_term_at(w, s->index) == s->term;
	if (!log_matches && w->hs.commit > s->index)
		return rps__seterr(-EINVAL, "wal: snapshot at %" PRIu64 " term %" PRIu64 " conflicts"
				   " with the log, which is committed up to %" PRIu64,
				   s->index, s->term, w->hs.commit);

	err = snap_write(w, s);
	if (err)
		return err;
	/* The file is durable; now the log learns about it. */
	err = rps__wal_append_marker(w, s->index, s->term);
	if (err)
		return err;

	if (log_matches) {
		size_t drop = (size_t)(s->index - w->snap_index);

		memmove(w->terms, w->terms + drop, (w->n_terms - drop) * sizeof(*w->terms));
		w->n_terms -= drop;
	} else {
		w->n_terms = 0;
	}
	w->snap_index = s->index;
	w->snap_term = s->term;
	err = rps__wal_grow((void **)&w->snaps, &w->cap_snaps, w->n_snaps + 1, sizeof(*w->snaps));
	if (err)
		return err;
	for (i = 0; i < w->n_snaps && w->snaps[i].index != s->index; i++)
		;
	w->snaps[i] = (struct wal_snapref){ s->index, s->term };
	if (i == w->n_snaps)
		w->n_snaps++;
	qsort(w->snaps, w->n_snaps, sizeof(*w->snaps), rps__wal_snapref_cmp);
	return wal_compact(w);
}

