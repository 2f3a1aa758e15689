/*
 * err.c - per-thread error messages and process logging.
 *
 * The message buffer is thread-local so that two clients, or two threads of
 * one client, never read each other's failures; no other global state.
 */
#include "config.h"
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char errbuf[512];

int rps__seterr(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	return err;
}

int rps__preerr(int err, const char *fmt, ...)
{
	char prefix[256], old[sizeof(errbuf)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, errbuf, sizeof(old));
	/* Truncation is fine: a cut message beats none. */
	if (old[0])
		snprintf(errbuf, sizeof(errbuf), "%.200s: %.300s", prefix, old);
	else
		snprintf(errbuf, sizeof(errbuf), "%.200s: %.300s", prefix, strerror(-err));
	return err;
}

const char *rps__errbuf(void)
{
	return errbuf;
}

void rps__clearerr(void)
{
	errbuf[0] = '\0';
}

int rps__log_level = RPS__LOG_WARN;

void rps__log(int level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	va_list ap;

	if (level > rps__log_level)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "%s: ", names[level]);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}
