/*
 * raft_msg.c - the Raft core's messages: the outbox and the read states the
 * next ready hands out, and the wire format the application sends them in.
 */
#include "config.h"
#include "control/raft_int.h"
#include "common/common.h"
#include "common/le.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct rps__raft_msg *rps__raft_msg_push(struct rps__raft *r, uint8_t type, uint64_t to)
{
	struct rps__raft_msg *m;

	if (rps__grow(&r->msgs, &r->cap_msgs, r->n_msgs + 1, sizeof(*r->msgs), 16)) {
		rps__raft_fail(r, -ENOMEM);
		return NULL;
	}
	m = &r->msgs[r->n_msgs++];
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->to = to;
	m->from = r->id;
	m->term = r->term;
	return m;
}

/* Copy entries [lo, hi] into one block owned by the message: the log may
 * change before the application sends it. */
int rps__raft_msg_attach_entries(struct rps__raft *r, struct rps__raft_msg *m, uint64_t lo, uint64_t hi)
{
	size_t n = (size_t)(hi - lo + 1), data = 0, off;
	struct rps__raft_entry *ents;
	uint8_t *block;

	for (uint64_t i = lo; i <= hi; i++)
		data += rps__raft_log_entry(&r->log, i)->len;
	block = malloc(n * sizeof(*ents) + data);
	if (!block) {
		r->n_msgs--;
		rps__raft_fail(r, -ENOMEM);
		return -ENOMEM;
	}
	ents = (struct rps__raft_entry *)(void *)block;
	off = n * sizeof(*ents);
	for (size_t k = 0; k < n; k++) {
		const struct rps__raft_entry *e = rps__raft_log_entry(&r->log, lo + k);

		ents[k] = *e;
		ents[k].data = block + off;
		if (e->len)
			memcpy(block + off, e->data, e->len);
		off += e->len;
	}
	m->owned = block;
	m->entries = ents;
	m->n_entries = (uint32_t)n;
	return 0;
}

int rps__raft_msg_attach_snapshot(struct rps__raft *r, struct rps__raft_msg *m)
{
	struct rps__raft_snapshot *s;
	uint8_t *block = malloc(sizeof(*s) + r->snap.len);

	if (!block) {
		r->n_msgs--;
		rps__raft_fail(r, -ENOMEM);
		return -ENOMEM;
	}
	s = (struct rps__raft_snapshot *)(void *)block;
	*s = r->snap;
	s->data = block + sizeof(*s);
	if (r->snap.len)
		memcpy(block + sizeof(*s), r->snap.data, r->snap.len);
	m->owned = block;
	m->snapshot = s;
	return 0;
}

void rps__raft_msgs_clear(struct rps__raft *r)
{
	for (size_t i = 0; i < r->n_msgs; i++)
		free(r->msgs[i].owned);
	r->n_msgs = 0;
}

void rps__raft_read_state_push(struct rps__raft *r, uint64_t index, uint64_t ctx)
{
	if (rps__grow(&r->read_states, &r->cap_read_states, r->n_read_states + 1, sizeof(*r->read_states), 8)) {
		rps__raft_fail(r, -ENOMEM);
		return;
	}
	r->read_states[r->n_read_states].index = index;
	r->read_states[r->n_read_states].ctx = ctx;
	r->n_read_states++;
}

/* ------------------------------------------------------------------------ */
/* wire format
 *
 *	u8 version, u8 type, u8 reject, u8 flags,
 *	u64 to, from, term, log_term, index, commit, hint, context,
 *	u32 n_entries, u8 has_snapshot,
 *	n_entries x { u64 term, u64 index, u32 type, u32 len, len bytes },
 *	[snapshot: u64 index, u64 term, u32 n_voters, u32 n_learners,
 *	 (n_voters + n_learners) x u64, u32 len, len bytes]
 */

#define WIRE_VERSION 1u
#define WIRE_HDR (4u + 8u * 8u + 4u + 1u)
#define WIRE_ENTRY_HDR (8u + 8u + 4u + 4u)
#define WIRE_SNAP_HDR (8u + 8u + 4u + 4u + 4u)

size_t rps__raft_msg_encoded_size(const struct rps__raft_msg *m)
{
	size_t n = WIRE_HDR;

	for (uint32_t i = 0; i < m->n_entries; i++)
		n += WIRE_ENTRY_HDR + m->entries[i].len;
	if (m->snapshot)
		n += WIRE_SNAP_HDR + 8u * (m->snapshot->conf.n_voters + m->snapshot->conf.n_learners) +
		     m->snapshot->len;
	return n;
}

int rps__raft_msg_encode(const struct rps__raft_msg *m, void *buf, size_t cap, size_t *len)
{
	size_t need = rps__raft_msg_encoded_size(m);
	uint8_t *p = buf;
	const uint64_t words[8] = { m->to, m->from, m->term, m->log_term, m->index, m->commit, m->hint, m->context };

	if (need > cap)
		return rps__seterr(-ENOSPC, "raft: message needs %zu bytes, buffer has %zu", need, cap);
	if (m->snapshot && !rps__raft_conf_fits(m->snapshot->conf.n_voters, m->snapshot->conf.n_learners))
		return rps__seterr(-EINVAL, "raft: a snapshot configuration of %u voters and %u learners is too large"
				   " to encode", m->snapshot->conf.n_voters, m->snapshot->conf.n_learners);
	*p++ = WIRE_VERSION;
	*p++ = m->type;
	*p++ = m->reject;
	*p++ = m->flags;
	for (int i = 0; i < 8; i++, p += 8)
		rps__le_put64(p, words[i]);
	rps__le_put32(p, m->n_entries);
	p += 4;
	*p++ = m->snapshot != NULL;
	for (uint32_t i = 0; i < m->n_entries; i++) {
		const struct rps__raft_entry *e = &m->entries[i];

		rps__le_put64(p, e->term);
		rps__le_put64(p + 8, e->index);
		rps__le_put32(p + 16, e->type);
		rps__le_put32(p + 20, e->len);
		p += WIRE_ENTRY_HDR;
		if (e->len)
			memcpy(p, e->data, e->len);
		p += e->len;
	}
	if (m->snapshot) {
		const struct rps__raft_snapshot *s = m->snapshot;

		rps__le_put64(p, s->index);
		rps__le_put64(p + 8, s->term);
		rps__le_put32(p + 16, s->conf.n_voters);
		rps__le_put32(p + 20, s->conf.n_learners);
		p += 24;
		for (uint32_t i = 0; i < s->conf.n_voters; i++, p += 8)
			rps__le_put64(p, s->conf.voters[i]);
		for (uint32_t i = 0; i < s->conf.n_learners; i++, p += 8)
			rps__le_put64(p, s->conf.learners[i]);
		rps__le_put32(p, s->len);
		p += 4;
		if (s->len)
			memcpy(p, s->data, s->len);
		p += s->len;
	}
	*len = (size_t)(p - (uint8_t *)buf);
	return 0;
}

/* First pass: validate the structure and size what the copy needs. */
static int wire_scan(const uint8_t *buf, size_t len, uint32_t *n_entries, bool *has_snap, size_t *data)
{
	struct rps__reader rd = { buf, len };
	const uint8_t *p = rps__reader_take(&rd, WIRE_HDR);
	uint32_t n;

	if (!p || p[0] != WIRE_VERSION || p[1] < RPS__RAFT_MSG_APP || p[1] > RPS__RAFT_MSG_TYPE_MAX ||
	    p[2] > 1 || (p[3] & ~RPS__RAFT_MSG_F_TRANSFER) || p[4 + 64 + 4] > 1)
		return -EBADMSG;
	n = rps__le_get32(p + 4 + 64);
	*has_snap = p[4 + 64 + 4];
	if ((n && p[1] != RPS__RAFT_MSG_APP) || (*has_snap != (p[1] == RPS__RAFT_MSG_SNAP)))
		return -EBADMSG;
	if (n > rd.left / WIRE_ENTRY_HDR)
		return -EBADMSG;	/* before any allocation sized by n */
	*n_entries = n;
	*data = 0;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = rps__reader_take(&rd, WIRE_ENTRY_HDR);
		uint32_t elen;

		if (!e || rps__le_get32(e + 16) > RPS__RAFT_ENTRY_CONF)
			return -EBADMSG;
		elen = rps__le_get32(e + 20);
		if (elen > RPS__RAFT_MAX_DATA || !rps__reader_take(&rd, elen))
			return -EBADMSG;
		*data += elen;
	}
	if (*has_snap) {
		const uint8_t *s = rps__reader_take(&rd, 24);
		uint32_t nv, nl, slen;

		if (!s)
			return -EBADMSG;
		nv = rps__le_get32(s + 16);
		nl = rps__le_get32(s + 20);
		if (!rps__raft_conf_fits(nv, nl) || !rps__reader_take(&rd, 8u * (nv + nl)))
			return -EBADMSG;
		s = rps__reader_take(&rd, 4);
		if (!s)
			return -EBADMSG;
		slen = rps__le_get32(s);
		if (slen > RPS__RAFT_MAX_DATA || !rps__reader_take(&rd, slen))
			return -EBADMSG;
		*data += slen;
	}
	if (rd.left)
		return -EBADMSG;	/* trailing garbage: the framing is off */
	return 0;
}

int rps__raft_msg_decode(const void *buf, size_t len, struct rps__raft_msg **out)
{
	struct rps__raft_entry *ents;
	struct rps__raft_snapshot *snap = NULL;
	struct rps__raft_msg *m;
	const uint8_t *p = buf;
	uint8_t *block, *data;
	uint32_t n;
	size_t data_len, size, off_ents, off_snap, off_data;
	bool has_snap;
	int err;

	*out = NULL;
	err = wire_scan(buf, len, &n, &has_snap, &data_len);
	if (err)
		return rps__seterr(err, "raft: malformed message of %zu bytes", len);
	off_ents = RPS__ALIGN_UP(sizeof(*m), 8);
	off_snap = off_ents + RPS__ALIGN_UP((size_t)n * sizeof(*ents), 8);
	off_data = off_snap + (has_snap ? RPS__ALIGN_UP(sizeof(*snap), 8) : 0);
	size = off_data + data_len;
	block = calloc(1, size);
	if (!block)
		return rps__seterr(-ENOMEM, "raft: no memory to decode a message of %zu bytes", len);
	m = (struct rps__raft_msg *)(void *)block;
	ents = (struct rps__raft_entry *)(void *)(block + off_ents);
	data = block + off_data;

	m->type = p[1];
	m->reject = p[2];
	m->flags = p[3];
	p += 4;
	m->to = rps__le_get64(p);
	m->from = rps__le_get64(p + 8);
	m->term = rps__le_get64(p + 16);
	m->log_term = rps__le_get64(p + 24);
	m->index = rps__le_get64(p + 32);
	m->commit = rps__le_get64(p + 40);
	m->hint = rps__le_get64(p + 48);
	m->context = rps__le_get64(p + 56);
	p += 64 + 4 + 1;
	m->n_entries = n;
	m->entries = n ? ents : NULL;
	for (uint32_t i = 0; i < n; i++) {
		ents[i].term = rps__le_get64(p);
		ents[i].index = rps__le_get64(p + 8);
		ents[i].type = rps__le_get32(p + 16);
		ents[i].len = rps__le_get32(p + 20);
		p += WIRE_ENTRY_HDR;
		ents[i].data = data;
		memcpy(data, p, ents[i].len);
		data += ents[i].len;
		p += ents[i].len;
	}
	if (has_snap) {
		snap = (struct rps__raft_snapshot *)(void *)(block + off_snap);
		snap->index = rps__le_get64(p);
		snap->term = rps__le_get64(p + 8);
		snap->conf.n_voters = rps__le_get32(p + 16);
		snap->conf.n_learners = rps__le_get32(p + 20);
		p += 24;
		for (uint32_t i = 0; i < snap->conf.n_voters; i++, p += 8)
			snap->conf.voters[i] = rps__le_get64(p);
		for (uint32_t i = 0; i < snap->conf.n_learners; i++, p += 8)
			snap->conf.learners[i] = rps__le_get64(p);
		snap->len = rps__le_get32(p);
		p += 4;
		snap->data = data;
		memcpy(data, p, snap->len);
		m->snapshot = snap;
	}
	m->owned = NULL;	/* the whole block is m itself */
	*out = m;
	return 0;
}

void rps__raft_msg_free(struct rps__raft_msg *m)
{
	free(m);
}

const char *rps__raft_msg_type_name(int type)
{
	static const char *const names[] = {
		[RPS__RAFT_MSG_APP] = "App",
		[RPS__RAFT_MSG_APP_RESP] = "AppResp",
		[RPS__RAFT_MSG_VOTE] = "Vote",
		[RPS__RAFT_MSG_VOTE_RESP] = "VoteResp",
		[RPS__RAFT_MSG_PRE_VOTE] = "PreVote",
		[RPS__RAFT_MSG_PRE_VOTE_RESP] = "PreVoteResp",
		[RPS__RAFT_MSG_HEARTBEAT] = "Heartbeat",
		[RPS__RAFT_MSG_HEARTBEAT_RESP] = "HeartbeatResp",
		[RPS__RAFT_MSG_SNAP] = "Snap",
		[RPS__RAFT_MSG_TIMEOUT_NOW] = "TimeoutNow",
		[RPS__RAFT_MSG_READ_INDEX] = "ReadIndex",
		[RPS__RAFT_MSG_READ_INDEX_RESP] = "ReadIndexResp",
	};

	if (type < RPS__RAFT_MSG_APP || type > RPS__RAFT_MSG_TYPE_MAX)
		return "?";
	return names[type];
}
