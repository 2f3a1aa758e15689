/*
 * psctl_ranks.c - psctl remove-rank: a dead worker's rank leaves the sync
 * and bounded tensors for good, on every member, so the other workers go
 * on without it (or without a replacement).
 */
#include "config.h"
#include "programs/psctl_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int psctl_cmd_remove_rank(int rank, const char *tensor)
{
	static struct psctl_member m[RPS__SMAP_MAX_MEMBERS];
	uint32_t n = 0, i, total = 0, got[RPS__SMAP_MAX_MEMBERS];
	struct rps__rank_req req;
	bool known = false;
	int ret;

	memset(&req, 0, sizeof(req));
	req.rank = rank;
	if (tensor)
		snprintf(req.name, sizeof(req.name), "%s", tensor);
	ret = psctl_members(m, &n, "every member must drop the rank (start it again, or remove it first)");
	if (ret)
		return psctl_fail_err();
	for (i = 0; i < n; i++) {
		struct rps__rank_rep rep;
		size_t rlen = 0;
		int32_t status = 0;

		memset(&rep, 0, sizeof(rep));
		ret = rps__ctl_call(m[i].ctl, RPS__MSG_RANK, &req, sizeof(req), &rep, sizeof(rep), &rlen, &status,
				    psctl_opt.timeout_ms);
		if (ret)
			return psctl_fail("member %llu: %s", (unsigned long long)m[i].id, rps__errbuf());
		got[i] = 0;
		if (status == -ENOENT && tensor)
			continue;	/* a member may hold none of the tensor's partitions */
		known = true;
		if (status)
			return psctl_fail("member %llu: %s", (unsigned long long)m[i].id,
					  rlen >= sizeof(rep) && rep.msg[0] ? rep.msg : psctl_errtext(status));
		got[i] = rep.tensors;
		total += rep.tensors;
	}
	if (tensor && !known)
		return psctl_fail("no tensor '%s' on any member: check its name", tensor);
	if (psctl_opt.json) {
		printf("{\"rank\":%d,\"tensor\":", rank);
		if (tensor)
			psctl_json_str(tensor);
		else
			printf("null");
		printf(",\"members\":[");
		for (i = 0; i < n; i++)
			printf("%s{\"id\":%llu,\"tensors\":%u}", i ? "," : "", (unsigned long long)m[i].id, got[i]);
		printf("]}\n");
		return 0;
	}
	for (i = 0; i < n; i++)
		printf("member %llu: rank %d removed from %u tensors\n", (unsigned long long)m[i].id, rank, got[i]);
	if (!total && tensor)
		printf("rank %d: already removed from '%s'\n", rank, tensor);
	else if (!total)
		printf("rank %d: already removed, or no sync or bounded tensor\n", rank);
	return 0;
}
