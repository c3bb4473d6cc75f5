// A call whose outcome is asserted later, on the test's thread: the expected status and the
// words its message must contain (each group: at least one alternative, case-insensitive).
#pragma once

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "harness.h"

namespace abi {

using Words = std::vector<std::vector<std::string>>;

struct Probe {
  std::string what;
  comm_status_t expect = COMM_OK;
  Words words;
  Outcome got;
};

class Probes {
 public:
  // Runs call now (on the calling rank's thread); comm is what comm_last_error is asked with.
  template <class F>
  void run(const std::string& what, comm_status_t expect, Words words, comm_t comm, F call) {
    Probe p{what, expect, std::move(words), timed(comm, call)};
    list.push_back(std::move(p));
  }
  std::vector<Probe> list;
};

inline void check_probe(const Probe& p, const std::string& who) {
  INFO(who << ": " << p.what << " -> " << describe(p.got));
  CHECK(status_name(p.got.status) == status_name(p.expect));
  for (const auto& group : p.words) {
    bool found = false;
    std::string alternatives;
    for (const auto& w : group) {
      found = found || icontains(p.got.message, w);
      alternatives += (alternatives.empty() ? "" : " or ") + ("\"" + w + "\"");
    }
    INFO("the message should contain " << alternatives);
    CHECK(found);
  }
}

inline void check_probes(const std::vector<Probes>& per_rank) {
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (const Probe& p : per_rank[r].list) check_probe(p, "rank " + std::to_string(r));
  }
}

}  // namespace abi
