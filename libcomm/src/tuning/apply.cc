#include "tuning/apply.h"

#include "dtype.h"
#include "params.h"

namespace comm::tuning {
namespace {

// The environment value that overrides `knob`, or "" when the profile may set it.
std::string env_override(const char* knob) {
  const Knob* k = find_knob(knob);
  auto v = params::env(k->env);
  return v ? std::string(k->env) + "=" + *v : "";
}

}  // namespace

std::shared_ptr<const Applied> Applied::match(std::shared_ptr<const Profile> profile, int ranks,
                                              const std::string& transport, std::vector<std::string>* notes) {
  auto a = std::make_shared<Applied>();
  a->profile_ = profile;
  if (!profile) return a;
  // Drops a knob the environment sets, saying so; returns whether the profile keeps it.
  auto keep = [&](const Entry& e, const char* knob, const std::string& value) {
    const std::string env = env_override(knob);
    if (env.empty()) return true;
    notes->push_back(e.label() + ": " + knob + "=" + value + " not applied: " + env +
                     " is set in the environment, which beats the profile");
    return false;
  };
  for (const Entry& e : profile->entries) {
    if (e.is_nccl()) continue;  // the NCCL backend's, once per process (nccl_settings.cc says which)
    if (e.ranks != ranks || e.transport != transport) {
      notes->push_back(e.label() + " ignored: written for " + std::to_string(e.ranks) + " ranks over " + e.transport +
                       ", this communicator has " + std::to_string(ranks) + " ranks over " + transport);
      continue;
    }
    const Settings& s = e.settings;
    if (e.is_engine()) {  // a gradient engine on this communicator picks one at comm_engine_finalize
      a->engine_.push_back(&e);
      continue;
    }
    if (e.collective == "*") {
      if (s.shm_slot_bytes && !a->shm_slot_bytes_ && keep(e, "shm_slot_bytes", std::to_string(s.shm_slot_bytes)))
        a->shm_slot_bytes_ = s.shm_slot_bytes;
      if (s.socket_nconns && !a->socket_nconns_ && keep(e, "socket_nconns", std::to_string(s.socket_nconns)))
        a->socket_nconns_ = s.socket_nconns;
      continue;
    }
    auto t = std::make_unique<CallTuning>();
    t->entry = &e;
    t->kind = e.kind;
    t->min_bytes = e.min_bytes;
    t->max_bytes = e.max_bytes;
    Settings used;
    if (!s.algo.empty() && keep(e, "algo", s.algo)) t->algo = used.algo = s.algo;
    if (s.chunk_bytes && keep(e, "chunk_bytes", std::to_string(s.chunk_bytes)))
      t->chunk_bytes = static_cast<size_t>(used.chunk_bytes = s.chunk_bytes);
    if (s.shm_chunk_bytes && keep(e, "shm_chunk_bytes", std::to_string(s.shm_chunk_bytes)))
      t->shm_chunk_bytes = static_cast<size_t>(used.shm_chunk_bytes = s.shm_chunk_bytes);
    t->applied = used.describe();
    t->source = "tuning profile " + e.label();
    if (t->applied.empty()) continue;  // the environment overrides all of it
    a->calls_.push_back(std::move(t));
  }
  Settings comm;
  comm.shm_slot_bytes = a->shm_slot_bytes_;
  comm.socket_nconns = a->socket_nconns_;
  a->comm_applied_ = comm.describe();
  return a;
}

uint64_t call_bytes(CollKind kind, size_t count, comm_dtype_t dtype, int nranks) {
  const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
  switch (kind) {
    case CollKind::kAllgather:
    case CollKind::kReduceScatter:
    case CollKind::kAlltoall:
      return bytes * static_cast<uint64_t>(nranks);
    default:
      return bytes;
  }
}

}  // namespace comm::tuning
