// Applying the plan's NCCL_* settings to this process's environment. NCCL reads its environment
// once, at its first initialisation, so this runs before that (from comm_init). None of these
// settings has an ncclConfig_t field (NCCL 2.18-2.21), so the environment is the only way in.
#pragma once

#include <string>
#include <vector>

#include "policy.h"

namespace comm::topology {

struct Applied {
  std::string name;
  std::string value;  // the value in the environment afterwards
  bool set_by_libcomm = false;
  std::string reason;
};

// Sets each setting the user has not set (never overwriting one), logging each with its reason
// at COMM_DEBUG=INFO (subsystem ENV). Returns what the environment holds for each afterwards.
std::vector<Applied> apply_nccl_settings(const Plan& plan);
std::vector<Applied> apply_nccl_settings(const std::vector<NcclSetting>& settings);

// The plan's settings with `over` (the tuning profile's) replacing those of the same name and
// added after them: API > environment > profile > plan (docs/design/base.md, "Precedence of settings").
std::vector<NcclSetting> merge_nccl_settings(const std::vector<NcclSetting>& plan,
                                             const std::vector<NcclSetting>& over);

}  // namespace comm::topology
