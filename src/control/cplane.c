/*
 * cplane.c - the server's control plane: the Raft node that orders changes
 * of the shard map, the connections to the other servers it talks over, the
 * moves of partitions, and psctl's requests.
 *
 * Everything here runs on the (first) serving thread, between completions: Raft
 * ticks and move duties are timers of the server loop, Raft messages arrive
 * as SEND/RECV on peer connections (verbs or TCP, the transport does not
 * matter here), and a moved partition travels as one RDMA READ by the new
 * owner from a buffer the old owner registered.
 *
 * A move (psctl move, add-server, remove-server) goes:
 *   leader        proposes MOVE_BEGIN(p, from, to, epoch e)
 *   from (owner)  on applying it: refuses pushes for p (workers get
 *                 RPS_ESTALE_EPOCH and retry elsewhere, nothing applied),
 *                 seals every lock word of p with the FENCE owner, publishes
 *                 epoch MOVED in every header, serialises p (parameters,
 *                 versions, optimizer state, sync accumulators, clocks,
 *                 applied push ids, parked pushes) with a crc32c, registers
 *                 it and sends MIGRATE to `to`
 *   to            READs it, checks the crc, installs it (not yet serving),
 *                 answers, and proposes MOVE_COMMIT(p, to, e)
 *   everyone      on applying COMMIT: owner = to, epoch e + 1; `to` serves;
 *                 `from` deregisters its copy (revoking remote access) after
 *                 a grace period.
 * Nothing is accepted for p between the fence and the commit, so no push is
 * applied twice or lost: a refused push was never applied, an acknowledged
 * one is in the shipped state.  If `to` does not install p in time, `from`
 * proposes MOVE_ABORT; whichever of COMMIT and ABORT is first in the log
 * wins on every server.
 *
 * Peer connections: the server with the higher member id connects, so two
 * servers never wait on each other's accept (a --join server with no map
 * yet learns the members from whichever one it reached: cp_peers.c).
 *
 * The control plane owns the map and what it does with each partition; the
 * data plane (server/dataplane.h) is reached only through the ops table it
 * was given, and calls back through the hooks set up here.  Files: this one
 * (start, stop, the hooks, timers), cp_peers.c, cp_moves.c, cp_map.c
 * (applying the map, proposals), repl_failover.c (failure detection, leases,
 * FAILOVER), repl_place.c (replica sets, seeding), cp_admin.c (psctl),
 * ckpt_srv.c; cplane_int.h has the map of the whole folder.
 */
#include "config.h"
#include "common/common.h"
#include "common/fsutil.h"
#include "control/cplane_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "rdmaps.h"

volatile int rps__cp_isolated;

/* ---- the hooks the server loop calls ------------------------------------------ */

static void cp_stop(struct rps__cplane *cp);

static void fini(void *ctx)
{
	cp_stop(ctx);
}

static void on_message(void *ctx, struct srv_conn *c, const struct rps__msg_hdr *h, void *body, uint32_t body_len)
{
	struct rps__cplane *cp = ctx;

	switch (h->type) {
	case RPS__MSG_STATUS:
		rps__cp_on_status(cp, c, h->req_id);
		return;
	case RPS__MSG_STATUS_REP:	/* a --join seed's answer (cp_peers.c) */
		if (cp->dp->conn_role(c) == CONN_PEER) {
			rps__cp_on_seed_status(cp, c, h->status, body, body_len);
			return;
		}
		break;
	case RPS__MSG_CKPT:
		if (cp->dp->conn_role(c) == CONN_ADMIN) {
			rps__ck_on_message(cp, c, h, body, body_len);
			return;
		}
		break;
	case RPS__MSG_RANK:
		if (cp->dp->conn_role(c) == CONN_ADMIN) {
			rps__cp_on_rank(cp, c, h->req_id, body);
			return;
		}
		break;
	case RPS__MSG_ADMIN:
		if (cp->dp->conn_role(c) == CONN_ADMIN) {
			rps__cp_on_admin(cp, c, h->req_id, body);
			return;
		}
		break;
	case RPS__MSG_RAFT:
		if (cp->dp->conn_role(c) == CONN_PEER && rps__cp_isolated)
			return;
		if (cp->dp->conn_role(c) == CONN_PEER) {
			if (rps__rnode_recv_from(cp->rnode, cp->dp->conn_peer_id(c), body, body_len))
				rps__log(RPS__LOG_WARN, "peer %llu: %s", (unsigned long long)cp->dp->conn_peer_id(c),
					 rps__errbuf());
			return;
		}
		break;
	case RPS__MSG_PROPOSE:
		if (cp->dp->conn_role(c) == CONN_PEER) {
			rps__cp_on_propose(cp, c, h->req_id, body, body_len);
			return;
		}
		break;
	case RPS__MSG_PROPOSE_REP:
		if (cp->dp->conn_role(c) == CONN_PEER)
			return;
		break;
	case RPS__MSG_LEASE:
		if (cp->dp->conn_role(c) == CONN_PEER && body_len == sizeof(struct rps__lease)) {
			if (!rps__cp_isolated)
				rps__cp_on_lease(cp, c, body);
			return;
		}
		break;
	case RPS__MSG_LEASE_REP:
		if (cp->dp->conn_role(c) == CONN_PEER) {
			if (!rps__cp_isolated && body_len == sizeof(struct rps__lease_rep))
				rps__cp_on_lease_rep(cp, h->status, body);
			return;
		}
		break;
	case RPS__MSG_MIGRATE:
		if (cp->dp->conn_role(c) == CONN_PEER &&
		    (body_len == sizeof(struct rps__migrate) || body_len == sizeof(struct rps__seed))) {
			rps__cp_on_migrate(cp, c, h->req_id, body,
					   body_len == sizeof(struct rps__seed) ? ((const struct rps__seed *)body)->seq : 0);
			return;
		}
		break;
	case RPS__MSG_SEED:
		if (cp->dp->conn_role(c) == CONN_PEER && body_len == sizeof(struct rps__seed)) {
			rps__cp_on_seed(cp, c, h->req_id, body);
			return;
		}
		break;
	case RPS__MSG_MIGRATE_REP:
		if (cp->dp->conn_role(c) == CONN_PEER) {
			rps__cp_on_migrate_rep(cp, c, (uint32_t)h->req_id, h->status);
			return;
		}
		break;
	default:
		break;
	}
	cp->dp->conn_fail(c, "sent a message type it may not send");
}

static void on_conn_gone(void *ctx, struct srv_conn *c)
{
	struct rps__cplane *cp = ctx;

	rps__cp_admin_conn_gone(cp, c);
	rps__ck_conn_gone(cp, c);
	rps__cp_reads_gone(cp, c);
	rps__cp_peers_gone(cp, c);
}

/* Timers: ticks, peer connections, leases, move duties.  Returns ms until due. */
static int run_timers(void *ctx, uint64_t now, bool *stop)
{
	struct rps__cplane *cp = ctx;
	uint64_t tick = ms_ns(cp->cfg.tick_ms);
	uint64_t fo_now = rps__cp_failover_now();
	int ret;

	rps__ck_timers(cp, now);	/* every turn: a checkpoint's hold ends as soon as it can */
	/* every turn too: a failure is declared when it is due, not a duty later */
	rps__cp_lease_send(cp, fo_now);
	rps__cp_failover_duties(cp, fo_now);
	if (now >= cp->next_tick) {
		cp->next_tick = now + tick;
		rps__rnode_tick(cp->rnode);
		rps__cp_quorum_note(cp, fo_now);
	}
	if (cp->replica_kick && now < cp->next_duty) {
		/* a seeding ended, an image arrived: its successor, its
		 * COMMIT, go now, not a duty turn later */
		cp->replica_kick = false;
		rps__cp_seed_duties(cp, now);
		rps__cp_replica_duties(cp, now);
	}
	if (now >= cp->next_duty) {
		cp->replica_kick = false;
		cp->next_duty = now + DUTY_NS;
		rps__cp_peers_connect(cp, now);
		rps__cp_move_duties(cp, now);
		rps__cp_seed_duties(cp, now);
		rps__cp_replica_duties(cp, now);
		rps__cp_balance_duty(cp, now);
		rps__cp_config_duties(cp, now);
		rps__cp_leader_membership(cp);
		rps__cp_admin_timeouts(cp, now);
		rps__cp_admin_map_changed(cp);
	}
	ret = rps__rnode_process(cp->rnode);
	if (ret) {
		rps__log(RPS__LOG_ERROR, "raft: %s", rps__errbuf());
		return ret;
	}
	if (cp->removed_at && now >= cp->removed_at) {
		rps__log(RPS__LOG_INFO, "removed from the cluster: stopping");
		*stop = true;
		return 0;
	}
	now = rps__now_ns();
	{
		uint64_t next = RPS__MIN(cp->next_tick, cp->next_duty);

		if (cp->replica_kick)	/* (set by what the log applied just now) */
			return 0;
		return next > now ? (int)((next - now) / 1000000ull) + 1 : 0;
	}
}

/* ---- start and stop ------------------------------------------------------------- */

static int make_temp_dir(struct rps__cplane *cp)
{
	char tmpl[] = "/tmp/rdmapsd-XXXXXX";

	if (!mkdtemp(tmpl))
		return rps__seterr(-errno, "mkdtemp: %s: give rdmapsd --data-dir", strerror(errno));
	cp->data_dir = strdup(tmpl);
	cp->data_dir_temp = true;
	return cp->data_dir ? 0 : -ENOMEM;
}

/* A data dir with anything in it: this server ran before, and whatever it
 * held in memory then is gone. */
static bool dir_has_state(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool any = false;

	if (!d)
		return false;
	while (!any && (e = readdir(d)))
		any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return any;
}

/* A number no other start of this server had (the wall clock's ns and the
 * pid: a restart is a new process, at another time), never 0. */
static uint64_t start_nonce(void)
{
	struct timespec ts;
	uint64_t x;

	clock_gettime(CLOCK_REALTIME, &ts);
	x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	x ^= (uint64_t)getpid() << 40 ^ rps__now_ns() * 0x9e3779b97f4a7c15ull;
	return x ? x : 1;
}

static int find_index(struct rps__cplane *cp)
{
	int i;

	if (cp->cfg.index >= 0) {
		if (cp->cfg.index >= cp->ncluster)
			return rps__seterr(-EINVAL, "--index %d is outside the %d-server cluster list",
					   cp->cfg.index, cp->ncluster);
		return cp->cfg.index;
	}
	for (i = 0; i < cp->ncluster; i++)
		if (!strcmp(cp->cluster[i].host, cp->cfg.listen.host) &&
		    cp->cluster[i].port == cp->cfg.listen.port)
			return i;
	return rps__seterr(-EINVAL, "the listen address is not in the cluster list: give --index N");
}

int rps__cp_create(const struct rps__server_config *cfg, struct rps__cplane **out)
{
	struct rps__cplane *cp;
	int ret;

	cp = calloc(1, sizeof(*cp));
	if (!cp)
		return rps__seterr(-ENOMEM, "out of memory");
	cp->cfg = *cfg;
	if (!cfg->failover_ms)	/* (a slow --tick-ms alone keeps working) */
		cp->cfg.failover_ms = (uint32_t)RPS__MIN(RPS__MAX(1000ull, 10ull * cfg->tick_ms), UINT32_MAX);
	if ((uint64_t)cp->cfg.failover_ms < 10ull * cfg->tick_ms) {
		ret = rps__seterr(-EINVAL, "--failover-ms %u: at least 10 x --tick-ms (%u)", cfg->failover_ms,
				  cfg->tick_ms);
		goto err_free;
	}
	if (cfg->cluster) {
		ret = rps__uri_list_parse(cfg->cluster, &cp->cluster, &cp->ncluster);
		if (ret)
			goto err_free;
	} else {
		cp->cluster = malloc(sizeof(*cp->cluster));
		if (!cp->cluster) {
			ret = rps__seterr(-ENOMEM, "out of memory");
			goto err_free;
		}
		cp->cluster[0] = cfg->listen;
		cp->ncluster = 1;
	}
	if (cfg->join_id) {
		/* --cluster names servers to reach, not a list we are in */
		if (!cfg->cluster)
			cp->ncluster = 0;
		if (cp->ncluster > (int)RPS__SMAP_MAX_MEMBERS)
			cp->ncluster = RPS__SMAP_MAX_MEMBERS;
		cp->index = -1;
	} else {
		ret = find_index(cp);
		if (ret < 0)
			goto err_free;
		cp->index = ret;
	}
	*out = cp;
	return 0;
err_free:
	free(cp->cluster);
	free(cp);
	return ret;
}

void rps__cp_destroy(struct rps__cplane *cp)
{
	if (!cp)
		return;
	free(cp->cluster);
	free(cp);
}

/* The Raft log's directory: --data-dir, or a temporary one. */
static int open_data_dir(struct rps__cplane *cp)
{
	int ret;

	if (cp->cfg.data_dir) {
		cp->data_dir = strdup(cp->cfg.data_dir);
		ret = cp->data_dir ? 0 : -ENOMEM;
	} else {
		ret = make_temp_dir(cp);
		if (!ret)
			rps__log(RPS__LOG_INFO, "no --data-dir: the Raft log lives in %s and goes away at exit",
				 cp->data_dir);
	}
	return ret;
}

/* A new cluster's shard map, encoded for the Raft log's bootstrap snapshot
 * (*buf malloc'ed).  Used only if the log is new: a restart replays onto the
 * map its cluster was formed with, even if --cluster or the defaults that
 * build the map have changed since. */
static int encode_bootstrap_map(struct rps__cplane *cp, void **buf, size_t *len)
{
	struct rps__smap *m = calloc(1, sizeof(*m));
	size_t cap;
	int ret;

	*buf = NULL;
	if (!m)
		return rps__seterr(-ENOMEM, "no memory for the bootstrap shard map");
	ret = rps__cp_bootstrap_map(cp, m);
	if (ret)
		goto out;
	cap = rps__smap_encoded_size(m);
	*buf = malloc(cap);
	if (!*buf) {
		ret = rps__seterr(-ENOMEM, "no memory for the bootstrap shard map");
		goto out;
	}
	ret = rps__smap_encode(m, *buf, cap, len);
	if (ret) {
		free(*buf);
		*buf = NULL;
	}
out:
	free(m);
	return ret;
}

/* The Raft node on that directory; a new cluster's voters are its first
 * servers (up to 5).  *nvoters_out: how many. */
static int open_raft(struct rps__cplane *cp, size_t *nvoters_out)
{
	struct rps__rnode_config rc;
	uint64_t voters[5];
	size_t nvoters = 0, boot_len = 0;
	void *boot = NULL;
	int ret, i;

	if (!cp->cfg.join_id) {
		int n = cp->ncluster >= 5 ? 5 : cp->ncluster >= 3 ? 3 : cp->ncluster;
		for (i = 0; i < n; i++)
			voters[nvoters++] = (uint64_t)i + 1;
		ret = encode_bootstrap_map(cp, &boot, &boot_len);
		if (ret)
			return ret;
	}
	memset(&rc, 0, sizeof(rc));
	rc.id = cp->my_id;
	rc.peers = voters;	/* copied by rps__rnode_open */
	rc.n_peers = nvoters;
	rc.boot_state = boot;	/* copied too */
	rc.boot_state_len = boot_len;
	rc.dir = cp->data_dir;
	rc.fsync = cp->cfg.fsync_none ? RPS__WAL_FSYNC_NONE : RPS__WAL_FSYNC_ALWAYS;
	rc.election_ticks = cp->cfg.election_ticks;
	rc.heartbeat_ticks = 1;
	rc.seed = cp->my_id * 0x9e3779b97f4a7c15ull ^ rps__now_ns();
	rc.cb = rps__cp_rnode_callbacks;
	rc.cb.ctx = cp;
	ret = rps__rnode_open(&rc, &cp->rnode);
	free(boot);
	if (ret) {
		rps__preerr(ret, "raft log in %s", cp->data_dir);
		return ret;
	}
	if (*rps__rnode_recovery_note(cp->rnode))
		rps__log(RPS__LOG_WARN, "raft log: %s", rps__rnode_recovery_note(cp->rnode));
	*nvoters_out = nvoters;
	return 0;
}

/* Catch up with the log (a new cluster: the bootstrap map), and say which
 * partitions a restart lost. */
static int recover_map(struct rps__cplane *cp)
{
	int ret, i;

	ret = rps__rnode_process(cp->rnode);
	if (ret)
		return ret;
	if (!cp->cfg.join_id && !cp->map.npart) {
		/* a restart whose log had no snapshot yet: the bootstrap state */
		ret = rps__cp_bootstrap_map(cp, &cp->map);
		if (ret)
			return ret;
		rps__cp_reconcile(cp);
	}
	for (i = 0; i < (int)cp->map.npart; i++)
		if (cp->parts[i].gone && cp->map.parts[i].backups[0])
			rps__log(RPS__LOG_WARN, "partition %d: restarted without it: failing over to its backup, member %llu",
				 i, (unsigned long long)cp->map.parts[i].backups[0]);
		else if (cp->parts[i].gone)
			rps__log(RPS__LOG_ERROR, "partition %d lost with member %llu (restarted): restore it"
				 " (psctl restore NAME) or accept it empty (psctl forget-lost %d)", i,
				 (unsigned long long)cp->my_id, i);
	return 0;
}

int rps__cp_start(struct rps__cplane *cp, const struct rps__dp_ops *dp, struct rps__server *srv,
		  struct rps__dp_hooks *hooks)
{
	size_t nvoters = 0;
	int ret;

	cp->dp = dp;
	cp->srv = srv;
	cp->my_id = cp->cfg.join_id ? cp->cfg.join_id : (uint64_t)cp->index + 1;
	cp->incarnation = start_nonce();
	rps__cp_failover_init(cp);	/* (before the Raft node reports its role) */
	dp->set_member_id(srv, cp->my_id);
	/* listening on port 0: the map must carry the port we got */
	if (!cp->cfg.join_id && cp->ncluster == 1 && !cp->cluster[0].port)
		cp->cluster[0].port = dp->port(srv);
	cp->mapbuf = calloc(1, RPS__MAP_BUF);
	if (!cp->mapbuf)
		return rps__seterr(-ENOMEM, "out of memory");
	ret = dp->map_register(srv, cp->mapbuf, RPS__MAP_BUF);
	if (ret)
		goto err_buf;
	ret = open_data_dir(cp);
	if (ret)
		goto err_mr;
	cp->restarted = dir_has_state(cp->data_dir);
	/* (after that look: a --checkpoint-dir made inside --data-dir is no
	 * sign of a restart) */
	ret = rps__ck_init(cp);
	if (ret)
		goto err_ck;
	cp->replay_to = UINT64_MAX;	/* (what open applies is the log's: replayed) */
	ret = open_raft(cp, &nvoters);
	if (ret)
		goto err_ck;
	{
		struct rps__raft_status rs;

		rps__rnode_status(cp->rnode, &rs);
		cp->replay_to = rs.last_index;
	}
	ret = recover_map(cp);
	if (ret)
		goto err_rnode;
	if (nvoters == 1 && cp->ncluster == 1)
		rps__rnode_campaign(cp->rnode);
	rps__cp_map_publish(cp);
	*hooks = (struct rps__dp_hooks){
		.on_message = on_message, .on_conn_gone = on_conn_gone,
		.on_read_done = rps__cp_on_read_done, .on_send_done = rps__cp_on_send_done,
		.accept_peer = rps__cp_accept_peer, .peer_attached = rps__cp_peer_attached,
		.peer_dialed = rps__cp_peer_dialed,
		.run_timers = run_timers, .fini = fini, .ctx = cp,
	};
	return 0;
err_rnode:
	rps__rnode_close(cp->rnode);
	cp->rnode = NULL;
err_ck:
	rps__ck_fini(cp);
	if (cp->data_dir_temp)
		(void)rps__remove_tree(cp->data_dir);
	free(cp->data_dir);
	cp->data_dir = NULL;
err_mr:
	dp->map_deregister(srv);
err_buf:
	free(cp->mapbuf);
	cp->mapbuf = NULL;
	return ret;
}

/* Undo rps__cp_start (the fini hook does; the data plane must still be there). */
static void cp_stop(struct rps__cplane *cp)
{
	uint32_t p;

	if (!cp->dp)
		return;
	rps__ck_fini(cp);
	for (p = 0; p < RPS__SMAP_MAX_PART; p++)
		rps__cp_blob_free(cp, &cp->parts[p]);
	rps__rnode_close(cp->rnode);
	cp->rnode = NULL;
	if (cp->data_dir_temp && cp->data_dir)
		(void)rps__remove_tree(cp->data_dir);
	free(cp->data_dir);
	cp->data_dir = NULL;
	free(cp->admin);
	cp->admin = NULL;
	free(cp->reads);
	cp->reads = NULL;
	cp->dp->map_deregister(cp->srv);
	free(cp->mapbuf);
	cp->mapbuf = NULL;
	cp->dp = NULL;
}
