/*
 * ckpt.h - checkpoint files: what a server writes of the shards it owns at a
 * consistent cut, and what a (maybe differently sized) cluster reads back.
 *
 * One file per server per checkpoint, PATH/member-<id>.rpsck (mode 0600),
 * written to a temporary name, fsync'ed, renamed.  Format (little-endian; version 1;
 * documented in rdmaps-checkpoint(5)):
 *   file header   magic "RPSCKPT1", version, member id, npart, shard elems,
 *                 checkpoint id, wall time, crc32c of the header
 *   records       one per tensor (name, spec) followed by its shards
 *                 (index, version, min_clock, flags, elems, the bounded
 *                 clocks, the parameters and the optimizer state, fp32),
 *                 each record: type, raw length, stored length, crc32c of
 *                 the raw bytes, then the bytes, deflated with ISA-L igzip
 *                 when that is smaller (flag), stored otherwise
 *   trailer       record count, total raw bytes, crc32c of every record crc
 * A reader refuses with a clear message (-EBADMSG / -EILSEQ, naming the
 * file and offset) a truncated file, a flipped bit anywhere, a record out
 * of place, or a version it does not know.
 */
#ifndef RPS_CKPT_H
#define RPS_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define RPS__CKPT_VERSION 1u

struct rps__ckpt_header {
	uint64_t member_id;	/* who wrote it */
	uint32_t npart;		/* the cluster's partitions then (informational) */
	uint32_t shard_elems;	/* shard size: a restore needs the same */
	uint64_t ckpt_id;	/* the same in every file of one checkpoint */
	uint64_t time_ns;	/* CLOCK_REALTIME when the cut was taken */
};

/* One shard of a tensor as of the cut. */
struct rps__ckpt_shard {
	uint32_t index;		/* global shard index */
	uint32_t elems;
	uint64_t version;	/* updates applied (the shard's step) */
	uint64_t min_clock;	/* bounded mode */
	uint32_t flags;		/* RPS__CKPT_SHARD_* */
	uint32_t nclocks;	/* bounded: num_workers, else 0 */
	const uint64_t *clocks;
	const float *params;	/* elems */
	uint32_t nstate;	/* optimizer state floats (0, elems or 2 x elems) */
	const float *state;
};

#define RPS__CKPT_SHARD_READY 1u	/* initial values were in place */

/*
 * Where checkpoints go.  A server writes and reads only under the directory
 * its operator gave (rdmapsd --checkpoint-dir); a request from the network
 * names a checkpoint in it (psctl checkpoint NAME), never a path.
 */
#define RPS__CKPT_NAME_MAX 128u

/* Open the operator's directory dir (a descriptor, O_CLOEXEC), making dir
 * itself (0700) if it is missing but never its parents.  -errno with a
 * message naming dir. */
int rps__ckpt_dir_open(const char *dir);
/* Is name a checkpoint name: 1..RPS__CKPT_NAME_MAX characters of A-Z a-z
 * 0-9 . _ -, components separated by single '/', none of them empty, "."
 * or "..", no leading '/'.  0, or -EINVAL with a one-line reason. */
int rps__ckpt_name_check(const char *name);
/* The directory name (checked as above) under base_fd, opened one
 * component at a time without following a symbolic link (-ELOOP names
 * it); make: missing components are made, 0700.  A descriptor, or -errno
 * with a one-line reason. */
int rps__ckpt_name_open(int base_fd, const char *name, bool make);

struct rps__ckpt_writer;

/* Start PATH/member-<id>.rpsck (PATH created, 0700, if absent; its parent
 * must exist) as 0600.  level: igzip compression level 0..3 (0: store
 * only).  Errors: -errno from the file system, with a message naming the
 * path. */
int rps__ckpt_create(const char *dir, const struct rps__ckpt_header *h, int level,
		     struct rps__ckpt_writer **out);
/* The same in the directory dir_fd (not closed: the writer keeps a
 * duplicate); label: how messages name the directory. */
int rps__ckpt_create_at(int dir_fd, const char *label, const struct rps__ckpt_header *h, int level,
			struct rps__ckpt_writer **out);
/* A tensor; its shards follow (any number, any order). */
int rps__ckpt_put_tensor(struct rps__ckpt_writer *w, const char *name, const struct rps__tensor_spec *spec);
int rps__ckpt_put_shard(struct rps__ckpt_writer *w, const struct rps__ckpt_shard *s);
/* Trailer, fsync, rename into place, fsync the directory.  Frees w. */
int rps__ckpt_finish(struct rps__ckpt_writer *w, uint64_t *bytes_written);
/* Give up: remove the temporary file.  Frees w (NULL is fine). */
void rps__ckpt_abort(struct rps__ckpt_writer *w);

struct rps__ckpt_reader;

enum rps__ckpt_item_type { RPS__CKPT_TENSOR = 1, RPS__CKPT_SHARD = 2 };

struct rps__ckpt_item {
	enum rps__ckpt_item_type type;
	/* RPS__CKPT_TENSOR */
	char name[RPS__NAME_MAX];
	struct rps__tensor_spec spec;
	/* RPS__CKPT_SHARD (pointers valid until the next call) */
	struct rps__ckpt_shard shard;
};

/* Open one file and check its header. */
int rps__ckpt_open(const char *file, struct rps__ckpt_reader **out, struct rps__ckpt_header *h);
/* The same for the file name in dir_fd, refused if it is a symbolic link;
 * label: how messages name the file. */
int rps__ckpt_open_at(int dir_fd, const char *name, const char *label, struct rps__ckpt_reader **out,
		      struct rps__ckpt_header *h);
/* 1 and the next item, 0 at a valid end (trailer checked), < 0 refused. */
int rps__ckpt_next(struct rps__ckpt_reader *r, struct rps__ckpt_item *it);
void rps__ckpt_close(struct rps__ckpt_reader *r);

/* The files of a checkpoint directory (member-*.rpsck), sorted; *files is
 * malloc'ed, free with rps__ckpt_free_list.  -ENOENT if none. */
int rps__ckpt_list(const char *dir, char ***files, size_t *n);
/* The same in dir_fd, as file names (for rps__ckpt_open_at); symbolic
 * links are not listed.  label: how messages name the directory. */
int rps__ckpt_list_at(int dir_fd, const char *label, char ***names, size_t *n);
void rps__ckpt_free_list(char **files, size_t n);

#endif
