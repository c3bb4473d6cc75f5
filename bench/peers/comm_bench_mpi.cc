// comm-bench-mpi: the same table (same engine, inputs and checks) for Open MPI's collectives,
// to run beside comm-bench: mpirun -np 4 build-bench/bench/comm-bench-mpi -b 1M -e 64M -f 2
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "../backend.h"
#include "../engine.h"
#include "../options.h"

namespace {

MPI_Datatype mpi_type(comm_dtype_t dt) {
  switch (dt) {
    case COMM_FLOAT32: return MPI_FLOAT;
    case COMM_FLOAT64: return MPI_DOUBLE;
    case COMM_INT8: return MPI_INT8_T;
    case COMM_UINT8: return MPI_UINT8_T;
    case COMM_INT32: return MPI_INT32_T;
    case COMM_UINT32: return MPI_UINT32_T;
    case COMM_INT64: return MPI_INT64_T;
    case COMM_UINT64: return MPI_UINT64_T;
    default: return MPI_DATATYPE_NULL;  // no half or bfloat16 in MPI
  }
}

MPI_Op mpi_op(comm_op_t op) {
  switch (op) {
    case COMM_SUM: return MPI_SUM;
    case COMM_PROD: return MPI_PROD;
    case COMM_MIN: return MPI_MIN;
    case COMM_MAX: return MPI_MAX;
    default: return MPI_OP_NULL;  // no avg in MPI
  }
}

// MPI counts are int; the engine's sizes stay far below that for every dtype used here.
int as_int(size_t n) { return static_cast<int>(n); }

class MpiBackend final : public bench::Backend {
 public:
  ~MpiBackend() override {
    int done = 0;
    MPI_Finalized(&done);
    if (!done && initialized_) MPI_Finalize();
  }
  std::string init(const bench::Options& opt) override {
    if (!opt.algo.empty()) algo_ = opt.algo;  // Open MPI: set with --mca coll_tuned_* instead; reported only
    if (MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return "MPI_Init failed";
    initialized_ = true;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks_);
    return "";
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string library() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    const size_t cut = v.find_first_of(",\n");
    return "mpi (" + v.substr(0, cut) + ")";
  }
  std::string transport() const override {
    const char* btl = std::getenv("OMPI_MCA_btl");
    return std::string("Open MPI BTLs: ") + (btl != nullptr ? btl : "default (vader for local ranks, tcp across hosts)");
  }
  std::string algorithm() const override { return algo_.empty() ? "coll/tuned's choice per size" : algo_; }
  std::string unsupported(const char* coll, comm_dtype_t dt, comm_op_t op) const override {
    if (mpi_type(dt) == MPI_DATATYPE_NULL) return "MPI has no half or bfloat16 type";
    if (mpi_op(op) == MPI_OP_NULL) return std::string("MPI has no avg reduction (") + coll + ")";
    return "";
  }

  void* alloc(size_t bytes, bool) override { return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); }
  void release(void* ptr, bool) override { std::free(ptr); }

  bool allreduce(const void* s, void* r, size_t n, comm_dtype_t dt, comm_op_t op) override {
    return ok(MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, as_int(n), mpi_type(dt), mpi_op(op), MPI_COMM_WORLD));
  }
  bool allgather(const void* s, void* r, size_t n, comm_dtype_t dt) override {
    const bool in_place = s == static_cast<char*>(r) + static_cast<size_t>(rank_) * n * elem(dt);
    return ok(MPI_Allgather(in_place ? MPI_IN_PLACE : s, as_int(n), mpi_type(dt), r, as_int(n), mpi_type(dt),
                            MPI_COMM_WORLD));
  }
  bool reduce_scatter(const void* s, void* r, size_t n, comm_dtype_t dt, comm_op_t op) override {
    if (r == static_cast<const char*>(s) + static_cast<size_t>(rank_) * n * elem(dt)) {
      // MPI's in-place form leaves the result at the start of the buffer; NCCL's is at block `rank`.
      if (!ok(MPI_Reduce_scatter_block(MPI_IN_PLACE, const_cast<void*>(s), as_int(n), mpi_type(dt), mpi_op(op),
                                       MPI_COMM_WORLD)))
        return false;
      if (rank_ != 0) std::memmove(r, s, n * elem(dt));
      return true;
    }
    return ok(MPI_Reduce_scatter_block(s, r, as_int(n), mpi_type(dt), mpi_op(op), MPI_COMM_WORLD));
  }
  bool broadcast(const void* s, void* r, size_t n, comm_dtype_t dt, int root) override {
    if (rank_ == root && s != r) std::memcpy(r, s, n * elem(dt));
    return ok(MPI_Bcast(r, as_int(n), mpi_type(dt), root, MPI_COMM_WORLD));
  }
  bool reduce(const void* s, void* r, size_t n, comm_dtype_t dt, comm_op_t op, int root) override {
    const void* send = rank_ == root && s == r ? MPI_IN_PLACE : s;
    return ok(MPI_Reduce(send, r, as_int(n), mpi_type(dt), mpi_op(op), root, MPI_COMM_WORLD));
  }
  bool alltoall(const void* s, void* r, size_t n, comm_dtype_t dt) override {
    return ok(MPI_Alltoall(s == r ? MPI_IN_PLACE : s, as_int(n), mpi_type(dt), r, as_int(n), mpi_type(dt),
                           MPI_COMM_WORLD));
  }
  bool sendrecv(const void* s, void* r, size_t n, comm_dtype_t dt, int to, int from) override {
    if (s == r) return ok(MPI_Sendrecv_replace(r, as_int(n), mpi_type(dt), to, 0, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    return ok(MPI_Sendrecv(s, as_int(n), mpi_type(dt), to, 0, r, as_int(n), mpi_type(dt), from, 0, MPI_COMM_WORLD,
                           MPI_STATUS_IGNORE));
  }

  bool barrier() override { return ok(MPI_Barrier(MPI_COMM_WORLD)); }
  bool reduce_value(double in, comm_op_t op, double* out) override {
    return ok(MPI_Allreduce(&in, out, 1, MPI_DOUBLE, mpi_op(op), MPI_COMM_WORLD));
  }
  bool gather_bytes(const void* in, size_t bytes, void* out) override {
    return ok(MPI_Allgather(in, as_int(bytes), MPI_BYTE, out, as_int(bytes), MPI_BYTE, MPI_COMM_WORLD));
  }
  std::string error() const override { return error_; }
  void abort() override { MPI_Abort(MPI_COMM_WORLD, 1); }
  bool finish() override {
    initialized_ = false;
    return ok(MPI_Finalize());
  }

 private:
  static size_t elem(comm_dtype_t dt) {
    int size = 0;
    MPI_Type_size(mpi_type(dt), &size);
    return static_cast<size_t>(size);
  }
  bool ok(int rc) {
    if (rc == MPI_SUCCESS) return true;
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    error_ = std::string(text, static_cast<size_t>(len));
    return false;
  }

  bool initialized_ = false;
  int rank_ = 0;
  int nranks_ = 1;
  std::string algo_;
  std::string error_;
};

}  // namespace

int main(int argc, char** argv) {
  MpiBackend backend;
  return bench::run_bench(argc, argv, "comm-bench-mpi", backend);
}
