// comm-bench-gloo: the same table (same engine, inputs and checks) for Gloo's all-reduce
// algorithms (--algo ring, ring_chunked, halving_doubling, bcube), over Gloo's TCP transport.
//
// Rank and size come from the same environment as comm-bench (RANK/WORLD_SIZE, or Open MPI's
// or Slurm's). Gloo of Debian 12 has no TCP store, so ranks meet through a FileStore in a
// directory every rank can see: GLOO_STORE_DIR, else /tmp/comm-bench-gloo-<run id>, where the
// run id is TORCHELASTIC_RUN_ID (comm-run and netsim set it per run), else MASTER_PORT.
// Gloo's classic algorithms are in place only: out of place is a copy into the output
// buffer and an in-place all-reduce there, timed together (what a framework would do).
#include <arpa/inet.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "../backend.h"
#include "../engine.h"
#include "../options.h"

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = env(n)) return std::atoi(v);
  return fallback;
}

// The local address that routes to MASTER_ADDR (a UDP connect sends nothing), so that on
// simulated hosts Gloo listens on the host's own link and not on a decoy interface.
std::string address_toward(const char* master) {
  in_addr dst{};
  if (master == nullptr || inet_pton(AF_INET, master, &dst) != 1) return "127.0.0.1";
  if ((ntohl(dst.s_addr) >> 24) == 127) return "127.0.0.1";
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "127.0.0.1";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(9);
  sa.sin_addr = dst;
  std::string out = "127.0.0.1";
  socklen_t len = sizeof sa;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    char text[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, &sa.sin_addr, text, sizeof text);
    out = text;
  }
  close(fd);
  return out;
}

template <typename T>
const gloo::ReductionFunction<T>* reduction(comm_op_t op) {
  switch (op) {
    case COMM_PROD: return gloo::ReductionFunction<T>::product;
    case COMM_MIN: return gloo::ReductionFunction<T>::min;
    case COMM_MAX: return gloo::ReductionFunction<T>::max;
    default: return gloo::ReductionFunction<T>::sum;
  }
}

template <typename T>
std::unique_ptr<gloo::Algorithm> make_allreduce(const std::string& algo, const std::shared_ptr<gloo::Context>& ctx,
                                                void* ptr, size_t count, comm_op_t op) {
  std::vector<T*> ptrs = {static_cast<T*>(ptr)};
  const int n = static_cast<int>(count);
  if (algo == "ring") return std::make_unique<gloo::AllreduceRing<T>>(ctx, ptrs, n, reduction<T>(op));
  if (algo == "halving_doubling")
    return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(ctx, ptrs, n, reduction<T>(op));
  if (algo == "bcube") return std::make_unique<gloo::AllreduceBcube<T>>(ctx, ptrs, n, reduction<T>(op));
  return std::make_unique<gloo::AllreduceRingChunked<T>>(ctx, ptrs, n, reduction<T>(op));
}

size_t elem_size(comm_dtype_t dt) {
  switch (dt) {
    case COMM_FLOAT64: case COMM_INT64: case COMM_UINT64: return 8;
    case COMM_INT8: case COMM_UINT8: return 1;
    default: return 4;
  }
}

class GlooBackend final : public bench::Backend {
 public:
  std::string init(const bench::Options& opt) override {
    algo_ = opt.algo.empty() ? "ring_chunked" : opt.algo;
    if (algo_ != "ring" && algo_ != "ring_chunked" && algo_ != "halving_doubling" && algo_ != "bcube")
      return "--algo " + algo_ + ": Gloo's all-reduce algorithms are ring, ring_chunked, halving_doubling, bcube";
    if (!opt.transport.empty() && opt.transport != "tcp") return "--transport: this build of Gloo has tcp only";
    rank_ = env_int({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, -1);
    nranks_ = env_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, -1);
    if (rank_ < 0 || nranks_ < 1 || rank_ >= nranks_)
      return "RANK and WORLD_SIZE (or Open MPI's or Slurm's) must be set: run under comm-run, torchrun or netsim";
    if (const char* d = env("GLOO_STORE_DIR")) {
      store_dir_ = d;
    } else {
      const char* id = env("TORCHELASTIC_RUN_ID");
      if (id == nullptr) id = env("MASTER_PORT");
      store_dir_ = std::string("/tmp/comm-bench-gloo-") + (id != nullptr ? id : "default");
    }
    try {
      std::filesystem::create_directories(store_dir_);
      gloo::transport::tcp::attr attr;
      if (const char* ifname = env("GLOO_SOCKET_IFNAME")) {
        attr.iface = ifname;
        address_ = std::string("interface ") + ifname;
      } else {
        attr.hostname = address_toward(env("MASTER_ADDR"));
        address_ = attr.hostname;
      }
      device_ = gloo::transport::tcp::CreateDevice(attr);
      gloo::rendezvous::FileStore store(store_dir_);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, nranks_);
      ctx->setTimeout(std::chrono::milliseconds(env_int({"COMM_TIMEOUT_MS"}, 120000)));
      ctx->connectFullMesh(store, device_);
      ctx_ = ctx;
    } catch (const std::exception& e) {
      return std::string("Gloo rendezvous in ") + store_dir_ + " failed: " + e.what();
    }
    return "";
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string library() const override { return "gloo"; }
  std::string transport() const override { return "gloo tcp (" + address_ + ")"; }
  std::string algorithm() const override { return algo_; }
  std::string unsupported(const char* coll, comm_dtype_t dt, comm_op_t op) const override {
    if (std::strcmp(coll, "allreduce") != 0) return std::string("comm-bench-gloo runs allreduce only, not ") + coll;
    if (dt != COMM_FLOAT32 && dt != COMM_FLOAT64 && dt != COMM_INT32 && dt != COMM_INT64 && dt != COMM_UINT8 &&
        dt != COMM_INT8)
      return "comm-bench-gloo: -d float, double, int32, int64, int8 or uint8";
    if (op == COMM_AVG) return "Gloo has no avg reduction";
    return "";
  }

  void* alloc(size_t bytes, bool) override { return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); }
  void release(void* ptr, bool) override { std::free(ptr); }

  bool allreduce(const void* s, void* r, size_t n, comm_dtype_t dt, comm_op_t op) override {
    return guard([&] {
      if (s != r) std::memcpy(r, s, n * elem_size(dt));
      if (n == 0) return;
      if (!algo_obj_ || key_.ptr != r || key_.count != n || key_.dt != dt || key_.op != op) {
        algo_obj_.reset();  // built outside the timed loop: the engine calls it with the same key first
        algo_obj_ = make(r, n, dt, op);
        key_ = {r, n, dt, op};
      }
      algo_obj_->run();
    });
  }
  bool allgather(const void*, void*, size_t, comm_dtype_t) override { return unsupported_call(); }
  bool reduce_scatter(const void*, void*, size_t, comm_dtype_t, comm_op_t) override { return unsupported_call(); }
  bool broadcast(const void*, void*, size_t, comm_dtype_t, int) override { return unsupported_call(); }
  bool reduce(const void*, void*, size_t, comm_dtype_t, comm_op_t, int) override { return unsupported_call(); }
  bool alltoall(const void*, void*, size_t, comm_dtype_t) override { return unsupported_call(); }
  bool sendrecv(const void*, void*, size_t, comm_dtype_t, int, int) override { return unsupported_call(); }

  bool barrier() override {
    return guard([&] { gloo::BarrierAllToAll(ctx_).run(); });
  }
  bool reduce_value(double in, comm_op_t op, double* out) override {
    return guard([&] {
      value_ = in;
      gloo::AllreduceRing<double>(ctx_, {&value_}, 1, reduction<double>(op)).run();
      *out = value_;
    });
  }
  bool gather_bytes(const void* in, size_t bytes, void* out) override {
    return guard([&] {
      gloo::AllgatherRing<char>(ctx_, {static_cast<const char*>(in)}, static_cast<char*>(out), static_cast<int>(bytes))
          .run();
    });
  }
  std::string error() const override { return error_; }
  void abort() override {}  // Gloo has none; the peers fail by their timeout
  bool finish() override {
    // No closing barrier: every rank has finished the last reduction, and a barrier's last
    // message can meet a peer that already closed its connections ("closed by peer").
    algo_obj_.reset();
    ctx_.reset();
    if (rank_ == 0) {
      std::error_code ec;
      std::filesystem::remove_all(store_dir_, ec);
    }
    return true;
  }

 private:
  struct Key {
    void* ptr = nullptr;
    size_t count = 0;
    comm_dtype_t dt = COMM_FLOAT32;
    comm_op_t op = COMM_SUM;
  };

  std::unique_ptr<gloo::Algorithm> make(void* p, size_t n, comm_dtype_t dt, comm_op_t op) {
    switch (dt) {
      case COMM_FLOAT64: return make_allreduce<double>(algo_, ctx_, p, n, op);
      case COMM_INT32: return make_allreduce<int32_t>(algo_, ctx_, p, n, op);
      case COMM_INT64: return make_allreduce<int64_t>(algo_, ctx_, p, n, op);
      case COMM_INT8: return make_allreduce<int8_t>(algo_, ctx_, p, n, op);
      case COMM_UINT8: return make_allreduce<uint8_t>(algo_, ctx_, p, n, op);
      default: return make_allreduce<float>(algo_, ctx_, p, n, op);
    }
  }
  template <typename F>
  bool guard(F&& f) {
    try {
      f();
      return true;
    } catch (const std::exception& e) {
      error_ = e.what();
      return false;
    }
  }
  bool unsupported_call() {
    error_ = "not supported by comm-bench-gloo";
    return false;
  }

  int rank_ = 0;
  int nranks_ = 1;
  std::string algo_;
  std::string store_dir_;
  std::string address_;
  std::string error_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  std::unique_ptr<gloo::Algorithm> algo_obj_;
  Key key_;
  double value_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  GlooBackend backend;
  return bench::run_bench(argc, argv, "comm-bench-gloo", backend);
}
