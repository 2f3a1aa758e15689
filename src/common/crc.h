/*
 * crc.h - the product's one CRC-32C (Castagnoli) helper, over ISA-L's
 * crc32_iscsi, with the conventions the on-disk and on-wire formats use.
 *
 * ISA-L's crc32_iscsi(buf, len, state) only runs the CRC register: it
 * neither inverts the state on the way in nor on the way out, and takes an
 * int length.  Two conventions over it are baked into existing formats and
 * must stay as they are (changing either breaks files and peers):
 *
 *   rps__crc32c(crc, buf, len)  standard CRC-32C (init ~0, final ~),
 *       chainable: rps__crc32c(rps__crc32c(0, a), b) == rps__crc32c(0, ab).
 *       The write-ahead log (wal.c) and checkpoint files (ckpt.c).
 *
 *   rps__crc32c_noinv(buf, len) init ~0 and NO final inversion, i.e.
 *       ~rps__crc32c(0, buf, len).  The shard map encoding (smap.c), the
 *       --verify push checksum (proto.c) and the partition image of a move
 *       (cplane.c).
 *
 * New formats use rps__crc32c.
 */
#ifndef RPS_CRC_H
#define RPS_CRC_H

#include <isa-l/crc.h>
#include <stddef.h>
#include <stdint.h>

/* The CRC register over buf, in chunks ISA-L's int length can take. */
static inline uint32_t rps__crc32c_reg(uint32_t reg, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	while (len) {
		size_t n = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);

		reg = crc32_iscsi((unsigned char *)p, (int)n, reg);
		p += n;
		len -= n;
	}
	return reg;
}

/* Standard CRC-32C, chainable; crc is 0 to start, or a previous result. */
static inline uint32_t rps__crc32c(uint32_t crc, const void *buf, size_t len)
{
	return ~rps__crc32c_reg(~crc, buf, len);
}

/* CRC-32C without the final inversion (the smap, push and migration
 * formats'): ~rps__crc32c(0, buf, len). */
static inline uint32_t rps__crc32c_noinv(const void *buf, size_t len)
{
	return rps__crc32c_reg(0xffffffffu, buf, len);
}

#endif
