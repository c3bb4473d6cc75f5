// comm-top-store: the metrics endpoints a running job lists in its store (libcomm/src/observe/
// endpoints.h), for `comm-top --store` (tools/comm-top/comm-top), one line each: RANK HOST:PORT
// HOSTNAME. It connects as a rank does (libcomm/base/store/tcp_store.cc): with COMM_AUTH_TOKEN it
// proves the token by challenge-response (never sends it), with COMM_TLS=1 it runs TLS keyed the
// same way, so a job that refuses strangers refuses it too without the token. It only reads.
//
//   comm-top-store [HOST:PORT]     (default MASTER_ADDR:MASTER_PORT)
//
// Exit status: 0; 1 when the store cannot be reached or refuses (the message says why and what to
// do); 3 when no rank listed an endpoint (COMM_METRICS_ADDR unset?).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "deadline.h"
#include "observe/endpoints.h"
#include "params.h"
#include "store/store.h"
#include "tls/tls.h"

namespace {

int fail(const std::string& why) {
  std::fprintf(stderr, "comm-top-store: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace comm;
  std::string where = argc > 1 ? argv[1] : "";
  if (where.empty()) {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    if (addr == nullptr || port == nullptr)
      return fail("give the store as HOST:PORT, or set MASTER_ADDR and MASTER_PORT as the job's ranks have them");
    where = std::string(addr) + ":" + port;
  }
  const size_t colon = where.rfind(':');
  if (colon == std::string::npos || colon == 0) return fail(where + " is not HOST:PORT");
  TcpStoreOptions o;
  o.host = where.substr(0, colon);
  if (o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']') o.host = o.host.substr(1, o.host.size() - 2);
  o.port = std::atoi(where.c_str() + colon + 1);
  o.is_server = false;
  o.timeout_ms = 5000;  // a live job's store answers at once; a gone one should not hold comm-top
  if (Status st = params::get_string("COMM_AUTH_TOKEN", &o.auth_token); !st.ok()) return fail(st.message());
  int64_t tls = 0;
  (void)params::get_int("COMM_TLS", &tls);
  if (Status st = tls::context_from_env(tls != 0, o.auth_token, "store", "COMM_AUTH_TOKEN", &o.tls); !st.ok())
    return fail(st.message());
  std::shared_ptr<Store> store;
  if (Status st = make_tcp_store(o, &store); !st.ok())
    return fail("the job's store at " + where + ": " + st.message() +
                " (is the job running? with COMM_AUTH_TOKEN or COMM_TLS set, give comm-top the job's)");
  int64_t slots = 0;
  if (Status st = store->add(std::string(observe::kEndpointCounter), 0, &slots); !st.ok())
    return fail("the job's store at " + where + ": " + st.message());
  int listed = 0;
  for (int64_t s = 0; s < slots; ++s) {
    std::string value;
    // A slot taken but not yet written (a rank between its two requests) is skipped.
    if (!store->get(std::string(observe::kEndpointPrefix) + std::to_string(s), &value, Deadline::after_ms(500)).ok())
      continue;
    std::printf("%s\n", value.c_str());
    ++listed;
  }
  if (listed == 0) {
    std::fprintf(stderr, "comm-top-store: no rank of the job at %s lists a metrics endpoint (start it with "
                 "COMM_METRICS_ADDR)\n", where.c_str());
    return 3;
  }
  return 0;
}
