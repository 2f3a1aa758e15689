/*
 * psctl_int.h - what the pieces of psctl share: the options, the leader as
 * found, the helpers and requests in psctl.c, and the commands main runs
 * (psctl_status.c, psctl_moves.c, psctl_ckpt.c, psctl_ranks.c).
 *
 * The files of src/programs/ (tests/filemaps.sh checks that this names each):
 *   rdmapsd.c        the server daemon (its node is control/daemon.c)
 *   psctl.c          psctl: main, options, helpers, requests
 *   psctl_status.c   psctl status
 *   psctl_moves.c    move, add-server, rebalance, remove-server,
 *                    forget-lost, transfer-leader, set-replicas
 *   psctl_ckpt.c     checkpoint and restore
 *   psctl_ranks.c    remove-rank
 * and rdmapsd.service.in, the systemd unit.
 */
#ifndef RPS_PSCTL_INT_H
#define RPS_PSCTL_INT_H

#include "common/common.h"
#include "client/ctl.h"
#include "proto/proto.h"
#include "proto/smap.h"
#include "transport/uri.h"

#include <stdbool.h>
#include <stdint.h>

/* the command line */
struct psctl_opt {
	struct rps__uri *servers;
	int nservers;
	bool json;
	bool no_rebalance;
	bool force;
	const char *role, *scope;	/* keygen */
	int timeout_ms;		/* --timeout: what an operation may take */
	int rpc_ms;		/* connect / STATUS */
	int level;		/* checkpoint: igzip level, -1: not given */
};
extern struct psctl_opt psctl_opt;

/* The leader as it sees itself. */
struct leader {
	uint64_t id;
	struct rps__uri uri;
	struct rps__status_rep st;
	struct rps__smap map;
};

/* A member of the map with its own admin channel. */
struct psctl_member {
	uint64_t id;
	struct rps__uri uri;
	struct rps__ctl *ctl;
};

/* psctl.c: helpers, connections, STATUS and ADMIN, main */
int psctl_fail(const char *fmt, ...) RPS__PRINTF(1, 2);
int psctl_fail_err(void);
const char *psctl_errtext(int err);
uint64_t psctl_deadline_in(int ms);
bool psctl_expired(uint64_t deadline);
void psctl_sleep_ms(unsigned ms);
void psctl_json_str(const char *s);
bool psctl_id_in(const uint64_t *ids, uint32_t n, uint64_t id, uint32_t *at);
int psctl_query_status(const struct rps__uri *u, struct rps__status_rep *st, struct rps__smap *map);
int psctl_query_any(struct rps__uri *from, struct rps__status_rep *st, struct rps__smap *map);
/* every member of the map, connected; why: what a member that fails misses */
int psctl_members(struct psctl_member *m, uint32_t *n, const char *why);
int psctl_find_leader(struct leader *L, uint64_t deadline);
int psctl_admin(uint32_t op, uint32_t part, uint64_t id, const char *uri, struct rps__admin_rep *rep,
		const char *what);

/* psctl_status.c: psctl status */
int psctl_cmd_status(void);

/* psctl_moves.c: move, add-server, remove-server, forget-lost, transfer-leader */
int psctl_cmd_move(uint32_t part, uint64_t to);
int psctl_cmd_add_server(uint64_t id, const char *uri);
int psctl_cmd_force_remove(uint64_t id);
int psctl_cmd_rebalance(void);
int psctl_cmd_set_replicas(uint32_t r);
int psctl_cmd_forget_lost(uint32_t part);
int psctl_cmd_remove_server(uint64_t id);
int psctl_cmd_transfer_leader(uint64_t to);

/* psctl_ckpt.c: checkpoint, restore */
int psctl_cmd_checkpoint(const char *name);
int psctl_cmd_restore(const char *name);

/* psctl_ranks.c: remove-rank */
int psctl_cmd_remove_rank(int rank, const char *tensor);

#endif
