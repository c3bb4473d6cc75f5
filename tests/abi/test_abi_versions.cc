// The ABI's versions: comm_get_version, and what each minor version added, declared, exported
// and refusing bad input (1.7 receives from any rank, 1.8 the agreement on failed ranks, 1.9
// comm_grow, 1.10 comm_agree's flag, 1.11 comm_exclude). The processes that use them:
// test_agree_processes.cc, test_grow_processes.cc, tests/python/test_fault_tolerant.py.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "harness.h"

using namespace abi;

TEST_CASE("comm_get_version reports the header's ABI version", "[lifecycle]") {
  int major = -1, minor = -1;
  CHECK(comm_get_version(&major, &minor) == COMM_OK);
  CHECK(major == COMM_ABI_VERSION_MAJOR);
  CHECK(minor == COMM_ABI_VERSION_MINOR);
}

TEST_CASE("ABI 1.7: COMM_ANY_SOURCE, comm_recv_any and comm_irecv_any are declared and exported", "[lifecycle]") {
  STATIC_REQUIRE(COMM_ABI_VERSION_MAJOR == 1);
  STATIC_REQUIRE(COMM_ABI_VERSION_MINOR >= 7);
  STATIC_REQUIRE(COMM_ANY_SOURCE < 0);  // never a rank
  STATIC_REQUIRE(COMM_ANY_SOURCE != COMM_UNSET);
  comm_status_t (*recv_any)(comm_t, void*, size_t, comm_dtype_t, int*, comm_stream_t) = comm_recv_any;
  comm_status_t (*irecv_any)(comm_t, void*, size_t, comm_dtype_t, int*, comm_request_t*) = comm_irecv_any;
  CHECK(recv_any != nullptr);
  CHECK(irecv_any != nullptr);
  int source = 0, x = 0;
  comm_request_t req = nullptr;
  CHECK(comm_recv_any(nullptr, &x, 1, COMM_INT32, &source, nullptr) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(source == COMM_ANY_SOURCE);  // written before anything else: no rank matched
  CHECK(comm_irecv_any(nullptr, &x, 1, COMM_INT32, &source, &req) == COMM_ERR_INVALID_ARGUMENT);
}

TEST_CASE("ABI 1.8: comm_agree_failed and COMM_SHRINK_AGREE: bad input is refused; a healthy communicator agrees "
          "on no failed rank and shrinks to itself", "[lifecycle]") {
  STATIC_REQUIRE(COMM_ABI_VERSION_MINOR >= 8);
  STATIC_REQUIRE(COMM_SHRINK_AGREE < 0);  // never a count
  int failed[4] = {-1, -1, -1, -1}, n_failed = -1;
  CHECK(comm_agree_failed(nullptr, failed, 4, &n_failed) == COMM_ERR_INVALID_ARGUMENT);
  const int n = 3;
  Ranks ranks = init_ranks(n, "agree-healthy", 20000);
  REQUIRE(ranks.all_ok());
  CHECK(comm_agree_failed(ranks.comms[0], failed, 4, nullptr) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_agree_failed(ranks.comms[0], nullptr, 4, &n_failed) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_agree_failed(ranks.comms[0], failed, -1, &n_failed) == COMM_ERR_INVALID_ARGUMENT);
  struct Seen {
    comm_status_t agree = COMM_ERR_INTERNAL, shrink = COMM_ERR_INTERNAL;
    int n_failed = -1, size = -1;
    Reduced after;
    std::string message;
  };
  auto seen = on_ranks(n, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    s.agree = comm_agree_failed(c, nullptr, 0, &s.n_failed);
    comm_t shrunk = nullptr;
    s.shrink = comm_shrink(c, nullptr, COMM_SHRINK_AGREE, &shrunk);
    if (s.shrink != COMM_OK) {
      s.message = comm_last_error(c);
    } else {
      comm_size(shrunk, &s.size);
      s.after = allreduce_sum(shrunk, r + 1);
      comm_destroy(shrunk);
    }
    comm_destroy(c);
    return s;
  });
  for (int r = 0; r < n; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << s.message);
    CHECK(s.agree == COMM_OK);
    CHECK(s.n_failed == 0);
    CHECK(s.shrink == COMM_OK);
    CHECK(s.size == n);
    CHECK(s.after.status == COMM_OK);
    CHECK(s.after.sum == 6);
  }
}

TEST_CASE("ABI 1.10: comm_agree: bad input is refused; every rank gets the bitwise AND of the flags, and "
          "one rank's 0 makes it 0 on every rank", "[lifecycle]") {
  STATIC_REQUIRE(COMM_ABI_VERSION_MINOR >= 10);
  int flag = 1, n_failed = -1;
  CHECK(comm_agree(nullptr, &flag, nullptr, 0, &n_failed) == COMM_ERR_INVALID_ARGUMENT);
  const int n = 3;
  Ranks ranks = init_ranks(n, "agree-flag", 20000);
  REQUIRE(ranks.all_ok());
  CHECK(comm_agree(ranks.comms[0], nullptr, nullptr, 0, &n_failed) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_agree(ranks.comms[0], &flag, nullptr, 0, nullptr) == COMM_ERR_INVALID_ARGUMENT);
  struct Seen {
    comm_status_t first = COMM_ERR_INTERNAL, second = COMM_ERR_INTERNAL;
    int flag_first = -1, flag_second = -1, n_failed = -1;
    std::string message;
  };
  auto seen = on_ranks(n, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    s.flag_first = r == 0 ? 7 : 5 | (1 << (r + 2));  // 0b111, 0b1101, 0b10101: AND 0b101
    s.first = comm_agree(c, &s.flag_first, nullptr, 0, &s.n_failed);
    s.flag_second = r == 1 ? 0 : 1;  // one rank's admission failed: none goes on with it
    if (s.first == COMM_OK) s.second = comm_agree(c, &s.flag_second, nullptr, 0, &s.n_failed);
    if (s.second != COMM_OK) s.message = comm_last_error(c);
    comm_destroy(c);
    return s;
  });
  for (int r = 0; r < n; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << s.message);
    CHECK(s.first == COMM_OK);
    CHECK(s.flag_first == 5);
    CHECK(s.second == COMM_OK);
    CHECK(s.flag_second == 0);
    CHECK(s.n_failed == 0);
  }
}

TEST_CASE("ABI 1.9: comm_grow: bad input is refused; with nobody waiting COMM_GROW_WAITING gives NULL, and waiting "
          "for a joiner that never comes times out leaving the communicator usable", "[lifecycle]") {
  STATIC_REQUIRE(COMM_ABI_VERSION_MINOR >= 9);
  STATIC_REQUIRE(COMM_GROW_WAITING < 0);  // never a count
  comm_t out = nullptr;
  CHECK(comm_grow(nullptr, 1, &out) == COMM_ERR_INVALID_ARGUMENT);
  const int n = 3;
  Ranks ranks = init_ranks(n, "grow-nobody", 1500);
  REQUIRE(ranks.all_ok());
  CHECK(comm_grow(ranks.comms[0], 1, nullptr) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_grow(ranks.comms[0], 0, &out) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_grow(ranks.comms[0], -2, &out) == COMM_ERR_INVALID_ARGUMENT);
  struct Seen {
    comm_status_t waiting = COMM_ERR_INTERNAL, one = COMM_ERR_INTERNAL;
    bool null_out = false;
    Reduced after;
    std::string message;
  };
  auto seen = on_ranks(n, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    comm_t grown = reinterpret_cast<comm_t>(&s);  // must come back NULL
    s.waiting = comm_grow(c, COMM_GROW_WAITING, &grown);
    s.null_out = grown == nullptr;
    s.one = comm_grow(c, 1, &grown);  // nobody comes within the 1.5 s timeout
    s.message = comm_last_error(c);
    s.after = allreduce_sum(c, r + 1);
    comm_destroy(c);
    return s;
  });
  for (int r = 0; r < n; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << s.message);
    CHECK(s.waiting == COMM_OK);
    CHECK(s.null_out);
    CHECK(s.one == COMM_ERR_TIMEOUT);
    CHECK(s.message.find("COMM_JOIN=1") != std::string::npos);
    CHECK(s.after.status == COMM_OK);
    CHECK(s.after.sum == 6);
  }
}

namespace {
std::string file_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}
}  // namespace

// The record a launcher reads (libcomm/src/grow.h: job/exclusions counts them, job/exclusion/<n>
// is "<world rank> <generation>"), read here as the file store writes them (one file per key,
// "%XX" for '/': libcomm/base/store/file_store.cc), as bench/chaos_slot.py reads them.
TEST_CASE("ABI 1.11: comm_exclude: bad input is refused and records nothing; two members naming one joiner record "
          "it once, for the launcher, also after the slot's next admission", "[lifecycle]") {
  STATIC_REQUIRE(COMM_ABI_VERSION_MINOR >= 11);
  const int one = 1;
  CHECK(comm_exclude(nullptr, &one, 1) == COMM_ERR_INVALID_ARGUMENT);
  char pattern[] = "/tmp/comm-exclude-XXXXXX";
  REQUIRE(mkdtemp(pattern) != nullptr);
  const std::string dir = pattern, method = "file://" + dir;
  const int n = 3;
  Ranks ranks = init_ranks(n, "exclude", 20000, [&](int, comm_config_t& cfg) { cfg.init_method = method.c_str(); });
  REQUIRE(ranks.all_ok());
  comm_t c0 = ranks.comms[0];
  const int self = 0, outside = 3, negative = -1, twice[2] = {2, 2}, all[3] = {1, 2, 0};
  CHECK(comm_exclude(c0, &one, 0) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_exclude(c0, nullptr, 1) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_exclude(c0, all, 3) == COMM_ERR_INVALID_ARGUMENT);  // as many as the communicator
  CHECK(comm_exclude(c0, &self, 1) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_exclude(c0, &outside, 1) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_exclude(c0, &negative, 1) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(comm_exclude(c0, twice, 2) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(std::string(comm_last_error(c0)).find("named twice") != std::string::npos);
  const std::string count_file = dir + "/kjob%2Fexclusions";
  CHECK(!std::filesystem::exists(count_file));  // nothing recorded by a refused call
  const int joiner = 2;
  CHECK(comm_exclude(c0, &joiner, 1) == COMM_OK);
  CHECK(comm_exclude(ranks.comms[1], &joiner, 1) == COMM_OK);  // the same process: recorded once
  CHECK(file_text(count_file) == "1");
  CHECK(file_text(dir + "/kjob%2Fexclusion%2F1") == "2 0");  // world rank 2, its first process
  // A member that records late, after the slot's next process was admitted (a grow counted it),
  // still names the process its communicator had: no new record, which the launcher would act
  // on by SIGKILLing the new one (grow_records.cc, record_exclusion).
  std::ofstream(dir + "/kjob%2Fslot%2F2%2Fjoins") << "1";
  CHECK(comm_exclude(ranks.comms[1], &joiner, 1) == COMM_OK);
  CHECK(file_text(count_file) == "1");
  CHECK(!std::filesystem::exists(dir + "/kjob%2Fexclusion%2F2"));
  destroy_ranks(ranks.comms);
  std::filesystem::remove_all(dir);
}
