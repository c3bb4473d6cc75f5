#include "tuning/nccl_settings.h"

#include <cstdio>

namespace comm::tuning {

std::vector<topology::NcclSetting> nccl_settings(const Profile* profile, int ranks, std::vector<std::string>* notes) {
  std::vector<topology::NcclSetting> out;
  if (profile == nullptr) return out;
  const Entry* chosen = nullptr;
  for (const Entry& e : profile->entries) {
    if (!e.is_nccl()) continue;
    if (e.ranks != ranks) {
      notes->push_back(e.label() + " ignored: NCCL settings written for " + std::to_string(e.ranks) +
                       " ranks, this communicator has " + std::to_string(ranks));
    } else if (chosen != nullptr) {
      notes->push_back(e.label() + " ignored: " + chosen->label() + " comes first for " + std::to_string(ranks) +
                       " ranks");
    } else {
      chosen = &e;
    }
  }
  if (chosen == nullptr) return out;
  std::string why = "tuning profile " + profile->path + " " + chosen->label();
  if (chosen->gain > 0) {
    char gain[64];
    std::snprintf(gain, sizeof gain, ", where comm-tune measured %.3fx the default's busbw", chosen->gain);
    why += gain;
  }
  for (const auto& [name, value] : chosen->settings.nccl) out.push_back({name, value, why, ""});
  return out;
}

}  // namespace comm::tuning
