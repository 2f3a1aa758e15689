/*
 * topo.h - where memory and threads go: hwloc placement near the HCA.
 *
 * rdmapsd and librdmaps open the machine's topology once (with I/O devices),
 * ask where to put things for the RDMA device they use, then allocate the
 * memory they register with the HCA on the chosen NUMA node and pin their
 * progress threads to the CPUs local to it.
 *
 * The decision (rps__topo_place):
 *   1. --no-pin: decide nothing; no memory binding, no thread pinning.
 *   2. otherwise the HCA's locality: the hwloc OS device of type OpenFabrics
 *      named like the device ("mlx5_0"), its first non-I/O ancestor's cpuset
 *      and nodeset; memory goes to the first NUMA node of that nodeset,
 *      threads to that cpuset (narrowed to this process's CPU affinity, so a
 *      taskset or an MPI launcher's binding is respected).
 *      No device (TCP), a device hwloc does not know (a soft device such as
 *      rxe, a typo), a device without a PCI parent, or one that hwloc ties
 *      to the whole of a multi-node machine: the whole machine, no binding,
 *      and the reason says so (placement.warn is set when a device was
 *      named, so the daemon can log it as a warning; it is not an error).
 *   3. --numa-node N forces the memory node (and the threads to N's cpus);
 *      --cpus LIST forces the threads' cpus.  Both are checked against the
 *      topology: a node or a cpu that does not exist is an error (-EINVAL).
 *
 * Memory binding needs mbind(2): in containers that forbid it, or on
 * machines without NUMA support, rps__topo_alloc falls back to plain
 * page-aligned memory (and says so once, see rps__topo_opts.log).
 *
 * A topology loaded from XML (tests, `rdmapsd --topology FILE`) describes
 * another machine: placement works, but nothing is bound or pinned here
 * (rps__topo_alloc returns plain memory, rps__topo_pin_thread -ENOTSUP).
 *
 * Thread safety: after rps__topo_open, every call may be made from any
 * thread (hwloc's topology is only read).  No global state: two clients in
 * one process open two topologies.
 */
#ifndef RPS_TOPO_H
#define RPS_TOPO_H

#include <sched.h>
#include <stddef.h>
#include <stdio.h>

struct rps__topo;

struct rps__topo_opts {
	/* NULL: this machine.  Otherwise an hwloc XML file (lstopo --of xml),
	 * or, when it starts with '<', an XML document in memory. */
	const char *xml_path;
	/* Nonzero: warnings (memory binding not possible here) go to rps__log
	 * once (the daemon).  Zero: stay silent (librdmaps never logs); the
	 * facts are still in rps__topo_describe. */
	int log;
};

struct rps__topo_overrides {
	int numa_node;		/* >= 0: memory on this NUMA node (OS index), threads on its cpus; -1: decide */
	const char *cpus;	/* "0-3,8": threads on these cpus (OS indexes); NULL or "": decide */
	int no_pin;		/* decide nothing: no memory binding, no pinning (excludes the two above) */
};
#define RPS__TOPO_OVERRIDES_INIT { .numa_node = -1, .cpus = NULL, .no_pin = 0 }

struct rps__placement {
	int numa_node;		/* memory goes to this NUMA node (OS index); -1: no binding */
	int pin;		/* 1: rps__topo_pin_thread binds threads to cpuset; 0: leaves them alone */
	int warn;		/* a device was named but could not be located: worth a warning */
	int ncpus;		/* cpus in cpuset */
	cpu_set_t cpuset;	/* the threads' cpus; the whole machine when pin == 0 */
	char cpus[256];		/* cpuset as a list, "16-31" */
	char device[64];	/* the RDMA device asked for, "" for none */
	char pci[32];		/* its PCI bus id "0000:81:00.0", "" if none */
	char reason[384];	/* one line: what was chosen and why */
};

/* Load the topology (with I/O devices: PCI and OS devices).  Returns 0 or a
 * negative errno with rps__seterr. */
int rps__topo_open(const struct rps__topo_opts *o, struct rps__topo **out);
void rps__topo_close(struct rps__topo *t);

/* Decide where memory and threads go for device_name ("mlx5_0", "rxe0";
 * NULL: no RDMA device).  ov may be NULL.  Returns 0, or -EINVAL (with
 * rps__seterr) for overrides that do not fit this topology. */
int rps__topo_place(struct rps__topo *t, const char *device_name,
		    const struct rps__topo_overrides *ov, struct rps__placement *out);

/* len bytes (rounded up to pages), zeroed, page-aligned, bound to
 * p->numa_node (p NULL or numa_node < 0: not bound).  NULL on failure (with
 * rps__seterr).  Free with rps__topo_free, the same t and the same len.
 * t may be NULL (no topology opened, e.g. a TCP client): plain memory.
 * Binding is MPOL_BIND: pages never spill to another node. */
void *rps__topo_alloc(struct rps__topo *t, const struct rps__placement *p, size_t len);
void rps__topo_free(struct rps__topo *t, void *ptr, size_t len);

/* Bind the calling thread to p->cpuset.  0 when done or when p is NULL or
 * p->pin is 0 (--no-pin, whole machine); -ENOTSUP for a topology loaded
 * from XML; -EINVAL with t NULL;
 * a negative errno if the OS refuses.  Callers treat failure as a warning. */
int rps__topo_pin_thread(struct rps__topo *t, const struct rps__placement *p);

/* 1 if this topology is this machine (not loaded from XML). */
int rps__topo_is_this_machine(const struct rps__topo *t);
/* Number of NUMA nodes in the topology (at least 1). */
int rps__topo_num_nodes(const struct rps__topo *t);
/* 1 if memory can be bound to a NUMA node here (mbind works; probed at
 * open); 0 in containers that forbid it, without NUMA support, or for XML. */
int rps__topo_can_bind_memory(const struct rps__topo *t);

/* What was chosen and why, the NUMA nodes (cpus, memory), the RDMA and
 * network devices and their locality: several lines, for
 * `rdmapsd --show-topology` and debug logs.  Like snprintf: returns the
 * length the full text needs (excluding the NUL), writes at most len bytes.
 * p may be NULL (machine only). */
size_t rps__topo_describe(struct rps__topo *t, const struct rps__placement *p, char *buf, size_t len);
/* rps__topo_describe to a stream.  Returns 0 or a negative errno. */
int rps__topo_print(struct rps__topo *t, const struct rps__placement *p, FILE *f);

#endif
