/*
 * gen_corpus.c - writes the seed corpora of the libFuzzer harnesses
 * (tests/fuzz/corpus/<name>/) with the product's own encoders, so the
 * seeds are valid inputs the fuzzer mutates from.  The committed corpora
 * came from this program; rerun it after a format change:
 *
 *   tests/fuzz/build.sh ... (any harness), then
 *   clang ... gen_corpus.c libfuzzcore.a (see `make fuzz-seeds`)
 *   gen_corpus tests/fuzz/corpus
 *
 * The TCP harness writes its own seeds (RPS_FUZZ_WRITE_SEEDS): the frame
 * encoders are static in tcp.c.
 */
#include "config.h"
#include "control/ckpt.h"
#include "common/common.h"
#include "common/le.h"
#include "proto/proto.h"
#include "control/raft.h"
#include "rdmaps.h"
#include "proto/smap.h"
#include "control/wal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(cond)                                                                     \
	do {                                                                            \
		if (!(cond)) {                                                          \
			fprintf(stderr, "gen_corpus: %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, rps__errbuf()); \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

static const char *root;

static void put(const char *target, const char *name, const void *p, size_t n)
{
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
	f = fopen(path, "wb");
	CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

/* [prefix bytes][p] */
static void put2(const char *target, const char *name, const void *pre, size_t npre, const void *p, size_t n)
{
	uint8_t *b = malloc(npre + n);
	CHECK(b);
	memcpy(b, pre, npre);
	if (n)
		memcpy(b + npre, p, n);
	put(target, name, b, npre + n);
	free(b);
}

static size_t read_file(const char *path, uint8_t **out)
{
	FILE *f = fopen(path, "rb");
	long n;

	CHECK(f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0);
	*out = malloc((size_t)n + 1);
	CHECK(*out && fread(*out, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	return (size_t)n;
}

/* ---- shard map ------------------------------------------------------------ */

static const char *const uris[] = { "tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000", "tcp://10.0.0.3:7000" };

static size_t enc_cmd(const struct rps__smap_cmd *c, uint8_t *buf)
{
	size_t len;
	CHECK(rps__smap_cmd_encode(c, buf, RPS__SMAP_CMD_MAX, &len) == 0);
	return len;
}

static void gen_smap(void)
{
	static struct rps__smap m;
	static uint8_t buf[RPS__SMAP_ENC_MAX + 1], seq[4096];
	struct rps__smap_cmd cmds[] = {
		{ .type = RPS__SMAP_ADD_MEMBER, .id = 4, .uri = "tcp://10.0.0.4:7000" },
		{ .type = RPS__SMAP_MOVE_BEGIN, .part = 3, .from = 1, .to = 4, .epoch = 1 },
		{ .type = RPS__SMAP_MOVE_COMMIT, .part = 3, .to = 4, .epoch = 1 },
		{ .type = RPS__SMAP_MOVE_BEGIN, .part = 0, .from = 1, .to = 2, .epoch = 1 },
		{ .type = RPS__SMAP_MOVE_ABORT, .part = 0, .epoch = 1 },
		{ .type = RPS__SMAP_NOP },
		{ .type = RPS__SMAP_MOVE_BEGIN, .part = 3, .from = 4, .to = 1, .epoch = 2 },
		{ .type = RPS__SMAP_MOVE_COMMIT, .part = 3, .to = 1, .epoch = 2 },
		{ .type = RPS__SMAP_REMOVE_MEMBER, .id = 4 },
	};
	size_t len, n = 0, i;

	CHECK(rps__smap_init(&m, uris, 3, 8) == 0);
	buf[0] = 0;
	CHECK(rps__smap_encode(&m, buf + 1, sizeof(buf) - 1, &len) == 0);
	put("smap", "map-3-members", buf, len + 1);
	seq[n++] = 1;
	for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		uint8_t c[RPS__SMAP_CMD_MAX];
		size_t l = enc_cmd(&cmds[i], c);
		char name[64];
		uint8_t one[RPS__SMAP_CMD_MAX + 2] = { 1, (uint8_t)l };
		memcpy(one + 2, c, l);
		snprintf(name, sizeof(name), "cmd-%s-%zu", rps__smap_cmd_name(cmds[i].type), i);
		put("smap", name, one, l + 2);
		seq[n++] = (uint8_t)l;
		memcpy(seq + n, c, l);
		n += l;
		CHECK(rps__smap_apply(&m, i + 2, &cmds[i]) == 0);
		if (i == 3) {	/* a map with a move in progress and 4 members */
			buf[0] = 0;
			CHECK(rps__smap_encode(&m, buf + 1, sizeof(buf) - 1, &len) == 0);
			put("smap", "map-moving", buf, len + 1);
		}
	}
	put("smap", "cmds-all", seq, n);
}

/* ---- raft ----------------------------------------------------------------- */

static size_t enc_raft(const struct rps__raft_msg *m, uint8_t *buf, size_t cap)
{
	size_t len;
	CHECK(rps__raft_msg_encode(m, buf, cap, &len) == 0);
	return len;
}

/* a harness chunk: [op][u16 len][bytes] */
static size_t chunk(uint8_t *out, uint8_t op, const void *p, size_t n)
{
	out[0] = op;
	out[1] = (uint8_t)n;
	out[2] = (uint8_t)(n >> 8);
	if (n)
		memcpy(out + 3, p, n);
	return 3 + n;
}

static void gen_raft(void)
{
	static uint8_t in[8192], enc[4096];
	uint8_t cmdbuf[RPS__SMAP_CMD_MAX];
	struct rps__smap_cmd nop = { .type = RPS__SMAP_NOP };
	size_t clen = enc_cmd(&nop, cmdbuf), n, l;
	struct rps__raft_entry ents[2] = {
		{ .term = 2, .index = 2, .type = RPS__RAFT_ENTRY_NORMAL, .len = 0, .data = NULL },
		{ .term = 2, .index = 3, .type = RPS__RAFT_ENTRY_NORMAL, .len = (uint32_t)clen, .data = cmdbuf },
	};
	uint64_t snapdata = 0x1122334455667788ull;
	struct rps__raft_snapshot snap = {
		.index = 5, .term = 2, .conf = { .n_voters = 3, .voters = { 1, 2, 3 } }, .len = 8, .data = &snapdata,
	};
	struct rps__raft_msg msgs[] = {
		{ .type = RPS__RAFT_MSG_APP, .from = 2, .to = 1, .term = 2, .log_term = 1, .index = 1, .commit = 2,
		  .n_entries = 2, .entries = ents },
		{ .type = RPS__RAFT_MSG_HEARTBEAT, .from = 2, .to = 1, .term = 2, .commit = 3, .context = 9 },
		{ .type = RPS__RAFT_MSG_SNAP, .from = 2, .to = 1, .term = 2, .snapshot = &snap },
		{ .type = RPS__RAFT_MSG_VOTE, .from = 3, .to = 1, .term = 3, .log_term = 1, .index = 1 },
		{ .type = RPS__RAFT_MSG_PRE_VOTE, .from = 3, .to = 1, .term = 3, .log_term = 1, .index = 1 },
		{ .type = RPS__RAFT_MSG_TIMEOUT_NOW, .from = 2, .to = 1, .term = 2 },
		{ .type = RPS__RAFT_MSG_READ_INDEX, .from = 2, .to = 1, .term = 2, .context = 77 },
		{ .type = RPS__RAFT_MSG_READ_INDEX_RESP, .from = 2, .to = 1, .term = 2, .index = 3, .context = 77 },
		{ .type = RPS__RAFT_MSG_VOTE_RESP, .from = 2, .to = 1, .term = 2 },
		{ .type = RPS__RAFT_MSG_PRE_VOTE_RESP, .from = 2, .to = 1, .term = 2 },
		{ .type = RPS__RAFT_MSG_HEARTBEAT_RESP, .from = 2, .to = 1, .term = 2, .context = 9 },
	};
	size_t i;

	/* as a follower: each message alone, then all of them with ticks between */
	n = 0;
	in[n++] = 0;
	for (i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
		char name[64];
		uint8_t one[4096];
		l = enc_raft(&msgs[i], enc, sizeof(enc));
		one[0] = 0;
		snprintf(name, sizeof(name), "follower-%s", rps__raft_msg_type_name(msgs[i].type));
		put("raft", name, one, 1 + chunk(one + 1, 3, enc, l));
		n += chunk(in + n, 3, enc, l);
		n += chunk(in + n, 1 | 3 << 2, NULL, 0);
	}
	put("raft", "follower-all", in, n);

	/* as the leader of 1, 2, 3 (term 2): proposals, acks, a reject with a hint */
	{
		struct rps__raft_msg acks[] = {
			{ .type = RPS__RAFT_MSG_APP_RESP, .from = 2, .to = 1, .term = 2, .index = 3 },
			{ .type = RPS__RAFT_MSG_APP_RESP, .from = 3, .to = 1, .term = 2, .index = 2, .reject = 1,
			  .hint = 1, .log_term = 1 },
			{ .type = RPS__RAFT_MSG_HEARTBEAT_RESP, .from = 3, .to = 1, .term = 2 },
		};
		n = 0;
		in[n++] = 1;
		n += chunk(in + n, 2, cmdbuf, clen);
		n += chunk(in + n, 1 | 1 << 2, NULL, 0);
		for (i = 0; i < 3; i++) {
			l = enc_raft(&acks[i], enc, sizeof(enc));
			n += chunk(in + n, 3, enc, l);
		}
		n += chunk(in + n, 2, cmdbuf, clen);
		n += chunk(in + n, 1 | 12 << 2, NULL, 0);
		put("raft", "leader-propose-acks", in, n);
	}
	/* an APP_RESP with term 2^64-1 to a one-voter leader;
	 * it adopts the term, then campaigns at term 0 and writes an entry
	 * whose term went down */
	{
		struct rps__raft_msg bad = { .type = RPS__RAFT_MSG_APP_RESP, .from = 2, .to = 1, .term = UINT64_MAX,
					     .index = 1 };
		n = 0;
		in[n++] = 3;	/* the sole voter (the one-server cluster) */
		l = enc_raft(&bad, enc, sizeof(enc));
		n += chunk(in + n, 0, enc, l);	/* from 2, not a member */
		n += chunk(in + n, 1 | 40 << 2, NULL, 0);
		put("raft", "issue10-item3-term-max-app-resp", in, n);
	}
}

/* ---- wire messages ---------------------------------------------------------- */

static void msg(const char *name, unsigned type, int32_t status, const void *body, size_t len)
{
	static uint8_t buf[RPS__BIG_MSG_MAX];
	size_t n = rps__msg_build(buf, type, 7, status, body, len);
	put("proto", name, buf, n);
}

static void gen_proto(void)
{
	static uint8_t buf[RPS__BIG_MSG_MAX];
	size_t len;

	{
		struct rps__hello h = { .magic = RPS__HELLO_MAGIC, .version = RPS__PROTO_VERSION, .rank = 0,
					.num_workers = 2, .client_id = 0xfeedu };
		msg("hello", RPS__MSG_HELLO, 0, &h, sizeof(h));
	}
	{
		struct rps__hello_rep h = { .magic = RPS__HELLO_MAGIC, .version = RPS__PROTO_VERSION, .member_id = 1,
					    .map_len = RPS__MAP_BUF, .shard_elems = 1024, .nslots = 4,
					    .slot_size = 4160, .owner = 3, .lease_ms = 5000 };
		msg("hello-rep", RPS__MSG_HELLO_REP, 0, &h, sizeof(h));
	}
	{
		struct rps__create c = { .name = "layer0.weight",
					 .spec = { .count = 4096, .dtype = RPS_DTYPE_F32, .mode = RPS_MODE_SYNC,
						   .optimizer = RPS_OPT_SGD, .lr = 0.1f, .num_workers = 2 },
					 .flags = RPS__CREATE_HAS_INIT };
		struct rps__create_rep r = { .spec = c.spec, .tensor_id = 1, .created = 1, .stride = 4096,
					     .map_applied = 3, .nregions = 2, .total = 2,
					     .regions = { { .addr = 0x1000, .rkey = 0x40000, .part = 0, .epoch = 1 },
							  { .addr = 0x2000, .rkey = 0x40001, .part = 1, .epoch = 1 } } };
		msg("create", RPS__MSG_CREATE, 0, &c, sizeof(c));
		msg("create-rep", RPS__MSG_CREATE_REP, 0, &r, sizeof(r));
		msg("create-rep-error", RPS__MSG_CREATE_REP, -ENOENT, NULL, 0);
	}
	{
		struct rps__push_ack a = { .slot = 1, .shard = 2, .version = 3 };
		struct rps__wait w = { .tensor_id = 1, .shard = 2, .min_version = 3 };
		struct rps__wait_rep wr = { .version = 3, .min_clock = 2 };
		struct rps__barrier b = { .generation = 4 };
		msg("push-ack", RPS__MSG_PUSH_ACK, 0, &a, sizeof(a));
		msg("wait", RPS__MSG_WAIT, 0, &w, sizeof(w));
		msg("wait-rep", RPS__MSG_WAIT_REP, 0, &wr, sizeof(wr));
		msg("barrier", RPS__MSG_BARRIER, 0, &b, sizeof(b));
		msg("barrier-rep", RPS__MSG_BARRIER_REP, 0, NULL, 0);
	}
	{
		struct rps__raft_msg m = { .type = RPS__RAFT_MSG_HEARTBEAT, .from = 2, .to = 1, .term = 2, .commit = 3 };
		len = enc_raft(&m, buf, sizeof(buf));
		msg("raft", RPS__MSG_RAFT, 0, buf, len);
	}
	{
		struct rps__smap_cmd c = { .type = RPS__SMAP_ADD_MEMBER, .id = 4, .uri = "tcp://10.0.0.4:7000" };
		struct rps__propose_rep r = { .index = 9, .leader = 2 };
		len = enc_cmd(&c, buf);
		msg("propose", RPS__MSG_PROPOSE, 0, buf, len);
		msg("propose-rep", RPS__MSG_PROPOSE_REP, 0, &r, sizeof(r));
	}
	{
		struct rps__migrate m = { .part = 3, .epoch = 2, .from = 1, .addr = 0x1000, .rkey = 0x40000, .len = 128 };
		msg("migrate", RPS__MSG_MIGRATE, 0, &m, sizeof(m));
		msg("migrate-rep", RPS__MSG_MIGRATE_REP, 0, NULL, 0);
		msg("status", RPS__MSG_STATUS, 0, NULL, 0);
	}
	{
		static struct rps__smap m;
		struct rps__status_rep *r = (void *)buf;
		memset(r, 0, sizeof(*r));
		r->id = 1;
		r->term = 2;
		r->role = 3;
		r->n_voters = 3;
		r->voters[0] = 1;
		r->voters[1] = 2;
		r->voters[2] = 3;
		CHECK(rps__smap_init(&m, uris, 3, 8) == 0);
		CHECK(rps__smap_encode(&m, buf + sizeof(*r), sizeof(buf) - sizeof(*r), &len) == 0);
		msg("status-rep", RPS__MSG_STATUS_REP, 0, buf, sizeof(*r) + len);
	}
	{
		struct rps__admin a = { .op = RPS__ADMIN_ADD_SERVER, .id = 4, .uri = "tcp://10.0.0.4:7000" };
		struct rps__admin_rep r = { .leader = 1, .index = 5, .msg = "" };
		msg("admin", RPS__MSG_ADMIN, 0, &a, sizeof(a));
		msg("admin-rep", RPS__MSG_ADMIN_REP, 0, &r, sizeof(r));
		snprintf(r.msg, sizeof(r.msg), "not the leader: ask the leader");
		msg("admin-rep-eperm", RPS__MSG_ADMIN_REP, -EPERM, &r, sizeof(r));
	}
	{
		struct rps__ckpt_req *c = (void *)buf;
		struct rps__ckpt_target *t = (void *)(buf + sizeof(*c));
		memset(buf, 0, sizeof(*c) + 2 * sizeof(*t));
		c->op = RPS__CKPT_TAKE;
		c->ntargets = 2;
		c->ckpt_id = 11;
		c->level = 1;
		snprintf(c->name, sizeof(c->name), "run1/step3");
		snprintf(t[0].name, sizeof(t[0].name), "a");
		t[0].step = 3;
		snprintf(t[1].name, sizeof(t[1].name), "b");
		t[1].step = 4;
		msg("ckpt", RPS__MSG_CKPT, 0, buf, sizeof(*c) + 2 * sizeof(*t));
	}
	{
		struct rps__ckpt_rep *c = (void *)buf;
		struct rps__ckpt_target *t = (void *)(buf + sizeof(*c));
		memset(buf, 0, sizeof(*c) + sizeof(*t));
		c->ntargets = 1;
		c->nshards = 8;
		snprintf(t[0].name, sizeof(t[0].name), "a");
		t[0].step = 3;
		msg("ckpt-rep", RPS__MSG_CKPT_REP, 0, buf, sizeof(*c) + sizeof(*t));
	}
	{
		/* a push descriptor and its data, as a staging slot holds them */
		struct rps__push_desc *d = (void *)buf;
		memset(buf, 0, 64 + 32);
		d->magic = RPS__DESC_MAGIC;
		d->kind = RPS__PUSH_GRAD;
		d->dtype = RPS_DTYPE_F32;
		d->tensor_id = 1;
		d->nbytes = 32;
		d->push_id = 5;
		d->epoch = 1;
		memset(buf + 64, 0x3f, 32);
		d->flags = RPS__DESC_CRC;
		d->crc = rps__push_crc(d);
		put("proto", "push-desc", buf, 64 + 32);
	}
	{
		/* HELLO_REP of 24 bytes with status -1 (libFuzzer found it) */
		static const uint8_t item14[] = {
			0x53, 0x50, 0x02, 0x00, 0x18, 0x00, 0x00, 0x00, 0x01, 0x00, 0x04, 0x00,
			0x00, 0x00, 0x00, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00,
		};
		put("proto", "issue10-item14-hello-rep-header-only", item14, sizeof(item14));
		/* its server-side twin: a header-only CREATE with status -1 */
		msg("issue10-item14-create-header-only", RPS__MSG_CREATE, -1, NULL, 0);
	}
}

/* ---- WAL ------------------------------------------------------------------- */

static int no_sync(int fd, bool data_only, void *ctx)
{
	(void)fd; (void)data_only; (void)ctx;
	return 0;
}

static void rm_dir(const char *dir)
{
	char path[1024];
	struct dirent *de;
	DIR *d = opendir(dir);
	if (!d)
		return;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
			unlink(path);
		}
	closedir(d);
	rmdir(dir);
}

/* the first file of dir whose name starts with prefix */
static size_t first_file(const char *dir, const char *prefix, uint8_t **out)
{
	char path[1024], best[256] = "";
	struct dirent *de;
	DIR *d = opendir(dir);

	CHECK(d);
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, prefix, strlen(prefix)) && !strstr(de->d_name, ".tmp") &&
		    (!best[0] || strcmp(de->d_name, best) < 0))
			snprintf(best, sizeof(best), "%s", de->d_name);
	closedir(d);
	CHECK(best[0]);
	snprintf(path, sizeof(path), "%s/%s", dir, best);
	return read_file(path, out);
}

static void wal_seed(const char *name, uint8_t mode, const uint8_t *seg, size_t seglen, const uint8_t *snap,
		     size_t snaplen)
{
	uint8_t *b = malloc(5 + seglen + snaplen);
	uint32_t l = htole32((uint32_t)seglen);
	CHECK(b);
	b[0] = mode;
	memcpy(b + 1, &l, 4);
	if (seglen)
		memcpy(b + 5, seg, seglen);
	if (snaplen)
		memcpy(b + 5 + seglen, snap, snaplen);
	put("wal", name, b, 5 + seglen + snaplen);
	free(b);
}

static void gen_wal(void)
{
	char dir[] = "/tmp/rps-gen-wal-XXXXXX";
	struct rps__wal_opts o = { .fsync = RPS__WAL_FSYNC_ALWAYS, .sync_fn = no_sync };
	struct rps__wal *w;
	struct rps__wal_hard_state hs = { .term = 1, .vote = 1, .commit = 0 };
	struct rps__wal_entry e[3] = {
		{ .term = 1, .index = 1, .type = 0, .data = "a", .len = 1 },
		{ .term = 1, .index = 2, .type = 1, .data = "conf", .len = 4 },
		{ .term = 2, .index = 3, .type = 0, .data = "", .len = 0 },
	};
	uint8_t *seg, *snap;
	size_t seglen, snaplen;
	uint64_t voters[] = { 1, 2, 3 }, learners[] = { 4 };
	struct rps__wal_snapshot s = { .index = 2, .term = 1, .voters = voters, .n_voters = 3,
				       .learners = learners, .n_learners = 1, .data = "state", .len = 5 };

	CHECK(mkdtemp(dir));
	CHECK(rps__wal_open(dir, &o, &w, NULL) == 0);
	CHECK(rps__wal_save(w, &hs, e, 2) == 0);
	hs.term = 2;
	hs.commit = 2;
	CHECK(rps__wal_save(w, &hs, &e[2], 1) == 0);
	rps__wal_close(w);
	seglen = first_file(dir, "wal-", &seg);
	wal_seed("segment", 1, seg, seglen, NULL, 0);
	wal_seed("segment-fixed-name", 1 | 4, seg, seglen, NULL, 0);
	free(seg);

	CHECK(rps__wal_open(dir, &o, &w, NULL) == 0);
	CHECK(rps__wal_save_snapshot(w, &s) == 0);
	rps__wal_close(w);
	seglen = first_file(dir, "wal-", &seg);
	snaplen = first_file(dir, "snap-", &snap);
	wal_seed("segment-and-snapshot", 3, seg, seglen, snap, snaplen);
	wal_seed("snapshot", 2, NULL, 0, snap, snaplen);
	free(seg);
	free(snap);
	rm_dir(dir);
}

/* ---- checkpoint files ------------------------------------------------------- */

static void gen_ckpt(void)
{
	char dir[] = "/tmp/rps-gen-ckpt-XXXXXX", path[1024];
	struct rps__ckpt_header h = { .member_id = 1, .npart = 8, .shard_elems = 8, .ckpt_id = 5, .time_ns = 1 };
	struct rps__tensor_spec sync = { .count = 16, .dtype = RPS_DTYPE_F32, .mode = RPS_MODE_SYNC,
					 .optimizer = RPS_OPT_MOMENTUM, .lr = 0.1f, .momentum = 0.9f, .num_workers = 2 };
	struct rps__tensor_spec bounded = { .count = 8, .dtype = RPS_DTYPE_F32, .mode = RPS_MODE_BOUNDED,
					    .staleness = 1, .optimizer = RPS_OPT_SUM, .num_workers = 2 };
	float params[8], state[8];
	uint64_t clocks[2] = { 3, 4 };
	int level;

	for (int i = 0; i < 8; i++) {
		params[i] = (float)i * 0.5f;
		state[i] = 0.25f;
	}
	CHECK(mkdtemp(dir));
	for (level = 0; level <= 1; level++) {
		struct rps__ckpt_writer *w;
		struct rps__ckpt_shard s0 = { .index = 0, .elems = 8, .version = 3, .flags = RPS__CKPT_SHARD_READY,
					      .params = params, .nstate = 8, .state = state };
		struct rps__ckpt_shard s1 = s0;
		struct rps__ckpt_shard b0 = { .index = 0, .elems = 8, .version = 4, .min_clock = 3,
					      .flags = RPS__CKPT_SHARD_READY, .nclocks = 2, .clocks = clocks,
					      .params = params };
		uint8_t *f;
		size_t n;

		s1.index = 1;
		CHECK(rps__ckpt_create(dir, &h, level, &w) == 0);
		CHECK(rps__ckpt_put_tensor(w, "w", &sync) == 0);
		CHECK(rps__ckpt_put_shard(w, &s0) == 0);
		CHECK(rps__ckpt_put_shard(w, &s1) == 0);
		CHECK(rps__ckpt_put_tensor(w, "b", &bounded) == 0);
		CHECK(rps__ckpt_put_shard(w, &b0) == 0);
		CHECK(rps__ckpt_finish(w, NULL) == 0);
		snprintf(path, sizeof(path), "%s/member-1.rpsck", dir);
		n = read_file(path, &f);
		put("ckpt", level ? "two-tensors-deflated" : "two-tensors-stored", f, n);
		free(f);
	}
	{
		struct rps__ckpt_writer *w;
		uint8_t *f;
		size_t n;
		CHECK(rps__ckpt_create(dir, &h, 0, &w) == 0);
		CHECK(rps__ckpt_finish(w, NULL) == 0);
		n = read_file(path, &f);
		put("ckpt", "empty", f, n);
		free(f);
	}
	rm_dir(dir);
}

/* ---- admin requests ---------------------------------------------------------- */

static void admin(const char *name, uint8_t sel, const void *body, size_t len)
{
	put2("admin", name, &sel, 1, body, len);
}

static void gen_admin(void)
{
	struct rps__admin a;
	uint8_t buf[1024];

	admin("status", 0, NULL, 0);
	memset(&a, 0, sizeof(a));
	a.op = RPS__ADMIN_NOP;
	a.timeout_ms = 200;
	admin("nop", 1, &a, sizeof(a));
	a.op = RPS__ADMIN_MOVE;
	a.part = 3;
	a.id = 1;
	admin("move-to-self", 1, &a, sizeof(a));
	a.op = RPS__ADMIN_ADD_SERVER;
	a.id = 2;
	snprintf(a.uri, sizeof(a.uri), "tcp://127.0.0.1:1");
	admin("add-server", 1, &a, sizeof(a));
	a.op = RPS__ADMIN_MOVE;
	a.part = 5;
	admin("move-to-2", 1, &a, sizeof(a));
	/* the server took a member uri psctl would refuse */
	a.op = RPS__ADMIN_ADD_SERVER;
	a.id = 3;
	snprintf(a.uri, sizeof(a.uri), "\x01\x02garbage");
	admin("issue10-item11-add-server-garbage-uri", 1, &a, sizeof(a));
	a.id = 2;
	a.op = RPS__ADMIN_REMOVE_SERVER;
	admin("remove-server", 1, &a, sizeof(a));
	a.op = RPS__ADMIN_TRANSFER_LEADER;
	a.id = 0;
	admin("transfer-leader", 1, &a, sizeof(a));
	{
		struct rps__ckpt_req *c = (void *)buf;
		struct rps__ckpt_target *t = (void *)(buf + sizeof(*c));
		uint32_t op;
		for (op = RPS__CKPT_PREPARE; op <= RPS__CKPT_FINISH; op++) {
			static const char *const names[] = { "", "ckpt-prepare", "ckpt-take", "ckpt-abort",
							     "ckpt-restore", "ckpt-finish" };
			memset(buf, 0, sizeof(*c) + sizeof(*t));
			c->op = op;
			c->ckpt_id = 3;
			c->timeout_ms = 200;
			c->ntargets = op == RPS__CKPT_TAKE;
			snprintf(t->name, sizeof(t->name), "w");
			admin(names[op], 2, buf, sizeof(*c) + c->ntargets * sizeof(*t));
		}
	}
	buf[0] = RPS__MSG_HELLO;
	admin("raw-hello-on-admin", 3, buf, 1);
	buf[0] = RPS__MSG_STATUS;
	admin("raw-status", 3, buf, 1);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_corpus DIR (writes DIR/<target>/...)\n");
		return 2;
	}
	root = argv[1];
	mkdir(root, 0755);
	gen_smap();
	gen_raft();
	gen_proto();
	gen_wal();
	gen_ckpt();
	gen_admin();
	return 0;
}
