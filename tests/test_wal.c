/*
 * test_wal.c - unit tests of the Raft log on disk (src/control/wal.c): round trips,
 * conflict truncation, rollover, compaction, and crash simulation done by
 * editing the files the way a crash or a bad disk would: every prefix of the
 * last write, a bit flip in every record, zero-filled tails, damaged
 * snapshots.  Syncs go through a counting hook (no real fsync), so the suite
 * stays fast; the hook also injects sync failures.
 *
 * The tests read the files with their own walker of the format documented at
 * the top of wal.c, so a change of format has to change both.
 */
#include "config.h"
#include "control/wal.h"
#include "common/common.h"
#include "lib/cutest.h"
#include "common/fsutil.h"
#include "lib/tmpdir.h"

#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEG_HDR 64u
#define REC_HDR 24u
#define MAXIDX 20000u
#define MAXFILES 256

static char dir[256];
static uint64_t model_term[MAXIDX + 2];	/* term of each stored index */

/* ---- fixtures ------------------------------------------------------------ */

struct sync_count {
	unsigned data, full;	/* fdatasync-like, fsync-like calls */
	unsigned fail_after;	/* fail the call after this many (0 = never) */
};

static struct sync_count syncs;

static int count_sync(int fd, bool data_only, void *ctx)
{
	struct sync_count *c = ctx;

	if (c->fail_after && c->data + c->full + 1 >= c->fail_after)
		return -EIO;
	if (data_only)
		c->data++;
	else
		c->full++;
	return 0;
}

static struct rps__wal_opts opts(uint64_t segment_size, unsigned keep)
{
	struct rps__wal_opts o = { 0 };

	o.fsync = RPS__WAL_FSYNC_ALWAYS;
	o.segment_size = segment_size;
	o.keep_snapshots = keep;
	o.sync_fn = count_sync;
	o.sync_ctx = &syncs;
	return o;
}

/* A fresh, not yet existing directory: open must create it. */
static void setup(void)
{
	char base[200];

	test_mkdtemp(base, sizeof(base), "test_wal");
	snprintf(dir, sizeof(dir), "%s/node", base);
	memset(&syncs, 0, sizeof(syncs));
	memset(model_term, 0, sizeof(model_term));
}

static void teardown(void)
{
	char *slash;

	rps__remove_tree(dir);
	slash = strrchr(dir, '/');
	*slash = '\0';
	rmdir(dir);
}

/* ---- entries and the model ----------------------------------------------- */

static size_t ent_len(uint64_t index, uint64_t term)
{
	return (size_t)((index * 37 + term * 11) % 160);	/* includes 0 */
}

static void ent_bytes(uint8_t *out, uint64_t index, uint64_t term, size_t len)
{
	for (size_t k = 0; k < len; k++)
		out[k] = (uint8_t)(index * 131 + term * 7 + k);
}

/* Save entries first..last with term as one batch (plus hs if given). */
static int save_range(struct rps__wal *w, uint64_t first, uint64_t last, uint64_t term,
		      const struct rps__wal_hard_state *hs)
{
	static uint8_t data[MAXIDX][160];
	static struct rps__wal_entry ents[MAXIDX];
	size_t n = 0;
	int rc;

	for (uint64_t i = first; i <= last; i++, n++) {
		size_t len = ent_len(i, term);

		ent_bytes(data[n], i, term, len);
		ents[n] = (struct rps__wal_entry){ term, i, (uint8_t)(i & 3), data[n], len };
	}
	rc = rps__wal_save(w, hs, ents, n);
	if (rc == 0)
		for (uint64_t i = first; i <= last; i++)
			model_term[i] = term;
	return rc;
}

static void check_entries(const struct rps__wal_recovered *rec, uint64_t first, uint64_t last)
{
	uint8_t expect[160];

	CU_ASSERT_EQUAL_FATAL(rec->n_ents, last >= first ? last - first + 1 : 0);
	for (size_t k = 0; k < rec->n_ents; k++) {
		const struct rps__wal_entry *e = &rec->ents[k];
		uint64_t i = first + k, t = model_term[i];
		size_t len = ent_len(i, t);

		ent_bytes(expect, i, t, len);
		CU_ASSERT_EQUAL(e->index, i);
		CU_ASSERT_EQUAL(e->term, t);
		CU_ASSERT_EQUAL(e->type, i & 3);
		CU_ASSERT_EQUAL_FATAL(e->len, len);
		CU_ASSERT_EQUAL(memcmp(e->data, expect, len), 0);
	}
}

static bool hs_equal(const struct rps__wal_hard_state *a, const struct rps__wal_hard_state *b)
{
	return a->term == b->term && a->vote == b->vote && a->commit == b->commit;
}

/* ---- files ------------------------------------------------------------------- */

static int name_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* Names in dir starting with prefix, sorted (= by seq / index). */
static size_t list(const char *prefix, char names[][64])
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)) && n < MAXFILES)
		if (!strncmp(de->d_name, prefix, strlen(prefix)))
			snprintf(names[n++], 64, "%.63s", de->d_name);
	closedir(d);
	qsort(names, n, 64, name_cmp);
	return n;
}

static char *path_of(const char *name)
{
	static char p[400];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return p;
}

static uint8_t *slurp(const char *name, size_t *len)
{
	struct stat st;
	uint8_t *buf;
	int fd = open(path_of(name), O_RDONLY);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(fstat(fd, &st) == 0);
	buf = malloc((size_t)st.st_size + 1);
	CU_ASSERT_FATAL(buf != NULL);
	CU_ASSERT_FATAL(read(fd, buf, (size_t)st.st_size) == st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return buf;
}

static void spit(const char *name, const void *buf, size_t len)
{
	int fd = open(path_of(name), O_WRONLY | O_CREAT | O_TRUNC, 0600);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(write(fd, buf, len) == (ssize_t)len);
	close(fd);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32(p + 4, (uint32_t)(v >> 32));
}

/* Record offsets and sizes in a segment image, by the documented format. */
static size_t walk(const uint8_t *buf, size_t size, size_t *offs, size_t *sizes, size_t max)
{
	size_t n = 0;

	for (size_t off = SEG_HDR; off + REC_HDR <= size && n < max;) {
		size_t sz = REC_HDR + ((le32(buf + off + 4) + 7u) & ~7u);

		if (off + sz > size)
			break;
		offs[n] = off;
		sizes[n++] = sz;
		off += sz;
	}
	return n;
}

/* A sealed record, built independently of wal.c: crc32c over bytes 4..end. */
static size_t craft(uint8_t *out, uint8_t kind, const void *payload, uint32_t len,
		    uint64_t batch, uint32_t left)
{
	size_t sz = REC_HDR + ((len + 7u) & ~7u);

	memset(out, 0, sz);
	put_le32(out + 4, len);
	out[8] = kind;
	put_le32(out + 12, left);
	put_le64(out + 16, batch);
	memcpy(out + REC_HDR, payload, len);
	put_le32(out, ~crc32_iscsi(out + 4, (int)(sz - 4), 0xffffffffu));
	return sz;
}

/* ---- round trips ----------------------------------------------------------- */

static void test_fresh_and_roundtrip(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	struct rps__wal_hard_state hs = { 3, 2, 15 };
	static const uint64_t voters[] = { 1, 2, 0xffffffffffffff03ull }, learners[] = { 7 };
	uint8_t appdata[1000];
	struct rps__wal_snapshot snap = { 10, 2, voters, 3, learners, 1, appdata, sizeof(appdata) };
	struct rps__wal *w;

	for (size_t k = 0; k < sizeof(appdata); k++)
		appdata[k] = (uint8_t)(k * 13 + 1);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.n_ents, 0);
	CU_ASSERT_FALSE(rec.has_snapshot);
	CU_ASSERT_EQUAL(rec.hs.term, 0);
	CU_ASSERT_EQUAL(rec.truncated_bytes, 0);
	CU_ASSERT_STRING_EQUAL(rec.note, "");
	rps__wal_recovered_free(&rec);

	CU_ASSERT_EQUAL(save_range(w, 1, 5, 1, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 6, 6, 1, &(struct rps__wal_hard_state){ 1, 1, 4 }), 0);
	CU_ASSERT_EQUAL(save_range(w, 7, 20, 2, &(struct rps__wal_hard_state){ 2, 0, 12 }), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &snap), 0);
	CU_ASSERT_EQUAL(save_range(w, 21, 25, 3, &hs), 0);
	CU_ASSERT_EQUAL(rps__wal_last_index(w), 25);
	CU_ASSERT_EQUAL(rps__wal_last_term(w), 3);
	rps__wal_close(w);

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_TRUE(hs_equal(&rec.hs, &hs));
	CU_ASSERT_TRUE_FATAL(rec.has_snapshot);
	CU_ASSERT_EQUAL(rec.snapshot.index, 10);
	CU_ASSERT_EQUAL(rec.snapshot.term, 2);
	CU_ASSERT_EQUAL_FATAL(rec.snapshot.n_voters, 3);
	CU_ASSERT_EQUAL_FATAL(rec.snapshot.n_learners, 1);
	CU_ASSERT_EQUAL(memcmp(rec.snapshot.voters, voters, sizeof(voters)), 0);
	CU_ASSERT_EQUAL(rec.snapshot.learners[0], 7);
	CU_ASSERT_EQUAL_FATAL(rec.snapshot.len, sizeof(appdata));
	CU_ASSERT_EQUAL(memcmp(rec.snapshot.data, appdata, sizeof(appdata)), 0);
	check_entries(&rec, 11, 25);
	CU_ASSERT_EQUAL(rec.truncated_bytes, 0);
	CU_ASSERT_EQUAL(rec.skipped_snapshots, 0);
	CU_ASSERT_EQUAL(rps__wal_last_index(w), 25);
	rps__wal_recovered_free(&rec);
	/* appends continue where the log ended */
	CU_ASSERT_EQUAL(save_range(w, 26, 26, 3, NULL), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 11, 26);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

static void test_conflict_truncation(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 10, 1, &(struct rps__wal_hard_state){ 1, 2, 3 }), 0);
	/* a new leader overwrites 6.. with a shorter suffix */
	CU_ASSERT_EQUAL(save_range(w, 6, 8, 2, &(struct rps__wal_hard_state){ 2, 3, 5 }), 0);
	CU_ASSERT_EQUAL(rps__wal_last_index(w), 8);
	CU_ASSERT_EQUAL(rps__wal_last_term(w), 2);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 8);
	CU_ASSERT_EQUAL(rec.ents[4].term, 1);
	CU_ASSERT_EQUAL(rec.ents[5].term, 2);
	CU_ASSERT_EQUAL(rec.hs.term, 2);
	CU_ASSERT_EQUAL(rec.hs.commit, 5);
	rps__wal_recovered_free(&rec);

	/* and again, replacing just the last entry */
	CU_ASSERT_EQUAL(save_range(w, 8, 9, 4, NULL), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 9);
	CU_ASSERT_EQUAL(rec.ents[7].term, 4);
	rps__wal_recovered_free(&rec);

	/* what Raft never asks for is refused, and changes nothing */
	CU_ASSERT_EQUAL(save_range(w, 11, 11, 4, NULL), -EINVAL);	/* gap */
	CU_ASSERT_EQUAL(save_range(w, 10, 10, 3, NULL), -EINVAL);	/* term down */
	CU_ASSERT_EQUAL(save_range(w, 0, 0, 4, NULL), -EINVAL);		/* index 0 */
	CU_ASSERT_EQUAL(rps__wal_save(w, &(struct rps__wal_hard_state){ 1, 0, 0 }, NULL, 0), -EINVAL);
	CU_ASSERT_EQUAL(rps__wal_save(w, &(struct rps__wal_hard_state){ 4, 0, 10 }, NULL, 0), -EINVAL);
	{
		struct rps__wal_entry two[2] = { { 4, 10, 0, NULL, 0 }, { 4, 12, 0, NULL, 0 } };

		CU_ASSERT_EQUAL(rps__wal_save(w, NULL, two, 2), -EINVAL);
	}
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 5, .term = 1 }), 0);
	CU_ASSERT_EQUAL(save_range(w, 5, 5, 4, NULL), -EINVAL);	/* covered by the snapshot */
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 5, .term = 1 }), -EINVAL);
	CU_ASSERT_EQUAL(rps__wal_last_index(w), 9);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 5);
	check_entries(&rec, 6, 9);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

static void test_rollover_and_many_records(void)
{
	struct rps__wal_opts o = opts(4096, 0);
	struct rps__wal_recovered rec;
	static char names[MAXFILES][64];
	struct rps__wal *w;
	uint64_t i;
	size_t n;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (i = 1; i <= 3000; i += 3)
		CU_ASSERT_EQUAL_FATAL(save_range(w, i, i + 2, 1 + i / 1000,
						 &(struct rps__wal_hard_state){ 1 + i / 1000, 1, i }), 0);
	/* one save bigger than a segment gets a segment to itself */
	CU_ASSERT_EQUAL(save_range(w, 3001, 3100, 5, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 3101, 3101, 5, NULL), 0);
	rps__wal_close(w);
	n = list("wal-", names);
	CU_ASSERT(n > 50);
	for (size_t k = 0; k < n; k++) {
		uint64_t seq = strtoull(names[k] + 4, NULL, 16);

		CU_ASSERT_EQUAL(seq, k + 1);	/* consecutive, none missing */
	}
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 3101);
	CU_ASSERT_EQUAL(rec.hs.commit, 2998);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

static void test_compaction(void)
{
	struct rps__wal_opts o = opts(2048, 1);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64], snaps[MAXFILES][64];
	struct rps__wal_snapshot s = { .index = 250, .term = 1, .voters = (uint64_t[]){ 1 }, .n_voters = 1 };
	struct rps__wal *w;
	size_t before, after;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 300; i++)
		CU_ASSERT_EQUAL_FATAL(save_range(w, i, i, 1, NULL), 0);
	before = list("wal-", segs);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 100, .term = 1 }), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &s), 0);
	after = list("wal-", segs);
	CU_ASSERT(after < before / 4);
	/* what is left starts at or before the snapshot, and only one snapshot */
	CU_ASSERT(strtoull(segs[0] + 4 + 17, NULL, 16) <= 250);
	CU_ASSERT(after < 2 || strtoull(segs[1] + 4 + 17, NULL, 16) > 250);
	CU_ASSERT_EQUAL(list("snap-", snaps), 1);
	CU_ASSERT_STRING_EQUAL(snaps[0], "snap-00000000000000fa-0000000000000001.snap");
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 250);
	check_entries(&rec, 251, 300);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);

	/* keep 2: the previous snapshot and the log from it stay */
	o.keep_snapshots = 2;
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 301; i <= 600; i++)
		CU_ASSERT_EQUAL_FATAL(save_range(w, i, i, 2, NULL), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 400, .term = 2 }), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 550, .term = 2 }), 0);
	CU_ASSERT_EQUAL(list("snap-", snaps), 2);
	CU_ASSERT_STRING_EQUAL(snaps[0], "snap-0000000000000190-0000000000000002.snap");
	list("wal-", segs);
	CU_ASSERT(strtoull(segs[0] + 4 + 17, NULL, 16) <= 400);
	CU_ASSERT(strtoull(segs[1] + 4 + 17, NULL, 16) > 400);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 550);
	check_entries(&rec, 551, 600);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

/* A snapshot from the leader that the log does not contain empties the log. */
static void test_installed_snapshot(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 10, 1, &(struct rps__wal_hard_state){ 1, 0, 4 }), 0);
	/* conflicting, and past our commit? refused */
	CU_ASSERT_EQUAL(rps__wal_save(w, &(struct rps__wal_hard_state){ 1, 0, 8 }, NULL, 0), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 7, .term = 3 }), -EINVAL);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 50, .term = 3 }), 0);
	CU_ASSERT_EQUAL(rps__wal_last_index(w), 50);
	CU_ASSERT_EQUAL(rps__wal_last_term(w), 3);
	CU_ASSERT_EQUAL(save_range(w, 51, 52, 3, &(struct rps__wal_hard_state){ 3, 0, 50 }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 50);
	check_entries(&rec, 51, 52);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

/* ---- crash simulation -------------------------------------------------------- */

/* Build a log of single-record saves over 3 segments; return the names. */
static size_t build_single_record_log(char segs[][64])
{
	struct rps__wal_opts o = opts(1024, 0);
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 24; i++) {
		CU_ASSERT_EQUAL_FATAL(save_range(w, i, i, 1 + i / 10, NULL), 0);
		if (i % 5 == 0)	/* a hard state alone is a save too */
			CU_ASSERT_EQUAL_FATAL(rps__wal_save(w, &(struct rps__wal_hard_state){ 1 + i / 10, 1, i }, NULL, 0), 0);
	}
	CU_ASSERT_EQUAL_FATAL(save_range(w, 25, 25, 9, NULL), 0);	/* the last save */
	rps__wal_close(w);
	return list("wal-", segs);
}

static void test_torn_last_write_every_prefix(void)
{
	struct rps__wal_opts o = opts(1024, 0);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	size_t nsegs = build_single_record_log(segs), size, offs[64], sizes[64], n, start;
	const char *last;
	uint8_t *img;
	struct rps__wal *w;

	CU_ASSERT_FATAL(nsegs >= 2);
	last = segs[nsegs - 1];
	img = slurp(last, &size);
	n = walk(img, size, offs, sizes, 64);
	CU_ASSERT_FATAL(n >= 2);
	start = offs[n - 1];
	CU_ASSERT_EQUAL_FATAL(start + sizes[n - 1], size);
	for (size_t cut = start; cut < size; cut++) {
		spit(last, img, cut);
		CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
		check_entries(&rec, 1, 24);
		CU_ASSERT_EQUAL(rec.hs.commit, 20);
		CU_ASSERT_EQUAL(rec.truncated_bytes, cut - start);
		CU_ASSERT_EQUAL(rec.truncated_offset, cut > start ? start : 0);
		CU_ASSERT_EQUAL(rps__wal_last_index(w), 24);
		if (cut > start)
			CU_ASSERT_PTR_NOT_NULL(strstr(rec.note, "torn tail"));
		rps__wal_recovered_free(&rec);
		rps__wal_close(w);
	}
	/* the repaired log takes appends again, and the file was cut */
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 25, 26, 9, NULL), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 26);
	CU_ASSERT_EQUAL(rec.truncated_bytes, 0);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	free(img);
}

static void test_bit_flip_in_every_record(void)
{
	struct rps__wal_opts o = opts(1024, 0);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	size_t nsegs = build_single_record_log(segs), size, offs[64], sizes[64], n;
	unsigned tried = 0, refused = 0, torn = 0;
	struct rps__wal *w;

	for (size_t s = 0; s < nsegs; s++) {
		uint8_t *img = slurp(segs[s], &size);

		n = walk(img, size, offs, sizes, 64);
		CU_ASSERT_EQUAL_FATAL(offs[n - 1] + sizes[n - 1], size);
		for (size_t r = 0; r < n; r++) {
			/* crc, length, kind, batch position, batch, payload, padding */
			const size_t bytes[] = { 0, 4, 8, 12, 16, 24, sizes[r] / 2 + 12, sizes[r] - 1 };
			bool last = s + 1 == nsegs && r + 1 == n;
			char offset[32];

			snprintf(offset, sizeof(offset), "offset %zu", offs[r]);
			for (size_t b = 0; b < RPS__ARRAY_SIZE(bytes); b++) {
				size_t at = offs[r] + RPS__MIN(bytes[b], sizes[r] - 1);
				int rc;

				img[at] ^= (uint8_t)(1u << (b % 8));
				spit(segs[s], img, size);
				rps__clearerr();
				rc = rps__wal_open(dir, &o, &w, &rec);
				tried++;
				if (last) {
					CU_ASSERT_EQUAL(rc, 0);
					if (rc == 0) {
						torn++;
						check_entries(&rec, 1, 24);
						CU_ASSERT_EQUAL(rec.truncated_bytes, sizes[r]);
						rps__wal_recovered_free(&rec);
						rps__wal_close(w);
					}
					spit(segs[s], img, size);	/* restore the cut tail */
				} else {
					CU_ASSERT_EQUAL(rc, -EBADMSG);
					if (rc == -EBADMSG) {
						struct stat st;

						refused++;
						/* refusing repairs nothing */
						CU_ASSERT_EQUAL(stat(path_of(segs[s]), &st), 0);
						CU_ASSERT_EQUAL((size_t)st.st_size, size);
						CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), segs[s]));
						CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), offset));
						CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(),
							"restore this node from a peer: remove"));
					} else if (rc == 0) {
						rps__wal_recovered_free(&rec);
						rps__wal_close(w);
					}
				}
				img[at] ^= (uint8_t)(1u << (b % 8));
				spit(segs[s], img, size);
			}
		}
		/* the segment header too: always refused */
		img[20] ^= 1;
		spit(segs[s], img, size);
		CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), -EBADMSG);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), segs[s]));
		img[20] ^= 1;
		spit(segs[s], img, size);
		free(img);
	}
	CU_ASSERT(refused > 100);
	CU_ASSERT_EQUAL(torn, 8);
	CU_ASSERT_EQUAL(refused + torn, tried);
	/* and the untouched log still opens whole */
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 25);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

/* Pages of one write reach the disk in any order: a hole inside the last
 * save, with its later records intact, is still a torn write. */
static void test_hole_in_last_save(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	size_t size, offs[64], sizes[64], n;
	struct rps__wal *w;
	uint8_t *img;

	uint8_t *witness;
	size_t witness_len;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 4, 1, &(struct rps__wal_hard_state){ 1, 1, 2 }), 0);
	witness = slurp("COMMIT", &witness_len);
	CU_ASSERT_EQUAL(save_range(w, 5, 7, 2, &(struct rps__wal_hard_state){ 2, 1, 6 }), 0);
	rps__wal_close(w);
	/* the crash came before the save returned: its commit index never
	 * reached the witness (see the top of wal.c) */
	spit("COMMIT", witness, witness_len);
	free(witness);
	CU_ASSERT_EQUAL_FATAL(list("wal-", segs), 1);
	img = slurp(segs[0], &size);
	n = walk(img, size, offs, sizes, 64);
	CU_ASSERT_EQUAL_FATAL(n, 1 + 5 + 4);	/* opening hs, two saves */
	memset(img + offs[6], 0, sizes[6]);	/* first entry of the last save */
	spit(segs[0], img, size);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 4);
	CU_ASSERT_EQUAL(rec.hs.term, 1);	/* the whole save went, hs included */
	CU_ASSERT_EQUAL(rec.truncated_offset, offs[6]);
	CU_ASSERT_EQUAL(rec.truncated_bytes, size - offs[6]);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	free(img);
}

/* A torn save that replaced a suffix: the old suffix is still there. */
static void test_torn_conflicting_save(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	size_t size, offs[64], sizes[64], n;
	struct rps__wal *w;
	uint8_t *img;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 10, 1, &(struct rps__wal_hard_state){ 1, 1, 4 }), 0);
	CU_ASSERT_EQUAL(rps__wal_save(w, &(struct rps__wal_hard_state){ 2, 3, 4 }, (struct rps__wal_entry[]){
				{ 2, 6, 0, "x", 1 }, { 2, 7, 0, "y", 1 } }, 2), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(list("wal-", segs), 1);
	img = slurp(segs[0], &size);
	n = walk(img, size, offs, sizes, 64);
	spit(segs[0], img, offs[n - 1] + 5);	/* the hard state record cut short */
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 10);		/* terms and data from the model: term 1 */
	CU_ASSERT_EQUAL(rec.hs.term, 1);
	CU_ASSERT_EQUAL(rps__wal_last_index(w), 10);
	/* cut at the start of the save, not at the damaged record: none of
	 * its records may linger to be mistaken for the next save's */
	CU_ASSERT_EQUAL(rec.truncated_offset, offs[n - 3]);
	rps__wal_recovered_free(&rec);
	CU_ASSERT_EQUAL(save_range(w, 6, 6, 3, &(struct rps__wal_hard_state){ 3, 3, 4 }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 6);
	CU_ASSERT_EQUAL(rec.hs.term, 3);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	free(img);
}

static void test_zero_filled_tail(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	size_t size, offs[64], sizes[64], n;
	struct rps__wal *w;
	uint8_t *img;
	struct stat st;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 10; i++)
		CU_ASSERT_EQUAL(save_range(w, i, i, 1, NULL), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(list("wal-", segs), 1);
	img = slurp(segs[0], &size);
	img = realloc(img, size + 4096);
	CU_ASSERT_FATAL(img != NULL);

	/* preallocated blocks after the last record */
	memset(img + size, 0, 4096);
	spit(segs[0], img, size + 4096);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 10);
	CU_ASSERT_EQUAL(rec.truncated_bytes, 4096);
	CU_ASSERT_EQUAL(rec.truncated_offset, size);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	CU_ASSERT_EQUAL(stat(path_of(segs[0]), &st), 0);
	CU_ASSERT_EQUAL((size_t)st.st_size, size);

	/* the size reached the disk, the last record's data did not */
	n = walk(img, size, offs, sizes, 64);
	memset(img + offs[n - 1], 0, sizes[n - 1] + 512);
	spit(segs[0], img, size + 512);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 9);
	CU_ASSERT_EQUAL(rec.truncated_bytes, sizes[n - 1] + 512);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	free(img);
}

/* Twelve saves of one entry each; save i carries commit min(i, commit_max). */
static void build_twelve(uint64_t commit_max)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 12; i++)
		CU_ASSERT_EQUAL_FATAL(save_range(w, i, i, 1, &(struct rps__wal_hard_state){
					1, 1, i < commit_max ? i : commit_max }), 0);
	rps__wal_close(w);
}

/* A torn tail can only be the last save, which was never acknowledged; a
 * log cut short below its own commit index lost committed entries. */
static void test_truncated_log_refused(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	size_t size, offs[64], sizes[64], n;
	struct rps__wal *w = NULL;
	struct stat st;
	uint8_t *img;

	build_twelve(12);
	CU_ASSERT_EQUAL_FATAL(list("wal-", segs), 1);
	img = slurp(segs[0], &size);
	n = walk(img, size, offs, sizes, 64);
	CU_ASSERT_EQUAL_FATAL(n, 1 + 12 * 2);	/* opening hs, 12 x (entry, hs) */
	spit(segs[0], img, offs[9] + 10);	/* inside entry 5 */
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, &rec), -EBADMSG);
	CU_ASSERT_PTR_NULL(w);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "tocommit(12) is out of range [lastIndex(4)]:"
				      " was the raft log corrupted, truncated, or lost?"));
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "remove it and rejoin"));
	CU_ASSERT_PTR_NULL(strchr(rps__errbuf(), '\n'));
	/* refused: nothing was repaired */
	CU_ASSERT_EQUAL(stat(path_of(segs[0]), &st), 0);
	CU_ASSERT_EQUAL((size_t)st.st_size, offs[9] + 10);
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, &rec), -EBADMSG);
	/* cut at a record boundary, nothing torn at all: the same */
	spit(segs[0], img, offs[9]);
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, &rec), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "tocommit(12) is out of range [lastIndex(4)]"));
	free(img);
	teardown();
	setup();

	/* a torn last save whose entry was not committed yet still opens */
	build_twelve(11);
	CU_ASSERT_EQUAL_FATAL(list("wal-", segs), 1);
	img = slurp(segs[0], &size);
	n = walk(img, size, offs, sizes, 64);
	CU_ASSERT_EQUAL_FATAL(n, 1 + 12 * 2);
	spit(segs[0], img, offs[n - 2] + 10);	/* inside entry 12, the last save */
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 1, 11);
	CU_ASSERT_EQUAL(rec.hs.commit, 11);
	CU_ASSERT_PTR_NOT_NULL(strstr(rec.note, "torn tail"));
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	free(img);
}

/* Records with good checksums that break the log's rules: refused. */
static void test_gaps_and_terms_refused(void)
{
	struct rps__wal_opts o = opts(0, 0);
	static char segs[MAXFILES][64];
	size_t size, offs[64], sizes[64], n, len;
	struct rps__wal *w;
	uint8_t *img, payload[17] = { 0 }, rec[64];
	uint64_t batch;
	const struct {
		uint64_t index, term;
		const char *why;
	} bad[] = { { 7, 2, "gap" }, { 6, 1, "terms go down" } };

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 5, 2, NULL), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(list("wal-", segs), 1);
	img = slurp(segs[0], &size);
	img = realloc(img, size + sizeof(rec));
	CU_ASSERT_FATAL(img != NULL);
	n = walk(img, size, offs, sizes, 64);
	batch = le64(img + offs[n - 1] + 16) + 1;
	for (size_t k = 0; k < RPS__ARRAY_SIZE(bad); k++) {
		put_le64(payload, bad[k].term);
		put_le64(payload + 8, bad[k].index);
		len = craft(rec, 1, payload, sizeof(payload), batch, 0);
		memcpy(img + size, rec, len);
		spit(segs[0], img, size + len);
		CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), -EBADMSG);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), bad[k].why));
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), segs[0]));
	}
	/* the same record, done right, is accepted: the crafting is sound */
	put_le64(payload, 2);
	put_le64(payload + 8, 6);
	len = craft(rec, 1, payload, sizeof(payload), batch, 0);
	memcpy(img + size, rec, len);
	spit(segs[0], img, size + len);
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), 0);
	rps__wal_close(w);
	free(img);
}

static void test_missing_segment_refused(void)
{
	struct rps__wal_opts o = opts(512, 0);
	static char segs[MAXFILES][64];
	struct rps__wal *w;
	size_t n;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 30; i++)
		CU_ASSERT_EQUAL(save_range(w, i, i, 1, NULL), 0);
	rps__wal_close(w);
	n = list("wal-", segs);
	CU_ASSERT_FATAL(n >= 3);
	CU_ASSERT_EQUAL(unlink(path_of(segs[1])), 0);
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "missing"));
	/* without its first segments and without a snapshot: refused too */
	CU_ASSERT_EQUAL(unlink(path_of(segs[0])), 0);
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "no snapshot"));
}

static void corrupt_byte(const char *name, size_t at)
{
	size_t size;
	uint8_t *img = slurp(name, &size);

	img[at % size] ^= 0x40;
	spit(name, img, size);
	free(img);
}

static void test_damaged_snapshot(void)
{
	struct rps__wal_opts o = opts(1024, 2);
	struct rps__wal_recovered rec;
	static char snaps[MAXFILES][64];
	uint8_t data[300] = { 1, 2, 3 };
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 100; i++)
		CU_ASSERT_EQUAL(save_range(w, i, i, 1, NULL), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 40, .term = 1,
			.data = data, .len = sizeof(data) }), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 80, .term = 1,
			.data = data, .len = sizeof(data) }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(list("snap-", snaps), 2);

	/* keep 2: the damaged newest is put aside, the previous one serves */
	corrupt_byte(snaps[1], 64 + 100);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 40);
	CU_ASSERT_EQUAL(rec.skipped_snapshots, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(rec.note, snaps[1]));
	check_entries(&rec, 41, 100);
	rps__wal_recovered_free(&rec);
	/* Raft snapshots again at a lower index than the damaged one */
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 60, .term = 1 }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL(list("snap-", snaps), 3);	/* 40, 60, and 80.damaged */
	CU_ASSERT_PTR_NOT_NULL(strstr(snaps[2], ".damaged"));
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 60);
	check_entries(&rec, 61, 100);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);

	/* a truncated snapshot, then a missing one: same fallback */
	{
		size_t size;
		uint8_t *img = slurp(snaps[1], &size);

		spit(snaps[1], img, size - 1);
		free(img);
	}
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 40);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	/* no usable snapshot left, and the log was compacted past index 1 */
	unlink(path_of(snaps[0]));
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, &rec), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "restore this node from a peer: remove"));
}

/* The only snapshot is damaged but the log still starts at index 1. */
static void test_damaged_snapshot_log_suffices(void)
{
	struct rps__wal_opts o = opts(0, 1);
	struct rps__wal_recovered rec;
	static char snaps[MAXFILES][64];
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 50, 1, &(struct rps__wal_hard_state){ 1, 1, 30 }), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 30, .term = 1 }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(list("snap-", snaps), 1);
	corrupt_byte(snaps[0], 70);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_FALSE(rec.has_snapshot);
	CU_ASSERT_EQUAL(rec.skipped_snapshots, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(rec.note, "from the log alone"));
	check_entries(&rec, 1, 50);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

static void test_damaged_snapshot_refused(void)
{
	struct rps__wal_opts o = opts(1024, 1);
	static char snaps[MAXFILES][64];
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 100; i++)
		CU_ASSERT_EQUAL(save_range(w, i, i, 1, NULL), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 40, .term = 1 }), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 80, .term = 1 }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(list("snap-", snaps), 1);
	corrupt_byte(snaps[0], 30);
	rps__clearerr();
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), snaps[0]));
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "restore this node from a peer: remove"));
	/* refusing changed nothing */
	CU_ASSERT_EQUAL(list("snap-", snaps), 1);
	CU_ASSERT_FALSE(strstr(snaps[0], ".damaged") != NULL);
	unlink(path_of(snaps[0]));
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), -EBADMSG);
}

/* The crash came after the snapshot's rename, before its log marker. */
static void test_snapshot_without_marker(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	size_t size, offs[64], sizes[64], n;
	struct rps__wal *w;
	uint8_t *img;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 10, 1, &(struct rps__wal_hard_state){ 1, 0, 3 }), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 30, .term = 2 }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(list("wal-", segs), 1);
	img = slurp(segs[0], &size);
	n = walk(img, size, offs, sizes, 64);
	CU_ASSERT_EQUAL_FATAL(img[offs[n - 1] + 8], 3);	/* the marker */
	spit(segs[0], img, offs[n - 1]);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.snapshot.index, 30);
	CU_ASSERT_EQUAL(rec.n_ents, 0);
	CU_ASSERT_EQUAL(rps__wal_last_index(w), 30);
	CU_ASSERT_EQUAL(save_range(w, 31, 31, 2, NULL), 0);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	check_entries(&rec, 31, 31);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
	free(img);
}

/* A new segment whose opening record is torn gets its hard state back, so
 * compacting the older segments cannot lose the vote. */
static void test_torn_segment_opening(void)
{
	struct rps__wal_opts o = opts(512, 1);
	struct rps__wal_recovered rec;
	static char segs[MAXFILES][64];
	struct rps__wal_hard_state hs = { 4, 2, 3 };
	size_t nsegs, size;
	struct rps__wal *w;
	uint8_t *img;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 1; i <= 12; i++)
		CU_ASSERT_EQUAL(save_range(w, i, i, 4, i == 3 ? &hs : NULL), 0);
	rps__wal_close(w);
	nsegs = list("wal-", segs);
	CU_ASSERT_FATAL(nsegs >= 2);
	/* keep only the last segment's opening batch, and damage it */
	img = slurp(segs[nsegs - 1], &size);
	img[SEG_HDR + 30] ^= 1;
	spit(segs[nsegs - 1], img, SEG_HDR + REC_HDR + 24);
	free(img);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_EQUAL(rec.truncated_bytes, REC_HDR + 24);
	CU_ASSERT_TRUE(hs_equal(&rec.hs, &hs));
	CU_ASSERT_EQUAL(rec.n_ents + 1, rps__wal_last_index(w) + 1);
	rps__wal_recovered_free(&rec);
	/* a snapshot at the end compacts every older segment away */
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){
				.index = rps__wal_last_index(w), .term = 4 }), 0);
	rps__wal_close(w);
	CU_ASSERT_EQUAL(list("wal-", segs), 1);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT_TRUE(hs_equal(&rec.hs, &hs));
	CU_ASSERT_EQUAL(rec.n_ents, 0);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

/* ---- policies, failures, housekeeping ------------------------------------------ */

static void test_fsync_policy(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	/* creating a node: the directory's parent, the first segment, dir */
	CU_ASSERT_EQUAL(syncs.data, 0);
	CU_ASSERT_EQUAL(syncs.full, 3);
	memset(&syncs, 0, sizeof(syncs));
	for (uint64_t i = 1; i <= 10; i++)
		CU_ASSERT_EQUAL(save_range(w, i, i, 1, &(struct rps__wal_hard_state){ 1, 1, i - 1 }), 0);
	CU_ASSERT_EQUAL(syncs.data, 10);	/* exactly one per save */
	CU_ASSERT_EQUAL(syncs.full, 0);
	CU_ASSERT_EQUAL(rps__wal_save(w, NULL, NULL, 0), 0);	/* nothing to save, nothing synced */
	CU_ASSERT_EQUAL(syncs.data, 10);
	memset(&syncs, 0, sizeof(syncs));
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 5, .term = 1 }), 0);
	CU_ASSERT_EQUAL(syncs.full, 2);		/* snapshot file, directory */
	CU_ASSERT_EQUAL(syncs.data, 1);		/* its log marker */
	rps__wal_close(w);

	o.fsync = RPS__WAL_FSYNC_NONE;
	memset(&syncs, 0, sizeof(syncs));
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	for (uint64_t i = 11; i <= 20; i++)
		CU_ASSERT_EQUAL(save_range(w, i, i, 1, NULL), 0);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 15, .term = 1 }), 0);
	CU_ASSERT_EQUAL(syncs.data + syncs.full, 0);
	rps__wal_close(w);
}

static void test_sync_failure_is_sticky(void)
{
	struct rps__wal_opts o = opts(0, 0);
	struct rps__wal_recovered rec;
	struct rps__wal *w;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(save_range(w, 1, 3, 1, NULL), 0);
	syncs.fail_after = syncs.data + syncs.full + 1;
	CU_ASSERT_EQUAL(save_range(w, 4, 4, 1, NULL), -EIO);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "restart"));
	syncs.fail_after = 0;
	/* never retried: a later fsync could report success for lost pages */
	CU_ASSERT_EQUAL(save_range(w, 4, 4, 1, NULL), -EIO);
	CU_ASSERT_EQUAL(rps__wal_save_snapshot(w, &(struct rps__wal_snapshot){ .index = 2, .term = 1 }), -EIO);
	rps__wal_close(w);
	/* restart: replay decides (here the page cache kept the write) */
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, &rec), 0);
	CU_ASSERT(rec.n_ents == 3 || rec.n_ents == 4);
	rps__wal_recovered_free(&rec);
	rps__wal_close(w);
}

static void test_lock_and_leftovers(void)
{
	struct rps__wal_opts o = opts(0, 0);
	static char names[MAXFILES][64];
	struct rps__wal *w, *w2;

	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w2, NULL), -EBUSY);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "another process"));
	CU_ASSERT_EQUAL(save_range(w, 1, 1, 1, NULL), 0);
	rps__wal_close(w);
	/* unfinished files from a crash are removed, other files left alone */
	spit("wal-0000000000000002-0000000000000001.log.tmp", "junk", 4);
	spit("snap-0000000000000001-0000000000000001.snap.tmp", "junk", 4);
	spit("README", "mine", 4);
	CU_ASSERT_EQUAL_FATAL(rps__wal_open(dir, &o, &w, NULL), 0);
	CU_ASSERT_EQUAL(list("wal-", names), 1);
	CU_ASSERT_EQUAL(list("snap-", names), 0);
	CU_ASSERT_EQUAL(list("README", names), 1);
	rps__wal_close(w);
	o.segment_size = 10;
	CU_ASSERT_EQUAL(rps__wal_open(dir, &o, &w, NULL), -EINVAL);
}

/* The write-all helpers the log and the checkpoints write with
 * (common/fsutil.c): whole buffers, at the position or at an offset, and a
 * short write followed by a failure reported as that failure. */
static void test_write_all(void)
{
	static const char a[] = "0123456789", b[] = "ab";
	struct rlimit old, lim;
	char got[32] = { 0 };
	void (*was)(int);
	int fd;

	CU_ASSERT_FATAL(mkdir(dir, 0700) == 0);	/* (the fixture leaves it to open) */
	fd = open(path_of("w"), O_RDWR | O_CREAT | O_TRUNC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(rps__write_all(fd, a, 10), 0);
	CU_ASSERT_EQUAL(rps__pwrite_all(fd, b, 2, 3), 0);
	CU_ASSERT_EQUAL(lseek(fd, 0, SEEK_CUR), 10);	/* pwrite left the position */
	CU_ASSERT_EQUAL(rps__write_all(fd, b, 0), 0);
	CU_ASSERT_EQUAL(pread(fd, got, sizeof(got), 0), 10);
	CU_ASSERT_STRING_EQUAL(got, "012ab56789");
	/* past RLIMIT_FSIZE: a short write, then EFBIG */
	CU_ASSERT_FATAL(getrlimit(RLIMIT_FSIZE, &old) == 0);
	lim = old;
	lim.rlim_cur = 14;
	was = signal(SIGXFSZ, SIG_IGN);
	CU_ASSERT_FATAL(setrlimit(RLIMIT_FSIZE, &lim) == 0);
	CU_ASSERT_EQUAL(rps__write_all(fd, a, 10), -EFBIG);
	CU_ASSERT_EQUAL(rps__pwrite_all(fd, a, 10, 10), -EFBIG);
	CU_ASSERT_FATAL(setrlimit(RLIMIT_FSIZE, &old) == 0);
	signal(SIGXFSZ, was);
	CU_ASSERT_EQUAL(lseek(fd, 0, SEEK_END), 14);
	close(fd);
	CU_ASSERT_EQUAL(rps__write_all(fd, a, 1), -EBADF);
	CU_ASSERT_EQUAL(rps__pwrite_all(fd, a, 1, 0), -EBADF);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "fresh node, then entries/hard state/snapshot round-trip", test_fresh_and_roundtrip },
		{ "conflicting suffix replaced; invalid saves refused", test_conflict_truncation },
		{ "segment rollover, 3100 records", test_rollover_and_many_records },
		{ "compaction removes old segments and snapshots", test_compaction },
		{ "snapshot installed from the leader empties the log", test_installed_snapshot },
		{ "every prefix of the last write is a torn tail", test_torn_last_write_every_prefix },
		{ "bit flip: last record torn, any other refused", test_bit_flip_in_every_record },
		{ "a hole inside the last save drops the whole save", test_hole_in_last_save },
		{ "a torn conflicting save leaves the old suffix", test_torn_conflicting_save },
		{ "zero-filled tail is a torn tail", test_zero_filled_tail },
		{ "a log truncated below its commit index is refused", test_truncated_log_refused },
		{ "index gap and falling term refused", test_gaps_and_terms_refused },
		{ "missing segments refused", test_missing_segment_refused },
		{ "damaged snapshot: fallback to the previous one", test_damaged_snapshot },
		{ "damaged snapshot, log compacted: refused", test_damaged_snapshot_refused },
		{ "damaged only snapshot, log from index 1: log alone", test_damaged_snapshot_log_suffices },
		{ "crash between snapshot and its log marker", test_snapshot_without_marker },
		{ "torn opening record of the last segment", test_torn_segment_opening },
		{ "fsync policy: one sync per save, none with NONE", test_fsync_policy },
		{ "a failed sync makes the log unusable", test_sync_failure_is_sticky },
		{ "directory lock, leftover temp files", test_lock_and_leftovers },
		{ "write-all helpers: offsets, short writes, errors", test_write_all },
	};
	/* setup/teardown per test: each one gets a fresh directory */
	const struct cutest_suite suites[] = {
		{ "wal", NULL, NULL, setup, teardown, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
