/*
 * test_ckpt.c - unit tests of checkpoint files (src/control/ckpt.c): round trips
 * bit for bit, compression chosen only when it pays, and a reader that
 * refuses every truncation, every flipped bit and hand-made files that are
 * well checksummed but malformed.  Run it under valgrind too: the reader
 * must not touch memory it did not read from the file.
 *
 * Checkpoint names (what a request may put under --checkpoint-dir) and the
 * directory walk that never follows a link are tested here too.
 *
 * The malformed files are built here with their own encoder of the format
 * documented at the top of ckpt.c, so a change of format has to change both.
 */
#include "config.h"
#include "control/ckpt.h"
#include "common/common.h"
#include "lib/cutest.h"
#include "common/fsutil.h"
#include "lib/tmpdir.h"

#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_ELEMS 4u

static char base[256];
static char dir[300];

/* ---- fixtures ------------------------------------------------------------ */

/* dir does not exist yet, its parent does: create must make it. */
static void setup(void)
{
	test_mkdtemp(base, sizeof(base), "test_ckpt");
	snprintf(dir, sizeof(dir), "%s/run", base);
	if (mkdir(dir, 0700) < 0) {
		perror("mkdir");
		exit(1);
	}
	snprintf(dir, sizeof(dir), "%s/run/step", base);
}

static void teardown(void)
{
	rps__remove_tree(base);
}

static size_t count_files(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	size_t n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static uint8_t *slurp(const char *file, size_t *len)
{
	FILE *f = fopen(file, "rb");
	uint8_t *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static void spit(const char *file, const uint8_t *buf, size_t len)
{
	FILE *f = fopen(file, "wb");

	if (!f || fwrite(buf, 1, len, f) != len) {
		perror(file);
		exit(1);
	}
	fclose(f);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static float rnd_float(void)
{
	uint32_t v = (uint32_t)rnd();
	float f;

	memcpy(&f, &v, 4);
	return f;	/* any bit pattern, NaNs included */
}

/* ---- a model of what was written ----------------------------------------- */

#define MAX_SHARDS 16
#define MAX_TENSORS 4

struct mshard {
	uint32_t index, elems, nclocks, nstate, flags;
	uint64_t version, min_clock;
	uint64_t clocks[8];
	float params[SHARD_ELEMS * 1024];
	float state[2 * SHARD_ELEMS * 1024];
};

struct mtensor {
	char name[RPS__NAME_MAX];
	struct rps__tensor_spec spec;
	size_t nshards;
	struct mshard shards[MAX_SHARDS];
};

static struct mtensor model[MAX_TENSORS];
static size_t nmodel;

static struct rps__ckpt_header hdr_of(uint64_t member, uint32_t shard_elems)
{
	struct rps__ckpt_header h = { .member_id = member, .npart = 8, .shard_elems = shard_elems,
				      .ckpt_id = 0x1122334455667788ull, .time_ns = 1700000000123456789ull };
	return h;
}

static struct mtensor *add_tensor(const char *name, uint64_t count, uint32_t mode, uint32_t optimizer,
				  int32_t workers)
{
	struct mtensor *t = &model[nmodel++];

	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->spec.count = count;
	t->spec.dtype = 1;
	t->spec.mode = mode;
	t->spec.staleness = mode == 3 ? 2 : 0;
	t->spec.optimizer = optimizer;
	t->spec.lr = 0.01f;
	t->spec.momentum = 0.9f;
	t->spec.beta1 = 0.9f;
	t->spec.beta2 = 0.999f;
	t->spec.eps = 1e-8f;
	t->spec.weight_decay = -0.0f;
	t->spec.rescale = 1.0f / 3.0f;
	t->spec.num_workers = workers;
	t->spec.flags = 2;
	return t;
}

/* Shards in reverse order (any order is allowed); nstate_mult 0, 1, 2. */
static void add_shards(struct mtensor *t, uint32_t shard_elems, unsigned nstate_mult, uint32_t nclocks)
{
	uint32_t n = (uint32_t)((t->spec.count + shard_elems - 1) / shard_elems);

	for (uint32_t k = 0; k < n; k++) {
		struct mshard *s = &t->shards[t->nshards++];
		uint32_t i = n - 1 - k;

		s->index = i;
		s->elems = (uint32_t)RPS__MIN((uint64_t)shard_elems, t->spec.count - (uint64_t)i * shard_elems);
		s->version = rnd();
		s->min_clock = rnd() & 0xffff;
		s->flags = (i & 1) ? RPS__CKPT_SHARD_READY : 0;
		s->nclocks = nclocks;
		for (uint32_t c = 0; c < nclocks; c++)
			s->clocks[c] = rnd();
		s->nstate = nstate_mult * s->elems;
		for (uint32_t e = 0; e < s->elems; e++)
			s->params[e] = rnd_float();
		for (uint32_t e = 0; e < s->nstate; e++)
			s->state[e] = rnd_float();
	}
}

static struct rps__ckpt_shard view(const struct mshard *s)
{
	struct rps__ckpt_shard v = { .index = s->index, .elems = s->elems, .version = s->version,
				     .min_clock = s->min_clock, .flags = s->flags, .nclocks = s->nclocks,
				     .clocks = s->clocks, .params = s->params, .nstate = s->nstate,
				     .state = s->state };
	return v;
}

static int write_model(uint64_t member, uint32_t shard_elems, int level, uint64_t *bytes)
{
	struct rps__ckpt_header h = hdr_of(member, shard_elems);
	struct rps__ckpt_writer *w;
	int err;

	err = rps__ckpt_create(dir, &h, level, &w);
	if (err)
		return err;
	for (size_t t = 0; t < nmodel; t++) {
		err = rps__ckpt_put_tensor(w, model[t].name, &model[t].spec);
		for (size_t i = 0; !err && i < model[t].nshards; i++) {
			struct rps__ckpt_shard v = view(&model[t].shards[i]);

			err = rps__ckpt_put_shard(w, &v);
		}
		if (err) {
			rps__ckpt_abort(w);
			return err;
		}
	}
	return rps__ckpt_finish(w, bytes);
}

static void member_path(char *out, size_t size, uint64_t member)
{
	snprintf(out, size, "%s/member-%llu.rpsck", dir, (unsigned long long)member);
}

/* Read the whole file; 0 if it matches the model bit for bit. */
static int check_model(const char *file, uint32_t shard_elems)
{
	struct rps__ckpt_reader *r;
	struct rps__ckpt_header h, want = hdr_of(7, shard_elems);
	struct rps__ckpt_item it;
	size_t t = 0, s = 0;
	int rc;

	rc = rps__ckpt_open(file, &r, &h);
	if (rc)
		return rc;
	CU_ASSERT_EQUAL(memcmp(&h, &want, sizeof(h)), 0);
	while ((rc = rps__ckpt_next(r, &it)) == 1) {
		if (it.type == RPS__CKPT_TENSOR) {
			CU_ASSERT_FATAL(t < nmodel);
			CU_ASSERT_STRING_EQUAL(it.name, model[t].name);
			CU_ASSERT_EQUAL(memcmp(&it.spec, &model[t].spec, sizeof(it.spec)), 0);
			t++;
			s = 0;
		} else {
			const struct mshard *m;

			CU_ASSERT_FATAL(t > 0 && s < model[t - 1].nshards);
			m = &model[t - 1].shards[s++];
			CU_ASSERT_EQUAL(it.shard.index, m->index);
			CU_ASSERT_EQUAL(it.shard.elems, m->elems);
			CU_ASSERT_EQUAL(it.shard.version, m->version);
			CU_ASSERT_EQUAL(it.shard.min_clock, m->min_clock);
			CU_ASSERT_EQUAL(it.shard.flags, m->flags);
			CU_ASSERT_EQUAL_FATAL(it.shard.nclocks, m->nclocks);
			CU_ASSERT_EQUAL_FATAL(it.shard.nstate, m->nstate);
			if (m->nclocks)
				CU_ASSERT_EQUAL(memcmp(it.shard.clocks, m->clocks, 8 * m->nclocks), 0);
			CU_ASSERT_EQUAL(memcmp(it.shard.params, m->params, 4 * m->elems), 0);
			if (m->nstate) {
				CU_ASSERT_EQUAL(memcmp(it.shard.state, m->state, 4 * m->nstate), 0);
			} else {
				CU_ASSERT_PTR_NULL(it.shard.state);
			}
		}
	}
	if (rc == 0) {
		CU_ASSERT_EQUAL(t, nmodel);
		CU_ASSERT_EQUAL(rps__ckpt_next(r, &it), 0);	/* stays at the end */
	}
	rps__ckpt_close(r);
	return rc;
}

/* Open and read to the end: 0 or the refusal. */
static int read_all(const char *file)
{
	struct rps__ckpt_reader *r;
	struct rps__ckpt_item it;
	int rc;

	rc = rps__ckpt_open(file, &r, NULL);
	if (rc)
		return rc;
	while ((rc = rps__ckpt_next(r, &it)) == 1)
		;
	rps__ckpt_close(r);
	return rc;
}

/* ---- a hand encoder of the format (see ckpt.c) -------------------------- */

static uint32_t crc(uint32_t c, const void *p, size_t n)
{
	return ~crc32_iscsi((unsigned char *)p, (int)n, ~c);
}

static void p32(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void p64(uint8_t *p, uint64_t v)
{
	for (unsigned i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

struct fbuf {
	uint8_t b[1 << 16];
	size_t len;
	uint64_t records, raw;
	uint32_t chain;
};

static void f_header(struct fbuf *f, uint32_t version, uint32_t shard_elems)
{
	memset(f, 0, sizeof(*f));
	memcpy(f->b, "RPSCKPT1", 8);
	p32(f->b + 8, version);
	p32(f->b + 12, 64);
	p64(f->b + 16, 7);
	p32(f->b + 24, 8);
	p32(f->b + 28, shard_elems);
	p32(f->b + 60, crc(0, f->b, 60));
	f->len = 64;
}

static void f_record(struct fbuf *f, uint32_t type, const uint8_t *raw, uint32_t len)
{
	uint8_t *h = f->b + f->len, c[4];
	uint32_t rc = crc(0, raw, len);

	p32(h, type);
	p32(h + 4, 0);
	p32(h + 8, len);
	p32(h + 12, len);
	p32(h + 16, rc);
	p32(h + 20, rc);
	p32(h + 24, 0);
	p32(h + 28, crc(0, h, 28));
	p32(c, crc(0, h, 28));
	f->chain = crc(f->chain, c, 4);
	memcpy(h + 32, raw, len);
	f->len += 32 + len;
	f->records++;
	f->raw += len;
}

static void f_tensor(struct fbuf *f, const char *name, uint64_t count, bool terminate)
{
	uint8_t raw[128] = { 0 };

	if (terminate)
		memcpy(raw, name, strlen(name));
	else
		memset(raw, 'x', 64);
	p64(raw + 64, count);
	f_record(f, 1, raw, sizeof(raw));
}

static void f_shard(struct fbuf *f, uint32_t index, uint32_t elems, uint32_t nclocks, uint32_t nstate,
		    uint32_t data_floats)
{
	static uint8_t raw[40 + 4 * 64];

	memset(raw, 0, sizeof(raw));
	p32(raw, index);
	p32(raw + 4, elems);
	p32(raw + 28, nclocks);
	p32(raw + 32, nstate);
	f_record(f, 2, raw, 40 + 4 * data_floats);
}

static void f_trailer(struct fbuf *f, int64_t records_delta)
{
	uint8_t *t = f->b + f->len;

	p32(t, 3);
	p32(t + 4, 0);
	p64(t + 8, f->records + (uint64_t)records_delta);
	p64(t + 16, f->raw);
	p32(t + 24, f->chain);
	p32(t + 28, crc(0, t, 28));
	f->len += 32;
}

static int f_read(struct fbuf *f)
{
	char path[512];

	mkdir(base, 0700);
	snprintf(path, sizeof(path), "%s/member-7.rpsck", base);
	spit(path, f->b, f->len);
	return read_all(path);
}

/* ---- tests --------------------------------------------------------------- */

static void test_round_trip(void)
{
	struct mtensor *t;
	char path[512];
	uint64_t bytes = 0;
	struct stat st;

	nmodel = 0;
	t = add_tensor("layer0.weight", 10, 1, 0, 0);		/* async, SGD: no state */
	add_shards(t, SHARD_ELEMS, 0, 0);			/* 4 + 4 + 2 (short last) */
	t = add_tensor("layer0.bias", 7, 2, 1, 0);		/* sync, momentum: 1x */
	add_shards(t, SHARD_ELEMS, 1, 0);
	t = add_tensor("embedding", 9, 3, 2, 3);		/* bounded, Adam: 2x, clocks */
	add_shards(t, SHARD_ELEMS, 2, 3);
	t = add_tensor("a-name-of-exactly-sixty-three-bytes-aaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1, 1, 0, 0);
	add_shards(t, SHARD_ELEMS, 0, 0);
	CU_ASSERT_EQUAL(strlen(t->name), 63);

	member_path(path, sizeof(path), 7);
	for (int level = 0; level <= 3; level++) {
		CU_ASSERT_EQUAL_FATAL(write_model(7, SHARD_ELEMS, level, &bytes), 0);
		CU_ASSERT_EQUAL_FATAL(stat(path, &st), 0);
		CU_ASSERT_EQUAL((uint64_t)st.st_size, bytes);
		CU_ASSERT_EQUAL(check_model(path, SHARD_ELEMS), 0);
		CU_ASSERT_EQUAL(count_files(dir), 1);	/* no .tmp left */
	}
}

/* Walk the records: how many were deflated, and the stored / raw bytes. */
static void walk(const char *file, unsigned *deflated, unsigned *stored, uint64_t *raw_bytes)
{
	size_t len, off = 64;
	uint8_t *b = slurp(file, &len);

	*deflated = *stored = 0;
	*raw_bytes = 0;
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	while (off + 32 <= len) {
		uint32_t type = b[off] | b[off + 1] << 8, flags = b[off + 4];
		uint32_t raw = (uint32_t)b[off + 8] | (uint32_t)b[off + 9] << 8 | (uint32_t)b[off + 10] << 16;
		uint32_t sto = (uint32_t)b[off + 12] | (uint32_t)b[off + 13] << 8 | (uint32_t)b[off + 14] << 16;

		if (type == 3)
			break;
		if (type == 2) {
			*raw_bytes += raw;
			if (flags & 1)
				(*deflated)++;
			else
				(*stored)++;
		}
		off += 32 + sto;
	}
	CU_ASSERT_EQUAL(off + 32, len);
	free(b);
}

static void test_compression(void)
{
	struct mtensor *t;
	char path[512];
	uint64_t bytes, raw;
	unsigned defl, sto;

	member_path(path, sizeof(path), 7);
	nmodel = 0;
	t = add_tensor("zeros", 4096, 1, 2, 0);
	add_shards(t, 1024, 2, 0);
	for (size_t i = 0; i < t->nshards; i++) {
		memset(t->shards[i].params, 0, sizeof(t->shards[i].params));
		memset(t->shards[i].state, 0, sizeof(t->shards[i].state));
	}
	CU_ASSERT_EQUAL_FATAL(write_model(7, 1024, 1, &bytes), 0);
	walk(path, &defl, &sto, &raw);
	CU_ASSERT_EQUAL(defl, 4);
	CU_ASSERT_EQUAL(sto, 0);
	CU_ASSERT(bytes < raw / 20);
	CU_ASSERT_EQUAL(check_model(path, 1024), 0);

	/* random bits do not compress: stored as they are */
	nmodel = 0;
	t = add_tensor("noise", 4096, 1, 2, 0);
	add_shards(t, 1024, 2, 0);
	CU_ASSERT_EQUAL_FATAL(write_model(7, 1024, 1, &bytes), 0);
	walk(path, &defl, &sto, &raw);
	CU_ASSERT_EQUAL(defl, 0);
	CU_ASSERT_EQUAL(sto, 4);
	CU_ASSERT(bytes > raw);
	CU_ASSERT_EQUAL(check_model(path, 1024), 0);

	/* level 0 never deflates */
	nmodel = 0;
	t = add_tensor("zeros", 4096, 1, 0, 0);
	add_shards(t, 1024, 0, 0);
	for (size_t i = 0; i < t->nshards; i++)
		memset(t->shards[i].params, 0, sizeof(t->shards[i].params));
	CU_ASSERT_EQUAL_FATAL(write_model(7, 1024, 0, &bytes), 0);
	walk(path, &defl, &sto, &raw);
	CU_ASSERT_EQUAL(defl, 0);
	CU_ASSERT_EQUAL(sto, 4);
}

/* A small file with both kinds of records: some deflated, some stored. */
static void small_file(char *path, size_t size)
{
	struct mtensor *t;
	unsigned defl, sto;
	uint64_t raw;

	nmodel = 0;
	t = add_tensor("w", 30, 3, 1, 2);
	add_shards(t, 128, 1, 2);
	t = add_tensor("z", 128, 1, 0, 0);
	add_shards(t, 128, 0, 0);
	memset(t->shards[0].params, 0, sizeof(t->shards[0].params));
	member_path(path, size, 7);
	CU_ASSERT_EQUAL_FATAL(write_model(7, 128, 1, NULL), 0);
	walk(path, &defl, &sto, &raw);
	if (defl != 1 || sto != 1)
		printf("\n  deflated %u stored %u\n", defl, sto);
	CU_ASSERT_EQUAL(defl, 1);
	CU_ASSERT_EQUAL(sto, 1);
}

static void test_truncation(void)
{
	char path[512];
	uint8_t *b;
	size_t len, refused = 0, named = 0, said = 0;

	small_file(path, sizeof(path));
	b = slurp(path, &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_EQUAL(read_all(path), 0);
	for (size_t n = 0; n < len; n++) {
		char want[64];
		int rc;

		spit(path, b, n);
		rc = read_all(path);
		refused += rc == -EBADMSG;
		named += strstr(rps__errbuf(), path) != NULL;
		snprintf(want, sizeof(want), "truncated at byte %zu", n);
		said += strstr(rps__errbuf(), want) != NULL;
		if (rc != -EBADMSG || !strstr(rps__errbuf(), want))
			printf("\n  length %zu: %d %s\n", n, rc, rps__errbuf());
	}
	CU_ASSERT_EQUAL(refused, len);
	CU_ASSERT_EQUAL(named, len);
	CU_ASSERT_EQUAL(said, len);
	/* and something appended after the trailer */
	b = realloc(b, len + 1);
	b[len] = 0;
	spit(path, b, len + 1);
	CU_ASSERT_EQUAL(read_all(path), -EBADMSG);
	free(b);
}

static void test_bit_flips(void)
{
	char path[512];
	uint8_t *b;
	size_t len, refused = 0;

	small_file(path, sizeof(path));
	b = slurp(path, &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	for (size_t bit = 0; bit < 8 * len; bit++) {
		int rc;

		b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		spit(path, b, len);
		rc = read_all(path);
		if (rc == -EILSEQ || rc == -EBADMSG)
			refused++;
		else
			printf("\n  bit %zu: %d %s\n", bit, rc, rps__errbuf());
		b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	CU_ASSERT_EQUAL(refused, 8 * len);
	spit(path, b, len);
	CU_ASSERT_EQUAL(read_all(path), 0);
	free(b);
}

/* Well checksummed, yet wrong: the structure checks must catch these. */
static void test_malformed(void)
{
	static struct fbuf f;

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_shard(&f, 0, 4, 0, 0, 4);
	f_shard(&f, 1, 2, 0, 2, 4);
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), 0);	/* the encoder is right */

	f_header(&f, 1, 4);
	f_shard(&f, 0, 4, 0, 0, 4);
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "shard before any tensor"));

	f_header(&f, 1, 1u << 28);
	f_tensor(&f, "t", 1ull << 30, true);
	f_shard(&f, 0, (1u << 28) + 1, 0, 0, 4);
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);

	f_header(&f, 1, (1u << 28) + 1);	/* absurd shard size in the header */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_shard(&f, 0, 4, 0, 9, 13);		/* nstate > 2 x elems */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_shard(&f, 0, 4, 4097, 0, 4);		/* nclocks > 4096 */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_shard(&f, 0, 4, 0, 0, 5);		/* length disagrees with contents */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_shard(&f, 1, 4, 0, 0, 4);		/* the last shard is short */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_shard(&f, 2, 4, 0, 0, 4);		/* no such shard */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, false);		/* name not NUL-terminated */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "NUL"));

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_trailer(&f, 1);			/* trailer counts a record more */
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "trailer mismatch"));

	f_header(&f, 1, 4);
	f_tensor(&f, "t", 6, true);
	f_trailer(&f, 0);
	f.len -= 32;				/* no trailer at all */
	CU_ASSERT_EQUAL(f_read(&f), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "truncated at byte"));

	f_header(&f, 2, 4);			/* a newer version, intact */
	f_trailer(&f, 0);
	CU_ASSERT_EQUAL(f_read(&f), -EPROTO);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "written by a newer rdmaps"));

	f_header(&f, 1, 4);
	memcpy(f.b, "RPSCKPT2", 8);
	CU_ASSERT_EQUAL(f_read(&f), -EILSEQ);

	/* a record dropped from the middle: the trailer no longer matches */
	{
		static struct fbuf g;

		f_header(&f, 1, 4);
		f_tensor(&f, "t", 6, true);
		f_shard(&f, 0, 4, 0, 0, 4);
		f_shard(&f, 1, 2, 0, 0, 2);
		f_trailer(&f, 0);
		g = f;
		memmove(g.b + 64 + 32 + 128, g.b + 64 + 32 + 128 + 32 + 56, f.len - (64 + 32 + 128 + 32 + 56));
		g.len -= 32 + 56;
		CU_ASSERT_EQUAL(f_read(&g), -EBADMSG);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "trailer mismatch"));
	}
}

static void test_writer_refuses(void)
{
	struct rps__ckpt_header h = hdr_of(3, 4);
	struct rps__tensor_spec spec = { .count = 6 };
	float p[4] = { 0 };
	struct rps__ckpt_shard s = { .index = 0, .elems = 4, .params = p };
	struct rps__ckpt_writer *w;

	CU_ASSERT_EQUAL(rps__ckpt_create(dir, &h, 4, &w), -EINVAL);
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_create(dir, &h, 1, &w), 0);
	CU_ASSERT_EQUAL(rps__ckpt_put_shard(w, &s), -EINVAL);		/* before any tensor */
	CU_ASSERT_EQUAL(rps__ckpt_put_tensor(w, "", &spec), -EINVAL);
	CU_ASSERT_EQUAL(rps__ckpt_put_tensor(w, "t", &spec), 0);
	s.index = 1;
	CU_ASSERT_EQUAL(rps__ckpt_put_shard(w, &s), -EINVAL);		/* shard 1 has 2 */
	s.elems = 2;
	s.nstate = 3;
	CU_ASSERT_EQUAL(rps__ckpt_put_shard(w, &s), -EINVAL);
	s.nstate = 0;
	CU_ASSERT_EQUAL(rps__ckpt_put_shard(w, &s), 0);
	rps__ckpt_abort(w);
	CU_ASSERT_EQUAL(count_files(dir), 0);
	rps__ckpt_abort(NULL);
}

static void test_abort(void)
{
	struct rps__ckpt_header h = hdr_of(5, 4);
	struct rps__tensor_spec spec = { .count = 4 };
	float p[4] = { 1, 2, 3, 4 };
	struct rps__ckpt_shard s = { .index = 0, .elems = 4, .params = p };
	struct rps__ckpt_writer *w;
	char path[512];

	CU_ASSERT_EQUAL_FATAL(rps__ckpt_create(dir, &h, 2, &w), 0);
	CU_ASSERT_EQUAL(count_files(dir), 1);	/* the temporary file */
	CU_ASSERT_EQUAL(rps__ckpt_put_tensor(w, "t", &spec), 0);
	CU_ASSERT_EQUAL(rps__ckpt_put_shard(w, &s), 0);
	rps__ckpt_abort(w);
	CU_ASSERT_EQUAL(count_files(dir), 0);
	member_path(path, sizeof(path), 5);
	CU_ASSERT_EQUAL(access(path, F_OK), -1);
}

static void test_list(void)
{
	static const char *junk[] = { "member-3.rpsck.tmp", "notes.txt", "member-.rpsck", "xmember-4.rpsck",
				      "member-5.rpsckx" };
	char **files = NULL, path[512];
	size_t n = 0;

	CU_ASSERT_EQUAL(rps__ckpt_list(dir, &files, &n), -ENOENT);	/* no directory */
	nmodel = 0;
	add_shards(add_tensor("t", 3, 1, 0, 0), SHARD_ELEMS, 0, 0);
	CU_ASSERT_EQUAL_FATAL(write_model(22, SHARD_ELEMS, 1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(write_model(1, SHARD_ELEMS, 1, NULL), 0);
	for (size_t i = 0; i < RPS__ARRAY_SIZE(junk); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, junk[i]);
		spit(path, (const uint8_t *)"x", 1);
	}
	snprintf(path, sizeof(path), "%s/member-9.rpsck", dir);
	CU_ASSERT_EQUAL(mkdir(path, 0700), 0);		/* a directory is no member file */
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_list(dir, &files, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	member_path(path, sizeof(path), 1);
	CU_ASSERT_STRING_EQUAL(files[0], path);
	member_path(path, sizeof(path), 22);
	CU_ASSERT_STRING_EQUAL(files[1], path);
	rps__ckpt_free_list(files, n);

	/* only junk: none */
	for (int m = 1; m <= 22; m += 21) {
		member_path(path, sizeof(path), (uint64_t)m);
		unlink(path);
	}
	CU_ASSERT_EQUAL(rps__ckpt_list(dir, &files, &n), -ENOENT);
	CU_ASSERT_EQUAL(n, 0);
}

/* Symlinks planted under the writer's file names are never
 * followed, the file is private, and missing parents are not made. */
static void test_writer_ignores_planted_symlinks(void)
{
	char victim[512], tmpname[600], final[512], got[16] = { 0 };
	struct stat st;
	FILE *f;

	snprintf(victim, sizeof(victim), "%s/victim", base);
	spit(victim, (const uint8_t *)"victim", 6);
	CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0755), 0);
	member_path(final, sizeof(final), 7);
	snprintf(tmpname, sizeof(tmpname), "%s.tmp", final);
	CU_ASSERT_EQUAL_FATAL(symlink(victim, tmpname), 0);
	CU_ASSERT_EQUAL_FATAL(symlink(victim, final), 0);
	nmodel = 0;
	add_shards(add_tensor("t", 3, 1, 0, 0), SHARD_ELEMS, 0, 0);
	CU_ASSERT_EQUAL_FATAL(write_model(7, SHARD_ELEMS, 1, NULL), 0);
	f = fopen(victim, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(fread(got, 1, sizeof(got) - 1, f), 6);
	fclose(f);
	CU_ASSERT_STRING_EQUAL(got, "victim");
	CU_ASSERT_EQUAL_FATAL(lstat(final, &st), 0);
	CU_ASSERT_TRUE(S_ISREG(st.st_mode));
	CU_ASSERT_EQUAL(st.st_mode & 07777, 0600);
	CU_ASSERT_EQUAL(lstat(tmpname, &st), -1);
	CU_ASSERT_EQUAL(check_model(final, SHARD_ELEMS), 0);
}

static void test_writer_makes_no_parents(void)
{
	struct rps__ckpt_header h = hdr_of(3, 4);
	struct rps__ckpt_writer *w = NULL;
	char deep[600], top[600];
	struct stat st;

	snprintf(top, sizeof(top), "%s/a", base);
	snprintf(deep, sizeof(deep), "%s/a/b/c", base);
	CU_ASSERT_EQUAL(rps__ckpt_create(deep, &h, 1, &w), -ENOENT);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "its parent does not exist"));
	CU_ASSERT_EQUAL(stat(top, &st), -1);
	/* the last component is made, private */
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_create(dir, &h, 1, &w), 0);
	rps__ckpt_abort(w);
	CU_ASSERT_EQUAL_FATAL(stat(dir, &st), 0);
	CU_ASSERT_EQUAL(st.st_mode & 07777, 0700);
}

static void test_open_errors(void)
{
	struct rps__ckpt_reader *r;
	char path[512];

	snprintf(path, sizeof(path), "%s/member-1.rpsck", base);
	CU_ASSERT_EQUAL(rps__ckpt_open(path, &r, NULL), -ENOENT);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), path));
	CU_ASSERT_EQUAL(rps__ckpt_open(base, &r, NULL), -EINVAL);	/* a directory */
}

/* ---- names under a --checkpoint-dir ---------------------------------------- */

static void test_name_check(void)
{
	static const char *const good[] = { "a", "run1", "run1/step-1000", "A.b_c-9/x.y/z", ".hidden", "a..b" };
	static const char *const bad[] = { "", "/", "/abs", "/tmp/x", ".", "..", "../x", "a/..", "a/../../x",
					   "a/./b", "a//b", "a/", "a b", "a\\b", "a:b", "a\nb", "\xc3\xa9" };
	char longest[RPS__CKPT_NAME_MAX + 2];
	size_t i;

	for (i = 0; i < RPS__ARRAY_SIZE(good); i++)
		CU_ASSERT_EQUAL(rps__ckpt_name_check(good[i]), 0);
	for (i = 0; i < RPS__ARRAY_SIZE(bad); i++) {
		if (rps__ckpt_name_check(bad[i]) != -EINVAL)
			fprintf(stderr, "name '%s' not refused\n", bad[i]);
		CU_ASSERT_EQUAL(rps__ckpt_name_check(bad[i]), -EINVAL);
		CU_ASSERT(strncmp(rps__errbuf(), "checkpoint name", 15) == 0);
		CU_ASSERT(strchr(rps__errbuf(), '\n') == NULL);	/* one line, whatever the name held */
	}
	CU_ASSERT_EQUAL(rps__ckpt_name_check(NULL), -EINVAL);
	memset(longest, 'a', sizeof(longest));
	longest[RPS__CKPT_NAME_MAX] = '\0';
	CU_ASSERT_EQUAL(rps__ckpt_name_check(longest), 0);
	longest[RPS__CKPT_NAME_MAX] = 'a';
	longest[RPS__CKPT_NAME_MAX + 1] = '\0';
	CU_ASSERT_EQUAL(rps__ckpt_name_check(longest), -EINVAL);
}

/* Directories made under the base, 0700 whatever the umask; links never
 * followed, not even to make a directory where they point. */
static void test_name_open(void)
{
	char outside[512], path[600];
	struct stat st;
	mode_t old;
	int bfd, fd;

	snprintf(outside, sizeof(outside), "%s/outside", base);
	CU_ASSERT_EQUAL_FATAL(mkdir(outside, 0700), 0);
	CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
	bfd = open(dir, O_RDONLY | O_DIRECTORY);
	CU_ASSERT_FATAL(bfd >= 0);

	old = umask(0277);
	fd = rps__ckpt_name_open(bfd, "run/step1", true);
	umask(old);
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	snprintf(path, sizeof(path), "%s/run", dir);
	CU_ASSERT(stat(path, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700);
	snprintf(path, sizeof(path), "%s/run/step1", dir);
	CU_ASSERT(stat(path, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700);
	fd = rps__ckpt_name_open(bfd, "run/step1", false);	/* there now */
	CU_ASSERT(fd >= 0);
	if (fd >= 0)
		close(fd);
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "run/step2", false), -ENOENT);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "no such checkpoint: 'run/step2'"));
	snprintf(path, sizeof(path), "%s/run/step2", dir);
	CU_ASSERT_EQUAL(lstat(path, &st), -1);			/* not made */
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "../x", true), -EINVAL);

	/* a link, as the whole name or on the way: -ELOOP, nothing made beyond it */
	snprintf(path, sizeof(path), "%s/ln", dir);
	CU_ASSERT_EQUAL_FATAL(symlink(outside, path), 0);
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "ln", true), -ELOOP);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "'ln' under --checkpoint-dir is a symbolic link"));
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "ln", false), -ELOOP);
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "ln/x", true), -ELOOP);
	snprintf(path, sizeof(path), "%s/run/ln", dir);
	CU_ASSERT_EQUAL_FATAL(symlink(outside, path), 0);
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "run/ln/x", true), -ELOOP);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "'run/ln'"));
	CU_ASSERT_EQUAL(count_files(outside), 0);
	/* a dangling one too */
	snprintf(path, sizeof(path), "%s/dangling", dir);
	CU_ASSERT_EQUAL_FATAL(symlink("/nonexistent/rps-test", path), 0);
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "dangling", true), -ELOOP);
	/* a file is no directory */
	snprintf(path, sizeof(path), "%s/file", dir);
	spit(path, (const uint8_t *)"x", 1);
	CU_ASSERT_EQUAL(rps__ckpt_name_open(bfd, "file/x", true), -ENOTDIR);
	close(bfd);
}

/* The _at writer and reader: the file 0600 whatever the umask; listing and
 * opening skip and refuse member files that are links. */
static void test_at_variants(void)
{
	struct rps__ckpt_header h = hdr_of(7, SHARD_ELEMS);
	struct rps__ckpt_writer *w;
	struct rps__ckpt_reader *r;
	char path[600], target[600], **names = NULL;
	struct stat st;
	size_t n = 0;
	mode_t old;
	int bfd, fd;

	CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
	bfd = open(dir, O_RDONLY | O_DIRECTORY);
	CU_ASSERT_FATAL(bfd >= 0);
	fd = rps__ckpt_name_open(bfd, "ck", true);
	CU_ASSERT_FATAL(fd >= 0);
	nmodel = 0;
	add_shards(add_tensor("t", 3, 1, 0, 0), SHARD_ELEMS, 0, 0);
	old = umask(0277);
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_create_at(fd, "DIR/ck", &h, 1, &w), 0);
	umask(old);
	CU_ASSERT_EQUAL(rps__ckpt_put_tensor(w, model[0].name, &model[0].spec), 0);
	for (size_t i = 0; i < model[0].nshards; i++) {
		struct rps__ckpt_shard v = view(&model[0].shards[i]);

		CU_ASSERT_EQUAL(rps__ckpt_put_shard(w, &v), 0);
	}
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_finish(w, NULL), 0);
	snprintf(path, sizeof(path), "%s/ck/member-7.rpsck", dir);
	CU_ASSERT_EQUAL_FATAL(lstat(path, &st), 0);
	CU_ASSERT(S_ISREG(st.st_mode));
	CU_ASSERT_EQUAL(st.st_mode & 07777, 0600);
	CU_ASSERT_EQUAL(check_model(path, SHARD_ELEMS), 0);

	/* member-8 a link to a good file elsewhere: neither listed nor opened */
	snprintf(target, sizeof(target), "%s/elsewhere.rpsck", base);
	CU_ASSERT_EQUAL_FATAL(link(path, target), 0);
	snprintf(path, sizeof(path), "%s/ck/member-8.rpsck", dir);
	CU_ASSERT_EQUAL_FATAL(symlink(target, path), 0);
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_list_at(fd, "DIR/ck", &names, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_STRING_EQUAL(names[0], "member-7.rpsck");
	rps__ckpt_free_list(names, n);
	CU_ASSERT_EQUAL(rps__ckpt_open_at(fd, "member-8.rpsck", "DIR/ck/member-8.rpsck", &r, NULL), -ELOOP);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "DIR/ck/member-8.rpsck: a symbolic link"));
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_open_at(fd, "member-7.rpsck", "DIR/ck/member-7.rpsck", &r, &h), 0);
	CU_ASSERT_EQUAL(h.member_id, 7u);
	rps__ckpt_close(r);
	/* the path-based list (rdmapsd --restore DIR, the operator's) still follows it */
	snprintf(path, sizeof(path), "%s/ck", dir);
	CU_ASSERT_EQUAL_FATAL(rps__ckpt_list(path, &names, &n), 0);
	CU_ASSERT_EQUAL(n, 2);
	rps__ckpt_free_list(names, n);
	close(fd);
	close(bfd);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "round trip, levels 0..3, bit-identical", test_round_trip },
		{ "compression only when it pays", test_compression },
		{ "every truncation refused", test_truncation },
		{ "every flipped bit refused", test_bit_flips },
		{ "malformed but checksummed files refused", test_malformed },
		{ "writer refuses bad input", test_writer_refuses },
		{ "abort leaves no file", test_abort },
		{ "list finds exactly the member files", test_list },
		{ "open errors", test_open_errors },
		{ "writer ignores planted symlinks, file 0600", test_writer_ignores_planted_symlinks },
		{ "writer makes no missing parents", test_writer_makes_no_parents },
		{ "checkpoint names: what may be under --checkpoint-dir", test_name_check },
		{ "names opened under the base: 0700, no link followed", test_name_open },
		{ "_at writer and reader: 0600 under any umask, links skipped", test_at_variants },
	};
	const struct cutest_suite suites[] = {
		{ "ckpt", NULL, NULL, setup, teardown, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
