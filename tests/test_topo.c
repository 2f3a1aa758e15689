/*
 * test_topo.c - unit tests of hwloc placement (src/common/topo.c).
 *
 * Without RDMA hardware: synthetic machines in tests/topo/ (*.xml each saying
 * what it is in its Machine's rdmapsFixture info) decide where memory and
 * threads go.  On the real machine (whatever it is): allocation is zeroed,
 * page-aligned and bound when binding works; pinning changes a thread's
 * affinity; a taskset narrows the derived cpus.
 *
 * Fixtures are found in $RPS_TOPO_DIR, else $srcdir/tests/topo (automake's
 * test harness sets srcdir), else tests/topo.
 */
#include "config.h"
#include "common/common.h"
#include "common/topo.h"
#include "lib/cutest.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *fixture(const char *name)
{
	static char path[4096];
	const char *dir = getenv("RPS_TOPO_DIR");
	const char *src = getenv("srcdir");

	if (dir)
		snprintf(path, sizeof(path), "%s/%s", dir, name);
	else if (src)
		snprintf(path, sizeof(path), "%s/tests/topo/%s", src, name);
	else
		snprintf(path, sizeof(path), "tests/topo/%s", name);
	return path;
}

static struct rps__topo *open_xml(const char *name)
{
	struct rps__topo_opts o = { .xml_path = fixture(name) };
	struct rps__topo *t = NULL;
	int ret = rps__topo_open(&o, &t);

	if (ret)
		fprintf(stderr, "\n  opening %s: %s\n", o.xml_path, rps__errbuf());
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	CU_ASSERT_FALSE(rps__topo_is_this_machine(t));
	return t;
}

static struct rps__topo *open_real(void)
{
	struct rps__topo_opts o = { .log = 0 };
	struct rps__topo *t = NULL;
	int ret = rps__topo_open(&o, &t);

	if (ret)
		fprintf(stderr, "\n  opening this machine: %s\n", rps__errbuf());
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_TRUE(rps__topo_is_this_machine(t));
	return t;
}

static void place_ok(struct rps__topo *t, const char *dev, const struct rps__topo_overrides *ov,
		     struct rps__placement *p)
{
	int ret = rps__topo_place(t, dev, ov, p);

	if (ret)
		fprintf(stderr, "\n  placing for %s: %s\n", dev ? dev : "(none)", rps__errbuf());
	CU_ASSERT_EQUAL_FATAL(ret, 0);
}

/* p's cpu_set_t, cpus string and count agree with the list `want` */
static void assert_cpus(const struct rps__placement *p, const char *want)
{
	cpu_set_t w;
	const char *s = want;
	int n = 0;

	CU_ASSERT_STRING_EQUAL(p->cpus, want);
	CPU_ZERO(&w);
	while (*s) {
		char *end;
		long a = strtol(s, &end, 10), b = a;
		if (*end == '-')
			b = strtol(end + 1, &end, 10);
		for (; a <= b; a++, n++)
			CPU_SET((int)a, &w);
		s = *end == ',' ? end + 1 : end;
	}
	CU_ASSERT_TRUE(CPU_EQUAL(&w, &p->cpuset));
	CU_ASSERT_EQUAL(p->ncpus, n);
}

/* ---- synthetic machines ------------------------------------------------- */

static void test_hca_on_node1(void)
{
	struct rps__topo *t = open_xml("two-node-hca-node1.xml");
	struct rps__placement p;

	CU_ASSERT_EQUAL(rps__topo_num_nodes(t), 2);
	place_ok(t, "mlx5_0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, 1);
	CU_ASSERT_EQUAL(p.pin, 1);
	CU_ASSERT_EQUAL(p.warn, 0);
	assert_cpus(&p, "16-31");
	CU_ASSERT_STRING_EQUAL(p.device, "mlx5_0");
	CU_ASSERT_STRING_EQUAL(p.pci, "0000:81:00.0");
	CU_ASSERT_STRING_EQUAL(p.reason, "HCA mlx5_0 is on PCI 0000:81:00.0, local to NUMA node 1 (cpus 16-31)");
	rps__topo_close(t);
}

static void test_hca_on_node0(void)
{
	struct rps__topo *t = open_xml("two-node-hca-node0.xml");
	struct rps__placement p;

	place_ok(t, "mlx5_0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	CU_ASSERT_EQUAL(p.pin, 1);
	assert_cpus(&p, "0-15");
	CU_ASSERT_STRING_EQUAL(p.pci, "0000:3b:00.0");
	CU_ASSERT_STRING_EQUAL(p.reason, "HCA mlx5_0 is on PCI 0000:3b:00.0, local to NUMA node 0 (cpus 0-15)");
	rps__topo_close(t);
}

static void test_two_hcas_by_name(void)
{
	struct rps__topo *t = open_xml("two-hcas.xml");
	struct rps__placement p;

	place_ok(t, "mlx5_0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, 1);
	assert_cpus(&p, "16-31");
	CU_ASSERT_STRING_EQUAL(p.pci, "0000:81:00.0");
	place_ok(t, "mlx5_1", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	assert_cpus(&p, "0-15");
	CU_ASSERT_STRING_EQUAL(p.pci, "0000:3b:00.0");
	/* a network interface's name is not an RDMA device's */
	place_ok(t, "ib0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.warn, 1);
	rps__topo_close(t);
}

static void test_unknown_device(void)
{
	struct rps__topo *t = open_xml("two-hcas.xml");
	struct rps__placement p;

	/* Decision: the whole machine and a warning, not an error; the daemon
	 * still serves, a little slower, and says why. */
	place_ok(t, "mlx5_9", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 0);
	CU_ASSERT_EQUAL(p.warn, 1);
	assert_cpus(&p, "0-31");
	CU_ASSERT_STRING_EQUAL(p.pci, "");
	CU_ASSERT_STRING_EQUAL(p.reason, "RDMA device mlx5_9 is unknown to hwloc (it sees mlx5_1, mlx5_0): "
			       "using the whole machine");
	rps__topo_close(t);
}

static void test_no_device(void)
{
	struct rps__topo *t = open_xml("two-node-hca-node1.xml");
	struct rps__placement p;

	place_ok(t, NULL, NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 0);
	CU_ASSERT_EQUAL(p.warn, 0);
	assert_cpus(&p, "0-31");
	CU_ASSERT_STRING_EQUAL(p.device, "");
	CU_ASSERT_STRING_EQUAL(p.reason, "no RDMA device: using the whole machine");
	place_ok(t, "", NULL, &p);
	CU_ASSERT_STRING_EQUAL(p.reason, "no RDMA device: using the whole machine");
	rps__topo_close(t);
}

static void test_numa_override(void)
{
	struct rps__topo *t = open_xml("two-node-hca-node1.xml");
	struct rps__topo_overrides ov = RPS__TOPO_OVERRIDES_INIT;
	struct rps__placement p;

	ov.numa_node = 0;
	place_ok(t, "mlx5_0", &ov, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	CU_ASSERT_EQUAL(p.pin, 1);
	assert_cpus(&p, "0-15");
	CU_ASSERT_STRING_EQUAL(p.reason, "--numa-node 0 given (cpus 0-15)");
	/* also without a device */
	place_ok(t, NULL, &ov, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	/* a node that does not exist is an error */
	ov.numa_node = 2;
	CU_ASSERT_EQUAL(rps__topo_place(t, "mlx5_0", &ov, &p), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "--numa-node 2: no such NUMA node here (nodes: 0-1)"));
	rps__topo_close(t);
}

static void test_cpus_override(void)
{
	struct rps__topo *t = open_xml("two-node-hca-node1.xml");
	struct rps__topo_overrides ov = RPS__TOPO_OVERRIDES_INIT;
	static const char *const bad[] = { "abc", "0x3", "5-", "-1", ",3", "1 2", "3-1", "1,", "1,,2", "1-2-3", "+1" };
	struct rps__placement p;
	size_t i;

	/* --cpus alone: memory still follows the HCA */
	ov.cpus = "0-3,8";
	place_ok(t, "mlx5_0", &ov, &p);
	CU_ASSERT_EQUAL(p.numa_node, 1);
	CU_ASSERT_EQUAL(p.pin, 1);
	assert_cpus(&p, "0-3,8");
	CU_ASSERT_STRING_EQUAL(p.reason, "HCA mlx5_0 is on PCI 0000:81:00.0, local to NUMA node 1 (cpus 16-31); "
			       "--cpus 0-3,8 given");
	/* both */
	ov.numa_node = 0;
	ov.cpus = "20";
	place_ok(t, "mlx5_0", &ov, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	assert_cpus(&p, "20");
	CU_ASSERT_STRING_EQUAL(p.reason, "--numa-node 0 and --cpus 20 given");
	/* without a device: threads pinned, memory not bound */
	ov.numa_node = -1;
	ov.cpus = "4";
	place_ok(t, NULL, &ov, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 1);
	assert_cpus(&p, "4");
	/* "" means not given */
	ov.cpus = "";
	place_ok(t, "mlx5_0", &ov, &p);
	assert_cpus(&p, "16-31");
	/* garbage, and cpus the machine does not have */
	for (i = 0; i < RPS__ARRAY_SIZE(bad); i++) {
		ov.cpus = bad[i];
		CU_ASSERT_EQUAL(rps__topo_place(t, "mlx5_0", &ov, &p), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "not a cpu list"));
	}
	ov.cpus = "4000000000";
	CU_ASSERT_EQUAL(rps__topo_place(t, "mlx5_0", &ov, &p), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "cpu 4000000000 is not on this machine"));
	ov.cpus = "30-40";
	CU_ASSERT_EQUAL(rps__topo_place(t, "mlx5_0", &ov, &p), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "cpus 32-40 are not on this machine"));
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "(cpus here: 0-31)"));
	ov.cpus = "1,33";
	CU_ASSERT_EQUAL(rps__topo_place(t, "mlx5_0", &ov, &p), -EINVAL);
	CU_ASSERT_STRING_EQUAL(rps__errbuf(), "--cpus 1,33: cpu 33 is not on this machine or not allowed to it "
			       "(cpus here: 0-31)");
	rps__topo_close(t);
}

static void test_no_pin(void)
{
	struct rps__topo *t = open_xml("two-node-hca-node1.xml");
	struct rps__topo_overrides ov = RPS__TOPO_OVERRIDES_INIT;
	struct rps__placement p;

	ov.no_pin = 1;
	place_ok(t, "mlx5_0", &ov, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 0);
	CU_ASSERT_EQUAL(p.warn, 0);
	assert_cpus(&p, "0-31");
	CU_ASSERT_STRING_EQUAL(p.reason, "--no-pin given: nothing bound or pinned, using the whole machine");
	/* pinning with it does nothing, even on a topology that is not this machine */
	CU_ASSERT_EQUAL(rps__topo_pin_thread(t, &p), 0);
	/* it excludes the other two */
	ov.numa_node = 1;
	CU_ASSERT_EQUAL(rps__topo_place(t, "mlx5_0", &ov, &p), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "--no-pin cannot be combined"));
	ov.numa_node = -1;
	ov.cpus = "1";
	CU_ASSERT_EQUAL(rps__topo_place(t, "mlx5_0", &ov, &p), -EINVAL);
	rps__topo_close(t);
}

static void test_single_node(void)
{
	struct rps__topo *t = open_xml("single-node.xml");
	struct rps__placement p;

	CU_ASSERT_EQUAL(rps__topo_num_nodes(t), 1);
	/* attached to the machine, but with one node that is local enough */
	place_ok(t, "mlx5_0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	CU_ASSERT_EQUAL(p.pin, 1);
	CU_ASSERT_EQUAL(p.warn, 0);
	assert_cpus(&p, "0-3");
	CU_ASSERT_STRING_EQUAL(p.reason, "HCA mlx5_0 is on PCI 0000:01:00.0, local to NUMA node 0 (cpus 0-3)");
	place_ok(t, NULL, NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	assert_cpus(&p, "0-3");
	rps__topo_close(t);
}

static void test_no_locality(void)
{
	struct rps__topo *t = open_xml("two-node-no-locality.xml");
	struct rps__placement p;

	/* rxe: an OpenFabrics device with no PCI parent */
	place_ok(t, "rxe0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 0);
	CU_ASSERT_EQUAL(p.warn, 1);
	assert_cpus(&p, "0-31");
	CU_ASSERT_STRING_EQUAL(p.reason, "RDMA device rxe0 has no PCI device (a software device such as rxe or siw): "
			       "using the whole machine");
	/* a PCI HCA that hwloc attaches to the whole 2-node machine: no node is
	 * nearer than another, so bind nothing rather than pick node 0 */
	place_ok(t, "mlx5_0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 0);
	CU_ASSERT_EQUAL(p.warn, 1);
	CU_ASSERT_STRING_EQUAL(p.pci, "0000:81:00.0");
	CU_ASSERT_STRING_EQUAL(p.reason, "HCA mlx5_0 is on PCI 0000:81:00.0, which hwloc ties to no NUMA node: "
			       "using the whole machine");
	rps__topo_close(t);
}

static void test_several_local_nodes(void)
{
	struct rps__topo *t = open_xml("snc.xml");
	struct rps__placement p;

	CU_ASSERT_EQUAL(rps__topo_num_nodes(t), 4);
	place_ok(t, "mlx5_0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, 2);	/* the first of the HCA's package */
	assert_cpus(&p, "8-15");
	CU_ASSERT_STRING_EQUAL(p.reason, "HCA mlx5_0 is on PCI 0000:81:00.0, local to NUMA nodes 2-3 (cpus 8-15): "
			       "memory on node 2");
	rps__topo_close(t);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = calloc(1, (size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

static void test_xml_string_and_errors(void)
{
	struct rps__topo_opts o = { 0 };
	struct rps__topo *t = NULL;
	struct rps__placement p;
	char *xml = slurp(fixture("two-hcas.xml"));

	CU_ASSERT_PTR_NOT_NULL_FATAL(xml);
	o.xml_path = xml;
	CU_ASSERT_EQUAL_FATAL(rps__topo_open(&o, &t), 0);
	place_ok(t, "mlx5_1", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	assert_cpus(&p, "0-15");
	rps__topo_close(t);
	free(xml);

	o.xml_path = "/nonexistent/topo.xml";
	t = NULL;
	CU_ASSERT_EQUAL(rps__topo_open(&o, &t), -ENOENT);
	CU_ASSERT_PTR_NULL(t);
	CU_ASSERT_STRING_EQUAL(rps__errbuf(), "topology XML file /nonexistent/topo.xml: No such file or directory");
	o.xml_path = "<topology version=\"2.0\"><oops/>";
	CU_ASSERT_TRUE(rps__topo_open(&o, &t) < 0);
	CU_ASSERT_PTR_NULL(t);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "expected hwloc 2 XML"));
	rps__topo_close(NULL);
}

static void test_xml_binds_nothing(void)
{
	struct rps__topo *t = open_xml("two-node-hca-node1.xml");
	struct rps__placement p;
	unsigned char *m;
	size_t i;

	place_ok(t, "mlx5_0", NULL, &p);
	CU_ASSERT_FALSE(rps__topo_can_bind_memory(t));
	/* plain memory, still zeroed and page-aligned */
	m = rps__topo_alloc(t, &p, 10000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL((uintptr_t)m % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
	for (i = 0; i < 10000 && !m[i]; i++)
		;
	CU_ASSERT_EQUAL(i, 10000);
	memset(m, 0xab, 10000);
	rps__topo_free(t, m, 10000);
	/* node 1's cpus are not this machine's: refuse, do not pretend */
	CU_ASSERT_EQUAL(rps__topo_pin_thread(t, &p), -ENOTSUP);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "not this machine"));
	rps__topo_close(t);
}

static void test_describe(void)
{
	struct rps__topo *t = open_xml("two-hcas.xml");
	struct rps__placement p;
	char buf[4096], small[16];
	size_t n;
	char *mem = NULL;
	size_t memlen = 0;
	FILE *f;

	place_ok(t, "mlx5_0", NULL, &p);
	n = rps__topo_describe(t, &p, buf, sizeof(buf));
	CU_ASSERT_EQUAL(n, strlen(buf));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "placement: memory on NUMA node 1, threads on cpus 16-31\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "  why: HCA mlx5_0 is on PCI 0000:81:00.0, local to NUMA node 1 (cpus 16-31)\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "another machine, nothing is bound or pinned here"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "NUMA nodes: 2, cpus: 0-31\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "  node 0: cpus 0-15, 64.0 GiB\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "  node 1: cpus 16-31, 64.0 GiB  <- memory\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "  mlx5_0     PCI 0000:81:00.0, NUMA node 1, cpus 16-31, netdev ib0, "
				      "port 1 ACTIVE  <- chosen\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "  mlx5_1     PCI 0000:3b:00.0, NUMA node 0, cpus 0-15, netdev ib1, "
				      "port 1 ACTIVE\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "network devices:\n  ib1        PCI 0000:3b:00.0, NUMA node 0, cpus 0-15, "
				      "rdma mlx5_1\n"));
	/* snprintf-like: cut, NUL-terminated, the full length returned */
	CU_ASSERT_EQUAL(rps__topo_describe(t, &p, small, sizeof(small)), n);
	CU_ASSERT_EQUAL(strlen(small), sizeof(small) - 1);
	CU_ASSERT_EQUAL(rps__topo_describe(t, &p, NULL, 0), n);
	/* print writes the same text */
	f = open_memstream(&mem, &memlen);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(rps__topo_print(t, &p, f), 0);
	fclose(f);
	CU_ASSERT_STRING_EQUAL(mem, buf);
	free(mem);
	/* without a placement: the machine only */
	rps__topo_describe(t, NULL, buf, sizeof(buf));
	CU_ASSERT_PTR_NULL(strstr(buf, "placement:"));
	CU_ASSERT_PTR_NULL(strstr(buf, "<-"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "RDMA devices:\n"));
	rps__topo_close(t);

	/* the software device and the unlocated HCA */
	t = open_xml("two-node-no-locality.xml");
	place_ok(t, "rxe0", NULL, &p);
	rps__topo_describe(t, &p, buf, sizeof(buf));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "placement: memory not bound, threads not pinned (cpus 0-31)\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "  rxe0       no PCI device (software device): no locality, port 1 ACTIVE  "
				      "<- chosen\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "  mlx5_0     PCI 0000:81:00.0, no NUMA locality"));
	rps__topo_close(t);
}

/* ---- this machine ------------------------------------------------------- */

static void test_real_whole_machine(void)
{
	struct rps__topo *t = open_real();
	struct rps__placement p;
	cpu_set_t mine;

	CU_ASSERT_TRUE(rps__topo_num_nodes(t) >= 1);
	place_ok(t, NULL, NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 0);
	CU_ASSERT_STRING_EQUAL(p.reason, "no RDMA device: using the whole machine");
	CU_ASSERT_EQUAL_FATAL(sched_getaffinity(0, sizeof(mine), &mine), 0);
	CU_ASSERT_TRUE(p.ncpus >= CPU_COUNT(&mine));
	/* rxe is never located: unknown to hwloc, or without a PCI parent */
	place_ok(t, "rxe0", NULL, &p);
	CU_ASSERT_EQUAL(p.numa_node, -1);
	CU_ASSERT_EQUAL(p.pin, 0);
	CU_ASSERT_EQUAL(p.warn, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(p.reason, "RDMA device rxe0 "));
	rps__topo_close(t);
}

#ifndef MPOL_BIND
#define MPOL_BIND 2
#endif
#ifndef MPOL_F_ADDR
#define MPOL_F_ADDR 2
#endif

static void test_real_alloc(void)
{
	static const size_t sizes[] = { 0, 1, 100, 4095, 4096, 4097, 1 << 20, (3 << 20) + 5 };
	struct rps__topo *t = open_real();
	struct rps__topo_overrides ov = RPS__TOPO_OVERRIDES_INIT;
	struct rps__placement p;
	size_t page = (size_t)sysconf(_SC_PAGESIZE), i, j, sz;
	int pass;

	ov.numa_node = 0;
	place_ok(t, NULL, &ov, &p);
	CU_ASSERT_EQUAL(p.numa_node, 0);
	for (pass = 0; pass < 3; pass++) {
		const struct rps__placement *pp = pass == 0 ? &p : NULL;
		struct rps__placement whole;

		if (pass == 2) {
			place_ok(t, NULL, NULL, &whole);
			pp = &whole;
		}
		for (i = 0; i < RPS__ARRAY_SIZE(sizes); i++) {
			unsigned char *m = rps__topo_alloc(t, pp, sizes[i]);

			CU_ASSERT_PTR_NOT_NULL_FATAL(m);
			CU_ASSERT_EQUAL((uintptr_t)m % page, 0);
			/* zeroed up to the end of the last page */
			sz = RPS__ALIGN_UP(sizes[i] ? sizes[i] : 1, page);
			for (j = 0; j < sz && !m[j]; j++)
				;
			CU_ASSERT_EQUAL(j, sz);
			memset(m, 0x5a, sz);
			if (pass == 0 && rps__topo_can_bind_memory(t)) {
				int mode = -1;
				unsigned long mask[1024 / (8 * sizeof(unsigned long))] = { 0 };

				CU_ASSERT_EQUAL(syscall(SYS_get_mempolicy, &mode, mask, 1024ul, m, MPOL_F_ADDR), 0);
				CU_ASSERT_EQUAL(mode, MPOL_BIND);
				CU_ASSERT_EQUAL(mask[0], 1ul);
			}
			rps__topo_free(t, m, sizes[i]);
		}
	}
	/* a node that does not exist (a stale placement): plain memory, not a failure */
	p.numa_node = 999;
	for (i = 0; i < 2; i++) {
		unsigned char *m = rps__topo_alloc(i ? NULL : t, &p, 5000);

		CU_ASSERT_PTR_NOT_NULL_FATAL(m);
		CU_ASSERT_EQUAL((uintptr_t)m % page, 0);
		for (j = 0; j < 5000 && !m[j]; j++)
			;
		CU_ASSERT_EQUAL(j, 5000);
		memset(m, 1, 2 * page);
		rps__topo_free(i ? NULL : t, m, 5000);
	}
	CU_ASSERT_EQUAL(rps__topo_pin_thread(NULL, NULL), 0);
	if (!rps__topo_can_bind_memory(t))
		fprintf(stderr, "\n  note: memory binding does not work here; checked the plain fallback only\n");
	rps__topo_close(t);
}

/* The daemon (opts.log) hears once that memory could not be bound; the
 * library (log 0) never logs. */
static void test_real_unbound_warns_once(void)
{
	struct rps__topo_opts o = { .log = 1 };
	struct rps__topo *t, *quiet;
	struct rps__placement p;
	char out[2048] = "";
	int saved, level = rps__log_level, i;
	FILE *f = tmpfile();
	size_t n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL_FATAL(rps__topo_open(&o, &t), 0);
	CU_ASSERT_EQUAL_FATAL(rps__topo_open(NULL, &quiet), 0);
	place_ok(t, NULL, NULL, &p);
	p.numa_node = 999;	/* not a node: cannot be bound */
	rps__log_level = RPS__LOG_DEBUG;
	fflush(stderr);
	saved = dup(2);
	dup2(fileno(f), 2);
	for (i = 0; i < 6; i++) {
		struct rps__topo *tt = i % 2 ? quiet : t;
		rps__topo_free(tt, rps__topo_alloc(tt, &p, 100), 100);
	}
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rps__log_level = level;
	rewind(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	fclose(f);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "memory not bound to NUMA node 999 (no such NUMA node): "
				      "using plain page-aligned memory\n"));
	CU_ASSERT_PTR_NULL(strstr(strstr(out, "memory not bound") + 1, "memory not bound"));
	n = rps__topo_describe(t, NULL, NULL, 0);
	{
		char *d = malloc(n + 1);
		CU_ASSERT_PTR_NOT_NULL_FATAL(d);
		rps__topo_describe(t, NULL, d, n + 1);
		CU_ASSERT_PTR_NOT_NULL(strstr(d, "allocations: 0 bound, 3 not"));
		free(d);
	}
	rps__topo_close(quiet);
	rps__topo_close(t);
}

struct pin_arg {
	struct rps__topo *t;
	const struct rps__placement *p;
	int ret;
	cpu_set_t after;
};

static void *pin_main(void *arg)
{
	struct pin_arg *a = arg;

	a->ret = rps__topo_pin_thread(a->t, a->p);
	if (sched_getaffinity(0, sizeof(a->after), &a->after))
		a->ret = -errno;
	return NULL;
}

static void test_real_pin(void)
{
	struct rps__topo *t = open_real();
	struct rps__topo_overrides ov = RPS__TOPO_OVERRIDES_INIT;
	struct rps__placement p;
	struct pin_arg a = { 0 };
	cpu_set_t before, main_after, one;
	char cpu[16];
	pthread_t th;
	int last = -1, c;

	CU_ASSERT_EQUAL_FATAL(sched_getaffinity(0, sizeof(before), &before), 0);
	for (c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &before))
			last = c;
	CU_ASSERT_FATAL(last >= 0);
	snprintf(cpu, sizeof(cpu), "%d", last);
	ov.cpus = cpu;
	place_ok(t, NULL, &ov, &p);
	CU_ASSERT_EQUAL(p.pin, 1);
	CPU_ZERO(&one);
	CPU_SET(last, &one);
	CU_ASSERT_TRUE(CPU_EQUAL(&p.cpuset, &one));

	/* a new thread pins itself: its affinity is exactly that cpu */
	a.t = t;
	a.p = &p;
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, pin_main, &a), 0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(a.ret, 0);
	CU_ASSERT_TRUE(CPU_EQUAL(&a.after, &one));
	if (CPU_COUNT(&before) > 1)
		CU_ASSERT_FALSE(CPU_EQUAL(&a.after, &before));
	/* and only that thread */
	CU_ASSERT_EQUAL(sched_getaffinity(0, sizeof(main_after), &main_after), 0);
	CU_ASSERT_TRUE(CPU_EQUAL(&main_after, &before));

	/* --no-pin leaves the thread alone */
	ov.cpus = NULL;
	ov.no_pin = 1;
	place_ok(t, NULL, &ov, &p);
	a.ret = -1;
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, pin_main, &a), 0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(a.ret, 0);
	CU_ASSERT_TRUE(CPU_EQUAL(&a.after, &before));
	rps__topo_close(t);
}

/* Run in a child: narrow the process to one cpu (as taskset would), then
 * --numa-node 0 must pin to that cpu only, and say why. */
static int narrowed_child(int cpu)
{
	struct rps__topo_overrides ov = RPS__TOPO_OVERRIDES_INIT;
	struct rps__topo_opts o = { 0 };
	struct rps__topo *t;
	struct rps__placement p;
	cpu_set_t one;
	char want[16];
	int ok;

	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one) || rps__topo_open(&o, &t))
		return 2;
	ov.numa_node = 0;
	if (rps__topo_place(t, NULL, &ov, &p))
		return 3;
	snprintf(want, sizeof(want), "%d", cpu);
	ok = p.pin == 1 && !strcmp(p.cpus, want) && CPU_EQUAL(&p.cpuset, &one) &&
	     strstr(p.reason, "narrowed by this process's affinity");
	if (!ok)
		fprintf(stderr, "\n  child: cpus %s, reason: %s\n", p.cpus, p.reason);
	rps__topo_close(t);
	return ok ? 0 : 4;
}

static void test_real_respects_affinity(void)
{
	struct rps__topo *t = open_real();
	struct rps__topo_overrides ov = RPS__TOPO_OVERRIDES_INIT;
	struct rps__placement p;
	int status = -1, first = -1, c;
	pid_t pid;

	ov.numa_node = 0;
	place_ok(t, NULL, &ov, &p);
	rps__topo_close(t);
	for (c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &p.cpuset)) {
			first = c;
			break;
		}
	if (p.ncpus < 2 || first < 0) {
		fprintf(stderr, "\n  note: node 0 has fewer than 2 cpus here; affinity narrowing not checked\n");
		return;
	}
	fflush(NULL);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0)
		_exit(narrowed_child(first));
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "HCA on NUMA node 1 of 2", test_hca_on_node1 },
		{ "HCA on NUMA node 0 of 2", test_hca_on_node0 },
		{ "two HCAs, chosen by name", test_two_hcas_by_name },
		{ "unknown device: whole machine, warned", test_unknown_device },
		{ "no device: whole machine", test_no_device },
		{ "--numa-node override", test_numa_override },
		{ "--cpus override", test_cpus_override },
		{ "--no-pin", test_no_pin },
		{ "single-node machine", test_single_node },
		{ "rxe and unlocated HCA: no locality", test_no_locality },
		{ "several local nodes: the first", test_several_local_nodes },
		{ "XML document in memory; load errors", test_xml_string_and_errors },
		{ "XML topology binds and pins nothing", test_xml_binds_nothing },
		{ "describe and print", test_describe },
		{ "this machine: whole machine without HCA", test_real_whole_machine },
		{ "this machine: alloc zeroed, page-aligned, bound", test_real_alloc },
		{ "this machine: unbound memory is reported once", test_real_unbound_warns_once },
		{ "this machine: pinning changes the thread's affinity", test_real_pin },
		{ "this machine: derived cpus respect the process affinity", test_real_respects_affinity },
	};
	const struct cutest_suite suites[] = {
		{ "topo", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
