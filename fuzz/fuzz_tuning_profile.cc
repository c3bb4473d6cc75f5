// Fuzz target: the tuning profile parser (libcomm/src/tuning/profile.h), which reads a JSON file
// a user names in COMM_TUNING_FILE. Any bytes give a Status (an error naming the entry), never a
// crash; a profile it accepts has the hash of its bytes.
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "tuning/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  comm::tuning::Profile profile;
  comm::Status st = comm::tuning::parse_profile("fuzz.json", text, &profile);
  if (!st.ok()) FUZZ_CHECK(!st.message().empty());
  return 0;
}
