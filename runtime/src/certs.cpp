// Certificate generation with OpenSSL 3 (certs.hpp).
#include "areal/runtime/certs.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace fs = std::filesystem;

namespace areal {

namespace {

struct free_key {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct free_cert {
  void operator()(X509* c) const { X509_free(c); }
};
using key_ptr = std::unique_ptr<EVP_PKEY, free_key>;
using cert_ptr = std::unique_ptr<X509, free_cert>;

[[noreturn]] void fail(const std::string& what) {
  char buf[256] = {};
  ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
  throw std::runtime_error(what + (buf[0] ? std::string{": "} + buf : std::string{}));
}

key_ptr new_key() {
  key_ptr key{EVP_EC_gen("P-256")};
  if (!key)
    fail("cannot generate a P-256 key");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  auto* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext)
    fail("cannot make the certificate extension " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `key` named `common_name`, signed by issuer (self-signed when null).
cert_ptr new_certificate(EVP_PKEY* key, const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key,
                         const std::string& alt_name, long serial) {
  cert_ptr cert{X509_new()};
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 10L * 365 * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  auto* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("areal cluster"), -1, -1,
                             0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                             -1, 0);
  auto* signer = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  if (!issuer) {
    add_extension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE");
    add_extension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), issuer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), issuer, NID_key_usage, "critical,digitalSignature,keyAgreement");
    add_extension(cert.get(), issuer, NID_ext_key_usage, "serverAuth,clientAuth");
    if (!alt_name.empty())
      add_extension(cert.get(), issuer, NID_subject_alt_name, alt_name);
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0)
    fail("cannot sign the certificate of " + common_name);
  return cert;
}

void write_key(const EVP_PKEY* key, const std::string& path) {
  auto* f = std::fopen(path.c_str(), "w");
  if (!f)
    throw std::runtime_error("cannot write " + path);
  chmod(path.c_str(), 0600);
  bool ok = PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(f);
  if (!ok)
    fail("cannot write " + path);
}

void write_certificate(X509* cert, const std::string& path) {
  auto* f = std::fopen(path.c_str(), "w");
  if (!f)
    throw std::runtime_error("cannot write " + path);
  bool ok = PEM_write_X509(f, cert) == 1;
  std::fclose(f);
  if (!ok)
    fail("cannot write " + path);
}

template <class T, class F>
T read_pem(const std::string& path, F reader) {
  auto* f = std::fopen(path.c_str(), "r");
  if (!f)
    throw std::runtime_error("cannot read " + path);
  T out{reader(f, nullptr, nullptr, nullptr)};
  std::fclose(f);
  if (!out)
    fail(path + " is not a PEM file of the expected kind");
  return out;
}

bool is_ip_address(const std::string& host) {
  return !host.empty() &&
         (host.find_first_not_of("0123456789.") == std::string::npos || host.find(':') != std::string::npos);
}

}  // namespace

tls_files tls_files_for(const std::string& dir, const std::string& node) {
  return {(fs::path{dir} / "ca.pem").string(), (fs::path{dir} / (node + ".pem")).string(),
          (fs::path{dir} / (node + ".key")).string()};
}

std::vector<std::string> make_cluster_certificates(const run_config& config, const std::string& dir) {
  std::vector<std::string> written;
  fs::create_directories(dir);
  auto ca_cert_path = (fs::path{dir} / "ca.pem").string();
  auto ca_key_path = (fs::path{dir} / "ca.key").string();
  key_ptr ca_key;
  cert_ptr ca_cert;
  if (fs::exists(ca_cert_path) && fs::exists(ca_key_path)) {
    ca_key = read_pem<key_ptr>(ca_key_path, PEM_read_PrivateKey);
    ca_cert = read_pem<cert_ptr>(ca_cert_path, PEM_read_X509);
  } else {
    ca_key = new_key();
    ca_cert = new_certificate(ca_key.get(), "areal CA " + config.cluster.app_id, nullptr, nullptr, {}, 1);
    write_key(ca_key.get(), ca_key_path);
    write_certificate(ca_cert.get(), ca_cert_path);
    written.push_back(ca_cert_path);
    written.push_back(ca_key_path);
  }
  long serial = static_cast<long>(std::time(nullptr));
  for (auto& node : config.nodes) {
    auto files = tls_files_for(dir, node.name);
    auto key = new_key();
    auto alt = std::string{is_ip_address(node.host) ? "IP:" : "DNS:"} + node.host;
    auto cert = new_certificate(key.get(), node.name, ca_cert.get(), ca_key.get(), alt, ++serial);
    write_key(key.get(), files.key);
    write_certificate(cert.get(), files.certificate);
    written.push_back(files.certificate);
    written.push_back(files.key);
  }
  return written;
}

std::string check_tls_files(const run_config& config, const std::string& node) {
  auto files = tls_files_for(config.cluster.certs_dir, node);
  for (auto* path : {&files.ca_certificate, &files.certificate, &files.key}) {
    std::FILE* f = std::fopen(path->c_str(), "r");
    if (!f)
      return "cluster.security = \"tls\" needs " + *path +
             " (missing or unreadable). Generate the cluster's certificates with: areal --config " + config.source +
             " --make-certs (then copy " + config.cluster.certs_dir +
             " to every host), or set cluster.security = \"plain\" to run without authentication";
    std::fclose(f);
  }
  return {};
}

}  // namespace areal
