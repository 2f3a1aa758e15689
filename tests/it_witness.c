/*
 * it_witness.c - who may form a cluster with whom (issue 30).
 *
 * Members that disagree on --threads (item 8): partition p's replication
 * stream runs between the two members' serving threads p % --threads, so
 * with different counts a thread's stream has nobody to dial.  The peer
 * handshake refuses it: both sides log one line naming who runs how many
 * threads and what to do, and neither hangs (each still answers psctl).
 */
#include "config.h"
#include "cluster.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"

#define PSCTL_MS 20000

static struct it_cluster clu;
static bool clu_up;
static char out[65536], err[8192];

static void test_setup(void)
{
	it_test_setup();
}

static void test_teardown(void)
{
	it_test_teardown();
}

/* The first line of a file that contains needle (in line, of len), or NULL. */
static const char *file_line(const char *path, const char *needle, char *line, size_t len)
{
	FILE *f = fopen(path, "r");
	const char *found = NULL;

	if (!f)
		return NULL;
	while (!found && fgets(line, (int)len, f))
		if (strstr(line, needle))
			found = line;
	fclose(f);
	return found;
}

/* ---- item 8: --threads differs ------------------------------------------------ */

static void test_threads_mismatch_refused(void)
{
	struct it_server_opts o = { .extra_args = "--partitions 4 --shard-size 4096 --slots 4 --fsync none", .threads = 2 };
	char logs[2][300], line[2][1024], want[2][200];
	double t0;
	int i;

	CU_ASSERT_FATAL(it_cluster_start_opts(&clu, 2, &o) == 0);
	clu_up = true;
	/* start both again from nothing, member 2 with one thread fewer and
	 * each with its log in a file of its own */
	for (i = 0; i < 2; i++)
		it_server_kill(&clu, i);
	for (i = 0; i < 2; i++) {
		char *th = strstr(clu.cmd[i], " --threads 2 ");
		size_t len = strlen(clu.cmd[i]);

		CU_ASSERT_FATAL(th != NULL);
		if (i == 1)
			th[11] = '1';
		snprintf(logs[i], sizeof(logs[i]), "%s/log.%d", clu.dir, i);
		/* (info: the log would say a peer connected) */
		snprintf(clu.cmd[i] + len, sizeof(clu.cmd[i]) - len, " --log-level info 2>%s", logs[i]);
		CU_ASSERT_FATAL(it_server_restart(&clu, i) == 0);
	}
	snprintf(want[0], sizeof(want[0]), "member 2 runs --threads 1, this member (1) --threads 2");
	snprintf(want[1], sizeof(want[1]), "member 1 runs --threads 2, this member (2) --threads 1");
	t0 = it_now_s();
	for (;;) {
		bool both = true;
		for (i = 0; i < 2; i++)
			both &= file_line(logs[i], want[i], line[i], sizeof(line[i])) != NULL;
		if (both || it_now_s() - t0 > 20)
			break;
		it_sleep_ms(100);
	}
	for (i = 0; i < 2; i++) {
		if (!file_line(logs[i], want[i], line[i], sizeof(line[i]))) {
			fprintf(stderr, "server %d did not log \"%s\"\n", i, want[i]);
			CU_FAIL("no --threads line");
			continue;
		}
		CU_ASSERT_PTR_NOT_NULL(strstr(line[i], "start every member with the same --threads"));
	}
	/* refused, not hung: both still serve psctl, and neither connected to the other */
	for (i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL(it_server_alive(&clu, i), 1);
		int st = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s status", clu.uri[i]);
		CU_ASSERT(st >= 0 && st < 128);
		CU_ASSERT_PTR_NULL(file_line(logs[i], "connected to peer", line[i], sizeof(line[i])));
		CU_ASSERT_PTR_NULL(file_line(logs[i], " connected from ", line[i], sizeof(line[i])));
	}
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "--threads differs between members: refused at the handshake, said on both sides", test_threads_mismatch_refused },
	};
	int ret;

	if ((ret = it_prog_init("it_witness", 300, &clu, &clu_up)))
		return ret;
	if (access(it_psctl_path(), X_OK) != 0) {
		fprintf(stderr, "it_witness: no psctl at %s (set PSCTL)\n", it_psctl_path());
		return 1;
	}
	return cutest_run1("cluster membership", NULL, NULL, test_setup, test_teardown, tests, CUTEST_COUNT(tests));
}
