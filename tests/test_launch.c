/*
 * test_launch.c - rps_client_opts_from_env(): each launcher's variables,
 * their precedence, members the caller set kept, malformed values and a
 * rank not below the world size refused with a message naming the
 * variable, opts untouched on failure, and the server list.
 * Only the environment is involved: no server runs.
 */
#include "config.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"
#include "lib/cutest.h"

static const char *const vars[] = {
	"RDMAPS_SERVERS", "RDMAPS_RANK", "RDMAPS_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID",
	"SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
};

static void clear_env(void)
{
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

/* opts as a program asking for everything from the environment */
static void unset_opts(struct rps_client_opts *o)
{
	rps_client_opts_init(o);
	o->rank = -1;
	o->num_workers = -1;
}

static int from_env(struct rps_client_opts *o, const char **src)
{
	*src = "untouched";
	return rps_client_opts_from_env(o, src);
}

static void check_launcher(const char *rank_var, const char *size_var, const char *name)
{
	struct rps_client_opts o;
	const char *src;

	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	setenv(rank_var, "3", 1);
	setenv(size_var, "8", 1);
	unset_opts(&o);
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_STRING_EQUAL(src, name);
	CU_ASSERT_EQUAL(o.rank, 3);
	CU_ASSERT_EQUAL(o.num_workers, 8);
	CU_ASSERT_PTR_NOT_NULL_FATAL(o.servers);
	CU_ASSERT_STRING_EQUAL(o.servers, "tcp://127.0.0.1:7000");
}

static void test_each_launcher(void)
{
	check_launcher("RDMAPS_RANK", "RDMAPS_WORLD_SIZE", "rdmaps");
	check_launcher("RANK", "WORLD_SIZE", "torchrun");
	check_launcher("SLURM_PROCID", "SLURM_NTASKS", "slurm");
	check_launcher("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi");
	check_launcher("PMI_RANK", "PMI_SIZE", "pmi");
}

/* Every launcher set at once, each with its own rank: removing the winner
 * each time shows the order rdmaps, torchrun, slurm, openmpi, pmi. */
static void test_precedence(void)
{
	static const struct {
		const char *r, *s, *name;
	} l[] = {
		{ "RDMAPS_RANK", "RDMAPS_WORLD_SIZE", "rdmaps" },
		{ "RANK", "WORLD_SIZE", "torchrun" },
		{ "SLURM_PROCID", "SLURM_NTASKS", "slurm" },
		{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi" },
		{ "PMI_RANK", "PMI_SIZE", "pmi" },
	};
	struct rps_client_opts o;
	const char *src;
	char buf[16];
	size_t i;

	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	for (i = 0; i < 5; i++) {
		snprintf(buf, sizeof(buf), "%zu", i);
		setenv(l[i].r, buf, 1);
		snprintf(buf, sizeof(buf), "%zu", 10 + i);
		setenv(l[i].s, buf, 1);
	}
	for (i = 0; i < 5; i++) {
		unset_opts(&o);
		CU_ASSERT_EQUAL(from_env(&o, &src), 0);
		CU_ASSERT_STRING_EQUAL(src, l[i].name);
		CU_ASSERT_EQUAL(o.rank, (int)i);
		CU_ASSERT_EQUAL(o.num_workers, 10 + (int)i);
		unsetenv(l[i].r);
		unsetenv(l[i].s);
	}
	/* a later launcher's garbage is never read */
	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("SLURM_PROCID", "garbage", 1);
	unset_opts(&o);
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_STRING_EQUAL(src, "torchrun");
	CU_ASSERT_EQUAL(o.rank, 1);
}

static void test_caller_fields_kept(void)
{
	struct rps_client_opts o;
	const char *src;

	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "4", 1);
	/* everything set: nothing read, not even a launcher */
	rps_client_opts_init(&o);
	o.servers = "tcp://10.0.0.9:7000";
	o.rank = 2;
	o.num_workers = 3;
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_STRING_EQUAL(src, "caller");
	CU_ASSERT_STRING_EQUAL(o.servers, "tcp://10.0.0.9:7000");
	CU_ASSERT_EQUAL(o.rank, 2);
	CU_ASSERT_EQUAL(o.num_workers, 3);
	/* the defaults of rps_client_opts_init count as set */
	rps_client_opts_init(&o);
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_STRING_EQUAL(src, "caller");
	CU_ASSERT_EQUAL(o.rank, 0);
	CU_ASSERT_EQUAL(o.num_workers, 1);
	CU_ASSERT_STRING_EQUAL(o.servers, "tcp://127.0.0.1:7000");
	/* only the rank unset: the launcher's rank, the caller's world */
	rps_client_opts_init(&o);
	o.rank = -1;
	o.num_workers = 6;
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_STRING_EQUAL(src, "torchrun");
	CU_ASSERT_EQUAL(o.rank, 1);
	CU_ASSERT_EQUAL(o.num_workers, 6);
	/* only the world unset */
	rps_client_opts_init(&o);
	o.rank = 3;
	o.num_workers = 0;
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_EQUAL(o.rank, 3);
	CU_ASSERT_EQUAL(o.num_workers, 4);
}

static void test_nothing_found(void)
{
	struct rps_client_opts o;
	const char *src;

	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	unset_opts(&o);
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_STRING_EQUAL(src, "none");
	CU_ASSERT_EQUAL(o.rank, -1);
	CU_ASSERT_EQUAL(o.num_workers, -1);
	/* an empty variable counts as unset */
	setenv("RANK", "", 1);
	setenv("WORLD_SIZE", "", 1);
	CU_ASSERT_EQUAL(from_env(&o, &src), 0);
	CU_ASSERT_STRING_EQUAL(src, "none");
	/* no servers anywhere */
	clear_env();
	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "1", 1);
	unset_opts(&o);
	CU_ASSERT_EQUAL(from_env(&o, &src), -ENOENT);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps_last_error(), "RDMAPS_SERVERS"));
	CU_ASSERT_PTR_NULL(o.servers);
	CU_ASSERT_EQUAL(o.rank, -1);
	setenv("RDMAPS_SERVERS", "", 1);
	CU_ASSERT_EQUAL(from_env(&o, &src), -ENOENT);
}

/* A value refused: -EINVAL, a message naming var=value, opts unchanged. */
static void check_refused(const char *r, const char *rv, const char *s, const char *sv, const char *want)
{
	struct rps_client_opts o;
	const char *src;

	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	if (rv)
		setenv(r, rv, 1);
	if (sv)
		setenv(s, sv, 1);
	unset_opts(&o);
	CU_ASSERT_EQUAL(from_env(&o, &src), -EINVAL);
	if (!strstr(rps_last_error(), want))
		fprintf(stderr, "\nmessage '%s' lacks '%s'\n", rps_last_error(), want);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps_last_error(), want));
	CU_ASSERT_PTR_NULL(strchr(rps_last_error(), '\n'));
	CU_ASSERT_EQUAL(o.rank, -1);
	CU_ASSERT_EQUAL(o.num_workers, -1);
	CU_ASSERT_PTR_NULL(o.servers);
}

static void test_malformed(void)
{
	check_refused("RANK", "abc", "WORLD_SIZE", "4", "RANK='abc' is not a rank");
	check_refused("RANK", "-1", "WORLD_SIZE", "4", "RANK='-1'");
	check_refused("RANK", "1x", "WORLD_SIZE", "4", "RANK='1x'");
	check_refused("RANK", " 1", "WORLD_SIZE", "4", "RANK=' 1'");
	check_refused("RANK", "1", "WORLD_SIZE", "0", "WORLD_SIZE='0' is not a world size");
	check_refused("SLURM_PROCID", "0", "SLURM_NTASKS", "99999999999", "SLURM_NTASKS='99999999999'");
	check_refused("OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", NULL,
		      "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
	check_refused("PMI_RANK", NULL, "PMI_SIZE", "2", "PMI_SIZE is set but PMI_RANK is not");
}

static void test_rank_not_below_world(void)
{
	struct rps_client_opts o;
	const char *src;

	check_refused("RANK", "4", "WORLD_SIZE", "4", "RANK=4 is not below WORLD_SIZE=4");
	check_refused("SLURM_PROCID", "7", "SLURM_NTASKS", "2", "SLURM_PROCID=7 is not below SLURM_NTASKS=2");
	/* the caller's rank against the launcher's world */
	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	setenv("PMI_RANK", "0", 1);
	setenv("PMI_SIZE", "2", 1);
	rps_client_opts_init(&o);
	o.rank = 5;
	o.num_workers = -1;
	CU_ASSERT_EQUAL(from_env(&o, &src), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps_last_error(), "the caller's rank 5 is not below PMI_SIZE=2"));
	CU_ASSERT_EQUAL(o.num_workers, -1);
	/* the caller's pair alone */
	o.num_workers = 3;
	CU_ASSERT_EQUAL(from_env(&o, &src), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps_last_error(), "rank 5 is not below its num_workers 3"));
}

static void test_bad_arguments(void)
{
	struct rps_client_opts o;

	clear_env();
	CU_ASSERT_EQUAL(rps_client_opts_from_env(NULL, NULL), -EINVAL);
	memset(&o, 0, sizeof(o));	/* size 0: never initialised */
	CU_ASSERT_EQUAL(rps_client_opts_from_env(&o, NULL), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps_last_error(), "rps_client_opts_init"));
	/* source may be NULL */
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	unset_opts(&o);
	CU_ASSERT_EQUAL(rps_client_opts_from_env(&o, NULL), 0);
}

/* What rps_client_connect says of a rank nobody filled in. */
static void test_connect_refuses_unset_rank(void)
{
	struct rps_client_opts o;
	rps_client_t *cl = NULL;

	clear_env();
	setenv("RDMAPS_SERVERS", "tcp://127.0.0.1:7000", 1);
	unset_opts(&o);
	CU_ASSERT_EQUAL(rps_client_opts_from_env(&o, NULL), 0);
	CU_ASSERT_EQUAL(rps_client_connect(&o, &cl), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps_last_error(), "rank -1"));
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "each launcher's variables", test_each_launcher },
		{ "precedence rdmaps > torchrun > slurm > openmpi > pmi", test_precedence },
		{ "members the caller set are kept", test_caller_fields_kept },
		{ "nothing found: none, or ENOENT without servers", test_nothing_found },
		{ "malformed values and half pairs refused", test_malformed },
		{ "a rank not below the world size refused", test_rank_not_below_world },
		{ "bad arguments", test_bad_arguments },
		{ "connect refuses a rank left unset", test_connect_refuses_unset_rank },
	};

	return cutest_run1("rps_client_opts_from_env", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests));
}
