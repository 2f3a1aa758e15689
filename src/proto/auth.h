/*
 * auth.h - keys and the mutual challenge-response every connection starts
 * with (doc/security.md, "How it works").
 *
 * One secret per cluster, the cluster key, held by the servers.  Every other
 * key is derived from it: K(role, scope) = HMAC-SHA256(cluster key,
 * "rdmaps-key-v1" 0 role 0 scope), so a server derives the key of any
 * role and scope it is shown and needs no list of them, while a job holding
 * the worker key of scope "jobA/" cannot compute the key of "jobB/", of a
 * reader, an admin or a peer.  A key file names its role and scope; the
 * derived secret is bound to both, so editing them breaks every proof.
 *
 * The handshake, on every connection kind (worker, reader, admin, peer,
 * replication), with fresh nonces from both sides:
 *   connect request   conn_priv: role, ids, key id, nonce_c
 *   accept reply      conn_priv: server id, key id, nonce_s
 *   AUTH              client -> server: key role, scope, MAC_C
 *   AUTH_REP          server -> client: status, MAC_S (only if MAC_C held)
 * MAC_X = HMAC-SHA256(K(role, scope), "rdmaps-auth-v1" X transcript) over
 * the connection role, key role, scope, key id, both member ids, both
 * nonces and both endpoints' addresses as each side sees them.  The server
 * proves nothing to a client that did not prove first, gives nothing
 * (no rkey, no address, no name) before MAC_C verifies, and a client sends
 * nothing but AUTH before MAC_S verifies: a replayed handshake fails on the
 * other side's fresh nonce, a fake server cannot answer, and a proof made
 * for one role, scope or pair of endpoints is worth nothing for another.
 *
 * Crypto is libsodium's (HMAC-SHA256, randombytes, constant-time compare):
 * a small, misuse-resistant library with a stable ABI in every distribution.
 *
 * Two files: auth_keys.c (roles, derivation, key files, the loopback key,
 * key rings) and auth_handshake.c (the transcript, the proofs and their
 * checks).
 */
#ifndef RPS_AUTH_H
#define RPS_AUTH_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rps__conn_priv;
struct rps__auth;
struct rps__auth_rep;
struct rps__msg_hdr;

#define RPS__KEY_BYTES 32		/* a derived key; a cluster key has 32 or more */
#define RPS__KEY_MAX 128		/* longest cluster key read */
#define RPS__NONCE_BYTES 16
#define RPS__MAC_BYTES 32
#define RPS__SCOPE_MAX 64		/* tensor-name prefix, NUL included (as RPS__NAME_MAX) */

/* What a key lets its holder be. */
enum rps__key_role {
	RPS__KEY_NONE = 0,
	RPS__KEY_CLUSTER = 1,	/* the servers' key: every role (peers derive "peer") */
	RPS__KEY_ADMIN = 2,	/* psctl: every command */
	RPS__KEY_WORKER = 3,	/* create, open, push, pull under its scope */
	RPS__KEY_READER = 4,	/* open and pull under its scope */
	RPS__KEY_PEER = 5,	/* derived only (server to server), never in a file */
};

struct rps__key {
	enum rps__key_role role;
	char scope[RPS__SCOPE_MAX];	/* worker/reader: tensor-name prefix ("" = all) */
	uint64_t id;			/* the cluster key's id (every key derived from it has it) */
	uint8_t secret[RPS__KEY_MAX];
	size_t len;
};

/* A server's keys: the current cluster key and, while a rotation is under
 * way (rdmapsd reloaded a changed key file), the previous one.  A client's:
 * its one key in cur.  Shared by a server's threads: read it with
 * rps__keyring_get, change it with rps__keyring_reload. */
struct rps__keyring {
	pthread_mutex_t lock;
	struct rps__key cur;
	struct rps__key prev;		/* role NONE: no rotation under way */
	char path[512];
};

/* Load path into a new ring (a server's key must be a cluster key). */
int rps__keyring_open(const char *path, bool server, struct rps__keyring **out);
void rps__keyring_close(struct rps__keyring *ring);
/* A copy of the ring's keys, taken under its lock. */
void rps__keyring_get(struct rps__keyring *ring, struct rps__key *cur, struct rps__key *prev);
/* Read the key file again: a changed key becomes the current one and the
 * current one the previous (both accepted: a rotation is under way); the
 * same key ends a rotation (the previous one is dropped).  Returns 1 if
 * the key changed, 0 if not, or a negative errno (the ring unchanged). */
int rps__keyring_reload(struct rps__keyring *ring);

const char *rps__key_role_name(enum rps__key_role role);
int rps__key_role_parse(const char *s, enum rps__key_role *out);

/* Load a key file (made by psctl keygen, or any 32+ random bytes as hex or
 * base64 on one line: a cluster key).  Refuses a file group or others may
 * read, with a line that says so.  0 or a negative errno (message set). */
int rps__key_load(const char *path, struct rps__key *out);
/* Write a key file with mode 0600 (never over an existing file).  role
 * CLUSTER makes a new random cluster key (from NULL); other roles derive
 * from `from`, a cluster key. */
int rps__key_write(const char *path, enum rps__key_role role, const char *scope, const struct rps__key *from);
/* The key of (role, scope) from a cluster key. */
int rps__key_derive(const struct rps__key *cluster, enum rps__key_role role, const char *scope,
		    struct rps__key *out);
/* The id of a cluster key (its first 8 bytes of HMAC(key, "rdmaps-key-id-v1")). */
uint64_t rps__key_id(const uint8_t *secret, size_t len);
/* The key path given, else $RDMAPS_KEY_FILE, else NULL. */
const char *rps__key_path(const char *given);
/*
 * This user's loopback key (doc/security.md "Loopback too, with nothing to
 * type"): what protects a server
 * started without --key (and without --insecure) from the host's other
 * users.  One cluster key per user, in $RDMAPS_RUNTIME_DIR/loopback.key,
 * else ~/.rdmaps/loopback.key (the directory mode 0700, the file 0600,
 * both ours), the way X11 and Jupyter keep their cookies: the first such
 * server makes it, every other one of the same user (a cluster of them on
 * loopback) reads the same, and so do that user's clients (librdmaps,
 * psctl, psperf, Python) when they talk to loopback servers without a key.
 */
#define RPS__LOCAL_KEY_NAME "loopback.key"
/* The loopback key's path into buf (its directory need not exist). */
int rps__local_key_path(char *buf, size_t len);
/* A server's: the loopback key's path, the key made now (atomically:
 * written aside, then linked into place, so of several servers starting at
 * once one key wins and all read it) if there is none; *made says which.
 * A directory that is not ours or that others may enter is refused. */
int rps__local_key_ensure(char *buf, size_t len, bool *made);
/* A client's: 0 and the path if the loopback key exists, -ENOENT (no
 * message) if not, another negative errno (message set) if its directory
 * is not safe. */
int rps__local_key_find(char *buf, size_t len);

/* Wipe a key. */
void rps__key_clear(struct rps__key *k);

/* Whether a key of role `have` may prove role `want` on a connection
 * (CLUSTER may prove any; others only themselves). */
bool rps__key_may(enum rps__key_role have, enum rps__key_role want);

/* fresh random bytes */
void rps__auth_random(void *buf, size_t len);
/* HMAC-SHA256 of parts[0..n) under key (auth_keys.c; shared with the
 * handshake's MACs) */
void rps__auth_hmac(const uint8_t *key, size_t keylen, const void *const *parts, const size_t *lens, int n,
		    uint8_t out[32]);

/* What both sides MAC. */
struct rps__auth_transcript {
	uint16_t conn_role;		/* enum rps__conn_role */
	uint16_t key_role;		/* enum rps__key_role proven */
	char scope[RPS__SCOPE_MAX];
	uint64_t key_id;
	uint64_t from_id, to_id;	/* as in the connect request */
	uint64_t server_id;		/* the accepting server's member id */
	uint8_t nonce_c[RPS__NONCE_BYTES];
	uint8_t nonce_s[RPS__NONCE_BYTES];
	char client_addr[64];		/* host part only, as both sides see it */
	char server_addr[64];
};

/* The connector's half, once the accept reply (rep) is in: with the key of
 * cur/prev whose id the server named (prev may be NULL), prove key role
 * `want` (and scope) for connection role conn_role.  Fills the AUTH body,
 * the transcript to check AUTH_REP with, and the key it proved with.
 * -EACCES (message set) when no key of ours matches the server's. */
int rps__auth_connect(const struct rps__key *cur, const struct rps__key *prev, enum rps__key_role want,
		      const char *scope, const struct rps__conn_priv *req, const struct rps__conn_priv *rep,
		      const char *local_addr, const char *peer_addr, const char *who, struct rps__auth *msg,
		      struct rps__auth_transcript *t, struct rps__key *proven);
/* How long to wait before dialing again a server that said it is busy
 * (RPS__BUSY_REFUSAL; tries: times so far): 10 ms doubling to 640 ms,
 * each spread at random over its upper half by salt and the clock. */
uint64_t rps__busy_wait_ms(uint32_t tries, uint32_t salt);
/* A blocking dialer's turn after a busy refusal: sleep the next such wait
 * (counting it in *tries) and true, or false if it would end past end_ns
 * (rps__now_ns clock): give up with the refusal. */
bool rps__busy_sleep(uint32_t *tries, uint32_t salt, uint64_t end_ns);
/* Check the server's AUTH_REP: 0, or its refusal / a bad proof (-EACCES,
 * message set: the server could not prove it holds the key). */
int rps__auth_connect_check(const struct rps__key *proven, const struct rps__auth_transcript *t,
			    const struct rps__msg_hdr *h, const struct rps__auth_rep *rep, const char *who);
/* The server's half: check AUTH (msg) of a connection whose connect data
 * were req and whose accept reply was rep.  0: rep_out holds MAC_S, and
 * *role / scope what the connector proved; -EACCES: rep_out->why says
 * why (no secret in it). */
int rps__auth_accept(struct rps__keyring *ring, const struct rps__conn_priv *req, const struct rps__conn_priv *rep,
		     const struct rps__auth *msg, const char *local_addr, const char *peer_addr,
		     struct rps__auth_rep *rep_out, enum rps__key_role *role, char scope[RPS__SCOPE_MAX]);
/* Connect data for a connector with key k (NULL: none): key id, fresh nonce. */
void rps__auth_priv_init(struct rps__conn_priv *p, const struct rps__key *k);

/* "10.0.0.1:7000" / "[fe80::1]:7000" -> its host ("::ffff:" dropped). */
void rps__auth_host(const char *addr, char *host, size_t len);
/* A loopback host (127.0.0.0/8, ::1, "localhost"). */
bool rps__host_is_loopback(const char *host);

#endif
