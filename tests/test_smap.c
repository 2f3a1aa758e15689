/*
 * test_smap.c - unit tests of the shard map: bootstrap placement, every
 * command's acceptance and each refusal with its errno (state untouched,
 * applied index moving on), move sequences, both codecs against truncation,
 * flipped bits and garbage, and two replicas fed the same random commands
 * staying byte-identical with the invariants holding at every step.
 */
#include "config.h"
#include "proto/smap.h"
#include "common/common.h"

#define TEST_RNG_SEED 0x5eed5a3a9ull
#include "test_rng.h"
#include "lib/cutest.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const uris3[] = { "tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000", "tcp://10.0.0.3:7000" };

static uint64_t next_index = 1;	/* Raft index for the next apply */

/* ------------------------------------------------------------------------ */
/* helpers */

static struct rps__smap_cmd cmd_add(uint64_t id, const char *uri)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = RPS__SMAP_ADD_MEMBER;
	c.id = id;
	snprintf(c.uri, sizeof(c.uri), "%s", uri);
	return c;
}

static struct rps__smap_cmd cmd_remove(uint64_t id)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = RPS__SMAP_REMOVE_MEMBER;
	c.id = id;
	return c;
}

static struct rps__smap_cmd cmd_begin(uint32_t part, uint64_t from, uint64_t to, uint64_t epoch)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = RPS__SMAP_MOVE_BEGIN;
	c.part = part;
	c.from = from;
	c.to = to;
	c.epoch = epoch;
	return c;
}

static struct rps__smap_cmd cmd_commit(uint32_t part, uint64_t to, uint64_t epoch)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = RPS__SMAP_MOVE_COMMIT;
	c.part = part;
	c.to = to;
	c.epoch = epoch;
	return c;
}

static struct rps__smap_cmd cmd_abort(uint32_t part, uint64_t epoch)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = RPS__SMAP_MOVE_ABORT;
	c.part = part;
	c.epoch = epoch;
	return c;
}

/* Apply c at the next index and expect it to be accepted. */
static void accept_cmd(struct rps__smap *m, struct rps__smap_cmd c)
{
	uint64_t index = next_index++;

	CU_ASSERT_EQUAL(rps__smap_check(m, &c), 0);
	CU_ASSERT_EQUAL(rps__smap_apply(m, index, &c), 0);
	CU_ASSERT_EQUAL(m->applied, index);
}

/* Apply c at the next index and expect refusal with err: the state is
 * untouched but for the applied index, and a message says why. */
static void refuse_cmd(struct rps__smap *m, struct rps__smap_cmd c, int err)
{
	static struct rps__smap before;
	uint64_t index = next_index++;

	memcpy(&before, m, sizeof(before));
	rps__clearerr();
	CU_ASSERT_EQUAL(rps__smap_check(m, &c), err);
	CU_ASSERT(rps__errbuf()[0] != '\0');
	CU_ASSERT(strchr(rps__errbuf(), '\n') == NULL);
	rps__clearerr();
	CU_ASSERT_EQUAL(rps__smap_apply(m, index, &c), err);
	CU_ASSERT(rps__errbuf()[0] != '\0');
	CU_ASSERT_EQUAL(m->applied, index);
	before.applied = index;
	CU_ASSERT_EQUAL(memcmp(&before, m, sizeof(before)), 0);
}

static bool all_zero(const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

static bool is_member(const struct rps__smap *m, uint64_t id)
{
	return rps__smap_member(m, id) != NULL;
}

/* NULL if every invariant of a map holds, else which one does not. */
static const char *invariant_broken(const struct rps__smap *m)
{
	if (m->npart < 1 || m->npart > RPS__SMAP_MAX_PART)
		return "npart out of range";
	if (m->nmembers < 1 || m->nmembers > RPS__SMAP_MAX_MEMBERS)
		return "nmembers out of range";
	for (uint32_t i = 0; i < m->nmembers; i++) {
		const struct rps__smap_member *mb = &m->members[i];
		size_t len = strnlen(mb->uri, sizeof(mb->uri));

		if (mb->id == 0 || mb->id > m->max_id)
			return "member id outside 1..max_id";
		if (i && mb->id <= m->members[i - 1].id)
			return "members not sorted by id";
		if (len == 0 || len == sizeof(mb->uri))
			return "member uri empty or unterminated";
		if (!all_zero(mb->uri + len, sizeof(mb->uri) - len))
			return "bytes after a uri not zero";
		for (uint32_t j = 0; j < i; j++)
			if (strcmp(mb->uri, m->members[j].uri) == 0)
				return "two members share a uri";
	}
	if (!all_zero(&m->members[m->nmembers], (RPS__SMAP_MAX_MEMBERS - m->nmembers) * sizeof(m->members[0])))
		return "unused member slots not zero";
	for (uint32_t p = 0; p < m->npart; p++) {
		const struct rps__smap_part *pt = &m->parts[p];

		if (!is_member(m, pt->owner))
			return "partition owned by a non-member";
		if (pt->epoch == 0)
			return "partition epoch 0";
		if (pt->moving_to && (pt->moving_to == pt->owner || !is_member(m, pt->moving_to)))
			return "partition moving to its owner or a non-member";
		if (rps__smap_is_witness(m, pt->owner) || rps__smap_is_witness(m, pt->moving_to) ||
		    rps__smap_is_witness(m, pt->joining) || rps__smap_is_witness(m, pt->backups[0]) ||
		    rps__smap_is_witness(m, pt->backups[1]))
			return "a witness holds a replica of a partition";
		for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++) {
			uint64_t b = pt->backups[k];

			if (!b) {
				if (!all_zero(&pt->backups[k], (RPS__SMAP_MAX_REPLICAS - 1 - k) * 8))
					return "a gap in the backups";
				break;
			}
			/* (the move's target may be a backup: a planned switch) */
			if (!is_member(m, b) || b == pt->owner || b == pt->joining)
				return "a backup that is no member, the owner or the seeding's target";
			for (uint32_t j = 0; j < k; j++)
				if (pt->backups[j] == b)
					return "a backup twice";
		}
		if (pt->joining && (pt->joining == pt->owner || !is_member(m, pt->joining)))
			return "seeding the owner or a non-member";
	}
	if (m->replicas < 1 || m->replicas > RPS__SMAP_MAX_REPLICAS)
		return "replication target out of range";
	if (!all_zero(&m->parts[m->npart], (RPS__SMAP_MAX_PART - m->npart) * sizeof(m->parts[0])))
		return "unused partition slots not zero";
	return NULL;
}

static void init3(struct rps__smap *m, uint32_t npart)
{
	memset(m, 0xa5, sizeof(*m));	/* init must not depend on what was there */
	CU_ASSERT_FATAL(rps__smap_init(m, uris3, 3, npart) == 0);
}

/* Recompute the trailing crc32c of an encoded map after a test edited it. */
static void reseal(uint8_t *buf, size_t len)
{
	uint32_t crc = crc32_iscsi(buf, (int)(len - 4), 0xffffffffu);

	for (int i = 0; i < 4; i++)
		buf[len - 4 + i] = (uint8_t)(crc >> (8 * i));
}

/* Decode from a heap copy of exactly len bytes, so that valgrind sees any
 * read past the end. */
static int decode_exact(const uint8_t *buf, size_t len, struct rps__smap *m)
{
	uint8_t *copy = malloc(len ? len : 1);
	int rc;

	CU_ASSERT_FATAL(copy != NULL);
	memcpy(copy, buf, len);
	rc = rps__smap_decode(copy, len, m);
	free(copy);
	return rc;
}

static int cmd_decode_exact(const uint8_t *buf, size_t len, struct rps__smap_cmd *c)
{
	uint8_t *copy = malloc(len ? len : 1);
	int rc;

	CU_ASSERT_FATAL(copy != NULL);
	memcpy(copy, buf, len);
	rc = rps__smap_cmd_decode(copy, len, c);
	free(copy);
	return rc;
}

/* What a FILE-printing function wrote, NUL-terminated, in a static buffer. */
static const char *capture(void (*fn)(const struct rps__smap *, FILE *), const struct rps__smap *m)
{
	static char out[65536];
	FILE *f = tmpfile();
	size_t n;

	CU_ASSERT_FATAL(f != NULL);
	fn(m, f);
	rewind(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	fclose(f);
	return out;
}

/* ------------------------------------------------------------------------ */
/* bootstrap and queries */

static void test_init(void)
{
	static struct rps__smap m, m40;
	static char names[RPS__SMAP_MAX_MEMBERS + 1][32];
	static const char *most[RPS__SMAP_MAX_MEMBERS + 1];
	char longuri[RPS__SMAP_URI_MAX + 1];
	const char *bad[2];

	for (uint32_t i = 0; i <= RPS__SMAP_MAX_MEMBERS; i++) {
		snprintf(names[i], sizeof(names[i]), "tcp://h%u:1", i + 1);
		most[i] = names[i];
	}

	init3(&m, 0);
	CU_ASSERT_EQUAL(m.npart, RPS__SMAP_DEFAULT_PART);
	/* the default scales with the members at bootstrap: 4 each, a power of two */
	CU_ASSERT_EQUAL(rps__smap_default_partitions(1), 64u);
	CU_ASSERT_EQUAL(rps__smap_default_partitions(16), 64u);
	CU_ASSERT_EQUAL(rps__smap_default_partitions(17), 128u);
	CU_ASSERT_EQUAL(rps__smap_default_partitions(32), 128u);
	CU_ASSERT_EQUAL(rps__smap_default_partitions(33), 256u);
	CU_ASSERT_EQUAL(rps__smap_default_partitions(RPS__SMAP_MAX_MEMBERS), RPS__SMAP_MAX_PART);
	CU_ASSERT_EQUAL_FATAL(rps__smap_init(&m40, most, 40, 0), 0);
	CU_ASSERT_EQUAL(m40.npart, 256u);
	for (uint32_t i = 0, owned; i < 40; i++) {	/* every member primary of 6 or 7 */
		owned = 0;
		for (uint32_t p = 0; p < m40.npart; p++)
			owned += m40.parts[p].owner == i + 1;
		CU_ASSERT(owned == 6 || owned == 7);
	}
	CU_ASSERT_EQUAL(m.nmembers, 3);
	CU_ASSERT_EQUAL(m.max_id, 3);
	CU_ASSERT_EQUAL(m.applied, 0);
	for (uint32_t i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(m.members[i].id, i + 1);
		CU_ASSERT_STRING_EQUAL(m.members[i].uri, uris3[i]);
		CU_ASSERT_PTR_EQUAL(rps__smap_member(&m, i + 1), &m.members[i]);
	}
	for (uint32_t p = 0; p < m.npart; p++) {
		CU_ASSERT_EQUAL(m.parts[p].owner, p % 3 + 1);
		CU_ASSERT_EQUAL(m.parts[p].epoch, 1);
		CU_ASSERT_EQUAL(m.parts[p].moving_to, 0);
	}
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	CU_ASSERT_PTR_NULL(rps__smap_member(&m, 0));
	CU_ASSERT_PTR_NULL(rps__smap_member(&m, 4));
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 1), 22);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 2), 21);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 21);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 4), 0);

	/* the limits themselves are fine */
	CU_ASSERT_EQUAL(rps__smap_init(&m, uris3, 1, 1), 0);
	CU_ASSERT_EQUAL(m.npart, 1);
	CU_ASSERT_EQUAL(m.parts[0].owner, 1);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	CU_ASSERT_EQUAL(rps__smap_init(&m, most, RPS__SMAP_MAX_MEMBERS, RPS__SMAP_MAX_PART), 0);
	CU_ASSERT_EQUAL(m.nmembers, RPS__SMAP_MAX_MEMBERS);
	CU_ASSERT_EQUAL(m.parts[RPS__SMAP_MAX_PART - 1].owner, (RPS__SMAP_MAX_PART - 1) % RPS__SMAP_MAX_MEMBERS + 1);
	CU_ASSERT_EQUAL(m.parts[RPS__SMAP_MAX_MEMBERS + 1].owner, 2);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	{	/* the largest map fits what workers READ it from */
		static char enc[RPS__SMAP_ENC_MAX];
		static struct rps__smap back;
		size_t len = 0;

		for (uint32_t i = 0; i < m.nmembers; i++) {
			/* the longest URIs and zones a member may have */
			int n = snprintf(m.members[i].uri, RPS__SMAP_URI_MAX, "tcp://h%u", i);

			memset(m.members[i].uri + n, 'h', RPS__SMAP_URI_MAX - 1 - (size_t)n - 6);
			memcpy(m.members[i].uri + RPS__SMAP_URI_MAX - 7, ":65535", 7);
			memset(m.members[i].zone, 'z', RPS__SMAP_ZONE_MAX - 1);
			m.members[i].zone[RPS__SMAP_ZONE_MAX - 1] = '\0';
		}
		m.replicas = RPS__SMAP_MAX_REPLICAS;
		for (uint32_t p = 0; p < m.npart; p++)
			for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++)
				m.parts[p].backups[k] = (p + k + 1) % RPS__SMAP_MAX_MEMBERS + 1;
		CU_ASSERT_EQUAL(rps__smap_encode(&m, enc, sizeof(enc), &len), 0);
		CU_ASSERT(len <= RPS__SMAP_ENC_MAX);
		CU_ASSERT_EQUAL(len, rps__smap_encoded_size(&m));
		CU_ASSERT_EQUAL(strlen(m.members[0].uri), RPS__SMAP_URI_MAX - 1);
		int dret = rps__smap_decode(enc, len, &back);

		if (dret)
			fprintf(stderr, "%s\n", rps__errbuf());
		CU_ASSERT_EQUAL(dret, 0);
		CU_ASSERT_EQUAL(back.nmembers, RPS__SMAP_MAX_MEMBERS);
		CU_ASSERT_EQUAL(memcmp(back.parts, m.parts, sizeof(m.parts)), 0);
	}

	/* out of range: refused, message set */
	rps__clearerr();
	CU_ASSERT_EQUAL(rps__smap_init(&m, uris3, 0, 8), -EINVAL);
	CU_ASSERT(rps__errbuf()[0] != '\0');
	CU_ASSERT_EQUAL(rps__smap_init(&m, most, RPS__SMAP_MAX_MEMBERS + 1, 8), -EINVAL);
	CU_ASSERT_EQUAL(rps__smap_init(&m, uris3, 3, RPS__SMAP_MAX_PART + 1), -EINVAL);
	CU_ASSERT_EQUAL(rps__smap_init(&m, NULL, 3, 8), -EINVAL);
	memset(longuri, 'a', RPS__SMAP_URI_MAX);
	longuri[RPS__SMAP_URI_MAX] = '\0';
	bad[0] = uris3[0];
	bad[1] = longuri;
	CU_ASSERT_EQUAL(rps__smap_init(&m, bad, 2, 8), -EINVAL);
	longuri[RPS__SMAP_URI_MAX - 1] = '\0';	/* 127 bytes: fits */
	CU_ASSERT_EQUAL(rps__smap_init(&m, bad, 2, 8), 0);
	CU_ASSERT_STRING_EQUAL(m.members[1].uri, longuri);
	bad[1] = "";
	CU_ASSERT_EQUAL(rps__smap_init(&m, bad, 2, 8), -EINVAL);
	bad[1] = NULL;
	CU_ASSERT_EQUAL(rps__smap_init(&m, bad, 2, 8), -EINVAL);
	bad[1] = uris3[0];
	CU_ASSERT_EQUAL(rps__smap_init(&m, bad, 2, 8), -EINVAL);

	/* two inits of the same cluster over different garbage: identical */
	{
		static struct rps__smap a, b;

		memset(&a, 0x00, sizeof(a));
		memset(&b, 0xff, sizeof(b));
		CU_ASSERT_EQUAL(rps__smap_init(&a, uris3, 3, 10), 0);
		CU_ASSERT_EQUAL(rps__smap_init(&b, uris3, 3, 10), 0);
		CU_ASSERT_EQUAL(memcmp(&a, &b, sizeof(a)), 0);
	}
}

static void test_part_of(void)
{
	static struct rps__smap m;

	init3(&m, 64);
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, 0, 0), 0);
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, 5, 3), 8);
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, 63, 1), 0);
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, 100, 0), 36);
	/* no 32-bit overflow: (2^32 - 1) * 2 = 2^33 - 2 = -2 mod 64 */
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, UINT32_MAX, UINT32_MAX), 62);
	init3(&m, 7);
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, UINT32_MAX, UINT32_MAX), (uint32_t)(8589934590ull % 7));
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, 10, 4), 0);
	for (uint32_t s = 0; s < 20; s++)
		CU_ASSERT_EQUAL(rps__smap_part_of(&m, 3, s), (3 + s) % 7);
	init3(&m, 1);
	CU_ASSERT_EQUAL(rps__smap_part_of(&m, 12345, 678), 0);
}

/* ------------------------------------------------------------------------ */
/* membership */

static void test_add_member(void)
{
	static struct rps__smap m;
	char longuri[RPS__SMAP_URI_MAX];
	struct rps__smap_cmd c;

	init3(&m, 8);
	accept_cmd(&m, cmd_add(4, "tcp://10.0.0.4:7000"));
	CU_ASSERT_EQUAL(m.nmembers, 4);
	CU_ASSERT_EQUAL(m.max_id, 4);
	CU_ASSERT_EQUAL(m.members[3].id, 4);
	CU_ASSERT_STRING_EQUAL(rps__smap_member(&m, 4)->uri, "tcp://10.0.0.4:7000");
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 4), 0);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* ids may skip */
	accept_cmd(&m, cmd_add(10, "verbs://192.168.1.1:7000"));
	CU_ASSERT_EQUAL(m.max_id, 10);
	CU_ASSERT_EQUAL(m.members[4].id, 10);

	refuse_cmd(&m, cmd_add(10, "tcp://elsewhere:1"), -EEXIST);	/* duplicate id */
	refuse_cmd(&m, cmd_add(10, "verbs://192.168.1.1:7000"), -EEXIST);	/* duplicate command */
	refuse_cmd(&m, cmd_add(2, "tcp://new:1"), -EEXIST);		/* a current member */
	refuse_cmd(&m, cmd_add(7, "tcp://new:1"), -EINVAL);		/* <= max_id, never used */
	refuse_cmd(&m, cmd_add(0, "tcp://new:1"), -EINVAL);
	refuse_cmd(&m, cmd_add(11, ""), -EINVAL);
	refuse_cmd(&m, cmd_add(11, "tcp://10.0.0.1:7000"), -EEXIST);	/* uri taken */
	c = cmd_add(11, "x");
	memset(c.uri, 'u', sizeof(c.uri));				/* unterminated */
	refuse_cmd(&m, c, -EINVAL);
	memset(longuri, 'u', sizeof(longuri) - 1);
	longuri[sizeof(longuri) - 1] = '\0';
	refuse_cmd(&m, cmd_add(11, longuri), -EINVAL);			/* 127 bytes, no address */
	memcpy(longuri, "tcp://", 6);
	memcpy(longuri + sizeof(longuri) - 3, ":1", 2);
	accept_cmd(&m, cmd_add(11, longuri));				/* 127 bytes fit */
	CU_ASSERT_STRING_EQUAL(rps__smap_member(&m, 11)->uri, longuri);

	/* fill the table */
	for (uint64_t id = 12; m.nmembers < RPS__SMAP_MAX_MEMBERS; id++) {
		char uri[64];

		snprintf(uri, sizeof(uri), "tcp://fill%llu:1", (unsigned long long)id);
		accept_cmd(&m, cmd_add(id, uri));
	}
	CU_ASSERT_EQUAL(m.nmembers, RPS__SMAP_MAX_MEMBERS);
	refuse_cmd(&m, cmd_add(m.max_id + 1, "tcp://onemore:1"), -ENOSPC);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* unknown command types */
	c = cmd_add(100, "tcp://z:1");
	c.type = 0;
	refuse_cmd(&m, c, -EINVAL);
	c.type = RPS__SMAP_CMD_LAST + 1;
	refuse_cmd(&m, c, -EINVAL);
	/* a no-op moves nothing but applied */
	c.type = RPS__SMAP_NOP;
	{
		static struct rps__smap before;
		before = m;
		CU_ASSERT_EQUAL(rps__smap_check(&m, &c), 0);
		CU_ASSERT_EQUAL(rps__smap_apply(&m, next_index++, &c), 0);
		before.applied = m.applied;
		CU_ASSERT_EQUAL(memcmp(&before, &m, sizeof(m)), 0);
	}
	c.type = UINT32_MAX;
	refuse_cmd(&m, c, -EINVAL);
}

/* ADD_MEMBER with an address no member could be dialed at is refused when
 * applied (not only when psctl proposes it): the map stays as it was. */
static void test_add_member_bad_uri(void)
{
	static struct rps__smap m, before;
	static const char *const bad[] = {
		"10.0.0.4:7000", "http://h:1", "tcp://", "tcp://h", "tcp://h:", "tcp://:7000", "tcp://h:0",
		"tcp://h:65536", "tcp://h:99999999", "tcp://h:7a", "tcp://h:-1", "tcp://h: 7", " tcp://h:7",
		"tcp://a b:7", "tcp://h:7\n", "tcp://[::1]", "tcp://[]:7", "tcp://[::1:7", "tcp://a:b:7",
		"verbs://h/x:7", "TCP://h:7", "tcp://h:7\x7f",
	};
	static const char *const good[] = { "tcp://h:1", "tcp://[::1]:65535", "verbs://10.0.0.9:7000" };
	uint64_t id = 4;
	size_t i;

	init3(&m, 8);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct rps__smap_cmd c = cmd_add(id, bad[i]);

		CU_ASSERT_FALSE(rps__smap_uri_ok(bad[i]));
		before = m;
		CU_ASSERT_EQUAL(rps__smap_apply(&m, next_index, &c), -EINVAL);
		if (!strstr(rps__errbuf(), "bad address"))
			fprintf(stderr, "'%s': %s\n", bad[i], rps__errbuf());
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "bad address"));
		CU_ASSERT_EQUAL(m.applied, next_index);
		next_index++;
		before.applied = m.applied;
		CU_ASSERT_EQUAL(memcmp(&before, &m, sizeof(m)), 0);	/* nothing else changed */
	}
	CU_ASSERT_EQUAL(m.nmembers, 3);
	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		CU_ASSERT_TRUE(rps__smap_uri_ok(good[i]));
		accept_cmd(&m, cmd_add(id++, good[i]));
	}
	CU_ASSERT_EQUAL(m.nmembers, 6);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
}

static void test_remove_member(void)
{
	static struct rps__smap m;

	init3(&m, 6);
	accept_cmd(&m, cmd_add(4, "tcp://d:1"));
	accept_cmd(&m, cmd_add(5, "tcp://e:1"));
	accept_cmd(&m, cmd_add(6, "tcp://f:1"));
	/* remove from the middle: the rest shift down, the freed slot is zero */
	accept_cmd(&m, cmd_remove(5));
	CU_ASSERT_EQUAL(m.nmembers, 5);
	CU_ASSERT_EQUAL(m.members[3].id, 4);
	CU_ASSERT_EQUAL(m.members[4].id, 6);
	CU_ASSERT_STRING_EQUAL(m.members[4].uri, "tcp://f:1");
	CU_ASSERT(all_zero(&m.members[5], sizeof(m.members[5])));
	CU_ASSERT_EQUAL(m.max_id, 6);
	CU_ASSERT_PTR_NULL(rps__smap_member(&m, 5));
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	refuse_cmd(&m, cmd_remove(5), -ENOENT);		/* duplicate */
	refuse_cmd(&m, cmd_remove(99), -ENOENT);
	refuse_cmd(&m, cmd_remove(0), -EINVAL);
	refuse_cmd(&m, cmd_add(5, "tcp://e:1"), -EINVAL);	/* ids never reused */
	accept_cmd(&m, cmd_add(7, "tcp://e:1"));		/* its uri may be */

	/* owners and move targets stay */
	refuse_cmd(&m, cmd_remove(1), -EBUSY);
	refuse_cmd(&m, cmd_remove(3), -EBUSY);
	accept_cmd(&m, cmd_begin(0, 1, 4, 1));
	refuse_cmd(&m, cmd_remove(4), -EBUSY);		/* target of a move */
	accept_cmd(&m, cmd_abort(0, 1));
	accept_cmd(&m, cmd_remove(4));

	/* member 3 owns partitions 2 and 5: move them away, then it can go */
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 2);
	accept_cmd(&m, cmd_begin(2, 3, 1, 1));
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 2);	/* a move still counts for the owner */
	refuse_cmd(&m, cmd_remove(3), -EBUSY);
	accept_cmd(&m, cmd_commit(2, 1, 1));
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 1);
	refuse_cmd(&m, cmd_remove(3), -EBUSY);
	accept_cmd(&m, cmd_begin(5, 3, 6, 1));
	accept_cmd(&m, cmd_commit(5, 6, 1));
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 0);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 6), 1);
	accept_cmd(&m, cmd_remove(3));
	CU_ASSERT_PTR_NULL(rps__smap_member(&m, 3));
	CU_ASSERT_EQUAL(m.nmembers, 4);
	CU_ASSERT_EQUAL(m.members[0].id, 1);
	CU_ASSERT_EQUAL(m.members[1].id, 2);
	CU_ASSERT_EQUAL(m.members[2].id, 6);
	CU_ASSERT_EQUAL(m.members[3].id, 7);
	CU_ASSERT(all_zero(&m.members[4], sizeof(m.members) - 4 * sizeof(m.members[0])));
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	refuse_cmd(&m, cmd_begin(0, 1, 3, 1), -ENOENT);	/* 3 is gone */
}

/* ------------------------------------------------------------------------ */
/* moves */

static void test_move_commit(void)
{
	static struct rps__smap m;

	init3(&m, 16);
	/* partition 7 is member 2's (7 mod 3 + 1) */
	refuse_cmd(&m, cmd_begin(7, 1, 3, 1), -ESTALE);	/* not the owner */
	refuse_cmd(&m, cmd_begin(7, 2, 3, 2), -ESTALE);	/* future epoch */
	refuse_cmd(&m, cmd_begin(7, 2, 3, 0), -ESTALE);
	refuse_cmd(&m, cmd_begin(7, 2, 2, 1), -EINVAL);	/* to == from */
	refuse_cmd(&m, cmd_begin(7, 2, 9, 1), -ENOENT);	/* not a member */
	refuse_cmd(&m, cmd_begin(7, 2, 0, 1), -ENOENT);
	refuse_cmd(&m, cmd_begin(16, 2, 3, 1), -ENOENT);	/* no such partition */
	refuse_cmd(&m, cmd_begin(UINT32_MAX, 2, 3, 1), -ENOENT);
	refuse_cmd(&m, cmd_commit(7, 3, 1), -ESTALE);		/* nothing in progress */
	refuse_cmd(&m, cmd_commit(7, 0, 1), -ESTALE);
	refuse_cmd(&m, cmd_abort(7, 1), -ESTALE);

	accept_cmd(&m, cmd_begin(7, 2, 3, 1));
	CU_ASSERT_EQUAL(m.parts[7].owner, 2);
	CU_ASSERT_EQUAL(m.parts[7].epoch, 1);
	CU_ASSERT_EQUAL(m.parts[7].moving_to, 3);
	refuse_cmd(&m, cmd_begin(7, 2, 3, 1), -EBUSY);	/* duplicate BEGIN */
	refuse_cmd(&m, cmd_begin(7, 2, 1, 1), -EBUSY);	/* another destination */
	refuse_cmd(&m, cmd_commit(7, 1, 1), -ESTALE);		/* wrong destination */
	refuse_cmd(&m, cmd_commit(7, 3, 2), -ESTALE);		/* wrong epoch */
	refuse_cmd(&m, cmd_commit(8, 3, 1), -ESTALE);		/* another partition */
	refuse_cmd(&m, cmd_commit(16, 3, 1), -ENOENT);
	refuse_cmd(&m, cmd_abort(7, 2), -ESTALE);

	accept_cmd(&m, cmd_commit(7, 3, 1));
	CU_ASSERT_EQUAL(m.parts[7].owner, 3);
	CU_ASSERT_EQUAL(m.parts[7].epoch, 2);
	CU_ASSERT_EQUAL(m.parts[7].moving_to, 0);
	refuse_cmd(&m, cmd_commit(7, 3, 1), -ESTALE);		/* duplicate COMMIT */
	refuse_cmd(&m, cmd_abort(7, 1), -ESTALE);		/* ABORT after COMMIT */
	refuse_cmd(&m, cmd_abort(7, 2), -ESTALE);
	refuse_cmd(&m, cmd_begin(7, 2, 3, 1), -ESTALE);	/* replayed BEGIN */
	refuse_cmd(&m, cmd_begin(7, 2, 1, 2), -ESTALE);	/* the old owner */
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 2), 4);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 6);
	/* the neighbours never moved */
	CU_ASSERT_EQUAL(m.parts[6].owner, 1);
	CU_ASSERT_EQUAL(m.parts[6].epoch, 1);
	CU_ASSERT_EQUAL(m.parts[8].owner, 3);
	CU_ASSERT_EQUAL(m.parts[8].epoch, 1);

	/* and back again */
	accept_cmd(&m, cmd_begin(7, 3, 2, 2));
	accept_cmd(&m, cmd_commit(7, 2, 2));
	CU_ASSERT_EQUAL(m.parts[7].owner, 2);
	CU_ASSERT_EQUAL(m.parts[7].epoch, 3);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
}

static void test_move_abort(void)
{
	static struct rps__smap m;

	init3(&m, 16);
	accept_cmd(&m, cmd_begin(4, 2, 1, 1));
	accept_cmd(&m, cmd_abort(4, 1));
	CU_ASSERT_EQUAL(m.parts[4].owner, 2);
	CU_ASSERT_EQUAL(m.parts[4].epoch, 1);
	CU_ASSERT_EQUAL(m.parts[4].moving_to, 0);
	refuse_cmd(&m, cmd_abort(4, 1), -ESTALE);		/* duplicate ABORT */
	refuse_cmd(&m, cmd_commit(4, 1, 1), -ESTALE);		/* COMMIT after ABORT */
	CU_ASSERT_EQUAL(m.parts[4].owner, 2);

	/* the partition can move again at the same epoch, elsewhere */
	accept_cmd(&m, cmd_begin(4, 2, 3, 1));
	refuse_cmd(&m, cmd_commit(4, 1, 1), -ESTALE);		/* the aborted move's COMMIT */
	accept_cmd(&m, cmd_commit(4, 3, 1));
	CU_ASSERT_EQUAL(m.parts[4].owner, 3);
	CU_ASSERT_EQUAL(m.parts[4].epoch, 2);
	refuse_cmd(&m, cmd_abort(4, 1), -ESTALE);

	/* several partitions moving at once are independent */
	accept_cmd(&m, cmd_begin(0, 1, 2, 1));
	accept_cmd(&m, cmd_begin(1, 2, 3, 1));
	accept_cmd(&m, cmd_begin(2, 3, 1, 1));
	accept_cmd(&m, cmd_abort(1, 1));
	accept_cmd(&m, cmd_commit(2, 1, 1));
	accept_cmd(&m, cmd_commit(0, 2, 1));
	CU_ASSERT_EQUAL(m.parts[0].owner, 2);
	CU_ASSERT_EQUAL(m.parts[1].owner, 2);
	CU_ASSERT_EQUAL(m.parts[2].owner, 1);
	CU_ASSERT_EQUAL(m.parts[0].epoch, 2);
	CU_ASSERT_EQUAL(m.parts[1].epoch, 1);
	CU_ASSERT_EQUAL(m.parts[2].epoch, 2);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* the last usable epoch cannot start a move that would reach EPOCH_MOVED */
	m.parts[9].epoch = RPS__EPOCH_MOVED - 1;
	refuse_cmd(&m, cmd_begin(9, 1, 2, RPS__EPOCH_MOVED - 1), -EOVERFLOW);
}

static struct rps__smap_cmd cmd_lost(uint32_t type, uint32_t part, uint64_t from, uint64_t epoch)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = type;
	c.part = part;
	c.from = from;
	c.epoch = epoch;
	return c;
}

/* A partition whose contents were lost is marked so by its owner, refuses
 * moves until restored or forgotten, and a forced removal hands a dead
 * member's partitions to the others marked lost. */
static void test_lost_partitions(void)
{
	static struct rps__smap m, d;
	static uint8_t buf[RPS__SMAP_ENC_MAX];
	struct rps__smap_cmd c;
	size_t len = 0;
	uint32_t p;

	init3(&m, 8);		/* partition p owned by p % 3 + 1 */
	refuse_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 1, 1, 1), -ESTALE);	/* not its owner */
	refuse_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 1, 2, 7), -ESTALE);	/* stale epoch */
	refuse_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 99, 2, 1), -ENOENT);
	refuse_cmd(&m, cmd_lost(RPS__SMAP_CLEAR_LOST, 1, 0, 1), -ESTALE);	/* not lost */
	accept_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 1, 2, 1));
	CU_ASSERT_EQUAL(m.parts[1].lost, 2);
	CU_ASSERT_EQUAL(m.parts[1].owner, 2);
	CU_ASSERT_EQUAL(rps__smap_nlost(&m), 1);
	refuse_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 1, 2, 1), -EALREADY);
	refuse_cmd(&m, cmd_begin(1, 2, 3, 1), -ENODATA);		/* nothing to move */
	/* a lost map is version 2 and round-trips */
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(buf[4], 2);
	CU_ASSERT_EQUAL(len, rps__smap_encoded_size(&m));
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &d, sizeof(m)), 0);
	CU_ASSERT_EQUAL(decode_exact(buf, len - 1, &d), -EBADMSG);
	refuse_cmd(&m, cmd_lost(RPS__SMAP_CLEAR_LOST, 1, 0, 2), -ESTALE);
	accept_cmd(&m, cmd_lost(RPS__SMAP_CLEAR_LOST, 1, 0, 1));
	CU_ASSERT_EQUAL(m.parts[1].lost, 0);
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(buf[4], 1);		/* nothing lost: readable by older builds */

	/* member 2 is dead with a move of its own and one into it under way */
	accept_cmd(&m, cmd_begin(4, 2, 3, 1));
	accept_cmd(&m, cmd_begin(0, 1, 2, 1));
	accept_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 7, 2, 1));
	refuse_cmd(&m, cmd_remove(2), -EBUSY);
	memset(&c, 0, sizeof(c));
	c.type = RPS__SMAP_FORCE_REMOVE;
	c.id = 9;
	refuse_cmd(&m, c, -ENOENT);
	c.id = 2;
	accept_cmd(&m, c);
	CU_ASSERT_PTR_NULL(rps__smap_member(&m, 2));
	CU_ASSERT_EQUAL(m.nmembers, 2);
	CU_ASSERT_EQUAL(m.parts[0].owner, 1);		/* the move into it is off */
	CU_ASSERT_EQUAL(m.parts[0].moving_to, 0);
	CU_ASSERT_EQUAL(m.parts[0].lost, 0);
	CU_ASSERT_EQUAL(m.parts[0].epoch, 1);
	/* its partitions 1, 4, 7 go to 1, 3, 1, one epoch on, lost with it */
	CU_ASSERT_EQUAL(m.parts[1].owner, 1);
	CU_ASSERT_EQUAL(m.parts[4].owner, 3);
	CU_ASSERT_EQUAL(m.parts[7].owner, 1);
	for (p = 1; p < 8; p += 3) {
		CU_ASSERT_EQUAL(m.parts[p].lost, 2);
		CU_ASSERT_EQUAL(m.parts[p].moving_to, 0);
		CU_ASSERT_EQUAL(m.parts[p].epoch, 2);
	}
	CU_ASSERT_EQUAL(rps__smap_nlost(&m), 3);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), 0);
	/* the last member cannot be forced out */
	c.id = 3;
	accept_cmd(&m, c);
	c.id = 1;
	refuse_cmd(&m, c, -EBUSY);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 1), 8);
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_FORCE_REMOVE), "FORCE_REMOVE");
}

static void test_messages(void)
{
	static struct rps__smap m;
	struct rps__smap_cmd c;
	char buf[256];

	init3(&m, 16);
	for (uint64_t e = 1; e <= 3; e++) {
		uint64_t from = m.parts[7].owner, to = from % 3 + 1;

		accept_cmd(&m, cmd_begin(7, from, to, e));
		accept_cmd(&m, cmd_commit(7, to, e));
	}
	CU_ASSERT_EQUAL(m.parts[7].epoch, 4);
	CU_ASSERT_EQUAL(rps__smap_check(&m, &(struct rps__smap_cmd){ .type = RPS__SMAP_MOVE_BEGIN, .part = 7,
				       .from = m.parts[7].owner, .to = 1, .epoch = 3 }), -ESTALE);
	CU_ASSERT_STRING_EQUAL(rps__errbuf(), "move partition 7: epoch 3 is stale, the partition is at epoch 4");
	CU_ASSERT_EQUAL(rps__smap_check(&m, &(struct rps__smap_cmd){ .type = RPS__SMAP_REMOVE_MEMBER, .id = 2 }),
			-EBUSY);
	CU_ASSERT(strstr(rps__errbuf(), "remove member 2") != NULL);

	/* a replayed index changes nothing, not even applied */
	{
		static struct rps__smap before;
		uint64_t at = m.applied;

		memcpy(&before, &m, sizeof(m));
		c = cmd_add(4, "tcp://d:1");
		CU_ASSERT_EQUAL(rps__smap_apply(&m, at, &c), -EALREADY);
		CU_ASSERT_EQUAL(rps__smap_apply(&m, at - 1, &c), -EALREADY);
		CU_ASSERT_EQUAL(memcmp(&before, &m, sizeof(m)), 0);
		CU_ASSERT_EQUAL(rps__smap_apply(&m, at + 5, &c), 0);
		CU_ASSERT_EQUAL(m.applied, at + 5);
		next_index = at + 6;
	}

	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_ADD_MEMBER), "ADD_MEMBER");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_REMOVE_MEMBER), "REMOVE_MEMBER");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_MOVE_BEGIN), "MOVE_BEGIN");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_MOVE_COMMIT), "MOVE_COMMIT");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_MOVE_ABORT), "MOVE_ABORT");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(0), "?");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_NOP), "NOP");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_name(RPS__SMAP_CMD_LAST + 1), "?");

	c = cmd_begin(7, 2, 3, 4);
	CU_ASSERT_PTR_EQUAL(rps__smap_cmd_str(&c, buf, sizeof(buf)), buf);
	CU_ASSERT_STRING_EQUAL(buf, "move partition 7 from 2 to 3 (epoch 4)");
	c = cmd_commit(7, 3, 4);
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_str(&c, buf, sizeof(buf)), "commit move of partition 7 to 3 (epoch 4)");
	c = cmd_abort(7, 4);
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_str(&c, buf, sizeof(buf)), "abort move of partition 7 (epoch 4)");
	c = cmd_add(5, "tcp://e:1");
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_str(&c, buf, sizeof(buf)), "add member 5 at tcp://e:1");
	c = cmd_remove(5);
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_str(&c, buf, sizeof(buf)), "remove member 5");
	c.type = 42;
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_str(&c, buf, sizeof(buf)), "unknown shard map command type 42");
	c = cmd_begin(7, 2, 3, 4);
	CU_ASSERT_STRING_EQUAL(rps__smap_cmd_str(&c, buf, 8), "move pa");	/* truncated, terminated */
}

/* ------------------------------------------------------------------------ */
/* map codec */

/* A map with a bit of everything: a removed member, moves, long uri. */
static void busy_map(struct rps__smap *m)
{
	init3(m, 64);
	accept_cmd(m, cmd_add(4, "verbs://[fe80::1]:7000"));
	accept_cmd(m, cmd_add(5, "tcp://five:1"));
	accept_cmd(m, cmd_remove(5));
	accept_cmd(m, cmd_begin(7, 2, 4, 1));
	accept_cmd(m, cmd_begin(8, 3, 4, 1));
	accept_cmd(m, cmd_commit(8, 4, 1));
	accept_cmd(m, cmd_begin(8, 4, 1, 2));
	accept_cmd(m, cmd_commit(8, 1, 2));
	CU_ASSERT_PTR_NULL(invariant_broken(m));
}

static void test_map_roundtrip(void)
{
	static struct rps__smap m, d;
	static uint8_t buf[RPS__SMAP_ENC_MAX], buf2[RPS__SMAP_ENC_MAX];
	size_t len = 0, len2 = 0;

	busy_map(&m);
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(len, rps__smap_encoded_size(&m));
	CU_ASSERT_EQUAL(memcmp(buf, "SMAP", 4), 0);
	CU_ASSERT_EQUAL(buf[4], 1);
	CU_ASSERT_EQUAL(buf[5], 0);
	memset(&d, 0x5a, sizeof(d));
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &d, sizeof(m)), 0);
	CU_ASSERT_EQUAL(rps__smap_encode(&d, buf2, sizeof(buf2), &len2), 0);
	CU_ASSERT_EQUAL(len2, len);
	CU_ASSERT_EQUAL(memcmp(buf, buf2, len), 0);

	/* exactly enough room, and one byte less */
	CU_ASSERT_EQUAL(rps__smap_encode(&m, buf2, len, &len2), 0);
	CU_ASSERT_EQUAL(rps__smap_encode(&m, buf2, len - 1, &len2), -ENOSPC);

	/* the largest map fits RPS__SMAP_ENC_MAX */
	{
		static const char *u[RPS__SMAP_MAX_MEMBERS];
		static char names[RPS__SMAP_MAX_MEMBERS][RPS__SMAP_URI_MAX];

		for (unsigned i = 0; i < RPS__SMAP_MAX_MEMBERS; i++) {
			memset(names[i], 'a' + (int)i, RPS__SMAP_URI_MAX - 1);
			names[i][RPS__SMAP_URI_MAX - 1] = '\0';
			u[i] = names[i];
		}
		CU_ASSERT_EQUAL_FATAL(rps__smap_init(&m, u, RPS__SMAP_MAX_MEMBERS, RPS__SMAP_MAX_PART), 0);
		m.applied = UINT64_MAX;
		m.parts[3].moving_to = 5;
		m.parts[3].epoch = RPS__EPOCH_MOVED - 1;
		CU_ASSERT(rps__smap_encoded_size(&m) <= RPS__SMAP_ENC_MAX);
		CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
		CU_ASSERT_EQUAL(decode_exact(buf, len, &d), 0);
		CU_ASSERT_EQUAL(memcmp(&m, &d, sizeof(m)), 0);
	}

	/* an unencodable struct is refused, not read past */
	init3(&m, 4);
	m.npart = RPS__SMAP_MAX_PART + 1;
	CU_ASSERT_EQUAL(rps__smap_encode(&m, buf, sizeof(buf), &len), -EINVAL);
	init3(&m, 4);
	memset(m.members[0].uri, 'x', sizeof(m.members[0].uri));
	CU_ASSERT_EQUAL(rps__smap_encode(&m, buf, sizeof(buf), &len), -EINVAL);
}

static void test_map_truncated_and_flipped(void)
{
	static struct rps__smap m, d, before;
	static uint8_t buf[RPS__SMAP_ENC_MAX];
	size_t len = 0, parts_at;

	busy_map(&m);
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
	memset(&d, 0x77, sizeof(d));
	memcpy(&before, &d, sizeof(d));
	for (size_t l = 0; l < len; l++) {
		rps__clearerr();
		CU_ASSERT_EQUAL(decode_exact(buf, l, &d), -EBADMSG);
		CU_ASSERT(rps__errbuf()[0] != '\0');
	}
	CU_ASSERT_EQUAL(memcmp(&before, &d, sizeof(d)), 0);	/* a failed decode leaves *m alone */
	/* one byte too many */
	{
		uint8_t *longer = malloc(len + 1);

		CU_ASSERT_FATAL(longer != NULL);
		memcpy(longer, buf, len);
		longer[len] = 0;
		CU_ASSERT_EQUAL(rps__smap_decode(longer, len + 1, &d), -EBADMSG);
		free(longer);
	}

	parts_at = len - 4 - (size_t)m.npart * 24;
	for (size_t bit = 0; bit < len * 8; bit++) {
		int rc;

		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		rc = decode_exact(buf, len, &d);
		CU_ASSERT(rc == -EBADMSG || rc == -EILSEQ);
		if (bit / 8 >= parts_at)	/* fixed-size fields: the crc catches it */
			CU_ASSERT_EQUAL(rc, -EILSEQ);
		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	CU_ASSERT_EQUAL(rps__smap_decode(buf, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &d, sizeof(m)), 0);
	buf[len - 1] ^= 0x80;
	rps__clearerr();
	CU_ASSERT_EQUAL(rps__smap_decode(buf, len, &d), -EILSEQ);
	CU_ASSERT(strstr(rps__errbuf(), "crc") != NULL);
}

/* Encode a deliberately broken struct (the encoder only bounds-checks) and
 * expect the decoder to refuse it although its crc is right. */
static void expect_invalid(const struct rps__smap *m)
{
	static uint8_t buf[RPS__SMAP_ENC_MAX];
	static struct rps__smap d;
	size_t len = 0;

	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(m, buf, sizeof(buf), &len), 0);
	rps__clearerr();
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), -EBADMSG);
	CU_ASSERT(rps__errbuf()[0] != '\0');
}

static void test_map_invalid_content(void)
{
	static struct rps__smap m, d;
	static uint8_t buf[RPS__SMAP_ENC_MAX];
	size_t len = 0;

	init3(&m, 8);
	m.parts[2].owner = 9;
	expect_invalid(&m);
	init3(&m, 8);
	m.parts[2].owner = 0;
	expect_invalid(&m);
	init3(&m, 8);
	m.parts[2].moving_to = m.parts[2].owner;
	expect_invalid(&m);
	init3(&m, 8);
	m.parts[2].moving_to = 9;
	expect_invalid(&m);
	init3(&m, 8);
	m.parts[2].epoch = 0;
	expect_invalid(&m);
	init3(&m, 8);
	m.parts[2].epoch = RPS__EPOCH_MOVED;
	expect_invalid(&m);
	init3(&m, 8);
	m.members[0].id = 2;	/* repeated id */
	expect_invalid(&m);
	init3(&m, 8);
	m.members[0].id = 3;	/* out of order */
	m.members[2].id = 1;
	expect_invalid(&m);
	init3(&m, 8);
	m.max_id = 2;		/* member 3 above max_id */
	expect_invalid(&m);
	init3(&m, 8);
	m.members[0].id = 0;
	expect_invalid(&m);
	init3(&m, 8);
	m.members[1].uri[0] = '\0';
	expect_invalid(&m);
	init3(&m, 8);
	strcpy(m.members[1].uri, m.members[0].uri);
	expect_invalid(&m);
	init3(&m, 8);
	m.npart = 0;
	expect_invalid(&m);
	init3(&m, 8);
	m.nmembers = 0;
	expect_invalid(&m);

	/* byte-level edits, resealed so only the structure is wrong */
	init3(&m, 8);
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
	/* header: "SMAP" 0, version 4, applied 6, max_id 14, npart 22, nmembers 26, members 30 */
	buf[0] = 'X';
	reseal(buf, len);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), -EBADMSG);
	buf[0] = 'S';
	buf[4] = 2;
	reseal(buf, len);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), -EBADMSG);
	buf[4] = 1;
	buf[22] = 1;		/* npart 257 */
	buf[23] = 1;
	reseal(buf, len);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), -EBADMSG);
	buf[22] = 8;
	buf[23] = 0;
	buf[26] = 17;		/* nmembers 17 */
	reseal(buf, len);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), -EBADMSG);
	buf[26] = 3;
	buf[30 + 8] = 128;	/* first uri 128 bytes long */
	reseal(buf, len);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), -EBADMSG);
	buf[30 + 8] = (uint8_t)strlen(uris3[0]);
	buf[30 + 10 + 3] = 0;	/* NUL inside the first uri */
	reseal(buf, len);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), -EBADMSG);
	buf[30 + 10 + 3] = (uint8_t)uris3[0][3];
	reseal(buf, len);
	CU_ASSERT_EQUAL(decode_exact(buf, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &d, sizeof(m)), 0);
}

/* Random bytes, and random edits of valid maps resealed with a good crc:
 * the decoder never crashes or reads past the input, and whatever it
 * accepts is a valid map that encodes back to the same bytes. */
static void test_map_garbage(void)
{
	static struct rps__smap m, d;
	static uint8_t buf[RPS__SMAP_ENC_MAX + 64], out[RPS__SMAP_ENC_MAX];
	size_t len = 0, olen = 0;
	unsigned accepted = 0;

	for (int iter = 0; iter < 3000; iter++) {
		size_t n = (size_t)(rng() % sizeof(buf));

		for (size_t i = 0; i < n; i++)
			buf[i] = (uint8_t)rng();
		if (n >= 30 && (iter & 1)) {	/* get past the magic into the body */
			memcpy(buf, "SMAP\1\0", 6);
			buf[22] = (uint8_t)(rng() % 8 + 1);
			buf[23] = buf[24] = buf[25] = 0;
			buf[26] = (uint8_t)(rng() % 4 + 1);
			buf[27] = buf[28] = buf[29] = 0;
			if (n >= 34)
				reseal(buf, n);
		}
		CU_ASSERT_NOT_EQUAL(decode_exact(buf, n, &d), 0);
	}

	busy_map(&m);
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, buf, sizeof(buf), &len), 0);
	for (int iter = 0; iter < 3000; iter++) {
		static uint8_t mut[RPS__SMAP_ENC_MAX];
		int edits = 1 + (int)(rng() % 3), rc;

		memcpy(mut, buf, len);
		for (int e = 0; e < edits; e++) {
			size_t at = (size_t)(rng() % (len - 4));

			/* small values make valid ids, epochs and lengths likely */
			mut[at] = (rng() & 1) ? (uint8_t)(rng() % 6) : (uint8_t)rng();
		}
		reseal(mut, len);
		rc = decode_exact(mut, len, &d);
		CU_ASSERT(rc == 0 || rc == -EBADMSG);
		if (rc == 0) {
			accepted++;
			CU_ASSERT_PTR_NULL(invariant_broken(&d));
			CU_ASSERT_EQUAL(rps__smap_encode(&d, out, sizeof(out), &olen), 0);
			CU_ASSERT_EQUAL(olen, len);
			CU_ASSERT_EQUAL(memcmp(out, mut, len), 0);
		}
	}
	CU_ASSERT(accepted > 100);	/* the accepting path was exercised too */
}

/* ------------------------------------------------------------------------ */
/* command codec */

static void cmd_roundtrip(const struct rps__smap_cmd *c)
{
	uint8_t buf[RPS__SMAP_CMD_MAX];
	struct rps__smap_cmd d;
	size_t len = 0;

	CU_ASSERT_EQUAL_FATAL(rps__smap_cmd_encode(c, buf, sizeof(buf), &len), 0);
	CU_ASSERT(len <= RPS__SMAP_CMD_MAX);
	CU_ASSERT_EQUAL(memcmp(buf, "SMCD", 4), 0);
	memset(&d, 0xee, sizeof(d));
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(c, &d, sizeof(d)), 0);
	for (size_t l = 0; l < len; l++)
		CU_ASSERT_EQUAL(cmd_decode_exact(buf, l, &d), -EBADMSG);
	CU_ASSERT_EQUAL(rps__smap_cmd_encode(c, buf, len - 1, &len), -ENOSPC);
}

static void test_cmd_codec(void)
{
	struct rps__smap_cmd c, d;
	uint8_t buf[RPS__SMAP_CMD_MAX + 8];
	size_t len = 0;

	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_ADD_MEMBER, .id = 12, .uri = "tcp://h:1" });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_REMOVE_MEMBER, .id = UINT64_MAX });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_MOVE_BEGIN, .part = 255, .from = 1, .to = 2,
					       .epoch = 0x0102030405060708ull });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_MOVE_COMMIT, .part = UINT32_MAX, .to = 3,
					       .epoch = 9 });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_MOVE_ABORT, .part = 1, .epoch = 1 });
	/* the longest uri */
	c = cmd_add(1, "");
	memset(c.uri, 'q', RPS__SMAP_URI_MAX - 1);
	cmd_roundtrip(&c);
	CU_ASSERT_EQUAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), 0);
	CU_ASSERT(len <= RPS__SMAP_CMD_MAX);
	/* unterminated uri: refused by the encoder */
	memset(c.uri, 'q', RPS__SMAP_URI_MAX);
	CU_ASSERT_EQUAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), -EINVAL);

	/* malformed: "SMCD" 0, version 4, type 6, part 10, id 14, from 22,
	 * to 30, epoch 38, uri length 46, uri 48 */
	c = cmd_add(7, "tcp://abc:9");
	CU_ASSERT_EQUAL_FATAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(len, 48 + strlen("tcp://abc:9"));
	buf[len] = 0;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len + 1, &d), -EBADMSG);	/* trailing byte */
	buf[3] = 'X';
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), -EBADMSG);
	buf[3] = 'D';
	buf[4] = 2;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), -EBADMSG);
	buf[4] = 1;
	buf[6] = 0;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), -EBADMSG);
	buf[6] = RPS__SMAP_CMD_LAST + 1;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), -EBADMSG);
	buf[6] = 1;
	buf[46] = 128;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), -EBADMSG);
	buf[46] = 0xff;
	buf[47] = 0xff;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), -EBADMSG);
	buf[46] = (uint8_t)strlen("tcp://abc:9");
	buf[47] = 0;
	buf[50] = 0;		/* NUL inside the uri */
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), -EBADMSG);
	buf[50] = 'p';
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&c, &d, sizeof(c)), 0);

	/* garbage: never a crash; anything accepted re-encodes to itself */
	for (int iter = 0; iter < 20000; iter++) {
		uint8_t g[RPS__SMAP_CMD_MAX + 16], out[RPS__SMAP_CMD_MAX];
		size_t n = (size_t)(rng() % sizeof(g)), olen = 0;

		for (size_t i = 0; i < n; i++)
			g[i] = (uint8_t)rng();
		if (n >= 48 && (iter & 1)) {
			memcpy(g, "SMCD\1\0", 6);
			g[6] = (uint8_t)(rng() % 7);
			g[7] = g[8] = g[9] = 0;
			if (rng() & 1) {
				g[46] = (uint8_t)(n - 48);
				g[47] = 0;
			}
		}
		if (cmd_decode_exact(g, n, &d) == 0) {
			CU_ASSERT_EQUAL(rps__smap_cmd_encode(&d, out, sizeof(out), &olen), 0);
			CU_ASSERT_EQUAL(olen, n);
			CU_ASSERT_EQUAL(memcmp(out, g, n), 0);
		}
	}
}


/* ------------------------------------------------------------------------ */
/* replica sets */

static struct rps__smap_cmd cmd_repl(uint32_t type, uint32_t part, uint64_t id, uint64_t to, uint64_t epoch)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = type;
	c.part = part;
	c.id = id;
	c.to = to;
	c.epoch = epoch;
	return c;
}

static struct rps__smap_cmd cmd_failover(uint32_t part, uint64_t from, uint64_t to, uint64_t epoch,
					 uint32_t nkeep, const uint64_t *keep)
{
	struct rps__smap_cmd c = cmd_repl(RPS__SMAP_FAILOVER, part, 0, to, epoch);

	c.from = from;
	c.nkeep = nkeep;
	for (uint32_t i = 0; i < nkeep && i < RPS__SMAP_MAX_REPLICAS - 1; i++)
		c.keep[i] = keep[i];	/* (nkeep may be too many on purpose) */
	return c;
}

static struct rps__smap_cmd cmd_zone(uint64_t id, const char *zone)
{
	struct rps__smap_cmd c = cmd_repl(RPS__SMAP_SET_ZONE, 0, id, 0, 0);

	snprintf(c.zone, sizeof(c.zone), "%s", zone);
	return c;
}

static uint8_t map_version_of(const struct rps__smap *m)
{
	static uint8_t enc[RPS__SMAP_ENC_MAX];
	size_t len = 0;

	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(m, enc, sizeof(enc), &len), 0);
	CU_ASSERT_EQUAL(len, rps__smap_encoded_size(m));
	return enc[4];
}

static void test_replica_init(void)
{
	static const char *const u4[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1" };
	static struct rps__smap m, r1;

	/* R = 1 is the unreplicated map, byte for byte */
	init3(&r1, 8);
	memset(&m, 0x5a, sizeof(m));
	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, uris3, 3, 8, 1), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &r1, sizeof(m)), 0);
	CU_ASSERT_EQUAL(m.replicas, 1);
	CU_ASSERT(!rps__smap_replicated(&m));
	CU_ASSERT_EQUAL(map_version_of(&m), 1);
	CU_ASSERT_EQUAL(rps__smap_nunder(&m), 0);

	/* R = 3 of 4: backups are the next members round the ring */
	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, u4, 4, 8, 3), 0);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	CU_ASSERT_EQUAL(m.replicas, 3);
	for (uint32_t p = 0; p < 8; p++) {
		CU_ASSERT_EQUAL(m.parts[p].owner, p % 4 + 1);
		CU_ASSERT_EQUAL(m.parts[p].backups[0], (p + 1) % 4 + 1);
		CU_ASSERT_EQUAL(m.parts[p].backups[1], (p + 2) % 4 + 1);
		CU_ASSERT_EQUAL(rps__smap_nbackups(&m, p), 2);
		CU_ASSERT_EQUAL(rps__smap_role(&m, p, p % 4 + 1), RPS__SMAP_ROLE_PRIMARY);
		CU_ASSERT_EQUAL(rps__smap_role(&m, p, (p + 2) % 4 + 1), RPS__SMAP_ROLE_BACKUP);
		CU_ASSERT_EQUAL(rps__smap_role(&m, p, (p + 3) % 4 + 1), RPS__SMAP_ROLE_NONE);
	}
	CU_ASSERT_EQUAL(rps__smap_role(&m, 8, 1), RPS__SMAP_ROLE_NONE);
	CU_ASSERT_EQUAL(rps__smap_role(&m, 0, 0), RPS__SMAP_ROLE_NONE);
	for (uint64_t id = 1; id <= 4; id++) {
		CU_ASSERT_EQUAL(rps__smap_owned(&m, id), 2);
		CU_ASSERT_EQUAL(rps__smap_backed(&m, id), 4);
	}
	CU_ASSERT(rps__smap_replicated(&m));
	CU_ASSERT_EQUAL(map_version_of(&m), 3);
	CU_ASSERT_EQUAL(rps__smap_nunder(&m), 0);

	/* R out of range, or more copies than members */
	CU_ASSERT_EQUAL(rps__smap_init_replicated(&m, u4, 4, 8, 0), -EINVAL);
	CU_ASSERT_EQUAL(rps__smap_init_replicated(&m, u4, 4, 8, RPS__SMAP_MAX_REPLICAS + 1), -EINVAL);
	CU_ASSERT_EQUAL(rps__smap_init_replicated(&m, u4, 2, 8, 3), -EINVAL);
	CU_ASSERT_EQUAL(rps__smap_init_replicated(&m, u4, 1, 8, 2), -EINVAL);
	CU_ASSERT_EQUAL(rps__smap_init_replicated(&m, u4, 1, 8, 1), 0);
}

static void test_replica_seeding(void)
{
	static struct rps__smap m;

	init3(&m, 4);
	accept_cmd(&m, cmd_repl(RPS__SMAP_SET_REPLICAS, 0, 2, 0, 0));
	CU_ASSERT_EQUAL(m.replicas, 2);
	CU_ASSERT_EQUAL(rps__smap_nunder(&m), 4);
	CU_ASSERT_EQUAL(map_version_of(&m), 3);
	refuse_cmd(&m, cmd_repl(RPS__SMAP_SET_REPLICAS, 0, 0, 0, 0), -EINVAL);
	refuse_cmd(&m, cmd_repl(RPS__SMAP_SET_REPLICAS, 0, RPS__SMAP_MAX_REPLICAS + 1, 0, 0), -EINVAL);

	/* partition 0 (owner 1) seeds member 2: epoch stays, then commits */
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 1, 1), -EEXIST);	/* the owner */
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 9, 1), -ENOENT);
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 2, 2), -ESTALE);
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 4, 0, 2, 1), -ENOENT);
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_COMMIT, 0, 0, 2, 1), -ESTALE);	/* nothing seeded */
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_ABORT, 0, 0, 0, 1), -ESTALE);
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 2, 1));
	CU_ASSERT_EQUAL(m.parts[0].joining, 2);
	CU_ASSERT_EQUAL(rps__smap_role(&m, 0, 2), RPS__SMAP_ROLE_JOINING);
	CU_ASSERT_EQUAL(rps__smap_nunder(&m), 4);	/* seeding is not a copy yet */
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 3, 1), -EBUSY);
	refuse_cmd(&m, cmd_begin(0, 1, 3, 1), -EBUSY);		/* no move while seeding */
	refuse_cmd(&m, cmd_begin(0, 1, 2, 1), -EBUSY);
	refuse_cmd(&m, cmd_remove(2), -EBUSY);
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_COMMIT, 0, 0, 3, 1), -ESTALE);
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_COMMIT, 0, 0, 2, 1));
	CU_ASSERT_EQUAL(m.parts[0].epoch, 1);
	CU_ASSERT_EQUAL(m.parts[0].joining, 0);
	CU_ASSERT_EQUAL(m.parts[0].backups[0], 2);
	CU_ASSERT_EQUAL(rps__smap_nunder(&m), 3);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* a move to a backup is a planned switch: the COMMIT makes it primary
	 * (it leaves the backups, the old owner leaves the set), epoch + 1;
	 * a DROP of it aborts the switch */
	{
		static struct rps__smap sw;

		sw = m;
		accept_cmd(&sw, cmd_begin(0, 1, 2, 1));
		CU_ASSERT_EQUAL(sw.parts[0].moving_to, 2);
		accept_cmd(&sw, cmd_commit(0, 2, 1));
		CU_ASSERT_EQUAL(sw.parts[0].owner, 2);
		CU_ASSERT_EQUAL(sw.parts[0].epoch, 2);
		CU_ASSERT_EQUAL(rps__smap_nbackups(&sw, 0), 0u);
		CU_ASSERT_EQUAL(rps__smap_role(&sw, 0, 1), RPS__SMAP_ROLE_NONE);
		CU_ASSERT_PTR_NULL(invariant_broken(&sw));
		sw = m;
		accept_cmd(&sw, cmd_begin(0, 1, 2, 1));
		accept_cmd(&sw, cmd_repl(RPS__SMAP_REPLICA_DROP, 0, 2, 0, 1));
		CU_ASSERT_EQUAL(sw.parts[0].moving_to, 0);
		CU_ASSERT_EQUAL(sw.parts[0].owner, 1);
		CU_ASSERT_EQUAL(sw.parts[0].epoch, 2);
		refuse_cmd(&sw, cmd_commit(0, 2, 1), -ESTALE);
		CU_ASSERT_PTR_NULL(invariant_broken(&sw));
	}
	/* a backup cannot be removed, or seeded again */
	refuse_cmd(&m, cmd_remove(2), -EBUSY);
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 2, 1), -EEXIST);
	/* a third copy, aborted */
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 3, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_ABORT, 0, 0, 0, 1));
	CU_ASSERT_EQUAL(m.parts[0].joining, 0);
	CU_ASSERT_EQUAL(m.parts[0].epoch, 1);
	/* the set is full at RPS__SMAP_MAX_REPLICAS */
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 3, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_COMMIT, 0, 0, 3, 1));
	accept_cmd(&m, cmd_add(4, "tcp://10.0.0.4:7000"));
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 4, 1), -ENOSPC);

	/* dropping a backup moves the epoch on and keeps the order of the rest */
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_DROP, 0, 1, 0, 1), -ESTALE);	/* the owner */
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_DROP, 0, 2, 0, 2), -ESTALE);
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_DROP, 0, 2, 0, 1));
	CU_ASSERT_EQUAL(m.parts[0].epoch, 2);
	CU_ASSERT_EQUAL(m.parts[0].backups[0], 3);
	CU_ASSERT_EQUAL(m.parts[0].backups[1], 0);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	/* a lost partition is not seeded */
	accept_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 1, 2, 1));
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 1, 0, 3, 1), -ENODATA);
	/* a moving one neither */
	accept_cmd(&m, cmd_begin(2, 3, 1, 1));
	refuse_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 2, 0, 2, 1), -EBUSY);
}

static void test_replica_failover(void)
{
	static const char *const u4[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1" };
	static struct rps__smap m;
	uint64_t keep[2];

	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, u4, 4, 4, 3), 0);
	/* partition 0: owner 1, backups 2, 3 */
	keep[0] = 3;
	refuse_cmd(&m, cmd_failover(0, 2, 3, 1, 0, NULL), -ESTALE);	/* not the primary */
	refuse_cmd(&m, cmd_failover(0, 1, 4, 1, 0, NULL), -ESTALE);	/* not a backup */
	refuse_cmd(&m, cmd_failover(0, 1, 2, 2, 0, NULL), -ESTALE);	/* stale epoch */
	refuse_cmd(&m, cmd_failover(0, 1, 2, 1, 1, (uint64_t[]){ 2 }), -EINVAL);	/* keeps the new primary */
	refuse_cmd(&m, cmd_failover(0, 1, 2, 1, 1, (uint64_t[]){ 4 }), -EINVAL);	/* not a backup */
	refuse_cmd(&m, cmd_failover(0, 1, 2, 1, 2, (uint64_t[]){ 3, 3 }), -EINVAL);
	refuse_cmd(&m, cmd_failover(0, 1, 2, 1, 3, (uint64_t[]){ 3, 3, 3 }), -EINVAL);
	accept_cmd(&m, cmd_failover(0, 1, 2, 1, 1, keep));
	CU_ASSERT_EQUAL(m.parts[0].owner, 2);
	CU_ASSERT_EQUAL(m.parts[0].epoch, 2);
	CU_ASSERT_EQUAL(m.parts[0].backups[0], 3);
	CU_ASSERT_EQUAL(m.parts[0].backups[1], 0);
	CU_ASSERT_EQUAL(m.parts[0].lost, 0);
	CU_ASSERT_EQUAL(rps__smap_nunder(&m), 1);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	/* partition 1 (owner 2, backups 3, 4) while seeding 1 and ... keeping none */
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_DROP, 1, 4, 0, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 1, 0, 1, 2));
	accept_cmd(&m, cmd_failover(1, 2, 3, 2, 0, NULL));
	CU_ASSERT_EQUAL(m.parts[1].owner, 3);
	CU_ASSERT_EQUAL(m.parts[1].epoch, 3);
	CU_ASSERT_EQUAL(m.parts[1].backups[0], 0);
	CU_ASSERT_EQUAL(m.parts[1].joining, 0);	/* the seeding came from the old primary */
	/* keep[] order does not matter: the map's order stays */
	accept_cmd(&m, cmd_failover(2, 3, 4, 1, 0, NULL));	/* partition 2: 3 + 4,1 -> 4 */
	CU_ASSERT_EQUAL(m.parts[2].owner, 4);
	CU_ASSERT_EQUAL(m.parts[2].backups[0], 0);
	accept_cmd(&m, cmd_failover(3, 4, 2, 1, 1, (uint64_t[]){ 1 }));	/* 4 + 1,2 -> 2 keeping 1 */
	CU_ASSERT_EQUAL(m.parts[3].owner, 2);
	CU_ASSERT_EQUAL(m.parts[3].backups[0], 1);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* FORCE_REMOVE: a primary with a backup fails over to it (not lost),
	 * a backup leaves its sets, a primary without one is lost as before */
	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, u4, 4, 4, 2), 0);
	/* 0: 1+2  1: 2+3  2: 3+4  3: 4+1 ; partition 1 loses its backup */
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_DROP, 1, 3, 0, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 2, 0, 2, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_FORCE_REMOVE, 0, 2, 0, 0));
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
	CU_ASSERT_EQUAL(m.parts[0].owner, 1);	/* 2 was its backup */
	CU_ASSERT_EQUAL(m.parts[0].backups[0], 0);
	CU_ASSERT_EQUAL(m.parts[0].epoch, 2);
	CU_ASSERT_EQUAL(m.parts[0].lost, 0);
	CU_ASSERT_NOT_EQUAL(m.parts[1].owner, 2);	/* no backup: passed on, lost */
	CU_ASSERT_EQUAL(m.parts[1].lost, 2);
	CU_ASSERT_EQUAL(m.parts[1].epoch, 3);
	CU_ASSERT_EQUAL(m.parts[2].joining, 0);	/* it was being seeded */
	CU_ASSERT_EQUAL(m.parts[2].epoch, 1);
	CU_ASSERT_EQUAL(m.parts[3].owner, 4);
	CU_ASSERT_EQUAL(m.parts[3].backups[0], 1);
	CU_ASSERT_EQUAL(m.parts[3].epoch, 1);
	accept_cmd(&m, cmd_repl(RPS__SMAP_FORCE_REMOVE, 0, 4, 0, 0));
	CU_ASSERT_EQUAL(m.parts[3].owner, 1);	/* failed over */
	CU_ASSERT_EQUAL(m.parts[3].lost, 0);
	CU_ASSERT_EQUAL(m.parts[3].epoch, 2);
	CU_ASSERT_EQUAL(m.parts[2].owner, 3);	/* 4 was its backup */
	CU_ASSERT_EQUAL(m.parts[2].backups[0], 0);
	CU_ASSERT_EQUAL(m.parts[2].epoch, 2);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));
}

static bool alive_but_3(void *ctx, uint64_t id)
{
	(void)ctx;
	return id != 3;
}

static void test_zones_and_placement(void)
{
	static const char *const u5[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1", "tcp://e:1" };
	static struct rps__smap m;
	struct rps__smap_cmd c;

	CU_ASSERT_EQUAL_FATAL(rps__smap_init(&m, u5, 5, 10), 0);
	CU_ASSERT_EQUAL(map_version_of(&m), 1);
	accept_cmd(&m, cmd_zone(1, "rack-a"));
	CU_ASSERT_STRING_EQUAL(m.members[0].zone, "rack-a");
	CU_ASSERT_EQUAL(map_version_of(&m), 3);	/* a zone needs version 3 */
	accept_cmd(&m, cmd_zone(2, "rack-a"));
	accept_cmd(&m, cmd_zone(3, "rack-b"));
	accept_cmd(&m, cmd_zone(4, "rack-b"));
	refuse_cmd(&m, cmd_zone(9, "x"), -ENOENT);
	refuse_cmd(&m, cmd_zone(5, "a b"), -EINVAL);
	c = cmd_zone(5, "");
	memset(c.zone, 'z', sizeof(c.zone));
	refuse_cmd(&m, c, -EINVAL);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* partition 0 is on 1 (rack-a): a new zone first (3, rack-b, least
	 * loaded first among equals: 3 before 4), unless 3 is down */
	CU_ASSERT_EQUAL(rps__smap_pick_backup(&m, 0, NULL, NULL), 3);
	CU_ASSERT_EQUAL(rps__smap_pick_backup(&m, 0, alive_but_3, NULL), 4);
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 3, 1));
	/* the joiner is skipped and its zone counts as in the set: with racks
	 * a and b in, the fewest replicas held wins (2, 4, 5 hold 2 each), then
	 * the lowest id */
	CU_ASSERT_EQUAL(rps__smap_pick_backup(&m, 0, NULL, NULL), 2);
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_COMMIT, 0, 0, 3, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 5, 0, 2, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_COMMIT, 5, 0, 2, 1));
	/* member 2 now holds 3 replicas, 4 and 5 hold 2 */
	CU_ASSERT_EQUAL(rps__smap_pick_backup(&m, 0, NULL, NULL), 4);
	/* partition 0 spans racks a and b; 5 has both copies in rack a (1,
	 * 2): 2 is the copy to give up first */
	CU_ASSERT_EQUAL(m.parts[5].owner, 1u);
	CU_ASSERT_EQUAL(rps__smap_in_zone(&m, 0, "rack-a"), 1u);
	CU_ASSERT_EQUAL(rps__smap_in_zone(&m, 0, "rack-b"), 1u);
	CU_ASSERT_EQUAL(rps__smap_in_zone(&m, 5, "rack-a"), 2u);
	CU_ASSERT_EQUAL(rps__smap_in_zone(&m, 5, ""), 0u);
	CU_ASSERT_EQUAL(rps__smap_zone_duplicate(&m, 0), 0u);
	CU_ASSERT_EQUAL(rps__smap_zone_duplicate(&m, 5), 2u);
	CU_ASSERT_EQUAL(rps__smap_zone_duplicate(&m, 1), 0u);	/* no backup */
	accept_cmd(&m, cmd_zone(1, ""));	/* cleared */
	CU_ASSERT_EQUAL(rps__smap_zone_duplicate(&m, 5), 0u);	/* undeclared zones share nothing */
	CU_ASSERT_STRING_EQUAL(m.members[0].zone, "");
	CU_ASSERT_EQUAL(rps__smap_pick_backup(&m, 99, NULL, NULL), 0);
}

/* ------------------------------------------------------------------------ */
/* balancing (psctl rebalance) */

/* A balancing move as the cluster carries it out: BEGIN, COMMIT (to a
 * backup: a planned switch, it leaves the backups). */
static void apply_move(struct rps__smap *m, uint32_t p, uint64_t from, uint64_t to)
{
	uint64_t e = m->parts[p].epoch;

	accept_cmd(m, cmd_begin(p, from, to, e));
	accept_cmd(m, cmd_commit(p, to, e));
}

/* Fewest and most partitions owned by a member that holds data and is
 * alive. */
static void owned_range(const struct rps__smap *m, bool (*alive)(void *, uint64_t), uint32_t *lo, uint32_t *hi)
{
	*lo = UINT32_MAX;
	*hi = 0;
	for (uint32_t i = 0; i < m->nmembers; i++) {
		uint32_t n = rps__smap_owned(m, m->members[i].id);
		if ((m->members[i].flags & RPS__SMAP_WITNESS) || (alive && !alive(NULL, m->members[i].id)))
			continue;
		*lo = n < *lo ? n : *lo;
		*hi = n > *hi ? n : *hi;
	}
}

static void test_balance(void)
{
	static const char *const u5[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1", "tcp://e:1" };
	static struct rps__smap m;
	uint64_t from, to;
	uint32_t p, lo, hi;
	int moves = 0, ret;

	/* even from the start: nothing to do */
	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, uris3, 3, 8, 2), 0);
	CU_ASSERT_EQUAL(rps__smap_balance_move(&m, NULL, NULL, &p, &from, &to), 0);

	/* member 2 restarted empty: its partitions (1, 4, 7) failed over to
	 * their backup, member 3 (5 of 8), and it was seeded again as their
	 * backup */
	for (p = 1; p < 8; p += 3) {
		accept_cmd(&m, cmd_failover(p, 2, 3, m.parts[p].epoch, 0, NULL));
		accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, p, 0, 2, m.parts[p].epoch));
		accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_COMMIT, p, 0, 2, m.parts[p].epoch));
	}
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 2), 0);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 5);
	/* two moves from 3 to 2, each a planned switch to the backup, the
	 * highest-numbered first: 7, then 4 */
	while ((ret = rps__smap_balance_move(&m, NULL, NULL, &p, &from, &to)) == 1 && moves < 16) {
		CU_ASSERT_EQUAL(from, 3);
		CU_ASSERT_EQUAL(to, 2);
		CU_ASSERT_EQUAL(rps__smap_role(&m, p, to), RPS__SMAP_ROLE_BACKUP);
		CU_ASSERT_EQUAL(p, moves ? 4u : 7u);
		apply_move(&m, p, from, to);
		moves++;
	}
	CU_ASSERT_EQUAL(ret, 0);
	CU_ASSERT_EQUAL(moves, 2);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 1), 3);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 2), 2);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 3);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* a member that is down neither gives nor takes: 3 down, 1 owns 3 and
	 * 2 owns 2: even among the living */
	CU_ASSERT_EQUAL(rps__smap_balance_move(&m, alive_but_3, NULL, &p, &from, &to), 0);

	/* without backups: 5 members, 10 partitions, all on 1 and 2 */
	CU_ASSERT_EQUAL_FATAL(rps__smap_init(&m, u5, 5, 10), 0);
	for (p = 0; p < 10; p++)	/* the even ones on 1, the odd ones on 2 */
		if (m.parts[p].owner != 1 + p % 2)
			apply_move(&m, p, m.parts[p].owner, 1 + p % 2);
	/* a zone: 4 and 5 in rack-x, so nothing prefers them; any order
	 * ends at 2 each */
	accept_cmd(&m, cmd_zone(4, "rack-x"));
	accept_cmd(&m, cmd_zone(5, "rack-x"));
	/* the busiest member's partitions all moving: -EBUSY, naming it */
	for (p = 0; p < 10; p += 2)
		accept_cmd(&m, cmd_begin(p, 1, 2, m.parts[p].epoch));
	CU_ASSERT_EQUAL(rps__smap_balance_move(&m, NULL, NULL, &p, &from, &to), -EBUSY);
	CU_ASSERT_EQUAL(from, 1);
	for (p = 0; p < 10; p += 2)
		accept_cmd(&m, cmd_abort(p, m.parts[p].epoch));
	/* a lost partition stays where it is */
	accept_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 9, m.parts[9].owner, m.parts[9].epoch));
	moves = 0;
	while ((ret = rps__smap_balance_move(&m, NULL, NULL, &p, &from, &to)) == 1 && moves < 32) {
		CU_ASSERT(p != 9);
		CU_ASSERT(from != to);
		apply_move(&m, p, from, to);
		moves++;
	}
	CU_ASSERT_EQUAL(ret, 0);
	owned_range(&m, NULL, &lo, &hi);
	CU_ASSERT_EQUAL(lo, 2);
	CU_ASSERT_EQUAL(hi, 2);
	CU_ASSERT_EQUAL(moves, 6);	/* 5 + 5 -> 2 each: 3 moves from each of 1 and 2 */
	CU_ASSERT_EQUAL(m.parts[9].owner, 2u);
	CU_ASSERT_PTR_NULL(invariant_broken(&m));

	/* a witness neither gives nor takes */
	CU_ASSERT_EQUAL_FATAL(rps__smap_init(&m, u5, 5, 10), 0);
	for (p = 0; p < 10; p++)
		if (m.parts[p].owner == 5)
			apply_move(&m, p, 5, 1);
	accept_cmd(&m, cmd_repl(RPS__SMAP_SET_WITNESS, 0, 5, 0, 0));
	CU_ASSERT(rps__smap_is_witness(&m, 5));
	moves = 0;
	while ((ret = rps__smap_balance_move(&m, NULL, NULL, &p, &from, &to)) == 1 && moves < 32) {
		CU_ASSERT(from != 5 && to != 5);
		apply_move(&m, p, from, to);
		moves++;
	}
	owned_range(&m, NULL, &lo, &hi);
	CU_ASSERT(hi <= lo + 1);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 5), 0);

	/* random maps: it always ends even (or busy), within npart moves,
	 * moving only between living members that hold data */
	for (int round = 0; round < 200; round++) {
		uint32_t npart = 1 + (uint32_t)(rng() % RPS__SMAP_MAX_PART);
		uint32_t n = 1 + (uint32_t)(rng() % 5);

		CU_ASSERT_EQUAL_FATAL(rps__smap_init(&m, u5, n, npart), 0);
		for (p = 0; p < npart; p++) {
			uint64_t want = 1 + rng() % (n > 1 && rng() % 2 ? 2 : n);	/* (crowded on 1, 2) */
			if (want != m.parts[p].owner)
				apply_move(&m, p, m.parts[p].owner, want);
			if (rng() % 16 == 0)
				accept_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, p, m.parts[p].owner, m.parts[p].epoch));
		}
		moves = 0;
		while ((ret = rps__smap_balance_move(&m, n > 2 ? alive_but_3 : NULL, NULL, &p, &from, &to)) == 1 &&
		       moves <= (int)npart) {
			CU_ASSERT(!(n > 2 && (from == 3 || to == 3)));
			CU_ASSERT(!m.parts[p].lost && m.parts[p].owner == from);
			apply_move(&m, p, from, to);
			moves++;
		}
		CU_ASSERT(moves <= (int)npart);
		if (ret == 0) {
			owned_range(&m, n > 2 ? alive_but_3 : NULL, &lo, &hi);
			CU_ASSERT(n < 2 || hi <= lo + 1);
		} else {
			/* busy: everything the busiest owns is lost */
			CU_ASSERT_EQUAL(ret, -EBUSY);
			for (p = 0; p < npart; p++)
				CU_ASSERT(m.parts[p].owner != from || m.parts[p].lost);
		}
		CU_ASSERT_PTR_NULL(invariant_broken(&m));
	}
}

/* Replicated maps through both codecs: v3 round trips, v1 commands stay
 * version 1, new commands need version 2. */
static void test_replica_codecs(void)
{
	static const char *const u4[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1" };
	static struct rps__smap m, d;
	static uint8_t enc[RPS__SMAP_ENC_MAX];
	uint8_t buf[RPS__SMAP_CMD_MAX];
	struct rps__smap_cmd c, cd;
	size_t len = 0;

	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, u4, 4, 16, 3), 0);
	accept_cmd(&m, cmd_zone(2, "z2"));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_DROP, 3, 1, 0, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 3, 0, 1, 2));
	accept_cmd(&m, cmd_lost(RPS__SMAP_MARK_LOST, 5, 2, 1));
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, enc, sizeof(enc), &len), 0);
	CU_ASSERT_EQUAL(enc[4], 3);
	CU_ASSERT_EQUAL(len, rps__smap_encoded_size(&m));
	memset(&d, 0x33, sizeof(d));
	CU_ASSERT_EQUAL(decode_exact(enc, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &d, sizeof(m)), 0);
	for (size_t l = 0; l < len; l++)
		CU_ASSERT_EQUAL(decode_exact(enc, l, &d), -EBADMSG);
	for (size_t i = 0; i < len; i += 7) {
		enc[i] ^= 0x10;
		CU_ASSERT_NOT_EQUAL(decode_exact(enc, len, &d), 0);
		enc[i] ^= 0x10;
	}
	CU_ASSERT_EQUAL(rps__smap_encode(&m, enc, len - 1, &len), -ENOSPC);

	/* invalid content, resealed: a backup that is the owner, twice, or a gap */
	{
		static struct rps__smap bad;
		const uint64_t owner0 = m.parts[0].owner;

		bad = m;
		bad.parts[0].backups[1] = owner0;
		CU_ASSERT_EQUAL(rps__smap_encode(&bad, enc, sizeof(enc), &len), 0);
		CU_ASSERT_EQUAL(decode_exact(enc, len, &d), -EBADMSG);
		bad = m;
		bad.parts[0].backups[1] = bad.parts[0].backups[0];
		CU_ASSERT_EQUAL(rps__smap_encode(&bad, enc, sizeof(enc), &len), 0);
		CU_ASSERT_EQUAL(decode_exact(enc, len, &d), -EBADMSG);
		bad = m;
		bad.parts[3].joining = bad.parts[3].owner;
		CU_ASSERT_EQUAL(rps__smap_encode(&bad, enc, sizeof(enc), &len), 0);
		CU_ASSERT_EQUAL(decode_exact(enc, len, &d), -EBADMSG);
		bad = m;
		bad.replicas = 4;
		CU_ASSERT_EQUAL(rps__smap_encode(&bad, enc, sizeof(enc), &len), 0);
		CU_ASSERT_EQUAL(decode_exact(enc, len, &d), -EBADMSG);
	}

	/* the worst case fits RPS__SMAP_ENC_MAX */
	{
		static struct rps__smap big;
		static const char *uris[RPS__SMAP_MAX_MEMBERS];
		static char ub[RPS__SMAP_MAX_MEMBERS][RPS__SMAP_URI_MAX];

		for (uint32_t i = 0; i < RPS__SMAP_MAX_MEMBERS; i++) {
			memset(ub[i], 'a' + (int)i, RPS__SMAP_URI_MAX - 1);
			uris[i] = ub[i];
		}
		CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&big, uris, RPS__SMAP_MAX_MEMBERS, RPS__SMAP_MAX_PART,
								RPS__SMAP_MAX_REPLICAS), 0);
		for (uint32_t i = 0; i < RPS__SMAP_MAX_MEMBERS; i++)
			memset(big.members[i].zone, 'z', RPS__SMAP_ZONE_MAX - 1);
		for (uint32_t p = 0; p < RPS__SMAP_MAX_PART; p++) {
			big.parts[p].lost = big.parts[p].owner;
			big.parts[p].joining = (p + 3) % RPS__SMAP_MAX_MEMBERS + 1;
		}
		CU_ASSERT_EQUAL(rps__smap_encode(&big, enc, sizeof(enc), &len), 0);
		CU_ASSERT_EQUAL(decode_exact(enc, len, &d), 0);
		CU_ASSERT_EQUAL(memcmp(&big, &d, sizeof(big)), 0);
	}

	/* commands: the old types are still version 1, byte for byte */
	c = cmd_begin(7, 2, 3, 4);
	CU_ASSERT_EQUAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(len, 48);
	CU_ASSERT_EQUAL(buf[4], 1);
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_SET_REPLICAS, .id = 2 });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_SET_ZONE, .id = 3, .zone = "rack-7" });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_REPLICA_BEGIN, .part = 9, .to = 4, .epoch = 3 });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_REPLICA_COMMIT, .part = 9, .to = 4, .epoch = 3 });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_REPLICA_ABORT, .part = 9, .epoch = 3 });
	cmd_roundtrip(&(struct rps__smap_cmd){ .type = RPS__SMAP_REPLICA_DROP, .part = 9, .id = 4, .epoch = 3 });
	c = cmd_failover(255, 1, 2, UINT64_MAX - 2, 2, (uint64_t[]){ 3, UINT64_MAX });
	memset(c.zone, 'q', RPS__SMAP_ZONE_MAX - 1);
	memset(c.uri, 'u', RPS__SMAP_URI_MAX - 1);
	cmd_roundtrip(&c);		/* the longest command there is */
	CU_ASSERT_EQUAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(buf[4], 2);
	c.nkeep = 3;
	CU_ASSERT_EQUAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), -EINVAL);
	memset(c.zone, 'q', RPS__SMAP_ZONE_MAX);
	c.nkeep = 0;
	CU_ASSERT_EQUAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), -EINVAL);

	/* a new type under version 1, and bad tails, are refused */
	c = cmd_repl(RPS__SMAP_REPLICA_DROP, 1, 2, 0, 3);
	CU_ASSERT_EQUAL_FATAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(len, 48 + 2);
	buf[4] = 1;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &cd), -EBADMSG);
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, 48, &cd), -EBADMSG);
	buf[4] = 2;
	buf[48] = 3;		/* too many backups kept */
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &cd), -EBADMSG);
	buf[48] = 0;
	buf[49] = RPS__SMAP_ZONE_MAX;	/* zone too long */
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len, &cd), -EBADMSG);
	buf[49] = 1;
	buf[50] = 0;		/* NUL in the zone */
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len + 1, &cd), -EBADMSG);
	buf[50] = 'x';
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len + 1, &cd), 0);
	CU_ASSERT_STRING_EQUAL(cd.zone, "x");
	/* an old type written as version 2 is read (and written back as 1) */
	c = cmd_abort(2, 5);
	CU_ASSERT_EQUAL_FATAL(rps__smap_cmd_encode(&c, buf, sizeof(buf), &len), 0);
	buf[4] = 2;
	buf[48] = 0;
	buf[49] = 0;
	CU_ASSERT_EQUAL(cmd_decode_exact(buf, len + 2, &cd), 0);
	CU_ASSERT_EQUAL(memcmp(&c, &cd, sizeof(c)), 0);
}

static void test_replica_print(void)
{
	static const char *const u3[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1" };
	static struct rps__smap m;
	const char *out;

	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, u3, 3, 6, 2), 0);
	accept_cmd(&m, cmd_zone(3, "r1"));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_DROP, 1, 3, 0, 1));
	accept_cmd(&m, cmd_repl(RPS__SMAP_REPLICA_BEGIN, 1, 0, 1, 2));
	out = capture(rps__smap_print, &m);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "replication: 2 copies of each partition, 1 under-replicated (UNDER-REPLICATED)\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "partitions 0,3 -> member 1 + backup 2 (epoch 1)\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "partition 1 -> member 2, seeding 1 (epoch 2)\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "  r1\n"));
	out = capture(rps__smap_print_json, &m);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "{\"applied\":"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, ",\"replicas\":2,\"under_replicated\":1,\"partitions\":["));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "{\"partition\":0,\"owner\":1,\"epoch\":1,\"moving_to\":0,\"lost\":0,"
				       "\"backups\":[2],\"joining\":0}"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "{\"partition\":1,\"owner\":2,\"epoch\":2,\"moving_to\":0,\"lost\":0,"
				       "\"backups\":[],\"joining\":1}"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "{\"id\":3,\"uri\":\"tcp://c:1\",\"zone\":\"r1\"}"));
}

/* ------------------------------------------------------------------------ */
/* printing */

static void test_print(void)
{
	static struct rps__smap m;
	static const char *const u[] = { "tcp://a:1", "x\"y\\z\n\x7f" };
	const char *out;

	CU_ASSERT_EQUAL_FATAL(rps__smap_init(&m, u, 2, 3), 0);
	accept_cmd(&m, cmd_begin(2, 1, 2, 1));
	m.applied = 1;
	out = capture(rps__smap_print_json, &m);
	CU_ASSERT_STRING_EQUAL(out,
		"{\"applied\":1,\"partitions\":["
		"{\"partition\":0,\"owner\":1,\"epoch\":1,\"moving_to\":0,\"lost\":0},"
		"{\"partition\":1,\"owner\":2,\"epoch\":1,\"moving_to\":0,\"lost\":0},"
		"{\"partition\":2,\"owner\":1,\"epoch\":1,\"moving_to\":2,\"lost\":0}],"
		"\"members\":[{\"id\":1,\"uri\":\"tcp://a:1\"},"
		"{\"id\":2,\"uri\":\"x\\\"y\\\\z\\u000a\\u007f\"}]}\n");

	init3(&m, 16);
	accept_cmd(&m, cmd_begin(7, 2, 3, 1));
	accept_cmd(&m, cmd_begin(0, 1, 2, 1));
	accept_cmd(&m, cmd_commit(0, 2, 1));
	accept_cmd(&m, cmd_begin(0, 2, 3, 2));
	accept_cmd(&m, cmd_commit(0, 3, 2));
	/* 9 and 12 join member 3 under a newer epoch: a group of their own */
	accept_cmd(&m, cmd_begin(9, 1, 3, 1));
	accept_cmd(&m, cmd_commit(9, 3, 1));
	accept_cmd(&m, cmd_begin(12, 1, 3, 1));
	accept_cmd(&m, cmd_commit(12, 3, 1));
	out = capture(rps__smap_print, &m);
	CU_ASSERT(strstr(out, "tcp://10.0.0.1:7000") != NULL);
	CU_ASSERT(strstr(out, "     1  tcp://10.0.0.1:7000  3\n") != NULL);
	CU_ASSERT(strstr(out, "     2  tcp://10.0.0.2:7000  5\n") != NULL);
	CU_ASSERT(strstr(out, "     3  tcp://10.0.0.3:7000  8\n") != NULL);
	CU_ASSERT(strstr(out, "partition 0 -> member 3 (epoch 3)\n") != NULL);
	CU_ASSERT(strstr(out, "partitions 1,4,10,13 -> member 2 (epoch 1)\n") != NULL);
	CU_ASSERT(strstr(out, "partitions 2,5,8,11,14 -> member 3 (epoch 1)\n") != NULL);
	CU_ASSERT(strstr(out, "partitions 3,6,15 -> member 1 (epoch 1)\n") != NULL);
	CU_ASSERT(strstr(out, "partition 7 -> member 2, moving to 3 (epoch 1)\n") != NULL);
	CU_ASSERT(strstr(out, "partitions 9,12 -> member 3 (epoch 2)\n") != NULL);

	init3(&m, 40);
	m.nmembers = 1;		/* a one-member map prints its partitions as one range */
	memset(&m.members[1], 0, 2 * sizeof(m.members[0]));
	for (uint32_t p = 0; p < m.npart; p++)
		m.parts[p].owner = 1;
	out = capture(rps__smap_print, &m);
	CU_ASSERT(strstr(out, "\npartitions 0-39 -> member 1 (epoch 1)\n") != NULL);
	m.parts[5].epoch = 2;
	m.parts[39].epoch = 2;
	out = capture(rps__smap_print, &m);
	CU_ASSERT(strstr(out, "\npartitions 0-4,6-38 -> member 1 (epoch 1)\n") != NULL);
	CU_ASSERT(strstr(out, "\npartitions 5,39 -> member 1 (epoch 2)\n") != NULL);
}

/* ------------------------------------------------------------------------ */
/* determinism */

static uint64_t pick_member(const struct rps__smap *m)
{
	if (rng() % 10 == 0)
		return rng() % (m->max_id + 3);
	return m->members[rng() % m->nmembers].id;
}

/* A command that is plausible given m most of the time and wrong in some
 * way the rest of the time. */
static struct rps__smap_cmd random_cmd(const struct rps__smap *m)
{
	struct rps__smap_cmd c;
	unsigned t = (unsigned)(rng() % 100);
	uint32_t part = (uint32_t)(rng() % m->npart);
	const struct rps__smap_part *p;
	uint64_t epoch;

	if (rng() % 25 == 0)
		part = m->npart + (uint32_t)(rng() % 3);
	p = part < m->npart ? &m->parts[part] : &m->parts[0];
	epoch = p->epoch;
	if (rng() % 6 == 0)
		epoch = epoch + (rng() % 3) - 1;
	if (t < 2) {
		c = cmd_abort(part, epoch);
		c.type = (rng() & 1) ? 0 : 6 + (uint32_t)(rng() % 10);
	} else if (t < 12) {
		char uri[64];
		uint64_t id = m->max_id + 1;

		if (rng() % 5 == 0)
			id = pick_member(m);
		snprintf(uri, sizeof(uri), "tcp://10.0.0.%u:7000", (unsigned)(rng() % 24));
		c = cmd_add(id, rng() % 30 ? uri : "");
	} else if (t < 22) {
		c = cmd_remove(pick_member(m));
	} else if (t < 55) {
		uint64_t from = rng() % 6 ? p->owner : pick_member(m);

		c = cmd_begin(part, from, pick_member(m), epoch);
	} else if (t < 85) {
		c = cmd_commit(part, p->moving_to && rng() % 6 ? p->moving_to : pick_member(m), epoch);
	} else {
		c = cmd_abort(part, epoch);
	}
	return c;
}

static void test_determinism(void)
{
	static const char *const u4[] = { "tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000", "tcp://10.0.0.3:7000",
					  "tcp://10.0.0.4:7000" };
	static struct rps__smap a, b, prev, d;
	static uint8_t enc[RPS__SMAP_ENC_MAX];
	unsigned ok[8] = { 0 }, refused[8] = { 0 };
	uint64_t index = 0;

	memset(&a, 0x11, sizeof(a));
	memset(&b, 0x22, sizeof(b));
	CU_ASSERT_EQUAL_FATAL(rps__smap_init(&a, u4, 4, 24), 0);
	CU_ASSERT_EQUAL_FATAL(rps__smap_init(&b, u4, 4, 24), 0);
	CU_ASSERT_EQUAL_FATAL(memcmp(&a, &b, sizeof(a)), 0);

	for (int step = 0; step < 5000; step++) {
		struct rps__smap_cmd c = random_cmd(&a), cb;
		uint8_t wire[RPS__SMAP_CMD_MAX];
		size_t wlen = 0;
		int rc_check, rc_a, rc_b;
		const char *why;

		index += 1 + rng() % 3;	/* Raft indexes may skip (conf changes, no-ops) */
		memcpy(&prev, &a, sizeof(a));
		rc_check = rps__smap_check(&a, &c);
		rc_a = rps__smap_apply(&a, index, &c);
		/* replica b gets the command through the wire format when it has one */
		if (rps__smap_cmd_encode(&c, wire, sizeof(wire), &wlen) == 0 &&
		    rps__smap_cmd_decode(wire, wlen, &cb) == 0) {
			CU_ASSERT_EQUAL(memcmp(&cb, &c, sizeof(c)), 0);
		} else {
			cb = c;
		}
		rc_b = rps__smap_apply(&b, index, &cb);
		CU_ASSERT_EQUAL(rc_check, rc_a);
		CU_ASSERT_EQUAL(rc_a, rc_b);
		CU_ASSERT_EQUAL(a.applied, index);
		CU_ASSERT_EQUAL_FATAL(memcmp(&a, &b, sizeof(a)), 0);
		why = invariant_broken(&a);
		if (why)
			fprintf(stderr, "step %d: %s\n", step, why);
		CU_ASSERT_PTR_NULL_FATAL(why);
		for (uint32_t p = 0; p < a.npart; p++) {
			CU_ASSERT(a.parts[p].epoch >= prev.parts[p].epoch);
			/* the owner changes only with a new epoch */
			if (a.parts[p].owner != prev.parts[p].owner)
				CU_ASSERT_EQUAL(a.parts[p].epoch, prev.parts[p].epoch + 1);
		}
		CU_ASSERT(a.max_id >= prev.max_id);
		if (rc_a) {
			prev.applied = index;
			CU_ASSERT_EQUAL(memcmp(&prev, &a, sizeof(a)), 0);
		}
		if (c.type <= 7)
			(rc_a ? refused : ok)[c.type]++;
		if (step % 97 == 0) {
			size_t len = 0;

			CU_ASSERT_EQUAL(rps__smap_encode(&a, enc, sizeof(enc), &len), 0);
			CU_ASSERT_EQUAL(rps__smap_decode(enc, len, &d), 0);
			CU_ASSERT_EQUAL(memcmp(&a, &d, sizeof(a)), 0);
		}
	}
	/* the walk went everywhere: every type both accepted and refused */
	for (unsigned t = RPS__SMAP_ADD_MEMBER; t <= RPS__SMAP_MOVE_ABORT; t++) {
		CU_ASSERT(ok[t] >= 10);
		CU_ASSERT(refused[t] >= 10);
	}
	CU_ASSERT_EQUAL(ok[0], 0);
	CU_ASSERT_EQUAL(ok[7], 0);
}

/* Like random_cmd, over every command type, replica sets included. */
static struct rps__smap_cmd random_repl_cmd(const struct rps__smap *m)
{
	unsigned t = (unsigned)(rng() % 100);
	uint32_t part = (uint32_t)(rng() % m->npart);
	const struct rps__smap_part *p = &m->parts[part];
	uint64_t epoch = p->epoch, b0 = p->backups[0] ? p->backups[0] : pick_member(m);
	struct rps__smap_cmd c;

	if (rng() % 8 == 0)
		epoch = epoch + (rng() % 3) - 1;
	if (t < 30)
		return random_cmd(m);
	if (t < 33)
		return cmd_repl(RPS__SMAP_SET_REPLICAS, 0, rng() % 5, 0, 0);
	if (t < 37)
		return cmd_zone(pick_member(m), (const char *[]){ "", "a", "b", "c" }[rng() % 4]);
	if (t < 42)
		return cmd_lost((rng() & 1) ? RPS__SMAP_MARK_LOST : RPS__SMAP_CLEAR_LOST, part, p->owner, epoch);
	if (t < 45)
		return cmd_repl(RPS__SMAP_FORCE_REMOVE, 0, pick_member(m), 0, 0);
	if (t < 62)
		return cmd_repl(RPS__SMAP_REPLICA_BEGIN, part, 0,
				rng() % 4 ? rps__smap_pick_backup(m, part, NULL, NULL) : pick_member(m), epoch);
	if (t < 74)
		return cmd_repl(RPS__SMAP_REPLICA_COMMIT, part, 0, p->joining && rng() % 5 ? p->joining : pick_member(m),
				epoch);
	if (t < 78)
		return cmd_repl(RPS__SMAP_REPLICA_ABORT, part, 0, 0, epoch);
	if (t < 85)
		return cmd_repl(RPS__SMAP_REPLICA_DROP, part, rng() % 4 ? b0 : pick_member(m), 0, epoch);
	if (t < 86)
		return cmd_repl(RPS__SMAP_SET_WITNESS, 0, pick_member(m), 0, 0);
	c = cmd_failover(part, rng() % 6 ? p->owner : pick_member(m), rng() % 6 ? b0 : pick_member(m), epoch, 0, NULL);
	if (p->backups[1] && rng() % 3) {
		c.nkeep = 1;
		c.keep[0] = p->backups[0] == c.to ? p->backups[1] : p->backups[0];
	}
	return c;
}

/* Two replicas of a replicated map fed the same random commands (one
 * through the wire format) stay byte-identical; every map is valid and
 * round-trips; an owner changes only with a new epoch, and a failover's
 * new primary was a backup of the epoch before. */
static void test_replica_determinism(void)
{
	static const char *const u5[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1", "tcp://e:1" };
	static struct rps__smap a, b, prev, d;
	static uint8_t enc[RPS__SMAP_ENC_MAX];
	unsigned ok[RPS__SMAP_CMD_LAST + 1] = { 0 };
	uint64_t index = 0;

	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&a, u5, 5, 16, 2), 0);
	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&b, u5, 5, 16, 2), 0);
	for (int step = 0; step < 20000; step++) {
		struct rps__smap_cmd c = random_repl_cmd(&a), cb = c;
		uint8_t wire[RPS__SMAP_CMD_MAX];
		size_t wlen = 0, len = 0;
		int rc_a, rc_b;
		const char *why;

		if (a.nmembers - rps__smap_nwitnesses(&a) < 3 && rng() % 2) {	/* keep the cluster from dwindling */
			char uri[32];

			snprintf(uri, sizeof(uri), "tcp://n%llu:1", (unsigned long long)a.max_id + 1);
			c = cmd_add(a.max_id + 1, uri);
			cb = c;
		}
		index++;
		memcpy(&prev, &a, sizeof(a));
		rc_a = rps__smap_apply(&a, index, &c);
		if (rps__smap_cmd_encode(&c, wire, sizeof(wire), &wlen) == 0 &&
		    c.type >= RPS__SMAP_ADD_MEMBER && c.type <= RPS__SMAP_CMD_LAST) {
			CU_ASSERT_EQUAL_FATAL(rps__smap_cmd_decode(wire, wlen, &cb), 0);
			CU_ASSERT_EQUAL(memcmp(&cb, &c, sizeof(c)), 0);
		}
		rc_b = rps__smap_apply(&b, index, &cb);
		CU_ASSERT_EQUAL(rc_a, rc_b);
		CU_ASSERT_EQUAL_FATAL(memcmp(&a, &b, sizeof(a)), 0);
		why = invariant_broken(&a);
		if (why) {
			char what[256];

			rps__smap_cmd_str(&c, what, sizeof(what));
			fprintf(stderr, "step %d: %s: \"%s\" (%d) made\n", step, why, what, rc_a);
			rps__smap_print(&prev, stderr);
			fprintf(stderr, "into\n");
			rps__smap_print(&a, stderr);
		}
		CU_ASSERT_PTR_NULL_FATAL(why);
		if (!rc_a && c.type <= RPS__SMAP_CMD_LAST)
			ok[c.type]++;
		for (uint32_t p = 0; p < a.npart; p++) {
			CU_ASSERT(a.parts[p].epoch >= prev.parts[p].epoch);
			if (a.parts[p].owner != prev.parts[p].owner)
				CU_ASSERT_EQUAL(a.parts[p].epoch, prev.parts[p].epoch + 1);
			if (!rc_a && c.type == RPS__SMAP_FAILOVER && p == c.part)
				CU_ASSERT_EQUAL(rps__smap_role(&prev, p, a.parts[p].owner), RPS__SMAP_ROLE_BACKUP);
			/* a backup appears only through a commit of its seeding */
			for (uint32_t k = 0; k < rps__smap_nbackups(&a, p); k++)
				if (rps__smap_role(&prev, p, a.parts[p].backups[k]) != RPS__SMAP_ROLE_BACKUP)
					CU_ASSERT_EQUAL(prev.parts[p].joining, a.parts[p].backups[k]);
		}
		CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&a, enc, sizeof(enc), &len), 0);
		CU_ASSERT_EQUAL(len, rps__smap_encoded_size(&a));
		CU_ASSERT_EQUAL(enc[4], rps__smap_nwitnesses(&a) ? 4 : rps__smap_replicated(&a) ? 3 :
				rps__smap_nlost(&a) ? 2 : 1);
		CU_ASSERT_EQUAL_FATAL(rps__smap_decode(enc, len, &d), 0);
		CU_ASSERT_EQUAL_FATAL(memcmp(&a, &d, sizeof(a)), 0);
	}
	/* the walk went everywhere */
	for (unsigned t = RPS__SMAP_SET_REPLICAS; t <= RPS__SMAP_CMD_LAST; t++)
		CU_ASSERT(ok[t] >= 10);
	CU_ASSERT(ok[RPS__SMAP_FORCE_REMOVE] >= 10);
}

/* SET_WITNESS (doc/design.md "Small clusters: the witness"): the member's partitions pass to their
 * backups, it leaves every set, it is never placed again; the map keeps
 * version 3 bytes until a member has a flag, then says so in version 4. */
static void test_witness(void)
{
	static const char *const u3[] = { "tcp://a:1", "tcp://b:1", "tcp://c:1" };
	static struct rps__smap m, before, d;
	static uint8_t enc[RPS__SMAP_ENC_MAX];
	struct rps__smap_cmd c;
	char *text = NULL;
	size_t len = 0, tlen = 0;
	uint64_t idx = 1;
	FILE *f;

	CU_ASSERT_EQUAL_FATAL(rps__smap_init_replicated(&m, u3, 3, 6, 2), 0);
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, enc, sizeof(enc), &len), 0);
	CU_ASSERT_EQUAL(enc[4], 3);
	before = m;
	c = cmd_repl(RPS__SMAP_SET_WITNESS, 0, 3, 0, 0);
	CU_ASSERT_EQUAL(rps__smap_apply(&m, idx++, &c), 0);
	CU_ASSERT_TRUE(rps__smap_is_witness(&m, 3));
	CU_ASSERT_FALSE(rps__smap_is_witness(&m, 1) || rps__smap_is_witness(&m, 2) || rps__smap_is_witness(&m, 9));
	CU_ASSERT_EQUAL(rps__smap_nwitnesses(&m), 1);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 0);
	CU_ASSERT_EQUAL(rps__smap_backed(&m, 3), 0);
	for (uint32_t p = 0; p < 6; p++) {
		const struct rps__smap_part *b = &before.parts[p], *a = &m.parts[p];

		if (b->owner == 3) {	/* its backup holds what it acknowledged: it leads */
			CU_ASSERT_EQUAL(a->owner, b->backups[0]);
			CU_ASSERT_EQUAL(rps__smap_nbackups(&m, p), 0);
			CU_ASSERT_EQUAL(a->epoch, b->epoch + 1);
		} else if (b->backups[0] == 3) {
			CU_ASSERT_EQUAL(a->owner, b->owner);
			CU_ASSERT_EQUAL(rps__smap_nbackups(&m, p), 0);
			CU_ASSERT_EQUAL(a->epoch, b->epoch + 1);
		} else {
			CU_ASSERT_EQUAL(memcmp(a, b, sizeof(*a)), 0);
		}
	}
	/* never placed, moved to or seeded again */
	for (uint32_t p = 0; p < 6; p++)
		CU_ASSERT_NOT_EQUAL(rps__smap_pick_backup(&m, p, NULL, NULL), 3);
	c = cmd_repl(RPS__SMAP_REPLICA_BEGIN, 0, 0, 3, m.parts[0].epoch);
	CU_ASSERT_EQUAL(rps__smap_check(&m, &c), -EINVAL);
	c = cmd_begin(0, m.parts[0].owner, 3, m.parts[0].epoch);
	CU_ASSERT_EQUAL(rps__smap_check(&m, &c), -EINVAL);
	/* once is enough; a member owning a partition without a backup
	 * cannot become one */
	c = cmd_repl(RPS__SMAP_SET_WITNESS, 0, 3, 0, 0);
	CU_ASSERT_EQUAL(rps__smap_check(&m, &c), -EALREADY);
	c = cmd_repl(RPS__SMAP_SET_WITNESS, 0, 2, 0, 0);
	CU_ASSERT_EQUAL(rps__smap_check(&m, &c), -EBUSY);
	c = cmd_repl(RPS__SMAP_SET_WITNESS, 0, 7, 0, 0);
	CU_ASSERT_EQUAL(rps__smap_check(&m, &c), -ENOENT);
	/* version 4 round-trips; the witness shows in the table and JSON */
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, enc, sizeof(enc), &len), 0);
	CU_ASSERT_EQUAL(enc[4], 4);
	CU_ASSERT_EQUAL(len, rps__smap_encoded_size(&m));
	CU_ASSERT_EQUAL_FATAL(rps__smap_decode(enc, len, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &d, sizeof(m)), 0);
	f = open_memstream(&text, &tlen);
	CU_ASSERT_FATAL(f != NULL);
	rps__smap_print(&m, f);
	rps__smap_print_json(&m, f);
	fclose(f);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "tcp://c:1  0  0  -  witness (votes, holds no partitions)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "{\"id\":3,\"uri\":\"tcp://c:1\",\"zone\":\"\",\"witness\":true}"));
	CU_ASSERT_PTR_NULL(strstr(text, "{\"id\":2,\"uri\":\"tcp://b:1\",\"zone\":\"\",\"witness\""));
	free(text);
	/* a member flag this build does not know, or a witness holding a
	 * partition, is refused by the decoder */
	d = m;
	d.members[2].flags = 2;
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&d, enc, sizeof(enc), &len), 0);
	CU_ASSERT_EQUAL(rps__smap_decode(enc, len, &before), -EBADMSG);
	d = m;
	d.members[1].flags = RPS__SMAP_WITNESS;
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&d, enc, sizeof(enc), &len), 0);
	CU_ASSERT_EQUAL(rps__smap_decode(enc, len, &before), -EBADMSG);
	/* forced removal never gives a partition to the witness, and the
	 * last member that is not one stays */
	c = cmd_repl(RPS__SMAP_FORCE_REMOVE, 0, 1, 0, 0);
	CU_ASSERT_EQUAL(rps__smap_apply(&m, idx++, &c), 0);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 2), 6);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 3), 0);
	c = cmd_repl(RPS__SMAP_FORCE_REMOVE, 0, 2, 0, 0);
	CU_ASSERT_EQUAL(rps__smap_check(&m, &c), -EBUSY);
	c = cmd_repl(RPS__SMAP_FORCE_REMOVE, 0, 3, 0, 0);
	CU_ASSERT_EQUAL(rps__smap_apply(&m, idx++, &c), 0);
	CU_ASSERT_EQUAL(rps__smap_nwitnesses(&m), 0);
	CU_ASSERT_EQUAL_FATAL(rps__smap_encode(&m, enc, sizeof(enc), &len), 0);
	CU_ASSERT_EQUAL(enc[4], 3);	/* no flag left: version 3 again */
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "bootstrap placement and limits", test_init },
		{ "partition of a shard", test_part_of },
		{ "add member: accepted and refused", test_add_member },
		{ "add member: an unparseable address refused when applied", test_add_member_bad_uri },
		{ "remove member: only when it owns nothing", test_remove_member },
		{ "move begin and commit", test_move_commit },
		{ "move abort", test_move_abort },
		{ "lost partitions: marked, cleared, forced removal", test_lost_partitions },
		{ "messages, names and replayed indexes", test_messages },
		{ "map round-trips byte-identical", test_map_roundtrip },
		{ "map truncation and flipped bits refused", test_map_truncated_and_flipped },
		{ "map with invalid content refused", test_map_invalid_content },
		{ "map garbage never crashes", test_map_garbage },
		{ "command codec", test_cmd_codec },
		{ "table and JSON output", test_print },
		{ "replica sets: bootstrap placement", test_replica_init },
		{ "replica sets: seeding, dropping, refusals", test_replica_seeding },
		{ "replica sets: failover and forced removal", test_replica_failover },
		{ "replica sets: zones and placement", test_zones_and_placement },
		{ "replica sets: codecs keep old bytes", test_replica_codecs },
		{ "replica sets: table and JSON", test_replica_print },
		{ "replicas stay identical under random commands", test_determinism },
		{ "replica sets: random commands keep replicas identical", test_replica_determinism },
		{ "witness: handed over, never placed, encoded compatibly", test_witness },
		{ "balancing moves: even, planned switches first, never the dead, lost or a witness", test_balance },
	};
	const struct cutest_suite suites[] = {
		{ "smap", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
