/*
 * err.c - per-thread error messages and process logging.
 *
 * The message buffer is thread-local so that two clients, or two threads of
 * one client, never read each other's failures; no other global state.
 */
#include "config.h"
#include "common/common.h"
#include "rdmaps.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

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

/* Control bytes (a newline above all) as \xNN: a peer's string logged as
 * is could end the line and forge one of its own. */
const char *rps__escape(const char *s, char *out, size_t len)
{
	size_t o = 0;

	if (!len)
		return out;
	for (; *s && o + 1 < len; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch >= 0x20 && ch != 0x7f) {
			out[o++] = (char)ch;
		} else if (o + 5 < len) {
			snprintf(out + o, len - o, "\\x%02x", ch);
			o += 4;
		} else {
			break;
		}
	}
	out[o] = '\0';
	return out;
}

static const char *const log_names[] = { "error", "warn", "info", "debug" };

/* "error", "warn", "info" or "debug" (any case): its level, or -EINVAL. */
int rps__log_level_parse(const char *name)
{
	for (int i = 0; i < (int)RPS__ARRAY_SIZE(log_names); i++)
		if (!strcasecmp(name, log_names[i]))
			return i;
	return -EINVAL;
}

void rps__log(int level, const char *fmt, ...)
{
	char line[1024], esc[4 * sizeof(line)];
	va_list ap;

	if (level > rps__log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* one record, one line, whatever the arguments held */
	fprintf(stderr, "%s: %s\n", log_names[level], rps__escape(line, esc, sizeof(esc)));
}

/* Public (rdmaps.h): here, not in the client, because the server and the
 * tools name the same errors with the same words. */
__attribute__((visibility("default"))) const char *rps_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case RPS_ESTALE_EPOCH: return "shard moved (stale epoch)";
	case RPS_ELEASE: return "shard lock lease expired";
	}
	if (err == -EMSGSIZE)
		return "size or dtype does not match the tensor";
	if (err < 0 && err > -4096) {
		const char *s = strerrordesc_np(-err);
		if (s)
			return s;
	}
	return "unknown error";
}
