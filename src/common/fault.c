/*
 * fault.c - the fault list of the test hooks (fault.h): RPS_FAULT, read
 * once, split at commas and matched a whole name at a time.  Compiled to
 * nothing without ./configure --enable-fault-injection.
 */
#include "config.h"

#include "common/fault.h"

#ifdef RPS_FAULT_INJECTION
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A list is never freed once installed: a hook on another thread may be
 * reading it.  rps__fault_set keeps the ones it replaces reachable (prev),
 * so that leak checkers see no leak. */
struct fault_list {
	struct fault_list *prev;
	char names[];		/* "a,b:3,c-2" */
};

static struct fault_list *current;	/* __atomic */
static pthread_mutex_t set_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void install(const char *list)
{
	size_t n = list ? strlen(list) : 0;
	struct fault_list *l = calloc(1, sizeof(*l) + n + 1);

	if (!l)
		return;		/* (test hooks: the old list stays) */
	if (n)
		memcpy(l->names, list, n);
	pthread_mutex_lock(&set_lock);
	l->prev = current;
	__atomic_store_n(&current, l, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&set_lock);
}

static void read_env(void)
{
	install(getenv("RPS_FAULT"));
}

static const char *names(void)
{
	const struct fault_list *l;

	pthread_once(&env_once, read_env);
	l = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
	return l ? l->names : "";
}

/* The entry of the list at *at, and its length; *at moves past it.  NULL
 * at the end. */
static const char *next_entry(const char **at, size_t *len)
{
	const char *p = *at, *e;

	if (!*p)
		return NULL;
	e = strchr(p, ',');
	if (!e)
		e = p + strlen(p);
	*len = (size_t)(e - p);
	*at = *e ? e + 1 : e;
	return p;
}

bool rps__fault(const char *name)
{
	const char *at = names(), *p;
	size_t n = strlen(name), len;

	while ((p = next_entry(&at, &len)))
		if (len == n && !memcmp(p, name, n))
			return true;
	return false;
}

bool rps__fault_arg(const char *prefix, long *val)
{
	const char *at = names(), *p;
	size_t n = strlen(prefix), len, i;

	while ((p = next_entry(&at, &len))) {
		if (len <= n || len - n > 9 || memcmp(p, prefix, n))
			continue;
		for (i = n; i < len && p[i] >= '0' && p[i] <= '9'; i++)
			;
		if (i == len) {
			*val = strtol(p + n, NULL, 10);
			return true;
		}
	}
	return false;
}

void rps__fault_set(const char *list)
{
	pthread_once(&env_once, read_env);
	install(list);
}
#endif
