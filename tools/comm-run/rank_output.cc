#include "rank_output.h"

#include <unistd.h>

#include <cerrno>

namespace comm_run {

void write_all(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // our own stdout is gone (EPIPE with SIGPIPE ignored): drop the output
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
}

void Stream::emit(const std::string& prefix, bool at_eof) {
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = pending.find('\n', start);
    if (nl == std::string::npos) break;
    if (!mid_line) out += prefix;
    out.append(pending, start, nl + 1 - start);
    mid_line = false;
    start = nl + 1;
  }
  pending.erase(0, start);
  if (!pending.empty() && (at_eof || pending.size() >= kMaxPartialLine)) {
    if (!mid_line) out += prefix;
    out += pending;
    pending.clear();
    if (at_eof) {
      out += '\n';
      mid_line = false;
    } else {
      mid_line = true;
    }
  }
  if (!out.empty()) write_all(dest, out.data(), out.size());
}

bool Stream::pump(const std::string& prefix) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      pending.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      emit(prefix, false);
      return true;
    }
    emit(prefix, true);
    close(fd);
    fd = -1;
    return false;
  }
}

void Stream::drain(const std::string& prefix) {
  if (fd < 0) return;
  if (pump(prefix)) {
    emit(prefix, true);
    close(fd);
    fd = -1;
  }
}

}  // namespace comm_run
