/*
 * tmpdir.h - where tests put their scratch files: $TMPDIR when set (so
 * parallel or sandboxed runs stay out of each other's way), else /tmp.
 * Remove what they make with rps__remove_tree (src/common/fsutil.h).
 */
#ifndef RPS_TESTS_TMPDIR_H
#define RPS_TESTS_TMPDIR_H

#include <stddef.h>

/* $TMPDIR if set and not empty, else "/tmp". */
const char *test_tmpdir(void);
/* Make a fresh directory test_tmpdir()/<name>.XXXXXX, its path into buf
 * (len bytes).  Exits the program with a message if it cannot: a test
 * without its directory cannot run. */
char *test_mkdtemp(char *buf, size_t len, const char *name);

#endif
