/*
 * wal_open.c - opening a node's log directory: list it, replay it, choose
 * the snapshot to recover from, check against the commit witness, then
 * repair (torn tail, damaged snapshots, leftovers) and continue; and close.
 */
#include "config.h"
#include "control/wal_int.h"
#include "common/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- open ----------------------------------------------------------------- */

static bool parse_hex16(const char *s, uint64_t *v)
{
	uint64_t x = 0;

	for (unsigned i = 0; i < 16; i++) {
		char c = s[i];

		if (c >= '0' && c <= '9')
			x = x << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			x = x << 4 | (uint64_t)(c - 'a' + 10);
		else
			return false;
	}
	*v = x;
	return true;
}

static bool parse_name(const char *name, const char *prefix, const char *suffix,
		       uint64_t *a, uint64_t *b)
{
	size_t lp = strlen(prefix), ls = strlen(suffix);

	if (strlen(name) != lp + 33 + ls || strncmp(name, prefix, lp) != 0 ||
	    name[lp + 16] != '-' || strcmp(name + lp + 33, suffix) != 0)
		return false;
	return parse_hex16(name + lp, a) && parse_hex16(name + lp + 17, b);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

struct dir_listing {
	struct wal_seg *segs;
	size_t n_segs, cap_segs;
	struct wal_snapref *snaps;
	size_t n_snaps, cap_snaps;
	char **tmps;
	size_t n_tmps, cap_tmps;
};

static void dir_listing_free(struct dir_listing *l)
{
	for (size_t i = 0; i < l->n_tmps; i++)
		free(l->tmps[i]);
	free(l->tmps);
	free(l->snaps);
	free(l->segs);
}

static int seg_cmp(const void *a, const void *b)
{
	const struct wal_seg *x = a, *y = b;

	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int list_dir(int dir_fd, const char *dir, struct dir_listing *l)
{
	struct dirent *de;
	DIR *d;
	int fd, err = 0;

	fd = dup(dir_fd);
	if (fd < 0 || !(d = fdopendir(fd))) {
		err = -errno;
		if (fd >= 0)
			close(fd);
		return rps__seterr(err, "wal: listing %.150s: %s", dir, strerror(-err));
	}
	while (!err && (errno = 0, de = readdir(d))) {
		uint64_t a, b;

		if (parse_name(de->d_name, "wal-", ".log", &a, &b)) {
			err = rps__wal_grow((void **)&l->segs, &l->cap_segs, l->n_segs + 1, sizeof(*l->segs));
			if (!err)
				l->segs[l->n_segs++] = (struct wal_seg){ a, b };
		} else if (parse_name(de->d_name, "snap-", ".snap", &a, &b)) {
			err = rps__wal_grow((void **)&l->snaps, &l->cap_snaps, l->n_snaps + 1, sizeof(*l->snaps));
			if (!err)
				l->snaps[l->n_snaps++] = (struct wal_snapref){ a, b };
		} else if (ends_with(de->d_name, ".tmp") &&
			   (!strncmp(de->d_name, "wal-", 4) || !strncmp(de->d_name, "snap-", 5))) {
			err = rps__wal_grow((void **)&l->tmps, &l->cap_tmps, l->n_tmps + 1, sizeof(*l->tmps));
			if (!err && !(l->tmps[l->n_tmps++] = strdup(de->d_name))) {
				l->n_tmps--;
				err = rps__seterr(-ENOMEM, "wal: out of memory");
			}
		}
	}
	if (!err && errno) {
		err = -errno;
		rps__seterr(err, "wal: listing %.150s: %s", dir, strerror(-err));
	}
	closedir(d);
	if (err)
		return err;
	if (l->n_segs)
		qsort(l->segs, l->n_segs, sizeof(*l->segs), seg_cmp);
	if (l->n_snaps)
		qsort(l->snaps, l->n_snaps, sizeof(*l->snaps), rps__wal_snapref_cmp);
	return 0;
}

static int replay_all(int dir_fd, const char *dir, const struct dir_listing *l, struct replay *r)
{
	char name[NAME_BUF];
	int err;

	for (size_t i = 0; i < l->n_segs; i++) {
		uint8_t *buf;
		size_t size;

		rps__wal_seg_name(name, l->segs[i].seq, l->segs[i].base_index);
		if (i > 0 && l->segs[i].seq != l->segs[i - 1].seq + 1)
			return rps__seterr(-EBADMSG, "wal: %.150s: log segment %" PRIu64 " is missing"
					   " (next is %s): " RESTORE_HINT, dir, l->segs[i - 1].seq + 1,
					   name, dir);
		err = rps__wal_grow((void **)&r->bufs, &r->cap_bufs, r->n_bufs + 1, sizeof(*r->bufs));
		if (err)
			return err;
		err = rps__wal_read_file(dir_fd, name, &buf, &size);
		if (err)
			return rps__seterr(err, "wal: reading %.150s/%s: %s", dir, name, strerror(-err));
		r->bufs[r->n_bufs++] = buf;
		err = rps__wal_replay_segment(r, name, l->segs[i].seq, l->segs[i].base_index, buf,
					      size, i == 0, i + 1 == l->n_segs);
		if (err)
			return err;
	}
	return 0;
}

static void replay_free(struct replay *r)
{
	for (size_t i = 0; i < r->n_bufs; i++)
		free(r->bufs[i]);
	free(r->bufs);
	free(r->markers);
	free(r->pend);
	free(r->ents);
}

/*
 * Pick the newest intact snapshot and cut the replayed log to what follows
 * it.  Damaged snapshots are passed over (they are the last *damaged of
 * l->snaps); the one chosen must fit the log, else open is refused.
 */
static int choose_snapshot(int dir_fd, const char *dir, const struct dir_listing *l,
			   struct replay *r, uint8_t **snap_buf, struct rps__wal_snapshot *snap,
			   bool *has_snap, bool *needs_marker, size_t *damaged, char *damage,
			   size_t damage_len)
{
	uint64_t last, t;
	char name[NAME_BUF];
	int err;

	for (size_t i = l->n_snaps; i-- > 0;) {
		rps__wal_snap_name(name, l->snaps[i].index, l->snaps[i].term);
		err = rps__wal_snap_load(dir_fd, dir, name, l->snaps[i].index, l->snaps[i].term, snap_buf, snap);
		if (err == -EBADMSG) {
			if (*damaged == 0)
				snprintf(damage, damage_len, "%s", rps__errbuf());
			(*damaged)++;
			continue;
		}
		if (err)
			return err;
		*has_snap = true;
		break;
	}
	last = rps__wal_replay_last(r);
	if (!*has_snap) {
		if (r->base == 0)
			return 0;
		if (*damaged)
			return rps__seterr(-EBADMSG, "%.200s; no older snapshot is usable and the log"
					   " starts after entry %" PRIu64 ": " RESTORE_HINT,
					   damage, r->base, dir);
		return rps__seterr(-EBADMSG, "wal: %.150s: the log starts after entry %" PRIu64
				   " but there is no snapshot: " RESTORE_HINT, dir, r->base, dir);
	}
	if (snap->index >= r->base && rps__wal_replay_term_at(r, snap->index, &t) && t == snap->term) {
		size_t drop = (size_t)(snap->index - r->base);

		if (drop) {
			memmove(r->ents, r->ents + drop, (r->n - drop) * sizeof(*r->ents));
			r->n -= drop;
		}
	} else if (snap->index >= r->base && !rps__wal_replay_has_marker(r, snap->index)) {
		/* The crash came between the snapshot's rename and its log
		 * marker: do what the marker would have done (open writes it). */
		r->n = 0;
	} else {
		rps__wal_snap_name(name, snap->index, snap->term);
		return rps__seterr(-EBADMSG, "wal: %.150s/%s (term %" PRIu64 ") does not fit the log,"
				   " which holds entries %" PRIu64 "..%" PRIu64 "%s: " RESTORE_HINT,
				   dir, name, snap->term, r->base + 1, last,
				   *damaged ? " (newer snapshots are damaged)" : "", dir);
	}
	*needs_marker = !rps__wal_replay_has_marker(r, snap->index);
	r->base = snap->index;
	r->base_term = snap->term;
	r->base_term_known = true;
	return 0;
}

/* A directory entry is durable only once its parent directory is synced. */
static int sync_parent(const char *dir, const struct rps__wal_opts *o)
{
	char *parent = strdup(dir), *slash;
	size_t n;
	int fd, err;

	if (!parent)
		return rps__seterr(-ENOMEM, "wal: out of memory");
	n = strlen(parent);
	while (n > 1 && parent[n - 1] == '/')
		parent[--n] = '\0';
	slash = strrchr(parent, '/');
	if (!slash)
		strcpy(parent, ".");
	else if (slash == parent)
		parent[1] = '\0';
	else
		*slash = '\0';
	fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		goto out;
	}
	err = rps__wal_do_sync(o, fd, false);
	close(fd);
out:
	if (err)
		rps__seterr(err, "wal: syncing %.150s: %s", parent, strerror(-err));
	free(parent);
	return err;
}

static void note_add(char *note, size_t size, const char *fmt, ...) RPS__PRINTF(3, 4);

static void note_add(char *note, size_t size, const char *fmt, ...)
{
	size_t used = strlen(note);
	va_list ap;

	if (used && used + 2 < size) {
		strcpy(note + used, "; ");
		used += 2;
	}
	va_start(ap, fmt);
	vsnprintf(note + used, size - used, fmt, ap);
	va_end(ap);
}

static int fill_recovered(struct rps__wal_recovered *rec, const struct replay *r)
{
	size_t total = 0, off = 0;
	uint8_t *arena;

	for (size_t i = 0; i < r->n; i++)
		total += r->ents[i].len;
	rec->ents = calloc(r->n ? r->n : 1, sizeof(*rec->ents));
	arena = malloc(total ? total : 1);
	if (!rec->ents || !arena) {
		free(arena);
		free(rec->ents);
		rec->ents = NULL;
		return rps__seterr(-ENOMEM, "wal: out of memory");
	}
	for (size_t i = 0; i < r->n; i++) {
		const struct replay_ent *e = &r->ents[i];

		memcpy(arena + off, e->data, e->len);
		rec->ents[i] = (struct rps__wal_entry){ e->term, e->index, e->type, arena + off, e->len };
		off += e->len;
	}
	rec->n_ents = r->n;
	rec->ent_data_ = arena;
	return 0;
}

/* What open read from the directory, between reading it and taking it over. */
struct wal_found {
	struct dir_listing l;
	struct replay r;
	struct rps__wal_snapshot snap;
	uint8_t *snap_buf;
	bool has_snap, needs_marker;
	uint64_t tocommit;
	size_t damaged;
	char damage[512];
};

static void found_free(struct wal_found *f)
{
	free(f->snap_buf);
	replay_free(&f->r);
	dir_listing_free(&f->l);
}

static int open_options(struct rps__wal *w, const struct rps__wal_opts *o)
{
	if (o)
		w->opts = *o;
	if (!w->opts.segment_size)
		w->opts.segment_size = DEFAULT_SEGMENT_SIZE;
	if (!w->opts.keep_snapshots)
		w->opts.keep_snapshots = DEFAULT_KEEP_SNAPSHOTS;
	if ((w->opts.fsync != RPS__WAL_FSYNC_ALWAYS && w->opts.fsync != RPS__WAL_FSYNC_NONE) ||
	    w->opts.segment_size < MIN_SEGMENT_SIZE)
		return rps__seterr(-EINVAL, "wal: bad options (fsync policy %d, segment size %" PRIu64
				   ", at least %u)", (int)w->opts.fsync, w->opts.segment_size,
				   MIN_SEGMENT_SIZE);
	return 0;
}

/* Create the directory if need be, open it and take its lock. */
static int open_dir_locked(struct rps__wal *w, const char *dir)
{
	int err;

	if (mkdir(dir, 0700) == 0) {
		err = sync_parent(dir, &w->opts);
		if (err)
			return err;
	} else if (errno != EEXIST) {
		err = -errno;
		return rps__seterr(err, "wal: creating directory %.150s: %s", dir, strerror(-err));
	}
	w->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (w->dir_fd < 0) {
		err = -errno;
		return rps__seterr(err, "wal: opening %.150s: %s", dir, strerror(-err));
	}
	w->lock_fd = openat(w->dir_fd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (w->lock_fd < 0 || flock(w->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		err = errno == EWOULDBLOCK ? -EBUSY : -errno;
		return rps__seterr(err, "wal: locking %.150s/LOCK: %s%s", dir, strerror(-err),
				   err == -EBUSY ? ": another process has this node's log open" : "");
	}
	return 0;
}

/* Read and check everything before changing anything: a refused open leaves
 * the directory as it found it. */
static int open_read(struct rps__wal *w, const char *dir, struct wal_found *f)
{
	int err = list_dir(w->dir_fd, dir, &f->l);

	if (err)
		return err;
	if (f->l.n_segs == 0 && f->l.n_snaps > 0)
		return rps__seterr(-EBADMSG, "wal: %.150s: snapshots but no log segments (the hard"
				   " state is lost): " RESTORE_HINT, dir, dir);
	f->r.dir = dir;
	err = replay_all(w->dir_fd, dir, &f->l, &f->r);
	if (err)
		return err;
	err = choose_snapshot(w->dir_fd, dir, &f->l, &f->r, &f->snap_buf, &f->snap, &f->has_snap,
			      &f->needs_marker, &f->damaged, f->damage, sizeof(f->damage));
	if (err)
		return err;
	/* A torn tail is only ever the last, unacknowledged save: a log that
	 * ends below an index known committed lost acknowledged entries. */
	f->tocommit = RPS__MAX(f->r.hs.commit, rps__wal_witness_read(w->dir_fd));
	if (f->tocommit > rps__wal_replay_last(&f->r))
		return rps__seterr(-EBADMSG, "wal: %.150s: tocommit(%" PRIu64 ") is out of range [lastIndex(%"
				   PRIu64 ")]: was the raft log corrupted, truncated, or lost? Restore %.150s"
				   " from a backup or a replica, or remove it and rejoin the cluster",
				   dir, f->tocommit, rps__wal_replay_last(&f->r), dir);
	return 0;
}

/* Open the last segment for appends, cutting off its torn tail if any. */
static int open_last_segment(struct rps__wal *w, const char *dir, const struct wal_found *f,
			     struct rps__wal_recovered *rec)
{
	const struct wal_seg *lastseg = &f->l.segs[f->l.n_segs - 1];
	char name[NAME_BUF];
	int err;

	rps__wal_seg_name(name, lastseg->seq, lastseg->base_index);
	w->seg_fd = openat(w->dir_fd, name, O_WRONLY | O_CLOEXEC);
	if (w->seg_fd < 0) {
		err = -errno;
		return rps__seterr(err, "wal: opening %.150s/%s: %s", dir, name, strerror(-err));
	}
	w->seg_end = f->r.keep_size;
	if (f->r.torn_bytes) {
		if (ftruncate(w->seg_fd, (off_t)f->r.keep_size) < 0)
			err = -errno;
		else
			err = rps__wal_do_sync(&w->opts, w->seg_fd, true);
		if (err)
			return rps__seterr(err, "wal: cutting the torn tail of %.150s/%s: %s",
					   dir, name, strerror(-err));
		if (rec) {
			rec->truncated_bytes = f->r.torn_bytes;
			rec->truncated_offset = f->r.keep_size;
			note_add(rec->note, sizeof(rec->note), "wal: %.100s/%s: dropped an"
				 " unfinished save (torn tail): %" PRIu64 " bytes at offset %"
				 PRIu64, dir, name, f->r.torn_bytes, f->r.keep_size);
		}
	}
	return 0;
}

/* Damaged snapshots are renamed out of the way (kept for a post-mortem):
 * compaction must never count them as kept.  Leftover .tmp files go. */
static int open_tidy_dir(struct rps__wal *w, const char *dir, const struct wal_found *f,
			 struct rps__wal_recovered *rec)
{
	const struct dir_listing *l = &f->l;
	bool dir_changed = false;
	char name[NAME_BUF];
	int err;

	for (size_t i = l->n_snaps - f->damaged; i < l->n_snaps; i++) {
		char aside[NAME_BUF + 8];

		rps__wal_snap_name(name, l->snaps[i].index, l->snaps[i].term);
		snprintf(aside, sizeof(aside), "%s.damaged", name);
		if (renameat(w->dir_fd, name, w->dir_fd, aside) < 0) {
			err = -errno;
			return rps__seterr(err, "wal: renaming %.150s/%s: %s", dir, name, strerror(-err));
		}
		dir_changed = true;
	}
	if (f->damaged && rec) {
		rec->skipped_snapshots = (unsigned)f->damaged;
		note_add(rec->note, sizeof(rec->note), "%.120s (renamed to .damaged); recovered %s",
			 f->damage, f->has_snap ? "from an older snapshot" : "from the log alone");
	}
	for (size_t i = 0; i < l->n_tmps; i++) {
		if (unlinkat(w->dir_fd, l->tmps[i], 0) == 0)
			dir_changed = true;
	}
	if (dir_changed) {
		err = rps__wal_do_sync(&w->opts, w->dir_fd, false);
		if (err)
			return rps__seterr(err, "wal: syncing directory %.150s: %s", dir, strerror(-err));
	}
	return 0;
}

/* The runtime state continues where replay ended: the listing's segments
 * and intact snapshots move into w. */
static int open_take_over(struct rps__wal *w, struct wal_found *f)
{
	struct dir_listing *l = &f->l;
	const struct replay *r = &f->r;
	int err;

	w->segs = l->segs;
	w->n_segs = l->n_segs;
	w->cap_segs = l->cap_segs;
	l->segs = NULL;
	w->snaps = l->snaps;
	w->n_snaps = l->n_snaps - f->damaged;
	w->cap_snaps = l->cap_snaps;
	l->snaps = NULL;
	w->hs = r->hs;
	w->next_batch = l->n_segs ? r->next_batch : 1;
	w->snap_index = r->base;
	w->snap_term = r->base_term_known ? r->base_term : 0;
	err = rps__wal_grow((void **)&w->terms, &w->cap_terms, r->n, sizeof(*w->terms));
	if (err)
		return err;
	for (size_t i = 0; i < r->n; i++)
		w->terms[i] = r->ents[i].term;
	w->n_terms = r->n;
	return 0;
}

/* Finish what a crash interrupted, then keep the commit witness open. */
static int open_continue(struct rps__wal *w, const char *dir, const struct wal_found *f)
{
	int err = 0;

	if (w->n_segs == 0)
		err = rps__wal_roll(w);	/* a fresh node */
	else if (w->seg_end < SEG_OPENING_SIZE)
		err = rps__wal_save(w, &w->hs, NULL, 0);	/* the opening hard state was torn */
	if (!err && f->needs_marker)
		err = rps__wal_append_marker(w, f->snap.index, f->snap.term);	/* finish save_snapshot */
	if (err)
		return err;
	w->witness_fd = openat(w->dir_fd, WITNESS_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (w->witness_fd < 0) {
		err = -errno;
		return rps__seterr(err, "wal: opening %.150s/" WITNESS_NAME ": %s", dir, strerror(-err));
	}
	rps__wal_witness_write(w, f->tocommit);	/* a directory from before the witness gets one */
	return 0;
}

/* Hand the recovered log and snapshot to the caller (the snapshot's buffer
 * moves to rec). */
static int open_hand_over(struct rps__wal_recovered *rec, struct wal_found *f)
{
	int err = fill_recovered(rec, &f->r);

	if (err)
		return err;
	rec->hs = f->r.hs;
	rec->has_snapshot = f->has_snap;
	if (f->has_snap) {
		rec->snapshot = f->snap;
		rec->snap_data_ = f->snap_buf;
		f->snap_buf = NULL;
	}
	return 0;
}

int rps__wal_open(const char *dir, const struct rps__wal_opts *o,
		  struct rps__wal **out, struct rps__wal_recovered *rec)
{
	struct rps__wal *w;
	struct wal_found f = { 0 };
	int err;

	*out = NULL;
	if (rec)
		memset(rec, 0, sizeof(*rec));
	w = calloc(1, sizeof(*w));
	if (!w)
		return rps__seterr(-ENOMEM, "wal: out of memory");
	w->dir_fd = w->lock_fd = w->seg_fd = w->witness_fd = -1;
	err = open_options(w, o);
	if (err)
		goto out_close;
	w->dir = strdup(dir);
	if (!w->dir) {
		err = rps__seterr(-ENOMEM, "wal: out of memory");
		goto out_close;
	}
	err = open_dir_locked(w, dir);
	if (err)
		goto out_close;
	err = open_read(w, dir, &f);
	if (err)
		goto out_found;

	/* Accepted: repair. */
	if (f.l.n_segs > 0) {
		err = open_last_segment(w, dir, &f, rec);
		if (err)
			goto out_found;
	}
	err = open_tidy_dir(w, dir, &f, rec);
	if (err)
		goto out_found;
	err = open_take_over(w, &f);
	if (!err)
		err = open_continue(w, dir, &f);
	if (!err && rec)
		err = open_hand_over(rec, &f);
	if (err)
		goto out_found;
	found_free(&f);
	*out = w;
	return 0;

out_found:
	found_free(&f);
out_close:
	rps__wal_close(w);
	if (rec)
		memset(rec, 0, sizeof(*rec));
	return err;
}

void rps__wal_close(struct rps__wal *w)
{
	if (!w)
		return;
	if (w->seg_fd >= 0)
		close(w->seg_fd);
	if (w->witness_fd >= 0)
		close(w->witness_fd);
	if (w->lock_fd >= 0)
		close(w->lock_fd);	/* drops the flock */
	if (w->dir_fd >= 0)
		close(w->dir_fd);
	free(w->buf);
	free(w->snaps);
	free(w->terms);
	free(w->segs);
	free(w->dir);
	free(w);
}

void rps__wal_recovered_free(struct rps__wal_recovered *rec)
{
	if (!rec)
		return;
	free(rec->ents);
	free(rec->ent_data_);
	free(rec->snap_data_);
	memset(rec, 0, sizeof(*rec));
}
