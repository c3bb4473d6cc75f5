// A dial knows whom it reached (socket/wire.h, protocol 5; docs/topology.md, "Messy networks"):
// a peer's published addresses may lead elsewhere first, as a Docker bridge's 172.17.0.1 leads
// every host to itself. Real transports on loopback: rank 1 of one world is told that rank 0's
// addresses are, in order, another world's rank 1 (same secret: a listener of the wrong rank),
// that world's rank 0 (another communicator: its proof binds another label), then rank 0's own.
// Rank 1 must move past both to the real rank 0, without blaming it, and the other world must
// go on unharmed (rank 0's own dial is sent to a listener that never answers, so rank 1's is
// the one that connects). Before protocol 5 the first address alone was dialed and either authenticated
// as rank 0 (same job) or failed the peer.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "interfaces.h"
#include "posix/endpoints.h"
#include "socket/socket_transport.h"
#include "socket/wire.h"
#include "store/store.h"
#include "support/socket_options.h"
#include "support/store_helpers.h"
#include "support/transport_test.h"
#include "transport.h"

using namespace comm;
using namespace comm::testing;
using namespace comm::transport;

namespace {

const std::string kSecret = "one-job-secret";

// options_for (support/socket_options.h) under a communicator label of its own.
Options options(int rank, std::shared_ptr<Store> store, const std::string& label) {
  Options o = options_for(rank, 2, std::move(store), kSocketTestTimeoutMs, kSecret);
  o.comm_label = label;
  return o;
}

Status exchange(Transport& from, int to_rank, Transport& to, int from_rank, uint64_t value, uint64_t* got) {
  RequestId send_id, recv_id;
  COMM_RETURN_IF_ERROR(from.isend(to_rank, tag(1, 1), &value, sizeof value, &send_id));
  COMM_RETURN_IF_ERROR(to.irecv(from_rank, tag(1, 1), got, sizeof *got, &recv_id));
  Status sent;
  std::thread sender([&] { sent = from.wait(&send_id, 1); });
  Status received = to.wait(&recv_id, 1);
  sender.join();
  COMM_RETURN_IF_ERROR(sent);
  return received;
}

}  // namespace

TEST_CASE("a dial that reaches the wrong rank or communicator moves on to the peer's next address", "[socket]") {
  // The other world: label "other", the same secret (as every communicator of one job has).
  auto other_store = memory_store(unique_store_name());
  std::unique_ptr<Transport> other0, other1;
  Status made_o0, made_o1;
  std::thread o0([&] { made_o0 = create_socket_transport(options(0, other_store, "other"), &other0); });
  std::thread o1([&] { made_o1 = create_socket_transport(options(1, other_store, "other"), &other1); });
  o0.join();
  o1.join();
  REQUIRE(made_o0.ok());
  REQUIRE(made_o1.ok());

  // This world, each rank with its own store so the test can write what rank 1 reads.
  auto store0 = memory_store(unique_store_name());
  auto store1 = memory_store(unique_store_name());
  std::unique_ptr<Transport> t0, t1;
  Status made0, made1;
  std::thread make0([&] { made0 = create_socket_transport(options(0, store0, "test"), &t0); });
  std::thread make1([&] { made1 = create_socket_transport(options(1, store1, "test"), &t1); });
  const std::string addr0 = published_address_of(store0, 0);
  std::string addr1;
  REQUIRE(store1->get("addr/1", &addr1, Deadline::after_ms(10000)).ok());
  const std::string lookalikes = "br-1a2b3c4d/" + published_address_of(other_store, 1) + ",br-1a2b3c4d/" +
                                 published_address_of(other_store, 0) + ",lo/" + addr0;
  // Rank 0 is told a rank 1 address that accepts TCP and never answers: its own dial hangs,
  // so the connection that comes up is rank 1's, through the look-alikes.
  posix::Fd silent;
  posix::SockAddr silent_at;
  REQUIRE(posix::listen_on("127.0.0.1", AF_INET, 4, &silent, &silent_at).ok());
  REQUIRE(store0->set("addr/1", "lo/" + posix::format_address(silent_at)).ok());
  REQUIRE(store1->set("addrs", lookalikes + "\n" + addr1).ok());
  make0.join();
  make1.join();
  INFO(made0.message() << " / " << made1.message());
  REQUIRE(made0.ok());
  REQUIRE(made1.ok());

  // The other world's ranks wait on each other, so their listeners answer the stray dials
  // (kWrongRank from its rank 1, kBadSecret from its rank 0) instead of leaving them unanswered.
  uint64_t never0 = 0, never1 = 0;
  RequestId wait0, wait1;
  REQUIRE(other0->irecv(1, tag(9, 1), &never0, sizeof never0, &wait0).ok());
  REQUIRE(other1->irecv(0, tag(9, 1), &never1, sizeof never1, &wait1).ok());
  Status other_status0, other_status1;
  std::thread serve0([&] { other_status0 = other0->wait(&wait0, 1); });
  std::thread serve1([&] { other_status1 = other1->wait(&wait1, 1); });

  // Rank 1 dials rank 0 through the look-alikes.
  uint64_t got = 0;
  Status st = exchange(*t1, 0, *t0, 1, 0x10047A11CEull, &got);
  INFO(st.message());
  CHECK(st.ok());
  CHECK(got == 0x10047A11CEull);

  // The other world was dialed by a stranger twice and is none the worse: its waits end only
  // by the abort.
  other0->abort();
  other1->abort();
  serve0.join();
  serve1.join();
  INFO(other_status0.message() << " / " << other_status1.message());
  CHECK(other_status0.code() == COMM_ERR_ABORTED);
  CHECK(other_status1.code() == COMM_ERR_ABORTED);
}

// Protocol 5 against 4, both ways: a listener of this version answers an old Hello kBadVersion
// with its version, and a dial that meets an old listener fails naming both versions (an old
// peer reads the version from the first 12 bytes, as every version did, and answers so).
TEST_CASE("a peer of wire protocol 4 is refused clearly, both ways", "[socket]") {
  auto store = memory_store(unique_store_name());
  std::unique_ptr<Transport> t0, t1;
  Status made0, made1;
  // Rank 1 is told rank 0 lives at an "old libcomm": a listener that answers every Hello with
  // version 4's kBadVersion.
  posix::Fd old;
  posix::SockAddr old_at;
  REQUIRE(posix::listen_on("127.0.0.1", AF_INET, 4, &old, &old_at).ok());
  std::thread old_peer([&] {
    pollfd ready{old.get(), POLLIN, 0};  // the listener is non-blocking
    if (::poll(&ready, 1, 10000) != 1) return;
    int fd = ::accept4(old.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    char hello[12];
    if (::recv(fd, hello, sizeof hello, MSG_WAITALL) == static_cast<ssize_t>(sizeof hello)) {
      const sock::Reply r{sock::kReplyMagic, static_cast<uint32_t>(sock::ReplyCode::kBadVersion), 4};
      (void)::send(fd, &r, sizeof r, MSG_NOSIGNAL);
    }
    // Closed once the dialer has read the reply and hung up: a close with the rest of its Hello
    // unread would reset the connection, and a reset may overtake the reply.
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char rest[64];
    while (::recv(fd, rest, sizeof rest, 0) > 0) {
    }
    ::close(fd);
  });
  auto store1 = memory_store(unique_store_name());
  std::thread make0([&] { made0 = create_socket_transport(options(0, store, "test"), &t0); });
  std::thread make1([&] { made1 = create_socket_transport(options(1, store1, "test"), &t1); });
  std::string addr1;
  REQUIRE(store1->get("addr/1", &addr1, Deadline::after_ms(10000)).ok());
  REQUIRE(store->set("addr/1", addr1).ok());
  REQUIRE(store1->set("addrs", "lo/" + posix::format_address(old_at) + "\n" + addr1).ok());
  make0.join();
  make1.join();
  REQUIRE(made0.ok());
  REQUIRE(made1.ok());

  uint64_t value = 7;
  RequestId id;
  REQUIRE(t1->isend(0, tag(1, 1), &value, sizeof value, &id).ok());
  Status st = t1->wait(&id, 1);
  old_peer.join();
  INFO(st.message());
  CHECK(st.code() == COMM_ERR_INVALID_USAGE);
  CHECK_THAT(st.message(), Catch::Contains("wire protocol version 4") && Catch::Contains("this rank 5"));

  // An old Hello (48 bytes, version 4) at rank 0's listener: kBadVersion with version 5.
  const std::string real0 = published_address_of(store, 0);
  posix::SockAddr at;
  REQUIRE(posix::parse_address(real0, &at).ok());
  posix::Fd fd(::socket(at.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(fd.get(), at.get(), at.len) == 0);
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  uint8_t hello[48] = {};
  const uint64_t magic = sock::kHelloMagic;
  const uint32_t v4 = 4;
  std::memcpy(hello, &magic, sizeof magic);
  std::memcpy(hello + 8, &v4, sizeof v4);
  REQUIRE(::send(fd.get(), hello, sizeof hello, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof hello));
  // Rank 0 serves its listener while it waits for something.
  uint64_t never = 0;
  RequestId wait0;
  REQUIRE(t0->irecv(1, tag(2, 1), &never, sizeof never, &wait0).ok());
  Status aborted;
  std::thread serve([&] { aborted = t0->wait(&wait0, 1); });
  sock::Reply r{};
  const bool got = ::recv(fd.get(), &r, sizeof r, MSG_WAITALL) == static_cast<ssize_t>(sizeof r);
  t0->abort();
  serve.join();
  REQUIRE(got);
  CHECK(r.magic == sock::kReplyMagic);
  CHECK(r.code == static_cast<uint32_t>(sock::ReplyCode::kBadVersion));
  CHECK(r.value == sock::kProtocolVersion);
}
