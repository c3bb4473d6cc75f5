#include "store/tcp_store_wire.h"

#include <netdb.h>
#include <poll.h>

#include <cerrno>
#include <cstdio>

namespace comm::tcp_store {

void put_u32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>((v >> shift) & 0xff));
}

void put_u64(std::string* out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>((v >> shift) & 0xff));
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string encode_request(Op op, std::string_view key, std::string_view value) {
  std::string out;
  out.reserve(kRequestHeaderBytes + key.size() + value.size());
  put_u32(&out, kMagic);
  out.push_back(static_cast<char>(op));
  out.append(3, '\0');
  put_u32(&out, static_cast<uint32_t>(key.size()));
  put_u32(&out, static_cast<uint32_t>(value.size()));
  out.append(key);
  out.append(value);
  return out;
}

std::string encode_response(Reply reply, std::string_view payload) {
  std::string out;
  out.reserve(kResponseHeaderBytes + payload.size());
  put_u32(&out, kMagic);
  out.push_back(static_cast<char>(reply));
  out.append(3, '\0');
  put_u32(&out, static_cast<uint32_t>(payload.size()));
  out.append(payload);
  return out;
}

std::string check_request_header(const char* p, RequestHeader* out) {
  uint32_t magic = get_u32(p);
  if (magic != kMagic) {
    char text[64];
    snprintf(text, sizeof text, "bad magic 0x%08x (not a libcomm store client)", magic);
    return text;
  }
  auto op = static_cast<uint8_t>(p[4]);
  if (op < static_cast<uint8_t>(Op::kHello) || op > static_cast<uint8_t>(Op::kProof))
    return "unknown operation " + std::to_string(op);
  out->op = static_cast<Op>(op);
  out->key_len = get_u32(p + 8);
  out->value_len = get_u32(p + 12);
  if (out->key_len > kMaxKeyBytes)
    return "key length " + std::to_string(out->key_len) + " exceeds the limit of " + std::to_string(kMaxKeyBytes);
  if (out->value_len > kMaxValueBytes)
    return "value length " + std::to_string(out->value_len) + " exceeds the limit of " +
           std::to_string(kMaxValueBytes);
  switch (out->op) {
    case Op::kHello:
      // The version, then (COMM_TLS) the client's flags: 4 or 8 bytes.
      if (out->value_len != 4 && out->value_len != 8)
        return "hello carries " + std::to_string(out->value_len) + " version bytes, not 4 or 8";
      // The nonce's length is checked after the version (tcp_store_server.cc): protocol 1 sent
      // its token here, and its clients are told their version is wrong.
      break;
    case Op::kProof:
      if (out->key_len != 0 || out->value_len != kDigestBytes)
        return "proof carries " + std::to_string(out->key_len) + " + " + std::to_string(out->value_len) +
               " bytes, not 0 + " + std::to_string(kDigestBytes);
      break;
    case Op::kGet:
      if (out->value_len != 0) return "get carries a value";
      break;
    case Op::kAdd:
      if (out->value_len != 8) return "add carries " + std::to_string(out->value_len) + " bytes, not 8";
      break;
    case Op::kSet:
      break;
  }
  return "";
}

Status check_sizes(const std::string& key, size_t value_size) {
  if (key.size() > kMaxKeyBytes)
    return InvalidArgument("store key of " + std::to_string(key.size()) + " bytes exceeds the limit of " +
                           std::to_string(kMaxKeyBytes));
  if (value_size > kMaxValueBytes)
    return InvalidArgument("store value of " + std::to_string(value_size) + " bytes exceeds the limit of " +
                           std::to_string(kMaxValueBytes));
  return Status::Ok();
}

std::string host_port_string(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

// Waits for `events` on fd until the deadline: kOk (ready), kTimeout or kError.
Io wait_for(int fd, short events, Deadline deadline, int* err) {
  for (;;) {
    if (deadline.expired()) return Io::kTimeout;
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, deadline.remaining_ms());
    if (n > 0) return Io::kOk;
    if (n < 0 && errno != EINTR) {
      *err = errno;
      return Io::kError;
    }
  }
}

}  // namespace

Io send_all(int fd, std::string_view data, Deadline deadline, int* err) { return send_all(fd, nullptr, data, deadline, err); }

Io recv_exact(int fd, char* buf, size_t n, Deadline deadline, int* err) {
  return recv_exact(fd, nullptr, buf, n, deadline, err);
}

Io send_all(int fd, tls::Session* tls, std::string_view data, Deadline deadline, int* err) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = tls::send_some(tls, fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Io w = wait_for(fd, POLLOUT, deadline, err);
      if (w != Io::kOk) return w;
      continue;
    }
    *err = n < 0 ? errno : EPIPE;
    return (*err == EPIPE || *err == ECONNRESET) ? Io::kClosed : Io::kError;
  }
  return Io::kOk;
}

Io recv_exact(int fd, tls::Session* tls, char* buf, size_t n, Deadline deadline, int* err) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = tls::recv_some(tls, fd, buf + done, n - done);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (tls != nullptr && tls->pending()) continue;
      Io w = wait_for(fd, POLLIN, deadline, err);
      if (w != Io::kOk) return w;
      continue;
    }
    *err = errno;
    return errno == ECONNRESET ? Io::kClosed : Io::kError;
  }
  return Io::kOk;
}

}  // namespace comm::tcp_store
