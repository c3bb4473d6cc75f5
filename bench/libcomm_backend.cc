// libcomm through comm.h only, as a user sees it. -z 0 issues the timed calls with the
// non-blocking comm_i* variants and waits for them at the end, as nccl-tests enqueues on a stream.
#include "libcomm_backend.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "device_stream.h"
#include "options.h"
#include "values.h"

namespace bench {
namespace {

class LibcommBackend final : public Backend {
 public:
  ~LibcommBackend() override {
    if (comm_ != nullptr) comm_destroy(comm_);
  }

  std::string init(const Options& opt) override {
    // COMM_ALGO is read at comm_init, before libcomm starts any thread.
    if (!opt.algo.empty()) setenv("COMM_ALGO", opt.algo.c_str(), 1);
    if (const char* a = std::getenv("COMM_ALGO"); a != nullptr && *a != '\0') algo_ = a;
    comm_config_t cfg = COMM_CONFIG_INIT;
    if (!opt.transport.empty()) cfg.transport = opt.transport.c_str();
    if (opt.timeout_s > 0) cfg.timeout_ms = opt.timeout_s * 1000;  // -T, nccl-tests' per-call timeout
    const char* t = !opt.transport.empty() ? opt.transport.c_str() : std::getenv("COMM_TRANSPORT");
    if (t != nullptr && *t != '\0') transport_ = t;
    if (comm_status_t s = comm_init(&cfg, &comm_); s != COMM_OK) {
      comm_ = nullptr;
      return std::string("comm_init failed: ") + comm_status_string(s) + ": " + comm_last_error(nullptr);
    }
    if (!ok(comm_rank(comm_, &rank_)) || !ok(comm_size(comm_, &nranks_))) return error_;
    if (opt.device) {
      if (opt.registered) return "--device 1 and -R 1 together: the engine fills buffers from the host; use one";
      if (std::string why = device_.open(opt.stream_null); !why.empty()) return why;
      stream_ = device_.stream();
    }
    return "";
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string library() const override { return "libcomm"; }
  std::string version() const override { return comm_get_version_string(); }
  std::string transport() const override {
    // comm.h does not report the transport "auto" chose; on one rank there is none to choose.
    if (nranks_ == 1) return transport_ + " (1 rank: nothing on the wire)";
    // What "auto" chose per peer is libcomm's (the topology plan's) and comm.h has no query
    // for it; COMM_DEBUG=INFO logs it.
    return transport_ == "auto" ? "auto (libcomm's choice per peer class; COMM_DEBUG=INFO logs it)" : transport_;
  }
  std::string algorithm() const override {
    return algo_.empty() ? "auto (libcomm picks per call: latency algorithms up to COMM_SMALL_MSG_BYTES, ring above)"
                         : algo_ + " (COMM_ALGO; libcomm falls back, with a warning, where it cannot run)";
  }
  std::string unsupported(const char*, comm_dtype_t, comm_op_t) const override { return ""; }

  void* alloc(size_t bytes, bool registered) override {
    if (stream_) return device_.alloc(bytes, &error_);
    if (registered) {
      void* p = nullptr;
      return ok(comm_mem_alloc(comm_, bytes, &p)) ? p : nullptr;
    }
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) error_ = "out of memory";
    return p;
  }
  void release(void* ptr, bool registered) override {
    if (stream_) {
      device_.release(ptr);
    } else if (registered) {
      comm_mem_free(comm_, ptr);
    } else {
      std::free(ptr);
    }
  }

  bool allreduce(const void* s, void* r, size_t n, comm_dtype_t dt, comm_op_t op) override {
    made(kAllreduce, n, dt, 1);
    if (stream_) return on_stream(comm_allreduce(comm_, s, r, n, dt, op, stream_));
    return batching_ ? queue(comm_iallreduce(comm_, s, r, n, dt, op, next()))
                     : ok(comm_allreduce(comm_, s, r, n, dt, op, nullptr));
  }
  bool allgather(const void* s, void* r, size_t n, comm_dtype_t dt) override {
    made(kAllgather, n, dt, nranks_);
    if (stream_) return on_stream(comm_allgather(comm_, s, r, n, dt, stream_));
    return batching_ ? queue(comm_iallgather(comm_, s, r, n, dt, next())) : ok(comm_allgather(comm_, s, r, n, dt, nullptr));
  }
  bool reduce_scatter(const void* s, void* r, size_t n, comm_dtype_t dt, comm_op_t op) override {
    made(kReduceScatter, n, dt, nranks_);
    if (stream_) return on_stream(comm_reduce_scatter(comm_, s, r, n, dt, op, stream_));
    return batching_ ? queue(comm_ireduce_scatter(comm_, s, r, n, dt, op, next()))
                     : ok(comm_reduce_scatter(comm_, s, r, n, dt, op, nullptr));
  }
  bool broadcast(const void* s, void* r, size_t n, comm_dtype_t dt, int root) override {
    made(kBroadcast, n, dt, 1);
    if (stream_) return on_stream(comm_broadcast(comm_, s, r, n, dt, root, stream_));
    return batching_ ? queue(comm_ibroadcast(comm_, s, r, n, dt, root, next()))
                     : ok(comm_broadcast(comm_, s, r, n, dt, root, nullptr));
  }
  bool reduce(const void* s, void* r, size_t n, comm_dtype_t dt, comm_op_t op, int root) override {
    made(kReduce, n, dt, 1);
    if (stream_) return on_stream(comm_reduce(comm_, s, r, n, dt, op, root, stream_));
    return batching_ ? queue(comm_ireduce(comm_, s, r, n, dt, op, root, next()))
                     : ok(comm_reduce(comm_, s, r, n, dt, op, root, nullptr));
  }
  bool alltoall(const void* s, void* r, size_t n, comm_dtype_t dt) override {
    made(kAlltoall, n, dt, nranks_);
    if (stream_) return on_stream(comm_alltoall(comm_, s, r, n, dt, stream_));
    return batching_ ? queue(comm_ialltoall(comm_, s, r, n, dt, next())) : ok(comm_alltoall(comm_, s, r, n, dt, nullptr));
  }
  bool sendrecv(const void* s, void* r, size_t n, comm_dtype_t dt, int to, int from) override {
    if (batching_ && !stream_)
      return queue(comm_isend(comm_, s, n, dt, to, next())) && queue(comm_irecv(comm_, r, n, dt, from, next()));
    // One group, so that the ring of sends and receives cannot deadlock (NCCL's semantics).
    if (!ok(comm_group_start())) return false;
    const bool sent = ok(comm_send(comm_, s, n, dt, to, stream_));
    const bool received = sent && ok(comm_recv(comm_, r, n, dt, from, stream_));
    const bool ended = ok(comm_group_end()) && sent && received;
    return stream_ ? ended && on_stream(COMM_OK) : ended;
  }

  bool begin_batch() override {
    batching_ = true;
    return true;
  }
  bool end_batch() override {
    batching_ = false;
    if (stream_) return device_.sync(&error_);
    bool good = true;
    for (comm_request_t req : requests_) good = ok(comm_wait(req)) && good;  // every request is freed by its wait
    requests_.clear();
    return good;
  }

  bool barrier() override {
    made(kBarrier, 0, COMM_UINT8, 1);
    return (!stream_ || device_.sync(&error_)) && ok(comm_barrier(comm_, nullptr)); }
  bool reduce_value(double in, comm_op_t op, double* out) override {
    made(kAllreduce, 1, COMM_FLOAT64, 1);
    return ok(comm_allreduce(comm_, &in, out, 1, COMM_FLOAT64, op, nullptr));
  }
  bool gather_bytes(const void* in, size_t bytes, void* out) override {
    made(kAllgather, bytes, COMM_UINT8, nranks_);
    return ok(comm_allgather(comm_, in, out, bytes, COMM_UINT8, nullptr));
  }

  std::string error() const override { return error_; }
  std::string calls_made() const override {
    std::string out;
    for (int k = 0; k < kKinds; ++k) {
      if (made_calls_[k] == 0) continue;
      out += std::string(out.empty() ? "" : ", ") + kNames[k] + " " + std::to_string(made_calls_[k]) + " calls " +
             std::to_string(made_bytes_[k]) + " bytes";
    }
    return out;
  }
  void abort() override {
    if (comm_ != nullptr) comm_abort(comm_);
  }
  bool finish() override {
    comm_status_t s = comm_destroy(comm_);
    comm_ = nullptr;
    return ok(s);
  }

 private:
  // The calls made, as libcomm's metrics count them (libcomm_collective_calls_total, _bytes_total).
  enum Kind { kAllreduce, kAllgather, kReduceScatter, kBroadcast, kReduce, kAlltoall, kBarrier, kKinds };
  static constexpr const char* kNames[kKinds] = {"allreduce", "allgather", "reduce_scatter", "broadcast",
                                                 "reduce",    "alltoall",  "barrier"};
  void made(Kind k, size_t count, comm_dtype_t dt, int times) {
    ++made_calls_[k];
    made_bytes_[k] += static_cast<uint64_t>(count) * dtype_info(dt).bytes * static_cast<uint64_t>(times);
  }
  uint64_t made_calls_[kKinds] = {};
  uint64_t made_bytes_[kKinds] = {};

  bool ok(comm_status_t s) {
    if (s == COMM_OK) return true;
    error_ = std::string(comm_status_string(s)) + ": " + comm_last_error(comm_);
    return false;
  }
  // --device 1: a call on the stream; blocking (-z 1, checks) waits for it, a batch at end_batch.
  bool on_stream(comm_status_t s) { return ok(s) && (batching_ || device_.sync(&error_)); }
  comm_request_t* next() {
    requests_.push_back(nullptr);
    return &requests_.back();
  }
  bool queue(comm_status_t s) {
    if (s == COMM_OK) return true;
    requests_.pop_back();  // a call that failed made no request
    return ok(s);
  }

  comm_t comm_ = nullptr;
  int rank_ = 0;
  int nranks_ = 1;
  std::string transport_ = "auto";
  std::string algo_;
  std::string error_;
  bool batching_ = false;
  DeviceStream device_;
  void* stream_ = nullptr;  // --device 1: the CUDA stream every collective goes on
  std::vector<comm_request_t> requests_;
};

}  // namespace

std::unique_ptr<Backend> make_libcomm_backend() { return std::make_unique<LibcommBackend>(); }

}  // namespace bench
