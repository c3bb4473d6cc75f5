// comm_shrink in real processes (issue 15, "Carry on"): 4 ranks, one SIGKILLed while the others
// wait for it in an all-reduce; the survivors get the error, shrink without it and run checked
// all-reduces on the 3 that are left, over sockets and over shared memory, also when the dead
// rank is rank 0, whose process served the rendezvous store. Then a healthy shrink and bad input
// (excluding oneself, out of range, lists that differ): each a clear error within the timeout.
#include <sstream>

#include "process_harness.h"

using namespace abi;

namespace {

struct ShrinkLine {
  int status = -1;
  long ms = -1;
  int new_rank = -1, new_size = -1;
};

std::optional<ShrinkLine> shrink_line(const std::string& out) {
  auto s = line_after(out, "SHRINK ");
  if (!s) return std::nullopt;
  ShrinkLine l;
  std::istringstream(*s) >> l.status >> l.ms >> l.new_rank >> l.new_size;
  return l;
}

int int_after(const std::string& out, const std::string& prefix) {
  auto s = line_after(out, prefix);
  return s ? std::atoi(s->c_str()) : -100;
}

// The survivors of a SIGKILL of `victim` shrink to n-1 ranks, renumbered in old order, and
// compute bitwise-identical, correct all-reduces; the old communicator then refuses calls.
void kill_then_shrink(const std::string& transport, int victim) {
  TempDir dir;
  const int n = 4, timeout_ms = 5000;
  const int port = free_port();
  Job job = run_job(dir, "shrink", n, [&](int r) {
    return torchrun_env(r, n, port, timeout_ms, {{"COMM_TRANSPORT", transport}, {"SHRINK_VICTIM", std::to_string(victim)}});
  }, 60000);
  INFO(transport << ", victim rank " << victim << ":\n" << describe_all(job.procs));
  CHECK(job.ended);
  CHECK((WIFSIGNALED(job.procs[victim].wstatus) && WTERMSIG(job.procs[victim].wstatus) == SIGKILL));
  std::vector<Proc> survivors;
  int expected_rank = 0;
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string out = job.procs[r].output();
    INFO("survivor rank " << r);
    const int end = int_after(out, "END ");
    CHECK((end == COMM_ERR_REMOTE || end == COMM_ERR_TIMEOUT));  // it saw the death
    auto s = shrink_line(out);
    REQUIRE(s.has_value());
    CHECK(s->status == COMM_OK);
    CHECK(s->new_rank == expected_rank++);  // dense, in the old order
    CHECK(s->new_size == n - 1);
    CHECK(int_after(out, "OLD ") == COMM_ERR_INVALID_USAGE);  // the old one can only be destroyed
    CHECK(line_after(out, "OLDMSG ").value_or("").find("comm_destroy") != std::string::npos);
    survivors.push_back(job.procs[r]);
  }
  check_done_and_identical(survivors, 3, /*every_label_on_rank0=*/true);
}

}  // namespace

TEST_CASE("shrink processes: 4 ranks over sockets, rank 2 SIGKILLed mid-all-reduce: the 3 survivors shrink and "
          "all-reduce correctly", "[shrink_process]") {
  kill_then_shrink("socket", 2);
}

TEST_CASE("shrink processes: 4 ranks over shared memory, rank 1 SIGKILLed mid-all-reduce: the 3 survivors shrink and "
          "all-reduce correctly", "[shrink_process]") {
  kill_then_shrink("shm", 1);
}

TEST_CASE("shrink processes: rank 0, whose process served the store, SIGKILLed: the survivors meet at rank 1's store "
          "and all-reduce correctly (sockets and shared memory)", "[shrink_process]") {
  kill_then_shrink("socket", 0);
  kill_then_shrink("shm", 0);
}

TEST_CASE("shrink processes: a healthy communicator shrinks; the excluded rank leaves", "[shrink_process]") {
  TempDir dir;
  const int n = 4;
  const int port = free_port();
  Job job = run_job(dir, "shrink", n, [&](int r) {
    return torchrun_env(r, n, port, 10000, {{"COMM_TRANSPORT", "socket"}, {"SHRINK_EXCLUDE", "1"}});
  }, 60000);
  INFO(describe_all(job.procs));
  CHECK(job.ended);
  CHECK(line_after(job.procs[1].output(), "LEFT").has_value());
  std::vector<Proc> survivors;
  for (int r : {0, 2, 3}) {
    auto s = shrink_line(job.procs[r].output());
    REQUIRE(s.has_value());
    CHECK(s->status == COMM_OK);
    CHECK(s->new_size == 3);
    survivors.push_back(job.procs[r]);
  }
  check_done_and_identical(survivors, 3, true);
}

TEST_CASE("shrink processes: excluding oneself or a rank out of range is COMM_ERR_INVALID_ARGUMENT at once, on every "
          "rank", "[shrink_process]") {
  TempDir dir;
  // A timeout far above what a busy host adds to starting 3 processes: a rank that waited for
  // another would show.
  const int n = 3, timeout_ms = 3 * loaded_host::kSlackMs;
  for (const std::string which : {"self", "range"}) {
    const int port = free_port();
    const double t0 = now_ms();
    Job job = run_job(dir, "shrink", n, [&](int r) {
      Env extra = {{"COMM_TRANSPORT", "socket"}, {"SHRINK_SELF", "1"}};
      extra.emplace_back("SHRINK_EXCLUDE", which == "self" ? std::to_string(r) : "7");
      return torchrun_env(r, n, port, timeout_ms, extra);
    }, 2 * timeout_ms);
    INFO(which << ":\n" << describe_all(job.procs));
    CHECK(job.ended);
    CHECK(now_ms() - t0 < timeout_ms);  // none waited for anyone
    for (int r = 0; r < n; ++r) {
      const std::string out = job.procs[r].output();
      auto s = shrink_line(out);
      REQUIRE(s.has_value());
      CHECK(s->status == COMM_ERR_INVALID_ARGUMENT);
      const std::string msg = line_after(out, "MSG ").value_or("");
      CHECK(msg.find("rank " + std::to_string(r)) != std::string::npos);
      CHECK(msg.find(which == "self" ? "excludes itself" : "excluded rank 7") != std::string::npos);
    }
  }
}

TEST_CASE("shrink processes: survivors that pass different lists all fail with COMM_ERR_INVALID_USAGE naming the "
          "lists, within the timeout", "[shrink_process]") {
  TempDir dir;
  const int n = 4, timeout_ms = 5000;
  const int port = free_port();
  const double t0 = now_ms();
  // Ranks 0 and 1 exclude 3; rank 2 excludes nobody; rank 3 leaves.
  Job job = run_job(dir, "shrink", n, [&](int r) {
    return torchrun_env(r, n, port, timeout_ms,
                        {{"COMM_TRANSPORT", "socket"}, {"SHRINK_EXCLUDE", "3"}, {"SHRINK_EXCLUDE_2", ""}});
  }, 60000);
  INFO(describe_all(job.procs));
  CHECK(job.ended);
  CHECK(now_ms() - t0 < timeout_ms + loaded_host::kSlackMs);  // within the timeout, not a hang
  for (int r : {0, 1, 2}) {
    const std::string out = job.procs[r].output();
    INFO("rank " << r);
    auto s = shrink_line(out);
    REQUIRE(s.has_value());
    CHECK(s->status == COMM_ERR_INVALID_USAGE);
    const std::string msg = line_after(out, "MSG ").value_or("");
    CHECK(msg.find("disagree") != std::string::npos);
    CHECK(msg.find("rank 2 excludes []") != std::string::npos);
  }
}
