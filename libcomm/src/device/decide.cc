// Which path device buffers take on a communicator, decided once by every rank together (so
// that no rank runs NCCL while its peer stages through the host), and what this process can load.
#include <mutex>
#include <set>

#include "log.h"
#include "params.h"
#include "store/store.h"
#include "device/state.h"

namespace comm::device {

Probe probe_process() {
  std::string nccl_path, cuda_path;
  (void)params::get_string("COMM_NCCL_LIBRARY", &nccl_path);
  (void)params::get_string("COMM_CUDA_LIBRARY", &cuda_path);
  const NcclLibrary& n = nccl_library(nccl_path);
  const CudaLibrary& cu = cuda_library(cuda_path);
  Probe p;
  p.built_with_headers = true;
  p.cuda_library = cu.path;
  p.cuda_runtime_version = cu.runtime_version;
  p.cuda_driver_version = cu.driver_version;
  p.cuda_devices = cu.devices;
  p.nccl_library = n.path;
  if (n.version > 0) p.nccl_version = n.version_text();
  if (!n.path.empty()) p.fault_tolerance = n.fault_tolerance();
  p.usable = n.usable() && cu.usable();
  p.why_not = !n.usable() ? n.why_not : cu.why_not;

  static std::mutex mu;
  static std::set<std::string> logged;
  std::lock_guard<std::mutex> lock(mu);
  if (logged.insert(nccl_path + "\n" + cuda_path).second) {
    std::string ft;
    for (const auto& [call, has] : p.fault_tolerance) ft += (ft.empty() ? "" : ", ") + call + (has ? " yes" : " no");
    COMM_INFO(kInit, "device buffers: NCCL %s (%s), CUDA runtime %s, %d device(s): %s; NCCL fault-tolerance calls: %s",
              p.nccl_version.empty() ? "-" : p.nccl_version.c_str(), p.nccl_library.empty() ? "not loaded" : p.nccl_library.c_str(),
              p.cuda_library.empty() ? "not loaded" : p.cuda_library.c_str(), p.cuda_devices,
              p.usable ? "NCCL usable" : p.why_not.c_str(), ft.empty() ? "none (NCCL not loaded)" : ft.c_str());
  }
  return p;
}

namespace {

// What this rank can do with device buffers: '2' NCCL, '1' CUDA only (staging), '0' nothing;
// then the GPU's bus id (NCCL refuses two ranks on one GPU) or why not.
std::string local_verdict(const Probe& p, const CudaLibrary& cuda, int device) {
  std::string v;
  // NCCL's reason first (what COMM_TRANSPORT=nccl asked for), then the runtime's if it differs.
  if (!cuda.usable()) {
    v.append("0").append(p.why_not);
    if (p.why_not != cuda.why_not) v.append("; ").append(cuda.why_not);
    return v;
  }
  char busid[64] = "?";
  if (device >= 0) (void)cuda.cudaDeviceGetPCIBusId(busid, sizeof busid, device);
  if (!p.usable) return v.append("1").append(p.why_not);
  return v.append("2").append(busid);
}

}  // namespace

// Every rank publishes what it can do; rank 0 decides for all and publishes the verdict:
// "N" NCCL, "S<why>" staged, "U<why>" unavailable. O(ranks) store operations.
Status agree_path(comm_t c, const std::string& mine, std::string* verdict) {
  auto store = make_prefix_store(c->job_store, "comm/" + c->id + "/device");
  const Deadline deadline = Deadline::after_ms(c->settings.timeout_ms);
  COMM_RETURN_IF_ERROR(store->set("can/" + std::to_string(c->rank), mine));
  if (c->rank == 0) {
    std::string staged, unavailable;
    std::vector<std::string> gpu_of(static_cast<size_t>(c->size));
    for (int r = 0; r < c->size; ++r) {
      std::string v;
      if (r == 0) {
        v = mine;
      } else {
        Status st = store->get("can/" + std::to_string(r), &v, deadline);
        if (!st.ok())
          return Timeout("rank " + std::to_string(r) + " did not reach its first device-buffer call within " +
                         std::to_string(c->settings.timeout_ms) + " ms (every rank must make the same calls)");
      }
      const std::string rest = v.size() > 1 ? v.substr(1) : "";
      const std::string who = "rank " + std::to_string(r) + ": ";
      if (v.empty() || v[0] == '0') {
        if (unavailable.empty()) unavailable = who + rest;
      } else if (v[0] == '1') {
        if (staged.empty()) staged = who + rest;
      } else {
        gpu_of[static_cast<size_t>(r)] = rest;
        for (int q = 0; q < r && staged.empty(); ++q)
          if (gpu_of[static_cast<size_t>(q)] == rest && c->host_of[static_cast<size_t>(q)] == c->host_of[static_cast<size_t>(r)])
            staged = "ranks " + std::to_string(q) + " and " + std::to_string(r) + " share GPU " + rest +
                     " on one host, and NCCL needs one GPU per rank";
      }
    }
    verdict->assign(!unavailable.empty() ? "U" : !staged.empty() ? "S" : "N");
    verdict->append(!unavailable.empty() ? unavailable : staged);
    COMM_RETURN_IF_ERROR(store->set("verdict", *verdict));
    // A failing rank 0 (COMM_TRANSPORT=nccl without a GPU) may exit next, taking the store along.
    return wait_read_by_all(*store, "verdict", c->size, deadline);
  }
  Status st = store->get("verdict", verdict, deadline);
  if (st.code() == COMM_ERR_TIMEOUT)
    return Timeout("rank 0 did not decide the device-buffer path within " + std::to_string(c->settings.timeout_ms) +
                   " ms (did it make the same first device-buffer call?)");
  if (!st.ok()) return st.prefixed("waiting for rank 0's device-buffer verdict: ");
  return confirm_read(*store, "verdict", c->rank);
}

// Decides the path of communicator c with every rank and sets up the one chosen. `device`: the
// GPU the first device buffer lives on (or the current one).
Status decide(comm_t c, int device, std::shared_ptr<State>* out) {
  auto s = std::make_shared<State>(c);
  const Probe p = probe_process();
  std::string cuda_path;
  (void)params::get_string("COMM_CUDA_LIBRARY", &cuda_path);
  std::string nccl_path;
  (void)params::get_string("COMM_NCCL_LIBRARY", &nccl_path);
  s->cuda = &cuda_library(cuda_path);
  s->nccl = &nccl_library(nccl_path);
  const std::string& t = c->settings.transport;
  const bool forced = t == "nccl", forbidden = t != "auto" && !forced;  // agreed at init: alike on every rank
  const std::string where = "rank " + std::to_string(c->rank) + ", comm " + c->id + ": ";
  if (device < 0 && s->cuda->usable()) (void)s->cuda->cudaGetDevice(&device);
  std::string verdict;
  COMM_RETURN_IF_ERROR(agree_path(c, local_verdict(p, *s->cuda, device), &verdict).prefixed(where));
  if (verdict == "N" && !forbidden) {
    s->path = State::Path::kNccl;
    COMM_RETURN_IF_ERROR(s->create_nccl(device));
  } else if (forced) {
    return Unavailable(where + "COMM_TRANSPORT=nccl, but NCCL cannot run on every rank: " + verdict.substr(1) +
                       ". Use COMM_TRANSPORT=auto to run device buffers through pinned host memory instead");
  } else if (verdict[0] == 'U') {
    s->path = State::Path::kUnavailable;
    s->why = where + "device buffers (a non-NULL stream) need CUDA on every rank, and " + verdict.substr(1);
  } else {
    s->path = State::Path::kStaged;
    s->why = forbidden ? "COMM_TRANSPORT=" + t + " keeps device buffers off NCCL" : verdict.substr(1);
  }
  if (s->path == State::Path::kStaged)
    COMM_WARN(kInit, "comm %s rank %d: device buffers are staged through pinned host memory onto the host transport "
                     "(%s), slower than NCCL: %s", c->id.c_str(), c->rank, c->transport ? c->transport->name() : "?",
              s->why.c_str());
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace comm::device
