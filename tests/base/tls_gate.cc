// Runs the command in its arguments where the TLS cases it names can run, else exits 77 so that
// meson shows SKIP with the reason: such cases never pass silently where they cannot run (Catch2
// 2.13 has no SKIP). `tls_gate own-records|ipsec-mb [...] -- PROGRAM ARGS...`:
//   own-records  libcomm seals its own records (the kernel has no TLS: tls/tls.h)
//   ipsec-mb     ipsec-mb loads (tls/gcm.h)
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tls/gcm.h"
#include "tls/tls.h"

int main(int argc, char** argv) {
  int i = 1;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    std::string why;
    if (std::strcmp(argv[i], "own-records") == 0) {
      if (comm::tls::kernel_tls_available(&why)) {
        std::printf("SKIP: the kernel seals TLS records here (%s): libcomm's own records never run\n", why.c_str());
        return 77;
      }
    } else if (std::strcmp(argv[i], "ipsec-mb") == 0) {
      bool vaes = false;
      if (!comm::tls::gcm::ipsec_mb_usable(&why, &vaes)) {
        std::printf("SKIP: ipsec-mb cannot run here: %s\n", why.c_str());
        return 77;
      }
      std::printf("ipsec-mb: %s%s\n", why.c_str(), vaes ? "" : " (not a VAES path: auto would not choose it)");
    } else {
      std::fprintf(stderr, "tls_gate: unknown condition '%s' (own-records, ipsec-mb)\n", argv[i]);
      return 2;
    }
  }
  if (i + 1 >= argc) {
    std::fprintf(stderr, "usage: %s CONDITION... -- PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  std::fflush(stdout);
  execv(argv[i + 1], argv + i + 1);
  std::perror("execv");
  return 2;
}
