/*
 * auth_handshake.c - the connection handshake's proofs (auth.h): the
 * transcript both sides MAC, the client's and the server's proofs and
 * their checks, which key role a connection needs, and the address
 * helpers the transcript names.  Keys and key files are auth_keys.c.
 * The primitives are libsodium's; nothing here is a primitive of its own.
 */
#include "config.h"
#include "proto/auth.h"
#include "common/common.h"
#include "proto/proto.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

/* at most cap - 1 bytes of src, the rest of dst (zeroed) untouched */
static void copy_field(char *dst, size_t cap, const char *src)
{
	memcpy(dst, src, strnlen(src, cap - 1));
}

/* MAC_C (client = true) or MAC_S of a transcript with key k (the key of
 * the transcript's role and scope). */
static void auth_mac(const struct rps__key *k, const struct rps__auth_transcript *t, bool client,
		     uint8_t mac[RPS__MAC_BYTES])
{
	static const char label_c[] = "rdmaps-auth-v1 client";
	static const char label_s[] = "rdmaps-auth-v1 server";
	struct rps__auth_transcript z;
	const void *parts[2];
	size_t lens[2];

	/* fixed layout, padding and unused bytes zeroed */
	memset(&z, 0, sizeof(z));
	z.conn_role = t->conn_role;
	z.key_role = t->key_role;
	copy_field(z.scope, sizeof(z.scope), t->scope);
	z.key_id = t->key_id;
	z.from_id = t->from_id;
	z.to_id = t->to_id;
	z.server_id = t->server_id;
	memcpy(z.nonce_c, t->nonce_c, sizeof(z.nonce_c));
	memcpy(z.nonce_s, t->nonce_s, sizeof(z.nonce_s));
	copy_field(z.client_addr, sizeof(z.client_addr), t->client_addr);
	copy_field(z.server_addr, sizeof(z.server_addr), t->server_addr);
	parts[0] = client ? label_c : label_s;
	lens[0] = sizeof(label_c);
	parts[1] = &z;
	lens[1] = sizeof(z);
	rps__auth_hmac(k->secret, k->len, parts, lens, 2, mac);
}

/* Constant-time check of a MAC: 0 or -EACCES. */
static int auth_check(const struct rps__key *k, const struct rps__auth_transcript *t, bool client,
		      const uint8_t mac[RPS__MAC_BYTES])
{
	uint8_t want[RPS__MAC_BYTES];
	int ret;

	auth_mac(k, t, client, want);
	ret = crypto_verify_32(want, mac) ? -EACCES : 0;
	sodium_memzero(want, sizeof(want));
	return ret;
}

void rps__auth_host(const char *addr, char *host, size_t len)
{
	const char *end;
	size_t n;

	if (addr[0] == '[') {	/* [v6]:port */
		addr++;
		end = strchr(addr, ']');
		n = end ? (size_t)(end - addr) : strlen(addr);
	} else {
		end = strrchr(addr, ':');
		n = end && !memchr(addr, ':', (size_t)(end - addr)) ? (size_t)(end - addr) : strlen(addr);
	}
	if (n > 7 && !strncasecmp(addr, "::ffff:", 7) && memchr(addr + 7, '.', n - 7)) {
		addr += 7;
		n -= 7;
	}
	if (n >= len)
		n = len - 1;
	memcpy(host, addr, n);
	host[n] = '\0';
}

bool rps__host_is_loopback(const char *host)
{
	return !strcmp(host, "localhost") || !strcmp(host, "::1") || !strcmp(host, "[::1]") ||
	       !strncmp(host, "127.", 4) || !strncmp(host, "::ffff:127.", 11);
}

/* ---- the handshake ---------------------------------------------------- */

/* Which key roles may open a connection of conn_role. */
static bool role_fits(unsigned conn_role, enum rps__key_role key_role)
{
	switch (conn_role) {
	case RPS__ROLE_WORKER:
		return key_role == RPS__KEY_WORKER || key_role == RPS__KEY_READER;
	case RPS__ROLE_ADMIN:
		return key_role == RPS__KEY_ADMIN;
	case RPS__ROLE_PEER:
	case RPS__ROLE_REPL:
	case RPS__ROLE_REPL_REV:
		return key_role == RPS__KEY_PEER;
	default:
		return false;
	}
}

void rps__auth_priv_init(struct rps__conn_priv *p, const struct rps__key *k)
{
	p->key_id = k && k->role != RPS__KEY_NONE ? k->id : 0;
	if (p->key_id)
		rps__auth_random(p->nonce, sizeof(p->nonce));
	else
		memset(p->nonce, 0, sizeof(p->nonce));
}

static void transcript(struct rps__auth_transcript *t, const struct rps__conn_priv *req,
		       const struct rps__conn_priv *rep, enum rps__key_role role, const char *scope, uint64_t key_id,
		       const char *client_addr, const char *server_addr)
{
	memset(t, 0, sizeof(*t));
	t->conn_role = req->role;
	t->key_role = (uint16_t)role;
	copy_field(t->scope, sizeof(t->scope), scope);
	t->key_id = key_id;
	t->from_id = req->from_id;
	t->to_id = req->to_id;
	t->server_id = rep->from_id;
	memcpy(t->nonce_c, req->nonce, sizeof(t->nonce_c));
	memcpy(t->nonce_s, rep->nonce, sizeof(t->nonce_s));
	rps__auth_host(client_addr, t->client_addr, sizeof(t->client_addr));
	rps__auth_host(server_addr, t->server_addr, sizeof(t->server_addr));
}

static bool zero(const uint8_t *p, size_t n)
{
	size_t i;
	uint8_t acc = 0;

	for (i = 0; i < n; i++)
		acc |= p[i];
	return !acc;
}

int rps__auth_connect(const struct rps__key *cur, const struct rps__key *prev, enum rps__key_role want,
		      const char *scope, const struct rps__conn_priv *req, const struct rps__conn_priv *rep,
		      const char *local_addr, const char *peer_addr, const char *who, struct rps__auth *msg,
		      struct rps__auth_transcript *t, struct rps__key *proven)
{
	const struct rps__key *k = NULL;
	int ret;

	if (!rep->key_id || zero(rep->nonce, sizeof(rep->nonce)))
		return rps__seterr(-EACCES, "%s does not authenticate (an rdmapsd without --key): "
				   "not trusted with a keyed connection", who);
	if (cur && cur->role != RPS__KEY_NONE && cur->id == rep->key_id)
		k = cur;
	else if (prev && prev->role != RPS__KEY_NONE && prev->id == rep->key_id)
		k = prev;
	if (!k)
		return rps__seterr(-EACCES, "%s has another cluster key (id %016llx, ours %016llx): the key is "
				   "from another cluster, or a rotation is half done", who,
				   (unsigned long long)rep->key_id, (unsigned long long)(cur ? cur->id : 0));
	if (want == RPS__KEY_ADMIN || want == RPS__KEY_PEER)
		scope = "";
	if (k->role == RPS__KEY_CLUSTER) {
		ret = rps__key_derive(k, want, scope, proven);
		if (ret)
			return ret;
	} else if (k->role == want) {
		*proven = *k;
	} else {
		return rps__seterr(-EACCES, "a key of role %s cannot open a connection of role %s (%s)", rps__key_role_name(k->role),
				   rps__key_role_name(want), who);
	}
	transcript(t, req, rep, proven->role, proven->scope, proven->id, local_addr, peer_addr);
	memset(msg, 0, sizeof(*msg));
	msg->key_role = proven->role;
	msg->key_id = proven->id;
	copy_field(msg->scope, sizeof(msg->scope), proven->scope);
	auth_mac(proven, t, true, msg->mac);
	return 0;
}

uint64_t rps__busy_wait_ms(uint32_t tries, uint32_t salt)
{
	uint64_t wait_ms = 10ull << RPS__MIN(tries, 6u);
	uint64_t h = (rps__now_ns() ^ ((uint64_t)salt << 32)) * 0x9e3779b97f4a7c15ull;

	return wait_ms / 2 + (h >> 33) % (wait_ms / 2 + 1);	/* (spread the burst) */
}

bool rps__busy_sleep(uint32_t *tries, uint32_t salt, uint64_t end_ns)
{
	uint64_t wait_ms = rps__busy_wait_ms((*tries)++, salt);

	if (rps__now_ns() + (wait_ms + 1) * 1000000ull >= end_ns)
		return false;
	usleep((useconds_t)(wait_ms * 1000));
	return true;
}

int rps__auth_connect_check(const struct rps__key *proven, const struct rps__auth_transcript *t,
			    const struct rps__msg_hdr *h, const struct rps__auth_rep *rep, const char *who)
{
	if (h->status == -ECONNREFUSED)	/* the key held, but no room (server full, memory) */
		return rps__seterr(-ECONNREFUSED, "%s refused the connection: %.*s", who, (int)sizeof(rep->why),
				   rep->why[0] ? rep->why : "no room");
	if (h->status == -EBUSY)	/* too many handshakes at once: this one closed to make room */
		return rps__seterr(-EBUSY, "%s refused the connection for now: %.*s (too many connections "
				   "authenticating at once: try again, or give the client a longer timeout_ms)",
				   who, (int)sizeof(rep->why), rep->why[0] ? rep->why : RPS__BUSY_REFUSAL);
	if (h->status < 0)
		return rps__seterr(h->status == -EPERM ? -EPERM : -EACCES, "%s refused the key: %s", who,
				   rep->why[0] ? rep->why : "authentication failed");
	if (auth_check(proven, t, false, rep->mac))
		return rps__seterr(-EACCES, "%s could not prove it holds the cluster key: "
				   "not an rdmapsd of this cluster (or a relay between)", who);
	return 0;
}

int rps__auth_accept(struct rps__keyring *ring, const struct rps__conn_priv *req, const struct rps__conn_priv *rep,
		     const struct rps__auth *msg, const char *local_addr, const char *peer_addr,
		     struct rps__auth_rep *out, enum rps__key_role *role, char scope[RPS__SCOPE_MAX])
{
	struct rps__key cur, prev, k;
	struct rps__auth_transcript t;
	const struct rps__key *cl = NULL;
	enum rps__key_role want = (enum rps__key_role)msg->key_role;
	int ret = -EACCES;

	memset(out, 0, sizeof(*out));
	if (!role_fits(req->role, want)) {
		snprintf(out->why, sizeof(out->why), "a %s key may not open this kind of connection",
			 rps__key_role_name(want));
		return -EACCES;
	}
	rps__keyring_get(ring, &cur, &prev);
	if (msg->key_id == cur.id)
		cl = &cur;
	else if (prev.role != RPS__KEY_NONE && msg->key_id == prev.id)
		cl = &prev;
	if (!cl) {
		snprintf(out->why, sizeof(out->why), "a key of another cluster key (id %016llx)",
			 (unsigned long long)msg->key_id);
		goto out;
	}
	if (rps__key_derive(cl, want, msg->scope, &k)) {
		snprintf(out->why, sizeof(out->why), "a key this server cannot check");
		goto out;
	}
	transcript(&t, req, rep, want, k.scope, k.id, peer_addr, local_addr);
	if (auth_check(&k, &t, true, msg->mac)) {
		snprintf(out->why, sizeof(out->why), "wrong key, or a proof made for another connection");
		goto out;
	}
	auth_mac(&k, &t, false, out->mac);
	*role = want;
	memset(scope, 0, RPS__SCOPE_MAX);
	copy_field(scope, RPS__SCOPE_MAX, k.scope);
	ret = 0;
out:
	rps__key_clear(&cur);
	rps__key_clear(&prev);
	rps__key_clear(&k);
	return ret;
}
