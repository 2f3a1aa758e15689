/*
 * json.c - the strict JSON reader of tests/lib/json.h: a recursive-descent
 * validator whose skip functions also walk a path to the value it names.
 */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_PATH_MAX 256

/* ---- the grammar: each function skips one item, NULL if malformed ---------- */

static const char *js_ws(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	return s;
}

static const char *js_value(const char *s, int depth);

static const char *js_string(const char *s)
{
	if (*s++ != '"')
		return NULL;
	while (*s && *s != '"') {
		if ((unsigned char)*s < 0x20)
			return NULL;
		if (*s == '\\') {
			s++;
			if (*s == 'u') {
				int k;
				for (k = 1; k <= 4; k++)
					if (!strchr("0123456789abcdefABCDEF", s[k]) || !s[k])
						return NULL;
				s += 4;
			} else if (!*s || !strchr("\"\\/bfnrt", *s)) {
				return NULL;
			}
		}
		s++;
	}
	return *s == '"' ? s + 1 : NULL;
}

static const char *js_number(const char *s)
{
	const char *d;

	if (*s == '-')
		s++;
	if (*s == '0')
		s++;
	else if (*s >= '1' && *s <= '9')
		while (*s >= '0' && *s <= '9')
			s++;
	else
		return NULL;
	if (*s == '.') {
		d = ++s;
		while (*s >= '0' && *s <= '9')
			s++;
		if (s == d)
			return NULL;
	}
	if (*s == 'e' || *s == 'E') {
		s++;
		if (*s == '+' || *s == '-')
			s++;
		d = s;
		while (*s >= '0' && *s <= '9')
			s++;
		if (s == d)
			return NULL;
	}
	return s;
}

static const char *js_value(const char *s, int depth)
{
	if (depth > 64)
		return NULL;
	s = js_ws(s);
	if (*s == '{' || *s == '[') {
		char close = *s == '{' ? '}' : ']';
		bool obj = *s == '{';
		s = js_ws(s + 1);
		if (*s == close)
			return s + 1;
		for (;;) {
			if (obj) {
				s = js_string(js_ws(s));
				if (!s)
					return NULL;
				s = js_ws(s);
				if (*s++ != ':')
					return NULL;
			}
			s = js_value(s, depth + 1);
			if (!s)
				return NULL;
			s = js_ws(s);
			if (*s == ',') {
				s++;
				continue;
			}
			return *s == close ? s + 1 : NULL;
		}
	}
	if (*s == '"')
		return js_string(s);
	if (!strncmp(s, "true", 4))
		return s + 4;
	if (!strncmp(s, "false", 5))
		return s + 5;
	if (!strncmp(s, "null", 4))
		return s + 4;
	return js_number(s);
}

bool json_valid(const char *doc)
{
	const char *s = doc ? js_value(doc, 0) : NULL;

	return s && !*js_ws(s);
}

/* ---- paths ---------------------------------------------------------------------- */

/* In the (valid) object at s, the value of the member named key[0..n). */
static const char *member(const char *s, const char *key, size_t n)
{
	s = js_ws(s);
	if (*s != '{')
		return NULL;
	s = js_ws(s + 1);
	while (*s == '"') {
		const char *k = s + 1, *end = js_string(s);
		bool match = (size_t)(end - 1 - k) == n && !strncmp(k, key, n);
		s = js_ws(js_ws(end) + 1);	/* past ':' */
		if (match)
			return s;
		s = js_ws(js_value(s, 0));
		if (*s != ',')
			return NULL;
		s = js_ws(s + 1);
	}
	return NULL;
}

/* In the (valid) array at s, element i. */
static const char *element(const char *s, unsigned long i)
{
	s = js_ws(s);
	if (*s != '[' || *js_ws(s + 1) == ']')
		return NULL;
	s = js_ws(s + 1);
	while (i--) {
		s = js_ws(js_value(s, 0));
		if (*s != ',')
			return NULL;
		s = js_ws(s + 1);
	}
	return s;
}

static const char *walk(const char *doc, const char *path)
{
	const char *s = js_ws(doc), *p = path;

	if (!json_valid(doc))
		return NULL;
	while (s && *p) {
		if (*p == '[') {
			char *end;
			unsigned long i = strtoul(p + 1, &end, 10);
			if (end == p + 1 || *end != ']')
				return NULL;
			s = element(s, i);
			p = end + 1;
		} else {
			size_t n;
			if (*p == '.' && p != path)
				p++;
			n = strcspn(p, ".[");
			if (!n)
				return NULL;
			s = member(s, p, n);
			p += n;
		}
	}
	return s;
}

static const char *vwalk(const char *doc, const char *fmt, va_list ap)
{
	char path[JSON_PATH_MAX];
	int n = vsnprintf(path, sizeof(path), fmt, ap);

	if (n < 0 || (size_t)n >= sizeof(path))
		return NULL;
	return walk(doc, path);
}

const char *json_at(const char *doc, const char *fmt, ...)
{
	const char *s;
	va_list ap;

	va_start(ap, fmt);
	s = vwalk(doc, fmt, ap);
	va_end(ap);
	return s;
}

bool json_u64(const char *doc, unsigned long long *v, const char *fmt, ...)
{
	const char *s, *end;
	unsigned long long x = 0;
	va_list ap;

	va_start(ap, fmt);
	s = vwalk(doc, fmt, ap);
	va_end(ap);
	if (!s || *s < '0' || *s > '9')
		return false;
	end = js_number(s);
	for (; s < end; s++) {
		if (*s < '0' || *s > '9' || x > (~0ull - (unsigned)(*s - '0')) / 10)
			return false;	/* a fraction, an exponent or too big */
		x = x * 10 + (unsigned)(*s - '0');
	}
	*v = x;
	return true;
}

bool json_str(const char *doc, char *buf, size_t len, const char *fmt, ...)
{
	const char *s;
	size_t n = 0;
	va_list ap;

	va_start(ap, fmt);
	s = vwalk(doc, fmt, ap);
	va_end(ap);
	if (!s || *s++ != '"' || !len)
		return false;
	for (; *s != '"'; s++) {
		char c = *s;
		if (c == '\\') {
			c = *++s;
			if (c == 'u') {
				unsigned long u = strtoul((char[5]){ s[1], s[2], s[3], s[4], 0 }, NULL, 16);
				if (u >= 0x80)
					return false;
				c = (char)u;
				s += 4;
			} else {
				c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' :
				    c == 'f' ? '\f' : c;
			}
		}
		if (n + 1 >= len)
			return false;
		buf[n++] = c;
	}
	buf[n] = '\0';
	return true;
}

bool json_is(const char *doc, const char *literal, const char *fmt, ...)
{
	const char *s;
	size_t n = strlen(literal);
	va_list ap;

	va_start(ap, fmt);
	s = vwalk(doc, fmt, ap);
	va_end(ap);
	return s && !strncmp(s, literal, n) && js_value(s, 0) == s + n;
}

int json_len(const char *doc, const char *fmt, ...)
{
	const char *s;
	int n = 0;
	va_list ap;

	va_start(ap, fmt);
	s = vwalk(doc, fmt, ap);
	va_end(ap);
	if (!s || (*s != '[' && *s != '{'))
		return -1;
	if (*js_ws(s + 1) == (*s == '[' ? ']' : '}'))
		return 0;
	for (s = js_ws(s + 1);; s = js_ws(s + 1)) {
		if (*s == '"' && *js_ws(js_string(s)) == ':')	/* an object's key */
			s = js_ws(js_ws(js_string(s)) + 1);
		s = js_ws(js_value(s, 0));
		n++;
		if (*s != ',')
			return n;
	}
}
