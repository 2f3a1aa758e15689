/*
 * le.h - little-endian encoding of integers into byte buffers, for every
 * on-disk and on-wire format that must not depend on the host (the Raft
 * message codec, the shard map, the write-ahead log, checkpoint files), and
 * the bounds-checked reader their decoders walk hostile input with.
 */
#ifndef RPS_LE_H
#define RPS_LE_H

#include <stddef.h>
#include <stdint.h>

static inline void rps__le_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline uint16_t rps__le_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static inline void rps__le_put32(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t rps__le_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void rps__le_put64(uint8_t *p, uint64_t v)
{
	for (unsigned i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t rps__le_get64(const uint8_t *p)
{
	return (uint64_t)rps__le_get32(p) | (uint64_t)rps__le_get32(p + 4) << 32;
}

/* Bounds-checked reader over a byte buffer: { buf, len } starts it. */
struct rps__reader {
	const uint8_t *p;
	size_t left;		/* bytes not taken yet */
};

/* The next n bytes, or NULL (and nothing taken) once fewer are left. */
static inline const uint8_t *rps__reader_take(struct rps__reader *rd, size_t n)
{
	const uint8_t *p = rd->p;

	if (n > rd->left)
		return NULL;
	rd->p += n;
	rd->left -= n;
	return p;
}

#endif
