// The Backend over libcomm's public C ABI (comm.h and libcomm.so, nothing internal).
#pragma once

#include <memory>

#include "backend.h"

namespace bench {

std::unique_ptr<Backend> make_libcomm_backend();

}  // namespace bench
