/* libcomm: collective communication for distributed training.
 *
 * This is the whole public C ABI. Every call returns comm_status_t; on failure
 * comm_last_error() gives the calling thread's detailed message (which rank,
 * which operation, which sequence number, what to do).
 *
 * Numeric values of every enum below are fixed forever: never renumber, only append.
 */
#ifndef COMM_COMM_H
#define COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define COMM_API __attribute__((visibility("default")))
#else
#define COMM_API
#endif

#define COMM_ABI_VERSION_MAJOR 1
#define COMM_ABI_VERSION_MINOR 11 /* 1: comm_get_version_string; 2: comm_engine_set_reduce_hook; 3: comm_engine_wait,
                                    comm_engine_set_priority, comm_dump_flight_recorder, engine config and stats v2;
                                    4: comm_shrink; 5: comm_engine_test; 6: comm_barrier_monitored;
                                    7: COMM_ANY_SOURCE, comm_recv_any, comm_irecv_any;
                                    8: comm_agree_failed, COMM_SHRINK_AGREE;
                                    9: comm_grow, COMM_GROW_WAITING, joining with COMM_JOIN=1;
                                    10: comm_agree; 11: comm_exclude */

typedef enum {
  COMM_OK = 0,
  COMM_ERR_INVALID_ARGUMENT = 1, /* bad input found locally; the communicator stays usable */
  COMM_ERR_INVALID_USAGE = 2,    /* ranks disagree on a collective, or a call out of order */
  COMM_ERR_SYSTEM = 3,           /* OS or network: a port in use, no route */
  COMM_ERR_TIMEOUT = 4,
  COMM_ERR_REMOTE = 5,           /* a peer failed or aborted */
  COMM_ERR_ABORTED = 6,
  COMM_ERR_UNAVAILABLE = 7,      /* backend or transport not present */
  COMM_ERR_INTERNAL = 8
} comm_status_t;

typedef enum {
  COMM_FLOAT32 = 0,
  COMM_FLOAT64 = 1,
  COMM_FLOAT16 = 2,
  COMM_BFLOAT16 = 3,
  COMM_INT8 = 4,
  COMM_UINT8 = 5,
  COMM_INT32 = 6,
  COMM_UINT32 = 7,
  COMM_INT64 = 8,
  COMM_UINT64 = 9
} comm_dtype_t;
#define COMM_NUM_DTYPES 10

typedef enum { COMM_SUM = 0, COMM_PROD = 1, COMM_MIN = 2, COMM_MAX = 3, COMM_AVG = 4 } comm_op_t;
#define COMM_NUM_OPS 5

typedef void* comm_stream_t; /* a cudaStream_t, or NULL for host buffers */

typedef struct comm_s* comm_t;
typedef struct comm_request_s* comm_request_t;
typedef struct comm_engine_s* comm_engine_t;

#define COMM_UNSET (-1) /* integer fields; NULL for strings */

#define COMM_CONFIG_VERSION 1

/* Versioned configuration. Fill with COMM_CONFIG_INIT, then set what you need.
 * Precedence: a field set here > environment > tuning profile > topology plan > default.
 * Fields are only ever appended; a caller built against an older header keeps working. */
typedef struct {
  size_t size;             /* sizeof(comm_config_t) as the caller saw it */
  int version;             /* COMM_CONFIG_VERSION */
  const char* init_method; /* "env://" (default), "tcp://HOST:PORT", "file:///PATH" */
  int rank;                /* COMM_UNSET: from the launcher's environment */
  int world_size;          /* COMM_UNSET: from the launcher's environment */
  int timeout_ms;          /* COMM_UNSET: COMM_TIMEOUT_MS, default 600000 */
  const char* transport;   /* NULL: COMM_TRANSPORT, default "auto" */
  int tls;                 /* COMM_UNSET: COMM_TLS, default 0; 1: the store's and the socket transport's
                              connections run TLS 1.3 (every rank alike) */
  /* ...added fields go last */
} comm_config_t;

#define COMM_CONFIG_INIT \
  { sizeof(comm_config_t), COMM_CONFIG_VERSION, NULL, COMM_UNSET, COMM_UNSET, COMM_UNSET, NULL, COMM_UNSET }

/* ---- status and errors ---- */
COMM_API const char* comm_status_string(comm_status_t s);
/* The calling thread's last failure, whatever handle it was on; comm may be NULL
 * (works after a failed comm_init). Never NULL; "" when nothing failed. */
COMM_API const char* comm_last_error(comm_t comm);
/* The first error that ended a background operation, or COMM_OK. Any thread. */
COMM_API comm_status_t comm_get_async_error(comm_t comm);
/* The ABI version of the library loaded (COMM_ABI_VERSION_MAJOR/MINOR it was built with). */
COMM_API comm_status_t comm_get_version(int* major, int* minor);
/* The release and the git commit the library was built from, e.g. "1.0.0 (git 868ddb39b8cc)"
 * ("-dirty" when built from modified sources). Static storage, never NULL. */
COMM_API const char* comm_get_version_string(void);

/* ---- lifecycle ---- */
/* Collective over all ranks: fails on every rank, naming the difference, when the ranks
 * disagree on world size, transport, timeout, tuning profile or ABI version. */
COMM_API comm_status_t comm_init(const comm_config_t* cfg, comm_t* comm);
COMM_API comm_status_t comm_dup(comm_t comm, comm_t* out);
/* color < 0 (COMM_UNSET): this rank takes no part and *out is set to NULL. */
COMM_API comm_status_t comm_split(comm_t comm, int color, int key, comm_t* out);
/* ncclCommShrink's semantics: collective over the ranks of comm that are not in exclude_ranks
 * (n_exclude ranks of comm; NULL when n_exclude is 0), which every one of them passes alike
 * (in any order). comm may be healthy or broken (after a peer died, timed out or aborted) or
 * aborted; its transport is not used. The survivors are renumbered densely in their old
 * order into *new_comm, which has comm's settings and host transports (and, when comm's device
 * buffers went through NCCL, NCCL's own ncclCommShrink of it: COMM_ERR_UNAVAILABLE when the
 * loaded NCCL lacks it). Afterwards comm can only be destroyed: every other call on it fails
 * with COMM_ERR_INVALID_USAGE. Excluding this rank, a rank out of range or a rank twice is
 * COMM_ERR_INVALID_ARGUMENT (nothing changes); survivors passing different lists fail with
 * COMM_ERR_INVALID_USAGE, or a survivor that never calls with COMM_ERR_TIMEOUT, within the
 * timeout. Works when world rank 0 (which serves the rendezvous store) is excluded:
 * docs/design/core.md, "Shrinking a communicator". */
COMM_API comm_status_t comm_shrink(comm_t comm, const int* exclude_ranks, int n_exclude, comm_t* new_comm);
/* Since ABI 1.8, after a failure: the ranks of comm that are still alive agree, without being
 * told, on one set of failed ranks (ULFM's MPIX_Comm_agree over the failed group), also when
 * they saw the failure differently (a stopped rank some timed out on and others not yet, two
 * failures at once, a failure during the agreement). Every live rank calls it (comm healthy,
 * broken or aborted; its transport is only asked which peers it saw gone). Writes the failed
 * ranks, ascending, to failed[0..min(*n_failed, capacity)-1] and their number to *n_failed
 * (failed may be NULL when capacity is 0). Errors: COMM_ERR_REMOTE when the others agreed that
 * this rank failed (it came too late: stopped, cut off; it may never rejoin comm: exit), or when
 * the ranks that agreed are not a strict majority of comm (that side stops); COMM_ERR_UNAVAILABLE
 * when the job store does not answer (it dies with world rank 0 unless init_method is file:// or
 * the store is served outside the ranks: COMM_STORE_EXTERNAL=1, comm-run --replace-failed). Since
 * ABI 1.9 the excluded ranks are recorded in the job store for the launcher (docs/design/core.md,
 * "Growing a communicator").
 * Bounded by about twice the timeout per failure during it. docs/design/core.md, "Agreeing on the
 * failed ranks". */
COMM_API comm_status_t comm_agree_failed(comm_t comm, int* failed, int capacity, int* n_failed);
/* Since ABI 1.10 (ULFM's MPIX_Comm_agree): comm_agree_failed that also agrees on a flag. Each
 * live rank passes its *flag; on success *flag is the bitwise AND of the flags of the ranks the
 * verdict keeps, the same on every rank it keeps, with the failed ranks as comm_agree_failed gives
 * them (errors as there). For one decision on an operation that ranks saw end differently (some
 * completed it, others failed it): each passes 1 when it completed, and all undo it unless the
 * result is 1 with no rank failed. A rank that calls comm_agree_failed where the others call
 * comm_agree takes part with flag 0. */
COMM_API comm_status_t comm_agree(comm_t comm, int* flag, int* failed, int capacity, int* n_failed);
/* Since ABI 1.11: records in the job store that these ranks of comm leave the job, as
 * comm_agree_failed records the ranks it agrees failed: a launcher that serves the store
 * (comm-run --replace-failed) SIGKILLs such a process if it still runs (stopped, cut off) and
 * starts its replacement with COMM_JOIN=1. For the members of a comm_grow whose admission they
 * undo (the joiners, ranks size.. of the grown communicator, may be alive, stopped or dead).
 * Local to this rank, no communication; comm may be broken. Several ranks may name the same
 * process: it is recorded once. Errors: COMM_ERR_INVALID_ARGUMENT for n outside 1..size-1, a
 * rank out of range, twice or this rank (nothing recorded); COMM_ERR_UNAVAILABLE (or the
 * store's error) when the job store does not answer. docs/design/core.md, "Growing a
 * communicator". */
COMM_API comm_status_t comm_exclude(comm_t comm, const int* ranks, int n);
/* comm_shrink(comm, NULL, COMM_SHRINK_AGREE, &new_comm): the failed ranks left to the library
 * (comm_agree_failed, then comm_shrink with its set). Since ABI 1.8. */
#define COMM_SHRINK_AGREE (-1)
/* Since ABI 1.9 (NCCL 2.29's ncclCommGrow): collective over every member of comm (a healthy
 * communicator, e.g. one comm_shrink made). The members and joiners make *new_comm: the members
 * keep their order as ranks 0..size-1, the joiners take ranks size.. in the order they
 * registered. comm stays usable (as after comm_dup). n_join > 0: admit exactly that many
 * joiners, waiting for them up to comm's timeout (COMM_ERR_TIMEOUT, nothing changes, when fewer
 * came). n_join == COMM_GROW_WAITING: admit the joiners waiting now, as the lowest member finds
 * them (the same set on every member); none waiting: *new_comm = NULL and COMM_OK (cheap: one
 * store read on the lowest member and a 16-byte broadcast; fine to call every step).
 * A joiner is a process started with the job's environment plus COMM_JOIN=1: its comm_init (the
 * rank and world size of its config and environment ignored) waits up to its timeout for the
 * job's next comm_grow and returns the grown communicator. Joiners find the job through its store,
 * which must outlive world rank 0: file://, or an external TCP store (COMM_STORE_EXTERNAL=1 or
 * TORCHELASTIC_USE_AGENT_STORE=True; comm-run --replace-failed serves one); COMM_ERR_UNAVAILABLE,
 * naming these, when it died with rank 0. docs/design/core.md, "Growing a communicator". */
COMM_API comm_status_t comm_grow(comm_t comm, int n_join, comm_t* new_comm);
#define COMM_GROW_WAITING (-1)
/* Local, non-blocking, idempotent, any thread: every pending and future call on comm
 * ends with COMM_ERR_ABORTED. Frees nothing; call comm_destroy afterwards. */
COMM_API comm_status_t comm_abort(comm_t comm);
/* The flight recorder: comm's last 256 operations (sequence number, collective, dtype,
 * count, algorithm, state, the peers a failed one waited on, start and end times) as JSON
 * in path (%h host, %p pid, %r rank; NULL: COMM_FLIGHT_RECORDER_FILE). Any thread, e.g. from
 * a framework's own signal handler thread (libcomm installs none). libcomm also writes it to
 * COMM_FLIGHT_RECORDER_FILE, when set, on a communicator's first failure and on comm_abort.
 * tools/comm-trace merges the ranks' files. */
COMM_API comm_status_t comm_dump_flight_recorder(comm_t comm, const char* path);
/* Graceful (bounded by the timeout), frees the handle; immediate after an abort. */
COMM_API comm_status_t comm_destroy(comm_t comm);
COMM_API comm_status_t comm_rank(comm_t comm, int* rank);
COMM_API comm_status_t comm_size(comm_t comm, int* size);

/* ---- memory that peers can reach directly ---- */
COMM_API comm_status_t comm_mem_alloc(comm_t comm, size_t bytes, void** ptr);
COMM_API comm_status_t comm_mem_free(comm_t comm, void* ptr);

/* ---- collectives (NCCL's counts and in-place rules) ----
 * stream: NULL for host buffers; a cudaStream_t for device buffers.
 * Collectives on one communicator complete in issue order. */
COMM_API comm_status_t comm_allreduce(comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                      comm_dtype_t dtype, comm_op_t op, comm_stream_t stream);
COMM_API comm_status_t comm_broadcast(comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                      comm_dtype_t dtype, int root, comm_stream_t stream);
COMM_API comm_status_t comm_reduce(comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                   comm_dtype_t dtype, comm_op_t op, int root, comm_stream_t stream);
COMM_API comm_status_t comm_allgather(comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                                      comm_dtype_t dtype, comm_stream_t stream);
COMM_API comm_status_t comm_reduce_scatter(comm_t comm, const void* sendbuf, void* recvbuf,
                                           size_t recvcount, comm_dtype_t dtype, comm_op_t op,
                                           comm_stream_t stream);
COMM_API comm_status_t comm_alltoall(comm_t comm, const void* sendbuf, void* recvbuf,
                                     size_t count /* per peer */, comm_dtype_t dtype,
                                     comm_stream_t stream);
COMM_API comm_status_t comm_barrier(comm_t comm, comm_stream_t stream);
/* A barrier with its own deadline that names the ranks that did not arrive (gloo's monitoredBarrier,
 * torch's monitored_barrier). Rank 0 waits up to timeout_ms for every other rank, then releases them.
 * On rank 0 a rank missing at the deadline ends the call with COMM_ERR_TIMEOUT; the missing ranks,
 * ascending, go to missing[0..max_missing) and their number to *n_missing (0 on success; missing may
 * be NULL when max_missing is 0); the message names the first one, or all of them when wait_all.
 * The other ranks end with COMM_ERR_TIMEOUT when rank 0 has not released them within timeout_ms of
 * their own call. On any failure the communicator is aborted (receives posted to absent ranks would
 * match later calls otherwise): give it a communicator of its own (comm_dup). Since ABI 1.6. */
COMM_API comm_status_t comm_barrier_monitored(comm_t comm, int timeout_ms, int wait_all, int* missing,
                                              int max_missing, int* n_missing);
COMM_API comm_status_t comm_send(comm_t comm, const void* buf, size_t count, comm_dtype_t dtype,
                                 int peer, comm_stream_t stream);
COMM_API comm_status_t comm_recv(comm_t comm, void* buf, size_t count, comm_dtype_t dtype, int peer,
                                 comm_stream_t stream);
/* Receive from any rank (MPI_ANY_SOURCE, Gloo's recvFromAny), since ABI 1.7: peer COMM_ANY_SOURCE
 * in comm_recv / comm_irecv, or comm_recv_any / comm_irecv_any, which also say which rank the
 * message came from. The first send from any rank of the communicator that no earlier receive
 * takes is matched: a receive posted before it for rank p takes p's next message first, and
 * messages from one rank match receives in the order they were sent (non-overtaking). The message
 * is checked as comm_recv checks it (count and dtype must agree: COMM_ERR_INVALID_USAGE otherwise).
 * Host buffers only (stream NULL), not inside a group, count > 0. The communicator's timeout
 * (COMM_TIMEOUT_MS) bounds the wait as any other: COMM_ERR_TIMEOUT names the receive from any rank.
 * *source (may be NULL) is COMM_ANY_SOURCE until the message matched, then its rank: for
 * comm_irecv_any it is written when the request completes (keep it valid until comm_wait or
 * comm_test reports it done, as the buffer). Over shared memory, sockets and UCX, and a
 * communicator whose ranks mix them (shared memory inside hosts, sockets or UCX between). */
#define COMM_ANY_SOURCE (-2)
COMM_API comm_status_t comm_recv_any(comm_t comm, void* buf, size_t count, comm_dtype_t dtype, int* source,
                                     comm_stream_t stream);
/* NCCL's group semantics: calls between start and end (per thread, nestable) are issued
 * together at the outermost end, so sends and receives among them cannot deadlock. */
COMM_API comm_status_t comm_group_start(void);
COMM_API comm_status_t comm_group_end(void);

/* ---- non-blocking host variants: issue, then comm_wait or comm_test ---- */
COMM_API comm_status_t comm_iallreduce(comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                       comm_dtype_t dtype, comm_op_t op, comm_request_t* req);
COMM_API comm_status_t comm_ibroadcast(comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                       comm_dtype_t dtype, int root, comm_request_t* req);
COMM_API comm_status_t comm_ireduce(comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                    comm_dtype_t dtype, comm_op_t op, int root, comm_request_t* req);
COMM_API comm_status_t comm_iallgather(comm_t comm, const void* sendbuf, void* recvbuf,
                                       size_t sendcount, comm_dtype_t dtype, comm_request_t* req);
COMM_API comm_status_t comm_ireduce_scatter(comm_t comm, const void* sendbuf, void* recvbuf,
                                            size_t recvcount, comm_dtype_t dtype, comm_op_t op,
                                            comm_request_t* req);
COMM_API comm_status_t comm_ialltoall(comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                      comm_dtype_t dtype, comm_request_t* req);
COMM_API comm_status_t comm_ibarrier(comm_t comm, comm_request_t* req);
COMM_API comm_status_t comm_isend(comm_t comm, const void* buf, size_t count, comm_dtype_t dtype,
                                  int peer, comm_request_t* req);
COMM_API comm_status_t comm_irecv(comm_t comm, void* buf, size_t count, comm_dtype_t dtype, int peer,
                                  comm_request_t* req);
COMM_API comm_status_t comm_irecv_any(comm_t comm, void* buf, size_t count, comm_dtype_t dtype, int* source,
                                      comm_request_t* req);
/* Blocks until the request completes, returns its status and frees it. */
COMM_API comm_status_t comm_wait(comm_request_t req);
/* *done = 1 when complete (then the request is freed and its status returned), else 0. */
COMM_API comm_status_t comm_test(comm_request_t req, int* done);

/* ---- the gradient engine: bucketed, overlapped all-reduce of a trainer's gradients ----
 *
 * A trainer registers its gradients once (definition order), then each step:
 *   comm_engine_begin(eng, sync);  ...backward: comm_engine_grad_ready(eng, i, grad_i) per
 *   gradient, from any thread, as each is produced...;  comm_engine_end(eng);  optimizer step.
 * Buckets are filled in reverse registration order (backward produces the last layer first), one
 * dtype per bucket, up to the bucket cap; a parameter is never split across buckets. Buckets go on
 * the wire in partitions (partition_bytes, which do split large parameters) on the engine's own
 * duplicate of the communicator: among the partitions ready on every rank (agreed in small
 * rounds), the one the next forward needs first runs next, in the same order on every rank. For
 * host gradients, end() returns when every gradient reported in this step holds the reduced value
 * (with overlap_forward: once every gradient is reported; comm_engine_wait per gradient).
 *
 * Errors: misuse found locally (an index out of range, grad_ready twice for one index in a step,
 * end() without begin(), begin() twice, register after finalize) fails that call and changes
 * nothing else. A step the ranks disagree on (a gradient never reported without
 * find_unused_parameters, a failed all-reduce, a timeout) breaks the engine: its communicator is
 * aborted so the peers fail within their timeout too, and every later call returns the error. */

#define COMM_ENGINE_CONFIG_VERSION 2

typedef struct {
  size_t size;  /* sizeof(comm_engine_config_t) as the caller saw it */
  int version;  /* COMM_ENGINE_CONFIG_VERSION */
  /* Bucket size limit in bytes of the gradients' own dtype. COMM_UNSET: COMM_ENGINE_BUCKET_CAP_BYTES,
   * default 25 MiB. A parameter larger than the cap gets a bucket of its own. */
  int64_t bucket_cap_bytes;
  /* Limit of the first bucket (of each dtype), small so communication starts early.
   * COMM_UNSET: COMM_ENGINE_FIRST_BUCKET_BYTES, default 1 MiB. */
  int64_t first_bucket_bytes;
  int op;                     /* a comm_op_t; COMM_UNSET: COMM_AVG (the sum divided by the rank count once) */
  /* COMM_UNSET: gradients travel in their own dtype. COMM_FLOAT16 or COMM_BFLOAT16: float32
   * buckets are compressed to it in the bucket, reduced (each step in fp32, rounded), and
   * decompressed; other dtypes travel as they are. Error bound: docs/engine.md, "fp16/bf16 on the wire". */
  int wire_dtype;
  /* 1: the engine owns flat bucket storage; comm_engine_grad_view gives each gradient's place in it
   * and the framework makes the gradient that view, so nothing is copied in or out.
   * COMM_UNSET: 0. */
  int gradient_as_bucket_view;
  /* 1: the set and order of gradients is the same every step: the first synced step's ready order
   * (rank 0's, broadcast) rebuilds the buckets once so each bucket's gradients arrive together; with
   * find_unused_parameters the unused set is learnt in that step too. COMM_UNSET: 0. */
  int static_graph;
  /* 1: gradients not reported by end() are reduced as zeros and reported in the stats, instead of
   * being an error. COMM_UNSET: 0. */
  int find_unused_parameters;
  /* NULL: host gradients. A cudaStream_t: device gradients produced on that stream; the buckets
   * are all-reduced on the engine's own stream (NCCL, or staged through pinned host memory),
   * ordered after that stream by events, and end() makes that stream wait for them (the host does
   * not). COMM_ERR_UNAVAILABLE without CUDA, or with wire_dtype set. docs/engine.md, "Device gradients". */
  comm_stream_t stream;
  /* Chrome/Perfetto trace (JSON) of steps and buckets, written at comm_engine_destroy.
   * NULL: COMM_TRACE_FILE; a "%r" in the name becomes the rank. "" or unset: no trace. */
  const char* trace_file;
  /* Version 2. Buckets are all-reduced in partitions of up to this many bytes (of the gradients'
   * dtype); a parameter larger than a partition is split across several. Among the partitions
   * ready on every rank, the one whose parameters the next forward needs first (lowest priority
   * value: registration order, or comm_engine_set_priority) goes on the wire next.
   * COMM_UNSET: COMM_ENGINE_PARTITION_BYTES, default 4 MiB. Device gradients: one partition per
   * bucket, in bucket order. docs/engine.md, "Partitions and priorities". */
  int64_t partition_bytes;
  /* 1: comm_engine_end returns once every gradient is reported, while partitions are still on the
   * wire; call comm_engine_wait(eng, i) before reading gradient i (the next forward's layer i), and
   * the next comm_engine_begin (or destroy) waits for the rest. COMM_UNSET:
   * COMM_ENGINE_OVERLAP_FORWARD, default 0. Host gradients only. */
  int overlap_forward;
  /* ...added fields go last */
} comm_engine_config_t;

#define COMM_ENGINE_CONFIG_INIT                                                                      \
  { sizeof(comm_engine_config_t), COMM_ENGINE_CONFIG_VERSION, COMM_UNSET, COMM_UNSET, COMM_UNSET, \
    COMM_UNSET, COMM_UNSET, COMM_UNSET, COMM_UNSET, NULL, NULL, COMM_UNSET, COMM_UNSET }

/* Per-bucket numbers of the last synced step; times in microseconds from that step's begin(). */
typedef struct {
  int first_param;   /* the bucket's first parameter (in its fill order) */
  int num_params;
  uint64_t bytes;    /* bytes this rank put on the wire for it (wire dtype) */
  double ready_us;   /* its last gradient was reported */
  double start_us;   /* its all-reduce started (ready_us + time queued behind earlier buckets) */
  double done_us;    /* its all-reduce (and copy back) finished */
} comm_engine_bucket_stats_t;

/* One partition of a bucket (version 2 of the stats); times as for buckets. */
typedef struct {
  int bucket;
  int priority;      /* lowest priority value of its parameters: it goes on the wire before higher ones */
  int first_param;   /* the first parameter it holds (part of) */
  int num_params;
  uint64_t bytes;    /* bytes this rank put on the wire for it (wire dtype) */
  int wire_order;    /* its place in the step's sequence of partition all-reduces (the same on every rank) */
  double ready_us, start_us, done_us;
} comm_engine_partition_stats_t;

#define COMM_ENGINE_STATS_VERSION 2
#define COMM_ENGINE_STATS_MAX_BUCKETS 64
#define COMM_ENGINE_STATS_MAX_UNUSED 64
#define COMM_ENGINE_STATS_MAX_PARTITIONS 256

/* Set size = sizeof(comm_engine_stats_t) (the rest may be anything); comm_engine_stats fills up to
 * size bytes, version included, so a caller built against an older header keeps working. */
typedef struct {
  size_t size;
  int version;              /* set by comm_engine_stats: COMM_ENGINE_STATS_VERSION */
  uint64_t steps;           /* steps ended (synced or not) */
  uint64_t synced_steps;
  int last_synced;          /* the last step was synced (1) or no_sync (0) */
  int num_buckets;
  int layout_version;       /* 1 at finalize, 2 after a static-graph rebuild: grad_view pointers change */
  uint64_t bytes;           /* bytes this rank put on the wire in the last synced step */
  double step_us;           /* last synced step: begin() to end() returning */
  double exposed_comm_us;   /* last synced step: time end() blocked waiting for communication */
  double comm_us;           /* last synced step: sum over buckets of start..done */
  double overlap_ratio;     /* 1 - exposed_comm_us / comm_us, in [0, 1]; 1 when comm_us is 0 */
  double wait_us;           /* last synced step: sum over buckets of ready..start (queued) */
  int num_unused;           /* gradients reduced as zeros in the last synced step (find_unused_parameters) */
  int unused[COMM_ENGINE_STATS_MAX_UNUSED]; /* their indices, ascending, the first 64 */
  int num_bucket_stats;     /* min(num_buckets, COMM_ENGINE_STATS_MAX_BUCKETS) */
  comm_engine_bucket_stats_t buckets[COMM_ENGINE_STATS_MAX_BUCKETS]; /* in issue order */
  /* Version 2: partitions and their scheduling, last synced step (with overlap_forward: complete
   * once the next comm_engine_begin returned). */
  int num_partitions;
  uint64_t rounds;          /* readiness agreements (one small all-reduce each) */
  double round_us;          /* time spent in them */
  double forward_wait_us;   /* time comm_engine_wait (and the next begin) blocked on this step's gradients */
  int num_partition_stats;  /* min(num_partitions, COMM_ENGINE_STATS_MAX_PARTITIONS) */
  comm_engine_partition_stats_t partitions[COMM_ENGINE_STATS_MAX_PARTITIONS]; /* in partition order */
} comm_engine_stats_t;

/* Collective over comm's ranks (it calls comm_dup). cfg may be NULL (all defaults). */
COMM_API comm_status_t comm_engine_create(comm_t comm, const comm_engine_config_t* cfg,
                                          comm_engine_t* eng);
/* One parameter's gradient, in definition order; *index is 0, 1, 2, ... count may be 0. */
COMM_API comm_status_t comm_engine_register(comm_engine_t eng, size_t count, comm_dtype_t dtype,
                                            int* index);
/* Before finalize: the place of parameter `index` in the next forward (lower = needed sooner;
 * default: its index, registration order). Every rank must give the same priorities. */
COMM_API comm_status_t comm_engine_set_priority(comm_engine_t eng, int index, int priority);
/* One partition handed to a reduce hook (comm_engine_set_reduce_hook). */
typedef struct {
  void* buffer;         /* the partition's elements: reduce them in place (every rank's, combined) */
  size_t count;         /* elements */
  comm_dtype_t dtype;   /* the wire dtype (wire_dtype when set, else the gradients') */
  int partition;        /* its index, 0 .. num_partitions - 1 */
  int bucket;
  const int* params;    /* the parameters it holds, whole or in part (fill order) */
  int num_params;
  int wire_order;       /* its place in this step's sequence (the same on every rank) */
  int num_partitions;
} comm_engine_hook_args_t;
/* Returns COMM_OK once args->buffer holds the reduced value; another status breaks the engine as a
 * failed all-reduce does (comm_engine_end returns it). */
typedef comm_status_t (*comm_engine_reduce_hook_t)(const comm_engine_hook_args_t* args, void* user);
/* Before finalize: the engine calls fn on its own thread for each partition of a synced step, in
 * place of its all-reduce (torch DDP's comm hook); the copy back into the gradients is as usual.
 * The calls come in the same sequence on every rank, so fn may run collectives on a communicator
 * of its own (not one another thread uses meanwhile, and not the engine's). fn = NULL: the built-in
 * all-reduce. Host gradients only (COMM_ERR_UNAVAILABLE with a stream). docs/engine.md, "Reduce hooks". */
COMM_API comm_status_t comm_engine_set_reduce_hook(comm_engine_t eng, comm_engine_reduce_hook_t fn, void* user);
/* Collective: checks every rank registered the same list (counts, dtypes) and the same options,
 * failing on every rank with the difference named; builds and touches the buckets. */
COMM_API comm_status_t comm_engine_finalize(comm_engine_t eng);
/* Start of backward. sync = 0 is DDP's no_sync: the framework accumulates into its gradients and
 * the engine moves nothing; the next synced step reduces what they then hold. */
COMM_API comm_status_t comm_engine_begin(comm_engine_t eng, int sync);
/* The gradient `index` is final for this step and lives at ptr (its current storage: frameworks
 * reallocate gradients). With gradient_as_bucket_view ptr may be NULL (= its view). Any thread;
 * returns at once. */
COMM_API comm_status_t comm_engine_grad_ready(comm_engine_t eng, int index, void* ptr);
/* With gradient_as_bucket_view: the gradient's place in the bucket storage. Valid until
 * layout_version changes (at most once, in the first synced step's end() with static_graph):
 * the old views then still hold that step's reduced values until the next comm_engine_begin;
 * fetch the new ones (they hold the same values) before it. */
COMM_API comm_status_t comm_engine_grad_view(comm_engine_t eng, int index, void** ptr);
/* Before the optimizer step: waits until every reported gradient holds the reduced value. With
 * device gradients: returns once every bucket is enqueued, and the gradients' stream waits (on the
 * GPU) until they hold it. */
COMM_API comm_status_t comm_engine_end(comm_engine_t eng);
/* Waits until gradient `index` holds this step's reduced value (every partition it is in has
 * finished). With overlap_forward: call it before the next forward reads parameter `index` (after
 * the optimizer has updated it from that gradient). Without: returns at once after end(). A
 * gradient not yet reported in the open step is refused. */
COMM_API comm_status_t comm_engine_wait(comm_engine_t eng, int index);
/* comm_engine_wait's question without blocking: *done = 1 when gradient `index` holds this step's
 * reduced value, else 0 (same refusals as comm_engine_wait). Lets a trainer use the time it would
 * wait for one gradient on gradients that have already arrived. */
COMM_API comm_status_t comm_engine_test(comm_engine_t eng, int index, int* done);
COMM_API comm_status_t comm_engine_stats(comm_engine_t eng, comm_engine_stats_t* stats);
/* All gradients reduced as zeros in the last synced step: up to capacity indices, ascending;
 * *count is how many there were. */
COMM_API comm_status_t comm_engine_unused(comm_engine_t eng, int* indices, int capacity, int* count);
/* Frees the engine and its communicator (bounded by the timeout); writes the trace file. */
COMM_API comm_status_t comm_engine_destroy(comm_engine_t eng);

#ifdef __cplusplus
}
#endif

#endif /* COMM_COMM_H */
