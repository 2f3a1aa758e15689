/*
 * topo.c - hwloc placement: which NUMA node and which cpus are local to the
 * RDMA device, memory bound there, threads pinned there.  See topo.h for the
 * rules.
 *
 * The device lookup is done by hand (OS devices of type OpenFabrics, by
 * name) rather than with hwloc/openfabrics-verbs.h, which would pull
 * <infiniband/verbs.h> into src/.
 */
#include "config.h"
#include "common/common.h"
#include "common/topo.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hwloc.h>
#include <hwloc/glibc-sched.h>

struct rps__topo {
	hwloc_topology_t topo;
	int thissystem;		/* 0: loaded from XML, nothing is bound or pinned */
	int log;		/* warnings to rps__log */
	int nnodes;
	size_t page;
	char source[192];	/* "this machine", "XML file tests/topo/a.xml" */
	int membind_ok;		/* mbind works here (probed at open) */
	char membind_why[160];	/* why not, when !membind_ok */
	atomic_int warned;	/* the one warning about unbound memory was given */
	atomic_ulong nbound, nplain;	/* allocations bound / not bound though asked */
};

/* ---- small helpers ------------------------------------------------------ */

/* snprintf that is allowed to cut (messages, lists). */
static void fmt_to(char *buf, size_t len, const char *fmt, ...) RPS__PRINTF(3, 4);
static void fmt_to(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

static void list_str(hwloc_const_bitmap_t set, char *buf, size_t len)
{
	if (!set || hwloc_bitmap_iszero(set))
		snprintf(buf, len, "none");
	else if (hwloc_bitmap_list_snprintf(buf, len, set) >= (int)len && len > 4)
		memcpy(buf + len - 4, "...", 4);	/* cut, and say so */
}

static hwloc_obj_t pci_parent(hwloc_obj_t o)
{
	for (o = o ? o->parent : NULL; o && hwloc_obj_type_is_io(o->type); o = o->parent)
		if (o->type == HWLOC_OBJ_PCI_DEVICE)
			return o;
	return NULL;
}

static void busid_str(hwloc_obj_t pci, char *buf, size_t len)
{
	if (!pci) {
		snprintf(buf, len, "%s", "");
		return;
	}
	snprintf(buf, len, "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
		 pci->attr->pcidev.dev, pci->attr->pcidev.func);
}

static hwloc_obj_t find_osdev(struct rps__topo *t, hwloc_obj_osdev_type_t type, const char *name)
{
	hwloc_obj_t o = NULL;

	while ((o = hwloc_get_next_osdev(t->topo, o)))
		if (o->attr->osdev.type == type && o->name && !strcmp(o->name, name))
			return o;
	return NULL;
}

/* Nonzero if obj's locality is the whole of a multi-node machine: hwloc
 * attached the device to the machine, i.e. knows no NUMA node for it. */
static int no_numa_locality(struct rps__topo *t, hwloc_obj_t anc)
{
	if (t->nnodes < 2)
		return 0;	/* one node: it is local to everything */
	if (!anc->nodeset || hwloc_bitmap_iszero(anc->nodeset))
		return 1;
	return hwloc_bitmap_isincluded(hwloc_topology_get_topology_nodeset(t->topo), anc->nodeset);
}

/* "NUMA node 1", "NUMA nodes 2-3" */
static void nodes_str(hwloc_const_bitmap_t ns, char *buf, size_t len)
{
	char l[64];

	list_str(ns, l, sizeof(l));
	fmt_to(buf, len, "NUMA node%s %s", hwloc_bitmap_weight(ns) > 1 ? "s" : "", l);
}

/* ---- open / close -------------------------------------------------------- */

static void probe_membind(struct rps__topo *t)
{
	const struct hwloc_topology_support *s = hwloc_topology_get_support(t->topo);
	hwloc_obj_t node = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, 0);
	void *p;

	if (!t->thissystem) {
		snprintf(t->membind_why, sizeof(t->membind_why), "the topology is not this machine");
		return;
	}
	if (!s->membind->alloc_membind || !s->membind->bind_membind || !node) {
		snprintf(t->membind_why, sizeof(t->membind_why), "hwloc cannot bind memory on this system");
		return;
	}
	errno = 0;
	p = hwloc_alloc_membind(t->topo, t->page, node->nodeset, HWLOC_MEMBIND_BIND,
				HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
	if (!p) {
		int e = errno ? errno : ENOSYS;
		snprintf(t->membind_why, sizeof(t->membind_why), "mbind: %s%s", strerror(e),
			 e == EPERM ? " (a container's seccomp profile forbids it?)" : "");
		return;
	}
	hwloc_free(t->topo, p, t->page);
	t->membind_ok = 1;
}

int rps__topo_open(const struct rps__topo_opts *o, struct rps__topo **out)
{
	const char *xml = o ? o->xml_path : NULL;
	struct rps__topo *t;
	long page;
	int ret;

	t = calloc(1, sizeof(*t));
	if (!t)
		return rps__seterr(-ENOMEM, "out of memory");
	t->log = o ? o->log : 0;
	page = sysconf(_SC_PAGESIZE);
	t->page = page > 0 ? (size_t)page : 4096;
	if (hwloc_topology_init(&t->topo)) {
		ret = rps__seterr(errno ? -errno : -ENOMEM, "hwloc_topology_init: %s", strerror(errno));
		free(t);
		return ret;
	}
	/* PCI devices that matter (network, InfiniBand, GPUs...) and their OS
	 * devices; bridges only where they lead to one. */
	hwloc_topology_set_io_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
	if (xml && xml[0] == '<') {
		snprintf(t->source, sizeof(t->source), "an XML document");
		if (strlen(xml) >= INT_MAX) {
			ret = rps__seterr(-EINVAL, "topology XML document too large");
			goto err;
		}
		if (hwloc_topology_set_xmlbuffer(t->topo, xml, (int)strlen(xml) + 1)) {
			ret = rps__seterr(-EINVAL, "topology XML document: hwloc refuses it: %s (expected hwloc 2 XML, as `lstopo --of xml` writes)",
					  strerror(errno));
			goto err;
		}
	} else if (xml) {
		snprintf(t->source, sizeof(t->source), "XML file %s", xml);
		if (access(xml, R_OK)) {
			ret = rps__seterr(-errno, "topology XML file %s: %s", xml, strerror(errno));
			goto err;
		}
		if (hwloc_topology_set_xml(t->topo, xml)) {
			ret = rps__seterr(-EINVAL, "topology XML file %s: hwloc refuses it: %s (expected hwloc 2 XML, as `lstopo --of xml` writes)",
					  xml, strerror(errno));
			goto err;
		}
	} else {
		snprintf(t->source, sizeof(t->source), "this machine");
	}
	if (hwloc_topology_load(t->topo)) {
		int e = errno ? errno : EINVAL;
		if (xml)
			ret = rps__seterr(-e, "loading the topology from %s: %s (expected hwloc 2 XML, as `lstopo --of xml` writes)",
					  t->source, strerror(e));
		else
			ret = rps__seterr(-e, "hwloc could not read this machine's topology: %s", strerror(e));
		goto err;
	}
	t->thissystem = hwloc_topology_is_thissystem(t->topo);
	t->nnodes = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_NUMANODE);
	if (t->nnodes < 1)
		t->nnodes = 1;
	probe_membind(t);
	*out = t;
	return 0;
err:
	hwloc_topology_destroy(t->topo);
	free(t);
	return ret;
}

void rps__topo_close(struct rps__topo *t)
{
	if (!t)
		return;
	hwloc_topology_destroy(t->topo);
	free(t);
}

int rps__topo_is_this_machine(const struct rps__topo *t)
{
	return t->thissystem;
}

int rps__topo_num_nodes(const struct rps__topo *t)
{
	return t->nnodes;
}

int rps__topo_can_bind_memory(const struct rps__topo *t)
{
	return t->membind_ok;
}

/* ---- placement ------------------------------------------------------------ */

/* Where the device is: sets *node (-1: nowhere in particular), *cpus (NULL:
 * the whole machine; else owned by the caller), the PCI id, the reason. */
static void locate(struct rps__topo *t, const char *dev, int *node, hwloc_bitmap_t *cpus,
		   struct rps__placement *out, char *why, size_t whylen)
{
	hwloc_obj_t od, pci, anc;
	char cl[128], nl[64];

	*node = -1;
	*cpus = NULL;
	if (!dev || !*dev) {
		snprintf(why, whylen, "no RDMA device: using the whole machine");
		return;
	}
	out->warn = 1;
	od = find_osdev(t, HWLOC_OBJ_OSDEV_OPENFABRICS, dev);
	if (!od) {
		char known[160] = "";
		size_t n = 0;
		hwloc_obj_t o = NULL;

		while ((o = hwloc_get_next_osdev(t->topo, o)) && n < sizeof(known))
			if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && o->name)
				n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%s", n ? ", " : "", o->name);
		if (n)
			snprintf(why, whylen, "RDMA device %s is unknown to hwloc (it sees %s): using the whole machine",
				 dev, known);
		else
			snprintf(why, whylen, "RDMA device %s is unknown to hwloc (it sees no RDMA device; a software "
				 "device such as rxe has no PCI locality): using the whole machine", dev);
		return;
	}
	pci = pci_parent(od);
	if (!pci) {
		snprintf(why, whylen, "RDMA device %s has no PCI device (a software device such as rxe or siw): "
			 "using the whole machine", dev);
		return;
	}
	busid_str(pci, out->pci, sizeof(out->pci));
	anc = hwloc_get_non_io_ancestor_obj(t->topo, od);
	if (!anc || !anc->cpuset || no_numa_locality(t, anc)) {
		snprintf(why, whylen, "HCA %s is on PCI %s, which hwloc ties to no NUMA node: using the whole machine",
			 dev, out->pci);
		return;
	}
	out->warn = 0;
	*node = hwloc_bitmap_first(anc->nodeset);
	*cpus = hwloc_bitmap_dup(anc->cpuset);
	if (*cpus)
		hwloc_bitmap_and(*cpus, *cpus, hwloc_topology_get_allowed_cpuset(t->topo));
	list_str(*cpus, cl, sizeof(cl));
	nodes_str(anc->nodeset, nl, sizeof(nl));
	if (hwloc_bitmap_weight(anc->nodeset) > 1)
		snprintf(why, whylen, "HCA %s is on PCI %s, local to %s (cpus %s): memory on node %d",
			 dev, out->pci, nl, cl, *node);
	else
		snprintf(why, whylen, "HCA %s is on PCI %s, local to %s (cpus %s)", dev, out->pci, nl, cl);
}

/* Parse --cpus: "N" or "N-M" items (N <= M) separated by commas, each cpu
 * on this machine.  Checked by hand first: hwloc's own parser accepts
 * "0x3" or "-1" and would grow a bitmap to any number it is given. */
static int parse_cpus(struct rps__topo *t, const char *s, hwloc_bitmap_t set)
{
	hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(t->topo);
	char have[128], bad[128];
	const char *c = s;

	for (;;) {
		unsigned long a, b;
		char *end;

		if (*c < '0' || *c > '9')
			goto syntax;
		a = b = strtoul(c, &end, 10);
		if (*end == '-') {
			c = end + 1;
			if (*c < '0' || *c > '9')
				goto syntax;
			b = strtoul(c, &end, 10);
		}
		if (a > b)
			goto syntax;
		if (b >= 1u << 20)
			return rps__seterr(-EINVAL, "--cpus %s: cpu %lu is not on this machine", s, b);
		c = end;
		if (!*c)
			break;
		if (*c++ != ',')
			goto syntax;
	}
	if (hwloc_bitmap_list_sscanf(set, s) || hwloc_bitmap_iszero(set) || hwloc_bitmap_weight(set) < 0)
		goto syntax;
	if (!hwloc_bitmap_isincluded(set, allowed)) {
		hwloc_bitmap_t extra = hwloc_bitmap_alloc();
		if (extra)
			hwloc_bitmap_andnot(extra, set, allowed);
		list_str(extra, bad, sizeof(bad));
		list_str(allowed, have, sizeof(have));
		hwloc_bitmap_free(extra);
		return rps__seterr(-EINVAL, "--cpus %s: %s %s %s not on this machine or not allowed to it (cpus here: %s)",
				   s, strpbrk(bad, ",-") ? "cpus" : "cpu", bad, strpbrk(bad, ",-") ? "are" : "is", have);
	}
	return 0;
syntax:
	return rps__seterr(-EINVAL, "--cpus '%s': not a cpu list (say e.g. 0-3,8)", s);
}

/* Refuse overrides that cannot be honoured here; parse --cpus into *forced. */
static int place_check(struct rps__topo *t, const struct rps__topo_overrides *ov, const char *cpus_ov,
		       hwloc_bitmap_t *forced)
{
	if (ov->no_pin && (ov->numa_node >= 0 || cpus_ov))
		return rps__seterr(-EINVAL, "--no-pin cannot be combined with --numa-node or --cpus");
	if (ov->numa_node >= 0 && !hwloc_get_numanode_obj_by_os_index(t->topo, (unsigned)ov->numa_node)) {
		char have[64];
		list_str(hwloc_topology_get_topology_nodeset(t->topo), have, sizeof(have));
		return rps__seterr(-EINVAL, "--numa-node %d: no such NUMA node here (nodes: %s)", ov->numa_node, have);
	}
	if (cpus_ov) {
		*forced = hwloc_bitmap_alloc();
		if (!*forced)
			return rps__seterr(-ENOMEM, "out of memory");
		return parse_cpus(t, cpus_ov, *forced);
	}
	return 0;
}

/* Choose the cpus (NULL: not pinned) and the NUMA node: as the overrides
 * say, else where the device is.  *derived: the cpus were not given. */
static hwloc_bitmap_t place_choose(struct rps__topo *t, const char *dev, const struct rps__topo_overrides *ov,
				   const char *cpus_ov, hwloc_const_bitmap_t forced, struct rps__placement *out,
				   int *derived, char *why, size_t why_len)
{
	hwloc_const_bitmap_t whole = hwloc_topology_get_allowed_cpuset(t->topo);
	hwloc_bitmap_t cpus = NULL, loc_cpus = NULL;
	int loc_node = -1;
	char cl[128];

	if (ov->no_pin) {
		snprintf(why, why_len, "--no-pin given: nothing bound or pinned, using the whole machine");
	} else if (ov->numa_node >= 0 && cpus_ov) {
		out->numa_node = ov->numa_node;
		cpus = hwloc_bitmap_dup(forced);
		snprintf(why, why_len, "--numa-node %d and --cpus %s given", ov->numa_node, cpus_ov);
	} else if (ov->numa_node >= 0) {
		hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(t->topo, (unsigned)ov->numa_node);

		out->numa_node = ov->numa_node;
		if (node->cpuset && !hwloc_bitmap_iszero(node->cpuset)) {
			cpus = hwloc_bitmap_dup(node->cpuset);
			if (cpus)
				hwloc_bitmap_and(cpus, cpus, whole);
			*derived = 1;
		}
		list_str(cpus, cl, sizeof(cl));
		if (cpus)
			snprintf(why, why_len, "--numa-node %d given (cpus %s)", ov->numa_node, cl);
		else
			snprintf(why, why_len, "--numa-node %d given (a node without cpus: threads not pinned)",
				 ov->numa_node);
	} else {
		char loc[sizeof(out->reason)];

		locate(t, dev, &loc_node, &loc_cpus, out, loc, sizeof(loc));
		out->numa_node = loc_node;
		if (cpus_ov) {
			cpus = hwloc_bitmap_dup(forced);
			fmt_to(why, why_len, "%s; --cpus %s given", loc, cpus_ov);
		} else {
			cpus = loc_cpus;
			loc_cpus = NULL;
			*derived = cpus != NULL;
			snprintf(why, why_len, "%s", loc);
		}
	}
	hwloc_bitmap_free(loc_cpus);
	return cpus;
}

/* Respect this process's cpu affinity (taskset, an MPI launcher) when the
 * cpus were derived rather than given. */
static void place_narrow_to_affinity(struct rps__topo *t, hwloc_bitmap_t *cpus, char *why, size_t why_len)
{
	hwloc_bitmap_t proc = NULL;
	char cl[128];
	size_t n;

	if (t->thissystem && (proc = hwloc_bitmap_alloc()) &&
	    !hwloc_get_cpubind(t->topo, proc, HWLOC_CPUBIND_PROCESS) && !hwloc_bitmap_iszero(proc) &&
	    !hwloc_bitmap_isincluded(*cpus, proc)) {
		char pl[128];

		list_str(proc, pl, sizeof(pl));
		n = strlen(why);
		if (!hwloc_bitmap_intersects(*cpus, proc)) {
			snprintf(why + n, why_len - n, "; none of them in this process's affinity (cpus %s): "
				 "threads not pinned", pl);
			hwloc_bitmap_free(*cpus);
			*cpus = NULL;
		} else {
			hwloc_bitmap_and(*cpus, *cpus, proc);
			list_str(*cpus, cl, sizeof(cl));
			snprintf(why + n, why_len - n, "; threads on cpus %s, narrowed by this process's affinity",
				 cl);
		}
	}
	hwloc_bitmap_free(proc);
}

int rps__topo_place(struct rps__topo *t, const char *dev, const struct rps__topo_overrides *ov,
		    struct rps__placement *out)
{
	static const struct rps__topo_overrides none = RPS__TOPO_OVERRIDES_INIT;
	hwloc_const_bitmap_t whole = hwloc_topology_get_allowed_cpuset(t->topo);
	hwloc_bitmap_t cpus = NULL, forced = NULL;
	const char *cpus_ov;
	char why[sizeof(out->reason)];
	int derived = 0, ret = 0;

	if (!ov)
		ov = &none;
	cpus_ov = ov->cpus && *ov->cpus ? ov->cpus : NULL;
	memset(out, 0, sizeof(*out));
	out->numa_node = -1;
	if (dev)
		snprintf(out->device, sizeof(out->device), "%s", dev);
	why[0] = '\0';

	ret = place_check(t, ov, cpus_ov, &forced);
	if (ret)
		goto out;
	cpus = place_choose(t, dev, ov, cpus_ov, forced, out, &derived, why, sizeof(why));
	if (cpus_ov && !ov->no_pin && !cpus) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	if (cpus && hwloc_bitmap_iszero(cpus)) {
		hwloc_bitmap_free(cpus);
		cpus = NULL;
		derived = 0;
	}
	if (cpus && derived)
		place_narrow_to_affinity(t, &cpus, why, sizeof(why));

	if (cpus) {
		if (hwloc_bitmap_last(cpus) >= CPU_SETSIZE) {
			ret = rps__seterr(-EINVAL, "cpu %d: pinning cpus beyond %d is not supported",
					  hwloc_bitmap_last(cpus), CPU_SETSIZE - 1);
			goto out;
		}
		out->pin = 1;
	}
	hwloc_cpuset_to_glibc_sched_affinity(t->topo, cpus ? cpus : whole, &out->cpuset, sizeof(out->cpuset));
	out->ncpus = hwloc_bitmap_weight(cpus ? cpus : whole);
	list_str(cpus ? cpus : whole, out->cpus, sizeof(out->cpus));
	snprintf(out->reason, sizeof(out->reason), "%s", why);
out:
	hwloc_bitmap_free(cpus);
	hwloc_bitmap_free(forced);
	return ret;
}

/* ---- memory ------------------------------------------------------------- */

static void note_unbound(struct rps__topo *t, int node, const char *why)
{
	atomic_fetch_add(&t->nplain, 1);
	if (atomic_exchange(&t->warned, 1) || !t->log)
		return;
	/* On a single-node machine nothing is lost: say it quietly. */
	rps__log(t->nnodes > 1 ? RPS__LOG_WARN : RPS__LOG_INFO,
		 "memory not bound to NUMA node %d (%s): using plain page-aligned memory", node, why);
}

/* Without a topology (a TCP client that did not open one): plain memory. */
static size_t plain_page(void)
{
	long page = sysconf(_SC_PAGESIZE);

	return page > 0 ? (size_t)page : 4096;
}

void *rps__topo_alloc(struct rps__topo *t, const struct rps__placement *p, size_t len)
{
	size_t sz, page = t ? t->page : plain_page();
	void *ptr = NULL;

	if (len > SIZE_MAX - page) {
		rps__seterr(-ENOMEM, "allocating %zu bytes: too large", len);
		return NULL;
	}
	sz = RPS__ALIGN_UP(len ? len : 1, page);
	if (!t) {
		if (posix_memalign(&ptr, page, sz))
			ptr = NULL;
	} else if (p && p->numa_node >= 0 && t->thissystem) {
		hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(t->topo, (unsigned)p->numa_node);

		if (!node) {
			note_unbound(t, p->numa_node, "no such NUMA node");
		} else if (!t->membind_ok) {
			note_unbound(t, p->numa_node, t->membind_why);
		} else {
			errno = 0;
			ptr = hwloc_alloc_membind(t->topo, sz, node->nodeset, HWLOC_MEMBIND_BIND,
						  HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
			if (ptr) {
				atomic_fetch_add(&t->nbound, 1);
			} else {
				char why[96];
				snprintf(why, sizeof(why), "mbind: %s", strerror(errno ? errno : ENOSYS));
				note_unbound(t, p->numa_node, why);
			}
		}
	}
	if (!ptr && t)
		ptr = hwloc_alloc(t->topo, sz);	/* mmap here, page-aligned heap for XML topologies */
	if (!ptr) {
		rps__seterr(-ENOMEM, "allocating %zu bytes: out of memory", sz);
		return NULL;
	}
	/* Zero it, which also faults the pages in now, on the bound node. */
	memset(ptr, 0, sz);
	return ptr;
}

void rps__topo_free(struct rps__topo *t, void *ptr, size_t len)
{
	if (!ptr)
		return;
	if (!t)
		free(ptr);
	else
		hwloc_free(t->topo, ptr, RPS__ALIGN_UP(len ? len : 1, t->page));
}

/* ---- threads ------------------------------------------------------------ */

int rps__topo_pin_thread(struct rps__topo *t, const struct rps__placement *p)
{
	hwloc_bitmap_t set;
	int ret = 0;

	if (!p || !p->pin)
		return 0;
	if (!t)
		return rps__seterr(-EINVAL, "not pinning to cpus %s: no topology", p->cpus);
	if (!t->thissystem)
		return rps__seterr(-ENOTSUP, "not pinning to cpus %s: the topology comes from %s, not this machine",
				   p->cpus, t->source);
	set = hwloc_bitmap_alloc();
	if (!set)
		return rps__seterr(-ENOMEM, "out of memory");
	hwloc_cpuset_from_glibc_sched_affinity(t->topo, set, &p->cpuset, sizeof(p->cpuset));
	if (hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD)) {
		int e = errno ? errno : EINVAL;
		ret = rps__seterr(-e, "pinning a thread to cpus %s: %s (see --cpus, --no-pin)", p->cpus, strerror(e));
	}
	hwloc_bitmap_free(set);
	return ret;
}

/* ---- describe ------------------------------------------------------------ */

struct out {
	char *buf;
	size_t len, pos;	/* pos: what the whole text needs so far */
};

static void put(struct out *o, const char *fmt, ...) RPS__PRINTF(2, 3);
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(o->pos < o->len ? o->buf + o->pos : NULL, o->pos < o->len ? o->len - o->pos : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->pos += (size_t)n;
}

static void mem_str(uint64_t bytes, char *buf, size_t len)
{
	if (bytes >= (1ull << 30))
		snprintf(buf, len, "%.1f GiB", (double)bytes / (1ull << 30));
	else
		snprintf(buf, len, "%.1f MiB", (double)bytes / (1ull << 20));
}

static void put_device(struct rps__topo *t, struct out *o, hwloc_obj_t od, const char *chosen)
{
	static const char *const states[] = { "?", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER" };
	hwloc_obj_t pci = pci_parent(od), anc, c;
	char bus[32], nl[64], cl[128], key[32];
	int port;

	put(o, "  %-10s", od->name);
	if (!pci) {
		put(o, " no PCI device (software device): no locality");
	} else {
		busid_str(pci, bus, sizeof(bus));
		anc = hwloc_get_non_io_ancestor_obj(t->topo, od);
		put(o, " PCI %s", bus);
		if (!anc || no_numa_locality(t, anc)) {
			put(o, ", no NUMA locality");
		} else {
			nodes_str(anc->nodeset, nl, sizeof(nl));
			list_str(anc->cpuset, cl, sizeof(cl));
			put(o, ", %s, cpus %s", nl, cl);
		}
		/* the other OS devices of the same PCI function (ib0 for mlx5_0) */
		for (c = pci->io_first_child; c; c = c->next_sibling)
			if (c != od && c->type == HWLOC_OBJ_OS_DEVICE && c->name)
				put(o, ", %s %s", c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS ? "rdma" :
				    c->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK ? "netdev" : "dev",
				    c->name);
	}
	for (port = 1; port <= 4; port++) {
		const char *v;
		snprintf(key, sizeof(key), "Port%dState", port);
		v = hwloc_obj_get_info_by_name(od, key);
		if (v) {
			int s = atoi(v);
			put(o, ", port %d %s", port, s >= 0 && s < (int)RPS__ARRAY_SIZE(states) ? states[s] : v);
		}
	}
	if (chosen && !strcmp(chosen, od->name))
		put(o, "  <- chosen");
	put(o, "\n");
}

size_t rps__topo_describe(struct rps__topo *t, const struct rps__placement *p, char *buf, size_t len)
{
	struct out o = { buf, len, 0 };
	hwloc_obj_t n = NULL, od;
	char cl[128], mem[32];
	int any;

	if (buf && len)
		buf[0] = '\0';
	if (p) {
		if (p->numa_node >= 0)
			put(&o, "placement: memory on NUMA node %d, ", p->numa_node);
		else
			put(&o, "placement: memory not bound, ");
		if (p->pin)
			put(&o, "threads on cpus %s\n", p->cpus);
		else
			put(&o, "threads not pinned (cpus %s)\n", p->cpus);
		put(&o, "  why: %s\n", p->reason);
	}
	put(&o, "topology: %s (hwloc %s)%s\n", t->source, HWLOC_VERSION,
	    t->thissystem ? "" : ": another machine, nothing is bound or pinned here");
	if (t->thissystem) {
		if (t->membind_ok)
			put(&o, "memory binding: works");
		else
			put(&o, "memory binding: not possible here (%s): plain memory is used", t->membind_why);
		if (atomic_load(&t->nbound) || atomic_load(&t->nplain))
			put(&o, "; allocations: %lu bound, %lu not", atomic_load(&t->nbound), atomic_load(&t->nplain));
		put(&o, "\n");
	}
	list_str(hwloc_topology_get_allowed_cpuset(t->topo), cl, sizeof(cl));
	put(&o, "NUMA nodes: %d, cpus: %s\n", t->nnodes, cl);
	while ((n = hwloc_get_next_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, n))) {
		list_str(n->cpuset, cl, sizeof(cl));
		mem_str(n->attr->numanode.local_memory, mem, sizeof(mem));
		put(&o, "  node %u: cpus %s, %s%s\n", n->os_index, cl, mem,
		    p && p->numa_node == (int)n->os_index ? "  <- memory" : "");
	}
	put(&o, "RDMA devices:");
	any = 0;
	for (od = NULL; (od = hwloc_get_next_osdev(t->topo, od));)
		if (od->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && od->name) {
			put(&o, any++ ? "" : "\n");
			put_device(t, &o, od, p && p->device[0] ? p->device : NULL);
		}
	if (!any)
		put(&o, " none seen by hwloc%s\n", p && p->device[0] ? " (a software device such as rxe is not listed)" : "");
	put(&o, "network devices:");
	any = 0;
	for (od = NULL; (od = hwloc_get_next_osdev(t->topo, od));)
		if (od->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && od->name) {
			put(&o, any++ ? "" : "\n");
			put_device(t, &o, od, NULL);
		}
	if (!any)
		put(&o, " none\n");
	return o.pos;
}

int rps__topo_print(struct rps__topo *t, const struct rps__placement *p, FILE *f)
{
	size_t n = rps__topo_describe(t, p, NULL, 0);
	char *buf = malloc(n + 1);
	int ret = 0;

	if (!buf)
		return rps__seterr(-ENOMEM, "out of memory");
	rps__topo_describe(t, p, buf, n + 1);
	if (fputs(buf, f) == EOF)
		ret = rps__seterr(-EIO, "writing the topology: %s", strerror(errno));
	free(buf);
	return ret;
}
