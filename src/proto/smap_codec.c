/*
 * smap_codec.c - the shard map's wire formats (commands: WAL entries and
 * proposals; the whole map: snapshots, what workers READ and psctl
 * receives), their names and one-line descriptions, and psctl's table and
 * JSON.  The contract is in smap.h.
 *
 * Decoders treat input as hostile and never read past it; a decoded map
 * must hold every invariant smap.c keeps, or applying commands to it could
 * go anywhere.  Each map is written in the oldest format version that can
 * hold it, so unreplicated clusters keep their bytes.
 */
#include "config.h"
#include "proto/smap.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/le.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
static unsigned long long ull(uint64_t v)
{
	return (unsigned long long)v;
}

static bool is_member(const struct rps__smap *m, uint64_t id)
{
	return id != 0 && rps__smap_member(m, id) != NULL;
}

/* ------------------------------------------------------------------------ */
/* command wire format
 *
 *	"SMCD", u16 version, u32 type, u32 part, u64 id, from, to, epoch,
 *	u16 uri length (< RPS__SMAP_URI_MAX, no NUL), uri bytes
 *	version 2 only: u8 nkeep (< RPS__SMAP_MAX_REPLICAS), u64 keep[nkeep],
 *	u8 zone length (< RPS__SMAP_ZONE_MAX, no NUL), zone bytes
 *
 * The commands that existed before replica sets are written as version 1,
 * so their bytes (in the WAL, in PROPOSE messages) did not change; the
 * replica-set commands need version 2.
 */

#define CMD_MAGIC "SMCD"
#define CMD_VERSION 1u
#define CMD_VERSION_REPL 2u
#define CMD_HDR (4u + 2u + 4u + 4u + 4u * 8u + 2u)
#define CMD_TAIL_MAX (1u + 8u * (RPS__SMAP_MAX_REPLICAS - 1u) + 1u + RPS__SMAP_ZONE_MAX - 1u)

_Static_assert(CMD_HDR + RPS__SMAP_URI_MAX - 1 + CMD_TAIL_MAX <= RPS__SMAP_CMD_MAX, "a command fits RPS__SMAP_CMD_MAX");

static bool cmd_needs_v2(uint32_t type)
{
	return type >= RPS__SMAP_SET_REPLICAS;
}

int rps__smap_cmd_encode(const struct rps__smap_cmd *c, void *buf, size_t cap, size_t *len)
{
	size_t ulen = strnlen(c->uri, RPS__SMAP_URI_MAX), zlen = 0, need = CMD_HDR + ulen;
	bool v2 = cmd_needs_v2(c->type);
	uint8_t *p = buf;

	if (ulen == RPS__SMAP_URI_MAX)
		return rps__seterr(-EINVAL, "shard map command: address longer than %u bytes",
				   RPS__SMAP_URI_MAX - 1);
	if (v2) {
		zlen = strnlen(c->zone, RPS__SMAP_ZONE_MAX);
		if (zlen == RPS__SMAP_ZONE_MAX)
			return rps__seterr(-EINVAL, "shard map command: zone longer than %u bytes",
					   RPS__SMAP_ZONE_MAX - 1);
		if (c->nkeep > RPS__SMAP_MAX_REPLICAS - 1)
			return rps__seterr(-EINVAL, "shard map command: %" PRIu32 " backups to keep, at most %u",
					   c->nkeep, RPS__SMAP_MAX_REPLICAS - 1);
		need += 1 + 8u * c->nkeep + 1 + zlen;
	}
	if (need > cap)
		return rps__seterr(-ENOSPC, "shard map command: needs %zu bytes, buffer has %zu", need, cap);
	memcpy(p, CMD_MAGIC, 4);
	rps__le_put16(p + 4, v2 ? CMD_VERSION_REPL : CMD_VERSION);
	rps__le_put32(p + 6, c->type);
	rps__le_put32(p + 10, c->part);
	rps__le_put64(p + 14, c->id);
	rps__le_put64(p + 22, c->from);
	rps__le_put64(p + 30, c->to);
	rps__le_put64(p + 38, c->epoch);
	rps__le_put16(p + 46, (uint16_t)ulen);
	memcpy(p + CMD_HDR, c->uri, ulen);
	p += CMD_HDR + ulen;
	if (v2) {
		*p++ = (uint8_t)c->nkeep;
		for (uint32_t i = 0; i < c->nkeep; i++, p += 8)
			rps__le_put64(p, c->keep[i]);
		*p++ = (uint8_t)zlen;
		memcpy(p, c->zone, zlen);
	}
	*len = need;
	return 0;
}

/* The version-2 tail: keep[] and zone. */
static int cmd_decode_tail(struct rps__reader *rd, struct rps__smap_cmd *c)
{
	const uint8_t *q = rps__reader_take(rd, 1), *z;

	if (!q)
		return rps__seterr(-EBADMSG, "shard map command: truncated before its backups");
	if (*q > RPS__SMAP_MAX_REPLICAS - 1)
		return rps__seterr(-EBADMSG, "shard map command: %u backups to keep, at most %u", *q,
				   RPS__SMAP_MAX_REPLICAS - 1);
	c->nkeep = *q;
	for (uint32_t i = 0; i < c->nkeep; i++) {
		q = rps__reader_take(rd, 8);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map command: truncated in backup %" PRIu32, i + 1);
		c->keep[i] = rps__le_get64(q);
	}
	q = rps__reader_take(rd, 1);
	if (!q)
		return rps__seterr(-EBADMSG, "shard map command: truncated before its zone");
	if (*q >= RPS__SMAP_ZONE_MAX)
		return rps__seterr(-EBADMSG, "shard map command: zone of %u bytes, the limit is %u", *q,
				   RPS__SMAP_ZONE_MAX - 1);
	z = rps__reader_take(rd, *q);
	if (!z)
		return rps__seterr(-EBADMSG, "shard map command: truncated in its zone");
	if (memchr(z, 0, *q))
		return rps__seterr(-EBADMSG, "shard map command: zone contains a NUL byte");
	memcpy(c->zone, z, *q);
	return 0;
}

int rps__smap_cmd_decode(const void *buf, size_t len, struct rps__smap_cmd *c)
{
	struct rps__reader rd = { buf, len };
	const uint8_t *p = rps__reader_take(&rd, CMD_HDR), *u;
	struct rps__smap_cmd out;
	uint16_t ulen, version;
	uint32_t type;
	int err;

	if (!p)
		return rps__seterr(-EBADMSG, "shard map command: truncated, %zu bytes is shorter than its header", len);
	if (memcmp(p, CMD_MAGIC, 4) != 0)
		return rps__seterr(-EBADMSG, "shard map command: bad magic, not a shard map command");
	version = rps__le_get16(p + 4);
	if (version != CMD_VERSION && version != CMD_VERSION_REPL)
		return rps__seterr(-EBADMSG, "shard map command: version %u, this build reads versions %u and %u",
				   version, CMD_VERSION, CMD_VERSION_REPL);
	type = rps__le_get32(p + 6);
	if (type < RPS__SMAP_ADD_MEMBER || type > RPS__SMAP_CMD_LAST)
		return rps__seterr(-EBADMSG, "shard map command: unknown type %" PRIu32, type);
	if (cmd_needs_v2(type) && version != CMD_VERSION_REPL)
		return rps__seterr(-EBADMSG, "shard map command: %s needs version %u, it says %u",
				   rps__smap_cmd_name(type), CMD_VERSION_REPL, version);
	ulen = rps__le_get16(p + 46);
	if (ulen >= RPS__SMAP_URI_MAX)
		return rps__seterr(-EBADMSG, "shard map command: address of %u bytes, the limit is %u",
				   ulen, RPS__SMAP_URI_MAX - 1);
	u = rps__reader_take(&rd, ulen);
	if (!u)
		return rps__seterr(-EBADMSG, "shard map command: truncated, %zu bytes of %zu", len,
				   (size_t)CMD_HDR + ulen);
	if (memchr(u, 0, ulen))
		return rps__seterr(-EBADMSG, "shard map command: address contains a NUL byte");

	memset(&out, 0, sizeof(out));
	if (version == CMD_VERSION_REPL && (err = cmd_decode_tail(&rd, &out)))
		return err;
	if (rd.left)
		return rps__seterr(-EBADMSG, "shard map command: %zu trailing bytes", rd.left);
	out.type = type;
	out.part = rps__le_get32(p + 10);
	out.id = rps__le_get64(p + 14);
	out.from = rps__le_get64(p + 22);
	out.to = rps__le_get64(p + 30);
	out.epoch = rps__le_get64(p + 38);
	memcpy(out.uri, u, ulen);
	memcpy(c, &out, sizeof(out));
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
		[RPS__SMAP_SET_REPLICAS] = "SET_REPLICAS",
		[RPS__SMAP_SET_ZONE] = "SET_ZONE",
		[RPS__SMAP_REPLICA_BEGIN] = "REPLICA_BEGIN",
		[RPS__SMAP_REPLICA_COMMIT] = "REPLICA_COMMIT",
		[RPS__SMAP_REPLICA_ABORT] = "REPLICA_ABORT",
		[RPS__SMAP_REPLICA_DROP] = "REPLICA_DROP",
		[RPS__SMAP_FAILOVER] = "FAILOVER",
		[RPS__SMAP_SET_WITNESS] = "SET_WITNESS",
	};

	if (type < RPS__SMAP_ADD_MEMBER || type > RPS__SMAP_CMD_LAST)
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
	case RPS__SMAP_SET_REPLICAS:
		snprintf(buf, len, "keep %llu cop%s of every partition", ull(c->id), c->id == 1 ? "y" : "ies");
		break;
	case RPS__SMAP_SET_ZONE:
		snprintf(buf, len, "member %llu is in zone '%.*s'", ull(c->id), (int)RPS__SMAP_ZONE_MAX - 1, c->zone);
		break;
	case RPS__SMAP_REPLICA_BEGIN:
		snprintf(buf, len, "seed member %llu as a backup of partition %" PRIu32 " (epoch %llu)",
			 ull(c->to), c->part, ull(c->epoch));
		break;
	case RPS__SMAP_REPLICA_COMMIT:
		snprintf(buf, len, "member %llu is a backup of partition %" PRIu32 " (epoch %llu)",
			 ull(c->to), c->part, ull(c->epoch));
		break;
	case RPS__SMAP_REPLICA_ABORT:
		snprintf(buf, len, "abort seeding a backup of partition %" PRIu32 " (epoch %llu)", c->part,
			 ull(c->epoch));
		break;
	case RPS__SMAP_REPLICA_DROP:
		snprintf(buf, len, "drop backup %llu of partition %" PRIu32 " (epoch %llu)", ull(c->id), c->part,
			 ull(c->epoch));
		break;
	case RPS__SMAP_FAILOVER:
		snprintf(buf, len, "fail over partition %" PRIu32 " from %llu to %llu keeping %" PRIu32
			 " backup%s (epoch %llu)", c->part, ull(c->from), ull(c->to), c->nkeep,
			 c->nkeep == 1 ? "" : "s", ull(c->epoch));
		break;
	case RPS__SMAP_SET_WITNESS:
		snprintf(buf, len, "member %llu is a witness (it holds no partitions)", ull(c->id));
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
 *	[u32 replicas (version 3)]
 *	nmembers x { u64 id, u16 uri length, uri bytes [, u8 zone length, zone bytes (versions 3, 4)]
 *		     [, u32 flags (version 4)] },
 *	npart x { u64 owner, u64 epoch, u64 moving_to [, u64 lost (versions 2, 3)]
 *		  [, u64 joining, u8 nbackups, u64 backups[nbackups] (versions 3, 4)] },
 *	u32 crc32c of everything before it
 *
 * Version 2 adds the lost field, version 3 the replica sets, zones and the
 * replication target, version 4 the members' flags (a witness).  Each map
 * is written in the oldest version that can hold it (no lost partition: 1;
 * nothing replicated: at most 2; no witness: at most 3), so builds that
 * predate a version still read the maps that do not need it.
 */

#define MAP_MAGIC "SMAP"
#define MAP_VERSION 1u
#define MAP_VERSION_LOST 2u
#define MAP_VERSION_REPL 3u
#define MAP_VERSION_FLAGS 4u
#define MAP_PART_LOST (4u * 8u)
#define MAP_HDR (4u + 2u + 8u + 8u + 4u + 4u)
#define MAP_MEMBER_HDR (8u + 2u)
#define MAP_PART (3u * 8u)
#define MAP_REPL_HDR 4u				/* replicas */
#define MAP_REPL_MEMBER 1u			/* + zone bytes */
#define MAP_FLAGS_MEMBER 4u
#define MAP_REPL_PART (MAP_PART_LOST + 8u + 1u)	/* + 8 per backup */

_Static_assert(MAP_HDR + MAP_REPL_HDR +
	       RPS__SMAP_MAX_MEMBERS * (MAP_MEMBER_HDR + RPS__SMAP_URI_MAX - 1 + MAP_REPL_MEMBER + RPS__SMAP_ZONE_MAX - 1 +
					MAP_FLAGS_MEMBER) +
	       RPS__SMAP_MAX_PART * (MAP_REPL_PART + 8u * (RPS__SMAP_MAX_REPLICAS - 1)) + 4u <= RPS__SMAP_ENC_MAX,
	       "a map fits RPS__SMAP_ENC_MAX");

static bool has_flags(const struct rps__smap *m)
{
	for (uint32_t i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++)
		if (m->members[i].flags)
			return true;
	return false;
}

static unsigned map_version(const struct rps__smap *m)
{
	if (has_flags(m))
		return MAP_VERSION_FLAGS;
	if (rps__smap_replicated(m))
		return MAP_VERSION_REPL;
	return rps__smap_nlost(m) ? MAP_VERSION_LOST : MAP_VERSION;
}

/* 0 if the struct can be encoded at all (its counts stay inside it). */
static int encodable(const struct rps__smap *m)
{
	if (m->npart > RPS__SMAP_MAX_PART || m->nmembers > RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-EINVAL, "shard map: %" PRIu32 " partitions and %" PRIu32
				   " members, beyond the limits of %u and %u", m->npart, m->nmembers,
				   RPS__SMAP_MAX_PART, RPS__SMAP_MAX_MEMBERS);
	for (uint32_t i = 0; i < m->nmembers; i++) {
		if (strnlen(m->members[i].uri, RPS__SMAP_URI_MAX) == RPS__SMAP_URI_MAX)
			return rps__seterr(-EINVAL, "shard map: address of member %llu is not terminated",
					   ull(m->members[i].id));
		if (strnlen(m->members[i].zone, RPS__SMAP_ZONE_MAX) == RPS__SMAP_ZONE_MAX)
			return rps__seterr(-EINVAL, "shard map: zone of member %llu is not terminated",
					   ull(m->members[i].id));
	}
	return 0;
}

size_t rps__smap_encoded_size(const struct rps__smap *m)
{
	unsigned v = map_version(m);
	bool repl = v >= MAP_VERSION_REPL;
	size_t n = MAP_HDR + 4u + (repl ? MAP_REPL_HDR : 0);
	uint32_t nm = RPS__MIN(m->nmembers, RPS__SMAP_MAX_MEMBERS), np = RPS__MIN(m->npart, RPS__SMAP_MAX_PART);

	for (uint32_t i = 0; i < nm; i++) {
		n += MAP_MEMBER_HDR + strnlen(m->members[i].uri, RPS__SMAP_URI_MAX - 1);
		if (repl)
			n += MAP_REPL_MEMBER + strnlen(m->members[i].zone, RPS__SMAP_ZONE_MAX - 1);
		if (v == MAP_VERSION_FLAGS)
			n += MAP_FLAGS_MEMBER;
	}
	if (!repl)
		return n + (size_t)np * (v == MAP_VERSION ? MAP_PART : MAP_PART_LOST);
	for (uint32_t p = 0; p < np; p++)
		n += MAP_REPL_PART + 8u * rps__smap_nbackups(m, p);
	return n;
}

int rps__smap_encode(const struct rps__smap *m, void *buf, size_t cap, size_t *len)
{
	size_t need;
	unsigned v;
	uint8_t *p = buf;
	int err = encodable(m);

	if (err)
		return err;
	need = rps__smap_encoded_size(m);
	if (need > cap)
		return rps__seterr(-ENOSPC, "shard map: needs %zu bytes, buffer has %zu", need, cap);
	v = map_version(m);
	memcpy(p, MAP_MAGIC, 4);
	rps__le_put16(p + 4, (uint16_t)v);
	rps__le_put64(p + 6, m->applied);
	rps__le_put64(p + 14, m->max_id);
	rps__le_put32(p + 22, m->npart);
	rps__le_put32(p + 26, m->nmembers);
	p += MAP_HDR;
	if (v >= MAP_VERSION_REPL) {
		rps__le_put32(p, m->replicas);
		p += MAP_REPL_HDR;
	}
	for (uint32_t i = 0; i < m->nmembers; i++) {
		size_t ulen = strlen(m->members[i].uri);

		rps__le_put64(p, m->members[i].id);
		rps__le_put16(p + 8, (uint16_t)ulen);
		memcpy(p + MAP_MEMBER_HDR, m->members[i].uri, ulen);
		p += MAP_MEMBER_HDR + ulen;
		if (v >= MAP_VERSION_REPL) {
			size_t zlen = strlen(m->members[i].zone);

			*p = (uint8_t)zlen;
			memcpy(p + 1, m->members[i].zone, zlen);
			p += 1 + zlen;
		}
		if (v == MAP_VERSION_FLAGS) {
			rps__le_put32(p, m->members[i].flags);
			p += MAP_FLAGS_MEMBER;
		}
	}
	for (uint32_t i = 0; i < m->npart; i++) {
		const struct rps__smap_part *pp = &m->parts[i];

		rps__le_put64(p, pp->owner);
		rps__le_put64(p + 8, pp->epoch);
		rps__le_put64(p + 16, pp->moving_to);
		p += MAP_PART;
		if (v == MAP_VERSION)
			continue;
		rps__le_put64(p, pp->lost);
		p += 8;
		if (v == MAP_VERSION_LOST)
			continue;
		rps__le_put64(p, pp->joining);
		p[8] = (uint8_t)rps__smap_nbackups(m, i);
		p += 9;
		for (uint32_t k = 0; k < rps__smap_nbackups(m, i); k++, p += 8)
			rps__le_put64(p, pp->backups[k]);
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

		if (!is_member(m, p->owner))
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " is owned by %llu, not a member",
					   i, ull(p->owner));
		if (p->epoch == 0 || p->epoch == RPS__EPOCH_MOVED)
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has invalid epoch %llu",
					   i, ull(p->epoch));
		if (p->moving_to && (p->moving_to == p->owner || !is_member(m, p->moving_to)))
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " of member %llu is moving to %llu,"
					   " not another member", i, ull(p->owner), ull(p->moving_to));
		for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++) {
			uint64_t b = p->backups[k];

			if (!b) {
				if (k + 1 < RPS__SMAP_MAX_REPLICAS - 1 && p->backups[k + 1])
					return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has a gap in its backups", i);
				continue;
			}
			/* (a move's target may be a backup: a planned switch) */
			if (!is_member(m, b) || b == p->owner || b == p->joining)
				return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has backup %llu,"
						   " not another member outside its seeding", i, ull(b));
			for (uint32_t j = 0; j < k; j++)
				if (p->backups[j] == b)
					return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has backup %llu twice",
							   i, ull(b));
		}
		if (p->joining && (p->joining == p->owner || p->joining == p->moving_to ||
				   !is_member(m, p->joining)))
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " seeds %llu,"
					   " not another member outside its move", i, ull(p->joining));
		if (rps__smap_is_witness(m, p->owner) || rps__smap_is_witness(m, p->moving_to) ||
		    rps__smap_is_witness(m, p->joining) || rps__smap_is_witness(m, p->backups[0]) ||
		    rps__smap_is_witness(m, p->backups[1]))
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " is held by a witness", i);
	}
	if (m->replicas == 0 || m->replicas > RPS__SMAP_MAX_REPLICAS)
		return rps__seterr(-EBADMSG, "shard map: replication target %" PRIu32 ", the range is 1 to %u",
				   m->replicas, RPS__SMAP_MAX_REPLICAS);
	return 0;
}

/* The parts of partition i that versions 2 and 3 add. */
static int decode_part_tail(struct rps__reader *rd, unsigned v, struct rps__smap_part *pp, uint32_t i)
{
	const uint8_t *q;

	if (v == MAP_VERSION)
		return 0;
	if (!(q = rps__reader_take(rd, 8)))
		return rps__seterr(-EBADMSG, "shard map: truncated in partition %" PRIu32, i);
	pp->lost = rps__le_get64(q);
	if (v == MAP_VERSION_LOST)
		return 0;
	if (!(q = rps__reader_take(rd, 9)))
		return rps__seterr(-EBADMSG, "shard map: truncated in the replicas of partition %" PRIu32, i);
	pp->joining = rps__le_get64(q);
	if (q[8] > RPS__SMAP_MAX_REPLICAS - 1)
		return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has %u backups, at most %u", i, q[8],
				   RPS__SMAP_MAX_REPLICAS - 1);
	for (uint32_t k = 0, nb = q[8]; k < nb; k++) {
		if (!(q = rps__reader_take(rd, 8)))
			return rps__seterr(-EBADMSG, "shard map: truncated in the backups of partition %" PRIu32, i);
		pp->backups[k] = rps__le_get64(q);
		if (!pp->backups[k])
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has backup 0", i);
	}
	return 0;
}

static int decode_zone(struct rps__reader *rd, struct rps__smap_member *mb)
{
	const uint8_t *q = rps__reader_take(rd, 1), *z;

	if (!q)
		return rps__seterr(-EBADMSG, "shard map: truncated before the zone of member %llu", ull(mb->id));
	if (*q >= RPS__SMAP_ZONE_MAX)
		return rps__seterr(-EBADMSG, "shard map: zone of member %llu has %u bytes, the limit is %u",
				   ull(mb->id), *q, RPS__SMAP_ZONE_MAX - 1);
	if (!(z = rps__reader_take(rd, *q)))
		return rps__seterr(-EBADMSG, "shard map: truncated in the zone of member %llu", ull(mb->id));
	if (memchr(z, 0, *q))
		return rps__seterr(-EBADMSG, "shard map: zone of member %llu contains a NUL byte", ull(mb->id));
	memcpy(mb->zone, z, *q);
	return 0;
}

int rps__smap_decode(const void *buf, size_t len, struct rps__smap *out)
{
	struct rps__smap m;
	struct rps__reader rd = { buf, len };
	const uint8_t *p = rps__reader_take(&rd, MAP_HDR), *q;
	size_t body;
	unsigned v;
	uint32_t crc;
	int err;

	if (!p)
		return rps__seterr(-EBADMSG, "shard map: truncated, %zu bytes is shorter than its header", len);
	if (memcmp(p, MAP_MAGIC, 4) != 0)
		return rps__seterr(-EBADMSG, "shard map: bad magic, not an encoded shard map");
	v = rps__le_get16(p + 4);
	if (v < MAP_VERSION || v > MAP_VERSION_FLAGS)
		return rps__seterr(-EBADMSG, "shard map: version %u, this build reads versions %u to %u",
				   v, MAP_VERSION, MAP_VERSION_FLAGS);
	memset(&m, 0, sizeof(m));
	m.applied = rps__le_get64(p + 6);
	m.max_id = rps__le_get64(p + 14);
	m.npart = rps__le_get32(p + 22);
	m.nmembers = rps__le_get32(p + 26);
	m.replicas = 1;
	if (m.npart == 0 || m.npart > RPS__SMAP_MAX_PART)
		return rps__seterr(-EBADMSG, "shard map: %" PRIu32 " partitions, a map has 1 to %u",
				   m.npart, RPS__SMAP_MAX_PART);
	if (m.nmembers == 0 || m.nmembers > RPS__SMAP_MAX_MEMBERS)
		return rps__seterr(-EBADMSG, "shard map: %" PRIu32 " members, a map has 1 to %u",
				   m.nmembers, RPS__SMAP_MAX_MEMBERS);
	if (v >= MAP_VERSION_REPL) {
		if (!(q = rps__reader_take(&rd, MAP_REPL_HDR)))
			return rps__seterr(-EBADMSG, "shard map: truncated in its replication target");
		m.replicas = rps__le_get32(q);
	}
	for (uint32_t i = 0; i < m.nmembers; i++) {
		uint16_t ulen;

		q = rps__reader_take(&rd, MAP_MEMBER_HDR);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map: truncated in member %" PRIu32 " of %" PRIu32,
					   i + 1, m.nmembers);
		m.members[i].id = rps__le_get64(q);
		ulen = rps__le_get16(q + 8);
		if (ulen >= RPS__SMAP_URI_MAX)
			return rps__seterr(-EBADMSG, "shard map: address of member %llu has %u bytes, the limit is %u",
					   ull(m.members[i].id), ulen, RPS__SMAP_URI_MAX - 1);
		q = rps__reader_take(&rd, ulen);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map: truncated in the address of member %llu",
					   ull(m.members[i].id));
		if (memchr(q, 0, ulen))
			return rps__seterr(-EBADMSG, "shard map: address of member %llu contains a NUL byte",
					   ull(m.members[i].id));
		memcpy(m.members[i].uri, q, ulen);
		if (v >= MAP_VERSION_REPL && (err = decode_zone(&rd, &m.members[i])))
			return err;
		if (v == MAP_VERSION_FLAGS) {
			if (!(q = rps__reader_take(&rd, MAP_FLAGS_MEMBER)))
				return rps__seterr(-EBADMSG, "shard map: truncated in the flags of member %llu",
						   ull(m.members[i].id));
			m.members[i].flags = rps__le_get32(q);
			if (m.members[i].flags & ~(uint32_t)RPS__SMAP_WITNESS)
				return rps__seterr(-EBADMSG, "shard map: member %llu has unknown flags %#" PRIx32,
						   ull(m.members[i].id), m.members[i].flags);
		}
	}
	for (uint32_t i = 0; i < m.npart; i++) {
		q = rps__reader_take(&rd, MAP_PART);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map: truncated in partition %" PRIu32 " of %" PRIu32,
					   i, m.npart);
		m.parts[i].owner = rps__le_get64(q);
		m.parts[i].epoch = rps__le_get64(q + 8);
		m.parts[i].moving_to = rps__le_get64(q + 16);
		if ((err = decode_part_tail(&rd, v, &m.parts[i], i)))
			return err;
	}
	body = len - rd.left;
	q = rps__reader_take(&rd, 4);
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

/* " + backups 2,3" and ", seeding 4" (nothing for a partition without). */
static void print_backups(const struct rps__smap_part *a, FILE *f)
{
	for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1 && a->backups[k]; k++)
		fprintf(f, "%s%llu", k ? "," : (a->backups[1] ? " + backups " : " + backup "), ull(a->backups[k]));
	if (a->joining)
		fprintf(f, ", seeding %llu", ull(a->joining));
}

void rps__smap_print(const struct rps__smap *m, FILE *f)
{
	uint32_t npart = RPS__MIN(m->npart, RPS__SMAP_MAX_PART);
	uint32_t nm = RPS__MIN(m->nmembers, RPS__SMAP_MAX_MEMBERS);
	bool done[RPS__SMAP_MAX_PART] = { false }, sel[RPS__SMAP_MAX_PART];
	bool repl = rps__smap_replicated(m);
	int w = 3;

	for (uint32_t i = 0; i < nm; i++)
		w = RPS__MAX(w, (int)strnlen(m->members[i].uri, RPS__SMAP_URI_MAX - 1));
	fprintf(f, "shard map: %" PRIu32 " member%s, %" PRIu32 " partitions, applied index %llu\n",
		nm, nm == 1 ? "" : "s", npart, ull(m->applied));
	if (repl)
		fprintf(f, "replication: %" PRIu32 " cop%s of each partition, %" PRIu32 " under-replicated%s\n",
			m->replicas, m->replicas == 1 ? "y" : "ies", rps__smap_nunder(m),
			rps__smap_nunder(m) ? " (UNDER-REPLICATED)" : "");
	fprintf(f, "%6s  %-*s  %s%s\n", "id", w, "uri", "partitions", repl ? "  backups  zone" : "");
	for (uint32_t i = 0; i < nm; i++) {
		fprintf(f, "%6llu  %-*.*s  %" PRIu32, ull(m->members[i].id), w, (int)RPS__SMAP_URI_MAX - 1,
			m->members[i].uri, rps__smap_owned(m, m->members[i].id));
		if (repl)
			fprintf(f, "  %" PRIu32 "  %s", rps__smap_backed(m, m->members[i].id),
				m->members[i].zone[0] ? m->members[i].zone : "-");
		if (m->members[i].flags & RPS__SMAP_WITNESS)
			fputs("  witness (votes, holds no partitions)", f);
		fputc('\n', f);
	}
	/* Settled partitions grouped by (owner, epoch) in order of their first
	 * partition; moving ones one per line, they are what an operator watches. */
	for (uint32_t p = 0; p < npart; p++) {
		const struct rps__smap_part *a = &m->parts[p];
		uint32_t count = 0;

		if (done[p])
			continue;
		if (a->moving_to) {
			fprintf(f, "partition %" PRIu32 " -> member %llu", p, ull(a->owner));
			print_backups(a, f);
			fprintf(f, ", moving to %llu (epoch %llu)\n", ull(a->moving_to), ull(a->epoch));
			done[p] = true;
			continue;
		}
		for (uint32_t q = p; q < npart; q++) {
			const struct rps__smap_part *b = &m->parts[q];

			sel[q] = !done[q] && !b->moving_to && b->owner == a->owner && b->epoch == a->epoch &&
				 b->lost == a->lost && b->joining == a->joining &&
				 memcmp(b->backups, a->backups, sizeof(a->backups)) == 0;
			if (sel[q]) {
				done[q] = true;
				count++;
			}
		}
		for (uint32_t q = 0; q < p; q++)
			sel[q] = false;
		fprintf(f, "partition%s ", count == 1 ? "" : "s");
		print_ranges(f, sel, npart);
		fprintf(f, " -> member %llu", ull(a->owner));
		print_backups(a, f);
		fprintf(f, " (epoch %llu)", ull(a->epoch));
		if (a->lost)
			fprintf(f, " LOST with member %llu: psctl restore NAME, or psctl forget-lost", ull(a->lost));
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

	bool repl = rps__smap_replicated(m);

	fprintf(f, "{\"applied\":%llu,", ull(m->applied));
	if (repl)
		fprintf(f, "\"replicas\":%" PRIu32 ",\"under_replicated\":%" PRIu32 ",", m->replicas,
			rps__smap_nunder(m));
	fputs("\"partitions\":[", f);
	for (uint32_t p = 0; p < npart; p++) {
		fprintf(f, "%s{\"partition\":%" PRIu32 ",\"owner\":%llu,\"epoch\":%llu,\"moving_to\":%llu,\"lost\":%llu",
			p ? "," : "", p, ull(m->parts[p].owner), ull(m->parts[p].epoch), ull(m->parts[p].moving_to),
			ull(m->parts[p].lost));
		if (repl) {
			fputs(",\"backups\":[", f);
			for (uint32_t k = 0; k < rps__smap_nbackups(m, p); k++)
				fprintf(f, "%s%llu", k ? "," : "", ull(m->parts[p].backups[k]));
			fprintf(f, "],\"joining\":%llu", ull(m->parts[p].joining));
		}
		fputc('}', f);
	}
	fputs("],\"members\":[", f);
	for (uint32_t i = 0; i < nm; i++) {
		fprintf(f, "%s{\"id\":%llu,\"uri\":", i ? "," : "", ull(m->members[i].id));
		json_string(f, m->members[i].uri, RPS__SMAP_URI_MAX - 1);
		if (repl) {
			fputs(",\"zone\":", f);
			json_string(f, m->members[i].zone, RPS__SMAP_ZONE_MAX - 1);
		}
		if (m->members[i].flags & RPS__SMAP_WITNESS)
			fputs(",\"witness\":true", f);
		fputc('}', f);
	}
	fputs("]}\n", f);
}
