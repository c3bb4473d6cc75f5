#include "version.h"

#include <string>

#ifndef COMM_RELEASE
#error "COMM_RELEASE (meson.build's project version) must be defined by the build"
#endif

namespace comm::version {

extern const char kCommit[];  // version_commit.cc, written by vcs_tag

const char* release() { return COMM_RELEASE; }
const char* commit() { return kCommit[0] != '\0' ? kCommit : "unknown"; }
const char* text() {
  static const std::string t = std::string(release()) + " (git " + commit() + ")";
  return t.c_str();
}

}  // namespace comm::version
