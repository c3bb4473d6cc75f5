// The work queue of python/libcomm/csrc/process_group_libcomm.cc: its Work objects and the
// executor that makes every libcomm call of one process group, in issue order. A header of that
// one translation unit (torch's headers are heavy: one compile for the whole extension).
#pragma once

#include <comm/comm.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace libcomm_torch {

using c10d::OpType;
using Clock = std::chrono::steady_clock;

// The words torch's users and tests match on come first (gloo's and NCCL's: " Timed out ",
// "closed"), libcomm's status and detail after. Called on the thread that made the failing call:
// comm_last_error is per thread.
inline std::string status_words(comm_status_t s) {
  switch (s) {
    case COMM_ERR_TIMEOUT: return " Timed out waiting for the peers (COMM_ERR_TIMEOUT): ";
    case COMM_ERR_REMOTE: return " a peer failed or its connection closed (COMM_ERR_REMOTE): ";
    case COMM_ERR_ABORTED: return " the communicator was aborted, its connections closed (COMM_ERR_ABORTED): ";
    default: return std::string(" ") + comm_status_string(s) + "; ";
  }
}
[[noreturn]] inline void raise_status(comm_status_t s, const std::string& what) {
  std::string detail = comm_last_error(nullptr);
  throw std::runtime_error("libcomm " + what + ":" + status_words(s) + detail);
}

inline void check(comm_status_t s, const char* what) {
  if (s != COMM_OK) raise_status(s, what);
}

class Executor;

class LibcommWork : public c10d::Work {
 public:
  // title: the profiler's event name ("libcomm:all_reduce"), a string that lives as long as the
  // process (torch's RecordFunction keeps the pointer); inputs: the shapes the event records.
  LibcommWork(std::shared_ptr<Executor> exec, int rank, OpType type, const char* title,
              const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs, int source = -1)
      : Work(rank, type, title, c10::optional<std::vector<at::Tensor>>(inputs)), exec_(std::move(exec)),
        outputs_(std::move(outputs)), source_(source),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override {
    TORCH_CHECK(source_ >= 0, "libcomm: sourceRank() is only defined for a receive");
    return source_;
  }
  void set_source(int source) { source_ = source; }  // a receive from any source, once matched
  bool wait(std::chrono::milliseconds timeout) override;

  // The future first, as gloo does: DDP's reducer and comm hooks chain on it.
  void complete(std::exception_ptr error) {
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(error);
  }

  bool started = false;  // taken off the queue (guarded by the executor's queue mutex)

 private:
  std::shared_ptr<Executor> exec_;
  std::vector<at::Tensor> outputs_;
  int source_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A group's libcomm calls, run in issue order by its worker thread, or inline by a thread that
// waits on one of them (a blocking torch.distributed call then has no thread hand-off). Whoever
// makes libcomm calls holds exec_mutex_: comm.h allows one thread at a time per communicator.
// Works hold it too (shared), so a Work that outlives its group stays safe to wait on.
class Executor {
 public:
  struct Job {
    c10::intrusive_ptr<LibcommWork> work;
    std::function<void()> run;                                        // a collective: done when it returns
    std::function<std::function<void()>(comm_request_t*)> start_p2p;  // or a p2p request to start
    Clock::time_point issued = Clock::now();
  };
  static constexpr auto kGrace = std::chrono::microseconds(200);

  Executor(comm_t p2p, int timeout_ms) : p2p_(p2p), timeout_ms_(timeout_ms) {}

  void push(Job job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(!stop_, "libcomm: the process group is being destroyed");
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // Runs the queue's head on this thread until `work` has been taken (by us or by the worker).
  // Point-to-point requests stay with the worker, which starts and tests them on one thread
  // (started here and tested there, a ring of isend/irecv made no progress in our tests).
  void run_until(LibcommWork* work) {
    for (;;) {
      Finished finished;
      {
        std::lock_guard<std::mutex> exec(exec_mutex_);
        Job job;
        if (!pop(&job, work, /*collectives_only=*/true)) return;
        execute(job, &finished);
      }
      complete(finished);
    }
  }

  void worker_loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        auto ready = [&] { return stop_ || !queue_.empty(); };
        if (pending_count_ == 0)
          cv_.wait(lock, ready);
        else
          cv_.wait_for(lock, std::chrono::microseconds(50), ready);
        if (stop_ && queue_.empty() && pending_count_ == 0) return;
        // A collective just issued is most often waited for at once (a blocking dist.all_reduce):
        // leave it to that thread for a moment. Taking it here would make the caller sleep until
        // we finish, and on a loaded machine that wake-up alone cost milliseconds (measured: a
        // 4 MiB all_reduce at 2.2x comm_allreduce's time, load 18 on 2 cores).
        if (!stop_ && !queue_.empty() && queue_.front().run) {
          auto issued = queue_.front().issued;
          cv_.wait_until(lock, issued + kGrace, [&] { return stop_ || queue_.empty() || queue_.front().issued != issued; });
        }
        // Taken by a waiter: do not queue up behind it on exec_mutex_ for the length of its call.
        if (queue_.empty() && pending_count_ == 0) continue;
      }
      Finished finished;
      {
        std::lock_guard<std::mutex> exec(exec_mutex_);
        Job job;
        if (pop(&job, nullptr)) execute(job, &finished);
        poll_p2p(&finished);
      }
      complete(finished);
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
  }

 private:
  // Works are completed after exec_mutex_ is released: completing runs the future's callbacks
  // (DDP's, a comm hook's), which may issue and wait on further calls of this group.
  using Finished = std::vector<std::pair<c10::intrusive_ptr<LibcommWork>, std::exception_ptr>>;
  static void complete(Finished& finished) {
    for (auto& [work, error] : finished) work->complete(error);
  }

  struct Pending {
    comm_request_t req;
    c10::intrusive_ptr<LibcommWork> work;
    std::function<void()> after;
    Clock::time_point deadline;
  };

  // until: stop once that work has been taken; nullptr: take the head if there is one.
  bool pop(Job* job, LibcommWork* until, bool collectives_only = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.empty() || (until != nullptr && until->started)) return false;
    if (collectives_only && !queue_.front().run) return false;
    *job = std::move(queue_.front());
    queue_.pop_front();
    job->work->started = true;
    if (until != nullptr) cv_.notify_all();  // a worker in its grace wait looks again
    return true;
  }

  void execute(Job& job, Finished* finished) {  // exec_mutex_ held
    if (job.run) {
      std::exception_ptr error;
      try {
        job.run();
      } catch (...) {
        error = std::current_exception();
      }
      finished->emplace_back(job.work, error);
      return;
    }
    Pending p{nullptr, job.work, nullptr, Clock::now() + std::chrono::milliseconds(timeout_ms_)};
    try {
      p.after = job.start_p2p(&p.req);
    } catch (...) {
      finished->emplace_back(job.work, std::current_exception());
      return;
    }
    pending_.push_back(std::move(p));
    std::lock_guard<std::mutex> lock(mutex_);
    pending_count_ = pending_.size();
  }

  // libcomm's own deadline ends a request whose peer makes no progress; ours (a little later)
  // only guards against a request that never reports, and breaks the p2p communicator as libcomm would.
  void poll_p2p(Finished* finished) {  // exec_mutex_ held
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      const char* what = p.work->retrieveOpType() == OpType::SEND ? "send" : "recv";
      int done = 0;
      std::exception_ptr error;
      try {
        comm_status_t s = comm_test(p.req, &done);
        if (done && s == COMM_OK) p.after();
        if (done) check(s, what);
        if (!done && Clock::now() > p.deadline + std::chrono::seconds(5)) {
          comm_abort(p2p_);
          comm_wait(p.req);
          done = 1;
          throw std::runtime_error(std::string("libcomm ") + what + ": Timed out (COMM_ERR_TIMEOUT): no completion "
                                   "within the process group's timeout (" + std::to_string(timeout_ms_) + " ms)");
        }
      } catch (...) {
        error = std::current_exception();
      }
      if (!done) {
        ++i;
        continue;
      }
      finished->emplace_back(p.work, error);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    pending_count_ = pending_.size();
  }

  comm_t p2p_;
  int timeout_ms_;
  std::mutex exec_mutex_;
  std::mutex mutex_;  // queue_, stop_, pending_count_, LibcommWork::started
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  size_t pending_count_ = 0;
  std::vector<Pending> pending_;  // exec_mutex_
};

inline bool LibcommWork::wait(std::chrono::milliseconds timeout) {
  exec_->run_until(this);
  return Work::wait(timeout);
}

}  // namespace libcomm_torch
