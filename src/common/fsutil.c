/*
 * fsutil.c - file-system helpers (contract in fsutil.h).
 */
#include "config.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
