// The coordinator's audit trail: one record per security-relevant call (a
// node's registration, a failure report, an operator action that changes
// state, and every call refused at authentication), naming who made it: the
// credential it presented, the verified TLS client certificate's names and
// the peer address. Each record is a log line "audit: {...}" through the
// coordinator's logger and, with --audit-log FILE, a JSON line appended to
// that file by a thread of its own, so that a slow or failing file never
// holds up a call. docs/operations.md ("Audit log") describes the records.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logger.h"

namespace ckptd::coordinator {

// The credential a call presented (AuditIdentity::credential).
inline constexpr char kCredentialAgentToken[] = "agent-token";
inline constexpr char kCredentialOperatorToken[] = "operator-token";
inline constexpr char kCredentialCertificate[] = "client-certificate";  // one naming the node (agent RPCs)
inline constexpr char kCredentialInsecure[] = "insecure-agents";        // none needed: --insecure-agents
inline constexpr char kCredentialNone[] = "none";
inline constexpr char kCredentialMalformed[] = "malformed";      // authorization metadata not "Bearer <token>"
inline constexpr char kCredentialWrongToken[] = "wrong-token";  // a bearer token that is neither

// Who made a call, as the coordinator knows it.
struct AuditIdentity {
  std::string credential;  // one of kCredential*
  // The common name and subject alternative names of the caller's verified
  // TLS client certificate (none without mutual TLS), at most 8.
  std::vector<std::string> tls_names;
  std::string peer;  // gRPC's peer address, e.g. "ipv4:10.0.0.5:41872"
};

struct AuditRecord {
  std::string action;  // the RPC: "RegisterAgent", "ReportFailure", "RequestCheckpoint", ...
  AuditIdentity identity;
  std::string node;  // what the request names (empty: nothing)
  std::string job;
  std::optional<uint32_t> rank;
  std::optional<uint64_t> step;
  // The call's outcome: OK (granted), or why it was refused. A call refused
  // at authentication (`authenticated` false) is rate-limited.
  absl::Status outcome;
  bool authenticated = true;
  // What else the action says, in order (e.g. "reregistration": true).
  using Value = std::variant<std::string, uint64_t, bool>;
  std::vector<std::pair<std::string, Value>> details;
  // Logged as a warning even when granted (a live node's re-registration).
  bool notable = false;
};

// Counts what the audit log did (CoordinatorMetrics).
class AuditObserver {
 public:
  virtual ~AuditObserver() = default;
  virtual void OnAuditRecord(bool granted) {}
  // A call refused at authentication left out by the rate limit.
  virtual void OnAuditSuppressed() {}
  // A record that did not reach the audit file (a failed write, or the
  // writer too far behind).
  virtual void OnAuditWriteError() {}
};

struct AuditLogOptions {
  // The file records are appended to (JSON lines); empty: log lines only.
  // Opened O_APPEND, created 0600; a symbolic link or anything but a
  // regular file is refused.
  std::string path;
  base::Logger* logger = nullptr;  // default: base::DefaultLogger()
  base::Clock* clock = nullptr;    // default: the real clock
  AuditObserver* observer = nullptr;
  // Calls refused at authentication are recorded in bursts of at most
  // `refused_burst`, then `refused_per_second` (a token bucket): a flood of
  // them cannot fill the disk. The next record says how many were left out.
  double refused_burst = 100;
  double refused_per_second = 1;
  // Records waiting for the file at most; one more is dropped (and counted).
  size_t max_queued = 10'000;
};

class AuditLog {
 public:
  // Opens options.path (when given). kFailedPrecondition naming the path for
  // a symbolic link or a file that is not regular; the errno's code (with
  // the path) when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(AuditLogOptions options);
  // Writes what is queued, waiting at most a few seconds for a file that
  // does not take it.
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Records `record` now: logs it and queues it for the file. Never waits
  // for the file; never fails (a record lost is counted and logged).
  void Record(const AuditRecord& record);

  // Waits until every record queued so far was written (or failed); false
  // when `timeout` passed first.
  bool Flush(absl::Duration timeout = absl::Seconds(10));

  const std::string& path() const { return path_; }

  // The JSON object of `record` made at `time` (one line, no newline);
  // `suppressed`: refused calls left out since the previous record.
  static std::string ToJson(const AuditRecord& record, absl::Time time, uint64_t suppressed);

 private:
  struct Writer;  // the file and its thread's state, shared with the thread
  AuditLog(AuditLogOptions options, std::shared_ptr<Writer> writer);

  const AuditLogOptions options_;
  const std::string path_;
  base::Logger* const logger_;
  base::Clock* const clock_;
  std::shared_ptr<Writer> writer_;  // null without a file
  std::thread thread_;

  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_);
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;  // since the last record
  absl::Time suppression_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ckptd::coordinator
