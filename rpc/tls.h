// Mutual TLS for the coordinator's gRPC API: credentials built from PEM files,
// for the coordinator (which requires and verifies a client certificate) and
// for its clients (agents, ckptctl), which present one.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace ckptd::rpc {

// Paths of PEM files.
struct TlsFiles {
  std::string cert;  // this side's certificate chain
  std::string key;   // its private key
  std::string ca;    // the CA certificates that sign the other side's certificate
};

// Server credentials that require a client certificate signed by `files.ca`
// (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY). All three
// files are needed. Errors name the flag's file: kInvalidArgument when a path
// is empty or a file holds no PEM block, kNotFound / kPermissionDenied / ...
// when it cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(const TlsFiles& files);

// Channel credentials that verify the server against `files.ca` and present
// `files.cert` / `files.key` as the client certificate. `ca` is required;
// `cert` and `key` go together (both empty: no client certificate, which a
// coordinator requiring one refuses). Errors as above.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFiles(const TlsFiles& files);

// The organizational unit that makes a client certificate a node's: with
// mutual TLS, a certificate speaks for the node its common name or a
// subjectAltName names only when its subject also names this unit
// (OU=ckptd-node), so that an operator's certificate of the same CA is no
// node's (the coordinator refuses it for agent calls, an agent's Peer
// service refuses it). --tls-node-ou on both changes it; empty: any.
inline constexpr char kNodeCertificateUnit[] = "ckptd-node";

// Whether `subject` (gRPC's x509_subject property, RFC 2253 as
// "CN=node-01,OU=ckptd-node,O=Example") names organizational unit `unit`.
// Escaped commas ("\,") do not split.
bool SubjectNamesUnit(std::string_view subject, std::string_view unit);

// The subject (RFC 2253) of the peer's verified certificate on a
// connection's `auth` context, or "" when there is none.
std::string CertificateSubject(const grpc::AuthContext* auth);

// Whether the peer's verified certificate on `auth` names `name` (its
// common name or a subjectAltName); false without one.
bool CertificateNames(const grpc::AuthContext* auth, std::string_view name);

// The contents of a PEM file (`what` names it in errors, e.g. "--tls-ca").
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what);

}  // namespace ckptd::rpc
