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
#include "base/host_port.h"
#include "rpc/coordinator_targets.h"
#include "protocol/restore_source.h"

namespace ckptd::cli {

const std::set<std::string>& CoordinatorValueFlags() {
  static const std::set<std::string>* const flags =
      new std::set<std::string>{"coordinator", "tls-ca", "tls-cert", "tls-key", "token-file"};
  return *flags;
}

absl::Status CheckCoordinatorAddress(const base::Args& args) {
  std::optional<std::string> address = args.Get("coordinator");
  if (!address) return absl::OkStatus();
  if (absl::Status s = rpc::ParseCoordinatorAddresses(*address).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--coordinator: ", s.message()));
  }
  return absl::OkStatus();
}

bool GivesFlag(const std::vector<std::string>& argv, absl::string_view flag) {
  const std::string bare = absl::StrCat("--", flag);
  for (const std::string& a : argv) {
    if (a == "--") break;
    if (a == bare || absl::StartsWith(a, absl::StrCat(bare, "="))) return true;
  }
  return false;
}

void AddEnvironmentDefaults(absl::string_view command, std::vector<std::string>* argv,
                            const std::function<const char*(const char*)>& getenv) {
  const std::string sub = argv->empty() ? "" : argv->front();
  const bool online = command == "status" || command == "checkpoint" || command == "list" ||
                      command == "restore-plan" || (command == "drill" && (sub == "run" || sub == "suite")) ||
                      (command == "verify" && !GivesFlag(*argv, "root")) ||
                      (command == "interval" && GivesFlag(*argv, "job"));
  if (!online) return;
  // Before a "--" that ends the flags, if there is one.
  auto end = std::find(argv->begin(), argv->end(), std::string("--"));
  std::vector<std::string> added;
  for (const auto& [flag, variable] : {std::pair<const char*, const char*>{"coordinator", "CKPTD_COORDINATOR"},
                                       std::pair<const char*, const char*>{"token-file", "CKPTD_TOKEN_FILE"}}) {
    const char* value = getenv(variable);
    if (value == nullptr || *value == '\0' || GivesFlag(*argv, flag)) continue;
    added.push_back(absl::StrCat("--", flag));
    added.push_back(value);
  }
  argv->insert(end, added.begin(), added.end());
}

std::string Percent(double fraction) { return absl::StrFormat("%.3g %%", 100 * fraction); }

// "3/4"; "-" when neither is known (an entry that carries no world size).
std::string Ranks(uint32_t reported, uint32_t world) {
  if (world == 0) return reported == 0 ? "-" : absl::StrCat(reported, "/?");
  return absl::StrCat(reported, "/", world);
}

double SecondsSince(absl::Time now, int64_t unix_nanos) {
  return absl::ToDoubleSeconds(now - absl::FromUnixNanos(unix_nanos));
}

double SecondsBetween(int64_t from_nanos, int64_t to_nanos) { return static_cast<double>(to_nanos - from_nanos) / 1e9; }

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

std::string JobStateName(const ckptd::v1::JobStatus& j) {
  return j.finished() ? "finished" : JobStateName(j.state());
}

std::string JobStateName(ckptd::v1::JobState s) {
  switch (s) {
    case ckptd::v1::JOB_RUNNING: return "running";
    case ckptd::v1::JOB_RESTARTING: return "restarting";
    default: return "unknown";
  }
}

namespace {
// Ranks per source, cheapest first, named as protocol::RestoreSourceName does.
std::vector<std::pair<std::string, int>> SourceCounts(const ckptd::v1::RestoreSummary& r) {
  std::map<int, int> by_source;
  for (const auto& rank : r.ranks()) ++by_source[rank.source()];
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [source, n] : by_source) {
    const absl::string_view name = protocol::RestoreSourceName(static_cast<ckptd::v1::RestoreSource>(source));
    out.emplace_back(name.empty() ? "unknown" : std::string(name), n);
  }
  return out;
}
}  // namespace

std::string RestoreSourcesText(const ckptd::v1::RestoreSummary& r) {
  std::vector<std::string> parts;
  for (const auto& [name, n] : SourceCounts(r)) {
    parts.push_back(absl::StrCat(n, parts.empty() ? (n == 1 ? " rank" : " ranks") : "", " from ", name));
  }
  if (const int resharded = protocol::ReshardedRanks(r); resharded > 0) {
    parts.push_back(absl::StrCat(resharded, resharded == 1 ? " rank" : " ranks", " read resharded (saved by ",
                                 r.saved_world_size(), r.saved_world_size() == 1 ? " rank)" : " ranks)"));
  }
  return absl::StrJoin(parts, ", ");
}

void WriteRestoreSummary(JsonWriter& w, const ckptd::v1::RestoreSummary& r) {
  w.BeginObject();
  w.Field("step", r.step());
  w.Field("incarnation", r.incarnation());
  // Ranks read the step resharded: the world that saved it; else null.
  NullableUint(w, "saved_world_size", r.saved_world_size() > 0, r.saved_world_size());
  w.Key("sources");
  w.BeginObject();
  for (const auto& [name, n] : SourceCounts(r)) w.Field(name, n);
  w.EndObject();
  w.Key("ranks");
  w.BeginArray();
  for (const auto& rank : r.ranks()) {
    w.BeginObject();
    w.Field("rank", rank.rank());
    const absl::string_view name = protocol::RestoreSourceName(rank.source());
    w.Field("source", name.empty() ? "unknown" : std::string(name));
    w.Field("node", rank.node_id());
    w.Field("resharded", rank.resharded());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
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

size_t DisplayWidth(absl::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : TerminalSafe(s)) {
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

void NullableUint(JsonWriter& w, absl::string_view key, bool present, uint64_t value) {
  w.Key(key);
  if (present) {
    w.Uint(value);
  } else {
    w.Null();
  }
}

void NullablePositive(JsonWriter& w, absl::string_view key, double value) {
  w.Key(key);
  if (value > 0 && std::isfinite(value)) {
    w.Double(value);
  } else {
    w.Null();
  }
}

void NullableTime(JsonWriter& w, absl::string_view key, int64_t unix_nanos) {
  w.Key(key);
  if (unix_nanos != 0) {
    w.String(IsoTime(unix_nanos));
  } else {
    w.Null();
  }
}

void UintArray(JsonWriter& w, absl::string_view key, const google::protobuf::RepeatedField<uint64_t>& values) {
  w.Key(key);
  w.BeginArray();
  for (uint64_t v : values) w.Uint(v);
  w.EndArray();
}

std::optional<int> Command::Start(const std::vector<std::string>& argv, std::set<std::string> value_flags,
                                  std::set<std::string> bool_flags, bool needs_job,
                                  const CoordinatorApiFactory& factory, size_t max_positional) {
  value_flags.insert(CoordinatorValueFlags().begin(), CoordinatorValueFlags().end());
  bool_flags.insert({"help", "json"});
  absl::StatusOr<base::Args> args = base::Args::Parse(argv, value_flags, bool_flags);
  if (!args.ok()) return Usage(args.status().message());
  args_ = *std::move(args);
  if (args_.Has("help")) {
    out_ << help_;
    return base::kExitOk;
  }
  if (args_.positional().size() > max_positional) {
    return Usage(absl::StrCat("unexpected argument \"", args_.positional()[max_positional], "\""));
  }
  if (!args_.Get("coordinator") || args_.Get("coordinator")->empty()) {
    return Usage("--coordinator HOST:PORT is required");
  }
  if (absl::Status s = CheckCoordinatorAddress(args_); !s.ok()) return Usage(s.message());
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
  const std::string message = TerminalSafe(s.message());
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      // The real API's messages start "coordinator HOST:PORT: ".
      err_ << prefix << "cannot reach "
           << (absl::StartsWith(s.message(), "coordinator ")  ? std::string("the ")
               : absl::StrContains(s.message(), address)      ? std::string("the coordinator: ")
                                                              : absl::StrCat("the coordinator at ", address, ": "))
           << message << "\n";
      return base::kExitUnavailable;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      err_ << prefix << message << "\n";
      if (std::optional<std::string> file = args_.Get("token-file")) {
        err_ << "  the coordinator refused the operator token in " << *file
             << ": pass --token-file with the token it was started with (<state-dir>/operator-token, or the file "
                "given to ckptd-coordinator --operator-token-file)\n";
      } else {
        err_ << "  this command needs the operator token: pass --token-file F, where F is "
                "<state-dir>/operator-token of the coordinator (or the file given to ckptd-coordinator "
                "--operator-token-file)\n";
      }
      return base::kExitFailed;
    case absl::StatusCode::kUnimplemented:
      err_ << prefix << "the coordinator at " << address << " is too old for `ckptctl " << name_ << "`"
           << (rpc.empty() ? "" : absl::StrCat(" (it does not implement ", rpc, ")"))
           << "; upgrade ckptd-coordinator\n";
      return base::kExitFailed;
    case absl::StatusCode::kInvalidArgument:
      err_ << prefix << message << "\n";
      return base::kExitUsage;
    default:
      err_ << prefix << message << "\n";
      return base::kExitFailed;
  }
}

}  // namespace ckptd::cli
