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

_Static_assert(sizeof(struct rps__smap_member) == 8 + RPS__SMAP_URI_MAX + RPS__SMAP_ZONE_MAX,
	       "member layout has no padding");
_Static_assert(sizeof(struct rps__smap_part) == 40 + 8 * (RPS__SMAP_MAX_REPLICAS - 1),
	       "partition layout has no padding");
_Static_assert(sizeof(struct rps__smap_cmd) == 48 + RPS__SMAP_URI_MAX + RPS__SMAP_ZONE_MAX +
	       8 * (RPS__SMAP_MAX_REPLICAS - 1), "command layout has no padding");

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

uint32_t rps__smap_nbackups(const struct rps__smap *m, uint32_t p)
{
	uint32_t n = 0;

	if (p >= RPS__SMAP_MAX_PART)
		return 0;
	while (n < RPS__SMAP_MAX_REPLICAS - 1 && m->parts[p].backups[n])
		n++;
	return n;
}

static int backup_index(const struct rps__smap *m, uint32_t p, uint64_t id)
{
	for (uint32_t k = 0; id && k < rps__smap_nbackups(m, p); k++)
		if (m->parts[p].backups[k] == id)
			return (int)k;
	return -1;
}

enum rps__smap_role rps__smap_role(const struct rps__smap *m, uint32_t p, uint64_t id)
{
	if (p >= m->npart || p >= RPS__SMAP_MAX_PART || id == 0)
		return RPS__SMAP_ROLE_NONE;
	if (m->parts[p].owner == id)
		return RPS__SMAP_ROLE_PRIMARY;
	if (backup_index(m, p, id) >= 0)
		return RPS__SMAP_ROLE_BACKUP;
	if (m->parts[p].joining == id)
		return RPS__SMAP_ROLE_JOINING;
	return RPS__SMAP_ROLE_NONE;
}

uint32_t rps__smap_backed(const struct rps__smap *m, uint64_t id)
{
	uint32_t n = 0;

	for (uint32_t p = 0; p < m->npart && p < RPS__SMAP_MAX_PART; p++)
		n += backup_index(m, p, id) >= 0;
	return n;
}

uint32_t rps__smap_nunder(const struct rps__smap *m)
{
	uint32_t n = 0;

	for (uint32_t p = 0; p < m->npart && p < RPS__SMAP_MAX_PART; p++)
		n += !m->parts[p].lost && 1 + rps__smap_nbackups(m, p) < m->replicas;
	return n;
}

bool rps__smap_replicated(const struct rps__smap *m)
{
	if (m->replicas > 1)
		return true;
	for (uint32_t i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++)
		if (m->members[i].zone[0])
			return true;
	for (uint32_t p = 0; p < m->npart && p < RPS__SMAP_MAX_PART; p++)
		if (m->parts[p].backups[0] || m->parts[p].joining)
			return true;
	return false;
}

/* Is zone already held by a replica of p (or the one being seeded)? */
static bool zone_in_set(const struct rps__smap *m, uint32_t p, const char *zone)
{
	const struct rps__smap_member *o = rps__smap_member(m, m->parts[p].owner);

	if (!zone[0])
		return false;
	if (o && strcmp(o->zone, zone) == 0)
		return true;
	for (uint32_t k = 0; k < rps__smap_nbackups(m, p); k++) {
		const struct rps__smap_member *b = rps__smap_member(m, m->parts[p].backups[k]);

		if (b && strcmp(b->zone, zone) == 0)
			return true;
	}
	o = rps__smap_member(m, m->parts[p].joining);	/* a backup soon */
	return o && strcmp(o->zone, zone) == 0;
}

uint64_t rps__smap_pick_backup(const struct rps__smap *m, uint32_t p, bool (*alive)(void *ctx, uint64_t id),
			       void *ctx)
{
	uint64_t best = 0;
	bool best_new_zone = false;
	uint32_t best_load = 0;

	if (p >= m->npart || p >= RPS__SMAP_MAX_PART)
		return 0;
	for (uint32_t i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++) {
		const struct rps__smap_member *mb = &m->members[i];
		bool new_zone;
		uint32_t load;

		if (rps__smap_role(m, p, mb->id) != RPS__SMAP_ROLE_NONE || m->parts[p].moving_to == mb->id)
			continue;
		if (alive && !alive(ctx, mb->id))
			continue;
		new_zone = mb->zone[0] && !zone_in_set(m, p, mb->zone);
		load = rps__smap_owned(m, mb->id) + rps__smap_backed(m, mb->id);
		/* members are sorted by id: the first of equals wins */
		if (!best || (new_zone && !best_new_zone) || (new_zone == best_new_zone && load < best_load)) {
			best = mb->id;
			best_new_zone = new_zone;
			best_load = load;
		}
	}
	return best;
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
	return rps__smap_init_replicated(m, uris, n, npart, 1);
}

int rps__smap_init_replicated(struct rps__smap *m, const char *const *uris, uint32_t n, uint32_t npart,
			      uint32_t r)
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
	if (r == 0 || r > RPS__SMAP_MAX_REPLICAS || r > n)
		return rps__seterr(-EINVAL, "shard map: %" PRIu32 " replicas, %" PRIu32 " members hold 1 to %u",
				   r, n, RPS__MIN(n, RPS__SMAP_MAX_REPLICAS));
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
	m->replicas = r;
	for (uint32_t p = 0; p < npart; p++) {
		m->parts[p].owner = p % n + 1;
		m->parts[p].epoch = 1;
		for (uint32_t k = 1; k < r; k++)
			m->parts[p].backups[k - 1] = (p + k) % n + 1;
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
	for (uint32_t p = 0; p < m->npart; p++) {
		if (m->parts[p].moving_to == c->id)
			return rps__seterr(-EBUSY, "remove member %llu: partition %" PRIu32
					   " is moving to it, commit or abort that move first", ull(c->id), p);
		if (rps__smap_role(m, p, c->id) == RPS__SMAP_ROLE_BACKUP)
			return rps__seterr(-EBUSY, "remove member %llu: it is a backup of partition %" PRIu32
					   ", drop it from the replica set first", ull(c->id), p);
		if (m->parts[p].joining == c->id)
			return rps__seterr(-EBUSY, "remove member %llu: it is being seeded as a backup of partition %"
					   PRIu32 ", abort that first", ull(c->id), p);
	}
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
	if (p->joining)
		return rps__seterr(-EBUSY, "move partition %" PRIu32 ": member %llu is being seeded as its backup",
				   c->part, ull(p->joining));
	if (p->lost)
		return rps__seterr(-ENODATA, "move partition %" PRIu32 ": its contents were lost with member %llu:"
				   " restore it or forget it first", c->part, ull(p->lost));
	if (member_index(m, c->to) < 0)
		return rps__seterr(-ENOENT, "move partition %" PRIu32 ": destination %llu is not a member",
				   c->part, ull(c->to));
	if (rps__smap_role(m, c->part, c->to) != RPS__SMAP_ROLE_NONE)
		return rps__seterr(-EEXIST, "move partition %" PRIu32 ": member %llu already holds a replica of it"
				   " (a planned hand-over to a backup is a failover)", c->part, ull(c->to));
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
		if ((m->parts[p].owner == c->id || backup_index(m, p, c->id) >= 0) &&
		    m->parts[p].epoch >= RPS__EPOCH_MOVED - 1)
			return rps__seterr(-EOVERFLOW, "force remove member %llu: partition %" PRIu32
					   " is at its last epoch", ull(c->id), p);
	return 0;
}

/* ---- replica sets ---- */

static int check_set_replicas(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	(void)m;
	if (c->id == 0 || c->id > RPS__SMAP_MAX_REPLICAS)
		return rps__seterr(-EINVAL, "set replicas: %llu, a partition has 1 to %u copies",
				   ull(c->id), RPS__SMAP_MAX_REPLICAS);
	return 0;
}

static int check_set_zone(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	size_t len = strnlen(c->zone, RPS__SMAP_ZONE_MAX);

	if (member_index(m, c->id) < 0)
		return rps__seterr(-ENOENT, "set zone of member %llu: not a member", ull(c->id));
	if (len == RPS__SMAP_ZONE_MAX)
		return rps__seterr(-EINVAL, "set zone of member %llu: zone longer than %u bytes",
				   ull(c->id), RPS__SMAP_ZONE_MAX - 1);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)c->zone[i] <= 0x20 || (unsigned char)c->zone[i] >= 0x7f)
			return rps__seterr(-EINVAL, "set zone of member %llu: a zone is printable ASCII without spaces",
					   ull(c->id));
	return 0;
}

/* The partition exists and c names its current epoch. */
static int check_part_epoch(const struct rps__smap *m, const struct rps__smap_cmd *c, const char *what)
{
	int err = check_part(m, c, what);

	if (err)
		return err;
	if (c->epoch != m->parts[c->part].epoch)
		return rps__seterr(-ESTALE, "%s partition %" PRIu32 ": epoch %llu is stale, the partition is at epoch %llu",
				   what, c->part, ull(c->epoch), ull(m->parts[c->part].epoch));
	return 0;
}

static int check_replica_begin(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	const struct rps__smap_part *p;
	int err = check_part_epoch(m, c, "seed a backup of");

	if (err)
		return err;
	p = &m->parts[c->part];
	if (member_index(m, c->to) < 0)
		return rps__seterr(-ENOENT, "seed a backup of partition %" PRIu32 ": %llu is not a member",
				   c->part, ull(c->to));
	if (p->joining)
		return rps__seterr(-EBUSY, "seed a backup of partition %" PRIu32 ": member %llu is being seeded already",
				   c->part, ull(p->joining));
	if (p->moving_to)
		return rps__seterr(-EBUSY, "seed a backup of partition %" PRIu32 ": moving to member %llu",
				   c->part, ull(p->moving_to));
	if (p->lost)
		return rps__seterr(-ENODATA, "seed a backup of partition %" PRIu32 ": its contents were lost with member %llu",
				   c->part, ull(p->lost));
	if (rps__smap_role(m, c->part, c->to) != RPS__SMAP_ROLE_NONE)
		return rps__seterr(-EEXIST, "seed a backup of partition %" PRIu32 ": member %llu holds a replica already",
				   c->part, ull(c->to));
	if (rps__smap_nbackups(m, c->part) == RPS__SMAP_MAX_REPLICAS - 1)
		return rps__seterr(-ENOSPC, "seed a backup of partition %" PRIu32 ": it has the maximum of %u copies",
				   c->part, RPS__SMAP_MAX_REPLICAS);
	return 0;
}

static int check_replica_commit(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	int err = check_part_epoch(m, c, "commit the backup of");

	if (err)
		return err;
	if (!m->parts[c->part].joining || m->parts[c->part].joining != c->to)
		return rps__seterr(-ESTALE, "commit the backup of partition %" PRIu32 ": member %llu is not being seeded",
				   c->part, ull(c->to));
	return 0;
}

static int check_replica_abort(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	int err = check_part_epoch(m, c, "abort the seeding of");

	if (err)
		return err;
	if (!m->parts[c->part].joining)
		return rps__seterr(-ESTALE, "abort the seeding of partition %" PRIu32 ": no backup is being seeded",
				   c->part);
	return 0;
}

static int check_replica_drop(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	int err = check_part_epoch(m, c, "drop a backup of");

	if (err)
		return err;
	if (backup_index(m, c->part, c->id) < 0)
		return rps__seterr(-ESTALE, "drop a backup of partition %" PRIu32 ": member %llu is not one",
				   c->part, ull(c->id));
	if (m->parts[c->part].epoch >= RPS__EPOCH_MOVED - 1)
		return rps__seterr(-EOVERFLOW, "drop a backup of partition %" PRIu32 ": epoch %llu is the last one",
				   c->part, ull(m->parts[c->part].epoch));
	return 0;
}

static int check_failover(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	const struct rps__smap_part *p;
	int err = check_part_epoch(m, c, "fail over");

	if (err)
		return err;
	p = &m->parts[c->part];
	if (c->from != p->owner)
		return rps__seterr(-ESTALE, "fail over partition %" PRIu32 ": member %llu is not its primary, member %llu is",
				   c->part, ull(c->from), ull(p->owner));
	if (backup_index(m, c->part, c->to) < 0)
		return rps__seterr(-ESTALE, "fail over partition %" PRIu32 ": member %llu is not a backup of it",
				   c->part, ull(c->to));
	if (c->nkeep > RPS__SMAP_MAX_REPLICAS - 1)
		return rps__seterr(-EINVAL, "fail over partition %" PRIu32 ": %" PRIu32 " backups to keep",
				   c->part, c->nkeep);
	for (uint32_t i = 0; i < c->nkeep; i++) {
		if (c->keep[i] == c->to || backup_index(m, c->part, c->keep[i]) < 0)
			return rps__seterr(-EINVAL, "fail over partition %" PRIu32 ": member %llu is not a backup it can keep",
					   c->part, ull(c->keep[i]));
		for (uint32_t j = 0; j < i; j++)
			if (c->keep[j] == c->keep[i])
				return rps__seterr(-EINVAL, "fail over partition %" PRIu32 ": backup %llu named twice",
						   c->part, ull(c->keep[i]));
	}
	if (p->epoch >= RPS__EPOCH_MOVED - 1)
		return rps__seterr(-EOVERFLOW, "fail over partition %" PRIu32 ": epoch %llu is the last one",
				   c->part, ull(p->epoch));
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
	case RPS__SMAP_SET_REPLICAS:
		return check_set_replicas(m, c);
	case RPS__SMAP_SET_ZONE:
		return check_set_zone(m, c);
	case RPS__SMAP_REPLICA_BEGIN:
		return check_replica_begin(m, c);
	case RPS__SMAP_REPLICA_COMMIT:
		return check_replica_commit(m, c);
	case RPS__SMAP_REPLICA_ABORT:
		return check_replica_abort(m, c);
	case RPS__SMAP_REPLICA_DROP:
		return check_replica_drop(m, c);
	case RPS__SMAP_FAILOVER:
		return check_failover(m, c);
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

/* Remove backup k of partition p, keeping the order of the others. */
static void backup_remove(struct rps__smap_part *pp, uint32_t k)
{
	for (; k + 1 < RPS__SMAP_MAX_REPLICAS - 1; k++)
		pp->backups[k] = pp->backups[k + 1];
	pp->backups[RPS__SMAP_MAX_REPLICAS - 2] = 0;
}

/* keep[] in the order the map lists them. */
static void do_failover(struct rps__smap *m, const struct rps__smap_cmd *c)
{
	struct rps__smap_part *pp = &m->parts[c->part];
	uint64_t kept[RPS__SMAP_MAX_REPLICAS - 1] = { 0 };
	uint32_t n = 0;

	for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1 && pp->backups[k]; k++)
		for (uint32_t i = 0; i < c->nkeep; i++)
			if (c->keep[i] == pp->backups[k])
				kept[n++] = pp->backups[k];
	memcpy(pp->backups, kept, sizeof(kept));
	pp->owner = c->to;
	pp->moving_to = 0;
	pp->joining = 0;
	pp->epoch++;
}

/* A dead member goes: moves from or to it and seedings of it are off, it
 * leaves every replica set (epoch + 1 where it was a backup); a partition
 * it was primary of fails over to its first backup, or without one passes
 * to the others in turn (by id), one epoch on, marked lost with it. */
static void do_force_remove(struct rps__smap *m, const struct rps__smap_cmd *c)
{
	uint32_t next = 0;

	for (uint32_t p = 0; p < m->npart; p++) {
		struct rps__smap_part *pp = &m->parts[p];
		int k = backup_index(m, p, c->id);

		if (pp->moving_to == c->id)
			pp->moving_to = 0;
		if (pp->joining == c->id)
			pp->joining = 0;
		if (k >= 0) {
			backup_remove(pp, (uint32_t)k);
			pp->epoch++;
			continue;
		}
		if (pp->owner != c->id)
			continue;
		if (pp->backups[0]) {
			pp->owner = pp->backups[0];
			backup_remove(pp, 0);
			pp->moving_to = 0;
			pp->joining = 0;
			pp->epoch++;
			continue;
		}
		pp->moving_to = 0;
		pp->joining = 0;	/* it was seeding from the dead member */
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
	case RPS__SMAP_SET_REPLICAS:
		m->replicas = (uint32_t)c->id;
		break;
	case RPS__SMAP_SET_ZONE:
		memset(m->members[member_index(m, c->id)].zone, 0, RPS__SMAP_ZONE_MAX);
		memcpy(m->members[member_index(m, c->id)].zone, c->zone, strlen(c->zone));
		break;
	case RPS__SMAP_REPLICA_BEGIN:
		m->parts[c->part].joining = c->to;
		break;
	case RPS__SMAP_REPLICA_COMMIT:
		p = &m->parts[c->part];
		p->backups[rps__smap_nbackups(m, c->part)] = p->joining;
		p->joining = 0;
		break;
	case RPS__SMAP_REPLICA_ABORT:
		m->parts[c->part].joining = 0;
		break;
	case RPS__SMAP_REPLICA_DROP:
		p = &m->parts[c->part];
		backup_remove(p, (uint32_t)backup_index(m, c->part, c->id));
		p->epoch++;
		break;
	case RPS__SMAP_FAILOVER:
		do_failover(m, c);
		break;
	}
	return 0;
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
static int cmd_decode_tail(struct reader *rd, struct rps__smap_cmd *c)
{
	const uint8_t *q = take(rd, 1), *z;

	if (!q)
		return rps__seterr(-EBADMSG, "shard map command: truncated before its backups");
	if (*q > RPS__SMAP_MAX_REPLICAS - 1)
		return rps__seterr(-EBADMSG, "shard map command: %u backups to keep, at most %u", *q,
				   RPS__SMAP_MAX_REPLICAS - 1);
	c->nkeep = *q;
	for (uint32_t i = 0; i < c->nkeep; i++) {
		q = take(rd, 8);
		if (!q)
			return rps__seterr(-EBADMSG, "shard map command: truncated in backup %" PRIu32, i + 1);
		c->keep[i] = rps__le_get64(q);
	}
	q = take(rd, 1);
	if (!q)
		return rps__seterr(-EBADMSG, "shard map command: truncated before its zone");
	if (*q >= RPS__SMAP_ZONE_MAX)
		return rps__seterr(-EBADMSG, "shard map command: zone of %u bytes, the limit is %u", *q,
				   RPS__SMAP_ZONE_MAX - 1);
	z = take(rd, *q);
	if (!z)
		return rps__seterr(-EBADMSG, "shard map command: truncated in its zone");
	if (memchr(z, 0, *q))
		return rps__seterr(-EBADMSG, "shard map command: zone contains a NUL byte");
	memcpy(c->zone, z, *q);
	return 0;
}

int rps__smap_cmd_decode(const void *buf, size_t len, struct rps__smap_cmd *c)
{
	struct reader rd = { buf, len };
	const uint8_t *p = take(&rd, CMD_HDR), *u;
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
	u = take(&rd, ulen);
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
 *	nmembers x { u64 id, u16 uri length, uri bytes [, u8 zone length, zone bytes (version 3)] },
 *	npart x { u64 owner, u64 epoch, u64 moving_to [, u64 lost (versions 2, 3)]
 *		  [, u64 joining, u8 nbackups, u64 backups[nbackups] (version 3)] },
 *	u32 crc32c of everything before it
 *
 * Version 2 adds the lost field, version 3 the replica sets, zones and the
 * replication target.  Each map is written in the oldest version that can
 * hold it (no lost partition: 1; nothing replicated: at most 2), so builds
 * that predate a version still read the maps that do not need it.
 */

#define MAP_MAGIC "SMAP"
#define MAP_VERSION 1u
#define MAP_VERSION_LOST 2u
#define MAP_VERSION_REPL 3u
#define MAP_PART_LOST (4u * 8u)
#define MAP_HDR (4u + 2u + 8u + 8u + 4u + 4u)
#define MAP_MEMBER_HDR (8u + 2u)
#define MAP_PART (3u * 8u)
#define MAP_REPL_HDR 4u				/* replicas */
#define MAP_REPL_MEMBER 1u			/* + zone bytes */
#define MAP_REPL_PART (MAP_PART_LOST + 8u + 1u)	/* + 8 per backup */

_Static_assert(MAP_HDR + MAP_REPL_HDR +
	       RPS__SMAP_MAX_MEMBERS * (MAP_MEMBER_HDR + RPS__SMAP_URI_MAX - 1 + MAP_REPL_MEMBER + RPS__SMAP_ZONE_MAX - 1) +
	       RPS__SMAP_MAX_PART * (MAP_REPL_PART + 8u * (RPS__SMAP_MAX_REPLICAS - 1)) + 4u <= RPS__SMAP_ENC_MAX,
	       "a map fits RPS__SMAP_ENC_MAX");

static unsigned map_version(const struct rps__smap *m)
{
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
	size_t n = MAP_HDR + 4u + (v == MAP_VERSION_REPL ? MAP_REPL_HDR : 0);
	uint32_t nm = RPS__MIN(m->nmembers, RPS__SMAP_MAX_MEMBERS), np = RPS__MIN(m->npart, RPS__SMAP_MAX_PART);

	for (uint32_t i = 0; i < nm; i++) {
		n += MAP_MEMBER_HDR + strnlen(m->members[i].uri, RPS__SMAP_URI_MAX - 1);
		if (v == MAP_VERSION_REPL)
			n += MAP_REPL_MEMBER + strnlen(m->members[i].zone, RPS__SMAP_ZONE_MAX - 1);
	}
	if (v != MAP_VERSION_REPL)
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
	if (v == MAP_VERSION_REPL) {
		rps__le_put32(p, m->replicas);
		p += MAP_REPL_HDR;
	}
	for (uint32_t i = 0; i < m->nmembers; i++) {
		size_t ulen = strlen(m->members[i].uri);

		rps__le_put64(p, m->members[i].id);
		rps__le_put16(p + 8, (uint16_t)ulen);
		memcpy(p + MAP_MEMBER_HDR, m->members[i].uri, ulen);
		p += MAP_MEMBER_HDR + ulen;
		if (v == MAP_VERSION_REPL) {
			size_t zlen = strlen(m->members[i].zone);

			*p = (uint8_t)zlen;
			memcpy(p + 1, m->members[i].zone, zlen);
			p += 1 + zlen;
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

		if (member_index(m, p->owner) < 0)
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " is owned by %llu, not a member",
					   i, ull(p->owner));
		if (p->epoch == 0 || p->epoch == RPS__EPOCH_MOVED)
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has invalid epoch %llu",
					   i, ull(p->epoch));
		if (p->moving_to && (p->moving_to == p->owner || member_index(m, p->moving_to) < 0))
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " of member %llu is moving to %llu,"
					   " not another member", i, ull(p->owner), ull(p->moving_to));
		for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++) {
			uint64_t b = p->backups[k];

			if (!b) {
				if (k + 1 < RPS__SMAP_MAX_REPLICAS - 1 && p->backups[k + 1])
					return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has a gap in its backups", i);
				continue;
			}
			if (member_index(m, b) < 0 || b == p->owner || b == p->moving_to || b == p->joining)
				return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has backup %llu,"
						   " not another member outside its move and seeding", i, ull(b));
			for (uint32_t j = 0; j < k; j++)
				if (p->backups[j] == b)
					return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has backup %llu twice",
							   i, ull(b));
		}
		if (p->joining && (p->joining == p->owner || p->joining == p->moving_to ||
				   member_index(m, p->joining) < 0))
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " seeds %llu,"
					   " not another member outside its move", i, ull(p->joining));
	}
	if (m->replicas == 0 || m->replicas > RPS__SMAP_MAX_REPLICAS)
		return rps__seterr(-EBADMSG, "shard map: replication target %" PRIu32 ", the range is 1 to %u",
				   m->replicas, RPS__SMAP_MAX_REPLICAS);
	return 0;
}

/* The parts of partition i that versions 2 and 3 add. */
static int decode_part_tail(struct reader *rd, unsigned v, struct rps__smap_part *pp, uint32_t i)
{
	const uint8_t *q;

	if (v == MAP_VERSION)
		return 0;
	if (!(q = take(rd, 8)))
		return rps__seterr(-EBADMSG, "shard map: truncated in partition %" PRIu32, i);
	pp->lost = rps__le_get64(q);
	if (v == MAP_VERSION_LOST)
		return 0;
	if (!(q = take(rd, 9)))
		return rps__seterr(-EBADMSG, "shard map: truncated in the replicas of partition %" PRIu32, i);
	pp->joining = rps__le_get64(q);
	if (q[8] > RPS__SMAP_MAX_REPLICAS - 1)
		return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has %u backups, at most %u", i, q[8],
				   RPS__SMAP_MAX_REPLICAS - 1);
	for (uint32_t k = 0, nb = q[8]; k < nb; k++) {
		if (!(q = take(rd, 8)))
			return rps__seterr(-EBADMSG, "shard map: truncated in the backups of partition %" PRIu32, i);
		pp->backups[k] = rps__le_get64(q);
		if (!pp->backups[k])
			return rps__seterr(-EBADMSG, "shard map: partition %" PRIu32 " has backup 0", i);
	}
	return 0;
}

static int decode_zone(struct reader *rd, struct rps__smap_member *mb)
{
	const uint8_t *q = take(rd, 1), *z;

	if (!q)
		return rps__seterr(-EBADMSG, "shard map: truncated before the zone of member %llu", ull(mb->id));
	if (*q >= RPS__SMAP_ZONE_MAX)
		return rps__seterr(-EBADMSG, "shard map: zone of member %llu has %u bytes, the limit is %u",
				   ull(mb->id), *q, RPS__SMAP_ZONE_MAX - 1);
	if (!(z = take(rd, *q)))
		return rps__seterr(-EBADMSG, "shard map: truncated in the zone of member %llu", ull(mb->id));
	if (memchr(z, 0, *q))
		return rps__seterr(-EBADMSG, "shard map: zone of member %llu contains a NUL byte", ull(mb->id));
	memcpy(mb->zone, z, *q);
	return 0;
}

int rps__smap_decode(const void *buf, size_t len, struct rps__smap *out)
{
	struct rps__smap m;
	struct reader rd = { buf, len };
	const uint8_t *p = take(&rd, MAP_HDR), *q;
	size_t body;
	unsigned v;
	uint32_t crc;
	int err;

	if (!p)
		return rps__seterr(-EBADMSG, "shard map: truncated, %zu bytes is shorter than its header", len);
	if (memcmp(p, MAP_MAGIC, 4) != 0)
		return rps__seterr(-EBADMSG, "shard map: bad magic, not an encoded shard map");
	v = rps__le_get16(p + 4);
	if (v != MAP_VERSION && v != MAP_VERSION_LOST && v != MAP_VERSION_REPL)
		return rps__seterr(-EBADMSG, "shard map: version %u, this build reads versions %u to %u",
				   v, MAP_VERSION, MAP_VERSION_REPL);
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
	if (v == MAP_VERSION_REPL) {
		if (!(q = take(&rd, MAP_REPL_HDR)))
			return rps__seterr(-EBADMSG, "shard map: truncated in its replication target");
		m.replicas = rps__le_get32(q);
	}
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
		if (v == MAP_VERSION_REPL && (err = decode_zone(&rd, &m.members[i])))
			return err;
	}
	for (uint32_t i = 0; i < m.npart; i++) {
		q = take(&rd, MAP_PART);
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
		fputc('}', f);
	}
	fputs("]}\n", f);
}
