// What this build is: the release (meson.build's project version) and the git commit it was
// built from, for --version, comm_get_version_string, the init log line and benchmark records.
#pragma once

namespace comm::version {

const char* release();  // "1.0.0"
const char* commit();   // "868ddb39b8cc", "868ddb39b8cc-dirty"; "unknown" outside a git checkout
const char* text();     // "1.0.0 (git 868ddb39b8cc)"

}  // namespace comm::version
