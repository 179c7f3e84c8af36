// The frame that ckptctl's online commands share: parsing the flags every
// one takes, connecting to the coordinator, saying why a call failed with
// the documented exit status, and the small formatting helpers of their
// tables and JSON objects (the offline ones use these too). Internal to
// ckptd::cli.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/format.h"
#include "base/json.h"
#include "ckptd/v1/coordinator.pb.h"
#include "cli/operator_commands.h"

namespace ckptd::cli {

using base::ByteUnits;
using base::DurationStyle;
using base::FormatBytes;
using base::FormatSeconds;
using base::HumanBytes;
using base::IsoTime;
using base::JsonWriter;
using base::Seconds;
using base::ShortDuration;
using base::TerminalSafe;

// The flags of every command that talks to a live coordinator
// (--coordinator HOST:PORT, mutual TLS and the operator's --token-file;
// cli/remote.h), for base::Args::Parse.
const std::set<std::string>& CoordinatorValueFlags();
// --coordinator's HOST:PORT, when given: kInvalidArgument naming the flag
// when it is malformed or its port is outside 1..65535 (never wrapped).
absl::Status CheckCoordinatorAddress(const base::Args& args);

// Whether `argv` (before a "--") gives `flag` ("--flag" or "--flag=value").
bool GivesFlag(const std::vector<std::string>& argv, absl::string_view flag);

// The environment's stand-ins for flags a command line leaves out:
// CKPTD_COORDINATOR for --coordinator and CKPTD_TOKEN_FILE for --token-file,
// appended to `argv` (the arguments after the command's name) where
// `command` talks to a live coordinator: status, checkpoint, list,
// restore-plan, drill run and drill suite always; verify without --root
// (otherwise the offline verify); interval with --job (otherwise the
// offline calculation). A flag on the command line wins; an unset or empty
// variable adds nothing. `getenv` is ::getenv but for tests.
void AddEnvironmentDefaults(absl::string_view command, std::vector<std::string>* argv,
                            const std::function<const char*(const char*)>& getenv);

std::string Percent(double fraction);
// "3/4"; "-" when neither is known (an entry that carries no world size).
std::string Ranks(uint32_t reported, uint32_t world);
double SecondsSince(absl::Time now, int64_t unix_nanos);
// From `from_nanos` to `to_nanos` (Unix nanoseconds, one clock), in seconds.
double SecondsBetween(int64_t from_nanos, int64_t to_nanos);
// "0-3,8,10-11" for sorted, distinct ranks.
std::string RankRanges(std::vector<uint32_t> ranks);
std::string JobStateName(ckptd::v1::JobState s);
// The job's state as status shows it: "finished" once every rank left
// without a failure (JobStatus.finished), else JobStateName(state).
std::string JobStateName(const ckptd::v1::JobStatus& j);
// Where the ranks of a restore read their step: "4 ranks from memory, 2 from
// storage-root" (cheapest source first; "" without ranks).
std::string RestoreSourcesText(const ckptd::v1::RestoreSummary& r);
// The same as a JSON object: step, incarnation, sources (ranks per source),
// ranks (rank, source, node).
void WriteRestoreSummary(JsonWriter& w, const ckptd::v1::RestoreSummary& r);
std::string StepStateName(ckptd::v1::StepState s);
std::string FailureKindName(ckptd::v1::FailureKind k);
// The width of UTF-8 text in columns: code points, not bytes (labels use δ, τ).
size_t DisplayWidth(absl::string_view s);
// `s` with & < > " ' escaped, for XML and HTML text and attributes, after
// TerminalSafe (which XML needs too: it allows no C0 control but TAB, LF and
// CR, and only UTF-8 in the page's encoding).
std::string XmlEscape(absl::string_view s);
// Writes `content` to `path` (created or truncated); an error naming the
// file and why when it cannot.
absl::Status WriteTextFile(const std::string& path, absl::string_view content);

// JSON fields of the commands' objects that may be unknown (null).
// key: `value`, or null when not `present`.
void NullableUint(JsonWriter& w, absl::string_view key, bool present, uint64_t value);
// key: `value`, or null unless it is positive and finite.
void NullablePositive(JsonWriter& w, absl::string_view key, double value);
// key: the time as IsoTime, or null for 0 (unknown).
void NullableTime(JsonWriter& w, absl::string_view key, int64_t unix_nanos);
// key: [values...].
void UintArray(JsonWriter& w, absl::string_view key, const google::protobuf::RepeatedField<uint64_t>& values);

// Columns padded to their widest cell, two spaces apart, indented by two;
// the last column is not padded. Cells are printed TerminalSafe: they hold
// names and reasons that came from the coordinator or from files.
class Table {
 public:
  // `right`: the columns aligned right (numbers).
  explicit Table(std::vector<std::string> header, std::set<size_t> right = {}) : right_(std::move(right)) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) {
    for (std::string& cell : row) cell = TerminalSafe(cell);
    rows_.push_back(std::move(row));
  }
  void Print(std::ostream& out) const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
      std::string line = " ";
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
        const bool last = c + 1 == row.size();
        const std::string pad(width[c] - row[c].size(), ' ');
        line += " ";
        line += right_.count(c) ? pad + row[c] : last ? row[c] : row[c] + pad;
        if (!last) line += " ";
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out << line << "\n";
    }
  }

 private:
  std::set<size_t> right_;
  std::vector<std::vector<std::string>> rows_;
};

// ------------------------------------------------------------- the commands' frame

// A parsed command line and the coordinator it talks to.
class Command {
 public:
  Command(absl::string_view name, const char* help, std::ostream& out, std::ostream& err)
      : name_(name), help_(help), out_(out), err_(err) {}

  // Parses `argv` (the coordinator's flags, `value_flags`, `bool_flags`,
  // --help and --json, and up to `max_positional` positional arguments),
  // reads the token file when given, and connects. Returns the exit status
  // when the command is over already (--help, a usage error, a failed
  // connect), nullopt when it goes on.
  std::optional<int> Start(const std::vector<std::string>& argv, std::set<std::string> value_flags,
                           std::set<std::string> bool_flags, bool needs_job, const CoordinatorApiFactory& factory,
                           size_t max_positional = 0);

  // `why` may quote a file's or an argument's text: it is printed TerminalSafe.
  int Usage(absl::string_view why) const {
    err_ << "ckptctl " << name_ << ": " << TerminalSafe(why) << "\n(`ckptctl " << name_
         << " --help` describes the flags)\n";
    return base::kExitUsage;
  }

  // Says why `rpc` failed (the coordinator's message, TerminalSafe) and
  // returns the exit status for it.
  int Fail(absl::string_view rpc, const absl::Status& s) const;

  const base::Args& args() const { return args_; }
  CoordinatorApi& api() const { return *api_; }
  bool json() const { return args_.Has("json"); }
  std::string job() const { return args_.Get("job").value_or(""); }
  std::ostream& out() const { return out_; }
  std::ostream& err() const { return err_; }
  const std::string& name() const { return name_; }

 private:
  const std::string name_;
  const char* const help_;
  std::ostream& out_;
  std::ostream& err_;
  base::Args args_;
  std::unique_ptr<CoordinatorApi> api_;
};

}  // namespace ckptd::cli
