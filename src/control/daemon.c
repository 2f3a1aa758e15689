/*
 * daemon.c - a server node: creates the data plane (with --threads N, N
 * instances of it, threads.c), starts the control plane over it and
 * registers the control plane's hooks with its (first instance's) loop.
 */
#include "config.h"
#include "common/common.h"
#include "control/cplane.h"
#include "control/daemon.h"
#include "server/dataplane.h"

#include <errno.h>
#include <stdlib.h>

struct rps__daemon {
	struct rps__server *srv;
	struct rps__cplane *cp;
};

int rps__daemon_create(const struct rps__server_config *cfg, struct rps__daemon **out)
{
	struct rps__dp_hooks hooks;
	struct rps__daemon *d;
	int ret;

	/* the configuration's own checks first, then the cluster list */
	ret = rps__server_config_check(cfg);
	if (ret)
		return ret;
	d = calloc(1, sizeof(*d));
	if (!d)
		return rps__seterr(-ENOMEM, "out of memory");
	ret = rps__cp_create(cfg, &d->cp);
	if (ret)
		goto err_free;
	ret = rps__server_group_create(cfg, &d->srv);
	if (ret)
		goto err_cp;
	ret = rps__cp_start(d->cp, cfg->nthreads > 1 ? rps__dataplane_ops_group() : rps__dataplane_ops(), d->srv,
			    &hooks);
	if (ret)
		goto err_server;
	rps__dp_set_hooks(d->srv, &hooks);
	*out = d;
	return 0;
err_server:
	rps__server_group_destroy(d->srv);
err_cp:
	rps__cp_destroy(d->cp);
err_free:
	free(d);
	return ret;
}

int rps__daemon_restore(struct rps__daemon *d, const char *dir)
{
	uint32_t installed;
	uint64_t seen, bytes;

	return rps__ck_restore(d->cp, dir, &installed, &seen, &bytes);
}

int rps__daemon_run(struct rps__daemon *d)
{
	int ret = rps__server_group_start(d->srv), joined;

	if (ret)
		return ret;
	ret = rps__server_run(d->srv);
	rps__server_group_stop(d->srv);
	joined = rps__server_group_join(d->srv);
	return ret ? ret : joined;
}

void rps__daemon_stop(struct rps__daemon *d)
{
	rps__server_group_stop(d->srv);
}

void rps__daemon_destroy(struct rps__daemon *d)
{
	if (!d)
		return;
	rps__server_group_destroy(d->srv);	/* (the first's fini hook stops the control plane) */
	rps__cp_destroy(d->cp);
	free(d);
}

uint16_t rps__daemon_port(const struct rps__daemon *d)
{
	return rps__server_port(d->srv);
}

int rps__daemon_windows(const struct rps__daemon *d)
{
	return rps__server_windows(d->srv);
}

const char *rps__daemon_fabric_name(const struct rps__daemon *d)
{
	return rps__server_fabric_name(d->srv);
}
