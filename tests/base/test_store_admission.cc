// Who gets into rank 0's store (libcomm/base/store/tcp_store_admission.cc): a burst of ranks
// during a flood of silent connections, a stranger that spoke is not closed for newcomers, and a
// client closed before its hello is told why and comes back. Real sockets on 127.0.0.1.
#include <sys/resource.h>
#include <sys/time.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/store_helpers.h"

using namespace store_test;

namespace {

// A client's handshake frame as the server reads it: header, key (the nonce), value (version).
std::string read_request(int fd) {
  char h[16];
  size_t got = 0;
  while (got < sizeof h) {
    ssize_t n = recv(fd, h + got, sizeof h - got, 0);
    if (n <= 0) return "";
    got += static_cast<size_t>(n);
  }
  auto u32 = [&](int at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(h[at + i]);
    return v;
  };
  std::string body(u32(8) + u32(12), '\0');
  for (size_t off = 0; off < body.size();) {
    ssize_t n = recv(fd, body.data() + off, body.size() - off, 0);
    if (n <= 0) return "";
    off += static_cast<size_t>(n);
  }
  return std::string(h, sizeof h) + body;
}

std::string response(uint8_t reply, const std::string& payload) {
  std::string r = "CMST";
  r.push_back(static_cast<char>(reply));
  r.append(3, '\0');
  for (int s = 24; s >= 0; s -= 8) r.push_back(static_cast<char>((payload.size() >> s) & 0xff));
  return r + payload;
}

// Keeps `count` connections open that never say a word, reopening each the server closes, until
// stopped: a port scanner, or a flood.
class SilentFlood {
 public:
  SilentFlood(int port, int count) : port_(port) {
    for (int i = 0; i < count; ++i) fds_.push_back(raw_connect(port_));
    thread_ = std::thread([this] { run(); });
  }
  ~SilentFlood() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) close(fd);
  }
  int reopened() const { return reopened_.load(); }

 private:
  void run() {
    while (!stop_) {
      std::vector<pollfd> p;
      for (int fd : fds_) p.push_back({fd, POLLIN, 0});
      if (poll(p.data(), p.size(), 50) <= 0) continue;
      for (size_t i = 0; i < p.size(); ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[512];
        if (recv(fds_[i], buf, sizeof buf, MSG_DONTWAIT) > 0) continue;  // the kBusy answer; the close follows
        close(fds_[i]);
        fds_[i] = raw_connect(port_);
        ++reopened_;
      }
    }
  }
  const int port_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<int> reopened_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("tcp store admission: a burst of 64 ranks with a token gets in while 200 silent connections flood the port",
          "[store]") {
  TcpStoreOptions o = server_options("burst-token");
  o.world_size = 65;  // the stranger limit scales with it
  std::shared_ptr<Store> server;
  REQUIRE(make_tcp_store(o, &server).ok());
  const int port = tcp_store_port(*server);
  CapturedStderr log;
  SilentFlood flood(port, 200);
  constexpr int kRanks = 64;
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      std::shared_ptr<Store> client;
      Status st = make_tcp_store(client_options(port, "burst-token", 20000), &client);
      if (st.ok()) st = client->set("rank/" + std::to_string(r), "here");
      std::string v;
      if (st.ok()) st = client->get("rank/" + std::to_string((r + 1) % kRanks), &v, Deadline::after_ms(20000));
      errors[static_cast<size_t>(r)] = st.message();
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<size_t>(r)] == "");
  }
  // The flood was met: its connections were closed (told why) for newer ones.
  CHECK(log.wait_for("had said nothing (a port scanner, or a flood?)"));
  CHECK(flood.reopened() > 0);
}

namespace {

// Sends a hello with a 16-byte nonce and reads the server's 16-byte challenge: a stranger that spoke.
int challenged_stranger(int port) {
  const int fd = raw_connect(port);
  timeval tv{30, 0};  // no read here waits forever
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string hello = frame_header(0x434d5354, 1, 16, 4) + std::string(16, 'n') + std::string("\0\0\0\2", 4);
  REQUIRE(send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size()));
  char challenge[12 + 16];
  size_t got = 0;
  while (got < sizeof challenge) {
    ssize_t n = recv(fd, challenge + got, sizeof challenge - got, 0);
    REQUIRE(n > 0);
    got += static_cast<size_t>(n);
  }
  REQUIRE(challenge[4] == 4);  // kChallenge
  return fd;
}

}  // namespace

TEST_CASE("tcp store admission: a stranger that said its hello is not closed for newcomers; silent ones are",
          "[store]") {
  TcpStoreOptions o = server_options("s3cret");
  o.max_unauthenticated = 4;
  o.hello_timeout_ms = 60000;  // far away: only the limit can close anything here
  std::shared_ptr<Store> server;
  REQUIRE(make_tcp_store(o, &server).ok());
  const int port = tcp_store_port(*server);
  CapturedStderr log;
  const int spoke = challenged_stranger(port);
  std::vector<int> silent;  // ten, over the limit of 4
  for (int i = 0; i < 10; ++i) silent.push_back(raw_connect(port));
  auto client = connect_client(port, "s3cret");  // accepted after them: they have all been seen
  check_round_trip(*client, "while-strangers-wait");
  CHECK(closed_by_peer(silent.front()));
  pollfd p{spoke, POLLIN, 0};
  CHECK(poll(&p, 1, 0) == 0);  // still open, nothing more said to it
  for (int fd : silent) close(fd);
  close(spoke);
}

TEST_CASE("tcp store admission: a stranger that never proves the token goes at its proof deadline, told why",
          "[store]") {
  TcpStoreOptions o = server_options("s3cret");
  o.hello_timeout_ms = 300;
  std::shared_ptr<Store> server;
  REQUIRE(make_tcp_store(o, &server).ok());
  const int port = tcp_store_port(*server);
  CapturedStderr log;
  const int spoke = challenged_stranger(port);
  std::string told;
  char buf[256];
  for (ssize_t n; (n = recv(spoke, buf, sizeof buf, 0)) > 0;) told.append(buf, static_cast<size_t>(n));
  close(spoke);
  REQUIRE(told.size() > 12);
  CHECK(told[4] == 5);  // kBusy
  CHECK_THAT(told.substr(12), Catch::Contains("no proof of COMM_AUTH_TOKEN within 300 ms"));
  CHECK(log.wait_for("no proof of COMM_AUTH_TOKEN within 300 ms"));
  auto client = connect_client(port, "s3cret");
  check_round_trip(*client, "after-the-deadline");
}

TEST_CASE("tcp store admission: a client closed before its hello is told why, and retries until it is in", "[store]") {
  UnlistenedPort reserved;
  const int port = reserved.port;
  close(reserved.fd);
  reserved.fd = -1;
  // A fake rank 0: the first connection is closed for room (kBusy), the second greeted (kOk).
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, kLocal, &a.sin_addr);
  REQUIRE(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(lfd, 4) == 0);
  int accepted = 0;
  std::thread fake([&] {
    for (; accepted < 2; ++accepted) {
      int c = accept(lfd, nullptr, nullptr);
      if (c < 0) return;
      if (read_request(c).empty()) {
        close(c);
        return;
      }
      const std::string answer =
          accepted == 0 ? response(5, "rank 0's store closed the connection before its hello: 64 connections were "
                                      "already waiting to say hello")
                        : response(0, "");
      (void)send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      close(c);
    }
  });
  CapturedStderr log;
  log::g_level.store(static_cast<int>(log::Level::kInfo));  // the retry is said at INFO
  std::shared_ptr<Store> client;
  Status st = make_tcp_store(client_options(port, "", 10000), &client);
  fake.join();
  close(lfd);
  CHECK(st.message() == "");
  CHECK(accepted == 2);
  CHECK(log.wait_for("64 connections were already waiting to say hello; retrying with backoff"));
}

TEST_CASE("tcp store admission: at its descriptor cap the server sheds waiting ranks and serves everyone", "[store]") {
  // The cap comes from the soft descriptor limit when the server is made: 160 - 64 = 96 clients.
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = 160;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  TcpStoreOptions o = server_options();
  o.world_size = 129;
  std::shared_ptr<Store> server;
  Status made = make_tcp_store(o, &server);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
  REQUIRE(made.ok());
  const int port = tcp_store_port(*server);
  constexpr int kRanks = 128;  // more than the cap: each parks a get that only the last set answers
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      std::shared_ptr<Store> client;
      Status st = make_tcp_store(client_options(port, "", 60000), &client);
      if (st.ok()) st = client->set("rank/" + std::to_string(r), "here");
      std::string v;
      if (st.ok()) st = client->get("everyone-is-here", &v, Deadline::after_ms(60000));
      errors[static_cast<size_t>(r)] = st.message();
    });
  std::string v;
  for (int r = 0; r < kRanks; ++r) REQUIRE(server->get("rank/" + std::to_string(r), &v, Deadline::after_ms(60000)).ok());
  REQUIRE(server->set("everyone-is-here", "yes").ok());
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<size_t>(r)] == "");
  }
}
