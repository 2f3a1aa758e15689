/*
 * fsutil.h - file-system helpers shared by the daemon, the tools and the
 * tests (one copy instead of one per file).
 */
#ifndef RPS_FSUTIL_H
#define RPS_FSUTIL_H

/* Remove path and, if it is a directory, everything under it; symbolic
 * links are removed, never followed.  A path that does not exist is not an
 * error.  Returns 0 or the first negative errno met (it goes on past it). */
int rps__remove_tree(const char *path);

#endif
