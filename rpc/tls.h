// Mutual TLS for the coordinator's gRPC API: credentials built from PEM files,
// for the coordinator (which requires and verifies a client certificate) and
// for its clients (agents, ckptctl), which present one.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
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

// The contents of a PEM file (`what` names it in errors, e.g. "--tls-ca").
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what);

}  // namespace ckptd::rpc
