// The gradient engine behind comm_engine_t: bucket storage, the step's state machine, and the
// thread that runs each bucket's all-reduce as soon as its last gradient is ready.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "engine/layout.h"
#include "engine/trace.h"
#include "status.h"
#include "device/device.h"

namespace comm::engine {

// Resolved options (API field > environment > default); every rank must agree on them.
struct Options {
  size_t bucket_cap_bytes = 25u << 20;
  size_t first_bucket_bytes = 1u << 20;
  // Where each came from when not the default ("comm_engine_config_t.bucket_cap_bytes",
  // "COMM_ENGINE_BUCKET_CAP_BYTES=..."): a tuning profile sets only what is still "".
  std::string bucket_cap_from, first_bucket_from;
  comm_op_t op = COMM_AVG;
  int wire_dtype = COMM_UNSET;  // COMM_UNSET, COMM_FLOAT16, COMM_BFLOAT16
  bool grad_view = false;
  bool static_graph = false;
  bool find_unused = false;
  comm_stream_t stream = nullptr;  // device gradients, produced on this stream
  std::string trace_file;
  size_t partition_bytes = 4u << 20;  // SIZE_MAX with device gradients: one partition per bucket
  bool overlap_forward = false;       // end() returns before the partitions finish; wait(i) per gradient
  bool fifo = false;                  // partitions in index order (bucket order), no agreement rounds
};

// 64-byte aligned, touched at allocation (first touch is slow here: never on a step). With
// device gradients: device memory, zeroed.
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  device::EngineStreams* dev = nullptr;  // device memory of the engine's device (outlives the buffer)
  Buffer() = default;
  explicit Buffer(size_t n);
  static Status on_device(size_t n, device::EngineStreams* dev, Buffer* out);
  Buffer(Buffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes), dev(o.dev) { o.ptr = nullptr, o.bytes = 0; }
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer();
};

struct Bucket {
  BucketLayout layout;
  comm_dtype_t wire = COMM_FLOAT32;  // what travels
  bool compressed = false;           // wire != layout.dtype
  Buffer data;                       // gradients in their dtype (views; staging when not compressed)
  Buffer wirebuf;                    // compressed copy (only when compressed)
  // Per step (guarded by Engine::mu):
  int pending = 0;  // gradients not yet in the bucket
  bool ready = false;
  Status ready_error;  // device gradients: recording the bucket's event failed
  double ready_us = 0, start_us = 0, done_us = 0;
};

// A partition (layout.h) and its state in the current synced step (guarded by Engine::mu).
struct Partition {
  PartitionLayout layout;
  int pending = 0;       // parameters not yet in it
  bool ready = false;    // every parameter in it reported, on this rank
  bool agreed = false;   // ready on every rank (a round said so): may go on the wire
  bool started = false, done = true;  // done: holds the reduced value (true outside a step)
  int wire_order = -1;
  double ready_us = 0, start_us = 0, done_us = 0;
};

enum class ParamState : uint8_t { kWaiting, kCopying, kReady, kUnused };

class Engine {
 public:
  static Status create(comm_t comm, const Options& opt, std::unique_ptr<Engine>* out);
  ~Engine();

  Status add_param(size_t count, comm_dtype_t dtype, int* index);
  Status set_priority(int index, int priority);
  Status set_reduce_hook(comm_engine_reduce_hook_t fn, void* user);
  Status finalize();
  Status begin(bool sync);
  Status grad_ready(int index, void* ptr);
  Status grad_view(int index, void** ptr);
  Status end();
  Status wait(int index);
  Status test(int index, int* done);
  void stats(comm_engine_stats_t* out);
  Status unused(int* indices, int capacity, int* count);
  Status destroy();  // graceful: stops the thread, writes the trace, frees the communicator

  int rank() const { return rank_; }

 private:
  // Under mu_: the shared checks of wait() and test(), and whether parameter p's partitions are done.
  Status check_reduced(const char* fn, int index, bool* done);
  bool param_reduced(size_t p) const;
  Engine() = default;
  std::string where(const char* fn) const;  // "rank 2, comm_engine_end (step 7): "
  Status check_agreement();                  // finalize's collective check
  Status build(const std::vector<int>& order); // buckets + storage for this fill order
  Status make_buffer(size_t bytes, Buffer* out);
  Status rebuild_from_rank0();               // static graph, end of the first synced step
  Status settle_unreported(const char* fn, double t_end);  // end(): gradients never reported
  void record_overlapped_step();             // overlap_forward: the step's numbers once it is done
  void mark_in_bucket(int p, double t_us);   // under mu: one gradient more in its bucket
  void copy_in(int p, const void* ptr);      // the gradient into its bucket (compressing)
  Status zero_slot(int p);
  Status run_partition(int k);               // the issue path: all-reduce + copy back
  Status run_bucket_device(int b);           // a whole bucket, enqueued on the engine's stream
  void comm_loop();
  // The comm thread's next move (schedule.cc), under mu_: a partition to run (>= 0), kRound, or kIdle.
  static constexpr int kRound = -1, kIdle = -2;
  int next_move();
  Status agree_round(std::unique_lock<std::mutex>& lock);  // one readiness agreement (unlocks inside)
  // Waits (mu_ held) until the step's partitions are all done or the engine broke; polls the
  // trainer's communicator for comm_abort.
  Status wait_comm_idle(std::unique_lock<std::mutex>& lock, const char* fn);
  void publish_step();                       // mu_ held: the last synced step to the metrics
  void complete_step();                      // mu_ held, every partition done: the step's numbers
  // Breaks the engine and tells the peers; interrupt: abort the bucket in flight first.
  Status fail(Status st, bool interrupt = false);
  double now_us() const;

  comm_t comm_ = nullptr;    // our own dup
  comm_t parent_ = nullptr;  // the trainer's: comm_abort on it ends our waits too (it outlives us)
  int rank_ = 0, size_ = 1;
  Options opt_;
  std::vector<ParamInfo> params_;
  std::vector<int> param_bucket_;
  std::vector<size_t> param_offset_;  // elements, inside its bucket
  // Device gradients (opt_.stream): the engine's stream and events; declared before the buckets,
  // whose device memory it frees.
  std::unique_ptr<device::EngineStreams> dev_;
  std::vector<Bucket> buckets_;
  std::vector<Partition> parts_;
  std::vector<std::vector<int>> param_parts_;  // the partitions each parameter is in
  std::vector<int> priority_;                  // per parameter (comm_engine_set_priority)
  // comm_engine_set_reduce_hook: set before finalize, read by the comm thread only after it.
  comm_engine_reduce_hook_t hook_ = nullptr;
  void* hook_user_ = nullptr;
  std::vector<Bucket> retired_;  // the layout a static-graph rebuild replaced, until the next begin()
  bool finalized_ = false;
  int layout_version_ = 0;

  // Step state, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  bool in_step_ = false, ending_ = false, sync_ = false;
  std::vector<ParamState> state_;
  std::vector<void*> grad_ptr_;
  // Scheduling of the synced step's partitions (schedule.cc): the same sequence on every rank.
  bool comm_active_ = false;  // a synced step's partitions are not all done (may outlive end())
  bool step_unrecorded_ = false;  // overlap_forward: end() returned, the numbers are not taken yet
  int done_parts_ = 0, started_parts_ = 0;
  int agreed_waiting_ = 0;    // agreed by a round, not started
  int known_parts_ = 0;       // agreed or started: once all are, no round is needed
  int fifo_next_ = 0;         // the lowest partition index not started
  size_t bytes_since_round_ = 0, round_every_ = 0;  // a round every round_every_ bytes on the wire
  std::vector<uint8_t> round_buf_;
  uint64_t rounds_ = 0, sched_step_ = 0;  // sched_step_: the synced step being scheduled (1-based)
  double round_us_ = 0, forward_wait_us_ = 0, t_end_ = 0;
  Status broken_;
  bool stop_ = false;
  bool running_ = false;  // the comm thread is inside a bucket's all-reduce (uses comm_)
  std::thread thread_;
  uint64_t steps_ = 0, synced_steps_ = 0;
  std::chrono::steady_clock::time_point epoch_;
  double step_begin_us_ = 0;

  // Static graph: the first synced step's ready order, and the gradients it never saw.
  bool learning_ = false, learnt_ = false;
  std::vector<int> observed_;
  std::vector<uint8_t> learnt_unused_;

  // Last synced step's numbers.
  double last_step_us_ = 0, last_exposed_us_ = 0;
  uint64_t last_bytes_ = 0, last_rounds_ = 0;
  double last_round_us_ = 0, last_forward_wait_us_ = 0;
  std::vector<comm_engine_partition_stats_t> last_parts_;
  bool last_synced_ = false;
  std::vector<int> last_unused_;
  std::vector<comm_engine_bucket_stats_t> last_buckets_;

  Trace trace_;
};

Status resolve_options(const comm_engine_config_t* cfg, Options* out);
// The tuning profile's engine entry for this model (`total_bytes` of gradients) into `opt`, for
// the knobs neither the caller nor the environment set; logs at INFO which entry and why.
void apply_profile(comm_t comm, uint64_t total_bytes, Options* opt);

}  // namespace comm::engine

struct comm_engine_s {
  std::unique_ptr<comm::engine::Engine> impl;
};
