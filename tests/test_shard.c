/*
 * test_shard.c - unit tests of placement, shard layout, lock-word encoding
 * and address parsing.
 */
#include "config.h"
#include "proto/shard.h"
#include "transport/uri.h"
#include "lib/cutest.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void test_lock_word(void)
{
	uint64_t w = rps__lock_locked(123456789ull, 32767);

	CU_ASSERT_TRUE(rps__lock_is_locked(w));
	CU_ASSERT_EQUAL(rps__lock_owner(w), 32767u);
	CU_ASSERT_EQUAL(rps__lock_version(w), 123456789ull);
	w = rps__lock_unlocked(77);
	CU_ASSERT_FALSE(rps__lock_is_locked(w));
	CU_ASSERT_EQUAL(rps__lock_owner(w), 0u);
	CU_ASSERT_EQUAL(rps__lock_version(w), 77u);
	/* The owner field never spills into the version. */
	CU_ASSERT_EQUAL(rps__lock_version(rps__lock_locked(5, 0xffffffffu)), 5u);
	CU_ASSERT_EQUAL(rps__lock_locked(0, 1), 3u);
	/* unlocked(v) and locked(v, o) differ, so a CAS on one never matches the other */
	CU_ASSERT_NOT_EQUAL(rps__lock_unlocked(9), rps__lock_locked(9, 1));
}

static void test_layout_covers_every_element_once(void)
{
	static const uint64_t counts[] = { 1, 7, 16384, 16385, 100000, 3 * 16384 };
	uint32_t nservers;
	size_t c;

	for (c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
		for (nservers = 1; nservers <= 5; nservers++) {
			struct rps__layout l;
			uint64_t covered = 0;
			uint32_t s, j, total = 0;
			CU_ASSERT_EQUAL_FATAL(rps__layout_init(&l, "tensor", counts[c], 16384, nservers), 0);
			CU_ASSERT_EQUAL(l.nshards, (counts[c] + 16383) / 16384);
			for (s = 0; s < l.nshards; s++) {
				CU_ASSERT_EQUAL(rps__shard_first(&l, s), covered);
				covered += rps__shard_elems(&l, s);
			}
			CU_ASSERT_EQUAL(covered, counts[c]);
			/* every shard is listed by exactly its server, at its local index */
			for (s = 0; s < nservers; s++) {
				uint32_t n = rps__part_nshards(&l, s);
				for (j = 0; j < n; j++) {
					uint32_t g = rps__part_shard(&l, s, j);
					CU_ASSERT_EQUAL(rps__shard_server(&l, g), s);
					CU_ASSERT_EQUAL(rps__shard_local_index(&l, g), j);
				}
				total += n;
			}
			CU_ASSERT_EQUAL(total, l.nshards);
		}
}

/* Counts near 2^64 used to wrap in the shard count: 2^64-1 elements made
 * 0 shards and the tensor was accepted. */
static void test_layout_refuses_count_overflow(void)
{
	struct rps__layout l;

	CU_ASSERT_EQUAL(rps__layout_init(&l, "t", UINT64_MAX, 16384, 4), -EFBIG);
	CU_ASSERT_EQUAL(rps__layout_init(&l, "t", UINT64_MAX - 100, 262144, 64), -EFBIG);
	CU_ASSERT_EQUAL(rps__layout_init(&l, "t", UINT64_MAX, 1u << 28, 1), -EFBIG);
	/* the largest count that fits: 2^32-1 full shards */
	CU_ASSERT_EQUAL(rps__layout_init(&l, "t", (uint64_t)UINT32_MAX * 16, 16, 1), 0);
	CU_ASSERT_EQUAL(l.nshards, UINT32_MAX);
	CU_ASSERT_EQUAL(rps__layout_init(&l, "t", (uint64_t)UINT32_MAX * 16 + 1, 16, 1), -EFBIG);
}

static void test_layout_spreads_and_is_deterministic(void)
{
	struct rps__layout a, b;
	uint32_t per[4] = { 0 }, s;

	CU_ASSERT_EQUAL(rps__layout_init(&a, "embedding", 400 * 1024, 1024, 4), 0);
	CU_ASSERT_EQUAL(rps__layout_init(&b, "embedding", 400 * 1024, 1024, 4), 0);
	CU_ASSERT_EQUAL(memcmp(&a, &b, sizeof(a)), 0);
	for (s = 0; s < a.nshards; s++)
		per[rps__shard_server(&a, s)]++;
	for (s = 0; s < 4; s++)
		CU_ASSERT_EQUAL(per[s], 100u);
	CU_ASSERT_EQUAL(rps__name_hash(""), 2166136261u);
	CU_ASSERT_EQUAL(rps__name_hash("a"), 0xe40c292cu);	/* FNV-1a test vector */
	CU_ASSERT_EQUAL(rps__layout_init(&a, "x", 0, 1024, 4), -EINVAL);
	CU_ASSERT_EQUAL(rps__layout_init(&a, "x", 10, 0, 4), -EINVAL);
	CU_ASSERT_EQUAL(rps__layout_init(&a, "x", 10, 16, 0), -EINVAL);
	CU_ASSERT_EQUAL(rps__layout_init(&a, "x", (uint64_t)UINT32_MAX * 2 + 5, 1, 1), -EFBIG);
}

static void test_stride(void)
{
	CU_ASSERT_EQUAL(rps__shard_stride(1), 128u);
	CU_ASSERT_EQUAL(rps__shard_stride(16), 128u);
	CU_ASSERT_EQUAL(rps__shard_stride(17), 192u);
	CU_ASSERT_EQUAL(rps__shard_stride(262144), 64u + 1048576u);
}

static void test_uri(void)
{
	struct rps__uri u, *list;
	char buf[300];
	int n;

	CU_ASSERT_EQUAL(rps__uri_parse("tcp://127.0.0.1:7000", &u), 0);
	CU_ASSERT_EQUAL(u.kind, RPS__KIND_TCP);
	CU_ASSERT_STRING_EQUAL(u.host, "127.0.0.1");
	CU_ASSERT_EQUAL(u.port, 7000);
	CU_ASSERT_EQUAL(rps__uri_parse("verbs://10.0.2.15:0", &u), 0);
	CU_ASSERT_EQUAL(u.kind, RPS__KIND_VERBS);
	CU_ASSERT_EQUAL(u.port, 0);
	CU_ASSERT_EQUAL(rps__uri_parse("tcp://[::1]:9", &u), 0);
	CU_ASSERT_STRING_EQUAL(u.host, "::1");
	CU_ASSERT_STRING_EQUAL(rps__uri_str(&u, buf, sizeof(buf)), "tcp://[::1]:9");
	CU_ASSERT_EQUAL(rps__uri_parse("udp://h:1", &u), -EINVAL);
	CU_ASSERT_EQUAL(rps__uri_parse("tcp://h", &u), -EINVAL);
	CU_ASSERT_EQUAL(rps__uri_parse("tcp://h:65536", &u), -EINVAL);
	CU_ASSERT_EQUAL(rps__uri_parse("tcp://h:12x", &u), -EINVAL);
	CU_ASSERT_EQUAL(rps__uri_parse("tcp://:1", &u), -EINVAL);
	CU_ASSERT_EQUAL(rps__uri_list_parse("tcp://a:1,tcp://b:2", &list, &n), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_STRING_EQUAL(list[1].host, "b");
	free(list);
	CU_ASSERT_EQUAL(rps__uri_list_parse("tcp://a:1,verbs://b:2", &list, &n), -EINVAL);
	CU_ASSERT_EQUAL(rps__uri_list_parse("", &list, &n), -EINVAL);
	CU_ASSERT_EQUAL(rps__uri_list_parse(",", &list, &n), -EINVAL);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "lock word encoding", test_lock_word },
		{ "layout covers every element once", test_layout_covers_every_element_once },
		{ "layout spreads evenly, deterministically", test_layout_spreads_and_is_deterministic },
		{ "layout refuses counts whose shard count overflows", test_layout_refuses_count_overflow },
		{ "shard stride", test_stride },
		{ "address parsing", test_uri },
	};
	const struct cutest_suite suites[] = {
		{ "shard", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
