// Fuzz target: the TCP store's live server (libcomm/base/store/tcp_store_server.cc), driven the
// way a stranger drives it: the input's bytes are sent on a real connection to a real server,
// then the connection is half-closed. The first byte picks the server: even, one without an auth
// token (the bytes can get past the hello: sets, gets, adds, parked gets); odd, one with a token
// (the hello, the challenge, wrong proofs, frames before authentication). Checked: the server
// closes every such connection once its peer has closed (nothing hangs, however the frames were
// cut), and afterwards still serves a real client, token and all.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_check.h"
#include "log.h"
#include "store/store.h"

using namespace comm;

namespace {

constexpr const char* kToken = "fuzz-token";

struct Servers {
  std::shared_ptr<Store> open, guarded;  // without and with a token
  std::shared_ptr<Store> open_client, guarded_client;
};

std::shared_ptr<Store> make(bool server, int port, const std::string& token) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.is_server = server;
  o.timeout_ms = 5000;
  o.hello_timeout_ms = 2000;
  o.auth_token = token;
  std::shared_ptr<Store> s;
  FUZZ_CHECK(make_tcp_store(o, &s).ok());
  return s;
}

Servers& servers() {
  static Servers* s = [] {
    // Every dropped connection is a warning: thousands of inputs would flood the output.
    log::g_level.store(static_cast<int>(log::Level::kNone));
    auto* out = new Servers;
    out->open = make(true, 0, "");
    out->guarded = make(true, 0, kToken);
    out->open_client = make(false, tcp_store_port(*out->open), "");
    out->guarded_client = make(false, tcp_store_port(*out->guarded), kToken);
    return out;
  }();
  return *s;
}

// Reads and discards until the server closes: false if it has not within 5 s.
bool closed_by_server(int fd) {
  char buf[4096];
  for (int waited_ms = 0; waited_ms < 5000;) {
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, 100);
    if (n <= 0) {
      waited_ms += 100;
      continue;
    }
    ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got == 0 || (got < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Servers& s = servers();
  const bool guarded = (data[0] & 1) != 0;
  Store& server = guarded ? *s.guarded : *s.open;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(tcp_store_port(server)));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  FUZZ_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  // The server may close before it has read it all (garbage): a failed send is an answer too.
  (void)::send(fd, data + 1, size - 1, MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  FUZZ_CHECK(closed_by_server(fd));
  ::close(fd);
  // Still serving, a real client with the token included.
  Store& client = guarded ? *s.guarded_client : *s.open_client;
  FUZZ_CHECK(client.set("fuzz-alive", "yes").ok());
  std::string v;
  FUZZ_CHECK(client.get("fuzz-alive", &v, Deadline::after_ms(5000)).ok() && v == "yes");
  return 0;
}
