/*
 * rdmaps.h - the client API of rdmaps, an RDMA parameter server.
 *
 * This header is all a trainer needs: it exposes no verbs type, no queue
 * pair, no memory key.  Conventions:
 *  - Handles are opaque.  Option structs begin with a `size` member set by
 *    the matching *_opts_init(), so they can grow without breaking the ABI:
 *    the init macros pass the library the caller's sizeof, and the library
 *    never writes past it (see rdmaps(3), "ABI").
 *  - Every function that can fail returns 0 (or a non-negative count) on
 *    success and a negative errno on failure; rps_strerror() names the code
 *    and rps_last_error() gives the calling thread's one-line account of
 *    the last failure (what failed and what to do).
 *  - No global state: several clients may live in one process.  Every
 *    function is thread-safe; one client may be shared by many threads.
 *
 * Parameters are kept on the servers as fp32.  A tensor's dtype is the type
 * of the gradients pushed to it (fp32, bf16 or fp16; the servers accumulate
 * in fp32).  Pulls always return fp32.
 */
#ifndef RDMAPS_H
#define RDMAPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The release of this header: the one place the version is written.
 * configure.ac reads AC_INIT's version from these three lines, and
 * `make check` (tests/abi-symbols.sh) checks the .map and -version-info
 * against them.  Keep each a bare number. */
#define RPS_VERSION_MAJOR 0
#define RPS_VERSION_MINOR 1
#define RPS_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, as rps_version() returns it. */
#define RPS_VERSION_NUMBER (RPS_VERSION_MAJOR * 10000 + RPS_VERSION_MINOR * 100 + RPS_VERSION_PATCH)
#define RPS__STR(x) #x
#define RPS__XSTR(x) RPS__STR(x)
/* "MAJOR.MINOR.PATCH" */
#define RPS_VERSION_STRING RPS__XSTR(RPS_VERSION_MAJOR) "." RPS__XSTR(RPS_VERSION_MINOR) "." \
	RPS__XSTR(RPS_VERSION_PATCH)

/* rdmaps' own error codes, beyond the errno values (all negative). */
#define RPS_ESTALE_EPOCH (-10001)	/* the shard moved and the map was stale: returned only
					 * when no server served the shard for timeout_ms
					 * (the library follows moves itself) */
#define RPS_ELEASE	 (-10002)	/* a shard lock lease expired (pushes retry it themselves) */

typedef struct rps_client rps_client_t;
typedef struct rps_tensor rps_tensor_t;
typedef struct rps_request rps_request_t;
typedef struct rps_buffer rps_buffer_t;
typedef struct rps_group rps_group_t;

enum rps_dtype {
	RPS_DTYPE_F32 = 1,	/* IEEE binary32 */
	RPS_DTYPE_BF16 = 2,	/* bfloat16 */
	RPS_DTYPE_F16 = 3,	/* IEEE binary16 */
};

enum rps_mode {
	RPS_MODE_SYNC = 1,	/* BSP: v+1 = opt(v, sum of every worker's step-v gradient) */
	RPS_MODE_BOUNDED = 2,	/* SSP: a worker at clock c sees every update older than c-k */
	RPS_MODE_ASYNC = 3,	/* ASP: each push applied alone, under the shard's lock */
};

enum rps_optimizer {
	RPS_OPT_SUM = 1,	/* p += g */
	RPS_OPT_SGD = 2,	/* p -= lr * (g + wd p) */
	RPS_OPT_MOMENTUM = 3,	/* v = mu v + (g + wd p); p -= lr v */
	RPS_OPT_ADAM = 4,	/* Adam with bias correction; L2 weight decay */
};

struct rps_client_opts {
	size_t size;		/* sizeof(struct rps_client_opts) */
	/* Comma-separated list of one or more servers of the cluster, in any
	 * order (the first that answers gives the shard map, which names the
	 * others): "tcp://10.0.0.1:7000,tcp://10.0.0.2:7000" or
	 * "verbs://10.0.0.1:7000". */
	const char *servers;
	int rank;		/* this worker's rank, 0 .. num_workers-1 */
	int num_workers;	/* workers taking part in sync/bounded tensors */
	int timeout_ms;		/* give up on one operation after this
				 * (0 or less: the default, 30000) */
	int verify;		/* 1: checksum every push end to end (crc32c); a
				 * corrupted push is refused with -EILSEQ, never applied */
	int spin_us;		/* busy-poll this long before sleeping (default 0):
				 * lower latency for a core's worth of CPU */
	int takeover;		/* 1: this process replaces a dead worker of the
				 * same rank: the servers close that rank's other
				 * connections, and sync/bounded tensors opened
				 * afterwards resume at the rank's next clock (see
				 * rps_tensor_create) */
	/* The key file proving who this worker is (doc/security.md; made
	 * by `psctl keygen`): NULL reads $RDMAPS_KEY_FILE.  With a key every
	 * connection authenticates both ways; a worker key reaches only the
	 * tensors under its scope, a reader key only pulls. */
	const char *key_file;
	int insecure;		/* 1: connect without a key to servers beyond
				 * loopback (also $RDMAPS_INSECURE=1); without
				 * it such a connect fails with -EACCES */
	/* Bytes of registered memory this client stages pushes and pulls
	 * in, over all its server endpoints (0: $RDMAPS_STAGING, e.g. 64M,
	 * or 256 MiB).  Each endpoint (a server's serving thread) gets up to the
	 * server's --slots push slots and 4 pull buffers of a shard each;
	 * when the cluster has more endpoints than the budget holds at that,
	 * each gets its share, at least one of each (rdmaps(3), MEMORY). */
	size_t staging_bytes;
};

struct rps_tensor_opts {
	size_t size;		/* sizeof(struct rps_tensor_opts) */
	uint64_t count;		/* number of elements */
	enum rps_dtype dtype;	/* gradient element type (default fp32) */
	enum rps_mode mode;	/* default RPS_MODE_SYNC */
	uint32_t staleness;	/* k for RPS_MODE_BOUNDED */
	enum rps_optimizer optimizer;	/* default RPS_OPT_SUM */
	float lr;		/* learning rate (default 0.01) */
	float momentum;		/* RPS_OPT_MOMENTUM (default 0.9) */
	float beta1, beta2, eps;	/* RPS_OPT_ADAM (0.9, 0.999, 1e-8) */
	float weight_decay;	/* default 0 */
	float rescale;		/* sync: gradient = rescale * sum (default 1; 1/W averages) */
	const float *init;	/* count initial values, or NULL for zeros */
};

/* Set opts to the defaults.  `size` is the caller's sizeof(*opts): the
 * library writes at most that many bytes (zeroing what it does not know)
 * and sets opts->size to the part of the structure it understands,
 * min(size, the library's sizeof).  Call them through the macros below,
 * which pass the sizeof of the structure this header declares. */
void rps_client_opts_init_sized(struct rps_client_opts *opts, size_t size);
void rps_tensor_opts_init_sized(struct rps_tensor_opts *opts, size_t size);
#define rps_client_opts_init(opts) rps_client_opts_init_sized((opts), sizeof(*(opts)))
#define rps_tensor_opts_init(opts) rps_tensor_opts_init_sized((opts), sizeof(*(opts)))

/* Fill the members of opts the caller left unset from the environment a
 * launcher set up, for workers started by torchrun, Slurm, Open MPI or a
 * PMI launcher.  Unset means: servers NULL, rank < 0, num_workers < 1
 * (rps_client_opts_init() sets rank 0 and num_workers 1, which are real
 * values: set them to -1 to ask for the environment's).  servers comes from
 * RDMAPS_SERVERS (the pointer is getenv()'s); rank and num_workers from the
 * first launcher with either of its variables set, in this order:
 * RDMAPS_RANK/RDMAPS_WORLD_SIZE ("rdmaps"), RANK/WORLD_SIZE ("torchrun"),
 * SLURM_PROCID/SLURM_NTASKS ("slurm"), OMPI_COMM_WORLD_RANK/
 * OMPI_COMM_WORLD_SIZE ("openmpi"), PMI_RANK/PMI_SIZE ("pmi").  *source
 * (if source is not NULL) receives that name, "caller" if the caller set
 * both rank and num_workers, or "none" if no launcher's variables are set
 * (rank and num_workers are then left as they were).  Returns 0; -EINVAL
 * for a launcher's variable that is not a number, one of its pair missing,
 * or a rank not below the world size; -ENOENT when servers is NULL and
 * RDMAPS_SERVERS is unset.  On failure opts is unchanged. */
int rps_client_opts_from_env(struct rps_client_opts *opts, const char **source);

/* The library's version, RPS_VERSION_NUMBER of the header it was built
 * with (compare it with this header's to detect a mismatch); *string (if
 * string is not NULL) receives its "MAJOR.MINOR.PATCH". */
int rps_version(const char **string);

/* Connect to every server of the cluster. */
int rps_client_connect(const struct rps_client_opts *opts, rps_client_t **out);
/* Disconnect and free.  Requests still running are cancelled (their
 * waiters get -ECANCELED): wait for them first.  Close the client's tensors
 * first; nothing of the client may be used afterwards. */
int rps_client_close(rps_client_t *client);

/* Create the tensor `name` (at most 63 bytes), or, if it exists with the very
 * same options, open it: every worker may call this with the same options.
 * Any difference (count, dtype, mode, staleness, optimizer, hyper-parameters,
 * num_workers, or whether init is given) gives -EEXIST.  If init is given,
 * every worker must give it (the same values): the first creator's are used. */
int rps_tensor_create(rps_client_t *client, const char *name,
		      const struct rps_tensor_opts *opts, rps_tensor_t **out);
/* Open an existing tensor; -ENOENT if no server holds it. */
int rps_tensor_open(rps_client_t *client, const char *name, rps_tensor_t **out);
/* Fill opts with the tensor's description (init is NULL).  opts->size must
 * be set (by rps_tensor_opts_init()); at most that many bytes are written. */
int rps_tensor_info(const rps_tensor_t *tensor, struct rps_tensor_opts *opts);
/* Number of shards and the servers they live on are the library's business;
 * this tells how many there are, for reporting. */
uint32_t rps_tensor_shards(const rps_tensor_t *tensor);
/* The clock this worker's next push of the tensor carries: sync, the step it
 * contributes to; bounded, the rank's count of pushes; async, this process's
 * pushes.  A replacement (takeover) starts at its predecessor's: one that
 * resumes its loop at a sync step s finds here whether the predecessor had
 * already pushed its bounded tensors for s (clock s + 1), and skips them. */
int rps_tensor_clock(const rps_tensor_t *tensor, uint64_t *clock);
/* Release the local handle (the tensor stays on the servers). */
void rps_tensor_close(rps_tensor_t *tensor);

/* Push a gradient: nbytes must be count * sizeof(dtype).  Returns when the
 * servers have taken it (sync: accumulated into its step, or set aside until
 * the earlier ranks' pushes of that step are in; async/bounded: applied).
 * The buffer may be reused at once after return. */
int rps_push(rps_tensor_t *tensor, const void *grad, size_t nbytes);
/* Pull the parameters: nbytes must be count * 4 (fp32).  Sync: waits until
 * every worker's pushes up to this worker's last one are applied.  Bounded:
 * waits until no update older than (this worker's clock - k) is missing.
 * Each shard is read at one version, never torn; *version (may be NULL)
 * receives the lowest shard version read. */
int rps_pull(rps_tensor_t *tensor, float *out, size_t nbytes, uint64_t *version);

/* Non-blocking forms: the buffer must stay valid, and unchanged for a push,
 * until the request completes with rps_wait() or rps_test(). */
int rps_push_start(rps_tensor_t *tensor, const void *grad, size_t nbytes, rps_request_t **req);
int rps_pull_start(rps_tensor_t *tensor, float *out, size_t nbytes, uint64_t *version,
		   rps_request_t **req);
/* 1 if done (the request is then freed and *result receives its status),
 * 0 if still running. */
int rps_test(rps_request_t *req, int *result);
/* Wait for the request, free it, return its status. */
int rps_wait(rps_request_t *req);

/* Register [addr, addr + len) with the client for zero-copy: a push whose
 * gradient (or a pull whose destination) lies inside it moves straight
 * between this memory and the network, without the client's copy (verbs:
 * the memory is pinned and registered with the device; tcp: recorded).
 * Pushes from memory not registered still work, through a copy (tcp
 * sends from any memory without one).  Register a few large buffers once,
 * not one per call: registering is slow.  The buffer belongs to this
 * client alone; another client's pushes from it take the copy. */
int rps_buffer_register(rps_client_t *client, void *addr, size_t len, rps_buffer_t **out);
/* Release the registration (not the memory).  -EBUSY while a push or pull
 * that uses the buffer is still running (one that timed out, too): wait
 * for its request first.  rps_client_close() releases those still left. */
int rps_buffer_deregister(rps_buffer_t *buf);

/* A group: n small tensors (biases, norms) pushed and pulled as one.  The
 * servers hold the members back to back as one tensor, named NAME#HHHHHHHH
 * (a hash of the counts: groups that disagree on their members never share
 * it), with opts (count left 0, or the sum; init, if given, the members'
 * initial values back to back).  Every worker creates it with the same
 * counts; member i has counts[i] elements.  A group push sends every
 * member's gradient (grads[i], nbytes[i] = counts[i] * sizeof(dtype)) in
 * one push of that tensor: the members share its shards and its round
 * trips, and each is updated exactly as a tensor of its own would be (the
 * optimizers are elementwise).  A group pull fills outs[i] (counts[i] * 4
 * bytes, fp32); *version is the lowest version of the shards read.  One
 * push or pull of a group runs at a time (they copy through the group's
 * staging buffer); the buffers may be reused at once after return. */
int rps_group_create(rps_client_t *client, const char *name, const struct rps_tensor_opts *opts,
		     uint32_t n, const uint64_t *counts, rps_group_t **out);
int rps_group_push(rps_group_t *group, const void *const *grads, const size_t *nbytes);
int rps_group_pull(rps_group_t *group, float *const *outs, const size_t *nbytes, uint64_t *version);
/* The group's tensor on the servers (for rps_tensor_info and the like;
 * the group owns it: do not close it). */
rps_tensor_t *rps_group_tensor(const rps_group_t *group);
/* Release the group's handle and staging buffer (the tensor stays). */
void rps_group_close(rps_group_t *group);

/* Wait until all num_workers workers have entered the barrier (call it from
 * one thread per worker).  -ETIMEDOUT after timeout_ms: a worker is gone. */
int rps_barrier(rps_client_t *client);

/* A one-line description of an error code (errno or RPS_E*). */
const char *rps_strerror(int err);
/* The calling thread's message for its last failed call. */
const char *rps_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
