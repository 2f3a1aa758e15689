/*
 * smap.c - the shard map (see smap.h for the contract): which member owns
 * each partition under which epoch, with which backups, and the commands
 * that change that.  Their wire formats and printing are in smap_codec.c.
 *
 * Determinism is the point: every replica applying the same commands must
 * hold byte-identical state, so unused members and partitions stay zeroed,
 * members stay sorted by id and every refusal depends only on the state and
 * the command.  Decoders treat input as hostile and never read past it.
 */
#include "config.h"
#include "proto/smap.h"
#include "common/common.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

_Static_assert(sizeof(struct rps__smap_member) == 16 + RPS__SMAP_URI_MAX + RPS__SMAP_ZONE_MAX,
	       "member layout has no padding");
_Static_assert(sizeof(struct rps__smap_part) == 40 + 8 * (RPS__SMAP_MAX_REPLICAS - 1),
	       "partition layout has no padding");
_Static_assert(sizeof(struct rps__smap_cmd) == 48 + RPS__SMAP_URI_MAX + RPS__SMAP_ZONE_MAX +
	       8 * (RPS__SMAP_MAX_REPLICAS - 1), "command layout has no padding");

static unsigned long long ull(uint64_t v)
{
	return (unsigned long long)v;
}

/* ------------------------------------------------------------------------ */
/* queries */

/* Members are sorted by id (do_add): a binary search, as the map grows. */
static int member_index(const struct rps__smap *m, uint64_t id)
{
	uint32_t lo = 0, hi = RPS__MIN(m->nmembers, RPS__SMAP_MAX_MEMBERS);

	if (id == 0)
		return -1;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (m->members[mid].id == id)
			return (int)mid;
		if (m->members[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
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

bool rps__smap_is_witness(const struct rps__smap *m, uint64_t id)
{
	const struct rps__smap_member *mb = rps__smap_member(m, id);

	return mb && (mb->flags & RPS__SMAP_WITNESS);
}

uint32_t rps__smap_nwitnesses(const struct rps__smap *m)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++)
		n += (m->members[i].flags & RPS__SMAP_WITNESS) != 0;
	return n;
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

void rps__smap_member_loads(const struct rps__smap *m, uint32_t loads[RPS__SMAP_MAX_MEMBERS])
{
	memset(loads, 0, RPS__SMAP_MAX_MEMBERS * sizeof(*loads));
	for (uint32_t p = 0; p < m->npart && p < RPS__SMAP_MAX_PART; p++) {
		int i = member_index(m, m->parts[p].owner);

		if (i >= 0)
			loads[i]++;
		for (uint32_t k = 0; k < rps__smap_nbackups(m, p); k++)
			if ((i = member_index(m, m->parts[p].backups[k])) >= 0)
				loads[i]++;
	}
}

uint64_t rps__smap_pick_backup(const struct rps__smap *m, uint32_t p, bool (*alive)(void *ctx, uint64_t id),
			       void *ctx)
{
	uint32_t loads[RPS__SMAP_MAX_MEMBERS];

	rps__smap_member_loads(m, loads);
	return rps__smap_pick_backup_loaded(m, p, alive, ctx, loads);
}

uint64_t rps__smap_pick_backup_loaded(const struct rps__smap *m, uint32_t p, bool (*alive)(void *ctx, uint64_t id),
				      void *ctx, const uint32_t loads[RPS__SMAP_MAX_MEMBERS])
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

		if (rps__smap_role(m, p, mb->id) != RPS__SMAP_ROLE_NONE || m->parts[p].moving_to == mb->id ||
		    (mb->flags & RPS__SMAP_WITNESS))
			continue;
		if (alive && !alive(ctx, mb->id))
			continue;
		new_zone = mb->zone[0] && !zone_in_set(m, p, mb->zone);
		load = loads[i];
		/* members are sorted by id: the first of equals wins */
		if (!best || (new_zone && !best_new_zone) || (new_zone == best_new_zone && load < best_load)) {
			best = mb->id;
			best_new_zone = new_zone;
			best_load = load;
		}
	}
	return best;
}

static const char *zone_of(const struct rps__smap *m, uint64_t id)
{
	const struct rps__smap_member *mb = rps__smap_member(m, id);

	return mb ? mb->zone : "";
}

/* How well partition p suits a move of its primary to member `to`: 3 to
 * one of its backups, 2 to a member whose zone none of the backups that
 * stay has (or no zones: the old primary leaves the set), 1 any other; 0
 * if it cannot move now. */
static int move_fit(const struct rps__smap *m, uint32_t p, uint64_t to)
{
	const struct rps__smap_part *mp = &m->parts[p];
	const char *zone = zone_of(m, to);

	if (mp->moving_to || mp->joining || mp->lost)
		return 0;
	if (rps__smap_role(m, p, to) == RPS__SMAP_ROLE_BACKUP)
		return 3;
	for (uint32_t k = 0; zone[0] && k < rps__smap_nbackups(m, p); k++)
		if (!strcmp(zone_of(m, mp->backups[k]), zone))
			return 1;
	return 2;
}

int rps__smap_balance_move(const struct rps__smap *m, bool (*alive)(void *ctx, uint64_t id), void *ctx,
			   uint32_t *part, uint64_t *from, uint64_t *to)
{
	uint32_t most_n = 0, least_n = 0, n = 0, p;
	int best = 0;

	*from = *to = 0;
	for (uint32_t i = 0; i < m->nmembers && i < RPS__SMAP_MAX_MEMBERS; i++) {
		const struct rps__smap_member *mb = &m->members[i];
		uint32_t k;

		if ((mb->flags & RPS__SMAP_WITNESS) || (alive && !alive(ctx, mb->id)))
			continue;
		k = rps__smap_owned(m, mb->id);
		n++;
		/* members are sorted by id: the first of equals wins */
		if (!*from || k > most_n) {
			*from = mb->id;
			most_n = k;
		}
		if (!*to || k < least_n) {
			*to = mb->id;
			least_n = k;
		}
	}
	if (n < 2 || most_n < least_n + 2)
		return 0;
	for (p = RPS__MIN(m->npart, RPS__SMAP_MAX_PART); p-- > 0;) {
		int fit = m->parts[p].owner == *from ? move_fit(m, p, *to) : 0;
		if (fit > best) {
			best = fit;
			*part = p;
		}
	}
	return best ? 1 : -EBUSY;
}

uint32_t rps__smap_in_zone(const struct rps__smap *m, uint32_t p, const char *zone)
{
	uint32_t n;

	if (p >= m->npart || p >= RPS__SMAP_MAX_PART || !zone[0])
		return 0;
	n = strcmp(zone_of(m, m->parts[p].owner), zone) == 0;
	for (uint32_t k = 0; k < rps__smap_nbackups(m, p); k++)
		n += strcmp(zone_of(m, m->parts[p].backups[k]), zone) == 0;
	return n;
}

uint64_t rps__smap_zone_duplicate(const struct rps__smap *m, uint32_t p)
{
	if (p >= m->npart || p >= RPS__SMAP_MAX_PART)
		return 0;
	for (uint32_t k = rps__smap_nbackups(m, p); k-- > 0;) {
		uint64_t id = m->parts[p].backups[k];

		if (rps__smap_in_zone(m, p, zone_of(m, id)) > 1)
			return id;
	}
	return 0;
}

bool rps__smap_uri_ok(const char *uri)
{
	const char *h, *end, *port;
	size_t n = strnlen(uri, RPS__SMAP_URI_MAX), i;
	unsigned long v = 0;

	if (n == 0 || n == RPS__SMAP_URI_MAX)
		return false;
	for (i = 0; i < n; i++)
		if ((unsigned char)uri[i] < 0x21 || (unsigned char)uri[i] > 0x7e)
			return false;
	if (!strncmp(uri, "tcp://", 6))
		h = uri + 6;
	else if (!strncmp(uri, "verbs://", 8))
		h = uri + 8;
	else
		return false;
	if (*h == '[') {		/* [IPv6]:PORT */
		end = strchr(h, ']');
		if (!end || end == h + 1 || end[1] != ':' || memchr(h + 1, '[', (size_t)(end - h - 1)))
			return false;
		port = end + 2;
	} else {			/* HOST:PORT, HOST without ':' '[' ']' '/' */
		end = strchr(h, ':');
		if (!end || end == h || strcspn(h, "[]/") < (size_t)(end - h))
			return false;
		port = end + 1;
	}
	if (!*port || strlen(port) > 5)
		return false;
	for (i = 0; port[i]; i++) {
		if (port[i] < '0' || port[i] > '9')
			return false;
		v = v * 10 + (unsigned long)(port[i] - '0');
	}
	return v >= 1 && v <= 65535;
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

uint32_t rps__smap_default_partitions(uint32_t n)
{
	uint32_t p = RPS__SMAP_DEFAULT_PART;

	while (p < 4u * n && p < RPS__SMAP_MAX_PART)
		p *= 2;
	return p;
}

int rps__smap_init_replicated(struct rps__smap *m, const char *const *uris, uint32_t n, uint32_t npart,
			      uint32_t r)
{
	if (npart == 0)
		npart = rps__smap_default_partitions(n);
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
	if (!rps__smap_uri_ok(c->uri)) {	/* (whoever proposed it: a member must be dialable) */
		char esc[4 * RPS__SMAP_URI_MAX];

		return rps__seterr(-EINVAL, "add member %llu: bad address '%s': give tcp://HOST:PORT or "
				   "verbs://ADDR:PORT (port 1 to 65535)", ull(c->id), rps__escape(c->uri, esc, sizeof(esc)));
	}
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
	if (rps__smap_is_witness(m, c->to))
		return rps__seterr(-EINVAL, "move partition %" PRIu32 ": member %llu is a witness, it holds no partitions",
				   c->part, ull(c->to));
	/* (to a backup: a planned switch, no image; a joiner is refused above) */
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
	if (!rps__smap_is_witness(m, c->id) && m->nmembers - rps__smap_nwitnesses(m) < 2)
		return rps__seterr(-EBUSY, "force remove member %llu: it is the last member that is not a witness",
				   ull(c->id));
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
	if (rps__smap_is_witness(m, c->to))
		return rps__seterr(-EINVAL, "seed a backup of partition %" PRIu32 ": member %llu is a witness,"
				   " it holds no partitions", c->part, ull(c->to));
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

static int check_set_witness(const struct rps__smap *m, const struct rps__smap_cmd *c)
{
	if (member_index(m, c->id) < 0)
		return rps__seterr(-ENOENT, "make member %llu a witness: not a member", ull(c->id));
	if (rps__smap_is_witness(m, c->id))
		return rps__seterr(-EALREADY, "make member %llu a witness: it is one already", ull(c->id));
	if (m->nmembers - rps__smap_nwitnesses(m) < 2)
		return rps__seterr(-EBUSY, "make member %llu a witness: no other member would hold the partitions",
				   ull(c->id));
	for (uint32_t p = 0; p < m->npart; p++) {
		const struct rps__smap_part *pp = &m->parts[p];

		if (pp->owner == c->id && (!pp->backups[0] || pp->lost))
			return rps__seterr(-EBUSY, "make member %llu a witness: it owns partition %" PRIu32
					   " %s: move its partitions to the other members first", ull(c->id), p,
					   pp->lost ? "(lost)" : "without a backup");
		if (rps__smap_role(m, p, c->id) != RPS__SMAP_ROLE_NONE && pp->epoch >= RPS__EPOCH_MOVED - 1)
			return rps__seterr(-EOVERFLOW, "make member %llu a witness: partition %" PRIu32
					   " is at its last epoch", ull(c->id), p);
	}
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
	case RPS__SMAP_SET_WITNESS:
		return check_set_witness(m, c);
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
		/* the next member in turn that is neither the dead one nor a
		 * witness (the check left one) */
		while (m->members[next % m->nmembers].id == c->id ||
		       (m->members[next % m->nmembers].flags & RPS__SMAP_WITNESS))
			next++;
		pp->owner = m->members[next % m->nmembers].id;
		next++;
		pp->epoch++;
		if (!pp->lost)
			pp->lost = c->id;
	}
	do_remove(m, c);
}

/* A member becomes a witness: it leaves every replica set, its partitions
 * pass to their first backup (which holds everything it acknowledged, as
 * in a FAILOVER), a move to it or a seeding of it is off; epoch + 1 where
 * anything changed, so what it served is fenced. */
static void do_set_witness(struct rps__smap *m, const struct rps__smap_cmd *c)
{
	for (uint32_t p = 0; p < m->npart; p++) {
		struct rps__smap_part *pp = &m->parts[p];
		int k = backup_index(m, p, c->id);
		bool changed = false;

		if (pp->moving_to == c->id) {
			pp->moving_to = 0;
			changed = true;
		}
		if (pp->joining == c->id) {
			pp->joining = 0;
			changed = true;
		}
		if (k >= 0) {
			backup_remove(pp, (uint32_t)k);
			changed = true;
		} else if (pp->owner == c->id) {
			pp->owner = pp->backups[0];
			backup_remove(pp, 0);
			pp->moving_to = 0;
			pp->joining = 0;
			changed = true;
		}
		if (changed)
			pp->epoch++;
	}
	m->members[member_index(m, c->id)].flags |= RPS__SMAP_WITNESS;
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
		if (backup_index(m, c->part, c->to) >= 0)	/* a planned switch: the backup leads */
			backup_remove(p, (uint32_t)backup_index(m, c->part, c->to));
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
		if (p->moving_to == c->id)
			p->moving_to = 0;	/* the switch to it is off */
		p->epoch++;
		break;
	case RPS__SMAP_FAILOVER:
		do_failover(m, c);
		break;
	case RPS__SMAP_SET_WITNESS:
		do_set_witness(m, c);
		break;
	}
	return 0;
}
