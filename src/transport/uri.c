/*
 * uri.c - endpoint address parsing (see uri.h).
 */
#include "config.h"
#include "transport/uri.h"
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rps__uri_parse(const char *s, struct rps__uri *out)
{
	const char *rest, *colon;
	size_t hlen;
	char *end;
	unsigned long port;

	memset(out, 0, sizeof(*out));
	while (*s == ' ')
		s++;
	if (!strncmp(s, "tcp://", 6)) {
		out->kind = RPS__KIND_TCP;
		rest = s + 6;
	} else if (!strncmp(s, "verbs://", 8)) {
		out->kind = RPS__KIND_VERBS;
		rest = s + 8;
	} else {
		return rps__seterr(-EINVAL, "address '%s': expected tcp://HOST:PORT or verbs://ADDR:PORT", s);
	}
	if (*rest == '[') {
		const char *close = strchr(rest, ']');
		if (!close || close[1] != ':')
			return rps__seterr(-EINVAL, "address '%s': IPv6 form is [ADDR]:PORT", s);
		hlen = (size_t)(close - rest - 1);
		rest++;
		colon = close + 1;
	} else {
		colon = strrchr(rest, ':');
		if (!colon)
			return rps__seterr(-EINVAL, "address '%s': missing :PORT", s);
		hlen = (size_t)(colon - rest);
	}
	if (hlen == 0 || hlen >= sizeof(out->host))
		return rps__seterr(-EINVAL, "address '%s': bad host", s);
	memcpy(out->host, rest, hlen);
	out->host[hlen] = '\0';
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	while (*end == ' ')
		end++;
	if (errno || end == colon + 1 || *end || port > 65535)
		return rps__seterr(-EINVAL, "address '%s': bad port", s);
	out->port = (uint16_t)port;
	return 0;
}

int rps__uri_list_parse(const char *s, struct rps__uri **out, int *n)
{
	struct rps__uri *list = NULL;
	int count = 0, ret;
	char *copy, *tok, *save = NULL;

	if (!s || !*s)
		return rps__seterr(-EINVAL, "empty server list: give tcp://HOST:PORT[,...]");
	copy = strdup(s);
	if (!copy)
		return rps__seterr(-ENOMEM, "out of memory");
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		struct rps__uri *grown = realloc(list, sizeof(*list) * (size_t)(count + 1));
		if (!grown) {
			ret = rps__seterr(-ENOMEM, "out of memory");
			goto err;
		}
		list = grown;
		ret = rps__uri_parse(tok, &list[count]);
		if (ret)
			goto err;
		if (count && list[count].kind != list[0].kind) {
			ret = rps__seterr(-EINVAL, "server list '%s' mixes transports", s);
			goto err;
		}
		count++;
	}
	if (!count) {
		ret = rps__seterr(-EINVAL, "empty server list: give tcp://HOST:PORT[,...]");
		goto err;
	}
	free(copy);
	*out = list;
	*n = count;
	return 0;
err:
	free(list);
	free(copy);
	return ret;
}

const char *rps__uri_str(const struct rps__uri *u, char *buf, size_t len)
{
	const char *scheme = u->kind == RPS__KIND_VERBS ? "verbs" : "tcp";

	if (strchr(u->host, ':'))
		snprintf(buf, len, "%s://[%s]:%u", scheme, u->host, u->port);
	else
		snprintf(buf, len, "%s://%s:%u", scheme, u->host, u->port);
	return buf;
}
