// Which algorithm a call gets, pinned over a grid: every collective x size x rank count x wire
// (no direct access, every rank on one host, ranks spread over hosts), plus how a forced name
// (COMM_ALGO) and a tuning profile entry override the default rules and fall back. The choice
// decides bandwidth and latency, and every rank must make the same one: a change here is a
// change of behaviour, never a side effect of a refactor. No traffic: select() only.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "support/collective_check.h"

using comm::Status;
using comm::algo::Algorithm;
using comm::algo::CollArgs;
using comm::algo::Context;
using comm::transport::CollKind;
using comm::transport::LocalAccess;
using comm::transport::OpTag;
using comm::transport::RequestId;

namespace {

// The layout a shared-memory transport would report; selection reads only the geometry.
class GeometryOnly final : public LocalAccess {
 public:
  GeometryOnly(const std::vector<int>& host_of, int rank) : host_of_(host_of) {
    for (int r = 0; r < static_cast<int>(host_of.size()); ++r)
      if (host_of[r] == host_of[rank]) {
        if (r == rank) index_ = static_cast<int>(local_.size());
        local_.push_back(r);
      }
    std::vector<int> per_host;
    for (int h : host_of) {
      if (h >= static_cast<int>(per_host.size())) per_host.resize(h + 1, 0);
      ++per_host[h];
    }
    hosts_ = static_cast<int>(per_host.size());
    rph_ = per_host[0];
    for (int c : per_host)
      if (c != rph_) rph_ = 0;
  }
  const std::vector<int>& local_ranks() const override { return local_; }
  int local_index() const override { return index_; }
  const std::vector<int>& host_of() const override { return host_of_; }
  int hosts() const override { return hosts_; }
  int ranks_per_host() const override { return rph_; }
  Status begin(const OpTag&) override { return Status::Ok(); }
  size_t slot_bytes() const override { return 16384; }  // COMM_SHM_SLOT_BYTES' default
  char* slot(int) override { return nullptr; }
  Status post() override { return Status::Ok(); }
  Status wait_posted(int) override { return Status::Ok(); }
  Status expose(const void*, void*, size_t, size_t) override { return Status::Ok(); }
  const char* mapped_input(int) override { return nullptr; }
  const char* mapped_output(int) override { return nullptr; }
  char* in_slot(int, uint64_t, int) override { return nullptr; }
  char* out_slot(int, uint64_t) override { return nullptr; }
  uint64_t ring_depth() const override { return 1; }
  void publish(Mark, uint64_t) override {}
  Status wait_mark(int, Mark, uint64_t) override { return Status::Ok(); }
  Status finish() override { return Status::Ok(); }
  void count_bytes(int, uint64_t, uint64_t) override {}

 private:
  std::vector<int> host_of_, local_;
  int index_ = 0, hosts_ = 1, rph_ = 0;
};

comm::transport::Options options_for(int rank, int n) {
  comm::transport::Options o;
  o.rank = rank;
  o.size = n;
  return o;
}

// A transport that moves nothing: what select() sees of a socket or shm communicator.
class NoTraffic final : public comm::transport::Transport {
 public:
  NoTraffic(int rank, int n, const std::vector<int>* host_of) : Transport(options_for(rank, n)) {
    if (host_of != nullptr) local_ = std::make_unique<GeometryOnly>(*host_of, rank);
  }
  const char* name() const override { return "none"; }
  Status post_request(const Post&, RequestId*) override { return Status::Ok(); }
  Status wait(const RequestId*, size_t) override { return Status::Ok(); }
  Status test(RequestId, bool* done) override {
    *done = true;
    return Status::Ok();
  }
  void notify_peers(const Status&, uint64_t) override {}
  void abort() override {}
  LocalAccess* local() override { return local_.get(); }

 private:
  std::unique_ptr<GeometryOnly> local_;
};

enum class Wire { kSocket, kOneHost, kTwoHosts, kPairs };
const char* wire_name(Wire w) {
  switch (w) {
    case Wire::kSocket: return "socket";
    case Wire::kOneHost: return "one-host";
    case Wire::kTwoHosts: return "two-hosts";
    case Wire::kPairs: return "pairs";
  }
  return "?";
}

// Every rank's host: one host; two hosts with ranks alternating (as a communicator over two
// machines numbered round-robin); hosts of two consecutive ranks each.
std::vector<int> hosts_for(Wire w, int n) {
  std::vector<int> h(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) h[r] = w == Wire::kTwoHosts ? r % 2 : w == Wire::kPairs ? r / 2 : 0;
  return h;
}

const CollKind kKinds[] = {CollKind::kAllreduce,     CollKind::kBroadcast, CollKind::kReduce,
                           CollKind::kAllgather,     CollKind::kReduceScatter,
                           CollKind::kAlltoall,      CollKind::kBarrier,   CollKind::kSendRecv};
const size_t kSizes[] = {0, 8, 4096, 65536, 1 << 20, 64 << 20};  // bytes of the call's buffer (count x 4)
const int kRanks[] = {2, 3, 4, 8};
const Wire kWires[] = {Wire::kSocket, Wire::kOneHost, Wire::kTwoHosts, Wire::kPairs};

struct Call {
  CollKind kind;
  size_t bytes;
  int ranks;
  Wire wire;
  std::string comm_algo;  // COMM_ALGO
  std::string profile;    // the tuning profile entry's algo for this call
};

// What every rank of the call picks: the name, or "error: ..." / "ranks disagree".
std::string chosen(const Call& call) {
  const std::vector<int> hosts = hosts_for(call.wire, call.ranks);
  std::string first;
  for (int r = 0; r < call.ranks; ++r) {
    NoTraffic t(r, call.ranks, call.wire == Wire::kSocket ? nullptr : &hosts);
    Context ctx{t, r, call.ranks, comm::testing::rank_scratch(0), comm::testing::kDefaultChunk};
    CollArgs a;
    a.kind = call.kind;
    a.count = call.bytes / 4;
    a.dtype = COMM_FLOAT32;
    a.peer = r == 0 ? 1 : 0;
    a.tag.coll = call.kind;
    a.tag.count = a.count;
    const Algorithm* algo = nullptr;
    comm::algo::Overrides overrides;
    overrides.forced = call.comm_algo;
    overrides.profile = call.profile;
    overrides.profile_source = "tuning profile entry #0";
    Status st = comm::algo::select(ctx, a, overrides, &algo);
    const std::string name = st.ok() ? std::string(algo->name) : "error: " + st.message();
    if (r == 0) first = name;
    if (name != first) return "ranks disagree: " + first + " / " + name;
  }
  return first;
}

// One line per collective, wire and rank count: the choice at each size of kSizes.
std::string grid() {
  std::ostringstream out;
  for (CollKind kind : kKinds)
    for (Wire w : kWires)
      for (int n : kRanks) {
        out << comm::transport::coll_name(kind) << ' ' << wire_name(w) << ' ' << n << ':';
        for (size_t bytes : kSizes) out << ' ' << chosen({kind, bytes, n, w, "", ""});
        out << '\n';
      }
  return out.str();
}

// The choices as they were before selection moved into algorithms/select.cc (issue 13), with
// COMM_SMALL_MSG_BYTES and COMM_SHM_SLOT_BYTES at their defaults; sizes 0, 8, 4K, 64K, 1M, 64M.
const char* kPinned = R"(
allreduce socket 2: recursive_doubling recursive_doubling recursive_doubling recursive_doubling ring ring
allreduce socket 3: recursive_doubling recursive_doubling recursive_doubling recursive_doubling ring ring
allreduce socket 4: recursive_doubling recursive_doubling recursive_doubling recursive_doubling ring ring
allreduce socket 8: recursive_doubling recursive_doubling recursive_doubling recursive_doubling ring ring
allreduce one-host 2: shm_slots shm_slots shm_slots shm_direct shm_direct shm_direct
allreduce one-host 3: shm_slots shm_slots shm_slots shm_direct shm_direct shm_direct
allreduce one-host 4: shm_slots shm_slots shm_slots shm_direct shm_direct shm_direct
allreduce one-host 8: shm_slots shm_slots shm_slots shm_direct shm_direct shm_direct
allreduce two-hosts 2: recursive_doubling recursive_doubling recursive_doubling recursive_doubling ring ring
allreduce two-hosts 3: recursive_doubling recursive_doubling recursive_doubling recursive_doubling ring ring
allreduce two-hosts 4: recursive_doubling recursive_doubling recursive_doubling recursive_doubling hierarchical hierarchical
allreduce two-hosts 8: recursive_doubling recursive_doubling recursive_doubling recursive_doubling hierarchical hierarchical
allreduce pairs 2: shm_slots shm_slots shm_slots shm_direct shm_direct shm_direct
allreduce pairs 3: recursive_doubling recursive_doubling recursive_doubling recursive_doubling ring ring
allreduce pairs 4: recursive_doubling recursive_doubling recursive_doubling recursive_doubling hierarchical hierarchical
allreduce pairs 8: recursive_doubling recursive_doubling recursive_doubling recursive_doubling hierarchical hierarchical
broadcast socket 2: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast socket 3: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast socket 4: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast socket 8: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast one-host 2: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast one-host 3: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast one-host 4: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast one-host 8: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast two-hosts 2: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast two-hosts 3: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast two-hosts 4: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast two-hosts 8: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast pairs 2: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast pairs 3: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast pairs 4: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
broadcast pairs 8: binomial_tree binomial_tree binomial_tree binomial_tree pipelined_chain pipelined_chain
reduce socket 2: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce socket 3: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce socket 4: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce socket 8: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce one-host 2: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce one-host 3: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce one-host 4: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce one-host 8: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce two-hosts 2: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce two-hosts 3: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce two-hosts 4: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce two-hosts 8: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce pairs 2: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce pairs 3: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce pairs 4: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
reduce pairs 8: binomial_tree binomial_tree binomial_tree binomial_tree ring ring
allgather socket 2: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather socket 3: ring ring ring ring ring ring
allgather socket 4: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather socket 8: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather one-host 2: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather one-host 3: ring ring ring ring ring ring
allgather one-host 4: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather one-host 8: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather two-hosts 2: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather two-hosts 3: ring ring ring ring ring ring
allgather two-hosts 4: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather two-hosts 8: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather pairs 2: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather pairs 3: ring ring ring ring ring ring
allgather pairs 4: recursive_doubling recursive_doubling recursive_doubling ring ring ring
allgather pairs 8: recursive_doubling recursive_doubling recursive_doubling ring ring ring
reduce_scatter socket 2: ring ring ring ring ring ring
reduce_scatter socket 3: ring ring ring ring ring ring
reduce_scatter socket 4: ring ring ring ring ring ring
reduce_scatter socket 8: ring ring ring ring ring ring
reduce_scatter one-host 2: ring ring ring ring ring ring
reduce_scatter one-host 3: ring ring ring ring ring ring
reduce_scatter one-host 4: ring ring ring ring ring ring
reduce_scatter one-host 8: ring ring ring ring ring ring
reduce_scatter two-hosts 2: ring ring ring ring ring ring
reduce_scatter two-hosts 3: ring ring ring ring ring ring
reduce_scatter two-hosts 4: ring ring ring ring ring ring
reduce_scatter two-hosts 8: ring ring ring ring ring ring
reduce_scatter pairs 2: ring ring ring ring ring ring
reduce_scatter pairs 3: ring ring ring ring ring ring
reduce_scatter pairs 4: ring ring ring ring ring ring
reduce_scatter pairs 8: ring ring ring ring ring ring
alltoall socket 2: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall socket 3: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall socket 4: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall socket 8: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall one-host 2: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall one-host 3: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall one-host 4: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall one-host 8: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall two-hosts 2: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall two-hosts 3: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall two-hosts 4: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall two-hosts 8: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall pairs 2: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall pairs 3: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall pairs 4: pairwise pairwise pairwise pairwise pairwise pairwise
alltoall pairs 8: pairwise pairwise pairwise pairwise pairwise pairwise
barrier socket 2: dissemination dissemination dissemination dissemination dissemination dissemination
barrier socket 3: dissemination dissemination dissemination dissemination dissemination dissemination
barrier socket 4: dissemination dissemination dissemination dissemination dissemination dissemination
barrier socket 8: dissemination dissemination dissemination dissemination dissemination dissemination
barrier one-host 2: dissemination dissemination dissemination dissemination dissemination dissemination
barrier one-host 3: dissemination dissemination dissemination dissemination dissemination dissemination
barrier one-host 4: dissemination dissemination dissemination dissemination dissemination dissemination
barrier one-host 8: dissemination dissemination dissemination dissemination dissemination dissemination
barrier two-hosts 2: dissemination dissemination dissemination dissemination dissemination dissemination
barrier two-hosts 3: dissemination dissemination dissemination dissemination dissemination dissemination
barrier two-hosts 4: dissemination dissemination dissemination dissemination dissemination dissemination
barrier two-hosts 8: dissemination dissemination dissemination dissemination dissemination dissemination
barrier pairs 2: dissemination dissemination dissemination dissemination dissemination dissemination
barrier pairs 3: dissemination dissemination dissemination dissemination dissemination dissemination
barrier pairs 4: dissemination dissemination dissemination dissemination dissemination dissemination
barrier pairs 8: dissemination dissemination dissemination dissemination dissemination dissemination
send/recv socket 2: direct direct direct direct direct direct
send/recv socket 3: direct direct direct direct direct direct
send/recv socket 4: direct direct direct direct direct direct
send/recv socket 8: direct direct direct direct direct direct
send/recv one-host 2: direct direct direct direct direct direct
send/recv one-host 3: direct direct direct direct direct direct
send/recv one-host 4: direct direct direct direct direct direct
send/recv one-host 8: direct direct direct direct direct direct
send/recv two-hosts 2: direct direct direct direct direct direct
send/recv two-hosts 3: direct direct direct direct direct direct
send/recv two-hosts 4: direct direct direct direct direct direct
send/recv two-hosts 8: direct direct direct direct direct direct
send/recv pairs 2: direct direct direct direct direct direct
send/recv pairs 3: direct direct direct direct direct direct
send/recv pairs 4: direct direct direct direct direct direct
send/recv pairs 8: direct direct direct direct direct direct
)";

}  // namespace

TEST_CASE("selection: every collective, size, rank count and wire gets the algorithm it always got",
          "[algorithms][selection]") {
  if (std::getenv("COMM_SMALL_MSG_BYTES") || std::getenv("COMM_ALGO")) return;  // the pins assume defaults
  const std::string now = grid();
  if (std::getenv("COMM_PRINT_SELECTION")) std::fputs(now.c_str(), stdout);
  std::istringstream want(kPinned), got(now);
  std::string w, g;
  while (std::getline(want, w)) {
    if (w.empty()) continue;
    REQUIRE(std::getline(got, g));
    CHECK(g == w);
  }
  CHECK_FALSE(std::getline(got, g));
}

TEST_CASE("selection: COMM_ALGO and a profile entry override the default rules and fall back like it",
          "[algorithms][selection]") {
  if (std::getenv("COMM_SMALL_MSG_BYTES") || std::getenv("COMM_ALGO")) return;
  const size_t k64 = 65536, m1 = 1 << 20;
  // Forced and runnable: taken, whatever the size rule says.
  CHECK(chosen({CollKind::kAllreduce, 8, 4, Wire::kSocket, "ring", ""}) == "ring");
  CHECK(chosen({CollKind::kAllreduce, m1, 4, Wire::kOneHost, "recursive_doubling", ""}) == "recursive_doubling");
  CHECK(chosen({CollKind::kAllreduce, m1, 4, Wire::kSocket, "", "recursive_doubling"}) == "recursive_doubling");
  CHECK(chosen({CollKind::kBroadcast, 8, 3, Wire::kSocket, "pipelined_chain", ""}) == "pipelined_chain");
  CHECK(chosen({CollKind::kAllreduce, m1, 8, Wire::kTwoHosts, "hierarchical", ""}) == "hierarchical");
  // COMM_ALGO before the profile's (the profile drops its algo when COMM_ALGO is set anyway).
  CHECK(chosen({CollKind::kAllreduce, 8, 4, Wire::kSocket, "ring", "recursive_doubling"}) == "ring");
  // Forced but "not me": the default rules decide.
  CHECK(chosen({CollKind::kAllreduce, m1, 4, Wire::kOneHost, "shm_slots", ""}) == "shm_direct");
  CHECK(chosen({CollKind::kAllreduce, k64, 4, Wire::kOneHost, "", "shm_slots"}) == "shm_direct");
  CHECK(chosen({CollKind::kAllreduce, 8, 4, Wire::kSocket, "shm_direct", ""}) == "recursive_doubling");
  CHECK(chosen({CollKind::kAllreduce, m1, 3, Wire::kTwoHosts, "hierarchical", ""}) == "ring");
  CHECK(chosen({CollKind::kAllgather, 8, 3, Wire::kSocket, "recursive_doubling", ""}) == "ring");
  // A name of another collective leaves this one to the default rules.
  CHECK(chosen({CollKind::kBarrier, 0, 3, Wire::kSocket, "ring", ""}) == "dissemination");
  CHECK(chosen({CollKind::kAlltoall, 8, 4, Wire::kSocket, "ring", ""}) == "pairwise");
  // An unknown name is refused, naming the known ones.
  const std::string unknown = chosen({CollKind::kAllreduce, 8, 2, Wire::kSocket, "ringg", ""});
  CHECK(unknown.rfind("error: ", 0) == 0);
  CHECK(unknown.find("recursive_doubling") != std::string::npos);
}
