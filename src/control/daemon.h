/*
 * daemon.h - one server node as rdmapsd (and psperf's in-process servers)
 * run it: the data plane (server/server.h) composed with the control plane
 * (Raft, the shard map, moves, psctl requests) and checkpoints.
 */
#ifndef RPS_DAEMON_H
#define RPS_DAEMON_H

#include <stdint.h>

#include "server/server.h"

struct rps__daemon;

int rps__daemon_create(const struct rps__server_config *cfg, struct rps__daemon **out);
/* rdmapsd --restore: load the checkpoint in dir before serving. */
int rps__daemon_restore(struct rps__daemon *d, const char *dir);
/* Serve until rps__daemon_stop().  Returns 0 after a clean stop. */
int rps__daemon_run(struct rps__daemon *d);
/* Async-signal-safe: ask rps__daemon_run to return. */
void rps__daemon_stop(struct rps__daemon *d);
void rps__daemon_destroy(struct rps__daemon *d);
uint16_t rps__daemon_port(const struct rps__daemon *d);
const char *rps__daemon_fabric_name(const struct rps__daemon *d);
int rps__daemon_windows(const struct rps__daemon *d);

#endif
