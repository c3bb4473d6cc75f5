#include "replace_failed.h"

#include <cstdio>

#include "grow.h"
#include "params.h"
#include "tls/tls.h"

namespace comm_run {

bool JobStore::serve(const std::string& port, int nranks) {
  comm::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = std::stoi(port);
  o.is_server = true;
  o.world_size = nranks;
  o.timeout_ms = 10000;
  bool tls = false;
  comm::Status st = comm::params::get_string("COMM_AUTH_TOKEN", &o.auth_token);
  if (st.ok()) st = comm::tls::enabled_from_env(&tls);
  if (st.ok()) st = comm::tls::context_from_env(tls, o.auth_token, "store", "COMM_AUTH_TOKEN", &o.tls);
  if (st.ok()) st = comm::make_tcp_store(o, &store_);
  if (!st.ok()) {
    std::fprintf(stderr, "comm-run: --replace-failed: cannot serve the job's store on 127.0.0.1:%s: %s\n",
                 port.c_str(), st.message().c_str());
    return false;
  }
  return true;
}

std::vector<Exclusion> JobStore::new_exclusions() {
  std::vector<Exclusion> out;
  int64_t n = 0;
  if (!store_ || !store_->add(comm::grow::kExclusions, 0, &n).ok()) return out;
  for (; seen_ < n; ++seen_) {
    std::string text;
    // Counted before written (grow_records.cc): the record follows within moments.
    if (!store_->get(comm::grow::exclusion_key(seen_ + 1), &text, comm::Deadline::after_ms(2000)).ok()) break;
    Exclusion e;
    long long gen = -1;
    if (std::sscanf(text.c_str(), "%d %lld", &e.slot, &gen) != 2 || gen < 0) {
      std::fprintf(stderr, "comm-run: --replace-failed: ignoring a malformed exclusion record '%s'\n", text.c_str());
      continue;
    }
    e.generation = gen;
    out.push_back(e);
  }
  return out;
}

int64_t JobStore::admitted(int slot) {
  int64_t n = -1;
  if (!store_ || !store_->add(comm::grow::joins_key(slot), 0, &n).ok()) return -1;
  return n;
}

}  // namespace comm_run
