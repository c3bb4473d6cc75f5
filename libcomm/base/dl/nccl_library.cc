#include "dl/nccl_library.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

namespace comm::dl {
namespace {

constexpr int kOldestVersion = 21400;  // ncclCommInitRankConfig, ncclCommFinalize, nonblocking init

template <typename F>
void resolve(void* lib, F* fn, const char* symbol, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, symbol));
  if (*fn == nullptr && missing) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
}

void load(NcclLibrary* n, const std::string& override_path) {
  const std::string name = override_path.empty() ? "libnccl.so.2" : override_path;
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    n->why_not = "NCCL library not found: dlopen(" + name + ")" + (override_path.empty() ? "" : " (COMM_NCCL_LIBRARY)") +
                 " failed" + (err ? std::string(": ") + err : std::string()) +
                 "; install NCCL 2.14 or newer or add its folder to LD_LIBRARY_PATH";
    return;
  }
  n->path = name;
  std::string missing;
#define COMM_REQUIRE(sym) resolve(lib, &n->sym, #sym, &missing)
#define COMM_OPTIONAL(sym) resolve(lib, &n->sym, #sym, nullptr)
  COMM_REQUIRE(ncclGetVersion);
  COMM_REQUIRE(ncclGetErrorString);
  COMM_REQUIRE(ncclGetUniqueId);
  COMM_REQUIRE(ncclCommInitRankConfig);
  COMM_REQUIRE(ncclCommGetAsyncError);
  COMM_REQUIRE(ncclCommAbort);
  COMM_REQUIRE(ncclCommDestroy);
  COMM_REQUIRE(ncclCommFinalize);
  COMM_REQUIRE(ncclAllReduce);
  COMM_REQUIRE(ncclBroadcast);
  COMM_REQUIRE(ncclReduce);
  COMM_REQUIRE(ncclAllGather);
  COMM_REQUIRE(ncclReduceScatter);
  COMM_REQUIRE(ncclSend);
  COMM_REQUIRE(ncclRecv);
  COMM_REQUIRE(ncclGroupStart);
  COMM_REQUIRE(ncclGroupEnd);
  COMM_OPTIONAL(ncclGetLastError);
  COMM_OPTIONAL(ncclMemAlloc);
  COMM_OPTIONAL(ncclMemFree);
  COMM_OPTIONAL(ncclCommRegister);
  COMM_OPTIONAL(ncclCommDeregister);
  COMM_OPTIONAL(ncclCommShrink);
  COMM_OPTIONAL(ncclCommRevoke);
  COMM_OPTIONAL(ncclCommSplit);
#undef COMM_REQUIRE
#undef COMM_OPTIONAL
  if (n->ncclGetVersion) (void)n->ncclGetVersion(&n->version);
  if (!missing.empty()) {
    n->why_not = name + " (NCCL " + n->version_text() + ") lacks " + missing + "; libcomm needs NCCL 2.14 or newer";
    return;
  }
  if (n->version < kOldestVersion)
    n->why_not = name + " is NCCL " + n->version_text() + "; libcomm needs NCCL 2.14 or newer";
  if (n->ncclMemFree == nullptr) n->ncclMemAlloc = nullptr;  // one without the other is useless
  if (n->ncclCommDeregister == nullptr) n->ncclCommRegister = nullptr;
}

}  // namespace

std::string NcclLibrary::version_text() const {
  if (version <= 0) return "?";
  // NCCL_VERSION(X,Y,Z): X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before.
  const int major = version >= 10000 ? version / 10000 : version / 1000;
  const int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(version % 100);
}

std::vector<std::pair<std::string, bool>> NcclLibrary::fault_tolerance() const {
  return {{"ncclCommAbort", ncclCommAbort != nullptr},
          {"ncclCommGetAsyncError", ncclCommGetAsyncError != nullptr},
          {"ncclCommFinalize", ncclCommFinalize != nullptr},
          {"ncclCommSplit", ncclCommSplit != nullptr},
          {"ncclCommShrink", ncclCommShrink != nullptr},
          {"ncclCommRevoke", ncclCommRevoke != nullptr}};
}

std::string NcclLibrary::error_text(ncclResult_t r, ncclComm_t) const {
  static const char* names[] = {"ncclSuccess",     "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",  "ncclInvalidUsage",
                                "ncclRemoteError", "ncclInProgress"};
  std::string text = static_cast<int>(r) >= 0 && static_cast<int>(r) < 8 ? names[r] : "ncclResult " + std::to_string(r);
  if (ncclGetErrorString) text += std::string(" (") + ncclGetErrorString(r) + ")";
  // The last error is per thread in NCCL; the comm argument is ignored by it.
  if (ncclGetLastError) {
    const char* last = ncclGetLastError(nullptr);
    if (last && *last) text += ": " + std::string(last);
  }
  return text;
}

const NcclLibrary& nccl_library(const std::string& override_path) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, std::unique_ptr<NcclLibrary>>;  // never freed: used until exit
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*loaded)[override_path];
  if (!slot) {
    slot = std::make_unique<NcclLibrary>();
    load(slot.get(), override_path);
  }
  return *slot;
}

}  // namespace comm::dl
