/*
 * cp_moves.c - moves of partitions, the control plane's side: the old owner
 * fences, ships and offers the partition, the new owner READs and installs
 * it (through the data plane's partition API), and the duties that push a
 * move on (offers, commits, aborts, lost partitions, draining copies).
 * Seeding a backup (repl_place.c) uses the same image and READ.
 */
#include "config.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/fault.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

void rps__cp_blob_free(struct rps__cplane *cp, struct part_local *pl)
{
	cp->dp->mem_deregister(pl->blob_mr);
	free(pl->blob);
	pl->blob = NULL;
	pl->blob_mr = NULL;
	pl->blob_len = 0;
}

/* Serialise the fenced partition into pl->blob, registered for the
 * other end's READ, with its crc (a move's and a seeding's image). */
int rps__cp_blob_make(struct rps__cplane *cp, uint32_t part)
{
	struct part_local *pl = &cp->parts[part];
	void *img = NULL;
	size_t len = 0;
	int ret;

	ret = cp->dp->part_serialize(cp->srv, part, pl->epoch, &img, &len);
	if (ret)
		return ret;
	pl->blob = img;
	pl->blob_len = len;
	pl->blob_crc = rps__crc32c_noinv(img, len);
	/* Test hook: a bit flipped after the crc, as a bad link or DIMM would */
	if (RPS__UNLIKELY(rps__fault("corrupt-migration")))
		((unsigned char *)pl->blob)[pl->blob_len / 2] ^= 0x04;
	ret = cp->dp->mem_register(cp->srv, pl->blob, pl->blob_len, &pl->blob_mr);
	if (ret) {
		free(pl->blob);
		pl->blob = NULL;
		return ret;
	}
	pl->offered = false;
	pl->installed = false;
	pl->next_try = 0;
	return 0;
}

static int ship_partition(struct rps__cplane *cp, uint32_t part)
{
	struct part_local *pl = &cp->parts[part];
	int ret;

	/* readers of our copy now learn it moved */
	cp->dp->part_publish(cp->srv, part, RPS__EPOCH_MOVED);
	ret = rps__cp_blob_make(cp, part);
	if (ret)
		return ret;
	cp->dp->part_forget_parked(cp->srv, part);
	pl->seq = cp->dp->repl_seq(cp->srv, part);	/* (fenced: every backup holds it) */
	pl->st = PART_SHIPPED;
	rps__cp_part_sync(cp, part);
	rps__log(RPS__LOG_INFO, "partition %u fenced (epoch %llu): %zu bytes for member %llu", part,
		 (unsigned long long)pl->epoch, pl->blob_len, (unsigned long long)pl->to);
	return 0;
}

/* Where the other end of c READs pl->blob: through a window of c alone. */
int rps__cp_blob_offer(const struct rps__cplane *cp, uint32_t part, struct srv_conn *c, struct rps__migrate *m)
{
	const struct part_local *pl = &cp->parts[part];
	uint32_t rkey;
	int ret = cp->dp->mem_window(c, pl->blob_mr, &rkey);

	if (ret)
		return ret;
	*m = (struct rps__migrate){
		.part = part, .epoch = pl->epoch, .from = cp->my_id,
		.addr = (uint64_t)(uintptr_t)pl->blob, .rkey = rkey,
		.crc = pl->blob_crc, .len = pl->blob_len,
	};
	return 0;
}

static void offer_partition(struct rps__cplane *cp, uint32_t part, uint64_t now)
{
	struct part_local *pl = &cp->parts[part];
	struct peer *p = rps__cp_peer_get(cp, pl->to, false);
	struct rps__seed m = { .seq = pl->seq };

	if (!p || !p->c || cp->dp->conn_dead(p->c) || now < pl->next_try)
		return;
	pl->next_try = now + PEER_RETRY_NS;
	if (rps__cp_blob_offer(cp, part, p->c, &m.mig))
		return;		/* (no window now: offered again at next_try) */
	pl->offered = true;
	cp->dp->conn_reply(p->c, RPS__MSG_MIGRATE, part, 0, &m, sizeof(m));
}

/* The READ in flight over c, if any (one at a time per connection). */
static struct cp_read *read_of(struct rps__cplane *cp, const struct srv_conn *c)
{
	uint32_t i;

	for (i = 0; i < cp->nreads; i++)
		if (cp->reads[i].c == c)
			return &cp->reads[i];
	return NULL;
}

void rps__cp_reads_gone(struct rps__cplane *cp, struct srv_conn *c)
{
	struct cp_read *r = read_of(cp, c);

	if (r)
		*r = cp->reads[--cp->nreads];
}

void rps__cp_on_read_done(void *ctx, struct srv_conn *c, bool ok, const void *buf)
{
	struct rps__cplane *cp = ctx;
	struct cp_read *r = read_of(cp, c);
	struct rps__migrate m;
	uint64_t req_id, seq;
	uint32_t crc;
	bool seed;
	int ret;

	if (!r)
		return;
	m = r->mig;
	req_id = r->req_id;
	seed = r->seed;
	seq = r->seq;
	rps__cp_reads_gone(cp, c);
	if (!ok) {
		rps__log(RPS__LOG_WARN, "partition %u: reading it from member %llu failed", m.part,
			 (unsigned long long)m.from);
		return;
	}
	crc = rps__crc32c_noinv(buf, m.len);
	if (crc != m.crc) {
		rps__log(RPS__LOG_ERROR, "partition %u from member %llu: crc32c %08x, expected %08x: corrupted in flight, refused",
			 m.part, (unsigned long long)m.from, crc, m.crc);
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -EILSEQ, NULL, 0);
		return;
	}
	if (seed) {
		rps__cp_seed_read_done(cp, c, req_id, &m, seq, buf);
		return;
	}
	if (cp->map.parts[m.part].moving_to != cp->my_id || cp->map.parts[m.part].epoch != m.epoch) {
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, RPS_ESTALE_EPOCH, NULL, 0);
		return;
	}
	ret = cp->dp->part_install(cp->srv, m.part, m.epoch, buf, m.len);
	if (!ret && cp->dp->part_repl_seq_set)
		/* the partition's backups hold the stream up to the fence: we
		 * number our first entry after it (0 from a sender without it,
		 * which never moves a partition with backups mid-stream) */
		cp->dp->part_repl_seq_set(cp->srv, m.part, seq);
	if (ret) {
		rps__log(RPS__LOG_ERROR, "%s", rps__errbuf());
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, ret, NULL, 0);
		return;
	}
	cp->parts[m.part].st = PART_INCOMING;
	cp->parts[m.part].epoch = m.epoch;
	cp->parts[m.part].next_try = 0;
	rps__cp_part_sync(cp, m.part);
	rps__log(RPS__LOG_INFO, "partition %u installed from member %llu (%llu bytes, crc ok)", m.part,
		 (unsigned long long)m.from, (unsigned long long)m.len);
	cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, 0, NULL, 0);
}

void rps__cp_on_migrate(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__migrate *m,
			uint64_t seq)
{
	if (m->part >= cp->map.npart || cp->map.parts[m->part].moving_to != cp->my_id ||
	    cp->map.parts[m->part].epoch != m->epoch) {
		/* our log may lag: the offer comes again */
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -EAGAIN, NULL, 0);
		return;
	}
	if (cp->parts[m->part].st == PART_INCOMING) {
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, 0, NULL, 0);
		return;
	}
	rps__cp_read_start(cp, c, req_id, m, false, seq);
}

/* READ the image m offers over c (one at a time per connection); the
 * answer goes back as MIGRATE_REP, at once if refused. */
void rps__cp_read_start(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__migrate *m,
			bool seed, uint64_t seq)
{
	int ret;

	if (read_of(cp, c) || m->len > ((uint64_t)1 << 40)) {
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -EBUSY, NULL, 0);
		return;
	}
	if (rps__grow(&cp->reads, &cp->reads_cap, cp->nreads + 1, sizeof(*cp->reads), 4)) {
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, -ENOMEM, NULL, 0);
		return;
	}
	ret = cp->dp->conn_read(c, m->addr, m->rkey, m->len);
	if (ret) {
		cp->dp->conn_reply(c, RPS__MSG_MIGRATE_REP, req_id, ret, NULL, 0);
		return;
	}
	cp->reads[cp->nreads++] = (struct cp_read){ .c = c, .mig = *m, .req_id = req_id, .seed = seed, .seq = seq };
}

void rps__cp_on_migrate_rep(struct rps__cplane *cp, struct srv_conn *c, uint32_t part, int32_t status)
{
	struct part_local *pl;

	if (part >= cp->map.npart)
		return;
	pl = &cp->parts[part];
	if ((pl->st != PART_SHIPPED && pl->st != PART_SEED_SHIPPED) || pl->to != cp->dp->conn_peer_id(c))
		return;
	if (status == 0) {
		pl->installed = true;
		if (pl->st == PART_SEED_SHIPPED)
			cp->replica_kick = true;	/* offer the next image to it now */
		return;
	}
	rps__log(status == -EAGAIN ? RPS__LOG_DEBUG : RPS__LOG_WARN, "partition %u: member %llu did not install it: %s",
		 part, (unsigned long long)pl->to, rps_strerror(status));
	pl->offered = false;
	/* a seeding's joiner that lags the log or reads another image of ours
	 * is ready in a moment: offer it again next turn, not a second later */
	if (pl->st == PART_SEED_SHIPPED && (status == -EAGAIN || status == -EBUSY))
		pl->next_try = 0;
}

/*
 * Restarted without what partition p held here (memory is gone, the map
 * was replayed): as its primary, fail over to its first backup (the leader's
 * failure duty may get there first: the loser is refused as stale), or,
 * without one, tell the cluster it is lost; as its backup, leave the set
 * (REPLICA_DROP), so nobody promotes an empty copy, and the leader seeds us
 * again from the primary.
 */
static void restarted_without(struct rps__cplane *cp, uint32_t p, uint64_t now)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];
	struct part_local *pl = &cp->parts[p];
	struct rps__smap_cmd cmd;
	uint32_t k;

	memset(&cmd, 0, sizeof(cmd));
	cmd.part = p;
	cmd.epoch = mp->epoch;
	if (pl->gone && !mp->lost && mp->owner == cp->my_id && !mp->moving_to) {
		if (mp->backups[0]) {
			cmd.type = RPS__SMAP_FAILOVER;
			cmd.from = cp->my_id;
			cmd.to = mp->backups[0];
			for (k = 1; k < RPS__SMAP_MAX_REPLICAS - 1; k++)
				if (mp->backups[k])
					cmd.keep[cmd.nkeep++] = mp->backups[k];
		} else {
			cmd.type = RPS__SMAP_MARK_LOST;
			cmd.from = cp->my_id;
		}
	} else if (cp->restarted && rps__smap_role(&cp->map, p, cp->my_id) == RPS__SMAP_ROLE_BACKUP) {
		cmd.type = RPS__SMAP_REPLICA_DROP;
		cmd.id = cp->my_id;
	} else {
		return;
	}
	pl->next_try = now + PEER_RETRY_NS / 2;
	rps__cp_propose_cmd(cp, &cmd);
}

/*
 * A planned switch (psctl move of a partition to one of its backups): the
 * fence holds until every update applied here is confirmed by every backup
 * (part_fence), so the destination, which applies the stream in order,
 * holds exactly our state and the stream position: nothing is shipped, we
 * propose the COMMIT.  It promotes the backup under epoch + 1 as a
 * FAILOVER does, but with nothing in flight; we leave the set and drain.
 * Workers meanwhile get RPS_ESTALE_EPOCH and retry, as during a move.
 */
static void switch_fenced(struct rps__cplane *cp, uint32_t p)
{
	struct part_local *pl = &cp->parts[p];

	/* readers of our copy now learn it moved */
	cp->dp->part_publish(cp->srv, p, RPS__EPOCH_MOVED);
	/* never replicated (a future step, out of turn): their workers resend
	 * them to the new primary, as after a failover (those acknowledged
	 * before the partition had backups, which nobody resends, the backup
	 * holds from its seeding image: partition.c, promote_shard) */
	cp->dp->part_forget_parked(cp->srv, p);
	pl->st = PART_SHIPPED;
	pl->installed = true;
	pl->next_try = 0;
	rps__cp_part_sync(cp, p);
	rps__log(RPS__LOG_INFO, "partition %u fenced (epoch %llu, stream seq %llu): its backup %llu takes over",
		 p, (unsigned long long)pl->epoch, (unsigned long long)cp->dp->repl_seq(cp->srv, p),
		 (unsigned long long)pl->to);
}

static void switch_commit(struct rps__cplane *cp, uint32_t p, uint64_t now)
{
	struct part_local *pl = &cp->parts[p];
	struct rps__smap_cmd cmd;

	memset(&cmd, 0, sizeof(cmd));
	pl->next_try = now + PEER_RETRY_NS / 2;
	cmd.type = RPS__SMAP_MOVE_COMMIT;
	cmd.part = p;
	cmd.to = pl->to;
	cmd.epoch = pl->epoch;
	rps__cp_propose_cmd(cp, &cmd);
}

void rps__cp_move_duties(struct rps__cplane *cp, uint64_t now)
{
	uint32_t p;

	for (p = 0; p < cp->map.npart; p++) {
		struct part_local *pl = &cp->parts[p];
		struct rps__smap_cmd cmd;

		memset(&cmd, 0, sizeof(cmd));
		/* Its contents are here again (restored, or accepted empty, since
		 * the restart) yet the map says lost: a MARK_LOST proposed before
		 * that (or a CLEAR_LOST dropped with a leader) was ordered after
		 * it.  Clear it again: the restore wins, whatever the order. */
		if (pl->cleared && !pl->gone && cp->map.parts[p].lost && cp->map.parts[p].owner == cp->my_id &&
		    !cp->map.parts[p].moving_to && now >= pl->next_try) {
			pl->next_try = now + PEER_RETRY_NS / 2;
			cmd.type = RPS__SMAP_CLEAR_LOST;
			cmd.part = p;
			cmd.id = cp->incarnation;
			cmd.epoch = cp->map.parts[p].epoch;
			rps__cp_propose_cmd(cp, &cmd);
			continue;
		}
		switch (pl->st) {
		case PART_LEAVING:
			if (pl->switching) {
				/* the backup takes over only while its stream is up:
				 * one that stopped meanwhile would be made the only
				 * copy (we leave the set), and lose it */
				if (cp->dp->part_fence(cp->srv, p) && cp->dp->part_stream_up(cp->srv, p, pl->to))
					switch_fenced(cp, p);
				else if (now >= pl->give_up && now >= pl->next_try) {
					/* a backup that confirms nothing (its stream
					 * broke, it is dying): we serve on */
					rps__log(RPS__LOG_WARN, "partition %u: backup %llu did not confirm what we applied in time"
						 " (or its stream is down): aborting the switch", p,
						 (unsigned long long)pl->to);
					pl->next_try = now + PEER_RETRY_NS / 2;
					cmd.type = RPS__SMAP_MOVE_ABORT;
					cmd.part = p;
					cmd.epoch = pl->epoch;
					rps__cp_propose_cmd(cp, &cmd);
				}
				break;
			}
			if (cp->dp->part_fence(cp->srv, p) && ship_partition(cp, p))
				rps__log(RPS__LOG_ERROR, "%s", rps__errbuf());
			if (pl->st == PART_SHIPPED)
				offer_partition(cp, p, now);
			break;
		case PART_SHIPPED:
			if (pl->switching) {
				if (now >= pl->next_try)
					switch_commit(cp, p, now);
				break;
			}
			if (!pl->installed && (!pl->offered || now >= pl->next_try))
				offer_partition(cp, p, now);
			if (!pl->installed && now >= pl->give_up && now + PEER_RETRY_NS / 2 >= pl->next_try) {
				cmd.type = RPS__SMAP_MOVE_ABORT;
				cmd.part = p;
				cmd.epoch = pl->epoch;
				rps__log(RPS__LOG_WARN, "partition %u: member %llu did not take it in time: aborting the move",
					 p, (unsigned long long)pl->to);
				rps__cp_propose_cmd(cp, &cmd);
				/* again in 0.5 s if it does not commit (no leader, no
				 * quorum), not every turn of the loop */
				pl->next_try = now + PEER_RETRY_NS;
			}
			break;
		case PART_INCOMING:
			if (cp->map.parts[p].moving_to == cp->my_id && now >= pl->next_try) {
				pl->next_try = now + PEER_RETRY_NS / 2;
				cmd.type = RPS__SMAP_MOVE_COMMIT;
				cmd.part = p;
				cmd.to = cp->my_id;
				cmd.epoch = pl->epoch;
				rps__cp_propose_cmd(cp, &cmd);
			}
			break;
		case PART_NONE:
			if (now >= pl->next_try)
				restarted_without(cp, p, now);
			break;
		case PART_DRAINING:
			if (now >= pl->free_at) {
				cp->dp->part_drop(cp->srv, p);
				pl->st = PART_NONE;
			}
			break;
		default:
			break;
		}
	}
}
