/*
 * fuzz_admin.c - libFuzzer harness for admin requests: what psctl sends an
 * rdmapsd (STATUS, ADMIN, CKPT), decoded and acted on by a real server,
 * and the replies decoded as psctl does (src/client/ctl.c and the shard map).
 *
 * One rdmapsd runs in this process for the whole fuzzing session (a
 * one-member cluster on 127.0.0.1, 8 partitions, its data and its
 * --checkpoint-dir in a scratch directory), and every input is one request over an admin
 * connection (rps__ctl_call), reopened if the server drops it:
 *   [u8 sel][body]
 *   sel % 4 == 0  STATUS; the reply's shard map must decode
 *   sel % 4 == 1  ADMIN: body laid over struct rps__admin
 *   sel % 4 == 2  CKPT: body laid over struct rps__ckpt_req + targets
 *   sel % 4 == 3  body[0] is any message type, the rest its raw body
 * Structure-aware unless sel bit 7 is set: the uri / checkpoint name are
 * terminated, ntargets agrees with the length, and timeouts are capped at
 * 300 ms.  The checkpoint name is fuzzed as it comes: the server must keep
 * every one under its --checkpoint-dir (the scratch directory) or refuse
 * it.  Always, for safety: a member uri that names a host other than
 * 127.0.0.1 is pointed at 127.0.0.1 (the server would dial it).  The server's state
 * carries over from input to input, as a real server's does.
 */
#include "config.h"
#include "fuzz_common.h"
#include "common/common.h"
#include "client/ctl.h"
#include "proto/proto.h"
#include "control/daemon.h"
#include "server/server.h"
#include "proto/smap.h"
#include "transport/uri.h"

#include <pthread.h>

static struct rps__daemon *srv;
static struct rps__uri addr;
static struct rps__ctl *ctl;
static char ckpt_dir[256];

static void *serve(void *arg)
{
	(void)arg;
	rps__daemon_run(srv);
	return NULL;
}

static struct rps__ctl *channel(void)
{
	int i;

	for (i = 0; !ctl && i < 50; i++) {
		if (rps__ctl_open(&addr, 2000, &ctl)) {
			ctl = NULL;
			usleep(10000);
		}
	}
	FUZZ_CHECK(ctl);
	return ctl;
}

static int call(unsigned type, const void *body, size_t len, void *reply, size_t cap, size_t *rlen,
		int32_t *status, int timeout_ms)
{
	int ret = rps__ctl_call(channel(), type, body, len, reply, cap, rlen, status, timeout_ms);
	if (ret == -ECONNRESET || ret == -EBADMSG) {
		rps__ctl_close(ctl);
		ctl = NULL;
	}
	return ret;
}

static void status_check(void)
{
	static char rep[RPS__BIG_MSG_MAX];
	static struct rps__smap m;
	size_t len = 0;
	int32_t st = 0;

	if (call(RPS__MSG_STATUS, NULL, 0, rep, sizeof(rep), &len, &st, 5000) || st)
		return;
	FUZZ_CHECK(len >= sizeof(struct rps__status_rep));
	if (len > sizeof(struct rps__status_rep)) {
		int ret = rps__smap_decode(rep + sizeof(struct rps__status_rep), len - sizeof(struct rps__status_rep), &m);
		if (ret)
			fprintf(stderr, "the server's own map does not decode: %s\n", rps__errbuf());
		FUZZ_CHECK(ret == 0);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct rps__server_config cfg;
	static char data_dir[256];
	struct rps__status_rep rep;
	pthread_t th;
	int i;

	signal(SIGPIPE, SIG_IGN);
	rps__log_level = getenv("RPS_FUZZ_VERBOSE") ? RPS__LOG_DEBUG : -1;
	/* the server's loopback key and the channel's: in the scratch
	 * directory, never a ~/.rdmaps/loopback.key another server of this
	 * user left (doc/security.md) */
	FUZZ_CHECK(setenv("RDMAPS_RUNTIME_DIR", fuzz_scratch_dir(), 1) == 0);
	snprintf(data_dir, sizeof(data_dir), "%s/data", fuzz_scratch_dir());
	snprintf(ckpt_dir, sizeof(ckpt_dir), "%s/ckpt", fuzz_scratch_dir());
	mkdir(ckpt_dir, 0700);
	rps__server_config_init(&cfg);
	FUZZ_CHECK(rps__uri_parse("tcp://127.0.0.1:0", &cfg.listen) == 0);
	cfg.data_dir = data_dir;
	cfg.fsync_none = 1;
	cfg.no_pin = 1;
	cfg.npart = 8;
	cfg.tick_ms = 10;
	cfg.move_timeout_ms = 500;
	cfg.drain_ms = 100;
	cfg.mem_limit = 64u << 20;
	cfg.topology = fuzz_topology();
	cfg.ckpt_dir = ckpt_dir;
	if (rps__daemon_create(&cfg, &srv)) {
		fprintf(stderr, "fuzz_admin: starting the server: %s\n", rps__errbuf());
		abort();
	}
	addr = cfg.listen;
	addr.port = rps__daemon_port(srv);
	FUZZ_CHECK(pthread_create(&th, NULL, serve, NULL) == 0);
	pthread_detach(th);
	/* wait until it leads its one-member group */
	for (i = 0; i < 500; i++) {
		static char buf[RPS__BIG_MSG_MAX];
		size_t len = 0;
		int32_t st = 0;
		if (!call(RPS__MSG_STATUS, NULL, 0, buf, sizeof(buf), &len, &st, 2000) && !st && len >= sizeof(rep)) {
			memcpy(&rep, buf, sizeof(rep));
			if (rep.role == 3 /* RPS__RAFT_LEADER */)
				break;
		}
		usleep(10000);
	}
	FUZZ_CHECK(i < 500);
	return 0;
}

/* A uri the server may dial: anything that does not parse goes as it is
 * (the server must refuse it), a parsed one is pointed at 127.0.0.1. */
static void tame_uri(char *uri, size_t cap)
{
	struct rps__uri u;

	if (!memchr(uri, '\0', cap) || rps__uri_parse(uri, &u))
		return;
	if (strcmp(u.host, "127.0.0.1"))
		snprintf(uri, cap, "tcp://127.0.0.1:%u", u.port);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char rep[RPS__BIG_MSG_MAX];
	const bool raw = size && (data[0] & 0x80);
	size_t len = 0;
	int32_t st = 0;

	if (size < 1)
		return 0;
	switch (data[0] % 4) {
	case 0:
		status_check();
		return 0;
	case 1: {
		struct rps__admin a = { 0 };
		memcpy(&a, data + 1, RPS__MIN(size - 1, sizeof(a)));
		if (!raw) {
			a.uri[sizeof(a.uri) - 1] = '\0';
			a.timeout_ms = a.timeout_ms % 301;
		}
		tame_uri(a.uri, sizeof(a.uri));
		if (!call(RPS__MSG_ADMIN, &a, sizeof(a), rep, sizeof(rep), &len, &st, 2000) && len) {
			FUZZ_CHECK(len == sizeof(struct rps__admin_rep));
			FUZZ_CHECK(memchr(((struct rps__admin_rep *)(void *)rep)->msg, '\0', 256));
		}
		break;
	}
	case 2: {
		size_t blen = RPS__MAX(size - 1, sizeof(struct rps__ckpt_req));
		char *body = calloc(1, blen);
		struct rps__ckpt_req *c = (void *)body;
		FUZZ_CHECK(body);
		memcpy(body, data + 1, size - 1);
		if (!raw) {
			c->ntargets = (uint32_t)((blen - sizeof(*c)) / sizeof(struct rps__ckpt_target));
			blen = sizeof(*c) + c->ntargets * sizeof(struct rps__ckpt_target);
			c->timeout_ms %= 301;
			c->level %= 4;
			c->name[sizeof(c->name) - 1] = '\0';
		}
		if (!call(RPS__MSG_CKPT, body, blen, rep, sizeof(rep), &len, &st, 2000) && len)
			FUZZ_CHECK(len >= sizeof(struct rps__ckpt_rep));
		free(body);
		break;
	}
	case 3: {
		unsigned type = size > 1 ? data[1] % RPS__MSG_TYPE_MAX : RPS__MSG_STATUS;
		size_t blen = size > 2 ? size - 2 : 0;
		if (type == RPS__MSG_CKPT || type == RPS__MSG_ADMIN)
			return 0;	/* taken care of above, with their safety rules */
		(void)call(type, data + 2, blen, rep, sizeof(rep), &len, &st, 200);
		break;
	}
	}
	/* whatever it was, the server still answers and its map still decodes */
	status_check();
	return 0;
}
