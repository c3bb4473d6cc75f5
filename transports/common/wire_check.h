// What every transport checks when a peer's message (or posted call) meets ours: the same call
// (sequence number, collective, count, dtype, op, root) and the same size, or INVALID_USAGE that
// names both sides, so that ranks which disagree fail with the reason instead of hanging or
// corrupting data (docs/design/core.md, "Validate at the edge").
#pragma once

#include <cstdint>
#include <string>

#include "status.h"
#include "transport.h"

namespace comm::transport {

// "rank 1 called allreduce #3 (...) but rank 0 (this rank) called broadcast #3 (...)"
inline Status call_mismatch(const std::string& them, const OpTag& theirs, const std::string& us, const OpTag& ours) {
  return InvalidUsage(them + " called " + describe(theirs) + " but " + us + " called " + describe(ours));
}

// A message for a posted receive: the same call and the same byte count, or INVALID_USAGE.
inline Status check_arrival(const std::string& them, const OpTag& got, uint64_t got_bytes, const std::string& us,
                            const OpTag& expected, uint64_t expected_bytes) {
  if (!(got == expected)) return call_mismatch(them, got, us, expected);
  if (got_bytes != expected_bytes)
    return InvalidUsage(them + " sent " + std::to_string(got_bytes) + " bytes for " + describe(got) + " but " + us +
                        " expects " + std::to_string(expected_bytes) + " bytes for it");
  return Status::Ok();
}

}  // namespace comm::transport
