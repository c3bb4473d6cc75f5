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
#define COMM_ABI_VERSION_MINOR 0

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
  /* ...added fields go last */
} comm_config_t;

#define COMM_CONFIG_INIT \
  { sizeof(comm_config_t), COMM_CONFIG_VERSION, NULL, COMM_UNSET, COMM_UNSET, COMM_UNSET, NULL }

/* ---- status and errors ---- */
COMM_API const char* comm_status_string(comm_status_t s);
/* The calling thread's last failure, whatever handle it was on; comm may be NULL
 * (works after a failed comm_init). Never NULL; "" when nothing failed. */
COMM_API const char* comm_last_error(comm_t comm);
/* The first error that ended a background operation, or COMM_OK. Any thread. */
COMM_API comm_status_t comm_get_async_error(comm_t comm);
COMM_API comm_status_t comm_get_version(int* major, int* minor);

/* ---- lifecycle ---- */
/* Collective over all ranks: fails on every rank, naming the difference, when the ranks
 * disagree on world size, transport, timeout, tuning profile or ABI version. */
COMM_API comm_status_t comm_init(const comm_config_t* cfg, comm_t* comm);
COMM_API comm_status_t comm_dup(comm_t comm, comm_t* out);
/* color < 0 (COMM_UNSET): this rank takes no part and *out is set to NULL. */
COMM_API comm_status_t comm_split(comm_t comm, int color, int key, comm_t* out);
/* Local, non-blocking, idempotent, any thread: every pending and future call on comm
 * ends with COMM_ERR_ABORTED. Frees nothing; call comm_destroy afterwards. */
COMM_API comm_status_t comm_abort(comm_t comm);
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
COMM_API comm_status_t comm_send(comm_t comm, const void* buf, size_t count, comm_dtype_t dtype,
                                 int peer, comm_stream_t stream);
COMM_API comm_status_t comm_recv(comm_t comm, void* buf, size_t count, comm_dtype_t dtype, int peer,
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
/* Blocks until the request completes, returns its status and frees it. */
COMM_API comm_status_t comm_wait(comm_request_t req);
/* *done = 1 when complete (then the request is freed and its status returned), else 0. */
COMM_API comm_status_t comm_test(comm_request_t req, int* done);

#ifdef __cplusplus
}
#endif

#endif /* COMM_COMM_H */
