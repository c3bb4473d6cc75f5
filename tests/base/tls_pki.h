// Certificates for the TLS tests (tests/base/test_tls*.cc), made with OpenSSL so the tests need
// no files: a CA, two ranks it signed and a self-signed rogue, written under a temporary folder.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "tls/tls.h"

namespace comm::tls_test {

namespace tls = comm::tls;

inline EVP_PKEY* new_key() { return EVP_EC_gen("P-256"); }

inline std::string to_pem(X509* x) {
  BIO* b = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(b, x);
  char* p = nullptr;
  long n = BIO_get_mem_data(b, &p);
  std::string s(p, static_cast<size_t>(n));
  BIO_free(b);
  return s;
}

inline std::string to_pem(EVP_PKEY* k) {
  BIO* b = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(b, k, nullptr, nullptr, 0, nullptr, nullptr);
  char* p = nullptr;
  long n = BIO_get_mem_data(b, &p);
  std::string s(p, static_cast<size_t>(n));
  BIO_free(b);
  return s;
}

// A certificate for `name`, signed by (issuer, issuer_key), or self-signed when issuer is null.
inline X509* make_cert(const char* name, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key, bool ca) {
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), static_cast<long>(std::hash<std::string>{}(name) & 0x7fffffff));
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600L * 24 * 30);
  X509_set_pubkey(x, key);
  X509_NAME* n = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(name), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : n);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
  X509_EXTENSION* bc = X509V3_EXT_conf_nid(nullptr, &v3, NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
  X509_add_ext(x, bc, -1);
  X509_EXTENSION_free(bc);
  X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
  return x;
}

struct Pki {
  std::filesystem::path dir;
  std::string ca;  // the CA's certificate file
  tls::Config rank_a, rank_b, rogue;  // rogue: self-signed, not by the CA
  ~Pki() { std::filesystem::remove_all(dir); }
};

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  FILE* f = std::fopen(p.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

inline std::unique_ptr<Pki> make_pki() {
  auto pki = std::make_unique<Pki>();
  pki->dir = std::filesystem::temp_directory_path() / ("comm-tls-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(pki->dir);
  EVP_PKEY* ca_key = new_key();
  X509* ca = make_cert("libcomm test CA", ca_key, nullptr, nullptr, true);
  pki->ca = (pki->dir / "ca.pem").string();
  write_file(pki->ca, to_pem(ca));
  auto leaf = [&](const char* name, bool signed_by_ca, tls::Config* out) {
    EVP_PKEY* k = new_key();
    X509* x = signed_by_ca ? make_cert(name, k, ca, ca_key, false) : make_cert(name, k, nullptr, nullptr, false);
    out->cert_path = (pki->dir / (std::string(name) + ".pem")).string();
    out->key_path = (pki->dir / (std::string(name) + ".key")).string();
    out->ca_path = pki->ca;
    write_file(out->cert_path, to_pem(x));
    write_file(out->key_path, to_pem(k));
    X509_free(x);
    EVP_PKEY_free(k);
  };
  leaf("rank-a", true, &pki->rank_a);
  leaf("rank-b", true, &pki->rank_b);
  leaf("rogue", false, &pki->rogue);
  X509_free(ca);
  EVP_PKEY_free(ca_key);
  return pki;
}

}  // namespace comm::tls_test
