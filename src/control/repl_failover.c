/*
 * repl_failover.c - failure detection, primary leases and FAILOVER proposals
 * (doc/design.md "Failover and leases").
 *
 * Every member sends LEASE {seq, t_send} to the Raft leader every
 * failover_ms / 10, t_send read on its own CLOCK_BOOTTIME (a suspended or
 * frozen machine does not come back believing its lease still holds).  The
 * leader notes the contact, then answers LEASE_REP {seq, granted} only once
 * a ReadIndex round started after the request arrived confirms that it
 * still leads: a deposed leader grants nothing.  The member then holds its
 * lease until t_send + lease_ms (lease_ms = failover_ms / 2) and tells the
 * data plane (dp->set_lease), once it applied the log up to the ReadIndex
 * round's index (the leader's commit index then): a primary of a partition
 * with backups acknowledges no push once its lease has run out, and its
 * shard headers show RPS__EPOCH_MOVED meanwhile, so that workers' READs
 * of its copy fail too (the read fence, src/server/partition.c).  The
 * leader grants itself through the same path.
 *
 * The leader declares a member failed after failover_ms without a LEASE,
 * and proposes, in one batch and again until the map shows them applied:
 * FAILOVER for each partition the member was primary of that has a live
 * backup, REPLICA_DROP where it was a backup, REPLICA_ABORT where it was
 * being seeded.  A partition without backups (R = 1: a single server, or
 * --replicas 1) gets nothing: as before, the operator removes
 * the dead server (psctl remove-server --force).
 *
 * The timing argument.  Clocks drift at most rho (assumed 1e-3; quartz is
 * 1e-4).  Member P sends LEASE at real time t_s (its clock reads s); the
 * leader L receives it at t_r >= t_s and grants only after a ReadIndex
 * round started after t_r, i.e. after a quorum acknowledged L's term after
 * t_r.  P acknowledges nothing after its clock reads s + lease_ms, i.e.
 * after real time t_s + lease_ms / (1 - rho).
 *
 * (a) L itself declares P failed no earlier than its clock reading
 *     last_contact + failover_ms, real time >= t_r + failover_ms / (1 + rho).
 *     Safe if lease_ms / (1 - rho) < failover_ms / (1 + rho), i.e.
 *     lease_ms < failover_ms (1 - rho) / (1 + rho).  With lease_ms =
 *     failover_ms / 2 this holds for rho < 1/3.
 * (b) A later leader L' was elected at t_e by a quorum that intersects the
 *     quorum that confirmed the grant; the node in both acknowledged L's
 *     round (sent after t_r) before voting for L', so t_e > t_r >= t_s.  L'
 *     declares nothing before t_e + 1.1 lease_ms / (1 + rho), which is
 *     > t_s + lease_ms / (1 - rho) for rho < 0.047.  So a leader's death
 *     costs election + 1.1 x lease_ms, not election + failover_ms.  (The
 *     others, which renewed with the old leader until it went, get
 *     failover_ms from the election, as from their last renewal: on a
 *     starved machine a member learns of a new leader and renews with it
 *     seconds late, and 1.1 x lease_ms failed live members over.)
 * (c) The FAILOVER entry is proposed after the declaration, committed, then
 *     applied by the new primary B; B serves only after applying it.  So B's
 *     first acknowledgement comes after P's last.  Independently of clocks:
 *     P acknowledges a push only after every backup of epoch e confirmed it;
 *     B applies stream entries and the FAILOVER in one thread in order and
 *     refuses epoch-e entries after it, so every push P acknowledged is in
 *     B's state before B serves, and P cannot complete an acknowledgement
 *     that needs B after B moved on.  Hence no push is acknowledged by two
 *     primaries, and none that was acknowledged is lost.
 * (d) Reads.  Workers READ P's shards without asking P, so the lease alone
 *     does not stop them.  P's loop wakes when its lease ends and, before
 *     anything else in that turn, writes RPS__EPOCH_MOVED into every header
 *     of each partition with backups it is primary of (the read fence,
 *     src/server/partition.c).  By (a) and (b) that is failover_ms -
 *     lease_ms (less the drift: about failover_ms / 2) before B can be
 *     promoted, so a READ that still saw P's epoch read before B
 *     acknowledged anything, and returns every push acknowledged before
 *     it began.  The margin is what a stall of P's serving thread may
 *     cost; with a NIC that serves READs of a frozen process, a stall
 *     longer than it could let a READ see P's copy after B acknowledged
 *     more.  A grant takes effect only once P applied the log up to the
 *     grant's ReadIndex, so the fence comes down again only on a P that
 *     knows it is still primary.
 *
 * All times here are on the failover clock (rps__cp_failover_now): the
 * data plane's lease clock, or a test's.
 */
#include "config.h"
#include "common/common.h"
#include "common/crc.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

uint64_t rps__cp_fake_clock_ns;

uint64_t rps__cp_failover_now(void)
{
	return rps__cp_fake_clock_ns ? rps__cp_fake_clock_ns : rps__dp_boottime_ns();
}

void rps__cp_failover_init(struct rps__cplane *cp)
{
	memset(&cp->fo, 0, sizeof(cp->fo));	/* (heard of nobody yet) */
	cp->fo.failover_ns = ms_ns(cp->cfg.failover_ms);
	cp->fo.lease_ns = cp->fo.failover_ns / 2;
}

/* ---- the member's side -------------------------------------------------------- */

static void lease_apply(struct rps__cplane *cp);

/* Ask the leader for a lease every failover_ms / 10. */
void rps__cp_lease_send(struct rps__cplane *cp, uint64_t now)
{
	struct cp_failover *fo = &cp->fo;
	struct rps__lease l;
	uint64_t leader;

	lease_apply(cp);
	if (now < fo->next_send)
		return;
	leader = rps__rnode_leader(cp->rnode);
	if (!leader || (leader == cp->my_id && !fo->leading))
		return;	/* next turn: a lease as soon as there is a leader */
	fo->next_send = now + fo->failover_ns / 10;
	l.seq = ++fo->seq;
	l.t_send = now;
	fo->sent[l.seq % FO_SENT_MAX].seq = l.seq;
	fo->sent[l.seq % FO_SENT_MAX].t_send = now;
	if (leader == cp->my_id) {
		if (!rps__cp_on_lease(cp, NULL, &l))
			fo->next_send = now;	/* no round yet (a new term's first commit): next turn */
	} else
		rps__cp_peer_send(cp, leader, RPS__MSG_LEASE, 0, 0, &l, sizeof(l));
}

/* The latest grant takes effect once we applied the log up to the
 * leader's commit index at the grant: a primary that was cut off learns of
 * a FAILOVER that deposed it before it holds a lease again (its read fence
 * would come down otherwise, src/server/partition.c).  Every turn. */
static void lease_apply(struct rps__cplane *cp)
{
	struct cp_failover *fo = &cp->fo;

	if (fo->grant_until <= fo->lease_until)
		return;
	if (cp->rnode && rps__rnode_applied(cp->rnode) < fo->grant_index)
		return;
	fo->lease_until = fo->grant_until;
	cp->dp->set_lease(cp->srv, fo->lease_until);
}

/* A grant: the lease runs from when we asked, on our clock, never from
 * when the answer came (it may have been delayed anywhere). */
void rps__cp_on_lease_rep(struct rps__cplane *cp, int32_t status, const struct rps__lease_rep *r)
{
	struct cp_failover *fo = &cp->fo;
	uint64_t until;

	if (status || !r->granted || fo->sent[r->seq % FO_SENT_MAX].seq != r->seq)
		return;
	until = fo->sent[r->seq % FO_SENT_MAX].t_send + fo->lease_ns;
	if (until <= fo->lease_until)
		return;
	/* a grant still waiting for the log is replaced by a later one (its
	 * index is reached no sooner), or by one for the same request that
	 * names an earlier index */
	if (until > fo->grant_until || (until == fo->grant_until && r->index < fo->grant_index)) {
		fo->grant_until = until;
		fo->grant_index = r->index;
	}
	lease_apply(cp);
}

/* ---- the leader's side: contacts and grants -------------------------------------- */

static struct fo_contact *contact_of(struct rps__cplane *cp, uint64_t id)
{
	uint32_t i;

	for (i = 0; i < cp->fo.ncontact; i++)
		if (cp->fo.contact[i].id == id)
			return &cp->fo.contact[i];
	return NULL;
}

/* A member first seen while we lead gets a whole failover_ms. */
static struct fo_contact *contact_get(struct rps__cplane *cp, uint64_t id, uint64_t now)
{
	struct fo_contact *k = contact_of(cp, id);

	if (k || cp->fo.ncontact == RPS__SMAP_MAX_MEMBERS)
		return k;
	k = &cp->fo.contact[cp->fo.ncontact++];
	*k = (struct fo_contact){ .id = id, .since = now, .deadline = now + cp->fo.failover_ns };
	return k;
}

static bool member_failed(const struct rps__cplane *cp, uint64_t id)
{
	for (uint32_t i = 0; i < cp->fo.ncontact; i++)
		if (cp->fo.contact[i].id == id)
			return cp->fo.contact[i].failed_at != 0;
	return false;
}

bool rps__cp_member_failed(const struct rps__cplane *cp, uint64_t id)
{
	return cp->fo.leading && member_failed(cp, id);
}

/* Leadership won or lost (leader_id: who leads now, 0 if unknown).  A new
 * leader cannot know when the old one last heard from anyone: it declares
 * nobody failed before 1.1 x lease_ms (argument (b) above), which
 * outlasts any lease the old leader granted.  That is the old leader's
 * time, whose silence is what elected us; every other member was renewing
 * with the old leader and must first learn of us, so it gets failover_ms
 * from now, as if it had just renewed.  (With no old leader known, as
 * after our own restart, everybody gets 1.1 x lease_ms.) */
void rps__cp_failover_role(struct rps__cplane *cp, bool leader, uint64_t leader_id)
{
	struct cp_failover *fo = &cp->fo;
	uint64_t now = rps__cp_failover_now();
	uint32_t i;

	fo->nwaits = 0;
	fo->ncontact = 0;
	fo->leading = leader;
	if (!leader) {
		if (leader_id && leader_id != cp->my_id)
			fo->last_leader = leader_id;
		return;
	}
	fo->won_at = now;
	fo->last_duty = 0;
	for (i = 0; i < cp->map.nmembers; i++) {
		uint64_t id = cp->map.members[i].id;

		if (id != cp->my_id)
			fo->contact[fo->ncontact++] = (struct fo_contact){
				.id = id, .since = now,
				.deadline = now + (!fo->last_leader || id == fo->last_leader ? fo->lease_ns / 10 * 11
											 : fo->failover_ns),
			};
	}
}

/* A LEASE from member c's peer (c NULL: our own).  The grant waits for a
 * ReadIndex round, which only a leader that still leads completes; false
 * if no round was started. */
bool rps__cp_on_lease(struct rps__cplane *cp, struct srv_conn *c, const struct rps__lease *l)
{
	struct cp_failover *fo = &cp->fo;
	uint64_t id = c ? cp->dp->conn_peer_id(c) : cp->my_id;
	uint64_t now = rps__cp_failover_now();
	struct fo_contact *k;
	uint64_t ctx;
	int ret;

	if (!fo->leading || !rps__rnode_is_leader(cp->rnode))
		return false;	/* not ours to grant; the member asks the leader it learns of */
	if (id != cp->my_id)
		rps__cp_failover_heard(cp, id);
	if (id != cp->my_id && rps__smap_member(&cp->map, id) && (k = contact_get(cp, id, now))) {
		/* fresh again after a failure, or after a silence too short
		 * for one (a restart): balancing, which counts only fresh
		 * members, looks again, and its share comes back to it
		 * (rps__cp_balance_duty).  (Not a new leader's first renewals:
		 * a leader change moves nothing.) */
		if (k->failed_at || (k->renewed && now - k->since >= fo->lease_ns))
			cp->balance_due = true;
		if (k->failed_at)
			rps__log(RPS__LOG_WARN, "member %llu: in contact again %llu ms after it was declared failed"
				 " (what failed over stays; it is seeded as a backup where a replica set lacks one)", (unsigned long long)id,
				 (unsigned long long)((now - k->failed_at) / 1000000ull));
		k->failed_at = 0;
		k->since = now;
		k->renewed = true;
		k->deadline = now + fo->failover_ns;
	}
	if (fo->nwaits == FO_WAITS_MAX)
		return false;	/* it asks again in failover_ms / 10 */
	ctx = cp->my_id << 48 | (++fo->next_ctx & 0xffffffffffffull);
	ret = rps__rnode_read(cp->rnode, ctx);
	if (ret) {
		rps__log(RPS__LOG_DEBUG, "lease for member %llu not granted: %s", (unsigned long long)id,
			 rps__errbuf());
		return false;
	}
	fo->waits[fo->nwaits++] = (struct fo_wait){ .read_ctx = ctx, .id = id, .seq = l->seq, .t_recv = now };
	return true;
}

/* The ReadIndex round of a LEASE completed: a quorum acknowledged our term
 * after the request arrived.  Grant it. */
void rps__cp_failover_read_ready(struct rps__cplane *cp, uint64_t read_ctx, uint64_t index)
{
	struct cp_failover *fo = &cp->fo;
	struct rps__lease_rep rep = { .granted = 1, .index = index };
	uint32_t i;
	uint64_t id;

	for (i = 0; i < fo->nwaits && fo->waits[i].read_ctx != read_ctx; i++)
		;
	if (i == fo->nwaits)
		return;
	id = fo->waits[i].id;
	rep.seq = fo->waits[i].seq;
	fo->waits[i] = fo->waits[--fo->nwaits];
	if (id == cp->my_id)
		rps__cp_on_lease_rep(cp, 0, &rep);
	else
		rps__cp_peer_send(cp, id, RPS__MSG_LEASE_REP, 0, 0, &rep, sizeof(rep));
}

/* Rounds that never completed (no quorum): forgotten after failover_ms. */
static void waits_expire(struct cp_failover *fo, uint64_t now)
{
	for (uint32_t i = 0; i < fo->nwaits;) {
		/* (a wait queued this turn may be later than the turn's now) */
		if (now > fo->waits[i].t_recv && now - fo->waits[i].t_recv > fo->failover_ns)
			fo->waits[i] = fo->waits[--fo->nwaits];
		else
			i++;
	}
}

/* ---- the leader's side: failures ----------------------------------------------- */

/* The backup of p to promote when its primary failed, 0 if none is live.
 *
 * The first live backup in map order; every other live one is kept.  They
 * may differ only in entries no worker was told of (a primary acknowledges
 * what every replica applied): a kept backup that applied an entry more
 * than the new primary refuses the new primary's next entry (its seq does
 * not follow), its stream breaks, and it is dropped and seeded again
 * (doc/design.md "Failover and leases").  Asking the live backups for
 * their applied seq and promoting the highest would spare that seeding;
 * not done. */
static uint64_t choose_new_primary(const struct rps__cplane *cp, uint32_t p)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];

	for (uint32_t i = 0; i < RPS__SMAP_MAX_REPLICAS - 1 && mp->backups[i]; i++)
		if (!member_failed(cp, mp->backups[i]))
			return mp->backups[i];
	return 0;
}

/* What failed member f's role in partition p calls for; false: nothing. */
static bool failover_cmd(const struct rps__cplane *cp, uint32_t p, uint64_t f, struct rps__smap_cmd *cmd)
{
	const struct rps__smap_part *mp = &cp->map.parts[p];

	memset(cmd, 0, sizeof(*cmd));
	cmd->part = p;
	cmd->epoch = mp->epoch;
	switch (rps__smap_role(&cp->map, p, f)) {
	case RPS__SMAP_ROLE_PRIMARY:
		/* no backup (R = 1), or none live: nothing automatic */
		cmd->to = rps__smap_nbackups(&cp->map, p) ? choose_new_primary(cp, p) : 0;
		if (!cmd->to)
			return false;
		cmd->type = RPS__SMAP_FAILOVER;
		cmd->from = f;
		for (uint32_t i = 0; i < RPS__SMAP_MAX_REPLICAS - 1 && mp->backups[i]; i++)
			if (mp->backups[i] != cmd->to && !member_failed(cp, mp->backups[i]))
				cmd->keep[cmd->nkeep++] = mp->backups[i];
		return true;
	case RPS__SMAP_ROLE_BACKUP:
		/* a failed primary's FAILOVER leaves failed backups out anyway */
		if (member_failed(cp, mp->owner))
			return false;
		cmd->type = RPS__SMAP_REPLICA_DROP;
		cmd->id = f;
		return true;
	case RPS__SMAP_ROLE_JOINING:
		cmd->type = RPS__SMAP_REPLICA_ABORT;
		return true;
	default:
		return false;
	}
}

/* Propose, in one batch, what f's failure calls for in every partition.
 * The commands name the epoch they expect: one proposed twice, or after
 * the map moved on, is refused by every replica alike. */
static uint32_t propose_failover(struct rps__cplane *cp, uint64_t f)
{
	struct rps__smap_cmd cmd;
	uint32_t p, n = 0;

	for (p = 0; p < cp->map.npart; p++) {
		if (!failover_cmd(cp, p, f, &cmd))
			continue;
		rps__cp_propose_cmd(cp, &cmd);
		n++;
	}
	return n;
}

static bool heard_of(const struct cp_failover *fo, uint64_t id)
{
	for (uint32_t i = 0; i < fo->nheard; i++)
		if (fo->heard[i] == id)
			return true;
	return false;
}

/* A peer connection with member id (either way).  A member this server
 * never had a connection with since it started is never declared failed:
 * servers of a cluster come up seconds apart, and one that never came up
 * held no lease and no acknowledged push (psctl remove-server --force
 * deals with it).  One heard of for the first time gets failover_ms from
 * now, whatever the election said. */
void rps__cp_failover_heard(struct rps__cplane *cp, uint64_t id)
{
	struct cp_failover *fo = &cp->fo;
	uint64_t now = rps__cp_failover_now();
	struct fo_contact *k;

	if (heard_of(fo, id))
		return;
	for (uint32_t i = 0; fo->nheard == RPS__SMAP_MAX_MEMBERS && i < fo->nheard;)
		if (!rps__smap_member(&cp->map, fo->heard[i]))
			fo->heard[i] = fo->heard[--fo->nheard];	/* (ids are never reused) */
		else
			i++;
	if (fo->nheard == RPS__SMAP_MAX_MEMBERS)
		return;
	fo->heard[fo->nheard++] = id;
	if (fo->leading && (k = contact_get(cp, id, now)) && !k->failed_at && k->deadline < now + fo->failover_ns)
		k->deadline = now + fo->failover_ns;
}

/* Leader duty (every turn of the loop): declare members failed, and keep
 * proposing what their failure calls for until the map shows it applied
 * (a failed member then has no role left that calls for anything). */
void rps__cp_failover_duties(struct rps__cplane *cp, uint64_t now)
{
	struct cp_failover *fo = &cp->fo;
	uint32_t i;

	if (!fo->leading)
		return;
	/* No contact is evidence of a failure only while we were listening:
	 * a turn of this loop that lasted longer than a lease request's
	 * period (a blocking dial to a dead host, a large image built) left
	 * the others' requests queued unread, so every deadline moves on by
	 * the stall.  Declaring later never breaks the lease argument. */
	if (!rps__cp_fake_clock_ns) {	/* (a test's clock jumps on purpose) */
		uint64_t real = rps__dp_boottime_ns();

		if (fo->last_duty && real - fo->last_duty > fo->failover_ns / 10)
			for (i = 0; i < fo->ncontact; i++)
				if (!fo->contact[i].failed_at)
					fo->contact[i].deadline += real - fo->last_duty;
		fo->last_duty = real;
	}
	waits_expire(fo, now);
	/* members that left the map */
	for (i = 0; i < fo->ncontact;) {
		if (!rps__smap_member(&cp->map, fo->contact[i].id))
			fo->contact[i] = fo->contact[--fo->ncontact];
		else
			i++;
	}
	/* every failure first: a new primary is never one that failed too */
	for (i = 0; i < cp->map.nmembers; i++) {
		uint64_t id = cp->map.members[i].id;
		struct fo_contact *k;

		if (id == cp->my_id || !heard_of(fo, id) || !(k = contact_get(cp, id, now)) || k->failed_at ||
		    now <= k->deadline)
			continue;
		k->failed_at = now;
		k->next_try = now;
		rps__log(RPS__LOG_WARN, "member %llu: no contact for %llu ms: failed", (unsigned long long)id,
			 (unsigned long long)((now - k->since) / 1000000ull));
	}
	for (i = 0; i < fo->ncontact; i++) {
		struct fo_contact *k = &fo->contact[i];
		uint32_t n;

		if (!k->failed_at || now < k->next_try)
			continue;
		k->next_try = now + PEER_RETRY_NS / 2;
		n = propose_failover(cp, k->id);
		if (n)
			rps__log(RPS__LOG_INFO, "member %llu failed: %u shard map command%s proposed",
				 (unsigned long long)k->id, n, n == 1 ? "" : "s");
	}
}

/* ---- no majority: what workers are told ---------------------------------------- */

/*
 * Two voters, one dead: the other has no majority, so no lease is granted
 * (its primaries acknowledge nothing), nothing fails over and workers
 * would wait for their timeout, then read "connection lost".  So once this
 * server has had no lease for lease_ms past its end and reaches fewer
 * voters than a majority, the end of its map buffer says so (which voter
 * it lost, how many it reaches); workers read it with the map and with
 * their liveness probes and fail what waits with that line
 * (src/client/progress.c).  Said once in the log too.  With more than two
 * voters a majority is lost only with two of them, which is most often a
 * restart under way while another member died (its peers dial it again
 * within a second or two): the note waits NOQ_WAIT_MANY x failover_ms
 * there.  A peer that went silent without its connection breaking (a
 * stopped host) is not named, nor one this server never reached since it
 * started (the other server of a new cluster, not up yet: it was told to
 * "restart member 2" while member 2 was starting).
 */
#define NOQ_WAIT_MANY 10
void rps__cp_quorum_note(struct rps__cplane *cp, uint64_t now)
{
	struct cp_failover *fo = &cp->fo;
	struct rps__quorum_note n;
	struct rps__raft_status st;
	uint64_t lost = 0;
	uint32_t reach = 1, i;

	if (!cp->mapbuf || !cp->rnode || !cp->map.npart)
		return;
	rps__rnode_status(cp->rnode, &st);
	for (i = 0; i < st.conf.n_voters; i++) {
		struct peer *p;

		if (st.conf.voters[i] == cp->my_id)
			continue;
		p = rps__cp_peer_get(cp, st.conf.voters[i], false);
		if (p && p->c && !cp->dp->conn_dead(p->c))
			reach++;
		else if (!lost && heard_of(fo, st.conf.voters[i]))
			lost = st.conf.voters[i];
		/* (one never reached since this server started is coming up,
		 * as the failover rule has it: not named, nothing told) */
	}
	if (!lost || reach > st.conf.n_voters / 2 || now < fo->lease_until)
		fo->noq_since = 0;
	else if (!fo->noq_since)
		fo->noq_since = now;
	memset(&n, 0, sizeof(n));
	if (fo->noq_since && now - fo->noq_since >= (st.conf.n_voters <= 2 ? fo->lease_ns : NOQ_WAIT_MANY * fo->failover_ns)) {
		n.magic = RPS__NOTE_MAGIC;
		n.member = lost;
		n.reporter = cp->my_id;
		n.voters = st.conf.n_voters;
		n.reachable = reach;
		n.since_ms = (uint32_t)RPS__MIN((now - fo->noq_since + fo->lease_ns) / 1000000ull, UINT32_MAX);
		n.failover_ms = cp->cfg.failover_ms;
		n.crc = rps__crc32c_noinv((const uint8_t *)&n + 8, sizeof(n) - 8);
		if (fo->noq_member != lost)
			rps__log(RPS__LOG_ERROR, "no Raft majority: member %llu is unreachable and this server reaches %u of"
				 " %u voters, so nothing can fail over and workers are told; restart member %llu%s",
				 (unsigned long long)lost, reach, st.conf.n_voters, (unsigned long long)lost,
				 st.conf.n_voters == 2 ? ", and add a witness (rdmapsd --witness) so that the next death"
				 " fails over" : "");
		fo->noq_member = lost;
	} else if (fo->noq_member) {
		rps__log(RPS__LOG_INFO, "a Raft majority is reachable again");
		fo->noq_member = 0;
	}
	memcpy(cp->mapbuf + RPS__MAP_BUF - sizeof(n), &n, sizeof(n));
}

bool rps__cp_member_live(const struct rps__cplane *cp, uint64_t id)
{
	if (id == cp->my_id)
		return true;
	return cp->fo.leading && heard_of(&cp->fo, id) && !member_failed(cp, id);
}

/* Live, and it renewed its lease with us within the last lease_ms (it
 * renews every failover_ms / 10): a member merely not declared failed yet
 * may be one that stopped a second ago, or one this new leader has not
 * heard from yet. */
bool rps__cp_member_fresh(const struct rps__cplane *cp, uint64_t id)
{
	uint64_t now = rps__cp_failover_now();

	if (id == cp->my_id)
		return true;
	if (!rps__cp_member_live(cp, id))
		return false;
	for (uint32_t i = 0; i < cp->fo.ncontact; i++)
		if (cp->fo.contact[i].id == id)
			return cp->fo.contact[i].renewed && now - cp->fo.contact[i].since < cp->fo.lease_ns;
	return false;
}
