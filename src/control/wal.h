/*
 * wal.h - durable storage for a Raft node: a write-ahead log of entries and
 * hard state, plus snapshot files, all in one directory.
 *
 * The Raft core is free of I/O; its driver hands every Ready to
 * rps__wal_save() (entries + hard state, durable on return) before sending
 * the messages that depend on them (with fsync always, a hard state whose
 * commit index alone moved waits for the next save: raft_node.c), and hands
 * snapshots to rps__wal_save_snapshot().  On restart rps__wal_open() gives
 * back what was durable: the newest usable snapshot, the hard state and the
 * entries after the snapshot, in order.
 *
 * Directory contents (format details at the top of wal.c):
 *   LOCK                                   flock()ed while a process has it open
 *   COMMIT                                 the last durable commit index, a
 *                                          witness that outlives a cut-short log
 *   wal-<seq>-<base index>.log             log segments, 16 hex digits each
 *   snap-<index>-<term>.snap               snapshots, 16 hex digits each
 *   *.tmp                                  unfinished files, removed by open
 *   snap-*.snap.damaged                    damaged snapshots open passed over
 *
 * Hard state lives in the log, as records: one fdatasync makes a save's
 * entries and its hard state durable together, and every segment starts with
 * a copy of the hard state so deleting old segments never loses the vote.
 *
 * Every save is one batch of records written with one write; after a crash a
 * batch is either entirely there or entirely dropped (a torn tail).  A damaged
 * record that is NOT part of the last batch cannot come from a crash: open
 * refuses it with -EBADMSG and a message naming the file and offset.
 *
 * Conflict truncation is logical: entries whose index is <= the last stored
 * index are appended and, on replay, replace the old suffix from that index.
 * Nothing already durable is rewritten in place; the superseded records go
 * away with compaction.
 *
 * Not thread-safe: one thread (the Raft driver) owns a struct rps__wal.
 * Every function returns 0 or a negative errno and, on failure, leaves a
 * one-line message in rps__errbuf().
 */
#ifndef RPS_WAL_H
#define RPS_WAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum rps__wal_fsync {
	/* default: a save is on stable storage when rps__wal_save() returns */
	RPS__WAL_FSYNC_ALWAYS = 0,
	/* never sync (benchmarks, tests): a power failure may lose anything,
	 * and may even leave a log that open refuses */
	RPS__WAL_FSYNC_NONE = 1,
};

/* Entry types are the Raft core's business; the log stores the byte. */
struct rps__wal_entry {
	uint64_t term;
	uint64_t index;
	uint8_t type;
	const void *data;
	size_t len;
};

struct rps__wal_hard_state {
	uint64_t term;
	uint64_t vote;		/* node id voted for in term, 0 = none */
	uint64_t commit;
};

struct rps__wal_snapshot {
	uint64_t index;		/* last entry the snapshot covers */
	uint64_t term;		/* term of that entry */
	const uint64_t *voters;	/* membership configuration at index */
	size_t n_voters;
	const uint64_t *learners;
	size_t n_learners;
	const void *data;	/* application state (the shard map) */
	size_t len;
};

struct rps__wal_opts {
	enum rps__wal_fsync fsync;	/* 0 = RPS__WAL_FSYNC_ALWAYS */
	/* Roll over to a new segment once a segment would grow past this.
	 * 0 = 64 MiB.  A single save larger than this gets a segment alone. */
	uint64_t segment_size;
	/* Snapshots kept on disk, newest first (0 = 2).  The log is kept from
	 * the oldest kept snapshot on, so with 2 a damaged newest snapshot
	 * falls back to the previous one; with 1 it is refused. */
	unsigned keep_snapshots;
	/* Test hook: called instead of fdatasync(fd) (data_only) or fsync(fd)
	 * for every sync the policy asks for; return 0 or a negative errno. */
	int (*sync_fn)(int fd, bool data_only, void *ctx);
	void *sync_ctx;
};

/* What open found.  Owns the memory behind every pointer in it. */
struct rps__wal_recovered {
	struct rps__wal_hard_state hs;	/* zeros on a fresh node */
	bool has_snapshot;
	struct rps__wal_snapshot snapshot;
	struct rps__wal_entry *ents;	/* snapshot.index + 1 ... , in order */
	size_t n_ents;
	/* Torn tail: bytes cut off the end of the last segment (an
	 * unfinished save), and where.  0 when the log ended cleanly. */
	uint64_t truncated_bytes;
	uint64_t truncated_offset;
	/* Newer snapshots passed over because they were damaged. */
	unsigned skipped_snapshots;
	/* One human-readable line for the operator's log when something was
	 * repaired or skipped, else "". */
	char note[320];
	/* private */
	void *ent_data_;
	void *snap_data_;
};

struct rps__wal;

/*
 * Open (creating dir if absent) and recover.  o may be NULL for defaults.
 * On success *out is the log, ready for appends after the recovered state,
 * and *rec is filled (free it with rps__wal_recovered_free()).  rec may be
 * NULL if the caller only wants to append.
 * Repairs open makes, all reported in rec: a torn tail is cut off the last
 * segment; damaged snapshots are renamed *.damaged and an older one (or the
 * log alone, if it reaches back to index 1) is used; a snapshot whose log
 * marker a crash prevented gets its marker.  Nothing is changed when open
 * refuses.
 * Errors: -EBADMSG damaged log or snapshot that is not a torn tail (message:
 * file, offset, "restore this node from a peer: remove DIR and rejoin"), or a
 * log that ends below an index known committed (truncated or lost: message
 * "tocommit(N) is out of range [lastIndex(M)]: was the raft log corrupted,
 * truncated, or lost?" and what to do),
 * -EBUSY another process has dir open, -errno from the file system.
 */
int rps__wal_open(const char *dir, const struct rps__wal_opts *o,
		  struct rps__wal **out, struct rps__wal_recovered *rec);

/*
 * Append entries and/or a hard state (hs may be NULL, n may be 0) as one
 * batch.  ents must be consecutive; if ents[0].index <= the last stored
 * index, the stored entries from ents[0].index on are replaced.  Refused with
 * -EINVAL: an index gap, an index covered by the snapshot, terms going
 * down, a hard state whose term goes down or whose commit is past the last
 * index.  With RPS__WAL_FSYNC_ALWAYS the batch is durable on return (one
 * fdatasync; a segment rollover adds the new file's syncs).
 * After a failed write or sync the log is unusable (-EIO from then on):
 * after a failed fsync the kernel may have dropped the unsynced pages, so
 * only a restart, which rereads the disk, knows what survived.
 */
int rps__wal_save(struct rps__wal *w, const struct rps__wal_hard_state *hs,
		  const struct rps__wal_entry *ents, size_t n);

/*
 * Write a snapshot (temp file, sync, rename, sync dir), record it in the log,
 * then drop what it makes unnecessary: snapshots beyond keep_snapshots and
 * log segments wholly before the oldest kept snapshot.  If the log holds
 * s->index with s->term its later entries stay (a local snapshot); otherwise
 * the log is emptied and the next entry must be s->index + 1 (a snapshot
 * installed from the leader).  s->index must be above the previous snapshot.
 * An error while removing old files comes after the snapshot is durable and
 * recorded (the message says so); the next snapshot retries the removal.
 */
int rps__wal_save_snapshot(struct rps__wal *w, const struct rps__wal_snapshot *s);

/* Last stored index and its term (snapshot index/term when the log is empty). */
uint64_t rps__wal_last_index(const struct rps__wal *w);
uint64_t rps__wal_last_term(const struct rps__wal *w);

/* Close (no sync: every save already synced per policy).  NULL is fine. */
void rps__wal_close(struct rps__wal *w);

void rps__wal_recovered_free(struct rps__wal_recovered *rec);

#endif
