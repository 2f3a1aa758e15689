/*
 * fsutil.c - file-system helpers (contract in fsutil.h).
 */
#include "config.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* name relative to the directory dfd: unlinked, or emptied and removed.
 * *at() calls so paths never grow past PATH_MAX however deep the tree. */
static int remove_at(int dfd, const char *name)
{
	struct dirent *e;
	DIR *d;
	int fd, ret = 0;

	if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	/* Linux says EISDIR for a directory, POSIX allows EPERM */
	if (errno != EISDIR && errno != EPERM)
		return -errno;
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		ret = -errno;
		close(fd);
		return ret;
	}
	while ((e = readdir(d))) {
		int r;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		r = remove_at(dirfd(d), e->d_name);
		if (r && !ret)
			ret = r;
	}
	closedir(d);
	if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && !ret)
		ret = -errno;
	return ret;
}

int rps__remove_tree(const char *path)
{
	return remove_at(AT_FDCWD, path);
}

static int sync_fd(int (*sync)(int fd, void *ctx), void *ctx, int fd)
{
	if (sync)
		return sync(fd, ctx);
	return fsync(fd) < 0 ? -errno : 0;
}

int rps__publish_at(int dir_fd, int fd, const char *tmp, const char *name,
		    int (*sync)(int fd, void *ctx), void *ctx, enum rps__publish_step *failed)
{
	int err;

	*failed = RPS__PUBLISH_SYNC_FILE;
	err = sync_fd(sync, ctx, fd);
	if (err)
		return err;
	*failed = RPS__PUBLISH_RENAME;
	if (renameat(dir_fd, tmp, dir_fd, name) < 0)
		return -errno;
	*failed = RPS__PUBLISH_SYNC_DIR;
	return sync_fd(sync, ctx, dir_fd);
}

/* The one loop of both: positional when at is set. */
static int write_loop(int fd, const void *buf, size_t len, int at, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = at ? pwrite(fd, p, len, (off_t)off) : write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int rps__write_all(int fd, const void *buf, size_t len)
{
	return write_loop(fd, buf, len, 0, 0);
}

int rps__pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	return write_loop(fd, buf, len, 1, off);
}
