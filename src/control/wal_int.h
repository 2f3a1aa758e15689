/*
 * wal_int.h - what the pieces of the Raft log on disk share (private to
 * src/control/wal*.c; the API is wal.h, the format is at the top of wal.c).
 */
#ifndef RPS_WAL_INT_H
#define RPS_WAL_INT_H

#include "control/wal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
	int witness_fd;		/* COMMIT, see the top of wal.c */
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

struct rec_view {
	uint8_t kind;
	uint32_t len;
	uint32_t left;
	uint64_t batch;
	const uint8_t *payload;
	size_t size;		/* header + padded payload */
};

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

/* wal.c: helpers, records, segments and batches */
int rps__wal_grow(void **arr, size_t *cap, size_t need, size_t elem);
void rps__wal_seg_name(char *out, uint64_t seq, uint64_t base);
void rps__wal_snap_name(char *out, uint64_t index, uint64_t term);
int rps__wal_do_sync(const struct rps__wal_opts *o, int fd, bool data_only);
int rps__wal_publish(struct rps__wal *w, int fd, const char *tmp, const char *name);
uint64_t rps__wal_witness_read(int dir_fd);
void rps__wal_witness_write(struct rps__wal *w, uint64_t commit);
int rps__wal_read_file(int dir_fd, const char *name, uint8_t **out, size_t *size);
const char *rps__wal_rec_parse(const uint8_t *buf, size_t size, size_t off, struct rec_view *v);
uint64_t rps__wal_term_at(const struct rps__wal *w, uint64_t index);
int rps__wal_roll(struct rps__wal *w);
int rps__wal_append_marker(struct rps__wal *w, uint64_t index, uint64_t term);

/* wal_replay.c: replaying segments */
uint64_t rps__wal_replay_last(const struct replay *r);
bool rps__wal_replay_term_at(const struct replay *r, uint64_t index, uint64_t *term);
bool rps__wal_replay_has_marker(const struct replay *r, uint64_t index);
int rps__wal_replay_segment(struct replay *r, const char *name, uint64_t name_seq,
			    uint64_t name_base, const uint8_t *buf, size_t size,
			    bool first, bool last);

/* wal_snap.c: snapshot files and compaction */
int rps__wal_snap_load(int dir_fd, const char *dir, const char *name, uint64_t index,
		       uint64_t term, uint8_t **bufp, struct rps__wal_snapshot *s);
int rps__wal_snapref_cmp(const void *a, const void *b);

#endif
