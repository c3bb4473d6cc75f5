// The tuning profile's engine entry: chosen at comm_engine_finalize, the first moment the model's
// gradient bytes are known, among the entries for the communicator's rank count and transport
// (comm.cc matched those at init). API field > environment > profile > default (docs/design/base.md, "Precedence of settings").
#include <cstdio>

#include "engine/engine.h"
#include "engine_view.h"
#include "log.h"

namespace comm::engine {

void apply_profile(comm_t comm, uint64_t total_bytes, Options* opt) {
  const tuning::Applied* applied_profile = tuning_of(comm);
  if (applied_profile == nullptr || applied_profile->engine_entries() == 0) return;
  const std::string total = std::to_string(total_bytes);
  const tuning::Entry* e = applied_profile->for_engine(total_bytes);
  if (e == nullptr) {
    COMM_INFO(kInit, "rank %d, comm_engine_finalize: no tuning profile engine entry covers %s gradient bytes at %d "
              "ranks; the engine's defaults apply", rank_of(comm), total.c_str(), size_of(comm));
    return;
  }
  const tuning::Settings& s = e->settings;
  std::string applied, kept;
  auto take = [&](const char* knob, int64_t value, const std::string& from, size_t* field) {
    if (value == 0) return;
    std::string setting(knob);
    setting += '=';
    setting += std::to_string(value);
    if (!from.empty()) {
      kept.append("; ").append(setting).append(" not applied: ").append(from).append(" is set, which beats the profile");
      return;
    }
    *field = static_cast<size_t>(value);
    if (!applied.empty()) applied += ' ';
    applied += setting;
  };
  take("bucket_cap_bytes", s.bucket_cap_bytes, opt->bucket_cap_from, &opt->bucket_cap_bytes);
  take("first_bucket_bytes", s.first_bucket_bytes, opt->first_bucket_from, &opt->first_bucket_bytes);
  char gain[96] = "";
  if (e->gain > 0) std::snprintf(gain, sizeof gain, "; comm-tune measured %.3fx the default's steps per second", e->gain);
  COMM_INFO(kInit, "rank %d, comm_engine_finalize: %s gradient bytes at %d ranks over %s: tuning profile %s %s: %s; "
            "why: the first engine entry whose range holds the model%s%s",
            rank_of(comm), total.c_str(), size_of(comm), e->transport.c_str(), applied_profile->profile().path.c_str(),
            e->label().c_str(), applied.empty() ? "nothing applied" : applied.c_str(), gain, kept.c_str());
}

}  // namespace comm::engine
