// A dial knows whom it reached (socket/wire.h, protocol 5; docs/topology.md, "Messy networks"):
// a peer's published addresses may lead elsewhere first, as a Docker bridge's 172.17.0.1 leads
// every host to itself. Real transports on loopback: rank 1 of one world is told that rank 0's
// addresses are, in order, another world's rank 1 (same secret: a listener of the wrong rank),
// that world's rank 0 (another communicator: its proof binds another label), then rank 0's own.
// Rank 1 must move past both to the real rank 0, without blaming it, and the other world must
// go on unharmed (rank 0's own dial is sent to a listener that never answers, so rank 1's is
// the one that connects). Before protocol 5 the first address alone was dialed and either authenticated
// as rank 0 (same job) or failed the peer.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "interfaces.h"
#include "posix/endpoints.h"
#include "socket/socket_transport.h"
#include "store/store.h"
#include "support/store_helpers.h"
#include "support/transport_test.h"
#include "transport.h"

using namespace comm;
using namespace comm::testing;
using namespace comm::transport;

namespace {

constexpr int kTimeoutMs = 20000;
const std::string kSecret = "one-job-secret";

std::string unique_store_name() {
  static std::atomic<int> counter{0};
  return "socket-addresses-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

Options options(int rank, std::shared_ptr<Store> store, const std::string& label) {
  Options o;
  o.rank = rank;
  o.size = 2;
  o.timeout_ms = kTimeoutMs;
  o.secret = kSecret;
  o.store = std::move(store);
  o.comm_label = label;
  o.all_local = true;
  std::string why;
  REQUIRE(topology::choose_socket_addresses(true, &o.listen.addresses, &why).ok());
  return o;
}

std::string first_address(const std::shared_ptr<Store>& store, int rank) {
  std::string text;
  REQUIRE(store->get("addr/" + std::to_string(rank), &text, Deadline::after_ms(10000)).ok());
  std::vector<posix::Endpoint> list;
  REQUIRE(posix::decode_endpoints(text, &list));
  return list.front().hostport;
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
  const std::string addr0 = first_address(store0, 0);
  std::string addr1;
  REQUIRE(store1->get("addr/1", &addr1, Deadline::after_ms(10000)).ok());
  const std::string lookalikes = "br-1a2b3c4d/" + first_address(other_store, 1) + ",br-1a2b3c4d/" +
                                 first_address(other_store, 0) + ",lo/" + addr0;
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
