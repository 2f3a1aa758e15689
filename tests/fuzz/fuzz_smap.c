/*
 * fuzz_smap.c - libFuzzer harness for the shard map codecs and command
 * application (src/proto/smap.c).
 *
 * First byte even: the rest is an encoded map (as in a snapshot or a
 * STATUS_REP).  What decodes must encode back to a map that decodes to the
 * same bytes, and print.
 * First byte odd: the rest is a series of commands, each a length byte and
 * an encoded command (as in a PROPOSE message or a log entry), applied in
 * order to a bootstrapped 3-member map: apply must agree with check, and
 * the map must stay well formed (encode / decode round trip).
 */
#include "config.h"
#include "fuzz_common.h"
#include "proto/smap.h"

static FILE *devnull;

static void round_trip(const struct rps__smap *m)
{
	static uint8_t a[RPS__SMAP_ENC_MAX], b[RPS__SMAP_ENC_MAX];
	static struct rps__smap m2;
	size_t la, lb;

	FUZZ_CHECK(rps__smap_encode(m, a, sizeof(a), &la) == 0);
	FUZZ_CHECK(la == rps__smap_encoded_size(m));
	FUZZ_CHECK(rps__smap_decode(a, la, &m2) == 0);
	FUZZ_CHECK(rps__smap_encode(&m2, b, sizeof(b), &lb) == 0);
	FUZZ_CHECK(la == lb && !memcmp(a, b, la));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rps__smap m;
	uint64_t index = 1;
	size_t off;

	if (!devnull)
		devnull = fopen("/dev/null", "w");
	if (size < 1)
		return 0;
	if (!(data[0] & 1)) {
		uint8_t *buf = fuzz_dup(data + 1, size - 1);
		if (rps__smap_decode(buf, size - 1, &m) == 0) {
			FUZZ_CHECK(m.nmembers <= RPS__SMAP_MAX_MEMBERS);
			FUZZ_CHECK(m.npart >= 1 && m.npart <= RPS__SMAP_MAX_PART);
			round_trip(&m);
			rps__smap_print(&m, devnull);
			rps__smap_print_json(&m, devnull);
		}
		free(buf);
		return 0;
	}
	{
		static const char *const uris[] = { "tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000", "tcp://10.0.0.3:7000" };
		FUZZ_CHECK(rps__smap_init(&m, uris, 3, 8) == 0);
	}
	for (off = 1; off < size;) {
		size_t n = data[off++];
		struct rps__smap_cmd c;
		uint8_t *buf;
		char line[512];
		int chk, ret;

		if (n > size - off)
			n = size - off;
		buf = fuzz_dup(data + off, n);
		off += n;
		ret = rps__smap_cmd_decode(buf, n, &c);
		free(buf);
		if (ret)
			continue;
		FUZZ_CHECK(memchr(c.uri, '\0', sizeof(c.uri)));
		(void)rps__smap_cmd_str(&c, line, sizeof(line));
		(void)rps__smap_cmd_name(c.type);
		chk = rps__smap_check(&m, &c);
		index++;
		ret = rps__smap_apply(&m, index, &c);
		FUZZ_CHECK(ret == chk);
		FUZZ_CHECK(m.applied == index);
		FUZZ_CHECK(m.nmembers <= RPS__SMAP_MAX_MEMBERS);
		round_trip(&m);
	}
	rps__smap_print_json(&m, devnull);
	return 0;
}
