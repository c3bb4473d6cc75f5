// What the store's tests share (tests/base/test_store.cc, tests/base/test_store_admission.cc): servers and
// clients on 127.0.0.1, raw sockets that speak garbage or nothing, the server's log captured.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "log.h"
#include "store/store.h"
#include "support/loaded_host.h"

namespace store_test {

using namespace comm;
using namespace std::chrono_literals;

inline constexpr const char* kLocal = "127.0.0.1";

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline TcpStoreOptions server_options(const std::string& token = "") {
  TcpStoreOptions o;
  o.host = kLocal;
  o.port = 0;
  o.is_server = true;
  o.timeout_ms = 5000;
  o.auth_token = token;
  return o;
}

inline TcpStoreOptions client_options(int port, const std::string& token = "", int timeout_ms = 5000) {
  TcpStoreOptions o;
  o.host = kLocal;
  o.port = port;
  o.is_server = false;
  o.timeout_ms = timeout_ms;
  o.auth_token = token;
  return o;
}

inline std::shared_ptr<Store> start_server(const std::string& token = "") {
  std::shared_ptr<Store> s;
  Status st = make_tcp_store(server_options(token), &s);
  REQUIRE(st.message() == "");
  REQUIRE(st.ok());
  REQUIRE(tcp_store_port(*s) > 0);
  return s;
}

inline std::shared_ptr<Store> connect_client(int port, const std::string& token = "") {
  std::shared_ptr<Store> c;
  Status st = make_tcp_store(client_options(port, token), &c);
  REQUIRE(st.message() == "");
  REQUIRE(st.ok());
  return c;
}

// Sends what the server's log lines say to a file while alive, so tests can read them.
class CapturedStderr {
 public:
  CapturedStderr() {
    char name[] = "/tmp/libcomm_test_stderr_XXXXXX";
    fd_ = mkstemp(name);
    REQUIRE(fd_ >= 0);
    path_ = name;
    saved_ = dup(STDERR_FILENO);
    dup2(fd_, STDERR_FILENO);
    // Make sure warnings from the store are printed, whatever COMM_DEBUG says.
    (void)log::enabled(log::Level::kWarn, log::kStore);
    level_ = log::g_level.load();
    subsys_ = log::g_subsys.load();
    if (level_ < static_cast<int>(log::Level::kWarn)) log::g_level.store(static_cast<int>(log::Level::kWarn));
    log::g_subsys.store(subsys_ | log::kStore);
  }
  ~CapturedStderr() {
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    close(fd_);
    unlink(path_.c_str());
    log::g_level.store(level_);
    log::g_subsys.store(subsys_);
  }
  std::string text() const {
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The server logs from its own thread: wait for the line to land (long enough for a busy
  // host; a line that is never written fails after it).
  bool wait_for(const std::string& needle) const {
    const auto start = Clock::now();
    while (ms_since(start) < loaded_host::kSlackMs) {
      if (text().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

 private:
  int fd_ = -1;
  int saved_ = -1;
  std::string path_;
  int level_ = 0;
  uint32_t subsys_ = 0;
};

// A raw socket to the store, for speaking garbage to it.
inline int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, kLocal, &a.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// True when the peer closes the connection within a busy host's margin (the server closes it as
// soon as its thread runs; tests/support/loaded_host.h).
inline bool closed_by_peer(int fd) {
  auto start = Clock::now();
  while (ms_since(start) < loaded_host::kSlackMs) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

// A port on 127.0.0.1 that is bound (so nobody else takes it) but never listened on.
struct UnlistenedPort {
  UnlistenedPort() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, kLocal, &a.sin_addr);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~UnlistenedPort() { close(fd); }
  int fd = -1;
  int port = 0;
};

inline std::string frame_header(uint32_t magic, uint8_t op, uint32_t key_len, uint32_t value_len) {
  std::string h;
  auto put = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) h.push_back(static_cast<char>((v >> s) & 0xff));
  };
  put(magic);
  h.push_back(static_cast<char>(op));
  h.append(3, '\0');
  put(key_len);
  put(value_len);
  return h;
}

inline void check_round_trip(Store& store, const std::string& key) {
  REQUIRE(store.set(key, "value-of-" + key).ok());
  std::string v;
  Status st = store.get(key, &v, Deadline::after_ms(loaded_host::kSlackMs));  // the key is there: no wait but a busy host's
  REQUIRE(st.message() == "");
  REQUIRE(v == "value-of-" + key);
}


}  // namespace store_test
