// UCX, opened with dlopen at the first use (libucp.so.0, or COMM_UCX_LIBRARY), the way the CUDA
// runtime and NCCL are (libcomm/base/dl/): libcomm.so links no UCX library, so it loads on a host
// without UCX and uses sockets there. The table's types come from ucp.h, so a signature can never
// drift; libucs's calls are found through libucp's own dependencies.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

namespace comm::transport {

struct UcxLibrary {
  std::string path;     // the name dlopen succeeded with
  std::string why_not;  // why UCX cannot be used ("" when it can)

#define COMM_UCX_FN(name) decltype(&::name) name = nullptr
  COMM_UCX_FN(ucp_get_version);
  COMM_UCX_FN(ucp_config_read);
  COMM_UCX_FN(ucp_config_release);
  COMM_UCX_FN(ucp_init_version);  // ucp_init is an inline over it
  COMM_UCX_FN(ucp_cleanup);
  COMM_UCX_FN(ucp_worker_create);
  COMM_UCX_FN(ucp_worker_destroy);
  COMM_UCX_FN(ucp_worker_get_address);
  COMM_UCX_FN(ucp_worker_release_address);
  COMM_UCX_FN(ucp_worker_get_efd);
  COMM_UCX_FN(ucp_worker_arm);
  COMM_UCX_FN(ucp_worker_progress);
  COMM_UCX_FN(ucp_worker_flush_nbx);
  COMM_UCX_FN(ucp_ep_create);
  COMM_UCX_FN(ucp_ep_flush_nbx);
  COMM_UCX_FN(ucp_ep_close_nbx);
  COMM_UCX_FN(ucp_tag_send_nbx);
  COMM_UCX_FN(ucp_tag_recv_nbx);
  COMM_UCX_FN(ucp_tag_probe_nb);
  COMM_UCX_FN(ucp_request_check_status);
  COMM_UCX_FN(ucp_request_cancel);
  COMM_UCX_FN(ucp_request_free);
  COMM_UCX_FN(ucs_status_string);
#undef COMM_UCX_FN

  bool usable() const { return why_not.empty(); }
};

// Opened once for the life of the process; the first failure is logged at INFO (NET).
const UcxLibrary& ucx_library();

}  // namespace comm::transport
