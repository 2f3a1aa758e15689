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
 */
#include "config.h"
#include "control/wal.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/le.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEG_MAGIC "RPSWAL\r\n"
#define SNAP_MAGIC "RPSSNP\r\n"
#define MAGIC_LEN 8u
#define FORMAT_VERSION 1u
#define SEG_HDR_SIZE 64u
#define SNAP_HDR_SIZE 64u
#define SNAP_TRAILER_SIZE 4u
#define REC_HDR_SIZE 24u
#define ENTRY_FIXED 17u		/* term, index, type */
#define HS_PAYLOAD 24u
#define MARKER_PAYLOAD 16u
#define REC_MAX_PAYLOAD (1u << 30)
#define SNAP_MAX_MEMBERS (1u << 20)
#define DEFAULT_SEGMENT_SIZE (64ull << 20)
#define MIN_SEGMENT_SIZE 256u
#define DEFAULT_KEEP_SNAPSHOTS 2u
#define NAME_BUF 64
#define SEG_NAME_LEN 41		/* wal-<16>-<16>.log */
#define SNAP_NAME_LEN 43	/* snap-<16>-<16>.snap */

enum { REC_ENTRY = 1, REC_HARD_STATE = 2, REC_SNAPSHOT = 3 };

/* Size of a segment's opening batch (one hard state record): a segment no
 * bigger than this holds no save yet, so a big save does not roll it over. */
#define SEG_OPENING_SIZE (SEG_HDR_SIZE + REC_HDR_SIZE + HS_PAYLOAD)

#define RESTORE_HINT "restore this node from a peer: remove %.150s and rejoin"

#define WITNESS_NAME "COMMIT"
#define WITNESS_MAGIC "RPSCMT\r\n"
#define WITNESS_SIZE 24u

struct wal_seg {
	uint64_t seq;
	uint64_t base_index;
};

struct wal_snapref {
	uint64_t index;
	uint64_t term;
};

struct rps__wal {
	char *dir;
	int dir_fd;
	int lock_fd;
	int seg_fd;		/* the last segment, open for appends */
	int witness_fd;		/* COMMIT, see the top of the file */
	uint64_t witness;	/* the commit index written there */
	struct rps__wal_opts opts;
	struct wal_seg *segs;	/* oldest first; the last one is seg_fd */
	size_t n_segs, cap_segs;
	uint64_t seg_end;	/* append offset in the last segment */
	uint64_t next_batch;
	struct rps__wal_hard_state hs;
	/* The log in memory, terms only: entry i (> snap_index) has term
	 * terms[i - snap_index - 1].  Enough to validate saves. */
	uint64_t snap_index, snap_term;
	uint64_t *terms;
	size_t n_terms, cap_terms;
	struct wal_snapref *snaps;	/* snapshot files, ascending index */
	size_t n_snaps, cap_snaps;
	int broken;		/* sticky error after a failed write or sync */
	uint8_t *buf;		/* batch being encoded */
	size_t cap_buf;
};

/* ---- small helpers ------------------------------------------------------ */

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
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

static void seg_name(char *out, uint64_t seq, uint64_t base)
{
	snprintf(out, NAME_BUF, "wal-%016" PRIx64 "-%016" PRIx64 ".log", seq, base);
}

static void snap_name(char *out, uint64_t index, uint64_t term)
{
	snprintf(out, NAME_BUF, "snap-%016" PRIx64 "-%016" PRIx64 ".snap", index, term);
}

/* Exactly 16 lowercase hex digits: the names we write, nothing looser. */
static bool parse_hex16(const char *s, uint64_t *v)
{
	uint64_t x = 0;

	for (unsigned i = 0; i < 16; i++) {
		char c = s[i];

		if (c >= '0' && c <= '9')
			x = x << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			x = x << 4 | (uint64_t)(c - 'a' + 10);
		else
			return false;
	}
	*v = x;
	return true;
}

static bool parse_name(const char *name, const char *prefix, const char *suffix,
		       uint64_t *a, uint64_t *b)
{
	size_t lp = strlen(prefix), ls = strlen(suffix);

	if (strlen(name) != lp + 33 + ls || strncmp(name, prefix, lp) != 0 ||
	    name[lp + 16] != '-' || strcmp(name + lp + 33, suffix) != 0)
		return false;
	return parse_hex16(name + lp, a) && parse_hex16(name + lp + 17, b);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int do_sync(const struct rps__wal_opts *o, int fd, bool data_only)
{
	int rc;

	if (o->fsync == RPS__WAL_FSYNC_NONE)
		return 0;
	if (o->sync_fn)
		return o->sync_fn(fd, data_only, o->sync_ctx);
	rc = data_only ? fdatasync(fd) : fsync(fd);
	return rc ? -errno : 0;
}

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/* The commit index the witness file holds, 0 if it is absent or damaged. */
static uint64_t witness_read(int dir_fd)
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
static void witness_write(struct rps__wal *w, uint64_t commit)
{
	uint8_t buf[WITNESS_SIZE] = { 0 };

	if (w->witness_fd < 0)
		return;
	memcpy(buf, WITNESS_MAGIC, MAGIC_LEN);
	rps__le_put64(buf + 8, commit);
	rps__le_put32(buf + 16, rps__crc32c(0, buf, 16));
	if (pwrite_all(w->witness_fd, buf, sizeof(buf), 0) == 0)
		w->witness = commit;
}

static int read_file(int dir_fd, const char *name, uint8_t **out, size_t *size)
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

struct rec_view {
	uint8_t kind;
	uint32_t len;
	uint32_t left;
	uint64_t batch;
	const uint8_t *payload;
	size_t size;		/* header + padded payload */
};

/* NULL if an intact record starts at off, else why not. */
static const char *rec_parse(const uint8_t *buf, size_t size, size_t off, struct rec_view *v)
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

/* ---- replay ------------------------------------------------------------- */

struct replay_ent {
	uint64_t term;
	uint64_t index;
	const uint8_t *data;
	uint32_t len;
	uint8_t type;
};

struct pending_rec {
	size_t off;
	uint8_t kind;
	const uint8_t *payload;
	uint32_t len;
};

struct replay {
	const char *dir;
	const char *name;	/* segment being replayed, for messages */
	/* The live log: ents[i] has index base + 1 + i.  base_term is unknown
	 * once an overwrite reached below the first segment's base. */
	uint64_t base, base_term;
	bool base_term_known;
	struct replay_ent *ents;
	size_t n, cap;
	struct rps__wal_hard_state hs;
	uint64_t *markers;	/* indexes of the snapshot markers seen */
	size_t n_markers, cap_markers;
	uint64_t next_batch;
	/* The batch being read: applied only once its last record is seen. */
	struct pending_rec *pend;
	size_t n_pend, cap_pend;
	bool in_batch;
	size_t batch_start;
	uint32_t batch_left;
	/* torn tail of the last segment */
	uint64_t keep_size, torn_bytes;
	/* segment contents, alive until the live entries are copied out */
	uint8_t **bufs;
	size_t n_bufs, cap_bufs;
};

static uint64_t replay_last(const struct replay *r)
{
	return r->base + r->n;
}

static bool replay_term_at(const struct replay *r, uint64_t index, uint64_t *term)
{
	if (index == r->base) {
		*term = r->base_term;
		return r->base_term_known;
	}
	if (index < r->base || index > replay_last(r))
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
	if (e.index > replay_last(r) + 1) {
		snprintf(what, sizeof(what), "entry %" PRIu64 " follows entry %" PRIu64
			 " (index gap)", e.index, replay_last(r));
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
	if (replay_term_at(r, e.index - 1, &prev_term) && e.term < prev_term) {
		snprintf(what, sizeof(what), "entry %" PRIu64 " has term %" PRIu64
			 " after term %" PRIu64 " (terms go down)", e.index, e.term, prev_term);
		return replay_damaged(r, pr->off, what);
	}
	err = grow((void **)&r->ents, &r->cap, r->n + 1, sizeof(*r->ents));
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
	err = grow((void **)&r->markers, &r->cap_markers, r->n_markers + 1, sizeof(*r->markers));
	if (err)
		return err;
	r->markers[r->n_markers++] = index;
	if (replay_term_at(r, index, &t)) {
		if (t == term)
			return 0;	/* local snapshot: the log goes on after it */
	} else if (index <= replay_last(r)) {
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

static bool replay_has_marker(const struct replay *r, uint64_t index)
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

		if (rec_parse(buf, size, p, &v) != NULL) {
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

static int replay_segment(struct replay *r, const char *name, uint64_t name_seq,
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
	} else if (base_index != replay_last(r) || first_batch != r->next_batch ||
		   (replay_term_at(r, base_index, &t) && t != base_term)) {
		return replay_damaged(r, 0, "segment does not continue the previous one");
	}

	for (off = SEG_HDR_SIZE; off < size;) {
		struct rec_view v;
		const char *why = rec_parse(buf, size, off, &v);

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
		err = grow((void **)&r->pend, &r->cap_pend, r->n_pend + 1, sizeof(*r->pend));
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

/* ---- snapshots files ------------------------------------------------------ */

/* Load and check a snapshot file.  On success *buf owns the memory that
 * s points into.  -EBADMSG (message says why) if it is damaged. */
static int snap_load(int dir_fd, const char *dir, const char *name, uint64_t index,
		     uint64_t term, uint8_t **bufp, struct rps__wal_snapshot *s)
{
	uint8_t *buf;
	size_t size, members;
	uint64_t nv, nl, len;
	const char *why = NULL;
	int err;

	err = read_file(dir_fd, name, &buf, &size);
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

	snap_name(name, s->index, s->term);
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	err = grow((void **)&w->buf, &w->cap_buf, ids_len + 1, 1);
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
	err = pwrite_all(fd, hdr, sizeof(hdr), off);
	off += sizeof(hdr);
	if (!err)
		err = pwrite_all(fd, w->buf, ids_len, off);
	off += ids_len;
	if (!err)
		err = pwrite_all(fd, s->data, s->len, off);
	off += s->len;
	if (!err)
		err = pwrite_all(fd, trailer, sizeof(trailer), off);
	if (err) {
		rps__seterr(err, "wal: writing %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	err = do_sync(&w->opts, fd, false);
	if (err) {
		rps__seterr(err, "wal: syncing %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	if (renameat(w->dir_fd, tmp, w->dir_fd, name) < 0) {
		err = -errno;
		rps__seterr(err, "wal: renaming %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	close(fd);
	err = do_sync(&w->opts, w->dir_fd, false);
	if (err) {
		/* the rename may or may not survive a crash: stop here */
		w->broken = -EIO;
		return rps__seterr(-EIO, "wal: syncing directory %.150s: %s: the node must stop;"
				   " restart it", w->dir, strerror(-err));
	}
	return 0;

out_unlink:
	close(fd);
	unlinkat(w->dir_fd, tmp, 0);
	return err;
}

/* ---- segments and batches ----------------------------------------------- */

static uint64_t wal_term_at(const struct rps__wal *w, uint64_t index)
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
	return wal_term_at(w, rps__wal_last_index(w));
}

/* Start segment seq last+1 at the current end of the log: written whole
 * under a temporary name, then renamed, so it is never seen half made. */
static int wal_roll(struct rps__wal *w)
{
	uint64_t seq = w->n_segs ? w->segs[w->n_segs - 1].seq + 1 : 1;
	uint64_t base = rps__wal_last_index(w);
	uint8_t head[SEG_OPENING_SIZE];
	char name[NAME_BUF], tmp[NAME_BUF + 4];
	int fd, err;

	err = grow((void **)&w->segs, &w->cap_segs, w->n_segs + 1, sizeof(*w->segs));
	if (err)
		return err;
	seg_name(name, seq, base);
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
	err = pwrite_all(fd, head, sizeof(head), 0);
	if (err) {
		rps__seterr(err, "wal: writing %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	err = do_sync(&w->opts, fd, false);
	if (err) {
		rps__seterr(err, "wal: syncing %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	if (renameat(w->dir_fd, tmp, w->dir_fd, name) < 0) {
		err = -errno;
		rps__seterr(err, "wal: renaming %.150s/%s: %s", w->dir, tmp, strerror(-err));
		goto out_unlink;
	}
	err = do_sync(&w->opts, w->dir_fd, false);
	if (err) {
		close(fd);
		w->broken = -EIO;
		return rps__seterr(-EIO, "wal: syncing directory %.150s: %s: the node must stop;"
				   " restart it", w->dir, strerror(-err));
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
		err = wal_roll(w);
		if (err)
			return err;
	}
	return grow((void **)&w->buf, &w->cap_buf, size, 1);
}

/* Write the batch encoded in w->buf and sync it per policy. */
static int wal_batch_commit(struct rps__wal *w, size_t size)
{
	char name[NAME_BUF];
	int err;

	seg_name(name, w->segs[w->n_segs - 1].seq, w->segs[w->n_segs - 1].base_index);
	err = pwrite_all(w->seg_fd, w->buf, size, w->seg_end);
	if (err) {
		/* Cut the partial batch off so the log stays clean; if even
		 * that fails, only a restart (replay) can sort it out. */
		if (ftruncate(w->seg_fd, (off_t)w->seg_end) < 0)
			w->broken = -EIO;
		return rps__seterr(err, "wal: writing %.150s/%s: %s%s", w->dir, name, strerror(-err),
				   w->broken ? ": the node must stop; restart it" : "");
	}
	err = do_sync(&w->opts, w->seg_fd, true);
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

int rps__wal_save(struct rps__wal *w, const struct rps__wal_hard_state *hs,
		  const struct rps__wal_entry *ents, size_t n)
{
	uint64_t last = rps__wal_last_index(w), new_last = last, batch;
	size_t size = 0, off = 0, keep;
	uint32_t left;
	int err;

	if (w->broken)
		return rps__seterr(w->broken, "wal: %.150s: an earlier write or sync failed;"
				   " restart the node", w->dir);
	if (!hs && n == 0)
		return 0;
	if (n > 0) {
		uint64_t first = ents[0].index;

		if (first <= w->snap_index || first > last + 1)
			return rps__seterr(-EINVAL, "wal: entry %" PRIu64 " cannot follow the log"
					   " (snapshot %" PRIu64 ", last %" PRIu64 ")",
					   first, w->snap_index, last);
		if (ents[0].term < wal_term_at(w, first - 1))
			return rps__seterr(-EINVAL, "wal: entry %" PRIu64 " term %" PRIu64
					   " is below the previous entry's %" PRIu64,
					   first, ents[0].term, wal_term_at(w, first - 1));
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
			size += rec_size(ENTRY_FIXED + ents[i].len);
		}
		new_last = ents[n - 1].index;
	}
	if (hs) {
		if (hs->term < w->hs.term || hs->commit > new_last)
			return rps__seterr(-EINVAL, "wal: hard state term %" PRIu64 " commit %" PRIu64
					   " after term %" PRIu64 " with last index %" PRIu64,
					   hs->term, hs->commit, w->hs.term, new_last);
		size += rec_size(HS_PAYLOAD);
	}
	if (n > 0) {
		err = grow((void **)&w->terms, &w->cap_terms,
			   (size_t)(new_last - w->snap_index), sizeof(*w->terms));
		if (err)
			return err;
	}

	err = wal_batch_begin(w, size);
	if (err)
		return err;
	batch = w->next_batch;
	left = (uint32_t)(n + (hs ? 1 : 0));
	/* entries before the hard state: a commit index never lands on disk
	 * ahead of the entries it covers, even with reordered pages. */
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
	err = wal_batch_commit(w, size);
	if (err)
		return err;

	if (n > 0) {
		keep = (size_t)(ents[0].index - w->snap_index - 1);	/* drops a conflicting suffix */
		for (size_t i = 0; i < n; i++)
			w->terms[keep + i] = ents[i].term;
		w->n_terms = keep + n;
	}
	if (hs)
		w->hs = *hs;
	if (hs && hs->commit > w->witness)
		witness_write(w, hs->commit);
	return 0;
}

static int wal_append_marker(struct rps__wal *w, uint64_t index, uint64_t term)
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

/* ---- compaction ---------------------------------------------------------- */

static int snapref_cmp(const void *a, const void *b)
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
		seg_name(name, w->segs[0].seq, w->segs[0].base_index);
		if (unlinkat(w->dir_fd, name, 0) < 0 && errno != ENOENT) {
			err = -errno;
			return rps__seterr(err, "wal: removing %.150s/%s: %s (the snapshot is durable;"
					   " the next one retries)", w->dir, name, strerror(-err));
		}
		/* oldest first, each durable before the next: a crash never
		 * leaves a hole in the sequence of segments */
		err = do_sync(&w->opts, w->dir_fd, false);
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
		snap_name(name, w->snaps[0].index, w->snaps[0].term);
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
	log_matches = s->index <= last && wal_term_at(w, s->index) == s->term;
	if (!log_matches && w->hs.commit > s->index)
		return rps__seterr(-EINVAL, "wal: snapshot at %" PRIu64 " term %" PRIu64 " conflicts"
				   " with the log, which is committed up to %" PRIu64,
				   s->index, s->term, w->hs.commit);

	err = snap_write(w, s);
	if (err)
		return err;
	/* The file is durable; now the log learns about it. */
	err = wal_append_marker(w, s->index, s->term);
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
	err = grow((void **)&w->snaps, &w->cap_snaps, w->n_snaps + 1, sizeof(*w->snaps));
	if (err)
		return err;
	for (i = 0; i < w->n_snaps && w->snaps[i].index != s->index; i++)
		;
	w->snaps[i] = (struct wal_snapref){ s->index, s->term };
	if (i == w->n_snaps)
		w->n_snaps++;
	qsort(w->snaps, w->n_snaps, sizeof(*w->snaps), snapref_cmp);
	return wal_compact(w);
}

/* ---- open ----------------------------------------------------------------- */

struct dir_listing {
	struct wal_seg *segs;
	size_t n_segs, cap_segs;
	struct wal_snapref *snaps;
	size_t n_snaps, cap_snaps;
	char **tmps;
	size_t n_tmps, cap_tmps;
};

static void dir_listing_free(struct dir_listing *l)
{
	for (size_t i = 0; i < l->n_tmps; i++)
		free(l->tmps[i]);
	free(l->tmps);
	free(l->snaps);
	free(l->segs);
}

static int seg_cmp(const void *a, const void *b)
{
	const struct wal_seg *x = a, *y = b;

	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int list_dir(int dir_fd, const char *dir, struct dir_listing *l)
{
	struct dirent *de;
	DIR *d;
	int fd, err = 0;

	fd = dup(dir_fd);
	if (fd < 0 || !(d = fdopendir(fd))) {
		err = -errno;
		if (fd >= 0)
			close(fd);
		return rps__seterr(err, "wal: listing %.150s: %s", dir, strerror(-err));
	}
	while (!err && (errno = 0, de = readdir(d))) {
		uint64_t a, b;

		if (parse_name(de->d_name, "wal-", ".log", &a, &b)) {
			err = grow((void **)&l->segs, &l->cap_segs, l->n_segs + 1, sizeof(*l->segs));
			if (!err)
				l->segs[l->n_segs++] = (struct wal_seg){ a, b };
		} else if (parse_name(de->d_name, "snap-", ".snap", &a, &b)) {
			err = grow((void **)&l->snaps, &l->cap_snaps, l->n_snaps + 1, sizeof(*l->snaps));
			if (!err)
				l->snaps[l->n_snaps++] = (struct wal_snapref){ a, b };
		} else if (ends_with(de->d_name, ".tmp") &&
			   (!strncmp(de->d_name, "wal-", 4) || !strncmp(de->d_name, "snap-", 5))) {
			err = grow((void **)&l->tmps, &l->cap_tmps, l->n_tmps + 1, sizeof(*l->tmps));
			if (!err && !(l->tmps[l->n_tmps++] = strdup(de->d_name))) {
				l->n_tmps--;
				err = rps__seterr(-ENOMEM, "wal: out of memory");
			}
		}
	}
	if (!err && errno) {
		err = -errno;
		rps__seterr(err, "wal: listing %.150s: %s", dir, strerror(-err));
	}
	closedir(d);
	if (err)
		return err;
	if (l->n_segs)
		qsort(l->segs, l->n_segs, sizeof(*l->segs), seg_cmp);
	if (l->n_snaps)
		qsort(l->snaps, l->n_snaps, sizeof(*l->snaps), snapref_cmp);
	return 0;
}

static int replay_all(int dir_fd, const char *dir, const struct dir_listing *l, struct replay *r)
{
	char name[NAME_BUF];
	int err;

	for (size_t i = 0; i < l->n_segs; i++) {
		uint8_t *buf;
		size_t size;

		seg_name(name, l->segs[i].seq, l->segs[i].base_index);
		if (i > 0 && l->segs[i].seq != l->segs[i - 1].seq + 1)
			return rps__seterr(-EBADMSG, "wal: %.150s: log segment %" PRIu64 " is missing"
					   " (next is %s): " RESTORE_HINT, dir, l->segs[i - 1].seq + 1,
					   name, dir);
		err = grow((void **)&r->bufs, &r->cap_bufs, r->n_bufs + 1, sizeof(*r->bufs));
		if (err)
			return err;
		err = read_file(dir_fd, name, &buf, &size);
		if (err)
			return rps__seterr(err, "wal: reading %.150s/%s: %s", dir, name, strerror(-err));
		r->bufs[r->n_bufs++] = buf;
		err = replay_segment(r, name, l->segs[i].seq, l->segs[i].base_index, buf, size,
				     i == 0, i + 1 == l->n_segs);
		if (err)
			return err;
	}
	return 0;
}

static void replay_free(struct replay *r)
{
	for (size_t i = 0; i < r->n_bufs; i++)
		free(r->bufs[i]);
	free(r->bufs);
	free(r->markers);
	free(r->pend);
	free(r->ents);
}

/*
 * Pick the newest intact snapshot and cut the replayed log to what follows
 * it.  Damaged snapshots are passed over (they are the last *damaged of
 * l->snaps); the one chosen must fit the log, else open is refused.
 */
static int choose_snapshot(int dir_fd, const char *dir, const struct dir_listing *l,
			   struct replay *r, uint8_t **snap_buf, struct rps__wal_snapshot *snap,
			   bool *has_snap, bool *needs_marker, size_t *damaged, char *damage,
			   size_t damage_len)
{
	uint64_t last, t;
	char name[NAME_BUF];
	int err;

	for (size_t i = l->n_snaps; i-- > 0;) {
		snap_name(name, l->snaps[i].index, l->snaps[i].term);
		err = snap_load(dir_fd, dir, name, l->snaps[i].index, l->snaps[i].term, snap_buf, snap);
		if (err == -EBADMSG) {
			if (*damaged == 0)
				snprintf(damage, damage_len, "%s", rps__errbuf());
			(*damaged)++;
			continue;
		}
		if (err)
			return err;
		*has_snap = true;
		break;
	}
	last = replay_last(r);
	if (!*has_snap) {
		if (r->base == 0)
			return 0;
		if (*damaged)
			return rps__seterr(-EBADMSG, "%.200s; no older snapshot is usable and the log"
					   " starts after entry %" PRIu64 ": " RESTORE_HINT,
					   damage, r->base, dir);
		return rps__seterr(-EBADMSG, "wal: %.150s: the log starts after entry %" PRIu64
				   " but there is no snapshot: " RESTORE_HINT, dir, r->base, dir);
	}
	if (snap->index >= r->base && replay_term_at(r, snap->index, &t) && t == snap->term) {
		size_t drop = (size_t)(snap->index - r->base);

		if (drop) {
			memmove(r->ents, r->ents + drop, (r->n - drop) * sizeof(*r->ents));
			r->n -= drop;
		}
	} else if (snap->index >= r->base && !replay_has_marker(r, snap->index)) {
		/* The crash came between the snapshot's rename and its log
		 * marker: do what the marker would have done (open writes it). */
		r->n = 0;
	} else {
		snap_name(name, snap->index, snap->term);
		return rps__seterr(-EBADMSG, "wal: %.150s/%s (term %" PRIu64 ") does not fit the log,"
				   " which holds entries %" PRIu64 "..%" PRIu64 "%s: " RESTORE_HINT,
				   dir, name, snap->term, r->base + 1, last,
				   *damaged ? " (newer snapshots are damaged)" : "", dir);
	}
	*needs_marker = !replay_has_marker(r, snap->index);
	r->base = snap->index;
	r->base_term = snap->term;
	r->base_term_known = true;
	return 0;
}

/* A directory entry is durable only once its parent directory is synced. */
static int sync_parent(const char *dir, const struct rps__wal_opts *o)
{
	char *parent = strdup(dir), *slash;
	size_t n;
	int fd, err;

	if (!parent)
		return rps__seterr(-ENOMEM, "wal: out of memory");
	n = strlen(parent);
	while (n > 1 && parent[n - 1] == '/')
		parent[--n] = '\0';
	slash = strrchr(parent, '/');
	if (!slash)
		strcpy(parent, ".");
	else if (slash == parent)
		parent[1] = '\0';
	else
		*slash = '\0';
	fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		goto out;
	}
	err = do_sync(o, fd, false);
	close(fd);
out:
	if (err)
		rps__seterr(err, "wal: syncing %.150s: %s", parent, strerror(-err));
	free(parent);
	return err;
}

static void note_add(char *note, size_t size, const char *fmt, ...) RPS__PRINTF(3, 4);

static void note_add(char *note, size_t size, const char *fmt, ...)
{
	size_t used = strlen(note);
	va_list ap;

	if (used && used + 2 < size) {
		strcpy(note + used, "; ");
		used += 2;
	}
	va_start(ap, fmt);
	vsnprintf(note + used, size - used, fmt, ap);
	va_end(ap);
}

static int fill_recovered(struct rps__wal_recovered *rec, const struct replay *r)
{
	size_t total = 0, off = 0;
	uint8_t *arena;

	for (size_t i = 0; i < r->n; i++)
		total += r->ents[i].len;
	rec->ents = calloc(r->n ? r->n : 1, sizeof(*rec->ents));
	arena = malloc(total ? total : 1);
	if (!rec->ents || !arena) {
		free(arena);
		free(rec->ents);
		rec->ents = NULL;
		return rps__seterr(-ENOMEM, "wal: out of memory");
	}
	for (size_t i = 0; i < r->n; i++) {
		const struct replay_ent *e = &r->ents[i];

		memcpy(arena + off, e->data, e->len);
		rec->ents[i] = (struct rps__wal_entry){ e->term, e->index, e->type, arena + off, e->len };
		off += e->len;
	}
	rec->n_ents = r->n;
	rec->ent_data_ = arena;
	return 0;
}

int rps__wal_open(const char *dir, const struct rps__wal_opts *o,
		  struct rps__wal **out, struct rps__wal_recovered *rec)
{
	struct rps__wal *w;
	struct dir_listing l = { 0 };
	struct replay r = { 0 };
	struct rps__wal_snapshot snap = { 0 };
	uint8_t *snap_buf = NULL;
	bool has_snap = false, needs_marker = false, dir_changed = false;
	uint64_t tocommit;
	size_t damaged = 0;
	char name[NAME_BUF], damage[512] = "";
	int err;

	*out = NULL;
	if (rec)
		memset(rec, 0, sizeof(*rec));
	w = calloc(1, sizeof(*w));
	if (!w)
		return rps__seterr(-ENOMEM, "wal: out of memory");
	w->dir_fd = w->lock_fd = w->seg_fd = w->witness_fd = -1;
	if (o)
		w->opts = *o;
	if (!w->opts.segment_size)
		w->opts.segment_size = DEFAULT_SEGMENT_SIZE;
	if (!w->opts.keep_snapshots)
		w->opts.keep_snapshots = DEFAULT_KEEP_SNAPSHOTS;
	if ((w->opts.fsync != RPS__WAL_FSYNC_ALWAYS && w->opts.fsync != RPS__WAL_FSYNC_NONE) ||
	    w->opts.segment_size < MIN_SEGMENT_SIZE) {
		err = rps__seterr(-EINVAL, "wal: bad options (fsync policy %d, segment size %" PRIu64
				  ", at least %u)", (int)w->opts.fsync, w->opts.segment_size,
				  MIN_SEGMENT_SIZE);
		goto out_close;
	}
	w->dir = strdup(dir);
	if (!w->dir) {
		err = rps__seterr(-ENOMEM, "wal: out of memory");
		goto out_close;
	}

	if (mkdir(dir, 0700) == 0) {
		err = sync_parent(dir, &w->opts);
		if (err)
			goto out_close;
	} else if (errno != EEXIST) {
		err = -errno;
		rps__seterr(err, "wal: creating directory %.150s: %s", dir, strerror(-err));
		goto out_close;
	}
	w->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (w->dir_fd < 0) {
		err = -errno;
		rps__seterr(err, "wal: opening %.150s: %s", dir, strerror(-err));
		goto out_close;
	}
	w->lock_fd = openat(w->dir_fd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (w->lock_fd < 0 || flock(w->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		err = errno == EWOULDBLOCK ? -EBUSY : -errno;
		rps__seterr(err, "wal: locking %.150s/LOCK: %s%s", dir, strerror(-err),
			    err == -EBUSY ? ": another process has this node's log open" : "");
		goto out_close;
	}

	/* Read and check everything before changing anything: a refused
	 * open leaves the directory as it found it. */
	err = list_dir(w->dir_fd, dir, &l);
	if (err)
		goto out_close;
	if (l.n_segs == 0 && l.n_snaps > 0) {
		err = rps__seterr(-EBADMSG, "wal: %.150s: snapshots but no log segments (the hard"
				  " state is lost): " RESTORE_HINT, dir, dir);
		goto out_close;
	}
	r.dir = dir;
	err = replay_all(w->dir_fd, dir, &l, &r);
	if (err)
		goto out_replay;
	err = choose_snapshot(w->dir_fd, dir, &l, &r, &snap_buf, &snap, &has_snap,
			      &needs_marker, &damaged, damage, sizeof(damage));
	if (err)
		goto out_replay;
	/* A torn tail is only ever the last, unacknowledged save: a log that
	 * ends below an index known committed lost acknowledged entries. */
	tocommit = RPS__MAX(r.hs.commit, witness_read(w->dir_fd));
	if (tocommit > replay_last(&r)) {
		err = rps__seterr(-EBADMSG, "wal: %.150s: tocommit(%" PRIu64 ") is out of range [lastIndex(%"
				  PRIu64 ")]: was the raft log corrupted, truncated, or lost? Restore %.150s"
				  " from a backup or a replica, or remove it and rejoin the cluster",
				  dir, tocommit, replay_last(&r), dir);
		goto out_snap;
	}

	/* Accepted: repair. */
	if (l.n_segs > 0) {
		struct wal_seg *lastseg = &l.segs[l.n_segs - 1];

		seg_name(name, lastseg->seq, lastseg->base_index);
		w->seg_fd = openat(w->dir_fd, name, O_WRONLY | O_CLOEXEC);
		if (w->seg_fd < 0) {
			err = -errno;
			rps__seterr(err, "wal: opening %.150s/%s: %s", dir, name, strerror(-err));
			goto out_snap;
		}
		w->seg_end = r.keep_size;
		if (r.torn_bytes) {
			if (ftruncate(w->seg_fd, (off_t)r.keep_size) < 0)
				err = -errno;
			else
				err = do_sync(&w->opts, w->seg_fd, true);
			if (err) {
				rps__seterr(err, "wal: cutting the torn tail of %.150s/%s: %s",
					    dir, name, strerror(-err));
				goto out_snap;
			}
			if (rec) {
				rec->truncated_bytes = r.torn_bytes;
				rec->truncated_offset = r.keep_size;
				note_add(rec->note, sizeof(rec->note), "wal: %.100s/%s: dropped an"
					 " unfinished save (torn tail): %" PRIu64 " bytes at offset %"
					 PRIu64, dir, name, r.torn_bytes, r.keep_size);
			}
		}
	}
	/* Damaged snapshots are renamed out of the way (kept for a
	 * post-mortem): compaction must never count them as kept. */
	for (size_t i = l.n_snaps - damaged; i < l.n_snaps; i++) {
		char aside[NAME_BUF + 8];

		snap_name(name, l.snaps[i].index, l.snaps[i].term);
		snprintf(aside, sizeof(aside), "%s.damaged", name);
		if (renameat(w->dir_fd, name, w->dir_fd, aside) < 0) {
			err = -errno;
			rps__seterr(err, "wal: renaming %.150s/%s: %s", dir, name, strerror(-err));
			goto out_snap;
		}
		dir_changed = true;
	}
	if (damaged && rec) {
		rec->skipped_snapshots = (unsigned)damaged;
		note_add(rec->note, sizeof(rec->note), "%.120s (renamed to .damaged); recovered %s",
			 damage, has_snap ? "from an older snapshot" : "from the log alone");
	}
	for (size_t i = 0; i < l.n_tmps; i++) {
		if (unlinkat(w->dir_fd, l.tmps[i], 0) == 0)
			dir_changed = true;
	}
	if (dir_changed) {
		err = do_sync(&w->opts, w->dir_fd, false);
		if (err) {
			rps__seterr(err, "wal: syncing directory %.150s: %s", dir, strerror(-err));
			goto out_snap;
		}
	}

	/* The runtime state continues where replay ended. */
	w->segs = l.segs;
	w->n_segs = l.n_segs;
	w->cap_segs = l.cap_segs;
	l.segs = NULL;
	w->snaps = l.snaps;
	w->n_snaps = l.n_snaps - damaged;
	w->cap_snaps = l.cap_snaps;
	l.snaps = NULL;
	w->hs = r.hs;
	w->next_batch = l.n_segs ? r.next_batch : 1;
	w->snap_index = r.base;
	w->snap_term = r.base_term_known ? r.base_term : 0;
	err = grow((void **)&w->terms, &w->cap_terms, r.n, sizeof(*w->terms));
	if (err)
		goto out_snap;
	for (size_t i = 0; i < r.n; i++)
		w->terms[i] = r.ents[i].term;
	w->n_terms = r.n;
	if (w->n_segs == 0)
		err = wal_roll(w);	/* a fresh node */
	else if (w->seg_end < SEG_OPENING_SIZE)
		err = rps__wal_save(w, &w->hs, NULL, 0);	/* the opening hard state was torn */
	if (!err && needs_marker)
		err = wal_append_marker(w, snap.index, snap.term);	/* finish save_snapshot */
	if (err)
		goto out_snap;
	w->witness_fd = openat(w->dir_fd, WITNESS_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (w->witness_fd < 0) {
		err = -errno;
		rps__seterr(err, "wal: opening %.150s/" WITNESS_NAME ": %s", dir, strerror(-err));
		goto out_snap;
	}
	witness_write(w, tocommit);	/* a directory from before the witness gets one */

	if (rec) {
		err = fill_recovered(rec, &r);
		if (err)
			goto out_snap;
		rec->hs = r.hs;
		rec->has_snapshot = has_snap;
		if (has_snap) {
			rec->snapshot = snap;
			rec->snap_data_ = snap_buf;
			snap_buf = NULL;
		}
	}
	free(snap_buf);
	replay_free(&r);
	dir_listing_free(&l);
	*out = w;
	return 0;

out_snap:
	free(snap_buf);
out_replay:
	replay_free(&r);
out_close:
	dir_listing_free(&l);
	rps__wal_close(w);
	if (rec)
		memset(rec, 0, sizeof(*rec));
	return err;
}

void rps__wal_close(struct rps__wal *w)
{
	if (!w)
		return;
	if (w->seg_fd >= 0)
		close(w->seg_fd);
	if (w->witness_fd >= 0)
		close(w->witness_fd);
	if (w->lock_fd >= 0)
		close(w->lock_fd);	/* drops the flock */
	if (w->dir_fd >= 0)
		close(w->dir_fd);
	free(w->buf);
	free(w->snaps);
	free(w->terms);
	free(w->segs);
	free(w->dir);
	free(w);
}

void rps__wal_recovered_free(struct rps__wal_recovered *rec)
{
	if (!rec)
		return;
	free(rec->ents);
	free(rec->ent_data_);
	free(rec->snap_data_);
	memset(rec, 0, sizeof(*rec));
}
