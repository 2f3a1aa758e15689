/*
 * repl_place.c - replica sets in a running cluster (doc/design.md
 * "Replication"): the leader places backups (REPLICA_BEGIN where a partition
 * has fewer copies than the target R, REPLICA_DROP where it has more), the
 * primary and the joiner seed a new backup, and --replicas / --zone reach
 * the map.
 *
 * Seeding reuses a move's machinery (cp_moves.c):
 *   primary  on applying REPLICA_BEGIN(p, to, e): stops serving p, fences it
 *            as a move's source does, serialises it (the move's image; the
 *            parked pushes stay here), notes its replication seq of p at the
 *            cut and offers it to `to` (SEED: the MIGRATE body + that seq)
 *   joiner   READs it, checks the crc, installs it as a backup (regions kept,
 *            announced to nobody, the stream goes on after the seq), answers
 *            MIGRATE_REP and proposes REPLICA_COMMIT(p, to, e)
 *   everyone on applying COMMIT: `to` is a backup (epoch unchanged); the
 *            primary unfences p and streams its next update to `to` too.
 * Nothing is applied to p between the fence and the commit, so the image
 * plus the stream after the seq is exactly the primary's state.  The pause
 * is a move's: workers get RPS_ESTALE_EPOCH meanwhile and retry.  If the
 * joiner has not installed it by --move-timeout-ms, the primary proposes
 * REPLICA_ABORT (so does a joiner that got no image by then: a primary
 * that cannot fence or is gone; the time of one queued behind another
 * image to the same joiner starts when that one is in); on ABORT (or a
 * FAILOVER, which clears the joiner) the primary unfences and the joiner
 * drops what it installed: nothing is lost.
 *
 * Pacing (the leader): seedings are limited by what is in flight, not by
 * time.  A primary seeds at most SEED_MAX_PER_SRC partitions at once (a
 * BEGIN proposed and not applied yet counts); when one commits or aborts,
 * the apply kicks the duties, so the next BEGIN goes out in the same loop
 * turn.  Only a failure waits: after an ABORT the partition and its primary
 * back off for REPLICA_RETRY_NS.  A not-yet-applied proposal is repeated
 * for its partition at most every REPLICA_RETRY_NS (no proposal storm).
 *
 * remove-server (cp_admin.c) of a member that still backs partitions: the
 * leader seeds a replacement on another member first where the set has
 * room for one (no moment with fewer copies than before), else drops it
 * first; it never places a backup on the member it removes, and proposes
 * REMOVE_MEMBER once the member holds nothing.
 *
 * --replicas R: the leader proposes SET_REPLICAS(R) once after this process
 * started, when the map's target differs (the leader's flag wins, logged);
 * psctl set-replicas changes it afterwards.  Without --replicas the map's
 * target stands.  A new cluster starts at 2 from 2 servers on, its backups
 * placed in the bootstrap map (cp_map.c); a --replicas 1 or 3 then comes
 * through here: drops (epoch + 1 each) or seedings.  --zone Z: each member proposes
 * SET_ZONE for itself while the map says otherwise.
 *
 * --witness: the member proposes SET_WITNESS for itself until the map says
 * it is one (a new cluster's map, built from --cluster alone, places
 * partitions on it at first: its first backup takes each over, as in a
 * failover, and it leaves every replica set; it takes no worker
 * connection meanwhile, so nothing was ever served from it).  A witness is
 * never a backup, a joiner or a move target (smap.c): it only votes, so
 * two data servers and a witness keep a Raft majority when one dies.
 * Two voters cannot (either's death leaves no majority): every member
 * warns of it at start.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

#define REPLICA_RETRY_NS (PEER_RETRY_NS / 2)
/* Seedings in flight per primary.  Each one pauses only its own partition
 * (as a move does), so more at once do not lengthen any pause; what they
 * cost is the primary's memory (one serialised image each, held until the
 * commit) and the joiners' (one READ buffer each): 4 bounds that to 4
 * images, and already keeps the wire busy while the others wait for their
 * two log entries (BEGIN, COMMIT) and the fence. */
#define SEED_MAX_PER_SRC 4u

/* ---- what this server does with a partition it is a replica of ----------- */

static bool is_backup(const struct rps__smap_part *mp, uint64_t id)
{
	for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++)
		if (mp->backups[k] == id)
			return true;
	return false;
}

/* Primary: the seeding is over (committed, aborted): serve p again. */
static void seed_source_end(struct rps__cplane *cp, uint32_t p)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];
	struct part_local *pl = &cp->parts[p];

	rps__log(RPS__LOG_INFO, "partition %u: %s member %llu, serving it again (epoch %llu)", p,
		 is_backup(mp, pl->to) ? "backed up by" : "seeding aborted for", (unsigned long long)pl->to,
		 (unsigned long long)mp->epoch);
	rps__cp_blob_free(cp, pl);
	cp->dp->part_unfence(cp->srv, p, mp->epoch);
	pl->st = PART_ACTIVE;
	pl->epoch = mp->epoch;
}

/* Called first by reconcile_part (cp_map.c): true if the partition was
 * dealt with here (seeding on either side, backups). */
bool rps__cp_replica_reconcile(struct rps__cplane *cp, uint32_t p, uint64_t now)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];
	struct part_local *pl = &cp->parts[p];
	bool seeding_on = mp->joining && !mp->moving_to;

	if (mp->owner == cp->my_id) {
		if (pl->st == PART_SEED_FENCING || pl->st == PART_SEED_SHIPPED) {
			if (seeding_on && mp->joining == pl->to && mp->epoch == pl->epoch)
				return true;
			/* over; or the epoch moved on (a backup dropped
			 * meanwhile): then it starts again below */
			seed_source_end(cp, p);
		}
		if (pl->st == PART_ACTIVE && seeding_on && !mp->lost) {
			pl->st = PART_SEED_FENCING;
			pl->epoch = mp->epoch;
			pl->to = mp->joining;
			pl->give_up = now + ms_ns(cp->cfg.move_timeout_ms);
			rps__log(RPS__LOG_INFO, "partition %u: seeding member %llu as a backup (epoch %llu): fencing",
				 p, (unsigned long long)pl->to, (unsigned long long)pl->epoch);
			rps__cp_part_sync(cp, p);
			cp->dp->part_refuse(cp->srv, p);
			return true;
		}
		return false;	/* (a backup promoted, a move: cp_map.c) */
	}
	if (pl->st == PART_SEED_FENCING || pl->st == PART_SEED_SHIPPED) {
		/* not ours any more (a FAILOVER took it): as after a move */
		rps__log(RPS__LOG_INFO, "partition %u now belongs to member %llu (epoch %llu)", p,
			 (unsigned long long)mp->owner, (unsigned long long)mp->epoch);
		rps__cp_blob_free(cp, pl);
		pl->st = PART_DRAINING;
		pl->free_at = now + ms_ns(cp->cfg.drain_ms);
		pl->epoch = mp->epoch;
		return true;
	}
	if (mp->joining == cp->my_id) {
		if (pl->st != PART_SEEDING || pl->epoch != mp->epoch) {
			pl->st = PART_SEEDING;
			pl->epoch = mp->epoch;
			pl->installed = false;
			pl->next_try = 0;
			pl->give_up = now + ms_ns(cp->cfg.move_timeout_ms);
			pl->gone = false;
			pl->cleared = false;
		}
		return true;
	}
	if (is_backup(mp, cp->my_id)) {
		if (pl->st == PART_SEEDING && !pl->installed) {
			/* a commit of an image we never installed: the log
			 * replayed after a restart (the image went with the
			 * memory).  Not a backup: we leave the set (cp_moves.c)
			 * rather than be promoted empty. */
			pl->st = PART_NONE;
			pl->epoch = mp->epoch;
			return false;
		}
		if (pl->st == PART_SEEDING) {
			rps__log(RPS__LOG_INFO, "partition %u: a backup of member %llu's now (epoch %llu)", p,
				 (unsigned long long)mp->owner, (unsigned long long)mp->epoch);
			pl->st = PART_BACKUP;
		}
		if (pl->st != PART_BACKUP)
			return false;	/* (a backup since the bootstrap: cp_map.c) */
		pl->epoch = mp->epoch;
		return true;
	}
	if (pl->st == PART_SEEDING) {
		rps__log(RPS__LOG_INFO, "partition %u: seeding ended without us, dropping what was installed", p);
		cp->dp->part_drop(cp->srv, p);
		pl->st = PART_NONE;
		pl->epoch = mp->epoch;
		return true;
	}
	if (pl->st == PART_BACKUP) {
		/* dropped from the set (REPLICA_DROP, a FAILOVER that did not
		 * keep us): the regions go like a drained partition's */
		rps__log(RPS__LOG_INFO, "partition %u: no longer a backup of it (epoch %llu)", p,
			 (unsigned long long)mp->epoch);
		pl->st = PART_DRAINING;
		pl->free_at = now + ms_ns(cp->cfg.drain_ms);
		pl->epoch = mp->epoch;
		return true;
	}
	return false;
}

/* ---- seeding: the primary's and the joiner's duties ------------------------ */

static void propose_abort(struct rps__cplane *cp, uint32_t p)
{
	struct rps__smap_cmd cmd;

	memset(&cmd, 0, sizeof(cmd));
	cmd.type = RPS__SMAP_REPLICA_ABORT;
	cmd.part = p;
	cmd.epoch = cp->parts[p].epoch;
	rps__cp_propose_cmd(cp, &cmd);
}

static void seed_offer(struct rps__cplane *cp, uint32_t p, uint64_t now)
{
	struct part_local *pl = &cp->parts[p];
	struct peer *peer = rps__cp_peer_get(cp, pl->to, false);
	struct rps__seed s = { .seq = pl->seq };

	if (!peer || !peer->c || cp->dp->conn_dead(peer->c) || now < pl->next_try)
		return;
	pl->next_try = now + PEER_RETRY_NS;
	if (rps__cp_blob_offer(cp, p, peer->c, &s.mig))
		return;		/* (no window now: offered again at next_try) */
	pl->offered = true;
	cp->dp->conn_reply(peer->c, RPS__MSG_SEED, p, 0, &s, sizeof(s));
}

/* Is another image of ours being READ by pl->to?  A joiner READs one image
 * per connection at a time and refuses a second offer (-EBUSY), which would
 * then wait PEER_RETRY_NS: offer the next one when that READ is done. */
static bool offer_busy(const struct rps__cplane *cp, uint32_t p)
{
	uint64_t to = cp->parts[p].to;

	for (uint32_t q = 0; q < cp->map.npart; q++) {
		const struct part_local *ql = &cp->parts[q];

		if (q != p && ql->st == PART_SEED_SHIPPED && ql->to == to && ql->offered && !ql->installed)
			return true;
	}
	return false;
}

static void seed_source_duty(struct rps__cplane *cp, uint32_t p, uint64_t now)
{
	struct part_local *pl = &cp->parts[p];

	if (pl->st == PART_SEED_FENCING) {
		if (!cp->dp->part_fence(cp->srv, p))
			return;
		if (rps__cp_blob_make(cp, p)) {
			rps__log(RPS__LOG_ERROR, "%s", rps__errbuf());
			return;
		}
		pl->seq = cp->dp->repl_seq(cp->srv, p);
		pl->st = PART_SEED_SHIPPED;
		rps__log(RPS__LOG_INFO, "partition %u fenced (epoch %llu, stream seq %llu): %zu bytes for backup %llu",
			 p, (unsigned long long)pl->epoch, (unsigned long long)pl->seq, pl->blob_len,
			 (unsigned long long)pl->to);
	}
	if (!pl->installed && !pl->offered && offer_busy(cp, p))
		/* queued behind another image to the same joiner: its time
		 * starts when it is offered (that one has a timeout of its own) */
		pl->give_up = now + ms_ns(cp->cfg.move_timeout_ms);
	else if (!pl->installed && (!pl->offered || now >= pl->next_try))
		seed_offer(cp, p, now);
	if (!pl->installed && now >= pl->give_up && now + PEER_RETRY_NS / 2 >= pl->next_try) {
		rps__log(RPS__LOG_WARN, "partition %u: member %llu did not take its image in time: aborting the seeding",
			 p, (unsigned long long)pl->to);
		propose_abort(cp, p);
		pl->next_try = now + PEER_RETRY_NS;
	}
}

/* Joiner: are we READing another image from p's primary?  We READ one at a
 * time per connection, so p's offer waits for it. */
static bool reading_other(const struct rps__cplane *cp, uint32_t p)
{
	for (uint32_t i = 0; i < cp->nreads; i++)
		if (cp->reads[i].seed && cp->reads[i].mig.part != p &&
		    cp->dp->conn_peer_id(cp->reads[i].c) == cp->map.parts[p].owner)
			return true;
	return false;
}

/* Primary: a replica whose stream broke before it confirmed an update
 * (src/server/repl_stream.c) leaves the set: the waits for it end once the map
 * drops it, and the leader seeds a backup again. */
static void diverged_duty(struct rps__cplane *cp, uint32_t p, uint64_t now)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];
	struct rps__smap_cmd cmd;
	uint64_t id;

	if (mp->owner != cp->my_id || !cp->dp->part_diverged || now < cp->diverged_next[p] ||
	    !(id = cp->dp->part_diverged(cp->srv, p)))
		return;
	cp->diverged_next[p] = now + REPLICA_RETRY_NS;
	memset(&cmd, 0, sizeof(cmd));
	cmd.part = p;
	cmd.epoch = mp->epoch;
	if (mp->joining == id) {
		cmd.type = RPS__SMAP_REPLICA_ABORT;
	} else if (is_backup(mp, id)) {
		cmd.type = RPS__SMAP_REPLICA_DROP;
		cmd.id = id;
	} else {
		return;
	}
	rps__cp_propose_cmd(cp, &cmd);
}

void rps__cp_seed_duties(struct rps__cplane *cp, uint64_t now)
{
	struct rps__smap_cmd cmd;
	uint32_t p;

	for (p = 0; p < cp->map.npart; p++) {
		struct part_local *pl = &cp->parts[p];

		diverged_duty(cp, p, now);

		if (pl->st == PART_SEED_FENCING || pl->st == PART_SEED_SHIPPED) {
			seed_source_duty(cp, p, now);
		} else if (pl->st == PART_SEEDING && !pl->installed && reading_other(cp, p)) {
			/* queued behind another image from its primary: the
			 * wait for ours starts when that one is in */
			pl->give_up = now + ms_ns(cp->cfg.move_timeout_ms);
		} else if (pl->st == PART_SEEDING && !pl->installed && now >= pl->give_up &&
			   now >= pl->next_try) {
			/* no image in time (a primary that cannot fence or offer
			 * it, or is gone): our side ends it too */
			pl->next_try = now + PEER_RETRY_NS;
			rps__log(RPS__LOG_WARN, "partition %u: no image from member %llu in time: aborting the seeding",
				 p, (unsigned long long)cp->map.parts[p].owner);
			propose_abort(cp, p);
		} else if (pl->st == PART_SEEDING && pl->installed && now >= pl->next_try &&
			   cp->map.parts[p].joining == cp->my_id) {
			pl->next_try = now + REPLICA_RETRY_NS;
			memset(&cmd, 0, sizeof(cmd));
			cmd.type = RPS__SMAP_REPLICA_COMMIT;
			cmd.part = p;
			cmd.to = cp->my_id;
			cmd.epoch = pl->epoch;
			rps__cp_propose_cmd(cp, &cmd);
		}
	}
}

/* Joiner: the primary offers the image. */
void rps__cp_on_seed(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__seed *s)
{
	const struct rps__migrate *m = &s->mig;

	if (m->part >= cp->map.npart || cp->map.parts[m->part].joining != cp->my_id ||
	    cp->map.parts[m->part].epoch != m->epoch || cp->parts[m->part].st != PART_SEEDING) {
		/* our log may lag: the offer comes again */
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -EAGAIN, NULL, 0);
		return;
	}
	if (cp->parts[m->part].installed) {
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, 0, NULL, 0);
		return;
	}
	rps__cp_read_start(cp, c, req_id, m, true, s->seq);
}

/* Joiner: the image arrived whole (crc checked). */
void rps__cp_seed_read_done(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__migrate *m,
			    uint64_t seq, const void *buf)
{
	struct part_local *pl = &cp->parts[m->part];
	int ret;

	if (cp->map.parts[m->part].joining != cp->my_id || cp->map.parts[m->part].epoch != m->epoch ||
	    pl->st != PART_SEEDING) {
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, RPS_ESTALE_EPOCH, NULL, 0);
		return;
	}
	if (!pl->installed) {
		ret = cp->dp->part_install_backup(cp->srv, m->part, m->epoch, buf, m->len, seq);
		if (ret) {
			rps__log(RPS__LOG_ERROR, "%s", rps__errbuf());
			cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, ret, NULL, 0);
			return;
		}
		pl->installed = true;
		pl->next_try = 0;
		cp->replica_kick = true;	/* propose the COMMIT this turn */
		rps__log(RPS__LOG_INFO, "partition %u installed as a backup of member %llu (%llu bytes, crc ok, stream after %llu)",
			 m->part, (unsigned long long)m->from, (unsigned long long)m->len, (unsigned long long)seq);
	}
	cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, 0, NULL, 0);
}

/* ---- the leader: placement -------------------------------------------------- */

static bool live(void *ctx, uint64_t id)
{
	const struct rps__cplane *cp = ctx;

	return id != cp->removing && rps__cp_member_live(cp, id);
}

/* What balancing moves between: members that renewed their lease lately
 * (a member that just stopped is not declared failed for failover_ms,
 * and a switch to it would leave the partition with that one copy). */
static bool fresh(void *ctx, uint64_t id)
{
	const struct rps__cplane *cp = ctx;

	return id != cp->removing && rps__cp_member_fresh(cp, id);
}

static int member_slot(const struct rps__smap *m, uint64_t id)
{
	for (uint32_t i = 0; i < m->nmembers; i++)
		if (m->members[i].id == id)
			return (int)i;
	return -1;
}

/* Would a copy of p on member `to` spread it over one more zone, while two
 * of its copies share one?  (A seeding beyond the target for that is a
 * zone move, not one to abort.) */
static bool zone_move(const struct rps__smap *m, uint32_t p, uint64_t to)
{
	const struct rps__smap_member *mb = to ? rps__smap_member(m, to) : NULL;

	return mb && mb->zone[0] && !rps__smap_in_zone(m, p, mb->zone) && rps__smap_zone_duplicate(m, p);
}

/* One pass of the placement duty over every partition: what it counts
 * once, not once per partition (at 64 members and 256 partitions, counting
 * each candidate's replicas for every partition, every tick, was the
 * leader's whole CPU). */
struct placement_pass {
	uint32_t inflight[RPS__SMAP_MAX_MEMBERS];	/* seedings from member slot i, in the map or proposed */
	uint32_t loads[RPS__SMAP_MAX_MEMBERS];		/* replicas member slot i holds (rps__smap_member_loads) */
	bool zones;					/* a member declared a zone */
};

/* What partition p calls for, if anything: false if nothing. */
static bool placement_cmd(struct rps__cplane *cp, uint32_t p, uint64_t now, struct placement_pass *pp,
			  struct rps__smap_cmd *cmd)
{
	uint32_t *inflight = pp->inflight;
	const struct rps__smap *m = &cp->map;
	const struct rps__smap_part *mp = &m->parts[p];
	uint32_t nb = rps__smap_nbackups(m, p);
	int src;

	memset(cmd, 0, sizeof(*cmd));
	cmd->part = p;
	cmd->epoch = mp->epoch;
	if (mp->lost || mp->moving_to)
		return false;
	if (cp->removing && mp->joining == cp->removing) {
		cmd->type = RPS__SMAP_REPLICA_ABORT;
		return true;
	}
	if (cp->removing && rps__smap_role(m, p, cp->removing) == RPS__SMAP_ROLE_BACKUP) {
		/* the copies without it: 1 + nb - 1 */
		if (mp->joining)
			return false;	/* its replacement is being seeded */
		cmd->type = RPS__SMAP_REPLICA_DROP;
		cmd->id = cp->removing;
		if (nb >= m->replicas || nb == RPS__SMAP_MAX_REPLICAS - 1 || !rps__cp_member_live(cp, mp->owner))
			return true;
		src = member_slot(m, mp->owner);
		if (src < 0 || now < cp->seed_src_next[src] || inflight[src] >= SEED_MAX_PER_SRC)
			return false;
		cmd->type = RPS__SMAP_REPLICA_BEGIN;
		cmd->to = rps__smap_pick_backup_loaded(m, p, live, cp, pp->loads);
		if (!cmd->to) {
			/* nowhere to put another copy: it just goes */
			cmd->type = RPS__SMAP_REPLICA_DROP;
			return true;
		}
		inflight[src]++;
		cp->seed_pending[p] = now + REPLICA_RETRY_NS;
		return true;
	}
	if (mp->joining) {
		/* the target was lowered meanwhile (not a copy on its way to
		 * another zone: below) */
		cmd->type = RPS__SMAP_REPLICA_ABORT;
		return 1 + nb > m->replicas || (1 + nb == m->replicas && !zone_move(m, p, mp->joining));
	}
	if (1 + nb > m->replicas) {
		/* a copy that shares its zone goes first (a zone move ends so) */
		cmd->type = RPS__SMAP_REPLICA_DROP;
		cmd->id = rps__smap_zone_duplicate(m, p);
		if (!cmd->id)
			cmd->id = mp->backups[nb - 1];
		return true;
	}
	if (!rps__cp_member_live(cp, mp->owner))
		return false;
	/* Full, but two copies in one zone while a live member of a zone the
	 * set lacks holds none (zones declared after the backups were placed,
	 * as in a cluster bootstrapped before its members' SET_ZONE): seed a
	 * copy there first, then drop the duplicate (above), so the set never
	 * has fewer than R copies.  Not with R = 3: no room for the extra one. */
	if (1 + nb == m->replicas &&
	    (nb == RPS__SMAP_MAX_REPLICAS - 1 || !pp->zones ||
	     !zone_move(m, p, rps__smap_pick_backup_loaded(m, p, live, cp, pp->loads))))
		return false;
	/* up to SEED_MAX_PER_SRC per primary; none while it backs off */
	src = member_slot(m, mp->owner);
	if (src < 0 || now < cp->seed_src_next[src] || inflight[src] >= SEED_MAX_PER_SRC)
		return false;
	cmd->type = RPS__SMAP_REPLICA_BEGIN;
	cmd->to = rps__smap_pick_backup_loaded(m, p, live, cp, pp->loads);
	if (!cmd->to)
		return false;
	inflight[src]++;
	cp->seed_pending[p] = now + REPLICA_RETRY_NS;
	return true;
}

/* Every member, on applying a seeding's command (ret: 0 or why it was
 * refused).  The leader's pacing follows the log, not a clock. */
void rps__cp_replica_applied(struct rps__cplane *cp, const struct rps__smap_cmd *cmd, int ret, uint64_t now)
{
	int src;

	/* --replicas has had its way once a target equal to it is in the log:
	 * a psctl set-replicas applied after that stands, even when it comes
	 * before the config duty next compares the map with the flag (the
	 * flag used to be re-proposed over it, undoing the operator's change) */
	if (cmd->type == RPS__SMAP_SET_REPLICAS && !ret && cp->cfg.replicas && cmd->id == cp->cfg.replicas)
		cp->replicas_settled = true;
	switch (cmd->type) {
	case RPS__SMAP_REPLICA_BEGIN:
		cp->seed_pending[cmd->part] = 0;	/* in the map now, or refused */
		break;
	case RPS__SMAP_REPLICA_ABORT:
		if (ret)
			return;
		/* a failure: back off before seeding it, or from its primary, again */
		cp->replica_next[cmd->part] = now + REPLICA_RETRY_NS;
		src = member_slot(&cp->map, cp->map.parts[cmd->part].owner);
		if (src >= 0)
			cp->seed_src_next[src] = now + REPLICA_RETRY_NS;
		break;
	case RPS__SMAP_REPLICA_COMMIT:
		if (ret)
			return;
		/* (the committed partition needs nothing more: no spacing) */
		break;
	case RPS__SMAP_MOVE_COMMIT:
		/* a move done: balancing's next one need not wait (a
		 * refused or aborted one waits REPLICA_RETRY_NS) */
		if (!ret)
			cp->balance_next = 0;
		return;
	default:
		return;
	}
	cp->replica_kick = true;
}

/* remove-server: once the member holds nothing, it goes. */
static void removing_duty(struct rps__cplane *cp, uint64_t now)
{
	const struct rps__smap *m = &cp->map;
	struct rps__smap_cmd cmd;
	uint32_t p;

	if (!cp->removing)
		return;
	if (!rps__smap_member(m, cp->removing)) {
		cp->removing = 0;
		return;
	}
	if (now < cp->removing_next || rps__smap_owned(m, cp->removing) || rps__smap_backed(m, cp->removing))
		return;
	for (p = 0; p < m->npart; p++)
		if (m->parts[p].joining == cp->removing || m->parts[p].moving_to == cp->removing)
			return;
	cp->removing_next = now + REPLICA_RETRY_NS;
	memset(&cmd, 0, sizeof(cmd));
	cmd.type = RPS__SMAP_REMOVE_MEMBER;
	cmd.id = cp->removing;
	rps__log(RPS__LOG_INFO, "member %llu holds no replica any more: removing it", (unsigned long long)cmd.id);
	rps__cp_propose_cmd(cp, &cmd);
}

void rps__cp_replica_duties(struct rps__cplane *cp, uint64_t now)
{
	struct placement_pass pass;
	struct rps__smap_cmd cmd;
	char what[256];
	uint32_t p;
	int src;

	if (!cp->rnode || !rps__rnode_is_leader(cp->rnode) || !cp->fo.leading)
		return;
	/* Test hook: maps built by hand (test_cplane, the bootstrap-replicas
	 * maps of the failover tests) stay as they are */
	if (RPS__UNLIKELY(rps__fault("no-replica-duty")))
		return;
	memset(&pass, 0, sizeof(pass));
	for (p = 0; p < cp->map.npart; p++)
		if ((cp->map.parts[p].joining || now < cp->seed_pending[p]) &&
		    (src = member_slot(&cp->map, cp->map.parts[p].owner)) >= 0)
			pass.inflight[src]++;
	rps__smap_member_loads(&cp->map, pass.loads);
	for (uint32_t i = 0; i < cp->map.nmembers; i++)
		pass.zones |= cp->map.members[i].zone[0] != '\0';
	for (p = 0; p < cp->map.npart; p++) {
		if (now < cp->replica_next[p] || !placement_cmd(cp, p, now, &pass, &cmd))
			continue;
		cp->replica_next[p] = now + REPLICA_RETRY_NS;
		rps__smap_cmd_str(&cmd, what, sizeof(what));
		rps__log(RPS__LOG_DEBUG, "replicas (target %u): proposing %s", cp->map.replicas, what);
		rps__cp_propose_cmd(cp, &cmd);
	}
	removing_duty(cp, now);
}

/*
 * Balancing (--rebalance auto, the default).  A failover leaves the
 * primaries of the dead member on its backups' members, a member that
 * comes back (restarted: it failed its partitions over itself) owns
 * nothing, a member made a witness or removed by force handed its
 * partitions to others (psctl add-server moves a new member's share
 * itself): once everything else is done (no partition moving, seeding
 * or short of copies, nothing being removed), the leader moves primaries
 * one at a time as psctl rebalance would (rps__smap_balance_move: among the
 * living members that hold data, from the one that owns most to the one
 * that owns fewest, while they differ by two; a partition it backs
 * first, a planned switch that ships nothing).  A move refused or aborted
 * is tried again REPLICA_RETRY_NS later; even, it stops until the next
 * such event.  Moves an operator makes by hand stay where they are put
 * until such an event evens them out (--rebalance off keeps them).
 */
static bool map_quiet(const struct rps__cplane *cp, uint64_t now)
{
	const struct rps__smap *m = &cp->map;

	if (cp->removing || rps__smap_nunder(m))
		return false;
	for (uint32_t p = 0; p < m->npart; p++)
		if (m->parts[p].moving_to || m->parts[p].joining || now < cp->seed_pending[p])
			return false;
	return true;
}

/* Balancing is on, due, and ours (the leader's) to do.  (Maps built by
 * hand stay as they are: rps__cp_replica_duties.) */
static bool balance_ours(const struct rps__cplane *cp)
{
	return !cp->cfg.rebalance_off && cp->balance_due && cp->rnode && rps__rnode_is_leader(cp->rnode) &&
	       !RPS__UNLIKELY(rps__fault("no-replica-duty"));
}

void rps__cp_balance_duty(struct rps__cplane *cp, uint64_t now)
{
	struct rps__smap_cmd cmd;
	uint64_t from, to;
	uint32_t p;
	int ret;

	if (!balance_ours(cp) || now < cp->balance_next || !cp->fo.leading || !map_quiet(cp, now))
		return;
	ret = rps__smap_balance_move(&cp->map, fresh, cp, &p, &from, &to);
	if (ret <= 0) {
		cp->balance_due = ret != 0;	/* (busy: its moves end first) */
		return;
	}
	memset(&cmd, 0, sizeof(cmd));
	cmd.type = RPS__SMAP_MOVE_BEGIN;
	cmd.part = p;
	cmd.from = from;
	cmd.to = to;
	cmd.epoch = cp->map.parts[p].epoch;
	cp->balance_next = now + REPLICA_RETRY_NS;
	rps__log(RPS__LOG_INFO, "rebalancing: partition %u from member %llu (owns %u) to member %llu (owns %u)%s", p,
		 (unsigned long long)from, rps__smap_owned(&cp->map, from), (unsigned long long)to,
		 rps__smap_owned(&cp->map, to),
		 rps__smap_role(&cp->map, p, to) == RPS__SMAP_ROLE_BACKUP ? ", its backup" : "");
	rps__cp_propose_cmd(cp, &cmd);
}

/* Will this leader's balancing move a primary yet: it is due, and the
 * primaries are uneven among the fresh members or a move of it is under
 * way?  STATUS says so (psctl status "rebalancing"): a map that settled
 * between two of its moves is not the map that stays. */
bool rps__cp_balance_pending(const struct rps__cplane *cp)
{
	uint64_t from, to;
	uint32_t p;

	return balance_ours(cp) && rps__smap_balance_move(&cp->map, fresh, (void *)cp, &p, &from, &to) != 0;
}

/* ---- --replicas, --zone and --witness ------------------------------------------ */

/* Two Raft voters: either's death leaves the other without a majority, so
 * nothing fails over (and no lease holds): said once, at start and when
 * the voters become two. */
static void voters_warn(struct rps__cplane *cp)
{
	struct rps__raft_status st;

	if (!cp->rnode)
		return;
	rps__rnode_status(cp->rnode, &st);
	if (st.conf.n_voters == cp->voters_warned)
		return;
	cp->voters_warned = st.conf.n_voters;
	if (st.conf.n_voters == 2)
		rps__log(RPS__LOG_WARN, "this cluster has 2 Raft voters (members %llu and %llu): if one dies the other has"
			 " no majority, so nothing fails over and workers wait; add a witness (a third server started"
			 " with rdmapsd --witness, which holds no data) or a third server",
			 (unsigned long long)st.conf.voters[0], (unsigned long long)st.conf.voters[1]);
}

void rps__cp_config_duties(struct rps__cplane *cp, uint64_t now)
{
	const struct rps__smap_member *me;
	struct rps__smap_cmd cmd;

	if (now < cp->config_next || !cp->map.npart)
		return;
	cp->config_next = now + REPLICA_RETRY_NS;
	if (cp->cfg.replicas && !cp->replicas_settled && cp->rnode && rps__rnode_is_leader(cp->rnode)) {
		if (cp->map.replicas == cp->cfg.replicas) {
			cp->replicas_settled = true;
		} else {
			rps__log(RPS__LOG_INFO, "the map's replication target is %u, --replicas says %u: this leader's flag wins",
				 cp->map.replicas, cp->cfg.replicas);
			memset(&cmd, 0, sizeof(cmd));
			cmd.type = RPS__SMAP_SET_REPLICAS;
			cmd.id = cp->cfg.replicas;
			rps__cp_propose_cmd(cp, &cmd);
		}
	}
	if (cp->cfg.witness && (me = rps__smap_member(&cp->map, cp->my_id)) && !(me->flags & RPS__SMAP_WITNESS)) {
		memset(&cmd, 0, sizeof(cmd));
		cmd.type = RPS__SMAP_SET_WITNESS;
		cmd.id = cp->my_id;
		if (!rps__smap_check(&cp->map, &cmd))
			rps__cp_propose_cmd(cp, &cmd);
		else if (!cp->witness_said) {
			rps__log(RPS__LOG_ERROR, "--witness: %s", rps__errbuf());
			cp->witness_said = true;
		}
	}
	voters_warn(cp);
	if (cp->cfg.zone && !cp->zone_settled && (me = rps__smap_member(&cp->map, cp->my_id))) {
		if (!strcmp(me->zone, cp->cfg.zone)) {
			cp->zone_settled = true;
		} else {
			memset(&cmd, 0, sizeof(cmd));
			cmd.type = RPS__SMAP_SET_ZONE;
			cmd.id = cp->my_id;
			snprintf(cmd.zone, sizeof(cmd.zone), "%s", cp->cfg.zone);
			rps__cp_propose_cmd(cp, &cmd);
		}
	}
}
