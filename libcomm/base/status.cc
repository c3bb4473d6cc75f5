#include "status.h"

#include <cstring>

namespace comm {

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* text = strerror_r(err, buf, sizeof buf);
  return std::string(text) + " (errno " + std::to_string(err) + ")";
}

}  // namespace comm
