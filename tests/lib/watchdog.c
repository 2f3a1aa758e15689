/*
 * watchdog.c - the per-test alarm of the integration tests (see watchdog.h).
 */
#include "config.h"
#include "watchdog.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char msg[160];		/* built before any alarm: the handler only writes it */
static unsigned limit_s;
static void (*fire_fn)(void);

static void on_watchdog(int sig)
{
	ssize_t r = write(2, msg, strlen(msg));

	(void)sig;
	(void)r;
	if (fire_fn)
		fire_fn();
	_exit(1);
}

void watchdog_init(const char *prog, unsigned default_s, void (*on_fire)(void))
{
	const char *env = getenv("RPS_IT_WATCHDOG_S");

	snprintf(msg, sizeof(msg), "%s: a test ran past its watchdog: killing every process it started\n", prog);
	limit_s = env && atoi(env) > 0 ? (unsigned)atoi(env) : default_s;
	fire_fn = on_fire;
	signal(SIGALRM, on_watchdog);
}

void watchdog_arm(void)
{
	alarm(limit_s);
}

void watchdog_disarm(void)
{
	alarm(0);
}
