// What only the shared-memory transport and the per-peer routing have, ranks as threads: every
// size around the channel's boundaries to every peer, copied or read in place (COMM_SHM_CMA),
// the routed transport's view of the hosts, and nothing left in /dev/shm once the segments are
// mapped. transport.h's contract is checked for every transport in transport_conformance.cc.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/shm_fabric.h"
#include "shm/layout.h"
#include "shm/segment.h"
#include "transport.h"

using comm::Status;
using comm::transport::OpTag;
using comm::transport::RequestId;
using comm::transport::Transport;
using namespace comm::testing;

namespace {

using Transports = std::vector<std::unique_ptr<Transport>>;

Transports make(const std::vector<int>& hosts, int timeout_ms) {
  Transports t;
  Status st = make_real_transports(hosts, timeout_ms, &t);
  INFO(st.message());
  REQUIRE(st.ok());
  return t;
}

OpTag tag_of(uint64_t seq, uint64_t count) {
  OpTag t;
  t.seq = seq;
  t.coll = comm::transport::CollKind::kSendRecv;
  t.count = count;
  return t;
}

unsigned char pattern(int from, size_t msg, size_t i) {
  return static_cast<unsigned char>((static_cast<size_t>(from) * 131 + msg * 17 + i * 7) % 251);
}

// Runs fn(rank) on one thread per transport; the statuses in rank order.
template <class F>
std::vector<Status> on_ranks(size_t n, F fn) {
  std::vector<Status> out(n);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = fn(static_cast<int>(r)); });
  for (auto& t : threads) t.join();
  return out;
}

// Every rank sends each size to every other rank, all posted before any wait (more than a
// channel holds), and checks every byte.
void exchange_all_sizes(Transports& ts) {
  const size_t sizes[] = {0, 1, 63, 65535, 65536, 65537, 262144, 262145, 3 << 20};
  const int n = static_cast<int>(ts.size());
  auto st = on_ranks(ts.size(), [&](int r) -> Status {
    Transport& t = *ts[static_cast<size_t>(r)];
    std::vector<std::vector<unsigned char>> out, in;
    std::vector<RequestId> ids;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t m = 0; m < std::size(sizes); ++m) {
        out.emplace_back(sizes[m]);
        for (size_t i = 0; i < sizes[m]; ++i) out.back()[i] = pattern(r, m, i);
        in.emplace_back(sizes[m], 0);
      }
    }
    size_t k = 0;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t m = 0; m < std::size(sizes); ++m, ++k) {
        RequestId a = 0, b = 0;
        COMM_RETURN_IF_ERROR(t.isend(p, tag_of(m, sizes[m]), out[k].data(), sizes[m], &a));
        COMM_RETURN_IF_ERROR(t.irecv(p, tag_of(m, sizes[m]), in[k].data(), sizes[m], &b));
        ids.push_back(a);
        ids.push_back(b);
      }
    }
    COMM_RETURN_IF_ERROR(t.wait(ids.data(), ids.size()));
    k = 0;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (size_t m = 0; m < std::size(sizes); ++m, ++k)
        for (size_t i = 0; i < sizes[m]; ++i)
          if (in[k][i] != pattern(p, m, i))
            return comm::Internal("rank " + std::to_string(r) + ": message " + std::to_string(m) + " from " +
                                  std::to_string(p) + " wrong at byte " + std::to_string(i));
    }
    return Status::Ok();
  });
  for (const auto& s : st) CHECK(s.message() == "");
}

// This process's only (tests/support/shm_fabric.cc names its jobs by pid): unit-shm and
// unit-shm-streaming run this binary side by side, and one saw the other's segments.
size_t job_segments_in_dev_shm() {
  size_t count = 0;
  const std::string mine = "shm-fabric-" + std::to_string(getpid()) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("comm-", 0) == 0 && std::string(e->d_name).find(mine) != std::string::npos)
        ++count;
    closedir(d);
  }
  return count;
}

}  // namespace

TEST_CASE("shm channels: every size arrives intact and in posting order, copied or read in place", "[shm]") {
  for (const char* cma : {"1", "0"}) {
    setenv("COMM_SHM_CMA", cma, 1);
    INFO("COMM_SHM_CMA=" << cma);
    Transports ts = make(one_host(3), 20000);
    CHECK(std::string(ts[0]->name()) == "shm");
    exchange_all_sizes(ts);
  }
  unsetenv("COMM_SHM_CMA");
}

TEST_CASE("routed: ranks on two hosts talk shm inside a host and sockets between, in one wait", "[shm]") {
  Transports ts = make(two_hosts(4), 20000);
  CHECK(std::string(ts[0]->name()) == "shm+socket");
  REQUIRE(ts[0]->local() != nullptr);
  CHECK(ts[0]->local()->local_ranks() == std::vector<int>{0, 2});
  CHECK(ts[1]->local()->local_ranks() == std::vector<int>{1, 3});
  CHECK(ts[3]->local()->host_of() == std::vector<int>{0, 1, 0, 1});
  exchange_all_sizes(ts);
}

TEST_CASE("shm: nothing of the job is left in /dev/shm once every local rank has mapped it", "[shm]") {
  Transports ts = make(one_host(4), 20000);
  CHECK(job_segments_in_dev_shm() == 0);
}

namespace {

// A segment as a rank leaves it when killed before unlinking it: libcomm's header, owner `pid`.
bool plant_segment(const std::string& name, pid_t pid) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return false;
  comm::transport::shm::OwnerPrefix owner{};
  owner.magic = comm::transport::shm::kControlMagic;
  owner.version = comm::transport::shm::kLayoutVersion;
  owner.pid = pid;
  owner.pid_ns = comm::transport::shm::pid_namespace();
  const bool ok = ftruncate(fd, 4096) == 0 && pwrite(fd, &owner, sizeof owner, 0) == sizeof owner;
  close(fd);
  return ok;
}

bool exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

}  // namespace

TEST_CASE("shm: segments of a rank killed before unlinking them are removed at the next init; a live "
          "owner's stay",
          "[shm]") {
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  REQUIRE(dead > 0);
  waitpid(dead, nullptr, 0);
  const std::string tag = std::to_string(getpid());
  const std::string orphan = "/comm-orphantest-" + tag + "-0c", live = "/comm-livetest-" + tag + "-0c";
  REQUIRE(plant_segment(orphan, dead));
  REQUIRE(plant_segment(live, getpid()));
  CHECK(comm::transport::shm::remove_orphans() >= 1);
  CHECK(!exists(orphan));
  CHECK(exists(live));
  shm_unlink(live.c_str());
}

// Issue 15: a segment was created, sized and mapped before its owner was written, and
// remove_orphans skipped a segment without one, so a rank killed in that window left it behind.
TEST_CASE("shm: a rank killed right after creating a segment, before writing its header, leaves nothing after the "
          "next init",
          "[shm]") {
  const std::string name = "/comm-createkill-" + std::to_string(getpid()) + "-0a";
  const pid_t child = fork();
  if (child == 0) {
    comm::transport::shm::Segment s;
    const bool ok = comm::transport::shm::Segment::create(name, 1 << 20, false, &s).ok();
    _exit(ok ? 0 : 1);  // killed: no destructor, nothing unlinked, no header written
  }
  REQUIRE(child > 0);
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  REQUIRE(exists(name));
  CHECK(comm::transport::shm::remove_orphans() >= 1);
  CHECK(!exists(name));
  shm_unlink(name.c_str());
}

TEST_CASE("shm: a segment with no owner written is removed once it is older than the bound, not before", "[shm]") {
  const std::string tag = std::to_string(getpid());
  const std::string old_one = "/comm-unclaimed-old-" + tag + "-0c", fresh = "/comm-unclaimed-new-" + tag + "-0c";
  for (const std::string& name : {old_one, fresh}) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 4096) == 0);  // sized, header all zero: its creator died before its claim
    if (name == old_one) {
      timespec times[2];
      clock_gettime(CLOCK_REALTIME, &times[0]);
      times[0].tv_sec -= 120;
      times[1] = times[0];
      REQUIRE(futimens(fd, times) == 0);
    }
    close(fd);
  }
  comm::transport::shm::remove_orphans();  // the default bound: 60 s
  CHECK(!exists(old_one));
  CHECK(exists(fresh));
  shm_unlink(old_one.c_str());
  shm_unlink(fresh.c_str());
}
