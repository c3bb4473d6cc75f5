// The flight recorder (flight_recorder.h): a fixed ring of relaxed atomics, written by the
// thread that issues the communicator's calls, read by whoever dumps it.
#include "flight_recorder.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "communicator.h"
#include "log.h"
#include "params.h"
#include "types.h"

namespace comm {
namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

const char* state_name(uint8_t s) {
  switch (s) {
    case 1: return "running";
    case 2: return "done";
    case 3: return "failed";
  }
  return "unknown";
}

}  // namespace

// %h host, %p pid, %r rank (the engine's COMM_TRACE_FILE knows %r too).
std::string expand_file_pattern(const std::string& pattern, int rank) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char k = pattern[++i];
    if (k == 'r') {
      out += std::to_string(rank);
    } else if (k == 'p') {
      out += std::to_string(getpid());
    } else if (k == 'h') {
      char host[256] = "";
      gethostname(host, sizeof host - 1);
      out += host;
    } else {
      out += '%';
      out += k;
    }
  }
  return out;
}

size_t FlightRecorder::begin(const transport::OpTag& tag) {
  const uint64_t n = next_.load(std::memory_order_relaxed);
  const size_t slot = n % kEntries;
  Entry& e = entries_[slot];
  e.state.store(0, std::memory_order_relaxed);
  e.seq.store(tag.seq, std::memory_order_relaxed);
  e.coll.store(static_cast<uint8_t>(tag.coll), std::memory_order_relaxed);
  e.dtype.store(tag.dtype, std::memory_order_relaxed);
  e.count.store(tag.count, std::memory_order_relaxed);
  e.algo.store(nullptr, std::memory_order_relaxed);
  e.npeers.store(0, std::memory_order_relaxed);
  e.status.store(0, std::memory_order_relaxed);
  e.last_peer.store(-1, std::memory_order_relaxed);
  e.last_wait_ns.store(0, std::memory_order_relaxed);
  e.end_ns.store(0, std::memory_order_relaxed);
  e.start_ns.store(now_ns(), std::memory_order_relaxed);
  e.state.store(kRunning, std::memory_order_release);
  next_.store(n + 1, std::memory_order_release);
  return slot;
}

void FlightRecorder::end(size_t slot, const Status& st, const transport::Transport::WaitFailure* failure) {
  Entry& e = entries_[slot];
  if (failure != nullptr) {
    uint32_t n = 0;
    for (const auto& a : failure->awaited) {
      if (n == kMaxPeers) break;
      e.peers[n++].store(a.peer, std::memory_order_relaxed);
    }
    e.npeers.store(n, std::memory_order_relaxed);
  }
  e.status.store(static_cast<uint32_t>(st.code()), std::memory_order_relaxed);
  e.end_ns.store(now_ns(), std::memory_order_relaxed);
  e.state.store(st.ok() ? kDone : kFailed, std::memory_order_release);
}

static std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string FlightRecorder::json(int rank, int size, const std::string& comm_id, const std::string& error) const {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  std::string out = "{\"version\": 1, \"comm\": \"" + comm_id + "\", \"rank\": " + std::to_string(rank) +
                    ", \"size\": " + std::to_string(size) + ", \"pid\": " + std::to_string(getpid()) +
                    ", \"host\": " + json_string(host) + ", \"dumped_ns\": " + std::to_string(now_ns()) +
                    ", \"error\": " + json_string(error) + ", \"entries\": [";
  const uint64_t n = next_.load(std::memory_order_acquire);
  const uint64_t first = n > kEntries ? n - kEntries : 0;
  for (uint64_t i = first; i < n; ++i) {
    const Entry& e = entries_[i % kEntries];
    const uint8_t state = e.state.load(std::memory_order_acquire);
    if (state == 0) continue;
    const auto coll = static_cast<transport::CollKind>(e.coll.load(std::memory_order_relaxed));
    const int dtype = e.dtype.load(std::memory_order_relaxed);
    const char* algo = e.algo.load(std::memory_order_relaxed);
    std::string peers;
    const uint32_t np = e.npeers.load(std::memory_order_relaxed);
    for (uint32_t k = 0; k < np && k < kMaxPeers; ++k)
      peers += (k ? ", " : "") + std::to_string(e.peers[k].load(std::memory_order_relaxed));
    out += std::string(i == first ? "" : ",") + "\n  {\"seq\": " + std::to_string(e.seq.load(std::memory_order_relaxed)) +
           ", \"collective\": \"" + transport::coll_name(coll) + "\", \"dtype\": \"" +
           (dtype_valid(dtype) ? dtype_name(static_cast<comm_dtype_t>(dtype)) : "?") +
           "\", \"count\": " + std::to_string(e.count.load(std::memory_order_relaxed)) + ", \"algorithm\": \"" +
           (algo ? algo : "") + "\", \"state\": \"" + state_name(state) +
           "\", \"status\": " + std::to_string(e.status.load(std::memory_order_relaxed)) + ", \"waited_on\": [" + peers +
           "], \"last_arrival\": {\"rank\": " + std::to_string(e.last_peer.load(std::memory_order_relaxed)) +
           ", \"wait_ns\": " + std::to_string(e.last_wait_ns.load(std::memory_order_relaxed)) +
           "}, \"start_ns\": " + std::to_string(e.start_ns.load(std::memory_order_relaxed)) +
           ", \"end_ns\": " + std::to_string(e.end_ns.load(std::memory_order_relaxed)) + "}";
  }
  out += "\n]}\n";
  return out;
}

FlightRecorder::Now FlightRecorder::now() const {
  Now out;
  const uint64_t n = next_.load(std::memory_order_acquire);
  out.operations = n;
  if (n == 0) return out;
  const Entry& e = entries_[(n - 1) % kEntries];
  const uint8_t state = e.state.load(std::memory_order_acquire);
  out.seq = e.seq.load(std::memory_order_relaxed);
  out.coll = static_cast<transport::CollKind>(e.coll.load(std::memory_order_relaxed));
  out.start_ns = e.start_ns.load(std::memory_order_relaxed);
  out.running = state == kRunning;
  if (!out.running) {
    out.last_done_seq = out.seq;
  } else if (n >= 2) {
    const Entry& before = entries_[(n - 2) % kEntries];
    if (before.state.load(std::memory_order_acquire) != kRunning)
      out.last_done_seq = before.seq.load(std::memory_order_relaxed);
  }
  return out;
}

Status dump_flight_recorder(comm_t c, const std::string& path, std::string* written) {
  written->clear();
  std::string pattern = path;
  if (pattern.empty()) COMM_RETURN_IF_ERROR(params::get_string("COMM_FLIGHT_RECORDER_FILE", &pattern));
  if (pattern.empty()) return Status::Ok();
  const std::string file = expand_file_pattern(pattern, c->rank);
  std::string error;
  if (c->is_broken.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(c->state_mu);
    error = c->broken.message();
  } else if (c->aborted.load(std::memory_order_acquire)) {
    error = "aborted (comm_abort)";
  }
  const std::string text = c->recorder.json(c->rank, c->size, c->id, error);
  // A temporary file, then rename: a reader never sees half a dump.
  const std::string tmp = file + ".tmp" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr)
    return SystemError("rank " + std::to_string(c->rank) + ": cannot write the flight recorder to " + file + ": " +
                       errno_string(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return SystemError("rank " + std::to_string(c->rank) + ": cannot write the flight recorder to " + file + ": " +
                       errno_string(err));
  }
  COMM_WARN(kColl, "comm %s rank %d: flight recorder written to %s", c->id.c_str(), c->rank, file.c_str());
  *written = file;
  return Status::Ok();
}

}  // namespace comm
