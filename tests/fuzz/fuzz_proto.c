/*
 * fuzz_proto.c - libFuzzer harness for the wire messages (src/proto/proto.c).
 *
 * The input is one received message, header included, in a buffer of
 * exactly its size (so reading one byte past what arrived is an ASan
 * error, where a real receive buffer would hand out stale bytes).  It goes
 * through rps__msg_check(); what passes is then consumed the way its
 * receiver does: a request's body is read whatever the status (the server
 * acts on requests), a reply's only with status 0 (the client looks at
 * the status first); variable bodies go to their decoders (RAFT, PROPOSE,
 * STATUS_REP's shard map, CKPT targets).  The same bytes are also checked
 * as a push descriptor at the start of a staging slot of that size.
 */
#include "config.h"
#include "fuzz_common.h"
#include "proto/proto.h"
#include "control/raft.h"
#include "proto/smap.h"
#include "common/common.h"

static bool is_request(unsigned type)
{
	switch (type) {
	case RPS__MSG_HELLO: case RPS__MSG_CREATE: case RPS__MSG_WAIT: case RPS__MSG_BARRIER:
	case RPS__MSG_RAFT: case RPS__MSG_PROPOSE: case RPS__MSG_MIGRATE: case RPS__MSG_STATUS:
	case RPS__MSG_ADMIN: case RPS__MSG_CKPT:
		return true;
	default:
		return false;
	}
}

static void consume_targets(const char *p, size_t n, uint32_t ntargets)
{
	uint32_t i;

	FUZZ_CHECK((uint64_t)ntargets * sizeof(struct rps__ckpt_target) <= n);
	for (i = 0; i < ntargets; i++) {
		struct rps__ckpt_target t;
		memcpy(&t, p + (size_t)i * sizeof(t), sizeof(t));
		(void)strnlen(t.name, sizeof(t.name));
	}
}

static void consume(const char *buf, size_t len)
{
	struct rps__msg_hdr h;
	const char *body = buf + sizeof(h);
	size_t blen;
	long fixed;

	memcpy(&h, buf, sizeof(h));
	blen = len - sizeof(h);
	if (!is_request(h.type) && h.status != 0)
		return;
	fixed = rps__msg_body_size(h.type);
	if (fixed > 0) {
		/* what the receiver memcpy's out of the buffer */
		(void)fuzz_touch(body, (size_t)fixed);
	}
	switch (h.type) {
	case RPS__MSG_CREATE: {
		struct rps__create c;
		memcpy(&c, body, sizeof(c));
		FUZZ_CHECK(memchr(c.name, '\0', sizeof(c.name)));
		break;
	}
	case RPS__MSG_CREATE_REP: {
		struct rps__create_rep r;
		memcpy(&r, body, sizeof(r));
		(void)fuzz_touch(r.regions, sizeof(r.regions[0]) * RPS__MIN(r.nregions, RPS__CREATE_MAX_REGIONS));
		break;
	}
	case RPS__MSG_ADMIN: {
		struct rps__admin a;
		memcpy(&a, body, sizeof(a));
		FUZZ_CHECK(memchr(a.uri, '\0', sizeof(a.uri)));
		break;
	}
	case RPS__MSG_ADMIN_REP: {
		struct rps__admin_rep a;
		memcpy(&a, body, sizeof(a));
		FUZZ_CHECK(memchr(a.msg, '\0', sizeof(a.msg)));
		break;
	}
	case RPS__MSG_RAFT: {
		struct rps__raft_msg *m = NULL;
		if (rps__raft_msg_decode(body, blen, &m) == 0) {
			uint32_t i;
			for (i = 0; i < m->n_entries; i++)
				(void)fuzz_touch(m->entries[i].data, m->entries[i].len);
			if (m->snapshot)
				(void)fuzz_touch(m->snapshot->data, m->snapshot->len);
			rps__raft_msg_free(m);
		}
		break;
	}
	case RPS__MSG_PROPOSE: {
		struct rps__smap_cmd c;
		if (rps__smap_cmd_decode(body, blen, &c) == 0)
			FUZZ_CHECK(memchr(c.uri, '\0', sizeof(c.uri)));
		break;
	}
	case RPS__MSG_STATUS_REP: {
		struct rps__status_rep r;
		static struct rps__smap m;
		FUZZ_CHECK(blen >= sizeof(r));
		memcpy(&r, body, sizeof(r));
		if (blen > sizeof(r) && rps__smap_decode(body + sizeof(r), blen - sizeof(r), &m) == 0) {
			FUZZ_CHECK(m.nmembers <= RPS__SMAP_MAX_MEMBERS);
			FUZZ_CHECK(m.npart <= RPS__SMAP_MAX_PART);
		}
		break;
	}
	case RPS__MSG_CKPT: {
		struct rps__ckpt_req c;
		memcpy(&c, body, sizeof(c));
		FUZZ_CHECK(memchr(c.name, '\0', sizeof(c.name)));
		consume_targets(body + sizeof(c), blen - sizeof(c), c.ntargets);
		break;
	}
	case RPS__MSG_CKPT_REP: {
		struct rps__ckpt_rep c;
		memcpy(&c, body, sizeof(c));
		FUZZ_CHECK(memchr(c.msg, '\0', sizeof(c.msg)));
		consume_targets(body + sizeof(c), blen - sizeof(c), c.ntargets);
		break;
	}
	default:
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = fuzz_dup(data, size);

	if (rps__msg_check(buf, size) == 0) {
		FUZZ_CHECK(size >= sizeof(struct rps__msg_hdr));
		consume(buf, size);
	}
	if (size >= RPS__PUSH_DESC_SIZE && rps__desc_check((const struct rps__push_desc *)(const void *)buf, size) == 0) {
		struct rps__push_desc d;
		memcpy(&d, buf, sizeof(d));
		FUZZ_CHECK((size_t)d.nbytes <= size - RPS__PUSH_DESC_SIZE);
		(void)fuzz_touch(buf + RPS__PUSH_DESC_SIZE, d.nbytes);
	}
	free(buf);
	return 0;
}
