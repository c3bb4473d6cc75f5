// Small POSIX socket helpers for the socket transport: an owning fd, numeric addresses.
#pragma once

#include <sys/socket.h>

#include <string>

#include "status.h"

namespace comm::transport::sock {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
};

// "192.0.2.2:4242" or "[fd00::2]:4242".
std::string format_address(const sockaddr* addr, socklen_t len);
inline std::string format_address(const SockAddr& a) { return format_address(a.get(), a.len); }
Status parse_address(const std::string& text, SockAddr* out);

// A non-blocking, CLOEXEC listening socket on a numeric host, port chosen by the kernel.
Status listen_on(const std::string& host, int family, int backlog, Fd* out, SockAddr* bound);

// The remote end of a connected socket, for log lines ("unknown" when it cannot be read).
std::string peer_address(int fd);

// Latency over throughput for small frames; large ones are written whole anyway.
void set_nodelay(int fd);

}  // namespace comm::transport::sock
