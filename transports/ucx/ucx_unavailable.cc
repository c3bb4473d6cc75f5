// Built instead of the UCX transport when libucx-dev was not found at build time, so that the
// communicator and the plan can ask for UCX everywhere and get a clear answer.
#include "ucx/ucx_transport.h"

namespace comm::transport {

bool ucx_built() { return false; }
std::string ucx_why_not() { return "libucx-dev was not found when libcomm was built"; }

Status create_ucx_transport(const Options&, std::unique_ptr<Transport>*) {
  return Unavailable(
      "the UCX transport is not in this build (libucx-dev was not found when libcomm was built); "
      "use COMM_TRANSPORT=auto or socket, or rebuild with libucx-dev installed");
}

}  // namespace comm::transport
