// What each transport counts as a lost peer (transports/transport.h): lost_peers (the agreement's
// suspicions on a live communicator), closed_peers (the same once nobody reads the heartbeats) and
// gone_peers (a set-up's or a shrink's watch, libcomm/src/setup_watch.h). A peer that idle
// detection convicted of silence is lost and closed, but never gone: a rank stopped for a while
// that took part in the agreement since is alive, and a watch that took it for dead failed every
// shrink attempt of the survivors (issue 35). And what the hang trace reads (silent_ms): a socket
// peer whose heartbeats wait unread is heard, not silent.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/shm_fabric.h"
#include "transport.h"

using comm::Status;
using comm::transport::CollKind;
using comm::transport::OpTag;
using comm::transport::RequestId;
using comm::transport::Transport;
using namespace comm::testing;

namespace {

// One byte each way between ranks 0 and 1: connects them (a lazy socket mesh dials at first use,
// and silence is judged on a connection only).
void exchange(std::vector<std::unique_ptr<Transport>>& ts) {
  std::vector<Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Transport& t = *ts[static_cast<size_t>(r)];
      OpTag tag;
      tag.seq = 1;
      tag.coll = CollKind::kSendRecv;
      tag.count = 1;
      char out = static_cast<char>(r), in = 0;
      RequestId ids[2] = {0, 0};
      Status s = t.isend(1 - r, tag, &out, 1, &ids[0]);
      if (s.ok()) s = t.irecv(1 - r, tag, &in, 1, &ids[1]);
      if (s.ok()) s = t.wait(ids, 2);
      st[static_cast<size_t>(r)] = s;
    });
  for (auto& t : threads) t.join();
  for (const Status& s : st) REQUIRE(s.message() == "");
}

std::vector<int> peers(Transport& t, void (Transport::*which)(std::vector<int>*)) {
  std::vector<int> out;
  (t.*which)(&out);
  return out;
}

// Two ranks; rank 1 never beats (no watcher runs here), so rank 0's idle detection convicts it
// once the silence limit passed (transports/common/silence.h: at least 2.2 s with these settings).
void silenced_peer_is_not_gone(const std::string& kind) {
  std::vector<std::unique_ptr<Transport>> ts;
  Status made = make_real_transports(one_host(2), /*timeout_ms=*/500, &ts, kind, kind, /*heartbeat_ms=*/100);
  INFO(kind << ": " << made.message());
  REQUIRE(made.ok());
  exchange(ts);
  Transport& t = *ts[0];
  CHECK(peers(t, &Transport::gone_peers).empty());  // nothing yet
  Status idle;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);  // a busy host's slack
  while (idle.ok() && std::chrono::steady_clock::now() < give_up) {
    idle = t.check_idle();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO(idle.message());
  REQUIRE(!idle.ok());
  CHECK(idle.message().find("rank 1") != std::string::npos);
  CHECK(peers(t, &Transport::lost_peers) == std::vector<int>{1});
  CHECK(peers(t, &Transport::closed_peers) == std::vector<int>{1});
  CHECK(peers(t, &Transport::gone_peers).empty());  // its process is alive, its connections open
}

}  // namespace

TEST_CASE("lost peers: shared memory: a peer silenced by idle detection is lost and closed, never gone", "[shm]") {
  silenced_peer_is_not_gone("shm");
}

TEST_CASE("lost peers: sockets: a peer silenced by idle detection is lost and closed, never gone", "[socket]") {
  silenced_peer_is_not_gone("socket");
}

// The hang trace takes a peer silent past a few heartbeats for the stalled one (libcomm/src/blame.cc,
// silent_ms). A rank that did not read its sockets meanwhile (routed: its call waited in the
// shared-memory part) has the peer's beats unread in the socket: the peer was heard. Only lower
// bounds of time here: each side slept at least 1.5 s (15 heartbeats, past the trace's 1 s).
TEST_CASE("silence: sockets: a peer whose heartbeats wait unread is heard; one that sent nothing is silent",
          "[socket]") {
  std::vector<std::unique_ptr<Transport>> ts;
  Status made = make_real_transports(one_host(2), /*timeout_ms=*/10000, &ts, "socket", "socket", /*heartbeat_ms=*/100);
  INFO(made.message());
  REQUIRE(made.ok());
  exchange(ts);
  // Rank 1 beats (as its watcher does), rank 0 reads nothing meanwhile.
  const auto beat_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < beat_until) {
    ts[1]->beat();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(ts[0]->silent_ms(1) == 0);  // the beats wait in the socket: heard (was >= 1500: unread)
  // Rank 0 never beat: nothing waits at rank 1, which heard rank 0 last at the exchange.
  CHECK(ts[1]->silent_ms(0) >= 1500);
}
