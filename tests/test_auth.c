/*
 * test_auth.c - unit tests of keys and the handshake's proofs
 * (src/proto/auth_keys.c, auth_handshake.c): key files (made, read, refused), derivation bound to
 * role and scope, the connector's and the server's halves against each
 * other, and every way a proof must fail: another key, another role,
 * another scope, a replayed transcript, another pair of endpoints, a
 * server proof taken for a client's.
 */
#include "config.h"
#include "common/common.h"
#include "proto/auth.h"
#include "proto/proto.h"
#include "lib/cutest.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static int suite_init(void)
{
	snprintf(dir, sizeof(dir), "/tmp/rps-test-auth.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int suite_clean(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static const char *path(const char *name)
{
	static char p[4][128];
	static int i;

	i = (i + 1) % 4;
	snprintf(p[i], sizeof(p[i]), "%s/%s", dir, name);
	return p[i];
}

static void write_file(const char *p, const char *text, mode_t mode)
{
	int fd;

	unlink(p);
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, mode);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL((size_t)write(fd, text, strlen(text)), strlen(text));
	fchmod(fd, mode);
	close(fd);
}

static void test_keygen_roundtrip(void)
{
	struct rps__key c, w, w2, again;
	struct stat st;

	CU_ASSERT_EQUAL_FATAL(rps__key_write(path("c.key"), RPS__KEY_CLUSTER, NULL, NULL), 0);
	CU_ASSERT_EQUAL(stat(path("c.key"), &st), 0);
	CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("c.key"), &c), 0);
	CU_ASSERT_EQUAL(c.role, RPS__KEY_CLUSTER);
	CU_ASSERT_EQUAL(c.len, 32);
	CU_ASSERT_EQUAL(c.id, rps__key_id(c.secret, c.len));
	/* never over an existing file */
	CU_ASSERT_EQUAL(rps__key_write(path("c.key"), RPS__KEY_CLUSTER, NULL, NULL), -EEXIST);
	CU_ASSERT(strstr(rps__errbuf(), "never overwritten") != NULL);
	/* a derived key reads back as the derivation gives it */
	CU_ASSERT_EQUAL_FATAL(rps__key_write(path("w.key"), RPS__KEY_WORKER, "jobA/", &c), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("w.key"), &w), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_derive(&c, RPS__KEY_WORKER, "jobA/", &w2), 0);
	CU_ASSERT_EQUAL(w.role, RPS__KEY_WORKER);
	CU_ASSERT_STRING_EQUAL(w.scope, "jobA/");
	CU_ASSERT_EQUAL(w.id, c.id);
	CU_ASSERT_EQUAL(w.len, 32);
	CU_ASSERT_EQUAL(memcmp(w.secret, w2.secret, 32), 0);
	/* a second cluster key differs (random), and so does its id */
	CU_ASSERT_EQUAL_FATAL(rps__key_write(path("c2.key"), RPS__KEY_CLUSTER, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("c2.key"), &again), 0);
	CU_ASSERT(memcmp(again.secret, c.secret, 32) != 0);
	CU_ASSERT(again.id != c.id);
	/* only a cluster key derives */
	CU_ASSERT_EQUAL(rps__key_derive(&w, RPS__KEY_WORKER, "jobB/", &w2), -EINVAL);
}

static void test_derivation_bound(void)
{
	struct rps__key c, a, b, r, adm, peer, x;

	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("c.key"), &c), 0);
	CU_ASSERT_EQUAL(rps__key_derive(&c, RPS__KEY_WORKER, "jobA/", &a), 0);
	CU_ASSERT_EQUAL(rps__key_derive(&c, RPS__KEY_WORKER, "jobB/", &b), 0);
	CU_ASSERT_EQUAL(rps__key_derive(&c, RPS__KEY_READER, "jobA/", &r), 0);
	CU_ASSERT_EQUAL(rps__key_derive(&c, RPS__KEY_ADMIN, "ignored", &adm), 0);
	CU_ASSERT_EQUAL(rps__key_derive(&c, RPS__KEY_PEER, NULL, &peer), 0);
	CU_ASSERT(memcmp(a.secret, b.secret, 32) != 0);		/* scope */
	CU_ASSERT(memcmp(a.secret, r.secret, 32) != 0);		/* role */
	CU_ASSERT(memcmp(adm.secret, peer.secret, 32) != 0);
	CU_ASSERT_STRING_EQUAL(adm.scope, "");			/* admin and peer have none */
	CU_ASSERT_EQUAL(rps__key_derive(&c, RPS__KEY_WORKER, "jobA/", &x), 0);
	CU_ASSERT_EQUAL(memcmp(a.secret, x.secret, 32), 0);	/* deterministic */
	/* a prefix of a scope is another scope */
	CU_ASSERT_EQUAL(rps__key_derive(&c, RPS__KEY_WORKER, "jobA", &x), 0);
	CU_ASSERT(memcmp(a.secret, x.secret, 32) != 0);
	CU_ASSERT(rps__key_may(RPS__KEY_CLUSTER, RPS__KEY_PEER));
	CU_ASSERT(rps__key_may(RPS__KEY_WORKER, RPS__KEY_WORKER));
	CU_ASSERT(!rps__key_may(RPS__KEY_WORKER, RPS__KEY_ADMIN));
	CU_ASSERT(!rps__key_may(RPS__KEY_READER, RPS__KEY_WORKER));
}

static void test_key_files_refused(void)
{
	struct rps__key k;
	char hex[80];

	/* readable by others: refused, saying how to fix it */
	CU_ASSERT_EQUAL_FATAL(rps__key_write(path("open.key"), RPS__KEY_CLUSTER, NULL, NULL), 0);
	chmod(path("open.key"), 0644);
	CU_ASSERT_EQUAL(rps__key_load(path("open.key"), &k), -EPERM);
	CU_ASSERT(strstr(rps__errbuf(), "chmod 600") != NULL);
	chmod(path("open.key"), 0640);
	CU_ASSERT_EQUAL(rps__key_load(path("open.key"), &k), -EPERM);
	/* a bare secret: 32 bytes hex or base64 make a cluster key; fewer do not */
	memset(hex, 'a', 64);
	strcpy(hex + 64, "\n");
	write_file(path("hex.key"), hex, 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("hex.key"), &k), 0);
	CU_ASSERT_EQUAL(k.role, RPS__KEY_CLUSTER);
	CU_ASSERT_EQUAL(k.len, 32);
	CU_ASSERT_EQUAL(k.secret[0], 0xaa);
	write_file(path("b64.key"), "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n", 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("b64.key"), &k), 0);
	CU_ASSERT_EQUAL(k.len, 32);
	CU_ASSERT_EQUAL(k.secret[31], 31);
	write_file(path("short.key"), "00112233445566778899aabbccddeeff\n", 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("short.key"), &k), -EINVAL);
	CU_ASSERT(strstr(rps__errbuf(), "16 bytes") != NULL);
	write_file(path("junk.key"), "not a key at all\n", 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("junk.key"), &k), -EINVAL);
	write_file(path("empty.key"), "# nothing\n", 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("empty.key"), &k), -EINVAL);
	CU_ASSERT(strstr(rps__errbuf(), "psctl keygen") != NULL);
	/* a derived key without the id of its cluster key, or a cluster key
	 * whose id does not match its secret (edited) */
	write_file(path("noid.key"), "role worker\nscope a/\nsecret "
		   "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("noid.key"), &k), -EINVAL);
	write_file(path("badid.key"), "role cluster\nid 1234\nsecret "
		   "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("badid.key"), &k), -EINVAL);
	CU_ASSERT(strstr(rps__errbuf(), "does not match") != NULL);
	write_file(path("role.key"), "role emperor\nsecret "
		   "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("role.key"), &k), -EINVAL);
	CU_ASSERT_EQUAL(rps__key_load(path("missing.key"), &k), -ENOENT);
}

/* The limits rdmapsd(8) gives: a key file of up to 4096 bytes is read, one
 * byte more is refused saying the limit; a secret of up to 128 bytes is
 * taken, a longer one is refused as too long (not as undecodable). */
static void test_key_file_limits(void)
{
	static char text[4200];
	struct rps__key k;

	/* one comment line, then 64 hex digits of secret and a newline */
	memset(text, 0, sizeof(text));
	memset(text, '#', 4096 - 65);
	text[4096 - 65 - 1] = '\n';
	memset(text + 4096 - 65, 'b', 64);
	text[4095] = '\n';
	CU_ASSERT_EQUAL_FATAL(strlen(text), 4096);
	write_file(path("full.key"), text, 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("full.key"), &k), 0);	/* exactly the limit: read */
	CU_ASSERT_EQUAL(k.len, 32);
	CU_ASSERT_EQUAL(k.secret[31], 0xbb);
	text[4096] = '\n';						/* one byte more */
	write_file(path("over.key"), text, 0600);
	rps__clearerr();
	CU_ASSERT_EQUAL(rps__key_load(path("over.key"), &k), -EFBIG);
	CU_ASSERT(strstr(rps__errbuf(), "over 4096 bytes") != NULL);
	CU_ASSERT(strchr(rps__errbuf(), '\n') == NULL);

	/* a secret of 128 bytes (256 hex digits) is a cluster key; 129 is not */
	memset(text, 0, sizeof(text));
	memcpy(text, "secret ", 7);
	memset(text + 7, 'c', 256);
	text[7 + 256] = '\n';
	write_file(path("long.key"), text, 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("long.key"), &k), 0);
	CU_ASSERT_EQUAL(k.len, 128);
	memset(text + 7, 'c', 258);
	text[7 + 258] = '\n';
	write_file(path("longer.key"), text, 0600);
	rps__clearerr();
	CU_ASSERT_EQUAL(rps__key_load(path("longer.key"), &k), -EINVAL);
	CU_ASSERT(strstr(rps__errbuf(), "the secret is 129 bytes, over the 128") != NULL);
	/* base64 too */
	memset(text, 0, sizeof(text));
	memcpy(text, "secret ", 7);
	memset(text + 7, 'Q', 176);	/* 132 bytes */
	text[7 + 176] = '\n';
	write_file(path("long64.key"), text, 0600);
	CU_ASSERT_EQUAL(rps__key_load(path("long64.key"), &k), -EINVAL);
	CU_ASSERT(strstr(rps__errbuf(), "the secret is 132 bytes") != NULL);
}

/* One handshake between a connector holding `have` (proving `want` with
 * scope) and a server holding the cluster key c: what each side's check
 * says.  tamper() may change the AUTH the server reads. */
struct hs {
	int connect, accept, check;
	enum rps__key_role role;
	char scope[RPS__SCOPE_MAX];
};

static struct hs handshake(const struct rps__key *c, const struct rps__key *have, unsigned conn_role,
			   enum rps__key_role want, const char *scope, const char *caddr, const char *saddr_seen,
			   void (*tamper)(struct rps__auth *))
{
	struct rps__keyring *ring;
	struct rps__conn_priv req = { .magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .role = (uint16_t)conn_role,
				      .from_id = 2, .to_id = 1 };
	struct rps__conn_priv rep = { .magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .from_id = 1 };
	struct rps__auth a;
	struct rps__auth_rep ar;
	struct rps__auth_transcript t;
	struct rps__key proven;
	struct rps__msg_hdr h = { 0 };
	struct hs r = { -1, -1, -1, RPS__KEY_NONE, "" };

	CU_ASSERT_EQUAL_FATAL(rps__keyring_open(path("c.key"), true, &ring), 0);
	CU_ASSERT_EQUAL(ring->cur.id, c->id);
	rps__auth_priv_init(&req, have);
	rps__auth_priv_init(&rep, c);
	r.connect = rps__auth_connect(have, NULL, want, scope, &req, &rep, caddr, "10.0.0.1:7000", "srv", &a, &t,
				      &proven);
	if (!r.connect) {
		if (tamper)
			tamper(&a);
		r.accept = rps__auth_accept(ring, &req, &rep, &a, "10.0.0.1:7000", saddr_seen, &ar, &r.role, r.scope);
		h.status = r.accept;
		r.check = rps__auth_connect_check(&proven, &t, &h, &ar, "srv");
	}
	rps__keyring_close(ring);
	return r;
}

static void flip_mac(struct rps__auth *a) { a->mac[7] ^= 1; }
static void other_scope(struct rps__auth *a) { snprintf(a->scope, sizeof(a->scope), "jobB/"); }
static void as_admin(struct rps__auth *a) { a->key_role = RPS__KEY_ADMIN; }
static void other_key_id(struct rps__auth *a) { a->key_id ^= 1; }

static void test_handshake(void)
{
	struct rps__key c, w, r, adm, other;
	struct hs h;

	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("c.key"), &c), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("c2.key"), &other), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_derive(&c, RPS__KEY_WORKER, "jobA/", &w), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_derive(&c, RPS__KEY_READER, "jobA/", &r), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_derive(&c, RPS__KEY_ADMIN, "", &adm), 0);

	/* the good cases: each side's proof holds, the server learns role and scope */
	h = handshake(&c, &w, RPS__ROLE_WORKER, RPS__KEY_WORKER, "jobA/", "10.0.0.2:5000", "10.0.0.2:5000", NULL);
	CU_ASSERT_EQUAL(h.connect, 0);
	CU_ASSERT_EQUAL(h.accept, 0);
	CU_ASSERT_EQUAL(h.check, 0);
	CU_ASSERT_EQUAL(h.role, RPS__KEY_WORKER);
	CU_ASSERT_STRING_EQUAL(h.scope, "jobA/");
	h = handshake(&c, &r, RPS__ROLE_WORKER, RPS__KEY_READER, "jobA/", "10.0.0.2:1", "10.0.0.2:2", NULL);
	CU_ASSERT(!h.connect && !h.accept && !h.check);		/* (ports are not bound) */
	CU_ASSERT_EQUAL(h.role, RPS__KEY_READER);
	h = handshake(&c, &adm, RPS__ROLE_ADMIN, RPS__KEY_ADMIN, "", "10.0.0.2:1", "10.0.0.2:1", NULL);
	CU_ASSERT(!h.connect && !h.accept && !h.check);
	h = handshake(&c, &c, RPS__ROLE_PEER, RPS__KEY_PEER, "", "[::ffff:10.0.0.2]:1", "10.0.0.2:9", NULL);
	CU_ASSERT(!h.connect && !h.accept && !h.check);	/* a cluster key proves a peer */
	CU_ASSERT_EQUAL(h.role, RPS__KEY_PEER);

	/* a key of another cluster: the connector knows before it proves anything */
	h = handshake(&c, &other, RPS__ROLE_WORKER, RPS__KEY_WORKER, "", "10.0.0.2:1", "10.0.0.2:1", NULL);
	CU_ASSERT_EQUAL(h.connect, -EACCES);
	CU_ASSERT(strstr(rps__errbuf(), "another cluster key") != NULL);
	/* a worker key does not open an admin or a peer connection */
	h = handshake(&c, &w, RPS__ROLE_ADMIN, RPS__KEY_ADMIN, "", "10.0.0.2:1", "10.0.0.2:1", NULL);
	CU_ASSERT_EQUAL(h.connect, -EACCES);
	/* a worker's proof relabelled: as admin, for another scope, with another
	 * key id, or one bit off: refused, and no server proof is given */
	h = handshake(&c, &w, RPS__ROLE_WORKER, RPS__KEY_WORKER, "jobA/", "10.0.0.2:1", "10.0.0.2:1", as_admin);
	CU_ASSERT_EQUAL(h.accept, -EACCES);
	CU_ASSERT_EQUAL(h.check, -EACCES);
	h = handshake(&c, &w, RPS__ROLE_WORKER, RPS__KEY_WORKER, "jobA/", "10.0.0.2:1", "10.0.0.2:1", other_scope);
	CU_ASSERT_EQUAL(h.accept, -EACCES);
	h = handshake(&c, &w, RPS__ROLE_WORKER, RPS__KEY_WORKER, "jobA/", "10.0.0.2:1", "10.0.0.2:1", other_key_id);
	CU_ASSERT_EQUAL(h.accept, -EACCES);
	h = handshake(&c, &w, RPS__ROLE_WORKER, RPS__KEY_WORKER, "jobA/", "10.0.0.2:1", "10.0.0.2:1", flip_mac);
	CU_ASSERT_EQUAL(h.accept, -EACCES);
	/* a worker key on a peer connection: the role does not fit */
	h = handshake(&c, &w, RPS__ROLE_PEER, RPS__KEY_WORKER, "jobA/", "10.0.0.2:1", "10.0.0.2:1", NULL);
	CU_ASSERT_EQUAL(h.accept, -EACCES);
	/* relayed: the server sees the connection come from another address
	 * than the one the connector proved */
	h = handshake(&c, &w, RPS__ROLE_WORKER, RPS__KEY_WORKER, "jobA/", "10.0.0.2:1", "10.0.0.3:1", NULL);
	CU_ASSERT_EQUAL(h.accept, -EACCES);
}

/* A recorded AUTH replayed on a new connection (new server nonce) fails;
 * a server proof replayed to a new connector (new client nonce) too; a
 * server's proof is no client's. */
static void test_replay(void)
{
	struct rps__key c, w, proven;
	struct rps__keyring *ring;
	struct rps__conn_priv req = { .magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .role = RPS__ROLE_WORKER };
	struct rps__conn_priv rep = { .magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .from_id = 1 };
	struct rps__conn_priv req2, rep2;
	struct rps__auth a, a2;
	struct rps__auth_rep ar, ar2;
	struct rps__auth_transcript t, t2;
	struct rps__msg_hdr h = { 0 };
	enum rps__key_role role;
	char scope[RPS__SCOPE_MAX];

	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("c.key"), &c), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_derive(&c, RPS__KEY_WORKER, "jobA/", &w), 0);
	CU_ASSERT_EQUAL_FATAL(rps__keyring_open(path("c.key"), true, &ring), 0);
	rps__auth_priv_init(&req, &w);
	rps__auth_priv_init(&rep, &c);
	CU_ASSERT_EQUAL_FATAL(rps__auth_connect(&w, NULL, RPS__KEY_WORKER, "jobA/", &req, &rep, "10.0.0.2:1",
						"10.0.0.1:7", "s", &a, &t, &proven), 0);
	CU_ASSERT_EQUAL_FATAL(rps__auth_accept(ring, &req, &rep, &a, "10.0.0.1:7", "10.0.0.2:1", &ar, &role, scope), 0);
	/* the same AUTH on a connection with a fresh server nonce */
	req2 = req;
	rep2 = rep;
	rps__auth_priv_init(&rep2, &c);
	CU_ASSERT(memcmp(rep2.nonce, rep.nonce, sizeof(rep.nonce)) != 0);
	CU_ASSERT_EQUAL(rps__auth_accept(ring, &req2, &rep2, &a, "10.0.0.1:7", "10.0.0.2:1", &ar2, &role, scope),
			-EACCES);
	CU_ASSERT(strstr(ar2.why, "wrong key") != NULL);
	CU_ASSERT(memcmp(ar2.mac, ar.mac, sizeof(ar.mac)) != 0);	/* no proof handed out */
	/* a fake server replays the real one's proof to a connector with a fresh nonce */
	rps__auth_priv_init(&req2, &w);
	CU_ASSERT_EQUAL_FATAL(rps__auth_connect(&w, NULL, RPS__KEY_WORKER, "jobA/", &req2, &rep, "10.0.0.2:1",
						"10.0.0.1:7", "s", &a2, &t2, &proven), 0);
	CU_ASSERT_EQUAL(rps__auth_connect_check(&proven, &t2, &h, &ar, "s"), -EACCES);
	CU_ASSERT(strstr(rps__errbuf(), "could not prove") != NULL);
	/* reflection: the client's own MAC is not a server proof */
	memcpy(ar2.mac, a.mac, sizeof(a.mac));
	CU_ASSERT_EQUAL(rps__auth_connect_check(&proven, &t, &h, &ar2, "s"), -EACCES);
	/* the real proof on the real transcript holds */
	CU_ASSERT_EQUAL(rps__auth_connect_check(&proven, &t, &h, &ar, "s"), 0);
	/* a server with no key answers with no nonce: a keyed connector refuses it */
	memset(&rep2, 0, sizeof(rep2));
	CU_ASSERT_EQUAL(rps__auth_connect(&w, NULL, RPS__KEY_WORKER, "jobA/", &req, &rep2, "a:1", "b:1", "s", &a2,
					  &t2, &proven), -EACCES);
	CU_ASSERT(strstr(rps__errbuf(), "does not authenticate") != NULL);
	rps__keyring_close(ring);
}

/* A changed key file: the new key and the old one both taken; reloaded
 * unchanged: only the new. */
static void test_rotation(void)
{
	struct rps__keyring *ring;
	struct rps__key old, cur, prev;
	uint64_t old_id;

	CU_ASSERT_EQUAL_FATAL(rps__key_write(path("rot.key"), RPS__KEY_CLUSTER, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(rps__keyring_open(path("rot.key"), true, &ring), 0);
	old_id = ring->cur.id;
	CU_ASSERT_EQUAL(rps__keyring_reload(ring), 0);		/* unchanged */
	unlink(path("rot.key"));
	CU_ASSERT_EQUAL_FATAL(rps__key_write(path("rot.key"), RPS__KEY_CLUSTER, NULL, NULL), 0);
	CU_ASSERT_EQUAL(rps__keyring_reload(ring), 1);
	rps__keyring_get(ring, &cur, &prev);
	CU_ASSERT(cur.id != old_id);
	CU_ASSERT_EQUAL(prev.id, old_id);
	CU_ASSERT_EQUAL(prev.role, RPS__KEY_CLUSTER);
	CU_ASSERT_EQUAL(rps__keyring_reload(ring), 0);		/* the rotation is over */
	rps__keyring_get(ring, &cur, &prev);
	CU_ASSERT_EQUAL(prev.role, RPS__KEY_NONE);
	/* a worker key in the file: refused, the ring kept */
	unlink(path("rot.key"));
	CU_ASSERT_EQUAL_FATAL(rps__key_load(path("c.key"), &old), 0);
	CU_ASSERT_EQUAL_FATAL(rps__key_write(path("rot.key"), RPS__KEY_WORKER, "x/", &old), 0);
	CU_ASSERT_EQUAL(rps__keyring_reload(ring), -EINVAL);
	rps__keyring_get(ring, &prev, NULL);
	CU_ASSERT_EQUAL(prev.id, cur.id);
	/* servers take only a cluster key */
	rps__keyring_close(ring);
	CU_ASSERT_EQUAL(rps__keyring_open(path("rot.key"), true, &ring), -EINVAL);
	CU_ASSERT(strstr(rps__errbuf(), "servers take the cluster key") != NULL);
}

static void test_hosts(void)
{
	char h[64];

	rps__auth_host("10.0.0.1:7000", h, sizeof(h));
	CU_ASSERT_STRING_EQUAL(h, "10.0.0.1");
	rps__auth_host("[fe80::1]:7000", h, sizeof(h));
	CU_ASSERT_STRING_EQUAL(h, "fe80::1");
	rps__auth_host("[::ffff:10.0.0.1]:7000", h, sizeof(h));
	CU_ASSERT_STRING_EQUAL(h, "10.0.0.1");
	rps__auth_host("10.0.0.1", h, sizeof(h));
	CU_ASSERT_STRING_EQUAL(h, "10.0.0.1");
	CU_ASSERT(rps__host_is_loopback("127.0.0.1"));
	CU_ASSERT(rps__host_is_loopback("127.1.2.3"));
	CU_ASSERT(rps__host_is_loopback("::1"));
	CU_ASSERT(rps__host_is_loopback("localhost"));
	CU_ASSERT(!rps__host_is_loopback("0.0.0.0"));
	CU_ASSERT(!rps__host_is_loopback("10.0.0.1"));
	CU_ASSERT(!rps__host_is_loopback("::"));
	CU_ASSERT(!rps__host_is_loopback("128.0.0.1"));
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "keygen: mode 0600, never over a file, derived keys read back", test_keygen_roundtrip },
		{ "derivation bound to role and scope", test_derivation_bound },
		{ "key files: readable by others, short, junk, edited ids refused", test_key_files_refused },
		{ "key files: the size limits, and a secret too long said so", test_key_file_limits },
		{ "handshake: each role, and every relabelled or foreign proof refused", test_handshake },
		{ "handshake: replayed AUTH, replayed or reflected server proof, keyless server", test_replay },
		{ "rotation: changed key adds, unchanged key ends, wrong kind refused", test_rotation },
		{ "hosts and loopback", test_hosts },
	};
	const struct cutest_suite suites[] = {
		{ "auth", suite_init, suite_clean, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
