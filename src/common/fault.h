/*
 * fault.h - the one entry point of the test hooks (fault injection), after
 * SQLite's sqlite3FaultSim: code that can be made to fail on purpose asks
 * rps__fault("name"), and the tests name the faults they want in the
 * environment variable read by fault.c, a comma-separated list of names
 * ("bootstrap-replicas-2,isolate-signals"; rdmapsd(8), rdmaps(3)).
 *
 * Compiled in only by ./configure --enable-fault-injection (config.h's
 * RPS_FAULT_INJECTION), as the tests and CI build.  Otherwise every hook
 * is a constant false, the compiler drops the branches it guards, and the
 * installed library and programs carry no hook and do not read the
 * variable (tests/fault-hooks.sh checks both).
 */
#ifndef RPS_COMMON_FAULT_H
#define RPS_COMMON_FAULT_H

#include <stdbool.h>

#include "common/common.h"

#ifndef PACKAGE_VERSION
#error "include config.h before common/fault.h: it says whether the hooks are compiled in"
#endif

#ifdef RPS_FAULT_INJECTION
#define RPS__FAULT_INJECTION 1

/* True if the fault list holds exactly this name. */
bool rps__fault(const char *name);

/* A hook with a number: true, with *val set, if the list holds prefix
 * followed by a decimal number ("kill-mid-push:9" for the prefix
 * "kill-mid-push:", "bootstrap-replicas-2" for "bootstrap-replicas-"). */
bool rps__fault_arg(const char *prefix, long *val);

/* Tests: replace the list (NULL: none) in this process, as a child does
 * after fork with a list of its own; the environment is read only once,
 * at the first hook asked. */
void rps__fault_set(const char *list);

#else
#define RPS__FAULT_INJECTION 0

static inline bool rps__fault(const char *name)
{
	(void)name;
	return false;
}

static inline bool rps__fault_arg(const char *prefix, long *val)
{
	(void)prefix;
	(void)val;
	return false;
}

static inline void rps__fault_set(const char *list)
{
	(void)list;
}
#endif

/* A counted hook (set from rps__fault_arg): true once, at the count's
 * N-th call. */
static inline bool rps__fault_countdown(int *left)
{
	return RPS__FAULT_INJECTION && RPS__UNLIKELY(*left) && --*left == 0;
}

#endif
