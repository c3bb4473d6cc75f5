#include "registry.h"

#include "shm/shm_transport.h"
#include "socket/socket_transport.h"
#include "ucx/ucx_transport.h"

namespace comm::transport {
namespace {

bool always() { return true; }
std::string no_reason() { return ""; }

Status connect_plain(Status (*create)(const Options&, std::unique_ptr<Transport>*), const ConnectRequest& r,
                     Connected* out) {
  out->usable = true;
  return create(r.options, &out->transport);
}

}  // namespace

const std::vector<TransportInfo>& registry() {
  static const std::vector<TransportInfo> table = {
      {"shm", true, false, false, always, no_reason, connect_shm},
      {"socket", false, true, true, always, no_reason,
       [](const ConnectRequest& r, Connected* out) { return connect_plain(create_socket_transport, r, out); }},
      {"ucx", false, false, false, ucx_built, ucx_why_not,
       [](const ConnectRequest& r, Connected* out) { return connect_plain(create_ucx_transport, r, out); }},
  };
  return table;
}

const TransportInfo* find(const std::string& name) {
  for (const auto& t : registry())
    if (name == t.name) return &t;
  return nullptr;
}

std::string first_reaching_other_hosts() {
  for (const auto& t : registry())
    if (!t.host_local && t.built()) return t.name;
  return "";
}

std::vector<std::string> profile_names() {
  std::vector<std::string> out;
  for (const auto& t : registry()) out.emplace_back(t.name);
  const TransportInfo* first_far = nullptr;  // built or not: a profile may be written elsewhere
  for (const auto& t : registry())
    if (!t.host_local && first_far == nullptr) first_far = &t;
  for (const auto& near : registry())
    for (const auto& far : registry())
      if (&near != &far && !far.host_local && (near.host_local || &near == first_far))
        out.push_back(std::string(near.name) + "+" + far.name);
  return out;
}

std::string names(bool built_only) {
  std::vector<std::string> list;
  for (const auto& t : registry())
    if (!built_only || t.built()) list.emplace_back(t.name);
  std::string out;
  for (size_t i = 0; i < list.size(); ++i)
    out += (i == 0 ? "" : i + 1 == list.size() ? " or " : ", ") + list[i];
  return out;
}

}  // namespace comm::transport
