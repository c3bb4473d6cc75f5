#include "tuning/profile.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "algorithms/algorithm.h"
#include "hash.h"
#include "params.h"
#include "registry.h"

namespace comm::tuning {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "libcomm-tuning-profile";
constexpr int kVersion = 1;

// The collectives a profile can tune; barrier and send/recv have no knob that changes them.
constexpr CollKind kTunable[] = {CollKind::kAllreduce, CollKind::kBroadcast,     CollKind::kReduce,
                                 CollKind::kAllgather, CollKind::kReduceScatter, CollKind::kAlltoall};

std::string hash_bytes(const std::string& text) {
  const uint64_t h = fnv1a(text);
  char buf[32];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string algo_names(CollKind kind) {
  std::string names;
  for (const auto& a : algo::registry())
    if (a.kind == kind) {
      if (!names.empty()) names += ", ";
      names += a.name;
    }
  return names;
}

bool is_algo_of(CollKind kind, const std::string& name) {
  for (const auto& a : algo::registry())
    if (a.kind == kind && name == a.name) return true;
  return false;
}

// One entry; `where` prefixes every message ("COMM_TUNING_FILE='p': entry #3 (...)").
class EntryParser {
 public:
  EntryParser(const std::string& file, int index, const json& j) : file_(file), j_(j) { e_.index = index; }

  Status parse(Entry* out) {
    if (!j_.is_object()) return fail("is not an object");
    for (const auto& [key, value] : j_.items())
      if (key != "collective" && key != "ranks" && key != "transport" && key != "min_bytes" && key != "max_bytes" &&
          key != "settings" && key != "measured")
        return fail("has an unknown field '" + key +
                    "' (fields: collective, ranks, transport, min_bytes, max_bytes, settings, measured)");
    COMM_RETURN_IF_ERROR(string_field("collective", &e_.collective));
    if (e_.collective != "*" && e_.collective != "engine") {
      for (CollKind k : kTunable)
        if (e_.collective == transport::coll_name(k)) e_.kind = k;
      if (e_.kind == CollKind::kInternal)
        return fail("collective '" + e_.collective +
                    "' is not tunable; use allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall, * "
                    "(communicator or NCCL knobs) or engine (the gradient engine's buckets)");
    }
    int64_t ranks = 0;
    COMM_RETURN_IF_ERROR(int_field("ranks", 1, 1 << 24, true, &ranks));
    e_.ranks = static_cast<int>(ranks);
    COMM_RETURN_IF_ERROR(string_field("transport", &e_.transport));
    // The names connect.cc's profile_transport() gives a communicator (the registry's), and NCCL's settings.
    const std::vector<std::string> known = transport::profile_names();
    if (e_.transport != "nccl" && std::find(known.begin(), known.end(), e_.transport) == known.end()) {
      std::string list;
      for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
      return fail("transport '" + e_.transport + "' is unknown; use " + list + " or nccl (NCCL_* settings)");
    }
    // NCCL reads its environment once per process: its settings cannot depend on a call.
    if (e_.is_nccl() && e_.collective != "*")
      return fail("sets NCCL's environment, which NCCL reads once per process: use collective \"*\"");
    if (e_.is_nccl() && (j_.contains("min_bytes") || j_.contains("max_bytes")))
      return fail("has a size range, but NCCL's settings hold for every size (NCCL reads them once per process)");
    int64_t lo = 0, hi = INT64_MAX;
    COMM_RETURN_IF_ERROR(int_field("min_bytes", 0, INT64_MAX, false, &lo));
    COMM_RETURN_IF_ERROR(int_field("max_bytes", 0, INT64_MAX, false, &hi));
    if (lo > hi) return fail("min_bytes " + std::to_string(lo) + " is above max_bytes " + std::to_string(hi));
    e_.min_bytes = static_cast<uint64_t>(lo);
    e_.max_bytes = hi == INT64_MAX ? UINT64_MAX : static_cast<uint64_t>(hi);
    if (j_.contains("measured")) {
      const json& m = j_["measured"];
      if (!m.is_object()) return fail("'measured' is not an object");
      if (m.contains("gain")) {
        if (!m["gain"].is_number() || m["gain"].get<double>() <= 0) return fail("measured.gain is not a positive number");
        e_.gain = m["gain"].get<double>();
      }
    }
    COMM_RETURN_IF_ERROR(settings());
    *out = e_;
    return Status::Ok();
  }

 private:
  Status fail(const std::string& what) const {
    return InvalidArgument("COMM_TUNING_FILE='" + file_ + "': " + e_.label() + " " + what +
                           "; fix the entry or regenerate the profile with comm-tune");
  }

  Status string_field(const char* key, std::string* out) {
    if (!j_.contains(key)) return fail(std::string("lacks the field '") + key + "'");
    if (!j_[key].is_string()) return fail(std::string("'") + key + "' is not a string");
    *out = j_[key].get<std::string>();
    return Status::Ok();
  }

  Status int_field(const char* key, int64_t min, int64_t max, bool required, int64_t* out) {
    if (!j_.contains(key)) return required ? fail(std::string("lacks the field '") + key + "'") : Status::Ok();
    const json& v = j_[key];
    if (!v.is_number_integer()) return fail(std::string("'") + key + "' is not an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return fail(std::string(key) + "=" + v.dump() + " is out of range");
    const int64_t x = v.get<int64_t>();
    if (x < min || x > max)
      return fail(std::string(key) + "=" + std::to_string(x) + " is out of range [" + std::to_string(min) + ", " +
                  std::to_string(max) + "]");
    *out = x;
    return Status::Ok();
  }

  Status settings() {
    if (!j_.contains("settings") || !j_["settings"].is_object() || j_["settings"].empty())
      return fail("needs 'settings', an object with at least one knob");
    const std::vector<Knob>& table = e_.is_nccl() ? nccl_knobs() : knobs();
    std::string known;
    for (const auto& k : table) {
      if (!known.empty()) known += ", ";
      known += k.name;
    }
    for (const auto& [name, value] : j_["settings"].items()) {
      const Knob* k = nullptr;
      for (const auto& t : table)
        if (name == t.name) k = &t;
      if (k == nullptr)
        return fail("sets the unknown knob '" + name + "' (" + (e_.is_nccl() ? "NCCL knobs: " : "knobs: ") + known +
                    (e_.is_nccl() || name.rfind("NCCL_", 0) != 0 ? ")" : "; NCCL's need transport \"nccl\")"));
      if (k->scope == Scope::kNccl) {
        COMM_RETURN_IF_ERROR(nccl_value(*k, value));
        continue;
      }
      if (k->scope == Scope::kEngine && !e_.is_engine())
        return fail("sets " + name + ", which acts on the gradient engine: put it in an entry with collective \"engine\"");
      if (k->scope != Scope::kEngine && e_.is_engine())
        return fail("sets " + name + ", which is not an engine knob (engine knobs: bucket_cap_bytes, first_bucket_bytes)");
      if (k->scope == Scope::kCommunicator && e_.collective != "*")
        return fail("sets " + name + ", which acts on the whole communicator: put it in an entry with collective \"*\"");
      if (k->scope == Scope::kCall && e_.collective == "*")
        return fail("sets " + name + ", which is chosen per collective: name the collective");
      if (name == "algo") {
        if (!value.is_string()) return fail("algo is not a string");
        e_.settings.algo = value.get<std::string>();
        if (!is_algo_of(e_.kind, e_.settings.algo))
          return fail("algo '" + e_.settings.algo + "' is not a " + e_.collective + " algorithm (" +
                      algo_names(e_.kind) + ")");
        continue;
      }
      if (!value.is_number_integer()) return fail(name + " is not an integer");
      const bool too_big = value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(k->max);
      const int64_t x = too_big ? k->max + 1 : value.get<int64_t>();
      if (too_big || x < k->min || x > k->max)
        return fail(name + "=" + value.dump() + " is out of range [" + std::to_string(k->min) + ", " +
                    std::to_string(k->max) + "]");
      if (name == "chunk_bytes") e_.settings.chunk_bytes = x;
      if (name == "shm_chunk_bytes") e_.settings.shm_chunk_bytes = x;
      if (name == "shm_slot_bytes") e_.settings.shm_slot_bytes = x;
      if (name == "socket_nconns") e_.settings.socket_nconns = x;
      if (name == "bucket_cap_bytes") e_.settings.bucket_cap_bytes = x;
      if (name == "first_bucket_bytes") e_.settings.first_bucket_bytes = x;
    }
    return e_.is_nccl() ? nccl_combination() : Status::Ok();
  }

  // NCCL_ALGO/NCCL_PROTO: names NCCL knows ("^" excludes, a comma list, "coll:Name" per
  // collective, as NCCL reads them); the others integers in NCCL's ranges.
  Status nccl_value(const Knob& k, const json& value) {
    const std::string name = k.name;
    if (name == "NCCL_ALGO" || name == "NCCL_PROTO") {
      if (!value.is_string()) return fail(name + " is not a string");
      static const char* const kAlgos[] = {"Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"};
      static const char* const kProtos[] = {"LL", "LL128", "Simple"};
      const std::string text = value.get<std::string>();
      std::string list = text[0] == '^' ? text.substr(1) : text;
      size_t start = 0;
      while (start <= list.size()) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) end = list.size();
        std::string item = list.substr(start, end - start);
        if (auto colon = item.rfind(':'); colon != std::string::npos) item = item.substr(colon + 1);
        bool ok = false;
        if (name == "NCCL_ALGO") {
          for (const char* a : kAlgos) ok = ok || item == a;
        } else {
          for (const char* p : kProtos) ok = ok || item == p;
        }
        if (!ok)
          return fail(name + "=" + text + ": '" + item + "' is not one of NCCL's " +
                      (name == "NCCL_ALGO" ? "algorithms (Tree, Ring, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT)"
                                           : "protocols (LL, LL128, Simple)"));
        start = end + 1;
      }
      e_.settings.nccl.emplace_back(name, text);
      return Status::Ok();
    }
    if (!value.is_number_integer()) return fail(name + " is not an integer");
    const bool too_big = value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(k.max);
    const int64_t x = too_big ? k.max + 1 : value.get<int64_t>();
    if (too_big || x < k.min || x > k.max)
      return fail(name + "=" + value.dump() + " is out of range [" + std::to_string(k.min) + ", " +
                  std::to_string(k.max) + "]");
    e_.settings.nccl.emplace_back(name, std::to_string(x));
    return Status::Ok();
  }

  // What NCCL refuses in combination (comm-tune's grid.validate_nccl says the same).
  Status nccl_combination() {
    auto get = [&](const char* name) -> int64_t {
      for (const auto& [n, v] : e_.settings.nccl)
        if (n == name) return std::stoll(v);
      return -1;
    };
    const int64_t nt = get("NCCL_SOCKET_NTHREADS"), ns = get("NCCL_NSOCKS_PERTHREAD");
    if (nt > 0 && ns > 0 && nt * ns > 64)
      return fail("NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = " + std::to_string(nt * ns) +
                  " is above 64, which NCCL refuses");
    for (auto [lo, hi] : {std::pair{"NCCL_MIN_CTAS", "NCCL_MAX_CTAS"}, std::pair{"NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"}})
      if (get(lo) > 0 && get(hi) > 0 && get(lo) > get(hi))
        return fail(std::string(lo) + "=" + std::to_string(get(lo)) + " is above " + hi + "=" + std::to_string(get(hi)));
    return Status::Ok();
  }

  const std::string& file_;
  const json& j_;
  Entry e_;
};

}  // namespace

const std::vector<Knob>& knobs() {
  // Bounds are the registry's own (params.cc): a profile cannot set what the environment could not.
  static const std::vector<Knob> table = [] {
    std::vector<Knob> t = {
        {"algo", "COMM_ALGO", Scope::kCall, 0, 0, "the collective's algorithm (a registry name)"},
        {"chunk_bytes", "COMM_CHUNK_BYTES", Scope::kCall, 0, 0,
         "pipelining chunk of the ring algorithms (shm_direct uses the smaller of it and shm_chunk_bytes)"},
        {"shm_chunk_bytes", "COMM_SHM_CHUNK_BYTES", Scope::kCall, 0, 0,
         "pipelining chunk of the shared-memory direct all-reduce"},
        {"shm_slot_bytes", "COMM_SHM_SLOT_BYTES", Scope::kCommunicator, 0, 0,
         "shared-memory slot per rank: all-reduce up to this size goes through the slots"},
        {"socket_nconns", "COMM_SOCKET_NCONNS", Scope::kCommunicator, 0, 0, "TCP connections per peer"},
        {"bucket_cap_bytes", "COMM_ENGINE_BUCKET_CAP_BYTES", Scope::kEngine, 0, 0,
         "gradient engine: bucket size limit (comm_engine_config_t.bucket_cap_bytes beats it too)"},
        {"first_bucket_bytes", "COMM_ENGINE_FIRST_BUCKET_BYTES", Scope::kEngine, 0, 0,
         "gradient engine: limit of the first bucket (comm_engine_config_t.first_bucket_bytes beats it too)"},
    };
    for (auto& k : t)
      if (const params::Param* p = params::find(k.env); p != nullptr && p->type == params::Type::kInt) {
        k.min = p->min;
        k.max = p->max;
      }
    return t;
  }();
  return table;
}

const std::vector<Knob>& nccl_knobs() {
  // NCCL's own names and ranges; the user's environment beats each (apply_nccl_settings).
  static const std::vector<Knob> table = {
      {"NCCL_ALGO", "NCCL_ALGO", Scope::kNccl, 0, 0, "NCCL's algorithms (Tree, Ring, ...; ^ excludes)"},
      {"NCCL_PROTO", "NCCL_PROTO", Scope::kNccl, 0, 0, "NCCL's protocols (LL, LL128, Simple; ^ excludes)"},
      {"NCCL_MIN_CTAS", "NCCL_MIN_CTAS", Scope::kNccl, 1, 64, "fewest CTAs (channels) per collective"},
      {"NCCL_MAX_CTAS", "NCCL_MAX_CTAS", Scope::kNccl, 1, 64, "most CTAs (channels) per collective"},
      {"NCCL_MIN_NCHANNELS", "NCCL_MIN_NCHANNELS", Scope::kNccl, 1, 64, "fewest channels (NCCL before 2.17)"},
      {"NCCL_MAX_NCHANNELS", "NCCL_MAX_NCHANNELS", Scope::kNccl, 1, 64, "most channels (NCCL before 2.17)"},
      {"NCCL_BUFFSIZE", "NCCL_BUFFSIZE", Scope::kNccl, int64_t{1} << 12, int64_t{1} << 30, "buffer per channel"},
      {"NCCL_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS", Scope::kNccl, 1, 16, "socket helper threads per connection"},
      {"NCCL_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD", Scope::kNccl, 1, 64, "sockets per helper thread"},
      {"NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_QPS_PER_CONNECTION", Scope::kNccl, 1, 128, "IB queue pairs per connection"},
  };
  return table;
}

const Knob* find_knob(const std::string& name) {
  for (const auto& k : knobs())
    if (name == k.name) return &k;
  return nullptr;
}

std::string Settings::describe() const {
  std::string text;
  auto add = [&](const char* name, const std::string& v) {
    if (!text.empty()) text += ' ';
    text += name;
    text += '=';
    text += v;
  };
  if (!algo.empty()) add("algo", algo);
  if (chunk_bytes) add("chunk_bytes", std::to_string(chunk_bytes));
  if (shm_chunk_bytes) add("shm_chunk_bytes", std::to_string(shm_chunk_bytes));
  if (shm_slot_bytes) add("shm_slot_bytes", std::to_string(shm_slot_bytes));
  if (socket_nconns) add("socket_nconns", std::to_string(socket_nconns));
  if (bucket_cap_bytes) add("bucket_cap_bytes", std::to_string(bucket_cap_bytes));
  if (first_bucket_bytes) add("first_bucket_bytes", std::to_string(first_bucket_bytes));
  for (const auto& [name, value] : nccl) add(name.c_str(), value);
  return text;
}

std::string Entry::label() const {
  std::string text = "entry #" + std::to_string(index);
  if (collective.empty()) return text;
  text += " (" + collective + ", " + std::to_string(ranks) + " ranks, " + transport;
  if (min_bytes != 0 || max_bytes != UINT64_MAX) {
    text += ", ";
    text += std::to_string(min_bytes);
    text += "..";
    if (max_bytes != UINT64_MAX) text += std::to_string(max_bytes);
    text += is_engine() ? " gradient bytes" : " bytes";
  }
  text += ')';
  return text;
}

Status parse_profile(const std::string& path, const std::string& text, Profile* out) {
  const std::string where = "COMM_TUNING_FILE='" + path + "': ";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgument(where + "not valid JSON: " + e.what() + "; fix it or regenerate it with comm-tune");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    return InvalidArgument(where + "not a tuning profile (\"format\" must be \"" + kFormat +
                           "\"); write it with comm-tune");
  if (!j.contains("version") || j["version"] != kVersion)
    return InvalidArgument(where + "profile version " + (j.contains("version") ? j["version"].dump() : "(none)") +
                           " is not supported; this libcomm reads version " + std::to_string(kVersion));
  if (!j.contains("entries") || !j["entries"].is_array())
    return InvalidArgument(where + "\"entries\" must be an array of entries");
  Profile p;
  p.path = path;
  p.hash = hash_bytes(text);
  int index = 0;
  for (const json& e : j["entries"]) {
    Entry entry;
    COMM_RETURN_IF_ERROR(EntryParser(path, index++, e).parse(&entry));
    p.entries.push_back(std::move(entry));
  }
  *out = std::move(p);
  return Status::Ok();
}

Status load_from_env(std::shared_ptr<const Profile>* out, std::string* hash) {
  out->reset();
  *hash = "none";
  std::string path;
  COMM_RETURN_IF_ERROR(params::get_string("COMM_TUNING_FILE", &path));
  if (path.empty()) return Status::Ok();
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("COMM_TUNING_FILE='" + path + "' cannot be read; fix the path or unset it");
  std::stringstream content;
  content << in.rdbuf();
  auto p = std::make_shared<Profile>();
  COMM_RETURN_IF_ERROR(parse_profile(path, content.str(), p.get()));
  *hash = p->hash;
  *out = std::move(p);
  return Status::Ok();
}

}  // namespace comm::tuning
