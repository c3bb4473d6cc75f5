// libcomm as a c10d ProcessGroup (torch 1.13's API), on the public C ABI (comm/comm.h) only.
//
// Threads: comm.h lets one thread at a time use a communicator, while torch calls a process group
// from the main thread, autograd threads and comm hooks alike. So every call of a group goes
// through its queue (work_queue.h): a collective returns a Work at once and runs in issue order,
// on the group's worker thread, as gloo's, or on the thread that waits for it.
// Point-to-point goes non-blocking on a second communicator (comm_dup at creation), so a pending
// irecv never holds back the collectives queued after it, and an isend/irecv pair on two ranks
// cannot deadlock. Every libcomm wait is bounded by the communicator's timeout, which is the one
// init_process_group(timeout=...) gave.
//
// Python side: python/libcomm/torch_backend.py (rendezvous through torch's store, registration).
#include <comm/comm.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "sparse_allreduce.h"
#include "tensors.h"
#include "work_queue.h"

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace libcomm_torch {

class ProcessGroupLibcomm : public c10d::ProcessGroup {
 public:
  ProcessGroupLibcomm(int rank, int size, const std::string& init_method, int timeout_ms,
                      const std::string& transport, const std::string& profiling_name)
      : ProcessGroup(rank, size), profiling_name_(profiling_name) {
    comm_config_t cfg = COMM_CONFIG_INIT;
    cfg.init_method = init_method.c_str();
    cfg.rank = rank;
    cfg.world_size = size;
    cfg.timeout_ms = timeout_ms;
    timeout_ms_ = timeout_ms;
    cfg.transport = transport.empty() ? nullptr : transport.c_str();
    check(comm_init(&cfg, &comm_), "comm_init");
    // p2p_: sends and receives; barrier_: monitoredBarrier, which aborts its communicator when a
    // rank is missing (comm.h), so that the group's other calls go on.
    comm_status_t s = comm_dup(comm_, &p2p_);
    if (s == COMM_OK) {
      s = comm_dup(comm_, &barrier_);
      if (s != COMM_OK) comm_destroy(p2p_);
    }
    if (s != COMM_OK) {
      std::string detail = comm_last_error(nullptr);
      comm_abort(comm_);
      comm_destroy(comm_);
      throw std::runtime_error(std::string("libcomm comm_dup: ") + comm_status_string(s) + "; " + detail);
    }
    exec_ = std::make_shared<Executor>(p2p_, timeout_ms);
    worker_ = std::thread([exec = exec_] { exec->worker_loop(); });
  }

  // The worker ends once every queued call has run and every p2p request has completed.
  ~ProcessGroupLibcomm() override {
    exec_->stop();
    worker_.join();
    comm_destroy(barrier_);
    comm_destroy(p2p_);
    comm_destroy(comm_);
  }

  const std::string getBackendName() const override { return "libcomm"; }
  comm_t comm() const { return comm_; }

  // Makes every pending and future call fail on this rank at once (comm_abort, any thread).
  void abort() {
    comm_abort(barrier_);
    comm_abort(p2p_);
    comm_abort(comm_);
  }

  // gloo's: the group's collectives counted from 0 (torch sets it after init_process_group).
  void setSequenceNumberForGroup() override { seq_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  // comm_barrier_monitored on its own communicator, worded as gloo's (torch's tests match it).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    auto timeout = opts.timeout == c10d::kUnsetTimeout ? std::chrono::milliseconds(options_timeout_ms()) : opts.timeout;
    int timeout_ms = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
    std::vector<int> missing(static_cast<size_t>(getSize()));
    int n_missing = 0;
    comm_status_t s = comm_barrier_monitored(barrier_, timeout_ms, wait_all_ranks ? 1 : 0, missing.data(),
                                             getSize(), &n_missing);
    if (s != COMM_OK) throw std::runtime_error(std::string("[Rank ") + std::to_string(getRank()) + "]: " +
                                               comm_last_error(nullptr));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) return sparse_allreduce(tensors, opts);
    Buf b(single(tensors, "allreduce"), "allreduce");
    comm_op_t op = to_comm_op(opts.reduceOp, "allreduce");
    return enqueue(OpType::ALLREDUCE, "all_reduce", tensors, tensors, [this, b, op]() mutable {
      check(comm_allreduce(comm_, b.ptr(), b.ptr(), b.count(), b.dtype, op, nullptr), "allreduce");
      b.copy_back();
    });
  }

  // One all-reduce of the tensors flattened together (they must share a dtype, as gloo's).
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "libcomm allreduce_coalesced: no tensors");
    comm_op_t op = to_comm_op(opts.reduceOp, "allreduce_coalesced");
    comm_dtype_t dtype = to_comm_dtype(tensors[0], "allreduce_coalesced");
    for (const auto& t : tensors) {
      TORCH_CHECK(to_comm_dtype(t, "allreduce_coalesced") == dtype && t.scalar_type() == tensors[0].scalar_type(),
                  "libcomm allreduce_coalesced: all tensors must have the same dtype");
    }
    return enqueue(OpType::ALLREDUCE_COALESCED, "all_reduce", tensors, tensors, [this, tensors, op, dtype]() {
      std::vector<at::Tensor> flat_views;
      for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
      at::Tensor flat = at::cat(flat_views);
      check(comm_allreduce(comm_, flat.data_ptr(), flat.data_ptr(), flat.numel(), dtype, op, nullptr),
            "allreduce_coalesced");
      int64_t offset = 0;
      for (const auto& t : tensors) {
        t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    Buf b(single(tensors, "broadcast"), "broadcast");
    int root = check_root(opts.rootRank, "broadcast");
    return enqueue(OpType::BROADCAST, "broadcast", tensors, tensors, [this, b, root]() mutable {
      check(comm_broadcast(comm_, b.ptr(), b.ptr(), b.count(), b.dtype, root, nullptr), "broadcast");
      b.copy_back();
    });
  }

  // The root's tensor gets the result; the others' are left as they were.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    Buf b(single(tensors, "reduce"), "reduce");
    comm_op_t op = to_comm_op(opts.reduceOp, "reduce");
    int root = check_root(opts.rootRank, "reduce");
    return enqueue(OpType::REDUCE, "reduce", tensors, tensors, [this, b, op, root]() mutable {
      bool is_root = getRank() == root;  // comm.h ignores a non-root's recvbuf
      check(comm_reduce(comm_, b.ptr(), is_root ? b.ptr() : nullptr, b.count(), b.dtype, op, root, nullptr), "reduce");
      if (is_root) b.copy_back();
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    TORCH_CHECK(outputs.size() == 1, "libcomm allgather: expects one output list, got ", outputs.size());
    Buf in(single(inputs, "allgather"), "allgather");
    check_list(outputs[0], in.user, "allgather");
    std::vector<at::Tensor> outs = outputs[0];
    return enqueue(OpType::ALLGATHER, "all_gather", inputs, outs, [this, in, outs]() {
      at::Tensor flat = at::empty({getSize() * in.dense.numel()}, in.dense.options());
      check(comm_allgather(comm_, in.ptr(), flat.data_ptr(), in.count(), in.dtype, nullptr), "allgather");
      for (int r = 0; r < getSize(); ++r)
        outs[r].copy_(flat.narrow(0, r * in.dense.numel(), in.dense.numel()).view(outs[r].sizes()));
    });
  }

  // gloo's: every input flattened into one all-gather; output_lists[r][i] gets rank r's input i.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override {
    TORCH_CHECK(!inputs.empty(), "libcomm allgather_coalesced: no input tensors");
    TORCH_CHECK(static_cast<int>(output_lists.size()) == getSize(), "libcomm allgather_coalesced: expects ",
                getSize(), " output lists (one per rank), got ", output_lists.size());
    comm_dtype_t dtype = to_comm_dtype(inputs[0], "allgather_coalesced");
    int64_t total = 0;
    for (const auto& t : inputs) {
      to_comm_dtype(t, "allgather_coalesced");
      TORCH_CHECK(t.scalar_type() == inputs[0].scalar_type(), "libcomm allgather_coalesced: all tensors must have "
                  "the same dtype, got ", inputs[0].scalar_type(), " and ", t.scalar_type());
      total += t.numel();
    }
    std::vector<at::Tensor> flat_outputs;
    for (const auto& list : output_lists) {
      TORCH_CHECK(list.size() == inputs.size(), "libcomm allgather_coalesced: every output list must have ",
                  inputs.size(), " tensors (one per input), got ", list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        to_comm_dtype(list[i], "allgather_coalesced");
        TORCH_CHECK(list[i].scalar_type() == inputs[i].scalar_type() && list[i].numel() == inputs[i].numel(),
                    "libcomm allgather_coalesced: output ", i, " must match input ", i, " in dtype and size (",
                    inputs[i].scalar_type(), ", ", inputs[i].numel(), "), got ", list[i].scalar_type(), ", ",
                    list[i].numel());
        flat_outputs.push_back(list[i]);
      }
    }
    std::vector<std::vector<at::Tensor>> lists = output_lists;
    return enqueue(OpType::ALLGATHER_COALESCED, "all_gather", inputs, flat_outputs,
                   [this, inputs, lists, dtype, total]() {
      std::vector<at::Tensor> flat_views;
      for (const auto& t : inputs) flat_views.push_back(t.reshape({-1}));
      at::Tensor flat_in = at::cat(flat_views);
      at::Tensor flat_out = at::empty({getSize() * total}, flat_in.options());
      check(comm_allgather(comm_, flat_in.data_ptr(), flat_out.data_ptr(), static_cast<size_t>(total), dtype, nullptr),
            "allgather_coalesced");
      int64_t offset = 0;
      for (const auto& list : lists)
        for (const auto& t : list) {
          t.copy_(flat_out.narrow(0, offset, t.numel()).view(t.sizes()));
          offset += t.numel();
        }
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    Buf in(input, "_allgather_base");
    Buf out(output, "_allgather_base");
    TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type(), "libcomm _allgather_base: output dtype ",
                out.user.scalar_type(), " differs from input dtype ", in.user.scalar_type());
    TORCH_CHECK(out.user.numel() == getSize() * in.user.numel(), "libcomm _allgather_base: output has ",
                out.user.numel(), " elements, expected world size x input = ", getSize() * in.user.numel());
    return enqueue(OpType::_ALLGATHER_BASE, "all_gather", {input}, {output}, [this, in, out]() mutable {
      check(comm_allgather(comm_, in.ptr(), out.ptr(), in.count(), in.dtype, nullptr), "_allgather_base");
      out.copy_back();
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(inputs.size() == 1, "libcomm reduce_scatter: expects one input list, got ", inputs.size());
    Buf out(single(outputs, "reduce_scatter"), "reduce_scatter");
    check_list(inputs[0], out.user, "reduce_scatter");
    comm_op_t op = to_comm_op(opts.reduceOp, "reduce_scatter");
    std::vector<at::Tensor> ins = inputs[0];
    return enqueue(OpType::REDUCE_SCATTER, "reduce_scatter", inputs[0], outputs, [this, out, ins, op]() mutable {
      std::vector<at::Tensor> flat_views;
      for (const auto& t : ins) flat_views.push_back(t.reshape({-1}));
      at::Tensor flat = at::cat(flat_views);
      check(comm_reduce_scatter(comm_, flat.data_ptr(), out.ptr(), out.count(), out.dtype, op, nullptr),
            "reduce_scatter");
      out.copy_back();
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    Buf in(input, "_reduce_scatter_base");
    Buf out(output, "_reduce_scatter_base");
    TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type(), "libcomm _reduce_scatter_base: dtypes differ");
    TORCH_CHECK(in.user.numel() == getSize() * out.user.numel(), "libcomm _reduce_scatter_base: input has ",
                in.user.numel(), " elements, expected world size x output = ", getSize() * out.user.numel());
    comm_op_t op = to_comm_op(opts.reduceOp, "_reduce_scatter_base");
    return enqueue(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter", {input}, {output}, [this, in, out, op]() mutable {
      check(comm_reduce_scatter(comm_, in.ptr(), out.ptr(), out.count(), out.dtype, op, nullptr),
            "_reduce_scatter_base");
      out.copy_back();
    });
  }

  // Equal splits are one comm_alltoall; uneven splits (libcomm's alltoall has one count per peer)
  // are a send and a receive per peer in one comm_group_start/end, and a local copy for ourselves.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& out_splits, std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions&) override {
    Buf in(input, "alltoall_base");
    Buf out(output, "alltoall_base");
    TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type(), "libcomm alltoall_base: dtypes differ");
    const int n = getSize();
    if (out_splits.empty() && in_splits.empty()) {
      TORCH_CHECK(in.user.numel() == out.user.numel() && in.user.numel() % n == 0,
                  "libcomm alltoall_base: input and output must have the same number of elements, divisible by "
                  "the world size ", n, "; got ", in.user.numel(), " and ", out.user.numel());
      return enqueue(OpType::ALLTOALL_BASE, "all_to_all", {input}, {output}, [this, in, out, n]() mutable {
        check(comm_alltoall(comm_, in.ptr(), out.ptr(), in.count() / n, in.dtype, nullptr), "alltoall_base");
        out.copy_back();
      });
    }
    std::vector<size_t> in_counts = split_counts(in.user, in_splits, "input"),
                        out_counts = split_counts(out.user, out_splits, "output");
    return enqueue(OpType::ALLTOALL_BASE, "all_to_all", {input}, {output}, [this, in, out, in_counts, out_counts]() mutable {
      std::vector<void*> send, recv;
      size_t elem = in.dense.element_size(), so = 0, ro = 0;
      for (int p = 0; p < getSize(); ++p) {
        send.push_back(static_cast<char*>(in.ptr()) + so * elem);
        recv.push_back(static_cast<char*>(out.ptr()) + ro * elem);
        so += in_counts[p];
        ro += out_counts[p];
      }
      exchange(send, in_counts, recv, out_counts, in.dtype, elem, "alltoall_base");
      out.copy_back();
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const int n = getSize();
    TORCH_CHECK(static_cast<int>(outputs.size()) == n && static_cast<int>(inputs.size()) == n,
                "libcomm alltoall: expects world size (", n, ") input and output tensors, got ", inputs.size(),
                " and ", outputs.size());
    std::vector<Buf> ins, outs;
    for (int p = 0; p < n; ++p) {
      ins.emplace_back(inputs[p], "alltoall");
      outs.emplace_back(outputs[p], "alltoall");
      TORCH_CHECK(ins[p].dtype == ins[0].dtype && outs[p].dtype == ins[0].dtype, "libcomm alltoall: dtypes differ");
    }
    return enqueue(OpType::ALLTOALL, "all_to_all", inputs, outputs, [this, ins, outs]() mutable {
      std::vector<void*> send, recv;
      std::vector<size_t> sc, rc;
      for (size_t p = 0; p < ins.size(); ++p) {
        send.push_back(ins[p].ptr());
        sc.push_back(ins[p].count());
        recv.push_back(outs[p].ptr());
        rc.push_back(outs[p].count());
      }
      exchange(send, sc, recv, rc, ins[0].dtype, ins[0].dense.element_size(), "alltoall");
      for (auto& o : outs) o.copy_back();
    });
  }

  // Built from point-to-point: the root receives from each peer in one group (no collective moves
  // every rank's data to every rank, as an allgather would).
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    Buf in(single(inputs, "gather"), "gather");
    int root = check_root(opts.rootRank, "gather");
    std::vector<at::Tensor> outs;
    if (getRank() == root) {
      TORCH_CHECK(outputs.size() == 1, "libcomm gather: the root expects one output list, got ", outputs.size());
      check_list(outputs[0], in.user, "gather");
      outs = outputs[0];
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "libcomm gather: only the root (", root, ") passes output tensors");
    }
    return enqueue(OpType::GATHER, "gather", inputs, outs, [this, in, outs, root]() {
      if (getRank() != root) {
        check(comm_send(comm_, in.ptr(), in.count(), in.dtype, root, nullptr), "gather (send to root)");
        return;
      }
      std::vector<at::Tensor> dense;
      for (const auto& o : outs) dense.push_back(o.is_contiguous() ? o : at::empty_like(o, at::MemoryFormat::Contiguous));
      grouped("gather", [&] {
        for (int p = 0; p < getSize(); ++p)
          if (p != root) check(comm_recv(comm_, dense[p].data_ptr(), in.count(), in.dtype, p, nullptr), "gather");
      });
      dense[root].copy_(in.dense.view(dense[root].sizes()));
      for (size_t p = 0; p < outs.size(); ++p)
        if (!dense[p].is_same(outs[p])) outs[p].copy_(dense[p]);
    });
  }

  // Built from point-to-point: the root sends each peer its part in one group.
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    Buf out(single(outputs, "scatter"), "scatter");
    int root = check_root(opts.rootRank, "scatter");
    std::vector<at::Tensor> ins;
    if (getRank() == root) {
      TORCH_CHECK(inputs.size() == 1, "libcomm scatter: the root expects one input list, got ", inputs.size());
      check_list(inputs[0], out.user, "scatter");
      for (const auto& t : inputs[0]) ins.push_back(t.contiguous());
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "libcomm scatter: only the root (", root, ") passes input tensors");
    }
    return enqueue(OpType::SCATTER, "scatter", {}, outputs, [this, out, ins, root]() mutable {
      if (getRank() != root) {
        check(comm_recv(comm_, out.ptr(), out.count(), out.dtype, root, nullptr), "scatter (receive from root)");
      } else {
        grouped("scatter", [&] {
          for (int p = 0; p < getSize(); ++p)
            if (p != root) check(comm_send(comm_, ins[p].data_ptr(), out.count(), out.dtype, p, nullptr), "scatter");
        });
        out.dense.copy_(ins[root].view(out.dense.sizes()));
      }
      out.copy_back();
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return enqueue(OpType::BARRIER, "barrier", {}, {}, [this]() { check(comm_barrier(comm_, nullptr), "barrier"); });
  }

  // comm.h's send/recv have no tag: messages between two ranks match in the order they were
  // issued, as NCCL's (whose process group ignores tags too). docs/torch-backend.md says so.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int /*tag*/) override {
    Buf b(single(tensors, "send"), "send");
    check_peer(dst, "send");
    return enqueue_p2p(OpType::SEND, "send", tensors, -1, [this, b, dst](comm_request_t* req) {
      check(comm_isend(p2p_, b.ptr(), b.count(), b.dtype, dst, req), "send");
      return std::function<void()>([b] { (void)b; });  // keeps the (contiguous) buffer alive
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int /*tag*/) override {
    Buf b(single(tensors, "recv"), "recv");
    check_peer(src, "recv");
    return enqueue_p2p(OpType::RECV, "recv", tensors, src, [this, b, src](comm_request_t* req) {
      check(comm_irecv(p2p_, b.ptr(), b.count(), b.dtype, src, req), "recv");
      return std::function<void()>([b]() mutable { b.copy_back(); });
    });
  }

  // Sum only, as gloo's. The caller's tensor is overwritten with the coalesced result.
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
    TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "libcomm allreduce: sparse tensors are summed only "
                "(ReduceOp.SUM), as gloo does");
    TORCH_CHECK(tensors[0].device().is_cpu(), "libcomm allreduce: sparse tensors must be on the CPU");
    at::Tensor t = tensors[0];
    comm_dtype_t dtype = to_comm_dtype(t._values(), "allreduce (sparse values)");
    return enqueue(OpType::ALLREDUCE, "sparse_all_reduce", tensors, tensors, [this, t, dtype]() mutable {
      at::Tensor sum = sparse_allreduce_sum(comm_, getSize(), t, dtype);
      t.copy_(sum);
    });
  }

  // comm_irecv_any (COMM_ANY_SOURCE): the first message from any rank that no earlier receive
  // takes; the Work's sourceRank() is that rank once it completed, as gloo's recvFromAny reports.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int /*tag*/) override {
    Buf b(single(tensors, "recv"), "recv");
    auto source = std::make_shared<int>(COMM_ANY_SOURCE);
    auto work = c10::make_intrusive<LibcommWork>(exec_, getRank(), OpType::RECVANYSOURCE, title("recvAnySource"),
                                                 tensors, tensors, -1);
    LibcommWork* w = work.get();  // alive while its request is pending (Executor::Pending holds it)
    exec_->push(Executor::Job{work, nullptr, [this, b, source, w](comm_request_t* req) {
      check(comm_irecv_any(p2p_, b.ptr(), b.count(), b.dtype, source.get(), req), "recv (from any source)");
      return std::function<void()>([b, source, w]() mutable {
        b.copy_back();
        w->set_source(*source);
      });
    }});
    return work;
  }

 private:
  int check_root(int64_t root, const char* what) const {
    TORCH_CHECK(root >= 0 && root < getSize(), "libcomm ", what, ": root ", root, " is not a rank of this group (size ",
                getSize(), ")");
    return static_cast<int>(root);
  }
  void check_peer(int peer, const char* what) const {
    TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "libcomm ", what, ": peer ", peer,
                " is not another rank of this group (rank ", getRank(), ", size ", getSize(), ")");
  }
  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what) const {
    TORCH_CHECK(static_cast<int>(list.size()) == getSize(), "libcomm ", what, ": expects ", getSize(),
                " tensors (one per rank), got ", list.size());
    for (const auto& t : list) {
      to_comm_dtype(t, what);
      TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "libcomm ", what,
                  ": every tensor must have the dtype and number of elements of this rank's (", like.scalar_type(),
                  ", ", like.numel(), "), got ", t.scalar_type(), ", ", t.numel());
    }
  }
  std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, const char* side) const {
    const int n = getSize();
    int64_t rows = t.dim() == 0 ? 1 : t.size(0), row = rows == 0 ? 0 : t.numel() / rows;
    std::vector<size_t> counts;
    if (splits.empty()) {
      TORCH_CHECK(rows % n == 0, "libcomm alltoall_base: ", side, " dim 0 (", rows, ") is not divisible by ", n);
      counts.assign(n, static_cast<size_t>(rows / n * row));
      return counts;
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == n, "libcomm alltoall_base: ", side, " split sizes have ",
                splits.size(), " entries, expected the world size ", n);
    int64_t total = 0;
    for (int64_t s : splits) {
      TORCH_CHECK(s >= 0, "libcomm alltoall_base: negative split size ", s);
      total += s;
      counts.push_back(static_cast<size_t>(s * row));
    }
    TORCH_CHECK(total == rows, "libcomm alltoall_base: ", side, " split sizes add up to ", total, ", dim 0 is ", rows);
    return counts;
  }

  // Sends and receives in one comm_group_start/end (NCCL's semantics: issued together at the end,
  // so the pairs cannot deadlock).
  void grouped(const char* what, const std::function<void()>& calls) {
    check(comm_group_start(), what);
    try {
      calls();
    } catch (...) {
      comm_group_end();
      throw;
    }
    check(comm_group_end(), what);
  }
  void exchange(const std::vector<void*>& send, const std::vector<size_t>& send_counts, const std::vector<void*>& recv,
                const std::vector<size_t>& recv_counts, comm_dtype_t dtype, size_t elem, const char* what) {
    const int me = getRank();
    TORCH_CHECK(send_counts[me] == recv_counts[me], "libcomm ", what, ": this rank sends itself ", send_counts[me],
                " elements but expects ", recv_counts[me]);
    grouped(what, [&] {
      for (int p = 0; p < getSize(); ++p) {
        if (p == me) continue;
        if (send_counts[p] > 0) check(comm_send(comm_, send[p], send_counts[p], dtype, p, nullptr), what);
        if (recv_counts[p] > 0) check(comm_recv(comm_, recv[p], recv_counts[p], dtype, p, nullptr), what);
      }
    });
    if (send_counts[me] > 0) std::memcpy(recv[me], send[me], send_counts[me] * elem);
  }

  // op: the profiler's name for it, gloo's ("all_reduce"); the event is "<profiling name>:<op>".
  c10::intrusive_ptr<c10d::Work> enqueue(OpType type, const char* op, const std::vector<at::Tensor>& inputs,
                                         std::vector<at::Tensor> outputs, std::function<void()> run) {
    ++seq_;
    auto work = c10::make_intrusive<LibcommWork>(exec_, getRank(), type, title(op), inputs, std::move(outputs));
    exec_->push(Executor::Job{work, std::move(run), nullptr});
    return work;
  }
  c10::intrusive_ptr<c10d::Work> enqueue_p2p(OpType type, const char* op, std::vector<at::Tensor> outputs, int source,
                                             std::function<std::function<void()>(comm_request_t*)> start) {
    auto work = c10::make_intrusive<LibcommWork>(exec_, getRank(), type, title(op), outputs, outputs, source);
    exec_->push(Executor::Job{work, nullptr, std::move(start)});
    return work;
  }

  // torch's RecordFunction keeps the name's pointer: one string per name for the process's life.
  const char* title(const char* op) const {
    static std::mutex mu;
    static std::unordered_set<std::string> names;
    std::lock_guard<std::mutex> lock(mu);
    return names.insert(profiling_name_ + ":" + op).first->c_str();
  }
  int options_timeout_ms() const { return timeout_ms_; }

  std::string profiling_name_;
  int timeout_ms_ = 0;
  uint64_t seq_ = 0;
  comm_t comm_ = nullptr;
  comm_t p2p_ = nullptr;
  comm_t barrier_ = nullptr;
  std::shared_ptr<Executor> exec_;
  std::thread worker_;
};

}  // namespace libcomm_torch

namespace py = pybind11;

PYBIND11_MODULE(_torch_backend, m) {
  m.doc() = "libcomm as a torch.distributed process group (see python/libcomm/torch_backend.py)";
  py::module::import("torch.distributed");  // registers c10d's ProcessGroup type, our base
  using PG = libcomm_torch::ProcessGroupLibcomm;
  py::class_<PG, c10d::ProcessGroup, c10::intrusive_ptr<PG>>(m, "ProcessGroupLibcomm")
      .def(py::init([](int rank, int size, const std::string& init_method, int timeout_ms, const std::string& transport,
                       const std::string& profiling_name) {
             return c10::make_intrusive<PG>(rank, size, init_method, timeout_ms, transport, profiling_name);
           }),
           py::arg("rank"), py::arg("size"), py::arg("init_method"), py::arg("timeout_ms"), py::arg("transport") = "",
           py::arg("profiling_name") = "libcomm",
           py::call_guard<py::gil_scoped_release>())
      .def("abort", &PG::abort, py::call_guard<py::gil_scoped_release>())
      // The comm_t as an integer, for bench/torch_backend_bench.py's comm_allreduce called directly
      // on the same communicator (only while the group has no call in flight: comm.h's one thread).
      .def("_comm_handle", [](const PG& pg) { return reinterpret_cast<uintptr_t>(pg.comm()); });
}
