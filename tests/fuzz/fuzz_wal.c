/*
 * fuzz_wal.c - libFuzzer harness for the Raft log on disk (src/control/wal.c).
 *
 * Input: [u8 mode][u32 segment length LE][segment bytes][snapshot bytes].
 * mode bit 0: write the segment, bit 1: write the snapshot, into an empty
 * directory, named after the seq/base (index/term) their headers carry
 * (bit 2: fixed names instead, so a name that disagrees with the header is
 * tried too).  Then rps__wal_open() the directory.  What it recovers must
 * be consistent (entries consecutive after the snapshot), and a log that
 * opened must take one more entry and open again with it: open may refuse
 * damage, but must never leave or accept a state a restart cannot read.
 */
#include "config.h"
#include "fuzz_common.h"
#include "control/wal.h"
#include "common/le.h"
#include "common/common.h"

#include <endian.h>

#include <inttypes.h>

static uint64_t field(const uint8_t *p, size_t n, size_t off)
{
	uint64_t v = 0;
	if (off + 8 <= n)
		memcpy(&v, p + off, 8);
	return le64toh(v);
}

static void check_recovered(const struct rps__wal_recovered *rec)
{
	uint64_t next = rec->has_snapshot ? rec->snapshot.index + 1 : 0;
	size_t i;

	if (rec->has_snapshot) {
		FUZZ_CHECK(rec->snapshot.n_voters + rec->snapshot.n_learners < (1u << 21));
		(void)fuzz_touch(rec->snapshot.voters, rec->snapshot.n_voters * 8);
		(void)fuzz_touch(rec->snapshot.learners, rec->snapshot.n_learners * 8);
		(void)fuzz_touch(rec->snapshot.data, rec->snapshot.len);
	}
	for (i = 0; i < rec->n_ents; i++) {
		const struct rps__wal_entry *e = &rec->ents[i];
		if (i == 0 && !rec->has_snapshot)
			next = e->index;
		FUZZ_CHECK(e->index == next);
		FUZZ_CHECK(i == 0 || e->term >= rec->ents[i - 1].term);
		(void)fuzz_touch(e->data, e->len);
		next++;
	}
	FUZZ_CHECK(memchr(rec->note, '\0', sizeof(rec->note)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct rps__wal_opts opts = { .fsync = RPS__WAL_FSYNC_NONE };
	const char *dir = fuzz_scratch_dir();
	struct rps__wal_recovered rec;
	struct rps__wal *w = NULL;
	const uint8_t *seg, *snap;
	size_t seglen, snaplen;
	char path[512];
	uint32_t l;
	uint8_t mode;

	if (size < 5)
		return 0;
	mode = data[0];
	memcpy(&l, data + 1, 4);
	l = le32toh(l);
	seg = data + 5;
	seglen = RPS__MIN((size_t)l, size - 5);
	snap = seg + seglen;
	snaplen = size - 5 - seglen;

	fuzz_clear_dir(dir);
	if (mode & 1) {
		uint64_t seq = mode & 4 ? 1 : field(seg, seglen, 16), base = mode & 4 ? 0 : field(seg, seglen, 24);
		snprintf(path, sizeof(path), "%s/wal-%016" PRIx64 "-%016" PRIx64 ".log", dir, seq, base);
		fuzz_write_file(path, seg, seglen);
	}
	if (mode & 2) {
		uint64_t index = mode & 4 ? 1 : field(snap, snaplen, 16), term = mode & 4 ? 1 : field(snap, snaplen, 24);
		snprintf(path, sizeof(path), "%s/snap-%016" PRIx64 "-%016" PRIx64 ".snap", dir, index, term);
		fuzz_write_file(path, snap, snaplen);
	}
	if (rps__wal_open(dir, &opts, &w, &rec) == 0) {
		struct rps__wal_hard_state hs = rec.hs;
		struct rps__wal_entry e = { .term = rps__wal_last_term(w), .index = rps__wal_last_index(w) + 1,
					    .data = "x", .len = 1 };
		size_t n = rec.n_ents;
		int ret;

		check_recovered(&rec);
		rps__wal_recovered_free(&rec);
		if (e.term < hs.term)
			e.term = hs.term;
		if (!e.term)
			e.term = hs.term = 1;
		ret = rps__wal_save(w, &hs, &e, 1);
		rps__wal_close(w);
		if (ret == 0) {
			ret = rps__wal_open(dir, &opts, &w, &rec);
			if (ret)
				fprintf(stderr, "reopen after a save refused: %s\n", rps__errbuf());
			FUZZ_CHECK(ret == 0);
			check_recovered(&rec);
			FUZZ_CHECK(rec.n_ents >= 1 && rec.ents[rec.n_ents - 1].index == e.index);
			FUZZ_CHECK(rec.n_ents == n + 1 || rec.has_snapshot);
			rps__wal_recovered_free(&rec);
			rps__wal_close(w);
		}
	}
	return 0;
}
