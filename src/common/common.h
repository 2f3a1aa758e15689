/*
 * common.h - small helpers shared by every module of librdmaps and rdmapsd:
 * container_of, error messages, logging, time.
 *
 * Errors: a failing internal function records one line in a per-thread
 * buffer ("what failed: why: what to do") with rps__seterr() and returns a
 * negative errno.  The public API hands that line out through
 * rps_last_error().
 *
 * The files of src/common/ (tests/filemaps.sh checks that this names each):
 *   err.c      per-thread error messages and process logging (this header)
 *   fsutil.c   file-system helpers, the write-all loops (fsutil.h)
 *   parse.c    sizes and counts from the command line (parse.h)
 *   topo.c     hwloc placement near the RDMA device (topo.h)
 *   fault.c    the test hooks (fault.h): only with --enable-fault-injection
 *   grow.c     rps__grow, the doubling step of every growing array
 * crc.h (CRC-32C) and le.h (byte order) are headers only.
 */
#ifndef RPS_COMMON_H
#define RPS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define rps__container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

#define RPS__ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define RPS__MIN(a, b) ((a) < (b) ? (a) : (b))
#define RPS__MAX(a, b) ((a) > (b) ? (a) : (b))
#define RPS__ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

#if defined(__GNUC__)
#define RPS__PRINTF(f, a) __attribute__((format(printf, f, a)))
#define RPS__LIKELY(x) __builtin_expect(!!(x), 1)
#define RPS__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define RPS__PRINTF(f, a)
#define RPS__LIKELY(x) (x)
#define RPS__UNLIKELY(x) (x)
#endif

/* Record a one-line message for this thread and return err (a negative
 * errno).  The message should say what failed and what to do. */
int rps__seterr(int err, const char *fmt, ...) RPS__PRINTF(2, 3);
/* Prefix the current message: "ctx: <old message>". Returns err. */
int rps__preerr(int err, const char *fmt, ...) RPS__PRINTF(2, 3);
const char *rps__errbuf(void);
void rps__clearerr(void);

/* Logging for the daemons and tools (stderr).  Levels: 0 error, 1 warn,
 * 2 info, 3 debug.  The level is per process; the library never logs. */
enum { RPS__LOG_ERROR, RPS__LOG_WARN, RPS__LOG_INFO, RPS__LOG_DEBUG };
extern int rps__log_level;
int rps__log_level_parse(const char *name);
void rps__log(int level, const char *fmt, ...) RPS__PRINTF(2, 3);
/* s with control bytes written as \xNN, into out (len bytes, truncated);
 * returns out.  rps__log applies it to every line; use it for peer
 * strings that go elsewhere (replies, error messages). */
const char *rps__escape(const char *s, char *out, size_t len);

/* Make room for `need` elements of `elem` bytes in the array *arrp (a
 * pointer to the array pointer) of capacity *cap: doubling from `first`
 * (or from *cap), realloc, *arrp and *cap updated.  0, or -ENOMEM with
 * the array and *cap untouched. */
int rps__grow(void *arrp, uint32_t *cap, uint32_t need, size_t elem, uint32_t first);

static inline uint64_t rps__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
