/*
 * uri.h - parsing of endpoint addresses: "tcp://HOST:PORT", "verbs://ADDR:PORT",
 * IPv6 as "tcp://[::1]:7000", and comma-separated lists of them.
 */
#ifndef RPS_URI_H
#define RPS_URI_H

#include "transport/transport.h"

struct rps__uri {
	enum rps__kind kind;
	char host[256];
	uint16_t port;
};

int rps__uri_parse(const char *s, struct rps__uri *out);
/* Parse a comma-separated list; *out is malloc'ed (free it). */
int rps__uri_list_parse(const char *s, struct rps__uri **out, int *n);
/* "tcp://host:port" into buf. */
const char *rps__uri_str(const struct rps__uri *u, char *buf, size_t len);

#endif
