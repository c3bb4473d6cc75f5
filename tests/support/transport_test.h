// What the transport tests share: ranks as threads that report instead of asserting (Catch2
// is not thread-safe), the call tag they post, and the bytes they send.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "transport.h"

namespace comm::testing {

// Runs body(rank) on one thread per rank; returns each rank's complaint ("" = fine).
inline std::vector<std::string> run_ranks(int n, const std::function<std::string(int)>& body) {
  std::vector<std::string> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[static_cast<size_t>(r)] = body(r); });
  for (auto& t : threads) t.join();
  return out;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "allreduce #seq (count N, float32, sum)", as a collective would post it.
inline transport::OpTag tag(uint64_t seq, uint64_t count = 0) {
  return transport::OpTag{
      .seq = seq, .coll = transport::CollKind::kAllreduce, .dtype = COMM_FLOAT32, .op = COMM_SUM, .count = count};
}

// Byte i of message `message` from `sender`: every message and sender differ, and so do the
// pages of one message.
inline uint8_t pattern(int sender, size_t message, size_t i) {
  return static_cast<uint8_t>(sender * 131 + message * 31 + i * 7 + (i >> 9) + (i >> 17));
}

}  // namespace comm::testing
