// ckptd-coordinator: the cluster's coordinator: tracks agents and jobs,
// detects failures, sets the checkpoint schedule, commits global checkpoints
// and plans restores.
#include <pthread.h>

#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/logger.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/state_store.h"
#include "metrics/http_server.h"
#include "metrics/registry.h"
#include "rpc/operator_token.h"
#include "rpc/tls.h"
#include "storage/file_system.h"
#include "storage/posix_file_system.h"
#include "storage/store.h"

namespace {

const char kUsage[] =
    "usage: ckptd-coordinator --listen <host:port> --storage-root <dir> --state-dir <dir>\n"
    "                         [--metrics-listen <host:port>] [--heartbeat-interval 1s]\n"
    "                         [--node-lost-after 5s] [--hang-floor 60s] [--keep N]\n"
    "                         [--every N | --initial-every N] [--min-interval 10s] [--max-interval 6h]\n"
    "                         [--failure-rate 3e-6] [--failure-prior-weight 1] [--restart-guess 5m]\n"
    "                         [--alternative-interval 30m] [--interval-hysteresis 0.2] [--decide-every 10s]\n"
    "                         [--step-deadline 30m] [--operator-token-file F]\n"
    "                         [--tls-cert F --tls-key F --tls-ca F]\n"
    "\n"
    "Coordinates the agents of a cluster over gRPC: tracks agents and jobs,\n"
    "detects lost nodes and dead or hung trainers, publishes the checkpoint\n"
    "schedule, commits a step once every rank's shard is durable, and plans\n"
    "restores so that every rank resumes from the same intact step.\n"
    "\n"
    "  --listen <host:port>        gRPC address (\":port\": every interface; port 0: any free port)\n"
    "  --storage-root <dir>        where checkpoints live (created when missing)\n"
    "  --state-dir <dir>           the coordinator's database (coordinator.db) and operator token\n"
    "  --metrics-listen <host:port>  serve Prometheus metrics at http://<host:port>/metrics\n"
    "  --heartbeat-interval <d>    how often agents send heartbeats (default 1s)\n"
    "  --node-lost-after <d>       heartbeat silence after which a node is lost (default 5s)\n"
    "  --hang-floor <d>            least time without step progress before a rank is hung (default 60s)\n"
    "  --every N                   a fixed interval: checkpoint every N steps, always (turns the\n"
    "                              interval policy off)\n"
    "  --initial-every N           without --every: the interval until the policy has measured a\n"
    "                              checkpoint (default 100 steps)\n"
    "  --min-interval <d>          the policy's bounds on the interval (defaults 10s and 6h; 0: none).\n"
    "  --max-interval <d>          The persist time is a floor above both.\n"
    "  --failure-rate <rate>       prior mean of the failure rate, per GPU-hour (default 3e-6)\n"
    "  --failure-prior-weight <n>  the prior's weight in failures (default 1): the estimate moves\n"
    "                              from the prior to the failures observed as they outweigh it\n"
    "  --restart-guess <d>         restart cost assumed until one is measured (default 5m)\n"
    "  --alternative-interval <d>  the interval reported beside the policy's for comparison\n"
    "                              (default 30m)\n"
    "  --interval-hysteresis <f>   change the interval only when it moves by more than this\n"
    "                              fraction (default 0.2) and lowers the expected waste\n"
    "  --decide-every <d>          how often the policy looks at its measurements (default 10s)\n"
    "  --keep N                    committed steps kept per job (default 2)\n"
    "  --step-deadline <d>         a step still incomplete this long after its first shard\n"
    "                              is aborted (default 30m)\n"
    "  --operator-token-file F     file holding the token operator RPCs must carry; without it a\n"
    "                              random token is generated at every start and written to\n"
    "                              <state-dir>/operator-token (mode 0600)\n"
    "  --tls-cert F --tls-key F --tls-ca F\n"
    "                              mutual TLS (PEM files): serve with this certificate and key and\n"
    "                              require client certificates signed by the CA\n"
    "  --help                      this text\n"
    "\n"
    "Durations are like 500ms, 1s, 1m30s, 2h. Prints \"ckptd-coordinator: listening on\n"
    "<host>:<port>\" to stderr once serving, and stops on SIGINT or SIGTERM (exit 0).\n"
    "Exit codes: 1 the storage root or state could not be opened, 2 bad command line,\n"
    "3 an address could not be served.\n";

// "host:port" with the port replaced by `port`.
std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

}  // namespace

int main(int argc, char** argv) {
  ckptd::base::SetProgramName("ckptd-coordinator");
  namespace co = ckptd::coordinator;
  using ckptd::base::Args;
  // Signals are taken by sigwait() below; blocked here, before any thread
  // starts, so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::vector<std::string> argv_list(argv + 1, argv + argc);
  absl::StatusOr<Args> args = Args::Parse(
      argv_list,
      {"listen", "storage-root", "state-dir", "metrics-listen", "heartbeat-interval", "node-lost-after", "hang-floor",
       "every", "initial-every", "keep", "step-deadline", "operator-token-file", "tls-cert", "tls-key", "tls-ca",
       "min-interval", "max-interval", "failure-rate", "failure-prior-weight", "restart-guess", "alternative-interval",
       "interval-hysteresis", "decide-every"},
      {"help"});
  if (args.ok() && args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  auto usage = [](const std::string& why) {
    std::cerr << "ckptd-coordinator: " << why << "\n" << kUsage;
    return ckptd::base::kExitUsage;
  };
  auto fail = [](const std::string& what, const absl::Status& s, int code) {
    std::cerr << "ckptd-coordinator: " << what << ": " << s.message() << "\n";
    return code;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  if (!args->positional().empty()) return usage(absl::StrCat("unexpected argument \"", args->positional()[0], "\""));
  if (!args->Get("listen") || !args->Get("storage-root") || !args->Get("state-dir")) {
    return usage("--listen, --storage-root and --state-dir are required");
  }
  const std::string listen = *args->Get("listen");
  const std::string storage_root = *args->Get("storage-root");
  const std::string state_dir = *args->Get("state-dir");

  co::CoordinatorOptions options;
  options.retention_in_tick = false;  // the service removes old steps on a thread of its own
  struct DurationFlag {
    const char* name;
    absl::Duration* value;
  };
  for (const DurationFlag& f : {DurationFlag{"heartbeat-interval", &options.heartbeat_interval},
                                DurationFlag{"node-lost-after", &options.node_lost_after},
                                DurationFlag{"hang-floor", &options.hang_floor},
                                DurationFlag{"step-deadline", &options.step_deadline},
                                DurationFlag{"restart-guess", &options.restart_guess},
                                DurationFlag{"alternative-interval", &options.alternative_interval},
                                DurationFlag{"decide-every", &options.decide_every}}) {
    std::optional<std::string> v = args->Get(f.name);
    if (!v) continue;
    absl::Duration d;
    if (!absl::ParseDuration(*v, &d) || d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return usage(absl::StrCat("--", f.name, ": \"", *v, "\" is not a positive duration (e.g. 500ms, 5s, 30m)"));
    }
    *f.value = d;
  }
  // Bounds: 0 turns one off.
  for (const DurationFlag& f : {DurationFlag{"min-interval", &options.min_interval},
                                DurationFlag{"max-interval", &options.max_interval}}) {
    std::optional<std::string> v = args->Get(f.name);
    if (!v) continue;
    absl::Duration d;
    if (!absl::ParseDuration(*v, &d) || d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return usage(absl::StrCat("--", f.name, ": \"", *v, "\" is not a duration (e.g. 30s, 2h; 0 for no bound)"));
    }
    *f.value = d;
  }
  if (options.max_interval > absl::ZeroDuration() && options.min_interval > options.max_interval) {
    return usage("--min-interval is longer than --max-interval");
  }
  struct RealFlag {
    const char* name;
    double* value;
    double low, high;  // exclusive, inclusive
  };
  for (const RealFlag& f : {RealFlag{"failure-rate", &options.failure_prior.mean_per_gpu_hour, 0, 1e3},
                            RealFlag{"failure-prior-weight", &options.failure_prior.shape, 0, 1e6},
                            RealFlag{"interval-hysteresis", &options.hysteresis, 0, 10}}) {
    std::optional<std::string> v = args->Get(f.name);
    if (!v) continue;
    double x = 0;
    if (!absl::SimpleAtod(*v, &x) || !(x > f.low) || !(x <= f.high)) {
      return usage(absl::StrCat("--", f.name, ": \"", *v, "\" is not a number in (", f.low, ", ", f.high, "]"));
    }
    *f.value = x;
  }
  if (options.heartbeat_interval < absl::Milliseconds(1)) return usage("--heartbeat-interval must be at least 1ms");
  if (options.node_lost_after <= options.heartbeat_interval) {
    return usage("--node-lost-after must be longer than --heartbeat-interval");
  }
  if (args->Has("every") && args->Has("initial-every")) return usage("--every and --initial-every exclude each other");
  options.interval_automatic = !args->Has("every");
  for (const char* flag : {"every", "initial-every", "keep"}) {
    absl::StatusOr<std::optional<uint64_t>> v = args->GetUint(flag);
    if (!v.ok()) return usage(std::string(v.status().message()));
    if (!*v) continue;
    if (**v == 0 || **v > (std::string(flag) == "keep" ? 1'000'000u : uint64_t{1} << 40)) {
      return usage(absl::StrCat("--", flag, " must be a positive integer of sensible size"));
    }
    if (std::string(flag) != "keep") options.every_steps = **v;
    if (std::string(flag) == "keep") options.keep_last = static_cast<int>(**v);
  }

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  const int tls_flags = args->Has("tls-cert") + args->Has("tls-key") + args->Has("tls-ca");
  if (tls_flags != 0 && tls_flags != 3) return usage("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca");
  if (tls_flags == 3) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls =
        ckptd::rpc::ServerCredentialsFromFiles({*args->Get("tls-cert"), *args->Get("tls-key"), *args->Get("tls-ca")});
    if (!tls.ok()) return fail("TLS", tls.status(), ckptd::base::kExitUsage);
    credentials = *tls;
  }

  std::unique_ptr<ckptd::storage::PosixFileSystem> fs = ckptd::storage::NewPosixFileSystem();
  if (absl::Status s = ckptd::storage::CreateDirs(fs.get(), storage_root); !s.ok()) {
    return fail("storage root", s, ckptd::base::kExitFailed);
  }
  absl::StatusOr<std::unique_ptr<co::StateStore>> state = co::OpenSqliteStateStore(state_dir);
  if (!state.ok()) {
    return fail("state database", state.status(),
                absl::IsUnavailable(state.status()) ? ckptd::base::kExitUnavailable : ckptd::base::kExitFailed);
  }

  co::CoordinatorServiceOptions service_options;
  if (std::optional<std::string> token_file = args->Get("operator-token-file")) {
    absl::StatusOr<std::string> token = ckptd::rpc::ReadOperatorTokenFile(*token_file);
    if (!token.ok()) return fail("--operator-token-file", token.status(), ckptd::base::kExitUsage);
    service_options.operator_token = *token;
  } else {
    absl::StatusOr<std::string> token = ckptd::rpc::GenerateOperatorToken();
    const std::string path = absl::StrCat(state_dir, "/", ckptd::rpc::kOperatorTokenFileName);
    absl::Status written = token.ok() ? ckptd::rpc::WriteOperatorTokenFile(path, *token) : token.status();
    if (!written.ok()) return fail("operator token", written, ckptd::base::kExitFailed);
    service_options.operator_token = *token;
    std::cerr << "ckptd-coordinator: operator token written to " << path << "\n";
  }

  ckptd::storage::CheckpointStore store(fs.get(), storage_root);
  ckptd::base::RealClock clock;
  ckptd::metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<co::CoordinatorMetrics>> metrics = co::CoordinatorMetrics::Create(&registry);
  if (!metrics.ok()) return fail("metrics", metrics.status(), ckptd::base::kExitFailed);
  co::CoordinatorCore core(&store, state->get(), &clock, options, metrics->get());
  if (absl::Status s = core.Recover(); !s.ok()) return fail("recovering state", s, ckptd::base::kExitFailed);
  ckptd::metrics::CollectorHandle collector = (*metrics)->Watch(&core);

  std::unique_ptr<ckptd::metrics::HttpServer> http;
  if (std::optional<std::string> metrics_listen = args->Get("metrics-listen")) {
    absl::StatusOr<std::unique_ptr<ckptd::metrics::HttpServer>> started =
        ckptd::metrics::HttpServer::Start(*metrics_listen, ckptd::metrics::MetricsHandler(registry));
    if (!started.ok()) {
      return fail(absl::StrCat("--metrics-listen ", *metrics_listen), started.status(), ckptd::base::kExitUnavailable);
    }
    http = *std::move(started);
  }
  auto service = std::make_unique<co::CoordinatorService>(&core, service_options);
  absl::StatusOr<co::CoordinatorServer> server = co::StartCoordinatorServer(listen, service.get(), credentials);
  if (!server.ok()) {
    return fail(absl::StrCat("--listen ", listen), server.status(),
                absl::IsInvalidArgument(server.status()) ? ckptd::base::kExitUsage : ckptd::base::kExitUnavailable);
  }
  if (http != nullptr) {
    std::cerr << "ckptd-coordinator: metrics on http://" << WithPort(*args->Get("metrics-listen"), http->port())
              << "/metrics\n";
  }
  std::cerr << "ckptd-coordinator: storage root " << storage_root << ", state " << state_dir
            << (tls_flags == 3 ? ", mutual TLS" : ", no TLS") << "\n";
  std::cerr << "ckptd-coordinator: listening on " << WithPort(listen, server->port) << std::endl;

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  std::cerr << "ckptd-coordinator: stopping on signal " << sig << "\n";
  co::ShutdownCoordinatorServer(server->server.get());
  if (http != nullptr) http->Stop();
  service.reset();  // stops the ticker
  collector.Reset();
  return ckptd::base::kExitOk;
}
