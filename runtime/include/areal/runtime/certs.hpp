// Certificates for mutual TLS between the nodes of a topology: a private
// certificate authority and one certificate per node, signed by it
// (`areal --config TOPOLOGY --make-certs`). Every node trusts exactly that CA.
#pragma once

#include <string>
#include <vector>

#include "areal/runtime/config.hpp"

namespace areal {

/// Where a node's TLS files lie in a certificate directory.
struct tls_files {
  std::string ca_certificate;  // DIR/ca.pem
  std::string certificate;     // DIR/NODE.pem
  std::string key;             // DIR/NODE.key
};
tls_files tls_files_for(const std::string& dir, const std::string& node);

/// Writes DIR/ca.pem and DIR/ca.key (kept when they exist already: nodes added
/// later get certificates of the same CA) and DIR/NODE.pem + DIR/NODE.key for
/// every node of the topology (P-256 keys, SHA-256, valid 10 years, the node's
/// name as common name and its host as subject alternative name). Keys are
/// written with mode 0600. Returns the files written, or throws
/// std::runtime_error saying what failed.
std::vector<std::string> make_cluster_certificates(const run_config& config, const std::string& dir);

/// Empty when the node's TLS files exist and are readable; else what is missing and what to do.
std::string check_tls_files(const run_config& config, const std::string& node);

}  // namespace areal
