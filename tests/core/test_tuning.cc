// The tuning profile (COMM_TUNING_FILE): what is refused at init and how each error names its
// entry, which entries a communicator takes, and that the environment beats the profile.
// tests/tuning/test_tuning.py checks the same through comm_init in real processes.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "nccl_env.h"
#include "tuning/apply.h"
#include "tuning/nccl_settings.h"
#include "tuning/profile.h"
#include "support/env_guard.h"

using comm::transport::CollKind;
using namespace comm::tuning;

namespace {

std::string profile_with(const std::string& entries) {
  return R"({"format": "libcomm-tuning-profile", "version": 1, "entries": [)" + entries + "]}";
}

const char* kTwoRanks =
    R"({"collective": "allreduce", "ranks": 2, "transport": "shm", "min_bytes": 1024, "max_bytes": 4096,
        "settings": {"algo": "ring", "chunk_bytes": 65536}, "measured": {"gain": 1.2}},
       {"collective": "allreduce", "ranks": 4, "transport": "shm", "settings": {"algo": "ring"}},
       {"collective": "*", "ranks": 2, "transport": "shm", "settings": {"shm_slot_bytes": 4096}},
       {"collective": "broadcast", "ranks": 2, "transport": "socket", "settings": {"chunk_bytes": 8192}})";

std::string error_of(const std::string& text) {
  Profile p;
  comm::Status st = parse_profile("p.json", text, &p);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  return st.message();
}


}  // namespace

TEST_CASE("a valid profile parses, with a stable hash", "[tuning]") {
  Profile p, q;
  REQUIRE(parse_profile("p.json", profile_with(kTwoRanks), &p).ok());
  REQUIRE(p.entries.size() == 4);
  CHECK(p.entries[0].kind == CollKind::kAllreduce);
  CHECK(p.entries[0].min_bytes == 1024);
  CHECK(p.entries[0].settings.describe() == "algo=ring chunk_bytes=65536");
  CHECK(p.entries[0].gain == Approx(1.2));
  CHECK(p.entries[1].max_bytes == UINT64_MAX);
  REQUIRE(parse_profile("q.json", profile_with(kTwoRanks), &q).ok());
  CHECK(p.hash == q.hash);
  REQUIRE(parse_profile("q.json", profile_with(kTwoRanks) + " ", &q).ok());
  CHECK(p.hash != q.hash);  // ranks agree on the file's bytes
}

TEST_CASE("a profile that does not parse is refused, saying where", "[tuning]") {
  std::string e = error_of(R"({"format": "libcomm-tuning-profile", "entries": [)");
  CHECK(e.find("p.json") != std::string::npos);
  CHECK(e.find("not valid JSON") != std::string::npos);
  CHECK(e.find("line") != std::string::npos);
  CHECK(error_of(R"({"entries": []})").find("not a tuning profile") != std::string::npos);
  CHECK(error_of(R"({"format": "libcomm-tuning-profile", "version": 2, "entries": []})").find("version 2") !=
        std::string::npos);
}

TEST_CASE("an unknown knob or a value out of range is refused, naming the entry", "[tuning]") {
  std::string e = error_of(profile_with(
      R"({"collective": "allreduce", "ranks": 2, "transport": "shm", "settings": {"algo": "ring"}},
         {"collective": "allreduce", "ranks": 4, "transport": "shm", "settings": {"chunk_size": 65536}})"));
  CHECK(e.find("entry #1 (allreduce, 4 ranks, shm)") != std::string::npos);
  CHECK(e.find("unknown knob 'chunk_size'") != std::string::npos);

  e = error_of(profile_with(R"({"collective": "allreduce", "ranks": 2, "transport": "shm",
                                "min_bytes": 0, "max_bytes": 10, "settings": {"chunk_bytes": 100}})"));
  CHECK(e.find("entry #0 (allreduce, 2 ranks, shm, 0..10 bytes)") != std::string::npos);
  CHECK(e.find("chunk_bytes=100 is out of range [4096,") != std::string::npos);

  e = error_of(profile_with(R"({"collective": "*", "ranks": 2, "transport": "socket",
                                "settings": {"socket_nconns": 9}})"));
  CHECK(e.find("socket_nconns=9 is out of range [1, 8]") != std::string::npos);
  e = error_of(profile_with(R"({"collective": "*", "ranks": 2, "transport": "socket",
                                "settings": {"socket_nconns": 18446744073709551615}})"));
  CHECK(e.find("out of range") != std::string::npos);

  e = error_of(profile_with(R"({"collective": "broadcast", "ranks": 2, "transport": "shm",
                                "settings": {"algo": "recursive_doubling"}})"));
  CHECK(e.find("algo 'recursive_doubling' is not a broadcast algorithm (pipelined_chain, binomial_tree)") !=
        std::string::npos);
  e = error_of(profile_with(R"({"collective": "allreduce", "ranks": 2, "transport": "shm",
                                "settings": {"socket_nconns": 2}})"));
  CHECK(e.find("whole communicator") != std::string::npos);
  CHECK(error_of(profile_with(R"({"collective": "allreduce", "ranks": 2, "transport": "nccl",
                                  "settings": {"algo": "ring"}})")).find("NCCL reads once per process: use collective") !=
        std::string::npos);
  Profile ucx;
  CHECK(parse_profile("p.json", profile_with(R"({"collective": "allreduce", "ranks": 2, "transport": "shm+ucx",
                                                 "settings": {"algo": "ring"}})"), &ucx).ok());
  CHECK(error_of(profile_with(R"({"collective": "allreduce", "ranks": 2, "transport": "shm", "setting": {}})"))
            .find("unknown field 'setting'") != std::string::npos);
  CHECK(error_of(profile_with(R"({"collective": "allreduce", "ranks": 2, "transport": "shm",
                                  "min_bytes": 10, "max_bytes": 1, "settings": {"algo": "ring"}})"))
            .find("min_bytes 10 is above max_bytes 1") != std::string::npos);
}

TEST_CASE("entries for another rank count or transport are ignored, each with a line that says so", "[tuning]") {
  EnvGuard algo("COMM_ALGO", nullptr), chunk("COMM_CHUNK_BYTES", nullptr), slot("COMM_SHM_SLOT_BYTES", nullptr);
  auto p = std::make_shared<Profile>();
  REQUIRE(parse_profile("p.json", profile_with(kTwoRanks), p.get()).ok());
  std::vector<std::string> notes;
  auto a = Applied::match(p, 2, "shm", &notes);
  REQUIRE(notes.size() == 2);
  CHECK(notes[0] == "entry #1 (allreduce, 4 ranks, shm) ignored: written for 4 ranks over shm, this communicator "
                    "has 2 ranks over shm");
  CHECK(notes[1].find("entry #3 (broadcast, 2 ranks, socket) ignored") == 0);
  CHECK(a->shm_slot_bytes() == 4096);
  CHECK(a->socket_nconns() == 0);
  // The size range is inclusive, per collective.
  CHECK(a->for_call(CollKind::kAllreduce, 1023) == nullptr);
  REQUIRE(a->for_call(CollKind::kAllreduce, 1024) != nullptr);
  CHECK(a->for_call(CollKind::kAllreduce, 4096)->algo == "ring");
  CHECK(a->for_call(CollKind::kAllreduce, 4096)->chunk_bytes == 65536);
  CHECK(a->for_call(CollKind::kAllreduce, 4097) == nullptr);
  CHECK(a->for_call(CollKind::kBroadcast, 2048) == nullptr);

  notes.clear();
  a = Applied::match(p, 8, "shm", &notes);
  CHECK(notes.size() == 4);
  CHECK(a->call_entries() == 0);
  CHECK(a->comm_settings().empty());
}

TEST_CASE("the environment beats the profile, knob by knob", "[tuning]") {
  auto p = std::make_shared<Profile>();
  REQUIRE(parse_profile("p.json", profile_with(kTwoRanks), p.get()).ok());
  EnvGuard algo("COMM_ALGO", nullptr), slot("COMM_SHM_SLOT_BYTES", "1024"), chunk("COMM_CHUNK_BYTES", "262144");
  std::vector<std::string> notes;
  auto a = Applied::match(p, 2, "shm", &notes);
  const CallTuning* t = a->for_call(CollKind::kAllreduce, 2048);
  REQUIRE(t != nullptr);
  CHECK(t->algo == "ring");
  CHECK(t->chunk_bytes == 0);  // the communicator's COMM_CHUNK_BYTES applies
  CHECK(t->applied == "algo=ring");
  CHECK(a->shm_slot_bytes() == 0);
  bool said = false;
  for (const auto& n : notes)
    said = said || n == "entry #0 (allreduce, 2 ranks, shm, 1024..4096 bytes): chunk_bytes=65536 not applied: "
                        "COMM_CHUNK_BYTES=262144 is set in the environment, which beats the profile";
  CHECK(said);

  // With every knob of an entry set in the environment, the entry is dropped entirely.
  EnvGuard forced("COMM_ALGO", "recursive_doubling");
  notes.clear();
  a = Applied::match(p, 2, "shm", &notes);
  CHECK(a->for_call(CollKind::kAllreduce, 2048) == nullptr);
}

TEST_CASE("a call's size is counted as comm-bench's size column", "[tuning]") {
  CHECK(call_bytes(CollKind::kAllreduce, 256, COMM_FLOAT32, 4) == 1024);
  CHECK(call_bytes(CollKind::kAllgather, 256, COMM_FLOAT32, 4) == 4096);
  CHECK(call_bytes(CollKind::kReduceScatter, 256, COMM_FLOAT16, 4) == 2048);
  CHECK(call_bytes(CollKind::kBroadcast, 3, COMM_FLOAT64, 4) == 24);
}

// The gradient engine's entries: keyed by rank count, transport and the model's gradient bytes.
const char* kEngine =
    R"({"collective": "engine", "ranks": 2, "transport": "shm", "min_bytes": 1000, "max_bytes": 1999,
        "settings": {"bucket_cap_bytes": 4194304, "first_bucket_bytes": 262144}, "measured": {"gain": 1.1}},
       {"collective": "engine", "ranks": 2, "transport": "shm", "min_bytes": 2000,
        "settings": {"bucket_cap_bytes": 8388608}},
       {"collective": "engine", "ranks": 4, "transport": "shm", "settings": {"bucket_cap_bytes": 65536}})";

TEST_CASE("engine entries are chosen by the model's gradient bytes, for their rank count and transport", "[tuning]") {
  auto p = std::make_shared<Profile>();
  REQUIRE(parse_profile("p.json", profile_with(kEngine), p.get()).ok());
  CHECK(p->entries[0].label() == "entry #0 (engine, 2 ranks, shm, 1000..1999 gradient bytes)");
  CHECK(p->entries[0].settings.describe() == "bucket_cap_bytes=4194304 first_bucket_bytes=262144");
  std::vector<std::string> notes;
  auto a = Applied::match(p, 2, "shm", &notes);
  CHECK(a->engine_entries() == 2);
  CHECK(a->call_entries() == 0);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("entry #2 (engine, 4 ranks, shm) ignored: written for 4 ranks over shm") == 0);
  CHECK(a->for_engine(999) == nullptr);
  REQUIRE(a->for_engine(1000) != nullptr);
  CHECK(a->for_engine(1999)->index == 0);
  CHECK(a->for_engine(1u << 30)->index == 1);
  notes.clear();
  CHECK(Applied::match(p, 2, "socket", &notes)->engine_entries() == 0);
  CHECK(notes.size() == 3);
}

TEST_CASE("a bad engine entry is refused, naming the entry", "[tuning]") {
  std::string e = error_of(profile_with(R"({"collective": "engine", "ranks": 2, "transport": "shm",
                                            "settings": {"bucket_cap": 1024}})"));
  CHECK(e.find("entry #0 (engine, 2 ranks, shm) sets the unknown knob 'bucket_cap'") != std::string::npos);
  e = error_of(profile_with(R"({"collective": "engine", "ranks": 2, "transport": "shm",
                                "settings": {"bucket_cap_bytes": 0}})"));
  CHECK(e.find("bucket_cap_bytes=0 is out of range [1, 1099511627776]") != std::string::npos);
  e = error_of(profile_with(R"({"collective": "allreduce", "ranks": 2, "transport": "shm",
                                "settings": {"first_bucket_bytes": 4096}})"));
  CHECK(e.find("acts on the gradient engine: put it in an entry with collective \"engine\"") != std::string::npos);
  e = error_of(profile_with(R"({"collective": "engine", "ranks": 2, "transport": "shm",
                                "settings": {"chunk_bytes": 65536}})"));
  CHECK(e.find("chunk_bytes, which is not an engine knob") != std::string::npos);
}

const char* kNccl =
    R"({"collective": "*", "ranks": 2, "transport": "nccl",
        "settings": {"NCCL_PROTO": "^LL128", "NCCL_BUFFSIZE": 8388608}, "measured": {"gain": 1.07}},
       {"collective": "*", "ranks": 8, "transport": "nccl", "settings": {"NCCL_ALGO": "Tree"}})";

TEST_CASE("NCCL entries give their settings to communicators of their rank count", "[tuning]") {
  auto p = std::make_shared<Profile>();
  REQUIRE(parse_profile("p.json", profile_with(kNccl), p.get()).ok());
  std::vector<std::string> notes;
  auto s = nccl_settings(p.get(), 2, &notes);
  REQUIRE(s.size() == 2);
  CHECK(s[0].name == "NCCL_BUFFSIZE");  // in the JSON object's order (nlohmann: sorted by name)
  CHECK(s[0].value == "8388608");
  CHECK(s[1].value == "^LL128");
  CHECK(s[0].reason.find("tuning profile p.json entry #0 (*, 2 ranks, nccl)") == 0);
  CHECK(s[0].reason.find("1.070x") != std::string::npos);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] == "entry #1 (*, 8 ranks, nccl) ignored: NCCL settings written for 8 ranks, this communicator has 2");
  CHECK(nccl_settings(p.get(), 4, &notes).empty());
  CHECK(nccl_settings(nullptr, 2, &notes).empty());
  // Host communicators do not see them.
  notes.clear();
  auto a = Applied::match(p, 2, "shm", &notes);
  CHECK(notes.empty());
  CHECK(a->call_entries() == 0);
}

TEST_CASE("the profile's NCCL settings beat the plan's and never the user's environment", "[tuning]") {
  std::vector<comm::topology::NcclSetting> plan = {{"NCCL_IB_TIMEOUT", "22", "long-haul links", ""},
                                                   {"NCCL_BUFFSIZE", "4194304", "plan", ""}};
  std::vector<comm::topology::NcclSetting> tuned = {{"NCCL_BUFFSIZE", "8388608", "tuning profile entry #0", ""},
                                                    {"NCCL_PROTO", "Simple", "tuning profile entry #0", ""}};
  auto merged = comm::topology::merge_nccl_settings(plan, tuned);
  REQUIRE(merged.size() == 3);
  CHECK(merged[1].value == "8388608");
  CHECK(merged[1].reason.find("tuning profile entry #0 (over the topology plan's 4194304") == 0);
  EnvGuard proto("NCCL_PROTO", "LL"), buff("NCCL_BUFFSIZE", nullptr), ib("NCCL_IB_TIMEOUT", nullptr);
  auto applied = comm::topology::apply_nccl_settings(merged);
  CHECK(std::string(std::getenv("NCCL_BUFFSIZE")) == "8388608");
  CHECK(std::string(std::getenv("NCCL_PROTO")) == "LL");  // the user's
  CHECK(applied[2].set_by_libcomm == false);
  CHECK(applied[1].set_by_libcomm);
}

TEST_CASE("a bad NCCL entry is refused, naming the entry", "[tuning]") {
  auto nccl = [](const std::string& settings, const std::string& extra = "") {
    return error_of(profile_with(R"({"collective": "*", "ranks": 2, "transport": "nccl", )" + extra +
                                 R"("settings": )" + settings + "}"));
  };
  CHECK(nccl(R"({"NCCL_PROTO": "LL256"})").find("entry #0 (*, 2 ranks, nccl) NCCL_PROTO=LL256: 'LL256' is not one of "
                                                "NCCL's protocols") != std::string::npos);
  CHECK(nccl(R"({"NCCL_ALGO": "Ring,Star"})").find("'Star' is not one of NCCL's algorithms") != std::string::npos);
  CHECK(nccl(R"({"NCCL_BUFFSIZE": 1024})").find("NCCL_BUFFSIZE=1024 is out of range [4096, 1073741824]") !=
        std::string::npos);
  CHECK(nccl(R"({"NCCL_SOCKET_NTHREADS": 16, "NCCL_NSOCKS_PERTHREAD": 8})").find("= 128 is above 64") !=
        std::string::npos);
  CHECK(nccl(R"({"NCCL_MIN_CTAS": 8, "NCCL_MAX_CTAS": 4})").find("NCCL_MIN_CTAS=8 is above NCCL_MAX_CTAS=4") !=
        std::string::npos);
  CHECK(nccl(R"({"NCCL_NTHREADS": 64})").find("unknown knob 'NCCL_NTHREADS' (NCCL knobs: NCCL_ALGO") !=
        std::string::npos);
  CHECK(nccl(R"({"NCCL_ALGO": "Ring"})", R"("min_bytes": 1, )").find("has a size range") != std::string::npos);
  CHECK(error_of(profile_with(R"({"collective": "*", "ranks": 2, "transport": "shm",
                                  "settings": {"NCCL_ALGO": "Ring"}})")).find("NCCL's need transport \"nccl\"") !=
        std::string::npos);
}
