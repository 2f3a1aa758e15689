/*
 * json.h - a small, strict JSON reader for tests that check what a program
 * printed with --json (psctl): a validator (RFC 8259 grammar, no semantics)
 * and field look-ups by path, so a test states the field it means instead
 * of matching text.  No allocation; the document is the NUL-terminated
 * string the program wrote.
 *
 * A path is keys and indexes: "leader", "members[2].role",
 * "map.partitions[5].owner", built printf-style.  Every look-up first
 * checks that the whole document is valid JSON and fails on anything else.
 */
#ifndef RPS_TESTS_JSON_H
#define RPS_TESTS_JSON_H

#include <stdbool.h>
#include <stddef.h>

/* The whole string is one JSON value (surrounding white space allowed). */
bool json_valid(const char *doc);
/* The value at path: a pointer into doc, or NULL (invalid document, no such
 * key or index, or a malformed path). */
const char *json_at(const char *doc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An unsigned integer (digits only, no sign, fraction or exponent) at the
 * path: true and *v, or false. */
bool json_u64(const char *doc, unsigned long long *v, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A string at the path, unescaped (\uXXXX only below 0x80) into buf: true,
 * or false (not a string, or it does not fit). */
bool json_str(const char *doc, char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The literal true, false or null at the path. */
bool json_is(const char *doc, const char *literal, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The number of elements of the array or members of the object at the
 * path, or -1. */
int json_len(const char *doc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
