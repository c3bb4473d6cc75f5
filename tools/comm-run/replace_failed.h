// comm-run --replace-failed: the job's store, served in comm-run's process so that no rank's
// death loses it (the joiners that replace lost ranks find the job there), and the exclusions
// the ranks' comm_agree_failed records in it (libcomm/src/grow.h: the keys; docs/design/core.md,
// "Growing a communicator"). The launcher (launcher.cc) acts on them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/store.h"

namespace comm_run {

struct Exclusion {
  int slot = -1;
  int64_t generation = 0;  // joiners admitted into the slot when it was admitted: which of its processes it is
};

class JobStore {
 public:
  // Serves libcomm's TCP store on 127.0.0.1:port, with COMM_AUTH_TOKEN and COMM_TLS as the ranks
  // will use them; false, with the reason on stderr, when it cannot.
  bool serve(const std::string& port, int nranks);
  // The exclusions recorded since the last call, in the order they were recorded.
  std::vector<Exclusion> new_exclusions();
  // How many joiners the members admitted into the slot (its process's generation); -1 unknown.
  int64_t admitted(int slot);

 private:
  std::shared_ptr<comm::Store> store_;
  int64_t seen_ = 0;
};

}  // namespace comm_run
