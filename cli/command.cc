#include "cli/command.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace ckptd::cli {

// "2024-05-01T12:00:00Z"; "-" for 0 (unknown).
std::string IsoTime(int64_t unix_nanos) {
  if (unix_nanos == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixNanos(unix_nanos), absl::UTCTimeZone());
}

// "0.4 s", "12 s", "5.2 min", "3.1 h", "2.0 d".
std::string ShortDuration(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 0) s = 0;  // clock skew between the coordinator and here
  if (s < 10) return absl::StrFormat("%.1f s", s);
  if (s < 120) return absl::StrFormat("%.0f s", s);
  if (s < 7200) return absl::StrFormat("%.1f min", s / 60);
  if (s < 172800) return absl::StrFormat("%.1f h", s / 3600);
  return absl::StrFormat("%.1f d", s / 86400);
}

std::string Percent(double fraction) { return absl::StrFormat("%.3g %%", 100 * fraction); }

// "0.04 s", "1.5 s", "35.2 s", "412 s"; "-" for 0 (unknown).
std::string Seconds(double s) {
  if (!(s > 0) || !std::isfinite(s)) return "-";
  if (s < 1) return absl::StrFormat("%.2f s", s);
  if (s < 100) return absl::StrFormat("%.1f s", s);
  return absl::StrFormat("%.0f s", s);
}

// "3/4"; "-" when neither is known (an entry that carries no world size).
std::string Ranks(uint32_t reported, uint32_t world) {
  if (world == 0) return reported == 0 ? "-" : absl::StrCat(reported, "/?");
  return absl::StrCat(reported, "/", world);
}

double SecondsSince(absl::Time now, int64_t unix_nanos) {
  return absl::ToDoubleSeconds(now - absl::FromUnixNanos(unix_nanos));
}

// "0-3,8,10-11" for sorted, distinct ranks.
std::string RankRanges(std::vector<uint32_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string JobStateName(ckptd::v1::JobState s) {
  switch (s) {
    case ckptd::v1::JOB_RUNNING: return "running";
    case ckptd::v1::JOB_RESTARTING: return "restarting";
    default: return "unknown";
  }
}

std::string StepStateName(ckptd::v1::StepState s) {
  switch (s) {
    case ckptd::v1::STEP_COMMITTED: return "committed";
    case ckptd::v1::STEP_QUARANTINED: return "quarantined";
    case ckptd::v1::STEP_PENDING: return "pending";
    case ckptd::v1::STEP_ABORTED: return "aborted";
    case ckptd::v1::STEP_INCOMPLETE: return "incomplete";
    default: return "unknown";
  }
}

std::string FailureKindName(ckptd::v1::FailureKind k) {
  switch (k) {
    case ckptd::v1::NODE_LOST: return "node_lost";
    case ckptd::v1::TRAINER_DIED: return "trainer_died";
    case ckptd::v1::TRAINER_HUNG: return "trainer_hung";
    case ckptd::v1::PERSIST_FAILED: return "persist_failed";
    case ckptd::v1::SHARD_DAMAGED: return "shard_damaged";
    default: return "unknown";
  }
}


std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

absl::Status WriteTextFile(const std::string& path, absl::string_view content) {
  errno = 0;
  std::ofstream file(path, std::ios::out | std::ios::trunc | std::ios::binary);
  file.write(content.data(), static_cast<std::streamsize>(content.size()));
  file.close();
  if (!file) {
    // The streams do not promise errno; most failures (open) do set it.
    return absl::UnavailableError(
        absl::StrCat("cannot write ", path, ": ", errno != 0 ? std::strerror(errno) : "write failed"));
  }
  return absl::OkStatus();
}

std::optional<int> Command::Start(const std::vector<std::string>& argv, std::set<std::string> value_flags,
                                  std::set<std::string> bool_flags, bool needs_job,
                                  const CoordinatorApiFactory& factory, size_t max_positional) {
  value_flags.insert(CoordinatorValueFlags().begin(), CoordinatorValueFlags().end());
  bool_flags.insert({"help", "json"});
  absl::StatusOr<Args> args = Args::Parse(argv, value_flags, bool_flags);
  if (!args.ok()) return Usage(args.status().message());
  args_ = *std::move(args);
  if (args_.Has("help")) {
    out_ << help_;
    return kExitOk;
  }
  if (args_.positional().size() > max_positional) {
    return Usage(absl::StrCat("unexpected argument \"", args_.positional()[max_positional], "\""));
  }
  if (!args_.Get("coordinator") || args_.Get("coordinator")->empty()) {
    return Usage("--coordinator HOST:PORT is required");
  }
  if (needs_job && (!args_.Get("job") || args_.Get("job")->empty())) return Usage("--job is required");
  if (std::optional<std::string> token_file = args_.Get("token-file")) {
    if (absl::Status s = ReadTokenFile(*token_file).status(); !s.ok()) return Usage(s.message());
  }
  if (absl::Status s = TimeoutFlag(args_).status(); !s.ok()) return Usage(s.message());
  if (!factory) return Usage("talking to a coordinator is not available in this build");
  absl::StatusOr<std::unique_ptr<CoordinatorApi>> api = factory(args_);
  if (!api.ok()) return Fail("", api.status());
  api_ = *std::move(api);
  return std::nullopt;
}

// Says why `rpc` failed and returns the exit status for it.
int Command::Fail(absl::string_view rpc, const absl::Status& s) const {
  const std::string address = args_.Get("coordinator").value_or("");
  const std::string prefix = absl::StrCat("ckptctl ", name_, ": ");
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      // The real API's messages start "coordinator HOST:PORT: ".
      err_ << prefix << "cannot reach "
           << (absl::StartsWith(s.message(), "coordinator ")  ? std::string("the ")
               : absl::StrContains(s.message(), address)      ? std::string("the coordinator: ")
                                                              : absl::StrCat("the coordinator at ", address, ": "))
           << s.message() << "\n";
      return kExitUnavailable;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      err_ << prefix << s.message() << "\n";
      if (std::optional<std::string> file = args_.Get("token-file")) {
        err_ << "  the coordinator refused the operator token in " << *file
             << ": pass --token-file with the token it was started with (<state-dir>/operator-token, or the file "
                "given to ckptd-coordinator --operator-token-file)\n";
      } else {
        err_ << "  this command needs the operator token: pass --token-file F, where F is "
                "<state-dir>/operator-token of the coordinator (or the file given to ckptd-coordinator "
                "--operator-token-file)\n";
      }
      return kExitFailed;
    case absl::StatusCode::kUnimplemented:
      err_ << prefix << "the coordinator at " << address << " is too old for `ckptctl " << name_ << "`"
           << (rpc.empty() ? "" : absl::StrCat(" (it does not implement ", rpc, ")"))
           << "; upgrade ckptd-coordinator\n";
      return kExitFailed;
    case absl::StatusCode::kInvalidArgument:
      err_ << prefix << s.message() << "\n";
      return kExitUsage;
    default:
      err_ << prefix << s.message() << "\n";
      return kExitFailed;
  }
}

}  // namespace ckptd::cli
