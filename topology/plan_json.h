// The topology and plan as JSON (comm-topo --json); the schema is in topology/README.md.
#pragma once

#include <string>

#include "policy.h"

namespace comm::topology {

inline constexpr const char* kJsonSchema = "libcomm.topology/1";
std::string to_json_text(const Topology& topo, const Plan& plan, int indent = 2);

}  // namespace comm::topology
