#include "nccl_env.h"

#include <cstdlib>

#include "log.h"
#include "params.h"

namespace comm::topology {

std::vector<Applied> apply_nccl_settings(const Plan& plan) { return apply_nccl_settings(plan.nccl); }

std::vector<NcclSetting> merge_nccl_settings(const std::vector<NcclSetting>& plan,
                                             const std::vector<NcclSetting>& over) {
  std::vector<NcclSetting> out = plan;
  for (const auto& o : over) {
    bool replaced = false;
    for (auto& s : out)
      if (s.name == o.name) {
        s.reason = o.reason + " (over the topology plan's " + s.value + ": " + s.reason + ")";
        s.value = o.value;
        replaced = true;
      }
    if (!replaced) out.push_back(o);
  }
  return out;
}

std::vector<Applied> apply_nccl_settings(const std::vector<NcclSetting>& settings) {
  std::vector<Applied> out;
  for (const auto& s : settings) {
    Applied a{s.name, s.value, false, s.reason};
    // The environment now, not when the plan was made: a user's value always wins.
    if (auto user = params::env(s.name.c_str())) {
      a.value = *user;
      a.reason = "set by the user; libcomm would have set " + s.value + " (" + s.reason + ")";
      COMM_INFO(kEnv, "%s=%s left as the user set it (libcomm would set %s: %s)", s.name.c_str(), user->c_str(),
                s.value.c_str(), s.reason.c_str());
    } else if (setenv(s.name.c_str(), s.value.c_str(), /*overwrite=*/0) == 0) {
      a.set_by_libcomm = true;
      COMM_INFO(kEnv, "%s=%s set by libcomm: %s", s.name.c_str(), s.value.c_str(), s.reason.c_str());
    } else {
      a.value.clear();
      COMM_WARN(kEnv, "could not set %s=%s: %s", s.name.c_str(), s.value.c_str(), errno_string(errno).c_str());
    }
    out.push_back(a);
  }
  return out;
}

}  // namespace comm::topology
