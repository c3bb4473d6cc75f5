// Where the ranks list their metrics endpoints in the job's store while it lives: observe/metrics.cc
// writes them, tools/comm-top/comm_top_store.cc (comm-top --store) reads them. A counter hands out
// slots; slot N holds "RANK HOST:PORT HOSTNAME". Addresses only: never a key, token or data.
#pragma once

#include <string_view>

namespace comm::observe {

inline constexpr std::string_view kEndpointCounter = "metrics/endpoints";
inline constexpr std::string_view kEndpointPrefix = "metrics/endpoint/";

}  // namespace comm::observe
