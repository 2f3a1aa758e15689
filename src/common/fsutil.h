/*
 * fsutil.h - file-system helpers shared by the daemon, its logs and
 * checkpoints, the tools and the tests (one copy instead of one per file).
 */
#ifndef RPS_FSUTIL_H
#define RPS_FSUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Remove path and, if it is a directory, everything under it; symbolic
 * links are removed, never followed.  A path that does not exist is not an
 * error.  Returns 0 or the first negative errno met (it goes on past it). */
int rps__remove_tree(const char *path);

/* The steps of rps__publish_at, to say which one failed. */
enum rps__publish_step {
	RPS__PUBLISH_SYNC_FILE,		/* nothing published: tmp may go */
	RPS__PUBLISH_RENAME,		/* nothing published: tmp may go */
	RPS__PUBLISH_SYNC_DIR,		/* published, but a crash may lose the name */
};

/* Make the file fd, written whole under the name tmp in the directory
 * dir_fd, durable under name: sync it, rename tmp to name, sync the
 * directory.  sync(fd, ctx) does both syncs (fsync when sync is NULL).
 * Returns 0, or a negative errno with *failed set to the step that failed.
 * Neither fd nor tmp is closed or removed: the caller knows its clean-up. */
/* Write the len bytes of buf to fd whole, at its file position
 * (rps__write_all) or at offset off, leaving the position alone
 * (rps__pwrite_all), retrying after EINTR and short writes.  Returns 0, or
 * the negative errno of the write that failed (-EIO for one that wrote
 * nothing).  For files and pipes: it blocks as long as the descriptor does
 * (the TCP provider writes to non-blocking sockets under a deadline). */
int rps__write_all(int fd, const void *buf, size_t len);
int rps__pwrite_all(int fd, const void *buf, size_t len, uint64_t off);

int rps__publish_at(int dir_fd, int fd, const char *tmp, const char *name,
		    int (*sync)(int fd, void *ctx), void *ctx, enum rps__publish_step *failed);

#endif
