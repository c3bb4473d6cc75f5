// Read receipts: rank 0 serves the TCP store, and the store ends with its process. Rank 0 may
// publish an answer and then exit (an init that fails on every rank); it must first wait until
// every other rank has read the answer, or they are left with a closed connection instead.
#include <string>
#include <vector>

#include "store/store.h"

namespace comm {

namespace {
std::string receipt(const std::string& key, int rank) { return key + "/read/" + std::to_string(rank); }
}  // namespace

Status confirm_read(Store& store, const std::string& key, int rank) { return store.set(receipt(key, rank), "1"); }

Status wait_read_by_all(Store& store, const std::string& key, int size, Deadline deadline) {
  for (int r = 1; r < size; ++r) {
    std::string ignored;
    Status st = store.get(receipt(key, r), &ignored, deadline);
    if (!st.ok()) return st.prefixed("rank " + std::to_string(r) + " did not confirm it read '" + key + "': ");
  }
  return Status::Ok();
}

Status wait_read_by(Store& store, const std::string& key, const std::vector<int>& ranks, Deadline deadline) {
  for (int r : ranks) {
    std::string ignored;
    Status st = store.get(receipt(key, r), &ignored, deadline);
    if (!st.ok()) return st.prefixed("rank " + std::to_string(r) + " did not confirm it read '" + key + "': ");
  }
  return Status::Ok();
}

}  // namespace comm
