/*
 * fuzz_raft.c - libFuzzer harness for Raft messages (src/control/raft.c): the wire
 * decoder, and a node stepped with what it decodes.
 *
 * Input: one byte choosing the node's starting role (% 4: follower, leader
 * of three, pre-candidate of three, sole voter and leader), then chunks of [u8 op][u16 len LE][len bytes]:
 *   op % 4 == 0  the bytes are an encoded message, stepped as they are
 *   op % 4 == 1  tick op / 4 times
 *   op % 4 == 2  propose the bytes (a leader appends them)
 *   op % 4 == 3  an encoded message addressed from a member (2 or 3) to
 *                this node (1): structure-aware, so mutations of the
 *                fields that matter get past the membership filter
 * Every ready the node produces is checked as storage would see it (terms
 * never go down, entries consecutive with non-decreasing terms, commit
 * within the log) and every message it sends must encode and decode back
 * to the same bytes.  A violation aborts: a node that does this would
 * persist state it cannot restart from.
 */
#include "config.h"
#include "fuzz_common.h"
#include "control/raft.h"

struct model {
	uint64_t term, commit;
	uint64_t snap_index, snap_term;
	uint64_t *terms;	/* terms[i]: term of entry snap_index + 1 + i */
	size_t n, cap;
};

static uint64_t model_term(const struct model *s, uint64_t index)
{
	if (index == s->snap_index)
		return s->snap_term;
	if (index < s->snap_index || index > s->snap_index + s->n)
		return 0;
	return s->terms[index - s->snap_index - 1];
}

static void check_msg_round_trip(const struct rps__raft_msg *m)
{
	size_t need = rps__raft_msg_encoded_size(m), len = 0, len2 = 0;
	uint8_t *a = malloc(need ? need : 1), *b = malloc(need ? need : 1);
	struct rps__raft_msg *d = NULL;

	FUZZ_CHECK(a && b);
	FUZZ_CHECK(rps__raft_msg_encode(m, a, need, &len) == 0 && len == need);
	FUZZ_CHECK(rps__raft_msg_decode(a, len, &d) == 0);
	FUZZ_CHECK(rps__raft_msg_encode(d, b, need, &len2) == 0 && len2 == len && !memcmp(a, b, len));
	rps__raft_msg_free(d);
	free(a);
	free(b);
}

static void drain(struct rps__raft *r, struct model *s)
{
	struct rps__raft_ready rd;
	size_t i;
	int guard = 0;

	while (rps__raft_ready(r, &rd) > 0) {
		FUZZ_CHECK(++guard < 1000);
		if (rd.snapshot) {
			FUZZ_CHECK(rd.snapshot->index >= s->snap_index);
			s->snap_index = rd.snapshot->index;
			s->snap_term = rd.snapshot->term;
			s->n = 0;
		}
		if (rd.n_entries) {
			uint64_t first = rd.entries[0].index;
			FUZZ_CHECK(first > s->snap_index && first <= s->snap_index + s->n + 1);
			FUZZ_CHECK(rd.entries[0].term >= model_term(s, first - 1));
			s->n = first - s->snap_index - 1;
			for (i = 0; i < rd.n_entries; i++) {
				const struct rps__raft_entry *e = &rd.entries[i];
				FUZZ_CHECK(e->index == first + i);
				FUZZ_CHECK(e->term >= 1);
				FUZZ_CHECK(i == 0 || e->term >= rd.entries[i - 1].term);
				(void)fuzz_touch(e->data, e->len);
				if (s->n == s->cap) {
					s->cap = s->cap ? 2 * s->cap : 64;
					s->terms = realloc(s->terms, s->cap * sizeof(*s->terms));
					FUZZ_CHECK(s->terms);
				}
				s->terms[s->n++] = e->term;
			}
		}
		if (rd.hard_state_changed) {
			FUZZ_CHECK(rd.hard_state.term >= s->term);
			FUZZ_CHECK(rd.hard_state.commit >= s->commit);
			FUZZ_CHECK(rd.hard_state.commit <= s->snap_index + s->n);
			s->term = rd.hard_state.term;
			s->commit = rd.hard_state.commit;
		}
		for (i = 0; i < s->n; i++)
			FUZZ_CHECK(s->terms[i] <= s->term);
		for (i = 0; i < rd.n_committed; i++)
			FUZZ_CHECK(rd.committed[i].index <= s->commit);
		for (i = 0; i < rd.n_msgs; i++)
			check_msg_round_trip(&rd.msgs[i]);
		FUZZ_CHECK(rps__raft_advance(r, &rd) == 0);
	}
}

static void step_simple(struct rps__raft *r, struct model *s, uint8_t type, uint64_t from, uint64_t term)
{
	struct rps__raft_msg m = { .type = type, .from = from, .to = 1, .term = term };

	(void)rps__raft_step(r, &m);
	drain(r, s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint64_t peers[] = { 1, 2, 3 };
	struct rps__raft_config cfg = {
		.id = 1, .peers = peers, .n_peers = 3, .election_ticks = 10, .heartbeat_ticks = 1,
		.pre_vote = true, .check_quorum = true, .max_inflight_msgs = 4, .max_msg_entries = 8, .seed = 7,
	};
	struct model s = { 0 };
	struct rps__raft *r = NULL;
	struct rps__raft_status st;
	size_t off = 1;

	if (size < 1)
		return 0;
	if (data[0] % 4 == 3)
		cfg.n_peers = 1;	/* the only voter: campaigning wins at once */
	FUZZ_CHECK(rps__raft_new(&cfg, NULL, &r) == 0);
	drain(r, &s);
	if (data[0] % 4 == 3) {
		FUZZ_CHECK(rps__raft_campaign(r) == 0);
		drain(r, &s);
	} else if (data[0] % 4 >= 1) {
		FUZZ_CHECK(rps__raft_campaign(r) == 0);
		drain(r, &s);
		rps__raft_status(r, &st);
		step_simple(r, &s, RPS__RAFT_MSG_PRE_VOTE_RESP, 2, st.term + 1);
		rps__raft_status(r, &st);
		if (data[0] % 4 == 1)
			step_simple(r, &s, RPS__RAFT_MSG_VOTE_RESP, 2, st.term);
	}
	while (off + 3 <= size) {
		uint8_t op = data[off];
		size_t n = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
		uint8_t *buf;

		off += 3;
		if (n > size - off)
			n = size - off;
		buf = fuzz_dup(data + off, n);
		off += n;
		switch (op % 4) {
		case 0:
		case 3: {
			struct rps__raft_msg *m = NULL;
			if (rps__raft_msg_decode(buf, n, &m) == 0) {
				uint32_t i;
				for (i = 0; i < m->n_entries; i++)
					(void)fuzz_touch(m->entries[i].data, m->entries[i].len);
				if (m->snapshot)
					(void)fuzz_touch(m->snapshot->data, m->snapshot->len);
				if (op % 4 == 3) {
					m->from = 2 + (op >> 2) % 2;
					m->to = 1;
				}
				(void)rps__raft_step(r, m);
				rps__raft_msg_free(m);
			}
			break;
		}
		case 1: {
			unsigned t;
			for (t = 0; t < (unsigned)(op >> 2); t++) {
				(void)rps__raft_tick(r);
				drain(r, &s);
			}
			break;
		}
		case 2:
			(void)rps__raft_propose(r, buf, n, NULL, NULL);
			break;
		}
		free(buf);
		drain(r, &s);
	}
	rps__raft_status(r, &st);
	FUZZ_CHECK(st.commit <= st.last_index);
	rps__raft_free(r);
	free(s.terms);
	return 0;
}
