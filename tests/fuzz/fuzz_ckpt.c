/*
 * fuzz_ckpt.c - libFuzzer harness for the checkpoint file reader
 * (src/control/ckpt.c).
 *
 * The input is written as DIR/member-1.rpsck and read back as a restore
 * does: rps__ckpt_open(), then rps__ckpt_next() to the end.  Every array a
 * shard item points at (clocks, parameters, optimizer state) must be
 * readable for the length the item states, and the reader must stop at
 * the end or with an error, never loop.
 */
#include "config.h"
#include "fuzz_common.h"
#include "control/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *dir = fuzz_scratch_dir();
	struct rps__ckpt_reader *r = NULL;
	struct rps__ckpt_header h;
	struct rps__ckpt_item it;
	char path[512];
	char **files = NULL;
	size_t nfiles = 0;
	unsigned items = 0;
	int ret;

	snprintf(path, sizeof(path), "%s/member-1.rpsck", dir);
	fuzz_write_file(path, data, size);
	if (rps__ckpt_list(dir, &files, &nfiles) == 0)
		rps__ckpt_free_list(files, nfiles);
	if (rps__ckpt_open(path, &r, &h) != 0)
		return 0;
	while ((ret = rps__ckpt_next(r, &it)) == 1) {
		FUZZ_CHECK(++items <= size);	/* each item takes bytes of the file */
		if (it.type == RPS__CKPT_TENSOR) {
			FUZZ_CHECK(memchr(it.name, '\0', sizeof(it.name)));
			continue;
		}
		FUZZ_CHECK(it.type == RPS__CKPT_SHARD);
		(void)fuzz_touch(it.shard.clocks, (size_t)it.shard.nclocks * sizeof(uint64_t));
		(void)fuzz_touch(it.shard.params, (size_t)it.shard.elems * sizeof(float));
		(void)fuzz_touch(it.shard.state, (size_t)it.shard.nstate * sizeof(float));
	}
	FUZZ_CHECK(ret <= 0);
	rps__ckpt_close(r);
	return 0;
}
