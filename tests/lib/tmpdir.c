/*
 * tmpdir.c - scratch directories for the tests (see tmpdir.h).
 */
#include "config.h"
#include "tmpdir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *test_tmpdir(void)
{
	const char *tmp = getenv("TMPDIR");

	return tmp && *tmp ? tmp : "/tmp";
}

char *test_mkdtemp(char *buf, size_t len, const char *name)
{
	int n = snprintf(buf, len, "%s/%s.XXXXXX", test_tmpdir(), name);

	if (n < 0 || (size_t)n >= len) {
		fprintf(stderr, "%s: TMPDIR %s is too long for the test's buffer: set a shorter TMPDIR\n", name,
			test_tmpdir());
		exit(1);
	}
	if (!mkdtemp(buf)) {
		fprintf(stderr, "%s: mkdtemp %s: %s: set TMPDIR to a writable directory\n", name, buf,
			strerror(errno));
		exit(1);
	}
	return buf;
}
