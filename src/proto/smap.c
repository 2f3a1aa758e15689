/*
 * smap.c - the shard map (see smap.h for the contract): which member owns
 * each partition under which epoch, the commands that change that, and the
 * wire formats of both.
 *
 * Determinism is the point: every replica applying the same commands must
 * hold byte-identical state, so unused members and partitions stay zeroed,
 * members stay sorted by id and every refusal depends only on the state and
 * the command.  Decoders treat input as hostile and never read past it.
 */
#include "config.h"
#include "proto/smap.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/le.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

_Static_assert(sizeof(struct rps__smap_member) == 8 + RPS__SMAP_URI_MAX, "member layout has no padding");
_Static_assert(sizeof(struct rps__smap_part) == 32, "partition layout has no padding");
_Static_assert(sizeof(struct rps__smap_cmd) == 40 + RPS__SMAP_URI_MAX, "command layout has no padding");

/* ------------------------------------------------------------------------ */
/* Bounds-checked reader: every take fails once the input is exhausted. */
struct reader {
	const uint8_t *p;
	size_t left;
};

static const uint8_t *take(struct reader *rd, size_t n)
{
	const uint8_t *p = rd->p;

	if (n > rd->left)
		return NULL;
	rd->p += n;
	rd->left -= n;
	return p;
}

static unsigned long long ull(uint64_t v)
{
	return (unsigned long long)v;
}

/* ------------------------------------------------------------------------ */
/* queries */

static int member_index(const struct rps__smap *m, uint64_t id)
{
	if (id == 0)
		return -1;
	for (uint32_t i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++)
		if (m->members[i].id == id)
			return (int)i;
	return -1;
}

const struct rps__smap_member *rps__smap_member(const struct rps__smap *m, uint64_t id)
{
	int i = member_index(m, id);

	return i < 0 ? NULL : &m->members[i];
}

uint32_t rps__smap_owned(const struct rps__smap *m, uint64_t id)
{
	uint32_t n = 0;

	for (uint32_t p = 0; p < m->npart && p < RPS__SMAP_MAX_PART; p++)
		n += m->parts[p].owner == id;
	return n;
}

uint32_t rps__smap_nlost(const struct rps__smap *m)
{
	uint32_t n = 0;

	for (uint32_t p = 0; p < m->npart && p < RPS__SMAP_MAX_PART; p++)
		n += m->parts[p].lost != 0;
	return n;
}

static bool uri_taken(const struct rps__smap *m, const char *uri)
{
	for (uint32_t i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++)
		if (strcmp(m->members[i].uri, uri) == 0)
			return true;
	return false;
}

/* ------------------------------------------------------------------------ */
/* bootstrap */

int rps__smap_init(struct rps__smap *m, const char *const *uris, uint32_t n, uint32_t npart)
{
	if (npart == 0)
		npart = RPS__SMAP_DEFAULT_PART;
	if (n == 0 || n > RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-EINVAL, "shard map: %" PRIu32 " members, a cluster has 1 to %u",
				   n, RPS__SMAP_MAX_MEMBERS);
	if (npart > RPS__SMAP_MAX_PART)
		return rps__seterr(-EINVAL, "shard map: %" PRIu32 " partitions, a cluster has 1 to %u",
				   npart, RPS__SMAP_MAX_PART);
	if (!uris)
		return rps__seterr(-EINVAL, "shard map: no member addresses given");
	for (uint32_t i = 0; i < n; i++) {
		size_t len = uris[i] ? strnlen(uris[i], RPS__SMAP_URI_MAX) : 0;

		if (len == 0)
			return rps__seterr(-EINVAL, "shard map: member %" PRIu32 " has no address", i + 1);
		if (len == RPS__SMAP_URI_MAX)
			return rps__seterr(-EINVAL, "shard map: address of member %" PRIu32
					   " is longer than %u bytes", i + 1, RPS__SMAP_URI_MAX - 1);
		for (uint32_t j = 0; j < i; j++)
			if (strcmp(uris[i], uris[j]) == 0)
				return rps__seterr(-EINVAL, "shard map: members %" PRIu32 " and %" PRIu32
						   " both have address %s", j + 1, i + 1, uris[i]);
	}

	memset(m, 0, sizeof(*m));
	m->npart = npart;
	m->nmembers = n;
	m->max_id = n;
	for (uint32_t i = 0; i < n; i++) {
		m->members[i].id = i + 1;
		memcpy(m->members[i].uri, uris[i], strlen(uris[i]));
	}
	for (uint32_t p = 0; p < npart; p++) {
		m->parts[p].owner = p % n + 1;
		m->parts[p].epoch = 1;
	}
	return 0;
}

/* ------------------------------------------------------------------------ */
/* commands */

static int check_add(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	size_t len = strnlen(c->uri, RPS__SMAP_URI_MAX);

	if (c->id == 0)
		return rps__seterr(-EINVAL, "add member: id 0 is reserved, member ids start at 1");
	if (len == 0)
		return rps__seterr(-EINVAL, "add member %llu: no address given", ull(c->id));
	if (len == RPS__SMAP_URI_MAX)
		return rps__seterr(-EINVAL, "add member %llu: address longer than %u bytes",
				   ull(c->id), RPS__SMAP_URI_MAX - 1);
	if (member_index(m, c->id) >= 0)
		return rps__seterr(-EEXIST, "add member %llu: already a member", ull(c->id));
	if (c->id <= m->max_id)
		return rps__seterr(-EINVAL, "add member %llu: ids are never reused, pick one above %llu",
				   ull(c->id), ull(m->max_id));
	if (uri_taken(m, c->uri))
		return rps__seterr(-EEXIST, "add member %llu: address %s belongs to another member",
				   ull(c->id), c->uri);
	if (m->nmembers >= RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-ENOSPC, "add member %llu: the cluster already has the maximum of %u members",
				   ull(c->id), RPS__SMAP_MAX_MEMBERS);
	return 0;
}

static int check_remove(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	uint32_t owned;

	if (c->id == 0)
		return rps__seterr(-EINVAL, "remove member: id 0 is never a member");
	if (member_index(m, c->id) < 0)
		return rps__seterr(-ENOENT, "remove member %llu: not a member", ull(c->id));
	owned = rps__smap_owned(m, c->id);
	if (owned)
		return rps__seterr(-EBUSY, "remove member %llu: it still owns %" PRIu32
				   " partition%s, move them away first", ull(c->id), owned, owned == 1 ? "" : "s");
	for (uint32_t p = 0; p < m->npart; p++)
		if (m->parts[p].moving_to == c->id)
			return rps__seterr(-EBUSY, "remove member %llu: partition %" PRIu32
					   " is moving to it, commit or abort that move first", ull(c->id), p);
	return 0;
}

static int check_part(const struct rps__smap *m, const struct rps__smap_cmd *c, const char *what)
{
	if (c->part >= m->npart)
		return rps__seterr(-ENOENT, "%s partition %" PRIu32 ": no such partition, the map has %" PRIu32 " partitions",
				   what, c->part, m->npart);
	return 0;
}

static int check_begin(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	const struct rps__smap_part *p;
	int err = check_part(m, c, "move");

	if (err)
		return err;
	p = &m->parts[c->part];
	if (c->to == c->from)
		return rps__seterr(-EINVAL, "move partition %" PRIu32 ": source and destination are both member %llu",
				   c->part, ull(c->to));
	if (c->from != p->owner)
		return rps__seterr(-ESTALE, "move partition %" PRIu32 ": member %llu is not its owner, member %llu is",
				   c->part, ull(c->from), ull(p->owner));
	if (c->epoch != p->epoch)
		return rps__seterr(-ESTALE, "move partition %" PRIu32 ": epoch %llu is stale, the partition is at epoch %llu",
				   c->part, ull(c->epoch), ull(p->epoch));
	if (p->moving_to)
		return rps__seterr(-EBUSY, "move partition %" PRIu32 ": already moving to member %llu",
				   c->part, ull(p->moving_to));
	if (p->lost)
		return rps__seterr(-ENODATA, "move partition %" PRIu32 ": its contents were lost with member %llu:"
				   " restore it or forget it first", c->part, ull(p->lost));
	if (member_index(m, c->to) < 0)
		return rps__seterr(-ENOENT, "move partition %" PRIu32 ": destination %llu is not a member",
				   c->part, ull(c->to));
	if (p->epoch >= RPS__EPOCH_MOVED - 1)
		return rps__seterr(-EOVERFLOW, "move partition %" PRIu32 ": epoch %llu is the last one",
				   c->part, ull(p->epoch));
	return 0;
}

static int check_commit(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	const struct rps__smap_part *p;
	int err = check_part(m, c, "commit move of");

	if (err)
		return err;
	p = &m->parts[c->part];
	if (!p->moving_to)
		return rps__seterr(-ESTALE, "commit move of partition %" PRIu32 ": no move in progress (epoch %llu)",
				   c->part, ull(p->epoch));
	if (c->to != p->moving_to)
		return rps__seterr(-ESTALE, "commit move of partition %" PRIu32 ": it is moving to member %llu, not %llu",
				   c->part, ull(p->moving_to), ull(c->to));
	if (c->epoch != p->epoch)
		return rps__seterr(-ESTALE, "commit move of partition %" PRIu32
				   ": epoch %llu is stale, the partition is at epoch %llu",
				   c->part, ull(c->epoch), ull(p->epoch));
	return 0;
}

static int check_abort(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	const struct rps__smap_part *p;
	int err = check_part(m, c, "abort move of");

	if (err)
		return err;
	p = &m->parts[c->part];
	if (!p->moving_to)
		return rps__seterr(-ESTALE, "abort move of partition %" PRIu32 ": no move in progress (epoch %llu)",
				   c->part, ull(p->epoch));
	if (c->epoch != p->epoch)
		return rps__seterr(-ESTALE, "abort move of partition %" PRIu32
				   ": epoch %llu is stale, the partition is at epoch %llu",
				   c->part, ull(c->epoch), ull(p->epoch));
	return 0;
}

static int check_mark_lost(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	const struct rps__smap_part *p;
	int err = check_part(m, c, "mark lost");

	if (err)
		return err;
	p = &m->parts[c->part];
	if (c->from != p->owner || c->epoch != p->epoch)
		return rps__seterr(-ESTALE, "mark lost partition %" PRIu32 ": member %llu at epoch %llu is not its owner,"
				   " member %llu at epoch %llu is", c->part, ull(c->from), ull(c->epoch),
				   ull(p->owner), ull(p->epoch));
	if (p->moving_to)
		return rps__seterr(-EBUSY, "mark lost partition %" PRIu32 ": moving to member %llu",
				   c->part, ull(p->moving_to));
	if (p->lost)
		return rps__seterr(-EALREADY, "mark lost partition %" PRIu32 ": already lost with member %llu",
				   c->part, ull(p->lost));
	return 0;
}

static int check_clear_lost(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	const struct rps__smap_part *p;
	int err = check_part(m, c, "clear lost");

	if (err)
		return err;
	p = &m->parts[c->part];
	if (!p->lost)
		return rps__seterr(-ESTALE, "clear lost partition %" PRIu32 ": it is not lost", c->part);
	if (c->epoch != p->epoch)
		return rps__seterr(-ESTALE, "clear lost partition %" PRIu32
				   ": epoch %llu is stale, the partition is at epoch %llu",
				   c->part, ull(c->epoch), ull(p->epoch));
	return 0;
}

static int check_force_remove(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	if (c->id == 0)
		return rps__seterr(-EINVAL, "force remove member: id 0 is never a member");
	if (member_index(m, c->id) < 0)
		return rps__seterr(-ENOENT, "force remove member %llu: not a member", ull(c->id));
	if (m->nmembers < 2)
		return rps__seterr(-EBUSY, "force remove member %llu: it is the last member", ull(c->id));
	for (uint32_t p = 0; p < m->npart; p++)
		if (m->parts[p].owner == c->id && m->parts[p].epoch >= RPS__EPOCH_MOVED - 1)
			return rps__seterr(-EOVERFLOW, "force remove member %llu: partition %" PRIu32
					   " is at its last epoch", ull(c->id), p);
	return 0;
}

int rps__smap_check(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	switch (c->type) {
	case RPS__SMAP_ADD_MEMBER:
		return check_add(m, c);
	case RPS__SMAP_REMOVE_MEMBER:
		return check_remove(m, c);
	case RPS__SMAP_MOVE_BEGIN:
		return check_begin(m, c);
	case RPS__SMAP_MOVE_COMMIT:
		return check_commit(m, c);
	case RPS__SMAP_MOVE_ABORT:
		return check_abort(m, c);
	case RPS__SMAP_NOP:
		return 0;
	case RPS__SMAP_MARK_LOST:
		return check_mark_lost(m, c);
	case RPS__SMAP_CLEAR_LOST:
		return check_clear_lost(m, c);
	case RPS__SMAP_FORCE_REMOVE:
		return check_force_remove(m, c);
	default:
		return rps__seterr(-EINVAL, "shard map command: unknown type %" PRIu32, c->type);
	}
}

static void do_add(struct rps__smap *m, const struct rps__smap_cmd *c)
{
	uint32_t i = m->nmembers;

	/* ids only grow, so this appends; keep the general sorted insert anyway */
	while (i > 0 && m->members[i - 1].id > c->id) {
		m->members[i] = m->members[i - 1];
		i--;
	}
	memset(&m->members[i], 0, sizeof(m->members[i]));
	m->members[i].id = c->id;
	memcpy(m->members[i].uri, c->uri, strlen(c->uri));
	m->nmembers++;
	m->max_id = c->id;
}

static void do_remove(struct rps__smap *m, const struct rps__smap_cmd *c)
{
	uint32_t i = (uint32_t)member_index(m, c->id);

	memmove(&m->members[i], &m->members[i + 1], (m->nmembers - i - 1) * sizeof(m->members[0]));
	m->nmembers--;
	memset(&m->members[m->nmembers], 0, sizeof(m->members[0]));
}

/* A dead member goes: moves from or to it are off, its partitions pass to
 * the others in turn (by id), one epoch on, marked lost with it. */
static void do_force_remove(struct rps__smap *m, const struct rps__smap_cmd *c)
{
	uint32_t next = 0;

	for (uint32_t p = 0; p < m->npart; p++) {
		struct rps__smap_part *pp = &m->parts[p];

		if (pp->moving_to == c->id)
			pp->moving_to = 0;
		if (pp->owner != c->id)
			continue;
		pp->moving_to = 0;
		if (m->members[next % m->nmembers].id == c->id)
			next++;
		pp->owner = m->members[next % m->nmembers].id;
		next++;
		pp->epoch++;
		if (!pp->lost)
			pp->lost = c->id;
	}
	do_remove(m, c);
}

int rps__smap_apply(struct rps__smap *m, uint64_t index, const struct rps__smap_cmd *c)
{
	struct rps__smap_part *p;
	int err;

	/* A replay of an entry the map already holds (after a snapshot restore):
	 * changing nothing keeps the map consistent. */
	if (index <= m->applied)
		return rps__seterr(-EALREADY, "shard map: entry %llu already applied (map is at %llu)",
				   ull(index), ull(m->applied));
	err = rps__smap_check(m, c);
	m->applied = index;
	if (err)
		return err;
	switch (c->type) {
	case RPS__SMAP_ADD_MEMBER:
		do_add(m, c);
		break;
	case RPS__SMAP_REMOVE_MEMBER:
		do_remove(m, c);
		break;
	case RPS__SMAP_MOVE_BEGIN:
		m->parts[c->part].moving_to = c->to;
		break;
	case RPS__SMAP_MOVE_COMMIT:
		p = &m->parts[c->part];
		p->owner = c->to;
		p->epoch++;
		p->moving_to = 0;
		break;
	case RPS__SMAP_MOVE_ABORT:
		m->parts[c->part].moving_to = 0;
		break;
	case RPS__SMAP_MARK_LOST:
		m->parts[c->part].lost = c->from;
		break;
	case RPS__SMAP_CLEAR_LOST:
		m->parts[c->part].lost = 0;
		break;
	case RPS__SMAP_FORCE_REMOVE:
		do_force_remove(m, c);
		break;
	}
	return 0;
}

/* ------------------------------------------------------------------------ */
/* command wire format
 *
 *	"SMCD", u16 version, u32 type, u32 part, u64 id, from, to, epoch,
 *	u16 uri length (< RPS__SMAP_URI_MAX, no NUL), uri bytes
 */

#define CMD_MAGIC "SMCD"
#define CMD_VERSION 1u
#define CMD_HDR (4u + 2u + 4u + 4u + 4u * 8u + 2u)

_Static_assert(CMD_HDR + RPS__SMAP_URI_MAX - 1 <= RPS__SMAP_CMD_MAX, "a command fits RPS__SMAP_CMD_MAX");

int rps__smap_cmd_encode(const struct rps__smap_cmd *c, void *buf, size_t cap, size_t *len)
{
	size_t ulen = strnlen(c->uri, RPS__SMAP_URI_MAX);
	uint8_t *p = buf;

	if (ulen == RPS__SMAP_URI_MAX)
		return rps__seterr(-EINVAL, "shard map command: address longer than %u bytes",
				   RPS__SMAP_URI_MAX - 1);
	if (CMD_HDR + ulen > cap)
		return rps__seterr(-ENOSPC, "shard map command: needs %zu bytes, buffer has %zu",
				   CMD_HDR + ulen, cap);
	memcpy(p, CMD_MAGIC, 4);
	rps__le_put16(p + 4, CMD_VERSION);
	rps__le_put32(p + 6, c->type);
	rps__le_put32(p + 10, c->part);
	rps__le_put64(p + 14, c->id);
	rps__le_put64(p + 22, c->from);
	rps__le_put64(p + 30, c->to);
	rps__le_put64(p + 38, c->epoch);
	rps__le_put16(p + 46, (uint16_t)ulen);
	memcpy(p + CMD_HDR, c->uri, ulen);
	*len = CMD_HDR + ulen;
	return 0;
}

int rps__smap_cmd_decode(const void *buf, size_t len, struct rps__smap_cmd *c)
{
	struct reader rd = { buf, len };
	const uint8_t *p = take(&rd, CMD_HDR), *u;
	uint16_t ulen;
	uint32_t type;

	if (!p)
		return rps__seterr(-EBADMSG, "shard map command: truncated, %zu bytes is shorter than its header", len);
	if (memcmp(p, CMD_MAGIC, 4) != 0)
		return rps__seterr(-EBADMSG, "shard map command: bad magic, not a shard map command");
	if (rps__le_get16(p + 4) != CMD_VERSION)
		return rps__seterr(-EBADMSG, "shard map command: version %u, this build reads version %u",
				   rps__le_get16(p + 4), CMD_VERSION);
	type = rps__le_get32(p + 6);
	if (type < RPS__SMAP_ADD_MEMBER || type > RPS__SMAP_FORCE_REMOVE)
		return rps__seterr(-EBADMSG, "shard map command: unknown type %" PRIu32, type);
	ulen = rps__le_get16(p + 46);
	if (ulen >= RPS__SMAP_URI_MAX)
		return rps__seterr(-EBADMSG, "shard map command: address of %u bytes, the limit is %u",
				   ulen, RPS__SMAP_URI_MAX - 1);
	u = take(&rd, ulen);
	if (!u)
		return rps__seterr(-EBADMSG, "shard map command: truncated, %zu bytes of %zu", len,
				   (size_t)CMD_HDR + ulen);
	if (memchr(u, 0, ulen))
		return rps__seterr(-EBADMSG, "shard map command: address contains a NUL byte");
	if (rd.left)
		return rps__seterr(-EBADMSG, "shard map command: %zu trailing bytes", rd.left);

	memset(c, 0, sizeof(*c));
	c->type = type;
	c->part = rps__le_get32(p + 10);
	c->id = rps__le_get64(p + 14);
	c->from = rps__le_get64(p + 22);
	c->to = rps__le_get64(p + 30);
	c->epoch = rps__le_get64(p + 38);
	memcpy(c->uri, u, ulen);
	return 0;
}

const char *rps__smap_cmd_name(uint32_t type)
{
	static const char *const names[] = {
		[RPS__SMAP_ADD_MEMBER] = "ADD_MEMBER",
		[RPS__SMAP_REMOVE_MEMBER] = "REMOVE_MEMBER",
		[RPS__SMAP_MOVE_BEGIN] = "MOVE_BEGIN",
		[RPS__SMAP_MOVE_COMMIT] = "MOVE_COMMIT",
		[RPS__SMAP_MOVE_ABORT] = "MOVE_ABORT",
		[RPS__SMAP_NOP] = "NOP",
		[RPS__SMAP_MARK_LOST] = "MARK_LOST",
		[RPS__SMAP_CLEAR_LOST] = "CLEAR_LOST",
		[RPS__SMAP_FORCE_REMOVE] = "FORCE_REMOVE",
	};

	if (type < RPS__SMAP_ADD_MEMBER || type > RPS__SMAP_FORCE_REMOVE)
		return "?";
	return names[type];
}

const char *rps__smap_cmd_str(const struct rps__smap_cmd *c, char *buf, size_t len)
{
	if (!buf || !len)
		return "";
	switch (c->type) {
	case RPS__SMAP_ADD_MEMBER:
		snprintf(buf, len, "add member %llu at %.*s", ull(c->id), (int)RPS__SMAP_URI_MAX - 1, c->uri);
		break;
	case RPS__SMAP_REMOVE_MEMBER:
		snprintf(buf, len, "remove member %llu", ull(c->id));
		break;
	case RPS__SMAP_MOVE_BEGIN:
		snprintf(buf, len, "move partition %" PRIu32 " from %llu to %llu (epoch %llu)",
			 c->part, ull(c->from), ull(c->to), ull(c->epoch));
		break;
	case RPS__SMAP_MOVE_COMMIT:
		snprintf(buf, len, "commit move of partition %" PRIu32 " to %llu (epoch %llu)",
			 c->part, ull(c->to), ull(c->epoch));
		break;
	case RPS__SMAP_MOVE_ABORT:
		snprintf(buf, len, "abort move of partition %" PRIu32 " (epoch %llu)", c->part, ull(c->epoch));
		break;
	case RPS__SMAP_NOP:
		snprintf(buf, len, "no-op");
		break;
	case RPS__SMAP_MARK_LOST:
		snprintf(buf, len, "partition %" PRIu32 " lost with member %llu (epoch %llu)", c->part,
			 ull(c->from), ull(c->epoch));
		break;
	case RPS__SMAP_CLEAR_LOST:
		snprintf(buf, len, "partition %" PRIu32 " no longer lost (epoch %llu)", c->part, ull(c->epoch));
		break;
	case RPS__SMAP_FORCE_REMOVE:
		snprintf(buf, len, "force remove member %llu", ull(c->id));
		break;
	default:
		snprintf(buf, len, "unknown shard map command type %" PRIu32, c->type);
		break;
	}
	return buf;
}

/* ------------------------------------------------------------------------ */
/* map wire format
 *
 *	"SMAP", u16 version, u64 applied, u64 max_id, u32 npart, u32 nmembers,
 *	nmembers x { u64 id, u16 uri length, uri bytes },
 *	npart x { u64 owner, u64 epoch, u64 moving_to [, u64 lost (version 2)] },
 *	u32 crc32c of everything before it
 *
 * Version 2 adds the lost field; a map with no lost partition is written as
 * version 1, so builds that predate it still read it.
 */

#define MAP_MAGIC "SMAP"
#define MAP_VERSION 1u
#define MAP_VERSION_LOST 2u
#define MAP_PART_LOST (4u * 8u)
#define MAP_HDR (4u + 2u + 8u + 8u + 4u + 4u)
#define MAP_MEMBER_HDR (8u + 2u)
#define MAP_PART (3u * 8u)

_Static_assert(MAP_HDR + RPS__SMAP_MAX_MEMBERS * (MAP_MEMBER_HDR + RPS__SMAP_URI_MAX - 1) +
	       RPS__SMAP_MAX_PART * MAP_PART_LOST + 4u <= RPS__SMAP_ENC_MAX, "a map fits RPS__SMAP_ENC_MAX");

static size_t part_size(const struct rps__smap *m)
{
	return rps__smap_nlost(m) ? MAP_PART_LOST : MAP_PART;
}

/* 0 if the struct can be encoded at all (its counts stay inside it). */
static int encodable(const struct rps__smap *m)
{
	if (m->npart > RPS__SMAP_MAX_PART || m->nmembers > RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-EINVAL, "shard map: %" PRIu32 " partitions and %" PRIu32
				   " members, beyond the limits of %u and %u", m->npart, m->nmembers,
				   RPS__SMAP_MAX_PART, RPS__SMAP_MAX_MEMBERS);
	for (uint32_t i = 0; i < m->nmembers; i++)
		if (strnlen(m->members[i].uri, RPS__SMAP_URI_MAX) == RPS__SMAP_URI_MAX)
			return rps__seterr(-EINVAL, "shard map: address of member %llu is not terminated",
					   ull(m->members[i].id));
	return 0;
}

size_t rps__smap_encoded_size(const struct rps__smap *m)
{
	size_t n = MAP_HDR + 4u;
	uint32_t nm = RPS__MIN(m->nmembers, RPS__SMAP_MAX_MEMBERS);

	for (uint32_t i = 0; i < nm; i++)
		n += MAP_MEMBER_HDR + strnlen(m->members[i].uri, RPS__SMAP_URI_MAX - 1);
	return n + (size_t)RPS__MIN(m->npart, RPS__SMAP_MAX_PART) * part_size(m);
}

int rps__smap_encode(const struct rps__smap *m, void *buf, size_t cap, size_t *len)
{
	size_t need, psize;
	uint8_t *p = buf;
	int err = encodable(m);

	if (err)
		return err;
	need = rps__smap_encoded_size(m);
	if (need > cap)
		return rps__seterr(-ENOSPC, "shard map: needs %zu bytes, buffer has %zu", need, cap);
	psize = part_size(m);
	memcpy(p, MAP_MAGIC, 4);
	rps__le_put16(p + 4, psize == MAP_PART ? MAP_VERSION : MAP_VERSION_LOST);
	rps__le_put64(p + 6, m->applied);
	rps__le_put64(p + 14, m->max_id);
	rps__le_put32(p + 22, m->npart);
	rps__le_put32(p + 26, m->nmembers);
	p += MAP_HDR;
	for (uint32_t i = 0; i < m->nmembers; i++) {
		size_t ulen = strlen(m->members[i].uri);

		rps__le_put64(p, m->members[i].id);
		rps__le_put16(p + 8, (uint16_t)ulen);
		memcpy(p + MAP_MEMBER_HDR, m->members[i].uri, ulen);
		p += MAP_MEMBER_HDR + ulen;
	}
	for (uint32_t i = 0; i < m->npart; i++, p += psize) {
		rps__le_put64(p, m->parts[i].owner);
		rps__le_put64(p + 8, m->parts[i].epoch);
		rps__le_put64(p + 16, m->parts[i].moving_to);
		if (psize == MAP_PART_LOST)
			rps__le_put64(p + 24, m->parts[i].lost);
	}
	rps__le_put32(p, rps__crc32c_noinv(buf, (size_t)(p - (uint8_t *)buf)));
	p += 4;
	*len = (size_t)(p - (uint8_t *)buf);
	return 0;
}

/* The invariants every map this module produces holds; a decoded map must
 * hold them too, or applying commands to it could go anywhere. */
static int map_validate(const struct rps__smap *m)
{
	for (uint32_t i = 0; i < m->nmembers; i++) {
		const struct rps__smap_member *mb = &m->members[i];

		if (mb->id == 0 || mb->id > m->max_id)
			return rps__seterr(-EBADMSG, "shard map: member id %llu is outside 1..%llu",
					   ull(mb->id), ull(m->max_id));
		if (i > 0 && mb->id <= m->members[i - 1].id)
			return rps__seterr(-EBADMSG, "shard map: member ids %llu and %llu are out of order or repeated",
					   ull(m->members[i - 1].id), ull(mb->id));
		if (mb->uri[0] == '\0')
			return rps__seterr(-EBADMSG, "shard map: member %llu has no address", ull(mb->id));
		for (uint32_t j = 0; j < i; j++)
			if (strcmp(mb->uri, m->members[j].uri) == 0)
				return rps__seterr(-EBADMSG, "shard map: members %llu and %llu share address %s",
						   ull(m->members[j].id), ull(mb->id), mb->uri);
	}
	for (uint32_t i = 0; i < m->npart; i++) {
		const struct rps__smap_part *p = &m->parts[i];

		if (member_index(m, p->owner) < 0)
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " is owned by %llu, not a member",
					   i, ull(p->owner));
		if (p->epoch == 0 || p->epoch == RPS__EPOCH_MOVED)
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has invalid epoch %llu",
					   i, ull(p->epoch));
		if (p->moving_to && (p->moving_to == p->owner || member_index(m, p->moving_to) < 0))
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " of member %llu is moving to %llu,"
					   " not another member", i, ull(p->owner), ull(p->moving_to));
	}
	return 0;
}

int rps__smap_decode(const void *buf, size_t len, struct rps__smap *out)
{
	struct rps__smap m;
	struct reader rd = { buf, len };
	const uint8_t *p = take(&rd, MAP_HDR), *q;
	size_t body, psize;
	uint32_t crc;
	int err;

	if (!p)
		return rps__seterr(-EBADMSG, "shard map: truncated, %zu bytes is shorter than its header", len);
	if (memcmp(p, MAP_MAGIC, 4) != 0)
		return rps__seterr(-EBADMSG, "shard map: bad magic, not an encoded shard map");
	if (rps__le_get16(p + 4) != MAP_VERSION && rps__le_get16(p + 4) != MAP_VERSION_LOST)
		return rps__seterr(-EBADMSG, "shard map: version %u, this build reads versions %u and %u",
				   rps__le_get16(p + 4), MAP_VERSION, MAP_VERSION_LOST);
	psize = rps__le_get16(p + 4) == MAP_VERSION ? MAP_PART : MAP_PART_LOST;
	memset(&m, 0, sizeof(m));
	m.applied = rps__le_get64(p + 6);
	m.max_id = rps__le_get64(p + 14);
	m.npart = rps__le_get32(p + 22);
	m.nmembers = rps__le_get32(p + 26);
	if (m.npart == 0 || m.npart > RPS__SMAP_MAX_PART)
		return rps__seterr(-EBADMSG, "shard map: %" PRIu32 " partitions, a map has 1 to %u",
				   m.npart, RPS__SMAP_MAX_PART);
	if (m.nmembers == 0 || m.nmembers > RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-EBADMSG, "shard map: %" PRIu32 " members, a map has 1 to %u",
				   m.nmembers, RPS__SMAP_MAX_MEMBERS);
	for (uint32_t i = 0; i < m.nmembers; i++) {
		uint16_t ulen;

		q = take(&rd, MAP_MEMBER_HDR);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map: truncated in member %" PRIu32 " of %" PRIu32,
					   i + 1, m.nmembers);
		m.members[i].id = rps__le_get64(q);
		ulen = rps__le_get16(q + 8);
		if (ulen >= RPS__SMAP_URI_MAX)
			return rps__seterr(-EBADMSG, "shard map: address of member %llu has %u bytes, the limit is %u",
					   ull(m.members[i].id), ulen, RPS__SMAP_URI_MAX - 1);
		q = take(&rd, ulen);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map: truncated in the address of member %llu",
					   ull(m.members[i].id));
		if (memchr(q, 0, ulen))
			return rps__seterr(-EBADMSG, "shard map: address of member %llu contains a NUL byte",
					   ull(m.members[i].id));
		memcpy(m.members[i].uri, q, ulen);
	}
	for (uint32_t i = 0; i < m.npart; i++) {
		q = take(&rd, psize);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map: truncated in partition %" PRIu32 " of %" PRIu32,
					   i, m.npart);
		m.parts[i].owner = rps__le_get64(q);
		m.parts[i].epoch = rps__le_get64(q + 8);
		m.parts[i].moving_to = rps__le_get64(q + 16);
		if (psize == MAP_PART_LOST)
			m.parts[i].lost = rps__le_get64(q + 24);
	}
	body = len - rd.left;
	q = take(&rd, 4);
	if (!q)
		return rps__seterr(-EBADMSG, "shard map: truncated before its checksum (%zu bytes)", len);
	if (rd.left)
		return rps__seterr(-EBADMSG, "shard map: %zu bytes after the checksum", rd.left);
	crc = rps__crc32c_noinv(buf, body);
	if (rps__le_get32(q) != crc)
		return rps__seterr(-EILSEQ, "shard map: crc32c mismatch (stored %08" PRIx32 ", computed %08" PRIx32
				   "): the map is corrupt", rps__le_get32(q), crc);
	err = map_validate(&m);
	if (err)
		return err;
	memcpy(out, &m, sizeof(m));
	return 0;
}

/* ------------------------------------------------------------------------ */
/* printing */

/* Print the partitions marked in sel[0..n) as "a-b" / "a" ranges. */
static void print_ranges(FILE *f, const bool *sel, uint32_t n)
{
	bool first = true;

	for (uint32_t p = 0; p < n; p++) {
		uint32_t q = p;

		if (!sel[p])
			continue;
		while (q + 1 < n && sel[q + 1])
			q++;
		fprintf(f, "%s%" PRIu32, first ? "" : ",", p);
		if (q > p)
			fprintf(f, "-%" PRIu32, q);
		first = false;
		p = q;
	}
}

void rps__smap_print(const struct rps__smap *m, FILE *f)
{
	uint32_t npart = RPS__MIN(m->npart, RPS__SMAP_MAX_PART);
	uint32_t nm = RPS__MIN(m->nmembers, RPS__SMAP_MAX_MEMBERS);
	bool done[RPS__SMAP_MAX_PART] = { false }, sel[RPS__SMAP_MAX_PART];
	int w = 3;

	for (uint32_t i = 0; i < nm; i++)
		w = RPS__MAX(w, (int)strnlen(m->members[i].uri, RPS__SMAP_URI_MAX - 1));
	fprintf(f, "shard map: %" PRIu32 " member%s, %" PRIu32 " partitions, applied index %llu\n",
		nm, nm == 1 ? "" : "s", npart, ull(m->applied));
	fprintf(f, "%6s  %-*s  %s\n", "id", w, "uri", "partitions");
	for (uint32_t i = 0; i < nm; i++)
		fprintf(f, "%6llu  %-*.*s  %" PRIu32 "\n", ull(m->members[i].id), w, (int)RPS__SMAP_URI_MAX - 1,
			m->members[i].uri, rps__smap_owned(m, m->members[i].id));
	/* Settled partitions grouped by (owner, epoch) in order of their first
	 * partition; moving ones one per line, they are what an operator watches. */
	for (uint32_t p = 0; p < npart; p++) {
		const struct rps__smap_part *a = &m->parts[p];
		uint32_t count = 0;

		if (done[p])
			continue;
		if (a->moving_to) {
			fprintf(f, "partition %" PRIu32 " -> member %llu, moving to %llu (epoch %llu)\n",
				p, ull(a->owner), ull(a->moving_to), ull(a->epoch));
			done[p] = true;
			continue;
		}
		for (uint32_t q = p; q < npart; q++) {
			const struct rps__smap_part *b = &m->parts[q];

			sel[q] = !done[q] && !b->moving_to && b->owner == a->owner && b->epoch == a->epoch &&
				 b->lost == a->lost;
			if (sel[q]) {
				done[q] = true;
				count++;
			}
		}
		for (uint32_t q = 0; q < p; q++)
			sel[q] = false;
		fprintf(f, "partition%s ", count == 1 ? "" : "s");
		print_ranges(f, sel, npart);
		fprintf(f, " -> member %llu (epoch %llu)", ull(a->owner), ull(a->epoch));
		if (a->lost)
			fprintf(f, " LOST with member %llu: psctl restore DIR, or psctl forget-lost", ull(a->lost));
		fputc('\n', f);
	}
}

static void json_string(FILE *f, const char *s, size_t max)
{
	fputc('"', f);
	for (size_t i = 0; i < max && s[i]; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			fprintf(f, "\\u%04x", ch);	/* keeps the output ASCII, hence valid */
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

void rps__smap_print_json(const struct rps__smap *m, FILE *f)
{
	uint32_t npart = RPS__MIN(m->npart, RPS__SMAP_MAX_PART);
	uint32_t nm = RPS__MIN(m->nmembers, RPS__SMAP_MAX_MEMBERS);

	fprintf(f, "{\"applied\":%llu,\"partitions\":[", ull(m->applied));
	for (uint32_t p = 0; p < npart; p++)
		fprintf(f, "%s{\"partition\":%" PRIu32 ",\"owner\":%llu,\"epoch\":%llu,\"moving_to\":%llu,\"lost\":%llu}",
			p ? "," : "", p, ull(m->parts[p].owner), ull(m->parts[p].epoch), ull(m->parts[p].moving_to),
			ull(m->parts[p].lost));
	fputs("],\"members\":[", f);
	for (uint32_t i = 0; i < nm; i++) {
		fprintf(f, "%s{\"id\":%llu,\"uri\":", i ? "," : "", ull(m->members[i].id));
		json_string(f, m->members[i].uri, RPS__SMAP_URI_MAX - 1);
		fputc('}', f);
	}
	fputs("]}\n", f);
}
