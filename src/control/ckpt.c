/*
 * ckpt.c - checkpoint files (contract in ckpt.h, format in
 * rdmaps-checkpoint(5)): a server writes the shards it owns at a consistent
 * cut into PATH/member-<id>.rpsck; a restore reads them back and refuses
 * anything it cannot trust.
 *
 * On-disk format, version 1.  Integers little-endian, floats IEEE-754
 * binary32 little-endian; every CRC is standard CRC-32C (ISA-L crc32_iscsi,
 * inverted in and out); every byte of the file is covered by one.
 *
 * File header, 64 bytes:
 *   0 magic "RPSCKPT1"  8 u32 version (1)  12 u32 header size (64)
 *   16 u64 member id  24 u32 npart  28 u32 shard elems  32 u64 checkpoint id
 *   40 u64 time (ns, CLOCK_REALTIME)  48..59 zero  60 u32 crc(0..59)
 *   Bytes 0..15 keep their meaning in every version, and the header crc is
 *   always the header's last 4 bytes, so a reader recognises (and refuses
 *   by name) a newer version instead of calling it damaged.
 * Records, each a 32-byte record header and its stored bytes:
 *   0 u32 type (1 tensor, 2 shard)  4 u32 flags (bit 0: deflated)
 *   8 u32 raw length  12 u32 stored length  16 u32 crc(raw bytes)
 *   20 u32 crc(stored bytes)  24 u32 zero  28 u32 crc(0..27)
 *   stored bytes: the raw bytes, or their raw deflate (ISA-L igzip, no
 *   gzip/zlib wrapper) when that is smaller.
 *   tensor, 128 raw bytes: 0 name[64] (NUL-terminated, zero-padded)
 *     64 u64 count  72 u32 dtype  76 u32 mode  80 u32 staleness
 *     84 u32 optimizer  88 f32 lr, momentum, beta1, beta2, eps,
 *     weight_decay, rescale  116 i32 num_workers  120 u32 flags
 *     124 u32 reserved
 *   shard, 40 + 8 nclocks + 4 elems + 4 nstate raw bytes: 0 u32 index
 *     4 u32 elems  8 u64 version  16 u64 min_clock  24 u32 flags
 *     28 u32 nclocks  32 u32 nstate  36 u32 zero  40 u64 clocks[nclocks]
 *     f32 params[elems]  f32 state[nstate]
 * Trailer, 32 bytes, laid out like a record header:
 *   0 u32 type (3)  4 u32 zero  8 u64 records  16 u64 total raw bytes
 *   24 u32 crc of the records' header crcs (each as 4 LE bytes, in order)
 *   28 u32 crc(0..27); then the end of the file.
 *
 * The reader streams: it holds one record at a time, checks a record
 * header's crc before trusting its lengths, never allocates more than the
 * file still holds, and checks every length against what the record's
 * contents imply.
 */
#include "config.h"
#include "control/ckpt.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/fsutil.h"
#include "common/le.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <isa-l/igzip_lib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "RPSCKPT1"
#define MAGIC_LEN 8u
#define HDR_SIZE 64u
#define HDR_SIZE_MAX 4096u	/* a newer version's header, for recognising it */
#define REC_HDR_SIZE 32u
#define TRAILER_SIZE 32u
#define TENSOR_RAW 128u
#define SHARD_FIXED 40u
#define REC_TENSOR 1u
#define REC_SHARD 2u
#define REC_TRAILER 3u
#define REC_DEFLATED 1u
#define MAX_ELEMS (1u << 28)
#define MAX_CLOCKS 4096u
#define SUFFIX ".rpsck"
#define PREFIX "member-"
#define PATH_BUF 4096

struct rps__ckpt_writer {
	char *path;		/* final name */
	char *tmp;		/* path + ".tmp" */
	char *dir;
	int dirfd;		/* dir, opened once: files are made relative to it */
	char name[64], tmpname[72];	/* file names inside dir */
	int fd;
	int level;
	int broken;		/* sticky error */
	uint32_t shard_elems;
	bool have_tensor;
	uint64_t off;
	uint64_t records, raw_total;
	uint32_t chain;		/* crc of the record header crcs */
	uint8_t *raw, *out, *level_buf;
	size_t cap_raw, cap_out;
	uint32_t level_buf_size;
	/* the current tensor, to check its shards */
	uint64_t count;
};

struct rps__ckpt_reader {
	char *file;
	int fd;
	int broken;		/* sticky error */
	struct rps__ckpt_header h;
	uint64_t off, size;
	uint64_t records, raw_total;
	uint32_t chain;
	bool have_tensor;
	uint64_t count;		/* the current tensor's */
	uint8_t *raw, *stored;
	size_t cap_raw, cap_stored;
};

/* ---- small helpers ------------------------------------------------------ */

static void putf(uint8_t *p, float f)
{
	uint32_t v;

	memcpy(&v, &f, 4);
	rps__le_put32(p, v);
}

static float getf(const uint8_t *p)
{
	uint32_t v = rps__le_get32(p);
	float f;

	memcpy(&f, &v, 4);
	return f;
}

static uint32_t chain_add(uint32_t chain, uint32_t rec_crc)
{
	uint8_t b[4];

	rps__le_put32(b, rec_crc);
	return rps__crc32c(chain, b, 4);
}

/* n host values of width 8 (u64) or 4 (f32) bytes to little-endian bytes
 * (le_to_host goes back); a copy on LE hosts. */
static void host_to_le(uint8_t *dst, const void *src, size_t n, size_t width)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	if (n)
		memcpy(dst, src, n * width);
#else
	const uint8_t *q = src;

	for (size_t i = 0; i < n; i++) {
		if (width == 8) {
			uint64_t v;
			memcpy(&v, q + 8 * i, 8);
			rps__le_put64(dst + 8 * i, v);
		} else {
			uint32_t v;
			memcpy(&v, q + 4 * i, 4);
			rps__le_put32(dst + 4 * i, v);
		}
	}
#endif
}

/* In place: little-endian bytes to host values. */
static void le_to_host(uint8_t *p, size_t n, size_t width)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	(void)p;
	(void)n;
	(void)width;
#else
	for (size_t i = 0; i < n; i++) {
		if (width == 8) {
			uint64_t v = rps__le_get64(p + 8 * i);
			memcpy(p + 8 * i, &v, 8);
		} else {
			uint32_t v = rps__le_get32(p + 4 * i);
			memcpy(p + 4 * i, &v, 4);
		}
	}
#endif
}

static int grow(uint8_t **buf, size_t *cap, size_t need)
{
	uint8_t *p;

	if (need <= *cap)
		return 0;
	p = malloc(need);	/* no realloc: the old contents are not needed */
	if (!p)
		return -ENOMEM;
	free(*buf);
	*buf = p;
	*cap = need;
	return 0;
}

/* Bytes read (fewer only at the end of the file), or -errno. */
static ssize_t read_full(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, p + got, len - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

static int fsync_path(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int err = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		err = -errno;
	close(fd);
	return err;
}

static void parent_of(char *buf, size_t size, const char *dir)
{
	char *slash;

	snprintf(buf, size, "%s", dir);
	while ((slash = strrchr(buf, '/')) && slash[1] == '\0' && slash != buf)
		*slash = '\0';	/* trailing slashes */
	slash = strrchr(buf, '/');
	if (!slash)
		snprintf(buf, size, ".");
	else if (slash == buf)
		buf[1] = '\0';
	else
		*slash = '\0';
}

/*
 * Open DIR, making DIR itself (mode 0700, whatever the umask) if it is
 * missing but never its parents: a mistyped path fails instead of growing
 * a tree.  The files are then made relative to this descriptor, so nothing
 * the directory's other users plant later (a symlink named like our
 * temporary file, a rename of DIR) can redirect our writes.
 */
static int open_dir(const char *dir)
{
	bool created = false;
	int fd;

	if (mkdir(dir, 0700) == 0)
		created = true;
	else if (errno != EEXIST)
		return -errno;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (created) {
		/* private, and the new directory's entry must survive a crash too */
		char parent[PATH_BUF];
		int err = fchmod(fd, 0700) < 0 ? -errno : 0;

		if (!err) {
			parent_of(parent, sizeof(parent), dir);
			err = fsync_path(parent);
		}
		if (err) {
			close(fd);
			return err;
		}
	}
	return fd;
}

int rps__ckpt_dir_open(const char *dir)
{
	int fd;

	if (!dir || !*dir)
		return rps__seterr(-EINVAL, "checkpoint: no directory given");
	fd = open_dir(dir);
	if (fd == -ENOENT)
		return rps__seterr(fd, "checkpoint directory %.200s: its parent does not exist; "
				   "create it first (only the last component is made)", dir);
	if (fd < 0)
		return rps__seterr(fd, "checkpoint directory %.200s: %s", dir, strerror(-fd));
	return fd;
}

/*
 * Create the temporary file: O_EXCL | O_NOFOLLOW, so a symlink or file
 * planted under that name is never followed or reused. A leftover of an
 * earlier crashed checkpoint (or a planted link) is unlinked, which removes
 * the name, not what a link points to, and the create is tried once more.
 */
static int create_tmp(int dirfd, const char *name)
{
	const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
	int fd = openat(dirfd, name, flags, 0600);

	if (fd < 0 && errno == EEXIST) {
		if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
			return -errno;
		fd = openat(dirfd, name, flags, 0600);
	}
	if (fd < 0)
		return -errno;
	/* 0600 exactly: the umask may only have narrowed it */
	if (fchmod(fd, 0600) < 0) {
		int err = -errno;

		close(fd);
		unlinkat(dirfd, name, 0);
		return err;
	}
	return fd;
}

/* ---- checkpoint names -------------------------------------------------------- */

static bool name_char_ok(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
	       c == '_' || c == '-' || c == '/';
}

int rps__ckpt_name_check(const char *name)
{
	size_t n, i, start;

	if (!name || !*name)
		return rps__seterr(-EINVAL, "checkpoint name is empty: give one such as run1/step1000");
	n = strnlen(name, RPS__CKPT_NAME_MAX + 1);
	if (n > RPS__CKPT_NAME_MAX)
		return rps__seterr(-EINVAL, "checkpoint name longer than %u characters: give a shorter one",
				   RPS__CKPT_NAME_MAX);
	for (i = 0; i < n; i++)
		if (!name_char_ok(name[i])) {
			unsigned char c = (unsigned char)name[i];

			if (c >= ' ' && c < 0x7f)
				return rps__seterr(-EINVAL, "checkpoint name: '%c' not allowed: use A-Z a-z 0-9"
						   " . _ - and / between components", c);
			return rps__seterr(-EINVAL, "checkpoint name: byte %#04x not allowed: use A-Z a-z"
					   " 0-9 . _ - and / between components", c);
		}
	if (name[0] == '/')
		return rps__seterr(-EINVAL, "checkpoint name is an absolute path: give one relative to"
				   " the servers' --checkpoint-dir");
	for (start = 0; start <= n; start = i + 1) {
		for (i = start; i < n && name[i] != '/'; i++)
			;
		if (i == start)
			return rps__seterr(-EINVAL, "checkpoint name has an empty component ('//' or a '/'"
					   " at the end)");
		if ((i - start == 1 && name[start] == '.') ||
		    (i - start == 2 && name[start] == '.' && name[start + 1] == '.'))
			return rps__seterr(-EINVAL, "checkpoint name has a '.' or '..' component: it must"
					   " stay under --checkpoint-dir");
	}
	return 0;
}

/* The last component of path (the name up to it, for messages), in dfd:
 * a directory, opened without following a link; made (0700, its parent
 * synced) when missing and make is set. */
static int open_component(int dfd, const char *comp, const char *path, bool make)
{
	const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
	bool made = false;
	struct stat st;
	int fd, err;

	if (make) {
		if (mkdirat(dfd, comp, 0700) == 0)
			made = true;
		else if (errno != EEXIST)
			goto fail;
	}
	fd = openat(dfd, comp, flags);
	if (fd < 0)
		goto fail;
	/* 0700 exactly: the umask may only have narrowed it */
	if (made && (fchmod(fd, 0700) < 0 || fsync(dfd) < 0)) {
		err = -errno;
		close(fd);
		return rps__seterr(err, "checkpoint: making '%s' under --checkpoint-dir: %s", path, strerror(-err));
	}
	return fd;

fail:
	err = -errno;
	/* O_NOFOLLOW | O_DIRECTORY says ENOTDIR (or ELOOP) for a link: tell it apart */
	if ((err == -ENOTDIR || err == -ELOOP) && fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISLNK(st.st_mode))
		return rps__seterr(-ELOOP, "'%s' under --checkpoint-dir is a symbolic link: refused"
				   " (checkpoints never follow links)", path);
	if (err == -ENOENT)
		return rps__seterr(err, "no such checkpoint: '%s' is missing under --checkpoint-dir", path);
	return rps__seterr(err, "checkpoint: '%s' under --checkpoint-dir: %s", path, strerror(-err));
}

int rps__ckpt_name_open(int base_fd, const char *name, bool make)
{
	char comp[RPS__CKPT_NAME_MAX + 1], upto[RPS__CKPT_NAME_MAX + 1];
	const char *p = name;
	int fd, err;

	err = rps__ckpt_name_check(name);
	if (err)
		return err;
	fd = fcntl(base_fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		err = -errno;
		return rps__seterr(err, "checkpoint: --checkpoint-dir: %s", strerror(-err));
	}
	while (*p) {
		size_t len = strcspn(p, "/");
		int next;

		memcpy(comp, p, len);
		comp[len] = '\0';
		snprintf(upto, sizeof(upto), "%.*s", (int)(p - name + (ptrdiff_t)len), name);
		next = open_component(fd, comp, upto, make);
		close(fd);
		if (next < 0)
			return next;
		fd = next;
		p += len + (p[len] == '/');
	}
	return fd;
}

/* Elements of shard index of a tensor of count elements; 0 if none. */
static uint32_t shard_size(uint64_t count, uint32_t shard_elems, uint32_t index)
{
	uint64_t first = (uint64_t)index * shard_elems;

	if (!shard_elems || first >= count)
		return 0;
	return (uint32_t)RPS__MIN((uint64_t)shard_elems, count - first);
}

static uint64_t shard_raw_len(uint32_t elems, uint32_t nclocks, uint32_t nstate)
{
	return SHARD_FIXED + 8ull * nclocks + 4ull * elems + 4ull * nstate;
}

/* ---- writer ------------------------------------------------------------- */

static void header_encode(uint8_t *p, const struct rps__ckpt_header *h)
{
	memset(p, 0, HDR_SIZE);
	memcpy(p, MAGIC, MAGIC_LEN);
	rps__le_put32(p + 8, RPS__CKPT_VERSION);
	rps__le_put32(p + 12, HDR_SIZE);
	rps__le_put64(p + 16, h->member_id);
	rps__le_put32(p + 24, h->npart);
	rps__le_put32(p + 28, h->shard_elems);
	rps__le_put64(p + 32, h->ckpt_id);
	rps__le_put64(p + 40, h->time_ns);
	rps__le_put32(p + 60, rps__crc32c(0, p, 60));
}

static void writer_free(struct rps__ckpt_writer *w)
{
	if (w->dirfd >= 0)
		close(w->dirfd);
	free(w->level_buf);
	free(w->out);
	free(w->raw);
	free(w->dir);
	free(w->tmp);
	free(w->path);
	free(w);
}

/* What every writer is started with; 0 or -EINVAL. */
static int create_args(const struct rps__ckpt_header *h, int level, struct rps__ckpt_writer **out)
{
	if (!h || !out)
		return rps__seterr(-EINVAL, "checkpoint: no header given");
	if (level < 0 || level > 3)
		return rps__seterr(-EINVAL, "checkpoint: compression level %d: use 0 (store) to 3", level);
	if (!h->shard_elems || h->shard_elems > MAX_ELEMS)
		return rps__seterr(-EINVAL, "checkpoint: shard size %u: must be 1..%u", h->shard_elems,
				   MAX_ELEMS);
	return 0;
}

/* The writer in the directory dirfd (its own from now on, closed by
 * writer_free, also on failure); label: how messages name the directory. */
static int create_in(int dirfd, const char *label, const struct rps__ckpt_header *h, int level,
		     struct rps__ckpt_writer **out)
{
	struct rps__ckpt_writer *w;
	uint8_t hdr[HDR_SIZE];
	int err;

	w = calloc(1, sizeof(*w));
	if (!w) {
		close(dirfd);
		return rps__seterr(-ENOMEM, "checkpoint: out of memory");
	}
	w->fd = -1;
	w->dirfd = dirfd;
	w->level = level;
	w->shard_elems = h->shard_elems;
	snprintf(w->name, sizeof(w->name), PREFIX "%" PRIu64 SUFFIX, h->member_id);
	snprintf(w->tmpname, sizeof(w->tmpname), "%s.tmp", w->name);
	w->dir = strdup(label);
	if (!w->dir || asprintf(&w->path, "%s/%s", label, w->name) < 0) {
		w->path = NULL;
		err = rps__seterr(-ENOMEM, "checkpoint: out of memory");
		goto err_free;
	}
	if (asprintf(&w->tmp, "%s.tmp", w->path) < 0) {
		w->tmp = NULL;
		err = rps__seterr(-ENOMEM, "checkpoint: out of memory");
		goto err_free;
	}
	if (level > 0) {
		static const uint32_t sizes[] = { 0, ISAL_DEF_LVL1_DEFAULT, ISAL_DEF_LVL2_DEFAULT,
						  ISAL_DEF_LVL3_DEFAULT };

		w->level_buf_size = sizes[level];
		w->level_buf = malloc(w->level_buf_size);
		if (!w->level_buf) {
			err = rps__seterr(-ENOMEM, "checkpoint: out of memory");
			goto err_free;
		}
	}
	w->fd = create_tmp(w->dirfd, w->tmpname);
	if (w->fd < 0) {
		err = w->fd;
		rps__seterr(err, "checkpoint: creating %.200s: %s", w->tmp, strerror(-err));
		goto err_free;
	}
	header_encode(hdr, h);
	err = rps__write_all(w->fd, hdr, sizeof(hdr));
	if (err) {
		rps__seterr(err, "checkpoint: writing %.200s: %s", w->tmp, strerror(-err));
		goto err_unlink;
	}
	w->off = HDR_SIZE;
	*out = w;
	return 0;

err_unlink:
	close(w->fd);
	unlinkat(w->dirfd, w->tmpname, 0);
err_free:
	writer_free(w);
	return err;
}

int rps__ckpt_create(const char *dir, const struct rps__ckpt_header *h, int level,
		     struct rps__ckpt_writer **out)
{
	int err = create_args(h, level, out), fd;

	if (err)
		return err;
	fd = rps__ckpt_dir_open(dir);
	if (fd < 0)
		return fd;
	return create_in(fd, dir, h, level, out);
}

int rps__ckpt_create_at(int dir_fd, const char *label, const struct rps__ckpt_header *h, int level,
			struct rps__ckpt_writer **out)
{
	int err = create_args(h, level, out), fd;

	if (err)
		return err;
	fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		err = -errno;
		return rps__seterr(err, "checkpoint directory %.200s: %s", label, strerror(-err));
	}
	return create_in(fd, label, h, level, out);
}

/* Seal and write the record whose raw bytes are w->raw[0..len). */
static int put_record(struct rps__ckpt_writer *w, uint32_t type, size_t len)
{
	uint8_t hdr[REC_HDR_SIZE];
	const uint8_t *stored = w->raw;
	uint32_t flags = 0, stored_len = (uint32_t)len, rec_crc;
	int err;

	if (w->level > 0 && len > 64) {
		struct isal_zstream zs;

		err = grow(&w->out, &w->cap_out, len);
		if (err)
			return rps__seterr(err, "checkpoint: out of memory");
		memset(&zs, 0, sizeof(zs));	/* init leaves fields igzip reads */
		isal_deflate_stateless_init(&zs);
		zs.level = (uint32_t)w->level;
		zs.level_buf = w->level_buf;
		zs.level_buf_size = w->level_buf_size;
		zs.gzip_flag = IGZIP_DEFLATE;
		zs.end_of_stream = 1;
		zs.flush = NO_FLUSH;
		zs.next_in = w->raw;
		zs.avail_in = (uint32_t)len;
		zs.next_out = w->out;
		zs.avail_out = (uint32_t)len - 1;	/* worth it only if smaller */
		if (isal_deflate_stateless(&zs) == COMP_OK && zs.avail_in == 0 &&
		    zs.total_out < len) {
			flags |= REC_DEFLATED;
			stored = w->out;
			stored_len = zs.total_out;
		}
	}
	rps__le_put32(hdr, type);
	rps__le_put32(hdr + 4, flags);
	rps__le_put32(hdr + 8, (uint32_t)len);
	rps__le_put32(hdr + 12, stored_len);
	rps__le_put32(hdr + 16, rps__crc32c(0, w->raw, len));
	rps__le_put32(hdr + 20, stored == w->raw ? rps__le_get32(hdr + 16) : rps__crc32c(0, stored, stored_len));
	rps__le_put32(hdr + 24, 0);
	rec_crc = rps__crc32c(0, hdr, 28);
	rps__le_put32(hdr + 28, rec_crc);
	err = rps__write_all(w->fd, hdr, sizeof(hdr));
	if (!err)
		err = rps__write_all(w->fd, stored, stored_len);
	if (err) {
		w->broken = err;
		return rps__seterr(err, "checkpoint: writing %.200s: %s", w->tmp, strerror(-err));
	}
	w->off += REC_HDR_SIZE + stored_len;
	w->records++;
	w->raw_total += len;
	w->chain = chain_add(w->chain, rec_crc);
	return 0;
}

int rps__ckpt_put_tensor(struct rps__ckpt_writer *w, const char *name, const struct rps__tensor_spec *spec)
{
	const float *fl;
	uint8_t *p;
	size_t nlen;
	int err;

	if (w->broken)
		return rps__seterr(w->broken, "checkpoint: %.200s: an earlier write failed", w->tmp);
	nlen = name ? strnlen(name, RPS__NAME_MAX) : 0;
	if (nlen == 0 || nlen >= RPS__NAME_MAX)
		return rps__seterr(-EINVAL, "checkpoint: tensor name empty or longer than %u bytes",
				   RPS__NAME_MAX - 1);
	err = grow(&w->raw, &w->cap_raw, TENSOR_RAW);
	if (err)
		return rps__seterr(err, "checkpoint: out of memory");
	p = w->raw;
	memset(p, 0, TENSOR_RAW);
	memcpy(p, name, nlen);
	rps__le_put64(p + 64, spec->count);
	rps__le_put32(p + 72, spec->dtype);
	rps__le_put32(p + 76, spec->mode);
	rps__le_put32(p + 80, spec->staleness);
	rps__le_put32(p + 84, spec->optimizer);
	fl = (const float[]){ spec->lr, spec->momentum, spec->beta1, spec->beta2, spec->eps,
			      spec->weight_decay, spec->rescale };
	for (unsigned i = 0; i < 7; i++)
		putf(p + 88 + 4 * i, fl[i]);
	rps__le_put32(p + 116, (uint32_t)spec->num_workers);
	rps__le_put32(p + 120, spec->flags);
	rps__le_put32(p + 124, spec->reserved);
	err = put_record(w, REC_TENSOR, TENSOR_RAW);
	if (err)
		return err;
	w->have_tensor = true;
	w->count = spec->count;
	return 0;
}

int rps__ckpt_put_shard(struct rps__ckpt_writer *w, const struct rps__ckpt_shard *s)
{
	uint64_t len;
	uint8_t *p;
	int err;

	if (w->broken)
		return rps__seterr(w->broken, "checkpoint: %.200s: an earlier write failed", w->tmp);
	if (!w->have_tensor)
		return rps__seterr(-EINVAL, "checkpoint: shard %u before any tensor", s->index);
	if (!s->elems || s->elems != shard_size(w->count, w->shard_elems, s->index))
		return rps__seterr(-EINVAL, "checkpoint: shard %u has %u elements; the tensor's"
				   " layout wants %u", s->index, s->elems,
				   shard_size(w->count, w->shard_elems, s->index));
	if (s->nstate != 0 && s->nstate != s->elems && s->nstate != 2 * s->elems)
		return rps__seterr(-EINVAL, "checkpoint: shard %u: %u optimizer state floats for %u"
				   " elements (0, 1x or 2x)", s->index, s->nstate, s->elems);
	if (s->nclocks > MAX_CLOCKS || (s->flags & ~RPS__CKPT_SHARD_READY))
		return rps__seterr(-EINVAL, "checkpoint: shard %u: %u clocks (at most %u), flags %#x",
				   s->index, s->nclocks, MAX_CLOCKS, s->flags);
	if (!s->params || (s->nclocks && !s->clocks) || (s->nstate && !s->state))
		return rps__seterr(-EINVAL, "checkpoint: shard %u: missing data", s->index);
	len = shard_raw_len(s->elems, s->nclocks, s->nstate);
	err = grow(&w->raw, &w->cap_raw, (size_t)len);
	if (err)
		return rps__seterr(err, "checkpoint: out of memory for a %" PRIu64 "-byte shard", len);
	p = w->raw;
	rps__le_put32(p, s->index);
	rps__le_put32(p + 4, s->elems);
	rps__le_put64(p + 8, s->version);
	rps__le_put64(p + 16, s->min_clock);
	rps__le_put32(p + 24, s->flags);
	rps__le_put32(p + 28, s->nclocks);
	rps__le_put32(p + 32, s->nstate);
	rps__le_put32(p + 36, 0);
	p += SHARD_FIXED;
	host_to_le(p, s->clocks, s->nclocks, 8);
	p += 8 * (size_t)s->nclocks;
	host_to_le(p, s->params, s->elems, 4);
	p += 4 * (size_t)s->elems;
	host_to_le(p, s->state, s->nstate, 4);
	return put_record(w, REC_SHARD, (size_t)len);
}

int rps__ckpt_finish(struct rps__ckpt_writer *w, uint64_t *bytes_written)
{
	uint8_t t[TRAILER_SIZE];
	enum rps__publish_step failed;
	int err;

	if (w->broken) {
		err = rps__seterr(w->broken, "checkpoint: %.200s: an earlier write failed", w->tmp);
		goto err_unlink;
	}
	rps__le_put32(t, REC_TRAILER);
	rps__le_put32(t + 4, 0);
	rps__le_put64(t + 8, w->records);
	rps__le_put64(t + 16, w->raw_total);
	rps__le_put32(t + 24, w->chain);
	rps__le_put32(t + 28, rps__crc32c(0, t, 28));
	err = rps__write_all(w->fd, t, sizeof(t));
	if (err) {
		rps__seterr(err, "checkpoint: writing %.200s: %s", w->tmp, strerror(-err));
		goto err_unlink;
	}
	w->off += TRAILER_SIZE;
	err = rps__publish_at(w->dirfd, w->fd, w->tmpname, w->name, NULL, NULL, &failed);
	if (err && failed != RPS__PUBLISH_SYNC_DIR) {
		rps__seterr(err, "checkpoint: %s %.200s: %s", failed == RPS__PUBLISH_RENAME ? "renaming" : "syncing",
			    w->tmp, strerror(-err));
		goto err_unlink;
	}
	close(w->fd);
	w->fd = -1;
	if (err) {
		/* the file is whole, but its name may not survive a crash */
		rps__seterr(err, "checkpoint: syncing directory %.200s: %s", w->dir, strerror(-err));
		goto err_free;
	}
	if (bytes_written)
		*bytes_written = w->off;
	writer_free(w);
	return 0;

err_unlink:
	close(w->fd);
	unlinkat(w->dirfd, w->tmpname, 0);
err_free:
	writer_free(w);
	return err;
}

void rps__ckpt_abort(struct rps__ckpt_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0) {
		close(w->fd);
		unlinkat(w->dirfd, w->tmpname, 0);
	}
	writer_free(w);
}

/* ---- reader ------------------------------------------------------------- */

#define BAD(r, err, at, ...) bad(r, err, at, __VA_ARGS__)

static int bad(struct rps__ckpt_reader *r, int err, uint64_t at, const char *fmt, ...) RPS__PRINTF(4, 5);

static int bad(struct rps__ckpt_reader *r, int err, uint64_t at, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	r->broken = err;
	return rps__seterr(err, "checkpoint %.200s: %s (at byte %" PRIu64 "): the file is damaged"
			   " or incomplete; use another checkpoint", r->file, what, at);
}

static int truncated(struct rps__ckpt_reader *r, uint64_t at)
{
	r->broken = -EBADMSG;
	return rps__seterr(-EBADMSG, "checkpoint %.200s: truncated at byte %" PRIu64 ": the file is"
			   " incomplete; use another checkpoint", r->file, at);
}

/* Exactly len bytes at the current offset, or a refusal. */
static int read_exact(struct rps__ckpt_reader *r, void *buf, size_t len)
{
	ssize_t n = read_full(r->fd, buf, len);

	if (n < 0) {
		r->broken = (int)n;
		return rps__seterr((int)n, "checkpoint %.200s: reading at byte %" PRIu64 ": %s",
				   r->file, r->off, strerror((int)-n));
	}
	if ((size_t)n < len)
		return truncated(r, r->off + (uint64_t)n);
	r->off += len;
	return 0;
}

void rps__ckpt_close(struct rps__ckpt_reader *r)
{
	if (!r)
		return;
	free(r->stored);
	free(r->raw);
	if (r->fd >= 0)
		close(r->fd);
	free(r->file);
	free(r);
}

/* Open the file name in dfd (AT_FDCWD: a path), which must be a regular
 * one, and note its size.  O_NONBLOCK: a fifo planted under a member
 * file's name must not hang the reader (no effect on a regular file). */
static int reader_open_file(struct rps__ckpt_reader *r, int dfd, const char *name, int flags)
{
	struct stat st;
	int err;

	r->fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC | flags);
	if (r->fd < 0) {
		err = -errno;
		if (err == -ELOOP && (flags & O_NOFOLLOW))
			return rps__seterr(err, "checkpoint %.200s: a symbolic link: refused (checkpoints never"
					   " follow links)", r->file);
		return rps__seterr(err, "checkpoint %.200s: %s", r->file, strerror(-err));
	}
	if (fstat(r->fd, &st) < 0) {
		err = -errno;
		return rps__seterr(err, "checkpoint %.200s: %s", r->file, strerror(-err));
	}
	if (!S_ISREG(st.st_mode))
		return rps__seterr(-EINVAL, "checkpoint %.200s: not a regular file", r->file);
	r->size = (uint64_t)st.st_size;
	return 0;
}

/* Read and check the header: magic, version (a newer one is told apart from
 * damage), size, checksum, reserved bytes, then its fields. */
static int reader_read_header(struct rps__ckpt_reader *r)
{
	uint8_t hdr[HDR_SIZE_MAX];
	uint32_t version, hsize;
	int err;

	err = read_exact(r, hdr, 16);
	if (err)
		return err;
	if (memcmp(hdr, MAGIC, MAGIC_LEN) != 0)
		return BAD(r, -EILSEQ, 0, "not an rdmaps checkpoint (bad magic)");
	version = rps__le_get32(hdr + 8);
	hsize = rps__le_get32(hdr + 12);
	if (version != RPS__CKPT_VERSION) {
		/* A newer file is recognised by its own header crc; anything
		 * else claiming another version is damage. */
		if (version > RPS__CKPT_VERSION && hsize >= HDR_SIZE && hsize <= HDR_SIZE_MAX &&
		    hsize % 4 == 0 && read_full(r->fd, hdr + 16, hsize - 16) == (ssize_t)(hsize - 16) &&
		    rps__crc32c(0, hdr, hsize - 4) == rps__le_get32(hdr + hsize - 4))
			return rps__seterr(-EPROTO, "checkpoint %.200s: format version %u, written by a"
					   " newer rdmaps (this one reads version %u): restore with"
					   " that version", r->file, version, RPS__CKPT_VERSION);
		return BAD(r, -EILSEQ, 8, "bad format version %u or damaged header", version);
	}
	if (hsize != HDR_SIZE)
		return BAD(r, -EBADMSG, 12, "header size %u, version 1 has %u", hsize, HDR_SIZE);
	err = read_exact(r, hdr + 16, HDR_SIZE - 16);
	if (err)
		return err;
	if (rps__crc32c(0, hdr, 60) != rps__le_get32(hdr + 60))
		return BAD(r, -EILSEQ, 0, "header checksum mismatch");
	for (unsigned i = 48; i < 60; i++)
		if (hdr[i])
			return BAD(r, -EBADMSG, i, "reserved header bytes not zero");
	r->h.member_id = rps__le_get64(hdr + 16);
	r->h.npart = rps__le_get32(hdr + 24);
	r->h.shard_elems = rps__le_get32(hdr + 28);
	r->h.ckpt_id = rps__le_get64(hdr + 32);
	r->h.time_ns = rps__le_get64(hdr + 40);
	if (!r->h.shard_elems || r->h.shard_elems > MAX_ELEMS)
		return BAD(r, -EBADMSG, 28, "shard size %u (1..%u)", r->h.shard_elems, MAX_ELEMS);
	return 0;
}

/* The reader of name in dfd; label: the file's name in messages. */
static int open_in(int dfd, const char *name, const char *label, int flags, struct rps__ckpt_reader **out,
		   struct rps__ckpt_header *h)
{
	struct rps__ckpt_reader *r;
	int err;

	r = calloc(1, sizeof(*r));
	if (!r)
		return rps__seterr(-ENOMEM, "checkpoint: out of memory");
	r->fd = -1;
	r->file = strdup(label);
	if (!r->file) {
		err = rps__seterr(-ENOMEM, "checkpoint: out of memory");
		goto err_free;
	}
	err = reader_open_file(r, dfd, name, flags);
	if (!err)
		err = reader_read_header(r);
	if (err)
		goto err_free;
	if (h)
		*h = r->h;
	*out = r;
	return 0;

err_free:
	rps__ckpt_close(r);
	return err;
}

int rps__ckpt_open(const char *file, struct rps__ckpt_reader **out, struct rps__ckpt_header *h)
{
	if (!file || !out)
		return rps__seterr(-EINVAL, "checkpoint: no file given");
	return open_in(AT_FDCWD, file, file, 0, out, h);
}

int rps__ckpt_open_at(int dir_fd, const char *name, const char *label, struct rps__ckpt_reader **out,
		      struct rps__ckpt_header *h)
{
	if (!name || !label || !out)
		return rps__seterr(-EINVAL, "checkpoint: no file given");
	return open_in(dir_fd, name, label, O_NOFOLLOW, out, h);
}

static int parse_tensor(struct rps__ckpt_reader *r, uint64_t at, struct rps__ckpt_item *it)
{
	const uint8_t *p = r->raw;
	struct rps__tensor_spec *s = &it->spec;
	size_t nlen = strnlen((const char *)p, RPS__NAME_MAX);

	if (nlen == 0 || nlen >= RPS__NAME_MAX)
		return BAD(r, -EBADMSG, at, "tensor name %s", nlen ? "not NUL-terminated" : "empty");
	memset(it, 0, sizeof(*it));
	it->type = RPS__CKPT_TENSOR;
	memcpy(it->name, p, nlen);
	s->count = rps__le_get64(p + 64);
	s->dtype = rps__le_get32(p + 72);
	s->mode = rps__le_get32(p + 76);
	s->staleness = rps__le_get32(p + 80);
	s->optimizer = rps__le_get32(p + 84);
	s->lr = getf(p + 88);
	s->momentum = getf(p + 92);
	s->beta1 = getf(p + 96);
	s->beta2 = getf(p + 100);
	s->eps = getf(p + 104);
	s->weight_decay = getf(p + 108);
	s->rescale = getf(p + 112);
	s->num_workers = (int32_t)rps__le_get32(p + 116);
	s->flags = rps__le_get32(p + 120);
	s->reserved = rps__le_get32(p + 124);
	if (s->count / r->h.shard_elems >= UINT32_MAX)
		return BAD(r, -EBADMSG, at, "tensor '%s' of %" PRIu64 " elements", it->name, s->count);
	r->have_tensor = true;
	r->count = s->count;
	return 1;
}

static int parse_shard(struct rps__ckpt_reader *r, uint64_t at, size_t len, struct rps__ckpt_item *it)
{
	uint8_t *p = r->raw;
	struct rps__ckpt_shard *s = &it->shard;
	uint32_t want;

	if (!r->have_tensor)
		return BAD(r, -EBADMSG, at, "shard before any tensor");
	if (len < SHARD_FIXED)
		return BAD(r, -EBADMSG, at, "shard record of %zu bytes", len);
	memset(it, 0, sizeof(*it));
	it->type = RPS__CKPT_SHARD;
	s->index = rps__le_get32(p);
	s->elems = rps__le_get32(p + 4);
	s->version = rps__le_get64(p + 8);
	s->min_clock = rps__le_get64(p + 16);
	s->flags = rps__le_get32(p + 24);
	s->nclocks = rps__le_get32(p + 28);
	s->nstate = rps__le_get32(p + 32);
	if (s->elems == 0 || s->elems > MAX_ELEMS)
		return BAD(r, -EBADMSG, at, "shard %u of %u elements", s->index, s->elems);
	want = shard_size(r->count, r->h.shard_elems, s->index);
	if (s->elems != want)
		return BAD(r, -EBADMSG, at, "shard %u has %u elements, the tensor's layout %u",
			   s->index, s->elems, want);
	if (s->nstate > 2 * s->elems || (s->nstate != 0 && s->nstate != s->elems && s->nstate != 2 * s->elems))
		return BAD(r, -EBADMSG, at, "shard %u: %u optimizer state floats for %u elements",
			   s->index, s->nstate, s->elems);
	if (s->nclocks > MAX_CLOCKS)
		return BAD(r, -EBADMSG, at, "shard %u: %u clocks (at most %u)", s->index, s->nclocks, MAX_CLOCKS);
	if (s->flags & ~RPS__CKPT_SHARD_READY)
		return BAD(r, -EBADMSG, at, "shard %u: unknown flags %#x", s->index, s->flags);
	if (rps__le_get32(p + 36))
		return BAD(r, -EBADMSG, at, "shard %u: reserved field not zero", s->index);
	if (shard_raw_len(s->elems, s->nclocks, s->nstate) != len)
		return BAD(r, -EBADMSG, at, "shard %u: record of %zu bytes, its contents need %" PRIu64,
			   s->index, len, shard_raw_len(s->elems, s->nclocks, s->nstate));
	p += SHARD_FIXED;
	le_to_host(p, s->nclocks, 8);
	s->clocks = s->nclocks ? (const uint64_t *)(void *)p : NULL;
	p += 8 * (size_t)s->nclocks;
	le_to_host(p, s->elems, 4);
	s->params = (const float *)(void *)p;
	p += 4 * (size_t)s->elems;
	le_to_host(p, s->nstate, 4);
	s->state = s->nstate ? (const float *)(void *)p : NULL;
	return 1;
}

static int read_trailer(struct rps__ckpt_reader *r, const uint8_t *t, uint64_t at)
{
	uint8_t extra;
	ssize_t n;

	if (rps__le_get32(t + 4))
		return BAD(r, -EBADMSG, at, "bad trailer");
	if (rps__le_get64(t + 8) != r->records || rps__le_get64(t + 16) != r->raw_total || rps__le_get32(t + 24) != r->chain)
		return BAD(r, -EBADMSG, at, "trailer mismatch: it counts %" PRIu64 " records of %" PRIu64
			   " bytes, the file has %" PRIu64 " of %" PRIu64 "%s", rps__le_get64(t + 8), rps__le_get64(t + 16),
			   r->records, r->raw_total, rps__le_get32(t + 24) != r->chain ? ", other records" : "");
	n = read_full(r->fd, &extra, 1);
	if (n < 0) {
		r->broken = (int)n;
		return rps__seterr((int)n, "checkpoint %.200s: reading at byte %" PRIu64 ": %s",
				   r->file, r->off, strerror((int)-n));
	}
	if (n > 0)
		return BAD(r, -EBADMSG, r->off, "data after the trailer");
	r->broken = 0;
	return 0;
}

int rps__ckpt_next(struct rps__ckpt_reader *r, struct rps__ckpt_item *it)
{
	uint8_t hdr[REC_HDR_SIZE];
	uint32_t type, flags, raw_len, stored_len, rec_crc;
	const uint8_t *raw;
	uint64_t at = r->off;
	int err;

	if (r->broken)
		return rps__seterr(r->broken, "checkpoint %.200s: refused earlier", r->file);
	if (r->off == UINT64_MAX)
		return 0;	/* the trailer was read */
	err = read_exact(r, hdr, sizeof(hdr));
	if (err)
		return err;
	rec_crc = rps__le_get32(hdr + 28);
	if (rps__crc32c(0, hdr, 28) != rec_crc)
		return BAD(r, -EILSEQ, at, "record header checksum mismatch");
	type = rps__le_get32(hdr);
	if (type == REC_TRAILER) {
		err = read_trailer(r, hdr, at);
		if (!err)
			r->off = UINT64_MAX;
		return err;
	}
	flags = rps__le_get32(hdr + 4);
	raw_len = rps__le_get32(hdr + 8);
	stored_len = rps__le_get32(hdr + 12);
	if (type != REC_TENSOR && type != REC_SHARD)
		return BAD(r, -EBADMSG, at, "unknown record type %u", type);
	if ((flags & ~REC_DEFLATED) || rps__le_get32(hdr + 24))
		return BAD(r, -EBADMSG, at, "unknown record flags %#x", flags);
	if (type == REC_TENSOR ? raw_len != TENSOR_RAW :
	    (raw_len < SHARD_FIXED || raw_len > shard_raw_len(MAX_ELEMS, MAX_CLOCKS, 2 * MAX_ELEMS)))
		return BAD(r, -EBADMSG, at, "record of %u bytes", raw_len);
	if ((flags & REC_DEFLATED) ? (stored_len == 0 || stored_len >= raw_len) : stored_len != raw_len)
		return BAD(r, -EBADMSG, at, "stored length %u for %u bytes", stored_len, raw_len);
	if (stored_len > r->size - r->off) {
		/* never allocate what the file cannot hold */
		return truncated(r, r->size);
	}
	err = grow(&r->raw, &r->cap_raw, RPS__MAX(raw_len, 8u));
	if (!err && (flags & REC_DEFLATED))
		err = grow(&r->stored, &r->cap_stored, stored_len);
	if (err) {
		r->broken = err;
		return rps__seterr(err, "checkpoint %.200s: out of memory for a %u-byte record", r->file, raw_len);
	}
	err = read_exact(r, (flags & REC_DEFLATED) ? r->stored : r->raw, stored_len);
	if (err)
		return err;
	if (rps__crc32c(0, (flags & REC_DEFLATED) ? r->stored : r->raw, stored_len) != rps__le_get32(hdr + 20))
		return BAD(r, -EILSEQ, at, "record checksum mismatch");
	if (flags & REC_DEFLATED) {
		struct inflate_state st;

		isal_inflate_init(&st);
		st.crc_flag = ISAL_DEFLATE;
		st.next_in = r->stored;
		st.avail_in = stored_len;
		st.next_out = r->raw;
		st.avail_out = raw_len;
		if (isal_inflate_stateless(&st) != ISAL_DECOMP_OK || st.total_out != raw_len ||
		    st.avail_in != 0)
			return BAD(r, -EBADMSG, at, "compressed record does not inflate to %u bytes", raw_len);
	}
	raw = r->raw;
	if (rps__crc32c(0, raw, raw_len) != rps__le_get32(hdr + 16))
		return BAD(r, -EILSEQ, at, "record data checksum mismatch");
	r->records++;
	r->raw_total += raw_len;
	r->chain = chain_add(r->chain, rec_crc);
	if (type == REC_TENSOR)
		return parse_tensor(r, at, it);
	return parse_shard(r, at, raw_len, it);
}

/* ---- listing ------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool member_name(const char *name)
{
	size_t n = strlen(name), lp = strlen(PREFIX), ls = strlen(SUFFIX);

	return n > lp + ls && strncmp(name, PREFIX, lp) == 0 && strcmp(name + n - ls, SUFFIX) == 0;
}

void rps__ckpt_free_list(char **files, size_t n)
{
	if (!files)
		return;
	for (size_t i = 0; i < n; i++)
		free(files[i]);
	free(files);
}

/* The member files of the directory d (closed here), sorted: their paths
 * (label/name), or with names_only their names; links followed or not as
 * stat_flags says. */
static int list_in(DIR *d, const char *label, bool names_only, int stat_flags, char ***files, size_t *n)
{
	char **v = NULL;
	size_t cnt = 0;
	uint32_t cap = 0;
	struct dirent *de;
	struct stat st;
	int err;

	while ((de = readdir(d))) {
		char *path;

		if (!member_name(de->d_name))
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, stat_flags) < 0 || !S_ISREG(st.st_mode))
			continue;
		if (rps__grow(&v, &cap, cnt + 1, sizeof(*v), 8)) {
			err = rps__seterr(-ENOMEM, "checkpoint: out of memory");
			goto err_free;
		}
		if (names_only)
			path = strdup(de->d_name);
		else if (asprintf(&path, "%s/%s", label, de->d_name) < 0)
			path = NULL;
		if (!path) {
			err = rps__seterr(-ENOMEM, "checkpoint: out of memory");
			goto err_free;
		}
		v[cnt++] = path;
	}
	closedir(d);
	if (!cnt) {
		free(v);
		return rps__seterr(-ENOENT, "checkpoint directory %.200s: no member-*" SUFFIX " files", label);
	}
	qsort(v, cnt, sizeof(*v), cmp_str);
	*files = v;
	*n = cnt;
	return 0;

err_free:
	rps__ckpt_free_list(v, cnt);
	closedir(d);
	return err;
}

int rps__ckpt_list(const char *dir, char ***files, size_t *n)
{
	DIR *d;
	int err;

	*files = NULL;
	*n = 0;
	d = opendir(dir);
	if (!d) {
		err = -errno;
		return rps__seterr(err, "checkpoint directory %.200s: %s", dir, strerror(-err));
	}
	return list_in(d, dir, false, 0, files, n);
}

int rps__ckpt_list_at(int dir_fd, const char *label, char ***names, size_t *n)
{
	int fd, err;
	DIR *d;

	*names = NULL;
	*n = 0;
	fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
	d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		err = -errno;
		if (fd >= 0)
			close(fd);
		return rps__seterr(err, "checkpoint directory %.200s: %s", label, strerror(-err));
	}
	rewinddir(d);	/* (a dup shares the offset) */
	return list_in(d, label, true, AT_SYMLINK_NOFOLLOW, names, n);
}
