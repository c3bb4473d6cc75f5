// How the engine words failures: a public call's status with its last error, and a failure from
// below (the device path, which names its rank already) under the engine's own context.
#pragma once

#include <string>

#include "comm/comm.h"
#include "status.h"
#include "types.h"

namespace comm::engine {

inline Status from_call(comm_status_t s, const std::string& context) {
  if (s == COMM_OK) return Status::Ok();
  return Status(s, context + comm_last_error(nullptr));
}

// "rank 2, comm_allreduce: why" from below, inside a message that names the rank already.
inline std::string without_rank(const std::string& m, int rank) {
  const std::string r = "rank " + std::to_string(rank) + ", ";
  return m.compare(0, r.size(), r) == 0 ? m.substr(r.size()) : m;
}

// The device side's failure (which names its rank and communicator) under the engine's context.
inline Status under(const Status& st, const std::string& context, int rank) {
  return st.ok() ? st : Status(st.code(), context + without_rank(st.message(), rank));
}

inline std::string dtype_text(int64_t d) {
  return dtype_valid(static_cast<int>(d)) ? dtype_name(static_cast<comm_dtype_t>(d)) : std::to_string(d);
}

}  // namespace comm::engine
