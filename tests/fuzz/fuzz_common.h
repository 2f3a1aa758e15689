/*
 * fuzz_common.h - small helpers shared by the libFuzzer harnesses.
 */
#ifndef RPS_FUZZ_COMMON_H
#define RPS_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A harness invariant broke: say which, then abort so libFuzzer keeps the input. */
#define FUZZ_CHECK(cond)                                                                  \
	do {                                                                              \
		if (!(cond)) {                                                            \
			fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                          \
		}                                                                         \
	} while (0)

/* A copy of exactly n bytes, so that ASan sees a read one byte past it. */
static inline void *fuzz_dup(const void *p, size_t n)
{
	void *q = malloc(n ? n : 1);
	if (!q)
		abort();
	if (n)
		memcpy(q, p, n);
	return q;
}

/* Fold bytes into a value the compiler cannot drop: makes ASan check that
 * every byte a decoder hands out is readable. */
static inline uint64_t fuzz_touch(const void *p, size_t n)
{
	const volatile uint8_t *b = p;
	uint64_t h = 0;
	size_t i;
	for (i = 0; i < n; i++)
		h = h * 31 + b[i];
	return h;
}

/* Write n bytes to path (truncating); abort on failure (the harness's own fault). */
static inline void fuzz_write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f)) {
		perror(path);
		abort();
	}
}

/* A scratch directory for this process (on tmpfs when there is one),
 * created once; fuzz_clear_dir() empties it between inputs. */
static inline const char *fuzz_scratch_dir(void)
{
	static char dir[64];
	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "%s/rps-fuzz-XXXXXX",
			 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
		if (!mkdtemp(dir)) {
			perror("mkdtemp");
			abort();
		}
	}
	return dir;
}

/* Remove the plain files of dir (the harnesses create no subdirectories). */
static inline void fuzz_clear_dir(const char *dir)
{
	char path[512];
	struct dirent *de;
	DIR *d = opendir(dir);
	if (!d)
		return;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		unlink(path);
	}
	closedir(d);
}

/* A fixed machine for in-process servers (tests/topo/single-node.xml):
 * discovering this one's PCI devices takes ~20 s under ASan, and fork mode
 * restarts the process often. NULL (discover) if the fixture is missing. */
static inline const char *fuzz_topology(void)
{
	static char topo[512];
	const char *slash = strrchr(__FILE__, '/');

	snprintf(topo, sizeof(topo), "%.*s/../topo/single-node.xml", slash ? (int)(slash - __FILE__) : 1,
		 slash ? __FILE__ : ".");
	return access(topo, R_OK) == 0 ? topo : NULL;
}

#endif
