/*
 * threads.c - serving threads (rdmapsd --threads N): N data planes in one
 * process, one control plane over them.
 *
 * Instance k of N is a whole data plane (server.c and the rest): its own
 * fabric, completion queue, listener (the member's port + k), connections,
 * tensors, held and parked pushes, waiters and replication streams.  It
 * serves the partitions p with p % N == k and no others, so no two
 * threads ever touch the same shard, connection or list: the hot path has
 * no lock and nothing shared to contend on.  A worker opens one connection
 * per instance (the HELLO reply names N) and sends each shard op to the
 * instance of its partition; the replication stream of a partition runs
 * between the instances of the same index on its primary and its backups.
 *
 * The control plane (Raft, the map, moves, checkpoints, psctl) runs on the
 * first instance's thread and talks to all of them through the ops table
 * below, the same dataplane.h contract as one instance: an op on a
 * partition goes to that partition's instance, an op on the server as a
 * whole to each, an op on the first's connections, memory or port to the
 * first alone (the classes of RPS__DP_OPS, from which the table is
 * generated).  The first instance's ops run in place; another's run on
 * its own thread, between two turns of its loop (its mailbox, mailbox.c:
 * one atomic load a turn when nothing is asked), while the control plane
 * waits.
 * Instances past the first never call back into the control plane (they
 * have no hooks: peers and psctl connect to the first only), so a call can
 * never wait on its caller.
 */
#include "config.h"
#include "common/common.h"
#include "server/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* ---- the instances ---------------------------------------------------------------- */

static void call_all(struct rps__server *srv, rps__srv_mbox_fn fn, void *arg)
{
	uint32_t k;

	for (k = 0; k < srv->thr.nthreads; k++)
		rps__srv_mbox_call(srv->thr.group[k], fn, arg);
}

static struct rps__server *inst_of(struct rps__server *srv, uint32_t part)
{
	return srv->thr.group[part % srv->thr.nthreads];
}

/* ---- the instances' threads --------------------------------------------------- */

static void *instance_main(void *arg)
{
	struct rps__server *srv = arg;
	int ret;

	rps__srv_mbox_claim(srv);
	ret = rps__server_run(srv);
	srv->thr.ret = ret;	/* (read after pthread_join) */
	rps__srv_mbox_close(srv);
	if (ret) {
		rps__log(RPS__LOG_ERROR, "serving thread %u stopped: %s", srv->thr.index, rps__errbuf());
		rps__server_group_stop(srv->thr.first);
	}
	return NULL;
}

int rps__server_group_start(struct rps__server *first)
{
	uint32_t k;
	int ret;

	for (k = 1; k < first->thr.nthreads; k++) {
		struct rps__server *srv = first->thr.group[k];
		rps__srv_mbox_open(srv);
		ret = pthread_create(&srv->thr.thread, NULL, instance_main, srv);
		if (ret) {
			rps__srv_mbox_close(srv);
			rps__server_group_stop(first);
			rps__server_group_join(first);
			return rps__seterr(-ret, "starting serving thread %u: %s", k, strerror(ret));
		}
	}
	return 0;
}

void rps__server_group_stop(struct rps__server *first)
{
	uint32_t k;

	for (k = 0; k < first->thr.nthreads; k++)
		rps__server_stop(first->thr.group ? first->thr.group[k] : first);
}

int rps__server_group_join(struct rps__server *first)
{
	uint32_t k;
	int ret = 0;

	for (k = 1; k < first->thr.nthreads; k++) {
		struct rps__server *srv = first->thr.group[k];
		if (!srv->thr.thread)
			continue;
		pthread_join(srv->thr.thread, NULL);
		srv->thr.thread = 0;
		if (srv->thr.ret && !ret)
			ret = srv->thr.ret;
	}
	return ret;
}

/* ---- create and destroy ----------------------------------------------------------- */

/* What a HELLO names in place of the map past the first instance (the
 * map is the first's alone: its control plane rewrites it). */
static int probe_area(struct rps__server *srv)
{
	void *buf = calloc(1, RPS__PROBE_AREA);
	int ret;

	if (!buf)
		return rps__seterr(-ENOMEM, "out of memory");
	ret = rps__mr_reg(srv->fab, buf, RPS__PROBE_AREA, RPS__ACCESS_REMOTE_READ | RPS__ACCESS_WINDOWED,
			  &srv->mapbuf_mr);
	if (ret) {
		free(buf);
		return ret;
	}
	srv->mapbuf = buf;
	return 0;
}

static void probe_area_free(struct rps__server *srv)
{
	if (!srv->mapbuf)
		return;
	rps__mr_dereg(srv->mapbuf_mr);
	free(srv->mapbuf);
	srv->mapbuf_mr = NULL;
	srv->mapbuf = NULL;
}

void rps__server_group_destroy(struct rps__server *first)
{
	struct rps__server **group;
	uint32_t k, n;

	if (!first)
		return;
	group = first->thr.group;
	n = first->thr.nthreads;
	rps__server_group_stop(first);
	rps__server_group_join(first);
	/* the others account their memory alone from now: the first goes
	 * first (its fini hook stops the control plane, which may still call
	 * into them, in place now that their threads are gone) */
	for (k = 1; group && k < n; k++) {
		group[k]->thr.first = group[k];
		group[k]->thr.nthreads = 1;
	}
	rps__server_destroy(first);
	for (k = 1; group && k < n; k++) {
		probe_area_free(group[k]);
		rps__srv_mbox_fini(group[k]);
		rps__server_destroy(group[k]);
	}
	free(group);
}

#define PORT_TRIES 16	/* an ephemeral first port whose followers were taken */

static int group_create_once(const struct rps__server_config *cfg, struct rps__server **out)
{
	struct rps__server_config c = *cfg;
	struct rps__server **group = calloc(cfg->nthreads, sizeof(*group));
	uint32_t k;
	int ret;

	if (!group)
		return rps__seterr(-ENOMEM, "out of memory");
	for (k = 0; k < cfg->nthreads; k++) {
		if (k)
			c.listen.port = (uint16_t)(rps__server_port(group[0]) + k);
		ret = rps__server_create(&c, &group[k]);
		if (ret)
			goto err;
		group[k]->thr.nthreads = cfg->nthreads;
		group[k]->thr.index = k;
		group[k]->thr.first = group[0];
		if (k && ((ret = rps__srv_mbox_init(group[k])) || (ret = probe_area(group[k])))) {
			rps__srv_mbox_fini(group[k]);
			rps__server_destroy(group[k]);
			goto err;
		}
	}
	group[0]->thr.group = group;
	/* what each took alone so far now counts for the whole (mem_take) */
	for (k = 0; k < cfg->nthreads; k++)
		group[0]->mem_group += group[k]->mem_used;
	*out = group[0];
	return 0;
err:
	while (k--) {
		probe_area_free(group[k]);
		rps__srv_mbox_fini(group[k]);
		rps__server_destroy(group[k]);
	}
	free(group);
	return ret;
}

int rps__server_group_create(const struct rps__server_config *cfg, struct rps__server **out)
{
	int tries, ret;

	if (cfg->nthreads <= 1)
		return rps__server_create(cfg, out);
	if (cfg->nthreads > RPS__SERVER_THREADS_MAX)
		return rps__seterr(-EINVAL, "--threads %u: at most %u", cfg->nthreads, RPS__SERVER_THREADS_MAX);
	if (cfg->listen.port && (uint32_t)cfg->listen.port + cfg->nthreads - 1 > 65535)
		return rps__seterr(-EINVAL, "--threads %u: ports %u to %u do not exist", cfg->nthreads,
				   cfg->listen.port, cfg->listen.port + cfg->nthreads - 1);
	for (tries = 0;; tries++) {
		ret = group_create_once(cfg, out);
		/* an ephemeral first port: its followers may be taken, try another */
		if (ret != -EADDRINUSE || cfg->listen.port || tries == PORT_TRIES)
			break;
	}
	if (ret == -EADDRINUSE)
		rps__preerr(ret, "--threads %u listens on %u ports in a row from the first", cfg->nthreads,
			    cfg->nthreads);
	return ret;
}

/* ---- the ops table over the instances --------------------------------------------- */

static const struct rps__dp_ops *one;	/* an instance's own ops (dataplane.c) */

/*
 * The forwarding of the PART and ALL ops, generated from their lines in
 * RPS__DP_OPS (dataplane.h).  For op f: struct fwd_f holds its arguments
 * and its result; do_f runs f on the instance it is called on (that
 * instance in the place of srv); g_f, in the group's table, calls do_f on
 * the instance of the op's part (PART) or on each instance in turn (ALL).
 * FIRST ops are the first instance's own; the _CUSTOM ones are written out
 * below.
 */
#define FWD(class, ret, name, ...) FWD_##class(ret, name, __VA_ARGS__)
#define FWD_FIRST(ret, name, ...)
#define FWD_PART_CUSTOM(ret, name, ...)
#define FWD_ALL_CUSTOM(ret, name, ...)
#define FWD_PART(ret, name, ...) \
	FWD_OP(ret, name, rps__srv_mbox_call(inst_of(srv, part), do_##name, &a), __VA_ARGS__)
#define FWD_ALL(ret, name, ...) \
	_Static_assert(IS_VOID(ret), #name ": an ALL op returns nothing (one that does is ALL_CUSTOM)"); \
	FWD_OP(ret, name, call_all(srv, do_##name, &a), __VA_ARGS__)
#define FWD_OP(ret, name, call, ...) \
	struct fwd_##name { \
		RPS__DP_SEQ(FWD_FIELD, __VA_ARGS__) \
		IF(IS_VOID(ret))(, ret result;) \
	}; \
	static void do_##name(struct rps__server *inst, void *arg) \
	{ \
		struct fwd_##name *a = arg; \
		a->srv = inst; \
		IF(IS_VOID(ret))(, a->result =) one->name(RPS__DP_LIST(FWD_ARG, __VA_ARGS__)); \
	} \
	static ret g_##name(RPS__DP_PARAMS(__VA_ARGS__)) \
	{ \
		struct fwd_##name a = { RPS__DP_SEQ(FWD_INIT, __VA_ARGS__) }; \
		call; \
		IF(IS_VOID(ret))(, return a.result;) \
	}
#define FWD_FIELD(type, param) type param;
#define FWD_INIT(type, param) .param = param,
#define FWD_ARG(type, param) a->param
/* IS_VOID(type): 1 if type is void, else 0 (a type that starts with a word) */
#define IS_VOID(type) SECOND(VOID_PROBE_##type, 0, ~)
#define VOID_PROBE_void ~, 1
#define SECOND(...) SECOND_(__VA_ARGS__)
#define SECOND_(a, b, ...) b
#define IF(cond) RPS__DP_CAT(IF_, cond)
#define IF_1(yes, no) yes
#define IF_0(yes, no) no

RPS__DP_OPS(FWD)

/* What the _CUSTOM ops pass their instances. */
struct args {
	uint64_t u64;
	const void *ptr;
	const char *name;
	int rank;
	int ret;
	bool b;
	struct rps__ckpt_target *targets;
	uint32_t ntargets;
	struct rps__dp_copy copy;
	struct rps__dp_stats st;
	const struct rps__tensor_spec *spec;
	struct srv_tensor *t;
	const struct rps__dp_shard *cs;
};

/* the server as a whole */

static void do_stats(struct rps__server *s, void *a)
{
	struct args *x = a;
	struct rps__dp_stats st;

	one->stats(s, &st);
	x->st.n_conns += st.n_conns;
	x->st.shards += st.shards;
	x->st.shard_bytes += st.shard_bytes;
	x->st.tensors = RPS__MAX(x->st.tensors, st.tensors);	/* (every instance knows every tensor) */
}
static void g_stats(struct rps__server *srv, struct rps__dp_stats *st)
{
	struct args a;

	memset(&a, 0, sizeof(a));
	call_all(srv, do_stats, &a);
	*st = a.st;
}

/* The replication stream of instance k goes to the backup's instance k. */
static void do_repl_peer(struct rps__server *s, void *a)
{
	struct args *x = a;
	struct rps__uri u;
	char uri[RPS__SMAP_URI_MAX];
	int r;

	if (!x->name || !s->thr.index) {
		r = one->repl_peer(s, x->u64, x->name);
		x->ret = r ? r : x->ret;
		return;
	}
	if (rps__uri_parse(x->name, &u) || (uint32_t)u.port + s->thr.index > 65535) {
		x->ret = rps__seterr(-EINVAL, "member %llu: '%s' has no port for serving thread %u",
				     (unsigned long long)x->u64, x->name, s->thr.index);
		return;
	}
	u.port = (uint16_t)(u.port + s->thr.index);
	rps__uri_str(&u, uri, sizeof(uri));
	r = one->repl_peer(s, x->u64, uri);
	x->ret = r ? r : x->ret;
}
static int g_repl_peer(struct rps__server *srv, uint64_t id, const char *uri)
{
	struct args a = { .u64 = id, .name = uri };

	call_all(srv, do_repl_peer, &a);
	return a.ret;
}

/* workers */

static void do_rank_remove(struct rps__server *s, void *a)
{
	struct args *x = a;

	x->ret = one->rank_remove(s, x->name, x->rank);
}
/* Every instance knows every tensor (workers create it on each): the
 * count is one instance's; an error other than "not here" wins. */
static int g_rank_remove(struct rps__server *srv, const char *name, int rank)
{
	char msg[512] = "";
	int ret = -ENOENT;
	uint32_t k;

	for (k = 0; k < srv->thr.nthreads; k++) {
		struct args a = { .name = name, .rank = rank };
		rps__srv_mbox_call(srv->thr.group[k], do_rank_remove, &a);
		if (a.ret < 0 && a.ret != -ENOENT) {
			if (ret >= 0 || ret == -ENOENT)
				snprintf(msg, sizeof(msg), "%s", rps__errbuf());
			ret = ret < 0 && ret != -ENOENT ? ret : a.ret;
		} else if (a.ret >= 0 && (ret == -ENOENT || (ret >= 0 && a.ret > ret))) {
			ret = a.ret;
		} else if (a.ret == -ENOENT && ret == -ENOENT) {
			snprintf(msg, sizeof(msg), "%s", rps__errbuf());
		}
	}
	if (ret < 0)
		rps__seterr(ret, "%s", msg);
	return ret;
}

/* checkpoints */

static void do_hold_steps(struct rps__server *s, void *a)
{
	struct args *x = a;
	struct rps__ckpt_target *t = NULL, *grown;
	uint32_t n = one->hold_steps(s, &t), i, j;

	if (!t) {
		x->ret = -ENOMEM;
		return;
	}
	/* held at once where they are: this thread goes on while the control
	 * plane asks the others, and PREPARE holds at the highest of all */
	for (i = 0; i < n; i++)
		one->hold_tensor(s, t[i].name, t[i].step);
	for (i = 0; i < n; i++) {
		for (j = 0; j < x->ntargets && strcmp(x->targets[j].name, t[i].name); j++)
			;
		if (j < x->ntargets) {
			x->targets[j].step = RPS__MAX(x->targets[j].step, t[i].step);
			continue;
		}
		grown = realloc(x->targets, (x->ntargets + 1) * sizeof(*grown));
		if (!grown) {
			x->ret = -ENOMEM;
			break;
		}
		x->targets = grown;
		x->targets[x->ntargets++] = t[i];
	}
	free(t);
}
static uint32_t g_hold_steps(struct rps__server *srv, struct rps__ckpt_target **out)
{
	struct args a;

	memset(&a, 0, sizeof(a));
	call_all(srv, do_hold_steps, &a);
	if (a.ret || !a.targets) {
		free(a.targets);
		*out = a.ret ? NULL : calloc(1, sizeof(**out));	/* (NULL: out of memory, as one instance says) */
		return 0;
	}
	*out = a.targets;
	return a.ntargets;
}

static void do_hold_reached(struct rps__server *s, void *a)
{
	if (!one->hold_reached(s))
		((struct args *)a)->b = false;
}
static bool g_hold_reached(struct rps__server *srv)
{
	struct args a = { .b = true };

	call_all(srv, do_hold_reached, &a);
	return a.b;
}

/* Each instance's copy, then one copy of them all: tensors by name, the
 * shards of each tensor in index order (as one instance gives them). */
static void do_take(struct rps__server *s, void *a)
{
	struct args *x = a;

	x->ret = one->take(s, &x->copy);
}

struct taken {
	const char *name;
	uint32_t index;
	struct rps__dp_shard_copy *sc;
};

static int taken_cmp(const void *a, const void *b)
{
	const struct taken *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	return c ? c : (x->index > y->index) - (x->index < y->index);
}

static int g_take(struct rps__server *srv, struct rps__dp_copy *out)
{
	struct rps__dp_copy *parts = calloc(srv->thr.nthreads, sizeof(*parts));
	struct taken *all = NULL;
	uint32_t k, i, n = 0, m = 0;
	int ret = 0;

	memset(out, 0, sizeof(*out));
	if (!parts)
		return rps__seterr(-ENOMEM, "out of memory");
	for (k = 0; k < srv->thr.nthreads && !ret; k++) {
		struct args a;
		memset(&a, 0, sizeof(a));
		rps__srv_mbox_call(srv->thr.group[k], do_take, &a);
		parts[k] = a.copy;
		ret = a.ret;
		n += a.copy.nshards;
		m += a.copy.ntensors;
	}
	if (ret)
		goto out;
	all = calloc(n ? n : 1, sizeof(*all));
	out->tensors = calloc(m ? m : 1, sizeof(*out->tensors));
	out->shards = calloc(n ? n : 1, sizeof(*out->shards));
	if (!all || !out->tensors || !out->shards) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	n = 0;
	for (k = 0; k < srv->thr.nthreads; k++)
		for (i = 0; i < parts[k].nshards; i++)
			all[n++] = (struct taken){ .name = parts[k].tensors[parts[k].shards[i].tensor].name,
						   .index = parts[k].shards[i].meta.index,
						   .sc = &parts[k].shards[i] };
	qsort(all, n, sizeof(*all), taken_cmp);
	for (i = 0; i < n; i++) {
		struct rps__dp_shard_copy *sc = &out->shards[out->nshards++];
		if (!out->ntensors || strcmp(out->tensors[out->ntensors - 1].name, all[i].name)) {
			/* (the spec of the instance that gave this shard: the same everywhere) */
			for (k = 0; k < srv->thr.nthreads; k++)
				if (all[i].sc >= parts[k].shards && all[i].sc < parts[k].shards + parts[k].nshards)
					break;
			out->tensors[out->ntensors] = parts[k].tensors[all[i].sc->tensor];
			out->ntensors++;
		}
		*sc = *all[i].sc;
		sc->tensor = out->ntensors - 1;
		all[i].sc->params = NULL;	/* (now the merged copy's) */
		all[i].sc->state = NULL;
		all[i].sc->clocks = NULL;
	}
	for (k = 0; k < srv->thr.nthreads; k++)
		out->raw_bytes += parts[k].raw_bytes;
out:
	for (k = 0; k < srv->thr.nthreads; k++)
		one->copy_free(&parts[k]);
	free(parts);
	free(all);
	return ret;
}

static void do_restore_tensor(struct rps__server *s, void *a)
{
	struct args *x = a;
	struct srv_tensor *t = NULL;
	int r = one->restore_tensor(s, (const char *)x->ptr, x->name, x->spec, &t);

	if (r && !x->ret)
		x->ret = r;
	if (s == s->thr.first)
		x->t = t;
}
static int g_restore_tensor(struct rps__server *srv, const char *file, const char *name,
			    const struct rps__tensor_spec *spec, struct srv_tensor **out)
{
	struct args a = { .ptr = file, .name = name, .spec = spec };

	call_all(srv, do_restore_tensor, &a);
	*out = a.t;
	return a.ret;
}

static void do_restore_shard(struct rps__server *s, void *a)
{
	struct args *x = a;
	struct srv_tensor *t = rps__srv_tensor_by_name(s, x->t->name);

	x->ret = t ? one->restore_shard(s, (const char *)x->ptr, t, x->cs)
		   : rps__seterr(-ENOENT, "%s: tensor '%s' is not on serving thread %u", (const char *)x->ptr,
				 x->t->name, s->thr.index);
}
static int g_restore_shard(struct rps__server *srv, const char *file, struct srv_tensor *t,
			   const struct rps__dp_shard *cs)
{
	struct args a = { .ptr = file, .t = t, .cs = cs };

	if (cs->index >= t->layout.nshards)
		return one->restore_shard(srv, file, t, cs);	/* (it says what is wrong) */
	rps__srv_mbox_call(inst_of(srv, rps__shard_server(&t->layout, cs->index)), do_restore_shard, &a);
	return a.ret;
}

/* The group's table: each op from its line in RPS__DP_OPS, the first
 * instance's own or g_<name> by its class, and nothing else. */
#define ENTRY(class, ret, name, ...) ENTRY_##class(name)
#define ENTRY_FIRST(name) .name = one->name,
#define ENTRY_PART(name) .name = g_##name,
#define ENTRY_PART_CUSTOM(name) .name = g_##name,
#define ENTRY_ALL(name) .name = g_##name,
#define ENTRY_ALL_CUSTOM(name) .name = g_##name,
#define COUNT(class, ret, name, ...) +1
_Static_assert(sizeof(struct rps__dp_ops) == (0 RPS__DP_OPS(COUNT)) * sizeof(void (*)(void)),
	       "struct rps__dp_ops has a member that is not in RPS__DP_OPS");

static struct rps__dp_ops group_ops;
static pthread_once_t group_ops_once = PTHREAD_ONCE_INIT;

static void group_ops_init(void)
{
	one = rps__dataplane_ops();
	group_ops = (struct rps__dp_ops){ RPS__DP_OPS(ENTRY) };
}

const struct rps__dp_ops *rps__dataplane_ops_group(void)
{
	pthread_once(&group_ops_once, group_ops_init);
	return &group_ops;
}
