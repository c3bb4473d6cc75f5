// Runs the command in its arguments where ipsec-mb loads (tls/gcm.h), else exits 77 so that meson
// shows SKIP with the reason: the ipsec-mb cases never pass silently where they cannot run.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "tls/gcm.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  std::string detail;
  bool vaes = false;
  if (!comm::tls::gcm::ipsec_mb_usable(&detail, &vaes)) {
    std::printf("SKIP: ipsec-mb cannot run here: %s\n", detail.c_str());
    return 77;
  }
  std::printf("ipsec-mb: %s%s\n", detail.c_str(), vaes ? "" : " (not a VAES path: auto would not choose it)");
  std::fflush(stdout);
  execv(argv[1], argv + 1);
  std::perror("execv");
  return 2;
}
