// The two engines behind tls/gcm.h's Cipher, for gcm.cc's factory only.
#pragma once

#include <memory>

#include "tls/gcm.h"

namespace comm::tls::gcm {

std::unique_ptr<Cipher> make_openssl_cipher();
// nullptr where ipsec-mb cannot run here (ipsec_mb_usable).
std::unique_ptr<Cipher> make_ipsec_mb_cipher();

}  // namespace comm::tls::gcm
