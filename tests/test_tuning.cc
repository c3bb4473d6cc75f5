// The tuning profile (COMM_TUNING_FILE): what is refused at init and how each error names its
// entry, which entries a communicator takes, and that the environment beats the profile.
// tests/tuning/test_tuning_init.sh checks the same through comm_init in real processes.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "tuning/apply.h"
#include "tuning/profile.h"

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

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) ::setenv(name, value, 1); else ::unsetenv(name);
  }
  ~EnvGuard() {
    if (had_) ::setenv(name_, old_.c_str(), 1); else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

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
                                  "settings": {"algo": "ring"}})")).find("transport 'nccl' is unknown") !=
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
