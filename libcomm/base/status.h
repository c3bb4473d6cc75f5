// Internal error type. Everything inside libcomm returns Status; it becomes a
// comm_status_t (and the thread's last-error text) once, at the C ABI.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "comm/comm.h"

namespace comm {

// OK is one null pointer: constructed, tested and destroyed in an instruction or two. Every
// call returns several, so an OK status that carried a std::string cost ~10% of a small
// all-reduce's instructions; the code and text of a failure live behind the pointer.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(comm_status_t code, std::string message)
      : rep_(code == COMM_OK ? nullptr : new Rep{code, std::move(message)}) {}
  Status(const Status& other) : rep_(other.rep_ ? new Rep(*other.rep_) : nullptr) {}
  Status(Status&& other) noexcept = default;
  Status& operator=(const Status& other) {
    if (this != &other) rep_.reset(other.rep_ ? new Rep(*other.rep_) : nullptr);
    return *this;
  }
  Status& operator=(Status&& other) noexcept = default;
  static Status Ok() { return {}; }

  bool ok() const { return rep_ == nullptr; }
  comm_status_t code() const { return rep_ ? rep_->code : COMM_OK; }
  const std::string& message() const { return rep_ ? rep_->message : empty_message(); }

  // Adds context in front: "rank 2, allreduce #17: " + message.
  Status prefixed(const std::string& context) const {
    if (ok()) return *this;
    return Status(rep_->code, context + rep_->message);
  }

  // "rank 2, comm_allreduce: " in front, saying the rank once: a message from below that starts
  // with "rank 2, " or "rank 2: " (the device path names the rank itself, for the watchdog's
  // messages that no call prefixes) gets the call's name after its rank instead.
  Status prefixed_at(int rank, const char* fn) const {
    if (ok()) return *this;
    const std::string& text = rep_->message;
    const std::string r = "rank " + std::to_string(rank);
    if (text.compare(0, r.size() + 2, r + ", ") == 0 || text.compare(0, r.size() + 2, r + ": ") == 0)
      return Status(rep_->code, r + ", " + fn + (text[r.size()] == ',' ? ", " : ": ") + text.substr(r.size() + 2));
    return Status(rep_->code, r + ", " + fn + ": " + text);
  }

 private:
  struct Rep {
    comm_status_t code;
    std::string message;
  };
  static const std::string& empty_message() {
    static const std::string empty;
    return empty;
  }
  std::unique_ptr<Rep> rep_;
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
