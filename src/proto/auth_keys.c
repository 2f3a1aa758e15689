/*
 * auth_keys.c - keys: roles, derivation of scoped keys from the cluster
 * key, key files (read, written, checked), this user's loopback key, and
 * the key rings servers and clients hold (auth.h).  The handshake that
 * proves a key is auth_handshake.c.  The primitives are libsodium's;
 * nothing here is a primitive of its own.
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

#define KEY_FILE_MAX 4096		/* longest key file read (rdmapsd(8)): bytes */

static const char *const role_names[] = {
	[RPS__KEY_NONE] = "none", [RPS__KEY_CLUSTER] = "cluster", [RPS__KEY_ADMIN] = "admin",
	[RPS__KEY_WORKER] = "worker", [RPS__KEY_READER] = "reader", [RPS__KEY_PEER] = "peer",
};

const char *rps__key_role_name(enum rps__key_role role)
{
	return (unsigned)role < sizeof(role_names) / sizeof(role_names[0]) ? role_names[role] : "?";
}

int rps__key_role_parse(const char *s, enum rps__key_role *out)
{
	enum rps__key_role r;

	for (r = RPS__KEY_CLUSTER; r <= RPS__KEY_READER; r++)
		if (!strcmp(s, role_names[r])) {
			*out = r;
			return 0;
		}
	return rps__seterr(-EINVAL, "unknown key role '%s': cluster, admin, worker or reader", s);
}

static int sodium_ready(void)
{
	if (sodium_init() < 0)
		return rps__seterr(-EIO, "libsodium could not start (sodium_init failed): is /dev/urandom readable?");
	return 0;
}

void rps__auth_random(void *buf, size_t len)
{
	if (sodium_init() < 0)	/* (it aborts on its own if no entropy is to be had) */
		abort();
	randombytes_buf(buf, len);
}

void rps__key_clear(struct rps__key *k)
{
	sodium_memzero(k, sizeof(*k));
}

void rps__auth_hmac(const uint8_t *key, size_t keylen, const void *const *parts, const size_t *lens, int n,
		 uint8_t out[32])
{
	crypto_auth_hmacsha256_state st;
	int i;

	crypto_auth_hmacsha256_init(&st, key, keylen);
	for (i = 0; i < n; i++)
		crypto_auth_hmacsha256_update(&st, parts[i], lens[i]);
	crypto_auth_hmacsha256_final(&st, out);
	sodium_memzero(&st, sizeof(st));
}

uint64_t rps__key_id(const uint8_t *secret, size_t len)
{
	static const char label[] = "rdmaps-key-id-v1";
	const void *parts[] = { label };
	size_t lens[] = { sizeof(label) };
	uint8_t out[32];
	uint64_t id;

	rps__auth_hmac(secret, len, parts, lens, 1, out);
	memcpy(&id, out, sizeof(id));
	return id ? id : 1;	/* 0 means "no key" on the wire */
}

int rps__key_derive(const struct rps__key *cluster, enum rps__key_role role, const char *scope,
		    struct rps__key *out)
{
	static const char label[] = "rdmaps-key-v1";
	const char *name = rps__key_role_name(role);
	const void *parts[3];
	size_t lens[3];
	struct rps__key k;

	if (cluster->role != RPS__KEY_CLUSTER)
		return rps__seterr(-EINVAL, "keys are derived from the cluster key, not a %s key",
				   rps__key_role_name(cluster->role));
	if (role < RPS__KEY_ADMIN || role > RPS__KEY_PEER)
		return rps__seterr(-EINVAL, "no key of role %s is derived", name);
	if (!scope || role == RPS__KEY_ADMIN || role == RPS__KEY_PEER)
		scope = "";
	if (strlen(scope) >= RPS__SCOPE_MAX)
		return rps__seterr(-ENAMETOOLONG, "scope '%s' is longer than %u bytes", scope, RPS__SCOPE_MAX - 1);
	parts[0] = label;
	lens[0] = sizeof(label);
	parts[1] = name;
	lens[1] = strlen(name) + 1;
	parts[2] = scope;
	lens[2] = strlen(scope);
	memset(&k, 0, sizeof(k));
	k.role = role;
	snprintf(k.scope, sizeof(k.scope), "%s", scope);
	k.id = cluster->id;
	k.len = RPS__KEY_BYTES;
	rps__auth_hmac(cluster->secret, cluster->len, parts, lens, 3, k.secret);
	*out = k;
	sodium_memzero(&k, sizeof(k));
	return 0;
}

bool rps__key_may(enum rps__key_role have, enum rps__key_role want)
{
	if (have == RPS__KEY_CLUSTER)
		return want >= RPS__KEY_ADMIN && want <= RPS__KEY_PEER;
	return have == want && have != RPS__KEY_NONE;
}

const char *rps__key_path(const char *given)
{
	const char *e;

	if (given && given[0])
		return given;
	e = getenv("RDMAPS_KEY_FILE");
	return e && e[0] ? e : NULL;
}

/* hex (even length) or base64 (with or without padding) into out. */
static int decode_secret(const char *s, uint8_t *out, size_t cap, size_t *len)
{
	size_t n = strlen(s), bin = 0;
	const char *end;

	if (n % 2 == 0 && !sodium_hex2bin(out, cap, s, n, NULL, &bin, &end) && !*end) {
		*len = bin;
		return 0;
	}
	if (!sodium_base642bin(out, cap, s, n, NULL, &bin, &end, sodium_base64_VARIANT_ORIGINAL) && !*end) {
		*len = bin;
		return 0;
	}
	if (!sodium_base642bin(out, cap, s, n, NULL, &bin, &end, sodium_base64_VARIANT_ORIGINAL_NO_PADDING) &&
	    !*end) {
		*len = bin;
		return 0;
	}
	return -EINVAL;
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n'))
		*--e = '\0';
	return s;
}

static int read_key_file(const char *path, char *buf, size_t cap)
{
	struct stat st;
	ssize_t n;
	size_t got = 0;
	int fd, ret = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return rps__seterr(-errno, "key file %s: %s", path, strerror(errno));
	if (fstat(fd, &st)) {
		ret = rps__seterr(-errno, "key file %s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = rps__seterr(-EINVAL, "key file %s is not a regular file", path);
		goto out;
	}
	if (st.st_mode & 077) {
		ret = rps__seterr(-EPERM, "key file %s is readable by others (mode %04o): chmod 600 %s", path,
				  (unsigned)(st.st_mode & 07777), path);
		goto out;
	}
	/* one byte more than the limit: a file of exactly cap - 1 bytes is
	 * whole, one byte more is too long */
	while (got < cap && (n = read(fd, buf + got, cap - got)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = rps__seterr(-errno, "key file %s: %s", path, strerror(errno));
			goto out;
		}
		got += (size_t)n;
	}
	if (got == cap) {
		ret = rps__seterr(-EFBIG, "key file %s is over %zu bytes, the most a key file may have: is it a key "
				  "file? (a cluster key's secret is %d to %d bytes)", path, cap - 1, RPS__KEY_BYTES,
				  RPS__KEY_MAX);
		goto out;
	}
	buf[got] = '\0';
out:
	close(fd);
	return ret;
}

int rps__key_load(const char *path, struct rps__key *out)
{
	char *buf, *line, *save = NULL;
	struct rps__key k;
	bool have_role = false, have_id = false, have_secret = false, bare = false;
	uint64_t id = 0;
	int ret;

	ret = sodium_ready();
	if (ret)
		return ret;
	buf = malloc(KEY_FILE_MAX + 1);
	if (!buf)
		return rps__seterr(-ENOMEM, "out of memory");
	memset(&k, 0, sizeof(k));
	ret = read_key_file(path, buf, KEY_FILE_MAX + 1);
	if (ret)
		goto out;
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *s = trim(line), *v;

		if (!*s || *s == '#')
			continue;
		v = s + strcspn(s, " \t");
		if (*v)
			*v++ = '\0';
		v = trim(v);
		if (!*v && !have_role && !have_secret && !bare) {	/* a bare secret */
			v = s;
			s = "secret";
			bare = true;
		}
		if (!strcmp(s, "role")) {
			ret = rps__key_role_parse(v, &k.role);
			if (ret) {
				ret = rps__preerr(ret, "key file %s", path);
				goto out;
			}
			have_role = true;
		} else if (!strcmp(s, "scope")) {
			if (strlen(v) >= sizeof(k.scope) || strchr(v, ' ')) {
				ret = rps__seterr(-EINVAL, "key file %s: scope '%s' is not a tensor-name prefix", path, v);
				goto out;
			}
			snprintf(k.scope, sizeof(k.scope), "%s", v);
		} else if (!strcmp(s, "id")) {
			char *end;
			errno = 0;
			id = strtoull(v, &end, 16);
			if (errno || *end || !id) {
				ret = rps__seterr(-EINVAL, "key file %s: bad id '%s'", path, v);
				goto out;
			}
			have_id = true;
		} else if (!strcmp(s, "secret")) {
			/* decoded with room to spare, so a secret too long is told
			 * as such, not as one that does not decode */
			uint8_t *raw = malloc(KEY_FILE_MAX);
			size_t rawlen = 0;

			if (!raw) {
				ret = rps__seterr(-ENOMEM, "out of memory");
				goto out;
			}
			ret = have_secret ? -EINVAL : decode_secret(v, raw, KEY_FILE_MAX, &rawlen);
			if (!ret && rawlen > sizeof(k.secret))
				ret = rps__seterr(-EINVAL, "key file %s: the secret is %zu bytes, over the %zu a key may "
						  "have: make a key with psctl keygen (32 bytes)", path, rawlen,
						  sizeof(k.secret));
			else if (ret)
				ret = rps__seterr(-EINVAL, "key file %s: the secret is not one hex or base64 string",
						  path);
			else
				memcpy(k.secret, raw, (k.len = rawlen));
			sodium_memzero(raw, KEY_FILE_MAX);
			free(raw);
			if (ret)
				goto out;
			have_secret = true;
		} else {
			ret = rps__seterr(-EINVAL, "key file %s: unknown line '%s' (is it an rdmaps key?)", path, s);
			goto out;
		}
	}
	if (!have_secret) {
		ret = rps__seterr(-EINVAL, "key file %s holds no secret: make one with `psctl keygen %s`", path, path);
		goto out;
	}
	if (!have_role)
		k.role = RPS__KEY_CLUSTER;
	if (k.role == RPS__KEY_CLUSTER ? k.len < RPS__KEY_BYTES : k.len != RPS__KEY_BYTES) {
		ret = rps__seterr(-EINVAL, "key file %s: the secret is %zu bytes, a %s key has %s32", path, k.len,
				  rps__key_role_name(k.role), k.role == RPS__KEY_CLUSTER ? "at least " : "");
		goto out;
	}
	if (k.role == RPS__KEY_CLUSTER) {
		k.id = rps__key_id(k.secret, k.len);
		if (have_id && id != k.id) {
			ret = rps__seterr(-EINVAL, "key file %s: its id does not match its secret (edited?)", path);
			goto out;
		}
		k.scope[0] = '\0';
	} else if (!have_id) {
		ret = rps__seterr(-EINVAL, "key file %s: a %s key names the id of its cluster key", path,
				  rps__key_role_name(k.role));
		goto out;
	} else {
		k.id = id;
	}
	if (k.role == RPS__KEY_ADMIN)
		k.scope[0] = '\0';
	*out = k;
out:
	sodium_memzero(&k, sizeof(k));
	sodium_memzero(buf, KEY_FILE_MAX + 1);
	free(buf);
	return ret;
}

int rps__key_write(const char *path, enum rps__key_role role, const char *scope, const struct rps__key *from)
{
	struct rps__key k;
	char hex[2 * RPS__KEY_MAX + 1];
	FILE *f;
	int fd, ret;

	ret = sodium_ready();
	if (ret)
		return ret;
	memset(&k, 0, sizeof(k));
	if (role == RPS__KEY_CLUSTER) {
		k.role = RPS__KEY_CLUSTER;
		k.len = RPS__KEY_BYTES;
		randombytes_buf(k.secret, k.len);
		k.id = rps__key_id(k.secret, k.len);
	} else {
		if (!from)
			return rps__seterr(-EINVAL, "a %s key is made from the cluster key: give it",
					   rps__key_role_name(role));
		ret = rps__key_derive(from, role, scope, &k);
		if (ret)
			return ret;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		ret = rps__seterr(-errno, "writing key file %s: %s%s", path, strerror(errno),
				  errno == EEXIST ? " (never overwritten: remove it first)" : "");
		goto out;
	}
	if (fchmod(fd, 0600)) {
		ret = rps__seterr(-errno, "key file %s: chmod: %s", path, strerror(errno));
		close(fd);
		goto err_unlink;
	}
	f = fdopen(fd, "w");
	if (!f) {
		ret = rps__seterr(-errno, "key file %s: %s", path, strerror(errno));
		close(fd);
		goto err_unlink;
	}
	sodium_bin2hex(hex, sizeof(hex), k.secret, k.len);
	fprintf(f, "# rdmaps %s key%s%s%s: keep it secret (mode 0600). Made by psctl keygen.\n",
		rps__key_role_name(k.role), k.scope[0] ? " for tensors under '" : "", k.scope,
		k.scope[0] ? "'" : "");
	fprintf(f, "role %s\n", rps__key_role_name(k.role));
	if (k.role == RPS__KEY_WORKER || k.role == RPS__KEY_READER)
		fprintf(f, "scope %s\n", k.scope);
	fprintf(f, "id %016llx\nsecret %s\n", (unsigned long long)k.id, hex);
	sodium_memzero(hex, sizeof(hex));
	if (fflush(f) || fsync(fileno(f))) {
		ret = rps__seterr(-errno, "key file %s: %s", path, strerror(errno));
		fclose(f);
		goto err_unlink;
	}
	if (fclose(f)) {
		ret = rps__seterr(-errno, "key file %s: %s", path, strerror(errno));
		goto err_unlink;
	}
	goto out;
err_unlink:
	unlink(path);
out:
	sodium_memzero(&k, sizeof(k));
	return ret;
}

/* ---- this user's loopback key --------------------------------------------- */

static int local_key_dir(char *buf, size_t len)
{
	const char *d = getenv("RDMAPS_RUNTIME_DIR"), *home = getenv("HOME");
	int n;

	if (d && d[0]) {
		n = snprintf(buf, len, "%s", d);
	} else {
		if (!home || !home[0]) {
			struct passwd *pw = getpwuid(geteuid());

			home = pw ? pw->pw_dir : NULL;
		}
		if (!home || !home[0])
			return rps__seterr(-ENOENT, "no home directory to keep the loopback key in: set HOME or "
					   "RDMAPS_RUNTIME_DIR, or give --key FILE");
		n = snprintf(buf, len, "%s/.rdmaps", home);
	}
	if (n < 0 || (size_t)n + sizeof("/" RPS__LOCAL_KEY_NAME) > len)
		return rps__seterr(-ENAMETOOLONG, "the loopback key's directory %s: path too long", buf);
	return 0;
}

int rps__local_key_path(char *buf, size_t len)
{
	char dir[PATH_MAX];
	int ret = local_key_dir(dir, sizeof(dir));

	if (ret)
		return ret;
	if ((size_t)snprintf(buf, len, "%s/%s", dir, RPS__LOCAL_KEY_NAME) >= len)
		return rps__seterr(-ENAMETOOLONG, "the loopback key's path under %s: too long", dir);
	return 0;
}

/* Ours, a directory, and nobody else's to enter: else nobody can trust
 * a key in it. */
static int local_dir_check(const char *dir)
{
	struct stat st;

	if (stat(dir, &st))
		return errno == ENOENT ? -ENOENT : rps__seterr(-errno, "the loopback key's directory %s: %s", dir,
							       strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return rps__seterr(-ENOTDIR, "the loopback key's directory %s is not a directory", dir);
	if (st.st_uid != geteuid())
		return rps__seterr(-EPERM, "the loopback key's directory %s belongs to uid %u, not to us (uid %u): "
				   "use another (RDMAPS_RUNTIME_DIR) or give --key FILE", dir, (unsigned)st.st_uid,
				   (unsigned)geteuid());
	if (st.st_mode & 077)
		return rps__seterr(-EPERM, "the loopback key's directory %s is open to others (mode %04o): "
				   "chmod 700 %s", dir, (unsigned)(st.st_mode & 07777), dir);
	return 0;
}

int rps__local_key_find(char *buf, size_t len)
{
	char dir[PATH_MAX];
	int ret = local_key_dir(dir, sizeof(dir));

	if (!ret)
		ret = local_dir_check(dir);
	if (!ret)
		ret = rps__local_key_path(buf, len);
	if (!ret && access(buf, F_OK))
		ret = -ENOENT;
	if (ret == -ENOENT)
		rps__clearerr();
	return ret;
}

int rps__local_key_ensure(char *buf, size_t len, bool *made)
{
	char dir[PATH_MAX], tmp[PATH_MAX + 64];
	uint32_t r;
	int ret;

	*made = false;
	ret = local_key_dir(dir, sizeof(dir));
	if (ret)
		return ret;
	if (mkdir(dir, 0700) && errno != EEXIST)
		return rps__seterr(-errno, "making the loopback key's directory %s: %s (or give --key FILE)", dir,
				   strerror(errno));
	ret = local_dir_check(dir);
	if (ret == -ENOENT)
		ret = rps__seterr(-ENOENT, "the loopback key's directory %s is gone", dir);
	if (ret)
		return ret;
	ret = rps__local_key_path(buf, len);
	if (ret || !access(buf, F_OK))
		return ret;
	/* written whole aside, then linked into place: a reader never sees a
	 * part of it, and link (unlike rename) never replaces another's */
	rps__auth_random(&r, sizeof(r));
	snprintf(tmp, sizeof(tmp), "%s/.%s.%ld.%08x", dir, RPS__LOCAL_KEY_NAME, (long)getpid(), (unsigned)r);
	ret = rps__key_write(tmp, RPS__KEY_CLUSTER, NULL, NULL);
	if (ret)
		return ret;
	if (!link(tmp, buf))
		*made = true;
	else if (errno != EEXIST)
		ret = rps__seterr(-errno, "the loopback key %s: %s (or give --key FILE)", buf, strerror(errno));
	unlink(tmp);
	return ret;
}


/* ---- key rings -------------------------------------------------------- */

int rps__keyring_open(const char *path, bool server, struct rps__keyring **out)
{
	struct rps__keyring *ring;
	int ret;

	*out = NULL;
	if (strlen(path) >= sizeof(ring->path))
		return rps__seterr(-ENAMETOOLONG, "key file path %s is too long", path);
	ring = calloc(1, sizeof(*ring));
	if (!ring)
		return rps__seterr(-ENOMEM, "out of memory");
	ret = rps__key_load(path, &ring->cur);
	if (!ret && server && ring->cur.role != RPS__KEY_CLUSTER)
		ret = rps__seterr(-EINVAL, "key file %s holds a %s key: servers take the cluster key "
				  "(the one psctl keygen FILE makes)", path, rps__key_role_name(ring->cur.role));
	if (ret) {
		rps__key_clear(&ring->cur);
		free(ring);
		return ret;
	}
	snprintf(ring->path, sizeof(ring->path), "%s", path);
	pthread_mutex_init(&ring->lock, NULL);
	*out = ring;
	return 0;
}

void rps__keyring_close(struct rps__keyring *ring)
{
	if (!ring)
		return;
	pthread_mutex_destroy(&ring->lock);
	sodium_memzero(ring, sizeof(*ring));
	free(ring);
}

void rps__keyring_get(struct rps__keyring *ring, struct rps__key *cur, struct rps__key *prev)
{
	pthread_mutex_lock(&ring->lock);
	*cur = ring->cur;
	if (prev)
		*prev = ring->prev;
	pthread_mutex_unlock(&ring->lock);
}

int rps__keyring_reload(struct rps__keyring *ring)
{
	struct rps__key k;
	int ret;

	ret = rps__key_load(ring->path, &k);
	if (!ret && k.role != ring->cur.role)
		ret = rps__seterr(-EINVAL, "key file %s now holds a %s key, not a %s key: kept the old one", ring->path,
				  rps__key_role_name(k.role), rps__key_role_name(ring->cur.role));
	if (ret)
		return ret;
	pthread_mutex_lock(&ring->lock);
	if (k.id == ring->cur.id && k.len == ring->cur.len && !sodium_memcmp(k.secret, ring->cur.secret, k.len)) {
		rps__key_clear(&ring->prev);	/* the rotation is over */
		ret = 0;
	} else {
		ring->prev = ring->cur;
		ring->cur = k;
		ret = 1;
	}
	pthread_mutex_unlock(&ring->lock);
	rps__key_clear(&k);
	return ret;
}
