// A throwaway PKI for relay TLS tests: EC P-256 keys and X.509
// certificates made with OpenSSL's C API at test time, written as PEM files
// into a temporary directory (no key file is ever committed). Test-only.
#ifndef REFIT_TESTS_SUPPORT_TLS_TESTING_H_
#define REFIT_TESTS_SUPPORT_TLS_TESTING_H_

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "support/testing.h"
#include "transport/relay_store.h"

namespace refit::tls_testing {

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* x) const { X509_free(x); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;
using CertPtr = std::unique_ptr<X509, CertFree>;

inline KeyPtr NewKey() {
  return KeyPtr(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
}

inline void AddExt(X509* cert, X509V3_CTX* ctx, int nid,
                   const std::string& value) {
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str());
  ASSERT_NE(ext, nullptr) << "extension " << nid << " = " << value;
  ASSERT_EQ(X509_add_ext(cert, ext, -1), 1);
  X509_EXTENSION_free(ext);
}

// A certificate for `key` named `cn`, signed by `issuer` / `issuer_key`
// (self-signed when issuer is null). `sans`: "DNS:n0,IP:127.0.0.1" or "".
inline CertPtr NewCert(EVP_PKEY* key, const std::string& cn, X509* issuer,
                       EVP_PKEY* issuer_key, bool ca, const std::string& sans) {
  static std::atomic<long> serial{1};
  CertPtr cert(X509_new());
  X509* x = cert.get();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()),
                             -1, -1, 0);
  X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer ? issuer : x, x, nullptr, nullptr, 0);
  AddExt(x, &ctx, NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
  AddExt(x, &ctx, NID_key_usage,
         ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
  AddExt(x, &ctx, NID_subject_key_identifier, "hash");
  AddExt(x, &ctx, NID_authority_key_identifier, "keyid:always");
  if (!ca) AddExt(x, &ctx, NID_ext_key_usage, "serverAuth,clientAuth");
  if (!sans.empty()) AddExt(x, &ctx, NID_subject_alt_name, sans);
  EXPECT_GT(X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256()), 0);
  return cert;
}

inline void WritePem(const std::string& path, X509* cert, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  if (cert) {
    EXPECT_EQ(PEM_write_X509(f, cert), 1);
  }
  if (key) {
    EXPECT_EQ(
        PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr), 1);
  }
  std::fclose(f);
}

// A CA whose files live in a temporary directory; Issue() makes leaves.
class TestCa {
 public:
  TestCa(const testing::TempDir& dir, std::string name)
      : dir_(dir), name_(std::move(name)), key_(NewKey()) {
    cert_ = NewCert(key_.get(), name_ + " test CA", nullptr, nullptr, true, "");
    WritePem(ca_file(), cert_.get(), nullptr);
  }
  std::string ca_file() const { return dir_.File(name_ + "-ca.pem"); }

  // A leaf named `cn` with the given subjectAltNames, as TLS options
  // (its CA file: `trust`, by default this CA).
  RelayTlsOptions Issue(const std::string& cn, const std::string& sans,
                        const TestCa* trust = nullptr) {
    KeyPtr key = NewKey();
    CertPtr cert = NewCert(key.get(), cn, cert_.get(), key_.get(), false, sans);
    RelayTlsOptions t;
    t.cert_file = dir_.File(name_ + "-" + cn + ".crt");
    t.key_file = dir_.File(name_ + "-" + cn + ".key");
    WritePem(t.cert_file, cert.get(), nullptr);
    WritePem(t.key_file, nullptr, key.get());
    t.ca_file = (trust ? trust : this)->ca_file();
    return t;
  }

 private:
  const testing::TempDir& dir_;
  std::string name_;
  KeyPtr key_;
  CertPtr cert_;
};

}  // namespace refit::tls_testing

#endif  // REFIT_TESTS_SUPPORT_TLS_TESTING_H_
