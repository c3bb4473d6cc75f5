#include "ucx/ucx_library.h"

#include <dlfcn.h>

#include "log.h"
#include "params.h"

namespace comm::transport {
namespace {

template <typename F>
void resolve(void* lib, F* fn, const char* symbol, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, symbol));
  if (*fn == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
}

void load(UcxLibrary* u) {
  std::string override_path;
  (void)params::get_string("COMM_UCX_LIBRARY", &override_path);
  const std::string name = override_path.empty() ? "libucp.so.0" : override_path;
  // RTLD_GLOBAL: UCX opens its own transport modules, which expect libucs's symbols in scope.
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    u->why_not = "UCX library not loadable: dlopen(" + name + ")" + (override_path.empty() ? "" : " (COMM_UCX_LIBRARY)") +
                 " failed" + (err ? std::string(": ") + err : std::string()) +
                 "; install libucx0 (or add its folder to LD_LIBRARY_PATH) to use UCX";
    return;
  }
  u->path = name;
  std::string missing;
#define COMM_RESOLVE(sym) resolve(lib, &u->sym, #sym, &missing)
  COMM_RESOLVE(ucp_get_version);
  COMM_RESOLVE(ucp_config_read);
  COMM_RESOLVE(ucp_config_release);
  COMM_RESOLVE(ucp_init_version);
  COMM_RESOLVE(ucp_cleanup);
  COMM_RESOLVE(ucp_worker_create);
  COMM_RESOLVE(ucp_worker_destroy);
  COMM_RESOLVE(ucp_worker_get_address);
  COMM_RESOLVE(ucp_worker_release_address);
  COMM_RESOLVE(ucp_worker_get_efd);
  COMM_RESOLVE(ucp_worker_arm);
  COMM_RESOLVE(ucp_worker_progress);
  COMM_RESOLVE(ucp_worker_flush_nbx);
  COMM_RESOLVE(ucp_ep_create);
  COMM_RESOLVE(ucp_ep_flush_nbx);
  COMM_RESOLVE(ucp_ep_close_nbx);
  COMM_RESOLVE(ucp_tag_send_nbx);
  COMM_RESOLVE(ucp_tag_recv_nbx);
  COMM_RESOLVE(ucp_tag_probe_nb);
  COMM_RESOLVE(ucp_request_check_status);
  COMM_RESOLVE(ucp_request_cancel);
  COMM_RESOLVE(ucp_request_free);
  COMM_RESOLVE(ucs_status_string);
#undef COMM_RESOLVE
  if (!missing.empty()) u->why_not = name + " lacks " + missing + "; libcomm needs UCX 1.10 or newer (the *_nbx calls)";
}

}  // namespace

const UcxLibrary& ucx_library() {
  static const UcxLibrary* lib = [] {
    auto* u = new UcxLibrary();  // never freed: UCX stays loaded for the life of the process
    load(u);
    if (!u->usable()) COMM_INFO(kNet, "%s; the UCX transport is off, hosts talk over sockets", u->why_not.c_str());
    return u;
  }();
  return *lib;
}

}  // namespace comm::transport
