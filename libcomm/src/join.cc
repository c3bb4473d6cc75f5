// comm_init with COMM_JOIN=1: a process that joins a running job at its next comm_grow (grow.cc:
// the members' side; grow.h: the keys). It opens the job's store as a client (never as its
// server, whatever its RANK says), registers in the job's join queue with what the lowest member
// needs to know of it, waits for the answer, and connects the grown communicator with the
// members, as a child of comm_dup does. docs/design/core.md, "Growing a communicator".
#include "communicator.h"
#include "grow.h"
#include "init_agreement.h"
#include "interfaces.h"
#include "log.h"
#include "params.h"
#include "process_plan.h"
#include "rendezvous.h"
#include "setup_watch.h"
#include "tls/tls.h"
#include "tuning/nccl_settings.h"

namespace comm::grow {
namespace {

std::string store_fix() {
  return "the job's store must outlive world rank 0 for joiners to find the job: run it under comm-run "
         "--replace-failed (which serves the store), with an external store (COMM_STORE_EXTERNAL=1, MASTER_ADDR:"
         "MASTER_PORT served outside the ranks), or with init_method file://";
}

// A launcher runs one process per slot at a time, so a joiner of slot `slot` that starts finds
// every earlier process of its slot dead: their tickets no grow has claimed yet are withdrawn,
// or the next grow would admit a dead process (whose set-up then fails) and record an exclusion
// of the slot's generation that its launcher would take for this process's (the chaos runs saw
// that cascade: each grow admitted the previous, killed, joiner).
void withdraw_earlier_tickets(Store& store, int slot) {
  int64_t claimed = 0, tickets = 0;
  if (!store.add(kClaimed, 0, &claimed).ok() || !store.add(kTickets, 0, &tickets).ok()) return;
  for (int64_t t = claimed + 1; t <= tickets; ++t) {
    std::string text;
    Hello h;
    if (!store.get(hello_key(t), &text, Deadline::after_ms(100)).ok() || !decode_hello(text, &h) || h.slot != slot)
      continue;
    withdraw(store, t);
    COMM_INFO(kInit, "joiner (slot %d): withdrew ticket %lld of an earlier process of its slot (it is gone)", slot,
              static_cast<long long>(t));
  }
}

}  // namespace

bool withdrawn(Store& store, int64_t ticket) {
  int64_t gone = 0;
  return store.add(gone_key(ticket), 0, &gone).ok() && gone > 0;
}

void withdraw(Store& store, int64_t ticket) {
  int64_t ignored = 0;
  (void)store.add(gone_key(ticket), 1, &ignored);
}

Status join_communicator(const comm_config_t& cfg_in, comm_t* out) {
  comm_config_t cfg = cfg_in;
  cfg.rank = COMM_UNSET;  // a joiner's rank is the grown communicator's to give
  cfg.world_size = COMM_UNSET;
  CommSettings settings;
  COMM_RETURN_IF_ERROR(resolve_settings(cfg, &settings));
  Identity id;
  COMM_RETURN_IF_ERROR(resolve_identity(cfg, &id));
  // The launcher's slot (a replacement is started with the RANK of the rank it replaces).
  const int slot = id.world_size > 1 ? id.rank : -1;
  id.join = true;  // open_store: a client
  if (slot >= 0) log::set_thread_rank(slot);
  announce_once();
  const std::string where =
      std::string("joiner") + (slot >= 0 ? " (slot " + std::to_string(slot) + ")" : "") + " with COMM_JOIN=1: ";
  const bool tcp = id.init_method == "env://" || id.init_method.rfind("tcp://", 0) == 0;
  if (tcp && id.store_port <= 0)
    return InvalidArgument(where + "no store to join: set MASTER_ADDR and MASTER_PORT (or init_method) to the "
                           "job's store, as for its ranks");
  std::string token;
  COMM_RETURN_IF_ERROR(params::get_string("COMM_AUTH_TOKEN", &token));
  std::shared_ptr<tls::Context> store_tls;
  COMM_RETURN_IF_ERROR(tls::context_from_env(settings.tls, token, "store", "COMM_AUTH_TOKEN", &store_tls));
  std::shared_ptr<Store> store;
  Status opened = open_store(id, settings.timeout_ms, token, &store, store_tls);
  if (!opened.ok())
    return Unavailable(where + "the job's store does not answer (" + opened.message() + "); " + store_fix());
  std::vector<std::string> notes;
  topology::prepare_process(store.get(), tuning::nccl_settings(settings.profile.get(), id.world_size, &notes));
  topology::remember_store_host(id.store_host);

  Hello hello;
  hello.slot = slot;
  hello.host = host_hash();
  hello.reach = store->reach_address();
  hello.settings = settings_fingerprint(settings);
  const Deadline deadline = Deadline::after_ms(settings.timeout_ms);
  if (slot >= 0) withdraw_earlier_tickets(*store, slot);
  std::string text, hook;
  for (;;) {
    int64_t ticket = 0;
    Status st = store->add(kTickets, 1, &ticket);
    if (st.ok()) st = store->set(hello_key(ticket), encode_hello(hello));
    if (!st.ok()) return Unavailable(where + "the job's store stopped answering (" + st.message() + "); " + store_fix());
    if (params::get_string("COMM_TEST_JOIN_EXIT", &hook).ok() && hook == "registered") std::_Exit(9);
    COMM_INFO(kInit, "%sregistered as ticket %lld; waiting for the job's next comm_grow", where.c_str(),
              static_cast<long long>(ticket));
    {
      Bumper alive(store, alive_key(ticket), std::chrono::milliseconds(50));  // grow.cc admits only a joiner whose counter moves
      st = store->get(answer_key(ticket), &text, deadline);
    }
    if (!st.ok()) {
      withdraw(*store, ticket);  // a grow that claims it later leaves it out
      if (st.code() != COMM_ERR_TIMEOUT)
        return Unavailable(where + "the job's store stopped answering (" + st.message() + "); " + store_fix());
      return Timeout(where + "no comm_grow admitted this process within " + std::to_string(settings.timeout_ms) +
                     " ms (COMM_TIMEOUT_MS); do the job's ranks call comm_grow (Communicator.grow()), and is this "
                     "the job's store (MASTER_ADDR/MASTER_PORT or init_method)?");
    }
    if (text != kRetry) break;
    if (deadline.expired())
      return Timeout(where + "the comm_grow calls that claimed this process failed until its timeout (" +
                     std::to_string(settings.timeout_ms) + " ms); see the members' errors");
  }
  if (params::get_string("COMM_TEST_JOIN_EXIT", &hook).ok() && hook == "answered") std::_Exit(9);
  if (text.rfind("FAIL\n", 0) == 0) return InvalidUsage(where + "the job refused this process: " + text.substr(5));
  Answer a;
  if (!decode_answer(text, &a))
    return Internal(where + "the answer in the job's store is malformed (a libcomm of another version? start every "
                    "process with the same libcomm)");
  log::set_thread_rank(a.rank);
  COMM_INFO(kInit, "%sadmitted as rank %d of %zu in comm %s", where.c_str(), a.rank, a.host_of.size(), a.id.c_str());
  std::unique_ptr<comm_s> g = make_grown(a, settings, store);
  g->setup_watch = SetupWatch::for_joiner(store, a.id, a.rank);  // alive, says its thread, until set up
  return finish_communicator(std::move(g), out).prefixed(where);
}

}  // namespace comm::grow
