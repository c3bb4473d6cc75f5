// Fuzz target: the NCCL topology XML reader (topology/probe.h, parse_nccl_topo_xml), which
// reads NCCL_TOPO_FILE-style files from users. Any bytes give a Status, never a crash.
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "probe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  comm::topology::Topology topo;
  comm::Status st = comm::topology::parse_nccl_topo_xml(text, "fuzz.xml", &topo);
  if (!st.ok()) FUZZ_CHECK(!st.message().empty());
  return 0;
}
