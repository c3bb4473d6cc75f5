// comm_grow and its joiners (docs/design/core.md, "Growing a communicator"): the members' side is
// grow.cc, the joiner's (comm_init with COMM_JOIN=1) join.cc; this is what both read and write
// in the job store, so the two sides never disagree on a key or a format.
//
// The job-wide join queue, in the job store (never a communicator's prefix: a joiner knows no
// communicator yet):
//   job/join/tickets        the store's add: a joiner's ticket (1, 2, ...), in registration order
//   job/join/claimed        the store's add: the tickets the growing communicators have claimed
//   job/join/<t>/hello      the joiner of ticket t: its slot, host, reach address, settings
//   job/join/<t>/answer     the lowest member's answer: the grown communicator, RETRY or FAIL
//   job/join/<t>/alive      the store's add: bumped every 200 ms while the joiner waits for it
//   job/join/<t>/gone       the store's add: > 0 once the ticket is withdrawn (its joiner gave up or died)
// The exclusions comm_agree_failed decided (agree.cc writes, comm-run --replace-failed reads):
//   job/exclusions          the store's add: how many records there are
//   job/exclusion/<n>       "<world rank> <generation>": the process of that slot is excluded
//   job/excluded/<w>/<g>    the store's add: the record is written once (retried rounds, several
//                           communicators agreeing on one death)
//   job/slot/<w>/joins      the store's add: joiners admitted into slot w, the generation of the
//                           process in it (0: the one the launcher started first)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "communicator.h"
#include "status.h"
#include "store/store.h"

namespace comm::grow {

inline const char* kTickets = "job/join/tickets";
inline const char* kClaimed = "job/join/claimed";
inline std::string hello_key(int64_t t) { return "job/join/" + std::to_string(t) + "/hello"; }
inline std::string answer_key(int64_t t) { return "job/join/" + std::to_string(t) + "/answer"; }
inline std::string alive_key(int64_t t) { return "job/join/" + std::to_string(t) + "/alive"; }
inline std::string gone_key(int64_t t) { return "job/join/" + std::to_string(t) + "/gone"; }
inline const char* kExclusions = "job/exclusions";
inline std::string exclusion_key(int64_t n) { return "job/exclusion/" + std::to_string(n); }
inline std::string excluded_key(int world, int64_t gen) {
  return "job/excluded/" + std::to_string(world) + "/" + std::to_string(gen);
}
inline std::string joins_key(int world) { return "job/slot/" + std::to_string(world) + "/joins"; }

// What a joiner says about itself.
struct Hello {
  int slot = -1;         // its launcher slot (RANK, ...), -1 when none: its world rank if free
  uint64_t host = 0;     // fnv1a of its host identity (init_agreement.h): same host, same value
  std::string reach;     // the address the store reached it by ("" unknown): comm_shrink's meeting place
  std::string settings;  // settings_fingerprint(): must equal the members'
};
std::string encode_hello(const Hello& h);
bool decode_hello(const std::string& text, Hello* h);

// What a joiner needs to be a member of the grown communicator, as a member of a child has it.
struct Answer {
  std::string id, secret;
  int rank = 0;
  bool local_transport_usable = true;
  std::vector<int> host_of, world_ranks, world_gens;  // world_gens: comm_s's
  std::vector<std::string> world_addrs;  // indexed by world rank ("" unknown)
};

// Rank r's admission into its world slot (comm_s::world_gens; 0 where none is known).
inline int generation_of(comm_t c, int r) {
  return static_cast<size_t>(r) < c->world_gens.size() ? c->world_gens[static_cast<size_t>(r)] : 0;
}
std::string encode_answer(const Answer& a);  // "OK\n..."

// One joiner in the lowest member's decision (grow.cc, describe): "world gen host reach".
struct DecidedJoiner {
  int world = -1;
  int gen = 0;            // its admission into the slot (comm_s::world_gens)
  uint64_t host = 0;      // Hello::host
  std::string reach;      // Hello::reach, "" unknown
};
std::string encode_decided(const DecidedJoiner& j);
bool decode_decided(const std::string& line, DecidedJoiner* j);
bool decode_answer(const std::string& text, Answer* a);
inline const char* kRetry = "RETRY";  // claimed by a grow that failed: take a new ticket

// fnv1a of this process's host identity.
uint64_t host_hash();

// The grown communicator from a decision, on a member or a joiner: every field but its
// transport, which finish_communicator (communicator.h) connects.
std::unique_ptr<comm_s> make_grown(const Answer& a, const CommSettings& settings, std::shared_ptr<Store> store);

// Records the world ranks comm_agree_failed excluded, for the launcher (agree.cc calls it
// where it decides, before its verdict; best effort: the agreement does not depend on it), and
// those comm_exclude names (api.cc).
Status record_exclusions(comm_t c, const std::vector<int>& failed);  // the first failure, also logged
// A comm_grow that failed after its decision (payload: describe()'s, in grow.cc): the joiners it
// counted into their slots are members of nothing, so each is recorded as excluded, or no launcher
// would ever replace it (docs/design/core.md, "Growing a communicator").
void record_failed_joiners(Store& store, const std::string& payload);

// Whether the joiner of `ticket` gave up waiting (join.cc marks it), or was found dead before it
// was claimed (grow.cc): a grow leaves it out.
bool withdrawn(Store& store, int64_t ticket);
// Marks `ticket` withdrawn (best effort: a mark lost leaves the ticket to the liveness look).
void withdraw(Store& store, int64_t ticket);

// The joiner's comm_init (COMM_JOIN=1): join.cc.
Status join_communicator(const comm_config_t& cfg, comm_t* out);
// The members' comm_grow: grow.cc.
Status grow_communicator(comm_t c, int n_join, comm_t* out);

}  // namespace comm::grow
