/*
 * proto.c - building and validating wire messages (see proto.h).
 * Everything a peer sends is checked here before anyone reads a field.
 */
#include "config.h"
#include "proto/proto.h"
#include "common/common.h"
#include "common/crc.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

_Static_assert(sizeof(struct rps__msg_hdr) == 24, "message header layout");
_Static_assert(sizeof(struct rps__push_desc) == RPS__PUSH_DESC_SIZE, "push descriptor layout");
_Static_assert(sizeof(struct rps__repl_desc) == RPS__REPL_DESC_SIZE, "replication descriptor layout");
_Static_assert(sizeof(struct rps__create) + sizeof(struct rps__msg_hdr) <= RPS__MSG_MAX, "CREATE fits");
_Static_assert(sizeof(struct rps__create_rep) + sizeof(struct rps__msg_hdr) <= RPS__MSG_MAX, "CREATE_REP fits");
_Static_assert(sizeof(struct rps__conn_priv) <= 56, "connect private data fits an IB CM REQ");
_Static_assert(sizeof(struct rps__quorum_note) == RPS__PROBE_AREA, "the note is what a probe READs");
_Static_assert(sizeof(struct rps__step_done) + sizeof(struct rps__msg_hdr) <= RPS__MSG_MAX, "STEP_DONE fits");

#define VAR ((size_t)-1)

/* Only replies may come as a bare header (an error without its body): a
 * request's handler always reads its body, so a request without one would
 * be answered from whatever an earlier message left in the buffer. */
#define REPLY 1

static const struct {
	const char *name;
	size_t body;		/* VAR: variable, at least min */
	size_t min;
	int reply;		/* REPLY: an error may omit the body */
} msg_types[RPS__MSG_TYPE_MAX] = {
	[RPS__MSG_HELLO] = { "HELLO", sizeof(struct rps__hello), 0, 0 },
	[RPS__MSG_HELLO_REP] = { "HELLO_REP", sizeof(struct rps__hello_rep), 0, REPLY },
	[RPS__MSG_CREATE] = { "CREATE", sizeof(struct rps__create), 0, 0 },
	[RPS__MSG_CREATE_REP] = { "CREATE_REP", sizeof(struct rps__create_rep), 0, REPLY },
	[RPS__MSG_PUSH_ACK] = { "PUSH_ACK", sizeof(struct rps__push_ack), 0, REPLY },
	[RPS__MSG_WAIT] = { "WAIT", sizeof(struct rps__wait), 0, 0 },
	[RPS__MSG_WAIT_REP] = { "WAIT_REP", sizeof(struct rps__wait_rep), 0, REPLY },
	[RPS__MSG_BARRIER] = { "BARRIER", sizeof(struct rps__barrier), 0, 0 },
	[RPS__MSG_BARRIER_REP] = { "BARRIER_REP", 0, 0, REPLY },
	[RPS__MSG_RAFT] = { "RAFT", VAR, 0, 0 },
	[RPS__MSG_PROPOSE] = { "PROPOSE", VAR, 0, 0 },
	[RPS__MSG_PROPOSE_REP] = { "PROPOSE_REP", sizeof(struct rps__propose_rep), 0, REPLY },
	/* (a struct rps__seed: with the stream's seq, for the backups) */
	[RPS__MSG_MIGRATE] = { "MIGRATE", VAR, sizeof(struct rps__migrate), 0 },
	[RPS__MSG_MIGRATE_REP] = { "MIGRATE_REP", 0, 0, REPLY },
	[RPS__MSG_STATUS] = { "STATUS", 0, 0, 0 },
	[RPS__MSG_STATUS_REP] = { "STATUS_REP", VAR, sizeof(struct rps__status_rep), REPLY },
	[RPS__MSG_ADMIN] = { "ADMIN", sizeof(struct rps__admin), 0, 0 },
	[RPS__MSG_ADMIN_REP] = { "ADMIN_REP", sizeof(struct rps__admin_rep), 0, REPLY },
	[RPS__MSG_CKPT] = { "CKPT", VAR, sizeof(struct rps__ckpt_req), 0 },
	[RPS__MSG_CKPT_REP] = { "CKPT_REP", VAR, sizeof(struct rps__ckpt_rep), REPLY },
	[RPS__MSG_RANK] = { "RANK", sizeof(struct rps__rank_req), 0, 0 },
	[RPS__MSG_RANK_REP] = { "RANK_REP", sizeof(struct rps__rank_rep), 0, REPLY },
	[RPS__MSG_LEASE] = { "LEASE", sizeof(struct rps__lease), 0, 0 },
	[RPS__MSG_LEASE_REP] = { "LEASE_REP", sizeof(struct rps__lease_rep), 0, REPLY },
	[RPS__MSG_REPL_HELLO] = { "REPL_HELLO", sizeof(struct rps__repl_hello), 0, 0 },
	[RPS__MSG_REPL_HELLO_REP] = { "REPL_HELLO_REP", sizeof(struct rps__repl_hello_rep), 0, 0 },	/* refusals carry the body too */
	[RPS__MSG_REPL_ACK] = { "REPL_ACK", sizeof(struct rps__repl_ack), 0, 0 },
	[RPS__MSG_REPL_NACK] = { "REPL_NACK", sizeof(struct rps__repl_ack), 0, 0 },
	[RPS__MSG_STEP_DONE] = { "STEP_DONE", sizeof(struct rps__step_done), 0, 0 },
	[RPS__MSG_SEED] = { "SEED", sizeof(struct rps__seed), 0, 0 },
	[RPS__MSG_AUTH] = { "AUTH", sizeof(struct rps__auth), 0, 0 },
	[RPS__MSG_AUTH_REP] = { "AUTH_REP", sizeof(struct rps__auth_rep), 0, 0 },	/* refusals say why */
	[RPS__MSG_AUTH_DONE] = { "AUTH_DONE", 0, 0, 0 },
};

long rps__msg_body_size(unsigned type)
{
	if (type == 0 || type >= RPS__MSG_TYPE_MAX)
		return -1;
	if (msg_types[type].body == VAR)
		return RPS__BODY_VAR;
	return (long)msg_types[type].body;
}

size_t rps__msg_body_min(unsigned type)
{
	if (type == 0 || type >= RPS__MSG_TYPE_MAX)
		return 0;
	return msg_types[type].min;
}

const char *rps__msg_type_name(unsigned type)
{
	if (type == 0 || type >= RPS__MSG_TYPE_MAX)
		return "unknown";
	return msg_types[type].name;
}

void rps__msg_set_flags(void *buf, uint8_t flags)
{
	((struct rps__msg_hdr *)buf)->flags = flags;
}

size_t rps__msg_build(void *buf, unsigned type, uint64_t req_id, int32_t status,
		      const void *body, size_t body_len)
{
	struct rps__msg_hdr h = {
		.magic = RPS__MSG_MAGIC,
		.type = (uint8_t)type,
		.len = (uint32_t)(sizeof(h) + body_len),
		.req_id = req_id,
		.status = status,
	};

	memcpy(buf, &h, sizeof(h));
	if (body_len)
		memcpy((char *)buf + sizeof(h), body, body_len);
	return sizeof(h) + body_len;
}

int rps__msg_check(const void *buf, size_t len)
{
	struct rps__msg_hdr h;
	bool bare;
	long body;

	if (len < sizeof(h))
		return rps__seterr(-EBADMSG, "malformed message: %zu bytes is shorter than a header", len);
	memcpy(&h, buf, sizeof(h));
	if (h.magic != RPS__MSG_MAGIC)
		return rps__seterr(-EBADMSG, "malformed message: bad magic 0x%04x", h.magic);
	if (h.len != len)
		return rps__seterr(-EBADMSG, "malformed message: header says %u bytes, %zu arrived", h.len, len);
	body = rps__msg_body_size(h.type);
	if (body == -1)
		return rps__seterr(-EBADMSG, "malformed message: unknown type %u", h.type);
	if ((h.flags && !(h.type == RPS__MSG_PUSH_ACK && h.flags == RPS__ACK_TAKEN)) || h.reserved)
		return rps__seterr(-EBADMSG, "malformed %s message: reserved header fields set",
				   rps__msg_type_name(h.type));
	/* Error replies may omit the body; requests never do. */
	bare = msg_types[h.type].reply == REPLY && h.status < 0 && len == sizeof(h);
	if (body == RPS__BODY_VAR) {
		if (len - sizeof(h) < rps__msg_body_min(h.type) && !bare)
			return rps__seterr(-EBADMSG, "malformed %s message: body of %zu bytes, expected at least %zu",
					   rps__msg_type_name(h.type), len - sizeof(h), rps__msg_body_min(h.type));
	} else if (len - sizeof(h) != (size_t)body && !bare)
		return rps__seterr(-EBADMSG, "malformed %s message: body of %zu bytes, expected %ld",
				   rps__msg_type_name(h.type), len - sizeof(h), body);
	/* From here on a body is only read when it arrived. */
	if (h.type == RPS__MSG_CREATE && !bare) {
		const struct rps__create *c = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(c->name, '\0', sizeof(c->name)) || !c->name[0])
			return rps__seterr(-EBADMSG, "malformed CREATE message: tensor name not terminated or empty");
	}
	if (h.type == RPS__MSG_ADMIN && len > sizeof(h)) {
		const struct rps__admin *a = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(a->uri, '\0', sizeof(a->uri)))
			return rps__seterr(-EBADMSG, "malformed ADMIN message: uri not terminated");
	}
	if (h.type == RPS__MSG_CKPT && len > sizeof(h)) {
		const struct rps__ckpt_req *c = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(c->name, '\0', sizeof(c->name)) ||
		    (uint64_t)c->ntargets * sizeof(struct rps__ckpt_target) != len - sizeof(h) - sizeof(*c))
			return rps__seterr(-EBADMSG, "malformed CKPT message: name not terminated or %u targets do not fit",
					   c->ntargets);
	}
	if (h.type == RPS__MSG_CKPT_REP && len > sizeof(h)) {
		const struct rps__ckpt_rep *c = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(c->msg, '\0', sizeof(c->msg)) ||
		    (uint64_t)c->ntargets * sizeof(struct rps__ckpt_target) != len - sizeof(h) - sizeof(*c))
			return rps__seterr(-EBADMSG, "malformed CKPT_REP message");
	}
	if (h.type == RPS__MSG_AUTH) {
		const struct rps__auth *a = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(a->scope, '\0', sizeof(a->scope)) || a->reserved)
			return rps__seterr(-EBADMSG, "malformed AUTH message: scope not terminated");
	}
	if (h.type == RPS__MSG_AUTH_REP) {
		const struct rps__auth_rep *a = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(a->why, '\0', sizeof(a->why)))
			return rps__seterr(-EBADMSG, "malformed AUTH_REP message: reason not terminated");
	}
	if (h.type == RPS__MSG_RANK && len > sizeof(h)) {
		const struct rps__rank_req *r = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(r->name, '\0', sizeof(r->name)))
			return rps__seterr(-EBADMSG, "malformed RANK message: name not terminated");
	}
	if (h.type == RPS__MSG_RANK_REP && len > sizeof(h)) {
		const struct rps__rank_rep *r = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(r->msg, '\0', sizeof(r->msg)))
			return rps__seterr(-EBADMSG, "malformed RANK_REP message: text not terminated");
	}
	if (h.type == RPS__MSG_ADMIN_REP && len > sizeof(h)) {
		const struct rps__admin_rep *a = (const void *)((const char *)buf + sizeof(h));
		if (!memchr(a->msg, '\0', sizeof(a->msg)))
			return rps__seterr(-EBADMSG, "malformed ADMIN_REP message: text not terminated");
	}
	if (h.type == RPS__MSG_STEP_DONE) {
		const struct rps__step_done *s = (const void *)((const char *)buf + sizeof(h));
		if (s->n == 0 || s->n > RPS__STEP_DONE_MAX)
			return rps__seterr(-EBADMSG, "malformed STEP_DONE message: %u entries (1 to %u)", s->n,
					   RPS__STEP_DONE_MAX);
	}
	if ((h.type == RPS__MSG_HELLO || h.type == RPS__MSG_HELLO_REP) && !bare) {
		uint64_t magic;
		memcpy(&magic, (const char *)buf + sizeof(h), sizeof(magic));
		if (magic != RPS__HELLO_MAGIC)
			return rps__seterr(-EPROTO, "peer speaks another byte order or protocol (hello magic 0x%016llx)",
					   (unsigned long long)magic);
	}
	return 0;
}

int rps__name_check(const char *name)
{
	char esc[4 * RPS__NAME_MAX];
	size_t i, n = strnlen(name, RPS__NAME_MAX);

	if (n == 0 || n >= RPS__NAME_MAX)
		return rps__seterr(-ENAMETOOLONG, "tensor name '%s': give 1 to %u bytes", rps__escape(name, esc, sizeof(esc)),
				   RPS__NAME_MAX - 1);
	for (i = 0; i < n; i++)
		if ((unsigned char)name[i] < 0x21 || (unsigned char)name[i] > 0x7e)
			return rps__seterr(-EINVAL, "tensor name '%s': byte %zu is 0x%02x: names are printable ASCII "
					   "without spaces (0x21 to 0x7e)", rps__escape(name, esc, sizeof(esc)), i,
					   (unsigned char)name[i]);
	return 0;
}

int rps__desc_check(const struct rps__push_desc *d, size_t slot_size)
{
	if (d->magic != RPS__DESC_MAGIC)
		return rps__seterr(-EBADMSG, "malformed push: bad descriptor magic 0x%08x", d->magic);
	if (d->kind != RPS__PUSH_GRAD && d->kind != RPS__PUSH_INIT)
		return rps__seterr(-EBADMSG, "malformed push: unknown kind %u", d->kind);
	if ((size_t)d->nbytes > slot_size - RPS__PUSH_DESC_SIZE)
		return rps__seterr(-EBADMSG, "malformed push: %u data bytes exceed the %zu-byte slot",
				   d->nbytes, slot_size - RPS__PUSH_DESC_SIZE);
	if ((d->flags & RPS__DESC_CRC) && rps__push_crc(d) != d->crc)
		return rps__seterr(-EILSEQ, "push %llu: checksum mismatch (crc32c %08x, data gives %08x): corrupted in flight, not applied",
				   (unsigned long long)d->push_id, d->crc, rps__push_crc(d));
	return 0;
}

uint32_t rps__push_crc(const struct rps__push_desc *d)
{
	return rps__crc32c_noinv((const unsigned char *)d + RPS__PUSH_DESC_SIZE, d->nbytes);
}
