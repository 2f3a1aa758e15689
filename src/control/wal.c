/*
 * wal.c - the Raft node's log and snapshots on disk (contract in wal.h).
 *
 * On-disk format.  Integers are little-endian; every CRC is standard CRC-32C
 * (ISA-L crc32_iscsi, inverted in and out), and every byte of every file is
 * covered by one.  Magics end in "\r\n" so a text-mode copy shows up as a
 * bad magic, not as a subtly different file.
 *
 * Segment wal-<seq>-<base index>.log (16 hex digits each):
 *   header, 64 bytes:  0 magic "RPSWAL\r\n"  8 u32 version (1)
 *     12 u32 header size (64)  16 u64 seq  24 u64 base index
 *     32 u64 base term  40 u64 first batch  48..59 zero  60 u32 crc(0..59)
 *   base index/term: the last log entry when the segment was started, so a
 *   segment can be replayed without the ones before it (after compaction).
 *   Then records, each starting 8-byte aligned:
 *     0 u32 crc of bytes 4..end of padding   4 u32 payload length
 *     8 u8 kind  9..11 zero  12 u32 records left in this batch after this one
 *     16 u64 batch (save sequence number, +1 per save across all segments)
 *     24 payload, zero-padded to a multiple of 8
 *   kinds: 1 entry {u64 term, u64 index, u8 type, data}
 *          2 hard state {u64 term, u64 vote, u64 commit}
 *          3 snapshot marker {u64 index, u64 term}
 *   A segment opens with a batch holding one hard state record (a copy of the
 *   current one), so the newest hard state survives compaction.
 *
 * Snapshot snap-<index>-<term>.snap:
 *   header, 64 bytes:  0 magic "RPSSNP\r\n"  8 u32 version (1)
 *     12 u32 header size (64)  16 u64 index  24 u64 term  32 u32 voters
 *     36 u32 learners  40 u64 data length  48..59 zero  60 u32 crc(0..59)
 *   u64 voters[], u64 learners[], data, then u32 crc of everything before.
 *
 * Why batches: a save is one write and one fdatasync, but the disk may
 * persist its pages in any order, so after a crash the last save can have a
 * hole with intact records after it.  Every record names its batch, so
 * replay can tell that (damage confined to the last, unfinished batch: a
 * torn tail, dropped whole) from damage to an earlier, acknowledged batch
 * (refused).  The price: bit rot in the very last batch is indistinguishable
 * from a torn write and is dropped too.
 *
 * Commit witness COMMIT, 24 bytes:  0 magic "RPSCMT\r\n"  8 u64 commit index
 *   16 u32 crc(0..15)  20 u32 zero.
 *   The hard state lives in the log, so a log cut short (a truncated or lost
 *   segment) takes its own commit index with it and passes for a torn tail.
 *   Once a save that raised the commit index is durable, the index is also
 *   written here (one pwrite, never synced): it can only lag what the log
 *   durably holds, so open refuses a log whose last index is below it.  A
 *   missing or damaged witness only weakens that check.
 *
 * Crash ordering: new segments and snapshots are written under a .tmp name,
 * synced, renamed and the directory synced, so a file with a final name is
 * always whole.  A snapshot is durable before its marker enters the log, and
 * the marker is durable before anything it covers is deleted.  Segments are
 * deleted oldest first, syncing the directory after each, so what survives a
 * crash is always a run of consecutive segments.
 *
 * This file: small helpers, records, segments and batches (saves).  Replay,
 * snapshot files and compaction, and open are beside it (wal_int.h).
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
#include <sys/stat.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------ */

int rps__wal_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	size_t ncap = *cap ? *cap : 8;
	void *p;

	if (need <= *cap)
		return 0;
	while (ncap < need)
		ncap *= 2;
	p = realloc(*arr, ncap * elem);
	if (!p)
		return rps__seterr(-ENOMEM, "wal: out of memory");
	*arr = p;
	*cap = ncap;
	return 0;
}

static size_t rec_size(size_t payload)
{
	return REC_HDR_SIZE + RPS__ALIGN_UP(payload, 8);
}

void rps__wal_seg_name(char *out, uint64_t seq, uint64_t base)
{
	snprintf(out, NAME_BUF, "wal-%016" PRIx64 "-%016" PRIx64 ".log", seq, base);
}

void rps__wal_snap_name(char *out, uint64_t index, uint64_t term)
{
	snprintf(out, NAME_BUF, "snap-%016" PRIx64 "-%016" PRIx64 ".snap", index, term);
}

/* Exactly 16 lowercase hex digits: the names we write, nothing looser. */
int rps__wal_do_sync(const struct rps__wal_opts *o, int fd, bool data_only)
{
	int rc;

	if (o->fsync == RPS__WAL_FSYNC_NONE)
		return 0;
	if (o->sync_fn)
		return o->sync_fn(fd, data_only, o->sync_ctx);
	rc = data_only ? fdatasync(fd) : fsync(fd);
	return rc ? -errno : 0;
}

static int wal_sync_file(int fd, void *opts)
{
	return rps__wal_do_sync(opts, fd, false);
}

/* Publish the file fd, written whole as tmp, under name (rps__publish_at);
 * fd stays open.  A failure before the rename removes tmp; one after it
 * breaks the log (-EIO): whether the name survives a crash is unknown, so
 * the node must stop. */
int rps__wal_publish(struct rps__wal *w, int fd, const char *tmp, const char *name)
{
	enum rps__publish_step failed;
	int err = rps__publish_at(w->dir_fd, fd, tmp, name, wal_sync_file, &w->opts, &failed);

	if (!err)
		return 0;
	if (failed != RPS__PUBLISH_SYNC_DIR) {
		rps__seterr(err, "wal: %s %.150s/%s: %s", failed == RPS__PUBLISH_RENAME ? "renaming" : "syncing",
			    w->dir, tmp, strerror(-err));
		unlinkat(w->dir_fd, tmp, 0);
		return err;
	}
	w->broken = -EIO;
	return rps__seterr(-EIO, "wal: syncing directory %.150s: %s: the node must stop;"
			   " restart it", w->dir, strerror(-err));
}

/* The commit index the witness file holds, 0 if it is absent or damaged. */
uint64_t rps__wal_witness_read(int dir_fd)
{
	uint8_t buf[WITNESS_SIZE + 1];
	ssize_t n;
	int fd = openat(dir_fd, WITNESS_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (n != WITNESS_SIZE || memcmp(buf, WITNESS_MAGIC, MAGIC_LEN) != 0 ||
	    rps__crc32c(0, buf, 16) != rps__le_get32(buf + 16))
		return 0;
	return rps__le_get64(buf + 8);
}

/* Called only once the save holding commit is durable.  A failed write is
 * not fatal: the witness then lags, which only weakens open's check. */
void rps__wal_witness_write(struct rps__wal *w, uint64_t commit)
{
	uint8_t buf[WITNESS_SIZE] = { 0 };

	if (w->witness_fd < 0)
		return;
	memcpy(buf, WITNESS_MAGIC, MAGIC_LEN);
	rps__le_put64(buf + 8, commit);
	rps__le_put32(buf + 16, rps__crc32c(0, buf, 16));
	if (rps__pwrite_all(w->witness_fd, buf, sizeof(buf), 0) == 0)
		w->witness = commit;
}

int rps__wal_read_file(int dir_fd, const char *name, uint8_t **out, size_t *size)
{
	struct stat st;
	uint8_t *buf = NULL;
	size_t got = 0;
	int fd, err;

	fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		err = -errno;
		goto out_close;
	}
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf) {
		err = -ENOMEM;
		goto out_close;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			err = n < 0 ? -errno : -EIO;	/* shrank under us */
			goto out_free;
		}
		got += (size_t)n;
	}
	close(fd);
	*out = buf;
	*size = got;
	return 0;

out_free:
	free(buf);
out_close:
	close(fd);
	return err;
}

/* ---- records ------------------------------------------------------------ */

/* The payload is already at p + REC_HDR_SIZE; fill the header, pad, seal. */
static void rec_seal(uint8_t *p, uint8_t kind, uint32_t len, uint64_t batch, uint32_t left)
{
	size_t total = rec_size(len);

	rps__le_put32(p + 4, len);
	p[8] = kind;
	p[9] = p[10] = p[11] = 0;
	rps__le_put32(p + 12, left);
	rps__le_put64(p + 16, batch);
	memset(p + REC_HDR_SIZE + len, 0, total - REC_HDR_SIZE - len);
	rps__le_put32(p, rps__crc32c(0, p + 4, total - 4));
}

/* NULL if an intact record starts at off, else why not. */
const char *rps__wal_rec_parse(const uint8_t *buf, size_t size, size_t off, struct rec_view *v)
{
	const uint8_t *p = buf + off;
	size_t room = size - off;

	if (room < REC_HDR_SIZE)
		return "incomplete record header";
	v->len = rps__le_get32(p + 4);
	v->kind = p[8];
	v->left = rps__le_get32(p + 12);
	v->batch = rps__le_get64(p + 16);
	if (p[9] || p[10] || p[11])
		return "bad record header";
	switch (v->kind) {
	case REC_ENTRY:
		if (v->len < ENTRY_FIXED || v->len > REC_MAX_PAYLOAD)
			return "bad record length";
		break;
	case REC_HARD_STATE:
		if (v->len != HS_PAYLOAD)
			return "bad record length";
		break;
	case REC_SNAPSHOT:
		if (v->len != MARKER_PAYLOAD)
			return "bad record length";
		break;
	default:
		return "unknown record kind";
	}
	v->size = rec_size(v->len);
	if (v->size > room)
		return "record runs past the end of the file";
	if (rps__crc32c(0, p + 4, v->size - 4) != rps__le_get32(p))
		return "checksum mismatch";
	v->payload = p + REC_HDR_SIZE;
	return NULL;
}

static void seg_header_encode(uint8_t *p, uint64_t seq, uint64_t base_index,
			      uint64_t base_term, uint64_t first_batch)
{
	memset(p, 0, SEG_HDR_SIZE);
	memcpy(p, SEG_MAGIC, MAGIC_LEN);
	rps__le_put32(p + 8, FORMAT_VERSION);
	rps__le_put32(p + 12, SEG_HDR_SIZE);
	rps__le_put64(p + 16, seq);
	rps__le_put64(p + 24, base_index);
	rps__le_put64(p + 32, base_term);
	rps__le_put64(p + 40, first_batch);
	rps__le_put32(p + 60, rps__crc32c(0, p, 60));
}

/* ---- segments and batches ----------------------------------------------- */

uint64_t rps__wal_term_at(const struct rps__wal *w, uint64_t index)
{
	if (index <= w->snap_index)
		return w->snap_term;
	return w->terms[index - w->snap_index - 1];
}

uint64_t rps__wal_last_index(const struct rps__wal *w)
{
	return w->snap_index + w->n_terms;
}

uint64_t rps__wal_last_term(const struct rps__wal *w)
{
	return rps__wal_term_at(w, rps__wal_last_index(w));
}

/* Start segment seq last+1 at the current end of the log: written whole
 * under a temporary name, then renamed, so it is never seen half made. */
int rps__wal_roll(struct rps__wal *w)
{
	uint64_t seq = w->n_segs ? w->segs[w->n_segs - 1].seq + 1 : 1;
	uint64_t base = rps__wal_last_index(w);
	uint8_t head[SEG_OPENING_SIZE];
	char name[NAME_BUF], tmp[NAME_BUF + 4];
	int fd, err;

	err = rps__wal_grow((void **)&w->segs, &w->cap_segs, w->n_segs + 1, sizeof(*w->segs));
	if (err)
		return err;
	rps__wal_seg_name(name, seq, base);
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	seg_header_encode(head, seq, base, rps__wal_last_term(w), w->next_batch);
	rps__le_put64(head + SEG_HDR_SIZE + REC_HDR_SIZE, w->hs.term);
	rps__le_put64(head + SEG_HDR_SIZE + REC_HDR_SIZE + 8, w->hs.vote);
	rps__le_put64(head + SEG_HDR_SIZE + REC_HDR_SIZE + 16, w->hs.commit);
	rec_seal(head + SEG_HDR_SIZE, REC_HARD_STATE, HS_PAYLOAD, w->next_batch, 0);

	fd = openat(w->dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		err = -errno;
		return rps__seterr(err, "wal: creating %.150s/%s: %s", w->dir, tmp, strerror(-err));
	}
	err = rps__pwrite_all(fd, head, sizeof(head), 0);
	if (err) {
		rps__seterr(err, "wal: writing %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	err = rps__wal_publish(w, fd, tmp, name);
	if (err) {
		close(fd);
		return err;
	}
	if (w->seg_fd >= 0)
		close(w->seg_fd);
	w->seg_fd = fd;
	w->segs[w->n_segs++] = (struct wal_seg){ seq, base };
	w->seg_end = sizeof(head);
	w->next_batch++;
	return 0;

out_unlink:
	close(fd);
	unlinkat(w->dir_fd, tmp, 0);
	return err;
}

/* Make room for a batch of size bytes: roll over if the segment is full. */
static int wal_batch_begin(struct rps__wal *w, size_t size)
{
	int err;

	if (w->seg_end > SEG_OPENING_SIZE && w->seg_end + size > w->opts.segment_size) {
		err = rps__wal_roll(w);
		if (err)
			return err;
	}
	return rps__wal_grow((void **)&w->buf, &w->cap_buf, size, 1);
}

/* Write the batch encoded in w->buf and sync it per policy. */
static int wal_batch_commit(struct rps__wal *w, size_t size)
{
	char name[NAME_BUF];
	int err;

	rps__wal_seg_name(name, w->segs[w->n_segs - 1].seq, w->segs[w->n_segs - 1].base_index);
	err = rps__pwrite_all(w->seg_fd, w->buf, size, w->seg_end);
	if (err) {
		/* Cut the partial batch off so the log stays clean; if even
		 * that fails, only a restart (replay) can sort it out. */
		if (ftruncate(w->seg_fd, (off_t)w->seg_end) < 0)
			w->broken = -EIO;
		return rps__seterr(err, "wal: writing %.150s/%s: %s%s", w->dir, name, strerror(-err),
				   w->broken ? ": the node must stop; restart it" : "");
	}
	err = rps__wal_do_sync(&w->opts, w->seg_fd, true);
	if (err) {
		/* After a failed fsync the kernel may have dropped the dirty
		 * pages and a retry would report success: never retry. */
		w->broken = -EIO;
		return rps__seterr(-EIO, "wal: syncing %.150s/%s: %s: the node must stop; restart it",
				   w->dir, name, strerror(-err));
	}
	w->seg_end += size;
	w->next_batch++;
	return 0;
}

/* Check that the entries follow the log and the hard state follows the last
 * one; *size: the bytes of the batch, *new_last: the last index after it. */
static int save_check(const struct rps__wal *w, const struct rps__wal_hard_state *hs,
		      const struct rps__wal_entry *ents, size_t n, size_t *size, uint64_t *new_last)
{
	uint64_t last = rps__wal_last_index(w);

	*size = 0;
	*new_last = last;
	if (n > 0) {
		uint64_t first = ents[0].index;

		if (first <= w->snap_index || first > last + 1)
			return rps__seterr(-EINVAL, "wal: entry %" PRIu64 " cannot follow the log"
					   " (snapshot %" PRIu64 ", last %" PRIu64 ")",
					   first, w->snap_index, last);
		if (ents[0].term < rps__wal_term_at(w, first - 1))
			return rps__seterr(-EINVAL, "wal: entry %" PRIu64 " term %" PRIu64
					   " is below the previous entry's %" PRIu64,
					   first, ents[0].term, rps__wal_term_at(w, first - 1));
		for (size_t i = 0; i < n; i++) {
			if (i > 0 && (ents[i].index != ents[i - 1].index + 1 ||
				      ents[i].term < ents[i - 1].term))
				return rps__seterr(-EINVAL, "wal: entries must be consecutive with"
						   " terms that never go down (entry %" PRIu64 ")",
						   ents[i].index);
			if (ents[i].len > REC_MAX_PAYLOAD - ENTRY_FIXED)
				return rps__seterr(-EMSGSIZE, "wal: entry %" PRIu64 " is %zu bytes,"
						   " more than %u", ents[i].index, ents[i].len,
						   REC_MAX_PAYLOAD - ENTRY_FIXED);
			*size += rec_size(ENTRY_FIXED + ents[i].len);
		}
		*new_last = ents[n - 1].index;
	}
	if (hs) {
		if (hs->term < w->hs.term || hs->commit > *new_last)
			return rps__seterr(-EINVAL, "wal: hard state term %" PRIu64 " commit %" PRIu64
					   " after term %" PRIu64 " with last index %" PRIu64,
					   hs->term, hs->commit, w->hs.term, *new_last);
		*size += rec_size(HS_PAYLOAD);
	}
	return 0;
}

/* Encode the batch into w->buf: entries before the hard state, so a commit
 * index never lands on disk ahead of the entries it covers, even with
 * reordered pages. */
static void save_encode(struct rps__wal *w, const struct rps__wal_hard_state *hs,
			const struct rps__wal_entry *ents, size_t n)
{
	uint64_t batch = w->next_batch;
	uint32_t left = (uint32_t)(n + (hs ? 1 : 0));
	size_t off = 0;

	for (size_t i = 0; i < n; i++) {
		uint8_t *p = w->buf + off, *pl = p + REC_HDR_SIZE;

		rps__le_put64(pl, ents[i].term);
		rps__le_put64(pl + 8, ents[i].index);
		pl[16] = ents[i].type;
		if (ents[i].len)
			memcpy(pl + ENTRY_FIXED, ents[i].data, ents[i].len);
		rec_seal(p, REC_ENTRY, (uint32_t)(ENTRY_FIXED + ents[i].len), batch, --left);
		off += rec_size(ENTRY_FIXED + ents[i].len);
	}
	if (hs) {
		uint8_t *p = w->buf + off;

		rps__le_put64(p + REC_HDR_SIZE, hs->term);
		rps__le_put64(p + REC_HDR_SIZE + 8, hs->vote);
		rps__le_put64(p + REC_HDR_SIZE + 16, hs->commit);
		rec_seal(p, REC_HARD_STATE, HS_PAYLOAD, batch, --left);
	}
}

/* The batch is durable: the log in memory and the witness follow it. */
static void save_remember(struct rps__wal *w, const struct rps__wal_hard_state *hs,
			  const struct rps__wal_entry *ents, size_t n)
{
	if (n > 0) {
		size_t keep = (size_t)(ents[0].index - w->snap_index - 1);	/* drops a conflicting suffix */

		for (size_t i = 0; i < n; i++)
			w->terms[keep + i] = ents[i].term;
		w->n_terms = keep + n;
	}
	if (hs)
		w->hs = *hs;
	if (hs && hs->commit > w->witness)
		rps__wal_witness_write(w, hs->commit);
}

int rps__wal_save(struct rps__wal *w, const struct rps__wal_hard_state *hs,
		  const struct rps__wal_entry *ents, size_t n)
{
	uint64_t new_last;
	size_t size;
	int err;

	if (w->broken)
		return rps__seterr(w->broken, "wal: %.150s: an earlier write or sync failed;"
				   " restart the node", w->dir);
	if (!hs && n == 0)
		return 0;
	err = save_check(w, hs, ents, n, &size, &new_last);
	if (err)
		return err;
	if (n > 0) {
		err = rps__wal_grow((void **)&w->terms, &w->cap_terms,
				    (size_t)(new_last - w->snap_index), sizeof(*w->terms));
		if (err)
			return err;
	}

	err = wal_batch_begin(w, size);
	if (err)
		return err;
	save_encode(w, hs, ents, n);
	err = wal_batch_commit(w, size);
	if (err)
		return err;
	save_remember(w, hs, ents, n);
	return 0;
}

int rps__wal_append_marker(struct rps__wal *w, uint64_t index, uint64_t term)
{
	size_t size = rec_size(MARKER_PAYLOAD);
	int err;

	err = wal_batch_begin(w, size);
	if (err)
		return err;
	rps__le_put64(w->buf + REC_HDR_SIZE, index);
	rps__le_put64(w->buf + REC_HDR_SIZE + 8, term);
	rec_seal(w->buf, REC_SNAPSHOT, MARKER_PAYLOAD, w->next_batch, 0);
	return wal_batch_commit(w, size);
}

