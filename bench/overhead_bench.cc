#include "bench/overhead_bench.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/flags.h"
#include "cli/json.h"

namespace ckptd::bench {

const char kOverheadHelp[] =
    "usage: ckptd-bench overhead [--state-mb M] [--steps N] [--step-ms T] [--every K,K,...] [--repeat R] [--json]\n"
    "\n"
    "Starts ckptd-agent (from this binary's folder) on a scratch folder and runs\n"
    "ckptd-demo-trainer with --state-mb M (default 4) for N steps (default 200),\n"
    "each padded to T ms of compute (default 50), without checkpoints and with a\n"
    "snapshot every K steps for each K (default 1,50), R rounds each (default 3)\n"
    "in alternating order. Reports the median training time of each and the\n"
    "overhead against the run without checkpoints.\n"
    "Ranges: --state-mb 1..65536, --steps 1..2^62, --step-ms 0..3600000, --every\n"
    "1..2^40 each, --repeat 1..100.\n";

namespace {

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, n);
  return p.substr(0, p.rfind('/'));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Runs the trainer; returns train_s from its last line.
std::optional<double> RunTrainer(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) return std::nullopt;
  const size_t at = out.rfind("train_s=");
  double v = 0;
  if (at == std::string::npos || !absl::SimpleAtod(absl::StripTrailingAsciiWhitespace(out.substr(at + 8)), &v)) {
    return std::nullopt;
  }
  return v;
}

}  // namespace

int RunOverheadBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<base::Args> args =
      base::Args::Parse(argv, {"state-mb", "steps", "step-ms", "every", "repeat"}, {"json", "help"});
  if (args.ok() && args->Has("help")) {
    out << kOverheadHelp;
    return base::kExitOk;
  }
  auto usage = [&](const std::string& why) {
    err << "ckptd-bench overhead: " << why << "\n" << kOverheadHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  // The trainer's ranges (ckptd-demo-trainer --help), checked here so that a
  // bad value is a usage error of the bench rather than N failed runs.
  uint64_t vals[4] = {4, 200, 50, 3};
  struct Range {
    const char* name;
    uint64_t min, max;
  };
  const Range ranges[4] = {
      {"state-mb", 1, 65536}, {"steps", 1, uint64_t{1} << 62}, {"step-ms", 0, 3'600'000}, {"repeat", 1, 100}};
  for (int i = 0; i < 4; ++i) {
    if (absl::Status s = args->ReadUint(ranges[i].name, ranges[i].min, ranges[i].max, &vals[i]); !s.ok()) {
      return usage(std::string(s.message()));
    }
  }
  std::vector<uint64_t> everies;
  for (absl::string_view part : absl::StrSplit(args->Get("every").value_or("1,50"), ',')) {
    uint64_t k = 0;
    if (part.empty() || !std::all_of(part.begin(), part.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
        !absl::SimpleAtoi(part, &k) || k == 0 || k > (uint64_t{1} << 40)) {
      return usage(
          absl::StrCat("--every must be integers in 1..1099511627776 separated by commas, got \"", part, "\""));
    }
    everies.push_back(k);
  }

  char tmpl[] = "/tmp/ckptd-overhead-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    err << "ckptd-bench overhead: cannot create a temporary folder\n";
    return base::kExitFailed;
  }
  const std::string dir = tmpl;
  const std::string bin = SelfDir();
  const std::string socket = dir + "/agent.sock";
  const pid_t agent = ::fork();
  if (agent == 0) {
    const std::string a = bin + "/ckptd-agent", root = dir + "/root";
    ::execl(a.c_str(), a.c_str(), "--storage-root", root.c_str(), "--socket", socket.c_str(), "--keep", "1",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 1000 && ::access(socket.c_str(), F_OK) != 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  int rc = base::kExitOk;
  // Index 0: no checkpoints; then one per --every value.
  std::vector<std::vector<double>> runs(everies.size() + 1);
  for (uint64_t round = 0; rc == base::kExitOk && round < vals[3]; ++round) {
    for (size_t k = 0; k <= everies.size(); ++k) {
      const size_t which = round % 2 == 0 ? k : everies.size() - k;
      const uint64_t every = which == 0 ? 0 : everies[which - 1];
      const std::string cmd = absl::StrCat("'", bin, "/ckptd-demo-trainer' --socket '", socket, "' --job run-", round,
                                           "-", which, " --steps ", vals[1], " --state-mb ", vals[0], " --step-ms ",
                                           vals[2], " --every ", every, " 2>/dev/null");
      std::optional<double> t = RunTrainer(cmd);
      if (!t) {
        err << "ckptd-bench overhead: the trainer failed: " << cmd << "\n";
        rc = base::kExitFailed;
        break;
      }
      runs[which].push_back(*t);
    }
  }
  ::kill(agent, SIGTERM);
  ::waitpid(agent, nullptr, 0);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  if (rc != base::kExitOk) return rc;
  const double base = Median(runs[0]);
  cli::JsonWriter w;
  w.BeginObject();
  w.Field("state_mb", vals[0]);
  w.Field("steps", vals[1]);
  w.Field("step_ms", vals[2]);
  w.Field("rounds", vals[3]);
  w.Field("no_checkpoint_s", base);
  w.Key("every");
  w.BeginArray();
  for (size_t i = 0; i < everies.size(); ++i) {
    const double t = Median(runs[i + 1]);
    w.BeginObject();
    w.Field("steps", everies[i]);
    w.Field("train_s", t);
    w.Field("overhead", base > 0 ? t / base - 1 : 0.0);
    w.EndObject();
    if (!args->Has("json")) {
      out << absl::StrFormat("snapshot every %d steps: %.3f s vs %.3f s without: overhead %.2f%%\n", everies[i], t,
                             base, base > 0 ? 100 * (t / base - 1) : 0.0);
    }
  }
  w.EndArray();
  w.EndObject();
  if (args->Has("json")) out << w.str() << "\n";
  return base::kExitOk;
}

}  // namespace ckptd::bench
