// Internal error type. Everything inside libcomm returns Status; it becomes a
// comm_status_t (and the thread's last-error text) once, at the C ABI.
#pragma once

#include <string>
#include <utility>

#include "comm/comm.h"

namespace comm {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(comm_status_t code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == COMM_OK; }
  comm_status_t code() const { return code_; }
  const std::string& message() const { return message_; }

  // Adds context in front: "rank 2, allreduce #17: " + message.
  Status prefixed(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + message_);
  }

  // "rank 2, comm_allreduce: " in front, saying the rank once: a message from below that starts
  // with "rank 2, " or "rank 2: " (the device path names the rank itself, for the watchdog's
  // messages that no call prefixes) gets the call's name after its rank instead.
  Status prefixed_at(int rank, const char* fn) const {
    if (ok()) return *this;
    const std::string r = "rank " + std::to_string(rank);
    if (message_.compare(0, r.size() + 2, r + ", ") == 0 || message_.compare(0, r.size() + 2, r + ": ") == 0)
      return Status(code_, r + ", " + fn + (message_[r.size()] == ',' ? ", " : ": ") + message_.substr(r.size() + 2));
    return Status(code_, r + ", " + fn + ": " + message_);
  }

 private:
  comm_status_t code_ = COMM_OK;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {COMM_ERR_INVALID_ARGUMENT, std::move(m)}; }
inline Status InvalidUsage(std::string m) { return {COMM_ERR_INVALID_USAGE, std::move(m)}; }
inline Status SystemError(std::string m) { return {COMM_ERR_SYSTEM, std::move(m)}; }
inline Status Timeout(std::string m) { return {COMM_ERR_TIMEOUT, std::move(m)}; }
inline Status RemoteError(std::string m) { return {COMM_ERR_REMOTE, std::move(m)}; }
inline Status Aborted(std::string m) { return {COMM_ERR_ABORTED, std::move(m)}; }
inline Status Unavailable(std::string m) { return {COMM_ERR_UNAVAILABLE, std::move(m)}; }
inline Status Internal(std::string m) { return {COMM_ERR_INTERNAL, std::move(m)}; }

// "strerror(errno)" as a std::string, thread-safe.
std::string errno_string(int err);

}  // namespace comm

#define COMM_RETURN_IF_ERROR(expr)        \
  do {                                    \
    ::comm::Status _st = (expr);          \
    if (!_st.ok()) return _st;            \
  } while (0)
