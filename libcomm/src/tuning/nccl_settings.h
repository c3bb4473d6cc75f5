// The tuning profile's NCCL_* settings (entries with transport "nccl"). NCCL reads its
// environment once per process, at its first initialisation, so they are applied through the
// same path as the topology plan's NCCL_* settings (topology::apply_nccl_settings_once): before
// NCCL's first init, never over a variable the user set, each logged with its reason.
#pragma once

#include <string>
#include <vector>

#include "policy.h"
#include "tuning/profile.h"

namespace comm::tuning {

// The first NCCL entry (file order) for a communicator of `ranks` ranks, as settings whose reason
// names the entry and its measured gain; none without a profile. `notes`: one line per NCCL entry
// ignored and why (another rank count), for the INFO log.
std::vector<topology::NcclSetting> nccl_settings(const Profile* profile, int ranks, std::vector<std::string>* notes);

}  // namespace comm::tuning
