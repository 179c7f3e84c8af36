#include "rpc/tls.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/posix_error.h"
#include "base/status_macros.h"

namespace ckptd::rpc {
namespace {

// Certificates and keys are a few KiB; anything far larger is not one.
constexpr size_t kMaxPemBytes = 1 << 20;

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no file given"));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return base::PosixError(absl::StrCat(what, ": open ", path), errno);
  std::string data;
  absl::Status status;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    status = base::PosixError(absl::StrCat(what, ": stat ", path), errno);
  } else if (!S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is not a regular file"));
  } else if (static_cast<uint64_t>(st.st_size) > kMaxPemBytes) {
    status = absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " is ", st.st_size, " bytes; a PEM file is at most ", kMaxPemBytes));
  } else {
    data.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = base::PosixError(absl::StrCat(what, ": read ", path), errno);
        break;
      }
      if (n == 0) break;  // shrank while reading: what was read is checked below
      done += static_cast<size_t>(n);
    }
    data.resize(done);
  }
  ::close(fd);  // read-only: nothing to lose on close
  CKPTD_RETURN_IF_ERROR(status);
  if (!absl::StrContains(data, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " holds no PEM block (-----BEGIN ...)"));
  }
  return data;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(const TlsFiles& files) {
  CKPTD_ASSIGN_OR_RETURN(std::string cert, ReadPemFile(files.cert, "--tls-cert"));
  CKPTD_ASSIGN_OR_RETURN(std::string key, ReadPemFile(files.key, "--tls-key"));
  CKPTD_ASSIGN_OR_RETURN(std::string ca, ReadPemFile(files.ca, "--tls-ca"));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = std::move(ca);
  options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  if (creds == nullptr) return absl::InvalidArgumentError("gRPC refused the TLS server credentials");
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFiles(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("a client certificate needs both --tls-cert and --tls-key");
  }
  grpc::SslCredentialsOptions options;
  CKPTD_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(files.ca, "--tls-ca"));
  if (!files.cert.empty()) {
    CKPTD_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPemFile(files.cert, "--tls-cert"));
    CKPTD_ASSIGN_OR_RETURN(options.pem_private_key, ReadPemFile(files.key, "--tls-key"));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(options);
  if (creds == nullptr) return absl::InvalidArgumentError("gRPC refused the TLS channel credentials");
  return creds;
}

bool SubjectNamesUnit(std::string_view subject, std::string_view unit) {
  const std::string want = std::string("OU=") + std::string(unit);
  size_t start = 0;
  for (size_t i = 0; i <= subject.size(); ++i) {
    if (i < subject.size() && subject[i] == '\\') {
      ++i;  // an escaped character, a comma included
      continue;
    }
    if (i == subject.size() || subject[i] == ',' || subject[i] == '+') {
      std::string_view rdn = subject.substr(start, i - start);
      while (!rdn.empty() && rdn.front() == ' ') rdn.remove_prefix(1);
      if (rdn == want) return true;
      start = i + 1;
    }
  }
  return false;
}

std::string CertificateSubject(const grpc::AuthContext* auth) {
  if (auth == nullptr) return "";
  for (const grpc::string_ref& s : auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
    return std::string(s.data(), s.size());
  }
  return "";
}

bool CertificateNames(const grpc::AuthContext* auth, std::string_view name) {
  if (auth == nullptr || !auth->IsPeerAuthenticated() || name.empty()) return false;
  for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
    for (const grpc::string_ref& n : auth->FindPropertyValues(property)) {
      if (std::string_view(n.data(), n.size()) == name) return true;
    }
  }
  return false;
}

}  // namespace ckptd::rpc
