/*
 * psctl_ckpt.c - psctl checkpoint and restore: every member writes (or
 * loads) its partitions in one consistent cut, driven from here.  A
 * checkpoint is named, not placed: each server keeps it under its own
 * --checkpoint-dir and checks the name (psctl sends it as given).
 */
#include "config.h"
#include "programs/psctl_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- checkpoint / restore --------------------------------------------------- */

struct ck_member {
	uint64_t id;
	struct rps__uri uri;
	struct rps__ctl *ctl;
	uint32_t nshards;	/* checkpoint: what TAKE said; restore: installed */
	uint64_t pause_ns;
	uint64_t raw;
	uint64_t bytes;		/* checkpoint: what FINISH said */
};

/* Every member of the map, each with its own admin channel. */
static int ck_members(struct ck_member *m, uint32_t *n)
{
	static struct psctl_member pm[RPS__SMAP_MAX_MEMBERS];
	uint32_t i;
	int ret;

	ret = psctl_members(pm, n, "every member takes part in a checkpoint");
	if (ret)
		return ret;
	for (i = 0; i < *n; i++) {
		m[i].id = pm[i].id;
		m[i].uri = pm[i].uri;
		m[i].ctl = pm[i].ctl;
	}
	return 0;
}

static char ckbuf[RPS__BIG_MSG_MAX];

/* One CKPT request; the reply (fixed part + targets) is left in ckbuf. */
static int ck_call(struct ck_member *m, const struct rps__ckpt_req *req, const struct rps__ckpt_target *t,
		   uint32_t nt, struct rps__ckpt_rep **rep)
{
	static char out[RPS__BIG_MSG_MAX];
	size_t len = sizeof(*req) + (size_t)nt * sizeof(*t), rlen = 0;
	int32_t status = 0;
	int ret;

	if (len + sizeof(struct rps__msg_hdr) > sizeof(out))
		return rps__seterr(-E2BIG, "too many sync tensors for one request");
	memcpy(out, req, sizeof(*req));
	((struct rps__ckpt_req *)out)->ntargets = nt;
	if (nt)
		memcpy(out + sizeof(*req), t, (size_t)nt * sizeof(*t));
	ret = rps__ctl_call(m->ctl, RPS__MSG_CKPT, out, len, ckbuf, sizeof(ckbuf), &rlen, &status, psctl_opt.rpc_ms + psctl_opt.timeout_ms);
	if (ret)
		return ret;
	*rep = (struct rps__ckpt_rep *)ckbuf;
	if (status) {
		if (rlen >= sizeof(**rep) && (*rep)->msg[0])
			return rps__seterr(status, "member %llu: %s", (unsigned long long)m->id, (*rep)->msg);
		return rps__seterr(status, "member %llu: %s", (unsigned long long)m->id, psctl_errtext(status));
	}
	if (rlen < sizeof(**rep))
		return rps__seterr(-EBADMSG, "member %llu: short checkpoint reply", (unsigned long long)m->id);
	return 0;
}

static void ck_print_member(const struct ck_member *m)
{
	printf("member %llu: %u shards, %llu bytes (%.1f%% of %llu), training paused %.3f ms\n",
	       (unsigned long long)m->id, m->nshards, (unsigned long long)m->bytes,
	       m->raw ? 100.0 * (double)m->bytes / (double)m->raw : 0.0, (unsigned long long)m->raw,
	       (double)m->pause_ns / 1e6);
}

/* checkpoint --json: the totals, the sync tensors' steps, every member */
static void ck_print_json(const char *name, const struct ck_member *m, uint32_t n,
			  const struct rps__ckpt_target *tg, uint32_t nt)
{
	unsigned long long bytes = 0, raw = 0, pause_max = 0;
	uint32_t i, shards = 0;

	for (i = 0; i < n; i++) {
		bytes += m[i].bytes;
		raw += m[i].raw;
		shards += m[i].nshards;
		pause_max = RPS__MAX(pause_max, m[i].pause_ns);
	}
	printf("{\"name\":");
	psctl_json_str(name);
	printf(",\"shards\":%u,\"bytes\":%llu,\"raw_bytes\":%llu,\"longest_pause_ns\":%llu,\"tensors\":[",
	       shards, bytes, raw, pause_max);
	for (i = 0; i < nt; i++) {
		printf("%s{\"name\":", i ? "," : "");
		psctl_json_str(tg[i].name);
		printf(",\"step\":%llu}", (unsigned long long)tg[i].step);
	}
	printf("],\"members\":[");
	for (i = 0; i < n; i++)
		printf("%s{\"id\":%llu,\"shards\":%u,\"bytes\":%llu,\"raw_bytes\":%llu,\"pause_ns\":%llu}",
		       i ? "," : "", (unsigned long long)m[i].id, m[i].nshards, (unsigned long long)m[i].bytes,
		       (unsigned long long)m[i].raw, (unsigned long long)m[i].pause_ns);
	printf("]}\n");
}

int psctl_cmd_checkpoint(const char *name)
{
	static struct ck_member m[RPS__SMAP_MAX_MEMBERS];
	static struct rps__ckpt_target tg[4096];
	struct rps__ckpt_req req;
	struct rps__ckpt_rep *rep;
	uint64_t bytes = 0, raw = 0, pause_max = 0;
	uint32_t n = 0, i, k, nt = 0, shards = 0;
	struct timespec ts;
	int ret;

	ret = ck_members(m, &n);
	if (ret)
		return psctl_fail_err();
	clock_gettime(CLOCK_REALTIME, &ts);
	memset(&req, 0, sizeof(req));
	req.ckpt_id = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	req.level = psctl_opt.level >= 0 ? (uint32_t)psctl_opt.level : 1;
	req.timeout_ms = (uint32_t)psctl_opt.timeout_ms;
	if (strlen(name) >= sizeof(req.name))
		return psctl_fail("checkpoint name of %zu characters: too long (at most %zu)", strlen(name), sizeof(req.name) - 1);
	snprintf(req.name, sizeof(req.name), "%s", name);
	/* 1. every server holds its sync tensors and says where they are */
	req.op = RPS__CKPT_PREPARE;
	for (i = 0; i < n && !ret; i++) {
		const struct rps__ckpt_target *got;
		ret = ck_call(&m[i], &req, NULL, 0, &rep);
		if (ret)
			break;
		got = (const void *)(ckbuf + sizeof(*rep));
		for (k = 0; k < rep->ntargets; k++) {
			uint32_t j;
			for (j = 0; j < nt && strcmp(tg[j].name, got[k].name); j++)
				;
			if (j == nt) {
				if (nt == RPS__ARRAY_SIZE(tg)) {
					ret = rps__seterr(-E2BIG, "more than %zu sync tensors", RPS__ARRAY_SIZE(tg));
					break;
				}
				tg[nt++] = got[k];
			} else if (got[k].step > tg[j].step) {
				tg[j].step = got[k].step;
			}
		}
	}
	/* 2. every sync tensor to the highest step any shard reached, copy
	 * (each server answers once its copy is done: the pause is over) */
	if (!ret) {
		req.op = RPS__CKPT_TAKE;
		for (i = 0; i < n && !ret; i++) {
			ret = ck_call(&m[i], &req, tg, nt, &rep);
			if (ret)
				break;
			m[i].nshards = rep->nshards;
			m[i].pause_ns = rep->pause_ns;
			m[i].raw = rep->raw_bytes;
		}
	}
	/* 3. the files, written meanwhile by the servers' threads */
	if (!ret) {
		req.op = RPS__CKPT_FINISH;
		for (i = 0; i < n && !ret; i++) {
			ret = ck_call(&m[i], &req, NULL, 0, &rep);
			if (ret)
				break;
			m[i].bytes = rep->bytes;
			bytes += rep->bytes;
			raw += m[i].raw;
			shards += m[i].nshards;
			pause_max = RPS__MAX(pause_max, m[i].pause_ns);
			if (!psctl_opt.json)
				ck_print_member(&m[i]);
		}
	}
	if (ret) {
		char msg[512];
		snprintf(msg, sizeof(msg), "%s", rps__errbuf());
		req.op = RPS__CKPT_ABORT;
		for (i = 0; i < n; i++)
			ck_call(&m[i], &req, NULL, 0, &rep);
		return psctl_fail("checkpoint %s: %s", name, msg);
	}
	if (psctl_opt.json) {
		ck_print_json(name, m, n, tg, nt);
		return 0;
	}
	printf("checkpoint %s: %u shards of %u sync tensor(s) at", name, shards, nt);
	for (k = 0; k < nt; k++)
		printf(" %s@%llu", tg[k].name, (unsigned long long)tg[k].step);
	printf("%s; %llu bytes written for %llu bytes of state; longest pause %.3f ms\n", nt ? "" : " -",
	       (unsigned long long)bytes, (unsigned long long)raw, (double)pause_max / 1e6);
	return 0;
}

/* restore --json: what every member installed */
static void restore_print_json(const char *name, uint64_t seen, const struct ck_member *m, uint32_t n)
{
	uint32_t i;

	printf("{\"name\":");
	psctl_json_str(name);
	printf(",\"shards\":%llu,\"members\":[", (unsigned long long)seen);
	for (i = 0; i < n; i++)
		printf("%s{\"id\":%llu,\"shards\":%u}", i ? "," : "", (unsigned long long)m[i].id, m[i].nshards);
	printf("]}\n");
}

int psctl_cmd_restore(const char *name)
{
	static struct ck_member m[RPS__SMAP_MAX_MEMBERS];
	struct rps__ckpt_req req;
	struct rps__ckpt_rep *rep;
	uint64_t seen = 0, total = 0;
	uint32_t n = 0, i;
	int ret;

	ret = ck_members(m, &n);
	if (ret)
		return psctl_fail_err();
	memset(&req, 0, sizeof(req));
	req.op = RPS__CKPT_RESTORE;
	if (strlen(name) >= sizeof(req.name))
		return psctl_fail("checkpoint name of %zu characters: too long (at most %zu)", strlen(name), sizeof(req.name) - 1);
	snprintf(req.name, sizeof(req.name), "%s", name);
	for (i = 0; i < n; i++) {
		ret = ck_call(&m[i], &req, NULL, 0, &rep);
		if (ret)
			return psctl_fail("restore %s: %s", name, rps__errbuf());
		if (i && rep->seen_shards != seen)
			return psctl_fail("restore %s: members read different checkpoints (%llu and %llu shards): do their --checkpoint-dir hold the same %s?",
				    name, (unsigned long long)seen, (unsigned long long)rep->seen_shards, name);
		seen = rep->seen_shards;
		total += rep->nshards;
		m[i].nshards = rep->nshards;
		if (!psctl_opt.json)
			printf("member %llu: %u shards installed\n", (unsigned long long)m[i].id, rep->nshards);
	}
	if (total != seen)
		return psctl_fail("restore %s: %llu of the checkpoint's %llu shards installed: a partition without a serving owner (a move in progress?)",
			    name, (unsigned long long)total, (unsigned long long)seen);
	if (psctl_opt.json) {
		restore_print_json(name, seen, m, n);
		return 0;
	}
	printf("restore %s: all %llu shards installed\n", name, (unsigned long long)seen);
	return 0;
}
