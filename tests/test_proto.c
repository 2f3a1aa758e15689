/*
 * test_proto.c - unit tests of the wire codecs: every message type builds
 * and validates; truncated, oversized, mistyped and garbage input is refused
 * with -EBADMSG (or -EPROTO for a foreign byte order), never read past.
 */
#include "config.h"
#include "proto/proto.h"
#include "lib/cutest.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static char buf[RPS__BIG_MSG_MAX];

static void test_roundtrip_every_type(void)
{
	unsigned type;

	for (type = 1; type < RPS__MSG_TYPE_MAX; type++) {
		char body[RPS__BIG_MSG_MAX / 2];
		long n = rps__msg_body_size(type);
		size_t len;
		struct rps__msg_hdr h;
		bool var = n == RPS__BODY_VAR;

		if (var) {
			/* variable bodies: at least the fixed part, any length above */
			size_t min = rps__msg_body_min(type);
			if (min) {
				len = rps__msg_build(buf, type, 1, 0, body, min - 1);
				CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
			}
			n = (long)min + 100;
		}
		CU_ASSERT_FATAL(n >= 0);
		memset(body, 0x5a, sizeof(body));
		if (type == RPS__MSG_ADMIN)
			memcpy(body + offsetof(struct rps__admin, uri), "tcp://x:1", 10);
		if (type == RPS__MSG_ADMIN_REP)
			body[offsetof(struct rps__admin_rep, msg)] = 0;
		if (type == RPS__MSG_RANK || type == RPS__MSG_RANK_REP) {
			/* an unterminated tensor name or message is refused */
			len = rps__msg_build(buf, type, 1, 0, body, (size_t)n);
			CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
			if (type == RPS__MSG_RANK)
				memcpy(body + offsetof(struct rps__rank_req, name), "w", 2);
			else
				body[offsetof(struct rps__rank_rep, msg)] = 0;
		}
		if (type == RPS__MSG_CKPT) {
			struct rps__ckpt_req c = { .ntargets = 1 };
			memcpy(body, &c, sizeof(c));
			n = sizeof(c) + sizeof(struct rps__ckpt_target);
			len = rps__msg_build(buf, type, 0x1122334455667788ull, 0, body, (size_t)n);
			CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
			CU_ASSERT_EQUAL(rps__msg_check(buf, len - 1), -EBADMSG);
			continue;
		}
		if (type == RPS__MSG_CKPT_REP) {
			struct rps__ckpt_rep c = { .ntargets = 2 };
			memcpy(body, &c, sizeof(c));
			n = sizeof(c) + 2 * sizeof(struct rps__ckpt_target);
			len = rps__msg_build(buf, type, 0x1122334455667788ull, 0, body, (size_t)n);
			CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
			CU_ASSERT_EQUAL(rps__msg_check(buf, len + sizeof(struct rps__ckpt_target)), -EBADMSG);
			continue;
		}
		if (type == RPS__MSG_CREATE)
			memcpy(body, "name", 5);
		if (type == RPS__MSG_AUTH || type == RPS__MSG_AUTH_REP) {
			/* an unterminated scope or reason, or AUTH's reserved word set, is refused */
			len = rps__msg_build(buf, type, 1, 0, body, (size_t)n);
			CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
			if (type == RPS__MSG_AUTH) {
				struct rps__auth a = { .key_role = 3 };
				memcpy(body, &a, sizeof(a));	/* scope "", reserved 0 */
			} else {
				body[offsetof(struct rps__auth_rep, why)] = 0;
			}
		}
		if (type == RPS__MSG_STEP_DONE) {
			uint32_t one = 1;
			memcpy(body, &one, sizeof(one));
		}
		if (type == RPS__MSG_HELLO || type == RPS__MSG_HELLO_REP) {
			uint64_t m = RPS__HELLO_MAGIC;
			memcpy(body, &m, sizeof(m));
		}
		len = rps__msg_build(buf, type, 0x1122334455667788ull, 0, body, (size_t)n);
		CU_ASSERT_EQUAL(len, sizeof(struct rps__msg_hdr) + (size_t)n);
		CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
		memcpy(&h, buf, sizeof(h));
		CU_ASSERT_EQUAL(h.type, type);
		CU_ASSERT_EQUAL(h.req_id, 0x1122334455667788ull);
		CU_ASSERT_EQUAL(memcmp(rps__msg_body(buf), body, (size_t)n), 0);
		/* one byte short, one byte long: refused */
		if (var)
			continue;
		if (n > 0)
			CU_ASSERT_EQUAL(rps__msg_check(buf, len - 1), -EBADMSG);
		CU_ASSERT_EQUAL(rps__msg_check(buf, len + 1), -EBADMSG);
	}
}

static void test_malformed(void)
{
	struct rps__msg_hdr h;
	struct rps__wait w = { 0 };
	size_t len = rps__msg_build(buf, RPS__MSG_WAIT, 1, 0, &w, sizeof(w));
	unsigned i;

	CU_ASSERT_EQUAL(rps__msg_check(buf, 0), -EBADMSG);
	CU_ASSERT_EQUAL(rps__msg_check(buf, sizeof(h) - 1), -EBADMSG);
	/* bad magic */
	memcpy(&h, buf, sizeof(h));
	h.magic ^= 1;
	memcpy(buf, &h, sizeof(h));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	h.magic ^= 1;
	/* unknown types */
	h.type = 0;
	memcpy(buf, &h, sizeof(h));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	h.type = RPS__MSG_TYPE_MAX;
	memcpy(buf, &h, sizeof(h));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	/* a body that does not fit the type */
	h.type = RPS__MSG_CREATE;
	memcpy(buf, &h, sizeof(h));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	/* header length lies */
	h.type = RPS__MSG_WAIT;
	h.len = (uint32_t)len + 8;
	memcpy(buf, &h, sizeof(h));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	/* random garbage never passes as anything but an accident of magic */
	srand(1);
	for (i = 0; i < 10000; i++) {
		size_t n = (size_t)(rand() % (int)sizeof(buf)), k;
		for (k = 0; k < n; k++)
			buf[k] = (char)rand();
		CU_ASSERT_EQUAL(rps__msg_check(buf, n), -EBADMSG);
	}
}

static void test_error_reply_without_body(void)
{
	size_t len = rps__msg_build(buf, RPS__MSG_CREATE_REP, 3, -ENOENT, NULL, 0);

	CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
	/* but a success reply must carry its body */
	len = rps__msg_build(buf, RPS__MSG_CREATE_REP, 3, 0, NULL, 0);
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
}

/* A reply may be a bare header when it reports an error; a request never:
 * its handler would read a body that did not arrive. */
static bool is_reply(unsigned type)
{
	switch (type) {
	case RPS__MSG_HELLO_REP: case RPS__MSG_CREATE_REP: case RPS__MSG_PUSH_ACK: case RPS__MSG_WAIT_REP:
	case RPS__MSG_BARRIER_REP: case RPS__MSG_PROPOSE_REP: case RPS__MSG_MIGRATE_REP:
	case RPS__MSG_STATUS_REP: case RPS__MSG_ADMIN_REP: case RPS__MSG_CKPT_REP: case RPS__MSG_RANK_REP:
	case RPS__MSG_LEASE_REP:
		return true;
	default:
		return false;
	}
}

/* The libFuzzer reproducer: HELLO_REP, 24 bytes, status -1, garbage in the
 * reserved word.  Checked in a buffer of exactly its size, so an ASan build
 * catches any read past it. */
static void test_header_only_hello_rep_not_read_past(void)
{
	static const unsigned char repro[24] = {
		0x53, 0x50, 0x02, 0x00, 0x18, 0x00, 0x00, 0x00, 0x01, 0x00, 0x04, 0x00,
		0x00, 0x00, 0x00, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00,
	};
	char *m = malloc(sizeof(repro));
	size_t len;

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	memcpy(m, repro, sizeof(repro));
	CU_ASSERT_EQUAL(rps__msg_check(m, sizeof(repro)), -EBADMSG);
	/* the same error reply, well formed: taken, without reading a body */
	len = rps__msg_build(buf, RPS__MSG_HELLO_REP, 1, -1, NULL, 0);
	CU_ASSERT_EQUAL(len, sizeof(repro));
	memcpy(m, buf, len);
	CU_ASSERT_EQUAL(rps__msg_check(m, len), 0);
	free(m);
}

/* Every type, every length from a bare header up to one byte short of its
 * body, success and error status: refused, except a bare error reply.  Each
 * check runs on a buffer of exactly that length (ASan sees over-reads). */
static void test_every_short_body_refused(void)
{
	static const int32_t statuses[] = { 0, -1, -EINVAL };
	unsigned type;
	size_t k, n;

	for (type = 1; type < RPS__MSG_TYPE_MAX; type++) {
		long body = rps__msg_body_size(type);
		size_t want = body == RPS__BODY_VAR ? rps__msg_body_min(type) : (size_t)body;
		for (k = 0; k < sizeof(statuses) / sizeof(statuses[0]); k++) {
			for (n = 0; n < want; n++) {
				size_t len = rps__msg_build(buf, type, 7, statuses[k], NULL, 0);
				char *m;
				int ret;
				struct rps__msg_hdr h;

				/* a body of n bytes that would pass every content check */
				memset(buf + len, 0, n);
				memcpy(&h, buf, sizeof(h));
				h.len = (uint32_t)(len + n);
				memcpy(buf, &h, sizeof(h));
				len += n;
				m = malloc(len);
				CU_ASSERT_PTR_NOT_NULL_FATAL(m);
				memcpy(m, buf, len);
				ret = rps__msg_check(m, len);
				if (n == 0 && statuses[k] < 0 && is_reply(type)) {
					CU_ASSERT_EQUAL(ret, 0);
				} else {
					if (ret != -EBADMSG)
						fprintf(stderr, "%s status %d with %zu of %zu body bytes: %d\n",
							rps__msg_type_name(type), statuses[k], n, want, ret);
					CU_ASSERT_EQUAL(ret, -EBADMSG);
				}
				free(m);
			}
		}
	}
}

/* PUSH_ACK TAKEN and STEP_DONE (the two-stage sync ack): the flag passes on
 * PUSH_ACK only, alone; STEP_DONE carries 1 to RPS__STEP_DONE_MAX entries
 * and fills a worker's receive buffer exactly. */
static void test_two_stage_ack(void)
{
	struct rps__push_ack ack = { .slot = 3, .shard = 9, .version = 7 };
	struct rps__step_done sd;
	struct rps__msg_hdr h;
	size_t len;
	unsigned type;

	len = rps__msg_build(buf, RPS__MSG_PUSH_ACK, 42, 0, &ack, sizeof(ack));
	rps__msg_set_flags(buf, RPS__ACK_TAKEN);
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
	memcpy(&h, buf, sizeof(h));
	CU_ASSERT_EQUAL(h.flags, RPS__ACK_TAKEN);
	CU_ASSERT_EQUAL(h.req_id, 42u);
	rps__msg_set_flags(buf, RPS__ACK_TAKEN | 2u);	/* an unknown flag */
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	rps__msg_set_flags(buf, 0);
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);	/* the plain ack of R=1, as before */
	for (type = 1; type < RPS__MSG_TYPE_MAX; type++) {
		if (type == RPS__MSG_PUSH_ACK)
			continue;
		len = rps__msg_build(buf, type, 1, -EINVAL, NULL, 0);
		rps__msg_set_flags(buf, RPS__ACK_TAKEN);
		CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	}
	CU_ASSERT_EQUAL(sizeof(struct rps__msg_hdr) + sizeof(sd), RPS__MSG_MAX);
	memset(&sd, 0, sizeof(sd));
	sd.n = RPS__STEP_DONE_MAX;
	sd.e[RPS__STEP_DONE_MAX - 1] = (struct rps__step_done_ent){ .tensor_id = 5, .shard = 2, .step = 10, .version = 11 };
	len = rps__msg_build(buf, RPS__MSG_STEP_DONE, 0, 0, &sd, sizeof(sd));
	CU_ASSERT_EQUAL(len, RPS__MSG_MAX);
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
	CU_ASSERT_EQUAL(memcmp(rps__msg_body(buf), &sd, sizeof(sd)), 0);
	sd.n = 0;
	len = rps__msg_build(buf, RPS__MSG_STEP_DONE, 0, 0, &sd, sizeof(sd));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	sd.n = RPS__STEP_DONE_MAX + 1;
	len = rps__msg_build(buf, RPS__MSG_STEP_DONE, 0, 0, &sd, sizeof(sd));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	sd.n = 1;
	len = rps__msg_build(buf, RPS__MSG_STEP_DONE, 0, 0, &sd, sizeof(sd));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
	CU_ASSERT_EQUAL(rps__msg_check(buf, len - 1), -EBADMSG);
	/* not a reply: never a bare header */
	len = rps__msg_build(buf, RPS__MSG_STEP_DONE, 0, -EINVAL, NULL, 0);
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
}

static void test_create_name_terminated(void)
{
	struct rps__create c;
	size_t len;

	memset(&c, 'x', sizeof(c));
	len = rps__msg_build(buf, RPS__MSG_CREATE, 1, 0, &c, sizeof(c));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);
	c.name[0] = '\0';
	len = rps__msg_build(buf, RPS__MSG_CREATE, 1, 0, &c, sizeof(c));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EBADMSG);	/* empty name */
	c.name[0] = 'w';
	c.name[RPS__NAME_MAX - 1] = '\0';
	len = rps__msg_build(buf, RPS__MSG_CREATE, 1, 0, &c, sizeof(c));
	CU_ASSERT_EQUAL(rps__msg_check(buf, len), 0);
}

static void test_foreign_byte_order(void)
{
	struct rps__hello h = { .magic = __builtin_bswap64(RPS__HELLO_MAGIC) };
	size_t len = rps__msg_build(buf, RPS__MSG_HELLO, 1, 0, &h, sizeof(h));

	CU_ASSERT_EQUAL(rps__msg_check(buf, len), -EPROTO);
}

static void test_push_desc(void)
{
	struct rps__push_desc d;

	memset(&d, 0, sizeof(d));
	d.magic = RPS__DESC_MAGIC;
	d.kind = RPS__PUSH_GRAD;
	d.nbytes = 1024 - RPS__PUSH_DESC_SIZE;
	CU_ASSERT_EQUAL(rps__desc_check(&d, 1024), 0);
	d.nbytes++;
	CU_ASSERT_EQUAL(rps__desc_check(&d, 1024), -EBADMSG);	/* past the slot */
	d.nbytes = 0xffffffffu;
	CU_ASSERT_EQUAL(rps__desc_check(&d, 1024), -EBADMSG);
	d.nbytes = 8;
	d.kind = 9;
	CU_ASSERT_EQUAL(rps__desc_check(&d, 1024), -EBADMSG);
	d.kind = RPS__PUSH_INIT;
	CU_ASSERT_EQUAL(rps__desc_check(&d, 1024), 0);
	d.magic = 0;
	CU_ASSERT_EQUAL(rps__desc_check(&d, 1024), -EBADMSG);
}

static void test_push_crc_catches_every_flipped_bit(void)
{
	static unsigned char slot[RPS__PUSH_DESC_SIZE + 256];
	struct rps__push_desc *d = (struct rps__push_desc *)slot;
	unsigned bit;

	memset(slot, 0, sizeof(slot));
	for (bit = 0; bit < 256; bit++)
		slot[RPS__PUSH_DESC_SIZE + bit] = (unsigned char)(bit * 7);
	d->magic = RPS__DESC_MAGIC;
	d->kind = RPS__PUSH_GRAD;
	d->nbytes = 256;
	d->flags = RPS__DESC_CRC;
	d->crc = rps__push_crc(d);
	CU_ASSERT_EQUAL(rps__desc_check(d, sizeof(slot)), 0);
	for (bit = 0; bit < 256 * 8; bit++) {
		slot[RPS__PUSH_DESC_SIZE + bit / 8] ^= (unsigned char)(1u << (bit % 8));
		CU_ASSERT_EQUAL(rps__desc_check(d, sizeof(slot)), -EILSEQ);
		slot[RPS__PUSH_DESC_SIZE + bit / 8] ^= (unsigned char)(1u << (bit % 8));
	}
	CU_ASSERT_EQUAL(rps__desc_check(d, sizeof(slot)), 0);
	/* without the flag nothing is checked */
	d->flags = 0;
	slot[RPS__PUSH_DESC_SIZE] ^= 1;
	CU_ASSERT_EQUAL(rps__desc_check(d, sizeof(slot)), 0);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "every message type round-trips", test_roundtrip_every_type },
		{ "malformed messages refused", test_malformed },
		{ "error replies may omit the body", test_error_reply_without_body },
		{ "CREATE names must be terminated", test_create_name_terminated },
		{ "the HELLO_REP fuzz reproducer is refused, not read past", test_header_only_hello_rep_not_read_past },
		{ "every type with a body shorter than its own refused", test_every_short_body_refused },
		{ "foreign byte order detected", test_foreign_byte_order },
		{ "push descriptors checked against the slot", test_push_desc },
		{ "push crc32c catches every flipped bit", test_push_crc_catches_every_flipped_bit },
		{ "PUSH_ACK TAKEN and STEP_DONE", test_two_stage_ack },
	};
	const struct cutest_suite suites[] = {
		{ "proto", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
