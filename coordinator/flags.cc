#include "coordinator/flags.h"

#include <cstdint>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/host_port.h"
#include "base/status_macros.h"
#ifdef CKPTD_HAVE_ETCD
#include "etcd/etcd_client.h"
#endif

namespace ckptd::coordinator {

const char kCoordinatorUsage[] =
    "usage: ckptd-coordinator --listen <host:port> --storage-root <dir|s3://bucket/prefix>\n"
    "                         (--state-dir <dir> | --etcd-endpoints <h:p,...> [--etcd-prefix /ckptd/<name>]\n"
    "                          [--etcd-lease-ttl 3s] [--advertise <host:port>] [--etcd-ca F [--etcd-cert F\n"
    "                          --etcd-key F]] [--etcd-user U --etcd-password-file F] [--import-state <dir>])\n"
    "                         [--metrics-listen <host:port>] [--heartbeat-interval 1s]\n"
    "                         [--node-lost-after 5s] [--hang-floor 60s] [--keep N]\n"
    "                         [--every N | --initial-every N] [--durable-every auto|K]\n"
    "                         [--min-interval 10s] [--max-interval 6h]\n"
    "                         [--failure-rate 3e-6] [--failure-prior-weight 1] [--failure-mix 0.75,0.2,0.05]\n"
    "                         [--restart-guess 5m]\n"
    "                         [--alternative-interval 30m] [--interval-hysteresis 0.2] [--decide-every 10s]\n"
    "                         [--step-deadline 30m] [--max-nodes N] [--max-jobs N] [--max-registration-memory B]\n"
    "                         [--forget-after 168h]\n"
    "                         [--operator-token-file F]\n"
    "                         [--agent-token-file F | --insecure-agents]\n"
    "                         [--tls-cert F --tls-key F --tls-ca F] [--audit-log F]\n"
    "\n"
    "Coordinates the agents of a cluster over gRPC: tracks agents and jobs,\n"
    "detects lost nodes and dead or hung trainers, publishes the checkpoint\n"
    "schedule, commits a step once every rank's shard is durable, and plans\n"
    "restores so that every rank resumes from the same intact step.\n"
    "\n"
    "  --listen <host:port>        gRPC address (\":port\": every interface; port 0..65535, 0: any\n"
    "                              free port)\n"
    "  --storage-root <dir>        where checkpoints live (created when missing): a directory, or an object\n"
    "                              store, s3://bucket/prefix (its bucket must exist; credentials, region\n"
    "                              and endpoint from the AWS_* environment or profile, see docs/operations.md)\n"
    "  --state-dir <dir>           the coordinator's database (coordinator.db) and tokens: one\n"
    "                              coordinator, its state on its own disk\n"
    "  --etcd-endpoints <list>     instead of --state-dir: replicated coordinators, their state in\n"
    "                              etcd (members as host:port, comma-separated). The replicas elect a\n"
    "                              leader through etcd; only it serves, the others answer UNAVAILABLE\n"
    "                              naming it, and take over within about the lease TTL when it is gone.\n"
    "                              Needs --operator-token-file and --agent-token-file (or\n"
    "                              --insecure-agents): every replica must hold the same tokens\n"
    "  --etcd-prefix <key>         the cluster's keys in etcd (default /ckptd/default): replicas with\n"
    "                              the same prefix share state and elect one leader\n"
    "  --etcd-lease-ttl <d>        the leader's lease, whole seconds 2s..60s (default 3s): how long\n"
    "                              after a leader dies (or is paused, or cut off) another takes over\n"
    "  --advertise <host:port>     the address this replica is reached at, which standbys name to\n"
    "                              agents and ckptctl (default: --listen, with this host's name when\n"
    "                              --listen has no host or a wildcard one)\n"
    "  --etcd-ca F [--etcd-cert F --etcd-key F]\n"
    "                              TLS to etcd: its CA, and a client certificate for members that\n"
    "                              require one\n"
    "  --etcd-user U --etcd-password-file F\n"
    "                              etcd's authentication: the user and a file holding its password\n"
    "  --import-state <dir>        with --etcd-endpoints: move a single coordinator's state (the\n"
    "                              --state-dir it ran with: jobs, quarantined steps, failure history)\n"
    "                              into etcd when this replica first leads and the prefix holds none\n"
    "  --metrics-listen <host:port>  serve Prometheus metrics at http://<host:port>/metrics\n"
    "  --heartbeat-interval <d>    how often agents send heartbeats, 1ms..1h (default 1s)\n"
    "  --node-lost-after <d>       heartbeat silence after which a node is lost (default 5s)\n"
    "  --hang-floor <d>            least time without step progress before a rank is hung (default 60s)\n"
    "  --every N                   a fixed interval: checkpoint every N steps (1..2^40), always\n"
    "                              (turns the interval policy off)\n"
    "  --initial-every N           without --every: the interval until the policy has measured a\n"
    "                              checkpoint (1..2^40; default 100 steps)\n"
    "  --durable-every auto|K      two cadences: every K-th checkpoint durable (written and committed),\n"
    "                              the others memory checkpoints (kept in the agents' memory and\n"
    "                              replicated to partners); auto (default): the policy picks K from the\n"
    "                              failures seen by class (1 with --every, or for a job with a node\n"
    "                              whose agent runs without its memory tier); K in 1..1000\n"
    "  --min-interval <d>          the policy's bounds on the interval (defaults 10s and 6h; 0: none;\n"
    "                              at most 8760h, a year).\n"
    "  --max-interval <d>          The persist time is a floor above both.\n"
    "  --failure-rate <rate>       prior mean of the failure rate, per GPU-hour, in (0, 1000]\n"
    "                              (default 3e-6)\n"
    "  --failure-prior-weight <n>  the prior's weight in failures, in (0, 1e6] (default 1): the\n"
    "                              estimate moves from the prior to the failures observed as they\n"
    "                              outweigh it\n"
    "  --failure-mix P,N,W         how the prior splits over failure classes, as fractions (each > 0,\n"
    "                              normalised; default 0.75,0.2,0.05): a trainer process lost on a\n"
    "                              healthy node, one node lost, several nodes lost at once. Memory\n"
    "                              checkpoints recover the first two, the third needs a durable one\n"
    "  --restart-guess <d>         restart cost assumed until one is measured (default 5m)\n"
    "  --alternative-interval <d>  the interval reported beside the policy's for comparison\n"
    "                              (default 30m; at most 8760h)\n"
    "  --interval-hysteresis <f>   change the interval only when it moves by more than this\n"
    "                              fraction, in (0, 10] (default 0.2), and lowers the expected waste\n"
    "  --decide-every <d>          how often the policy looks at its measurements (default 10s)\n"
    "  --keep N                    committed steps kept per job, 1..1000000 (default 2)\n"
    "  --step-deadline <d>         a step still incomplete this long after its first shard\n"
    "                              is aborted (default 30m)\n"
    "  --max-nodes N               nodes tracked at most, 1..1000000 (default 10000): one more\n"
    "                              is refused at registration (RESOURCE_EXHAUSTED)\n"
    "  --max-jobs N                jobs tracked at most, 1..100000 (default 1000): a request\n"
    "                              naming one more is refused\n"
    "  --max-registration-memory B what the nodes' registrations may hold in memory together (their\n"
    "                              addresses, GPU names and ranks, about 600 bytes a rank), 1M..1T\n"
    "                              (K/M/G/T suffixes; default 512M): a registration past it is\n"
    "                              refused (RESOURCE_EXHAUSTED), a heartbeat's new ranks left out\n"
    "  --forget-after <d>          a node lost this long ago, and a job none of whose ranks ran for\n"
    "                              this long, are forgotten (default 168h, a week; at most 8760h);\n"
    "                              a forgotten job's committed steps stay in storage\n"
    "  --operator-token-file F     file holding the token operator RPCs must carry; without it a\n"
    "                              random token is generated at every start and written to\n"
    "                              <state-dir>/operator-token (mode 0600)\n"
    "  --agent-token-file F        file holding the token agents must present (ckptd-agent\n"
    "                              --agent-token-file) unless their TLS client certificate names\n"
    "                              their node; without it the token in <state-dir>/agent-token is\n"
    "                              used, or a random one generated and written there (mode 0600).\n"
    "                              It must differ from the operator token\n"
    "  --insecure-agents           accept agent RPCs (register, heartbeat, report shards and\n"
    "                              failures, restore plans) without any credential: anyone who can\n"
    "                              reach the port can act as any node. For tests and closed networks\n"
    "  --tls-cert F --tls-key F --tls-ca F\n"
    "                              mutual TLS (PEM files): serve with this certificate and key and\n"
    "                              require client certificates signed by the CA; an agent whose\n"
    "                              certificate's common name or a subject alternative name is its\n"
    "                              node id needs no agent token\n"
    "  --audit-log F               append the audit trail to F, one JSON object a line: who (credential,\n"
    "                              TLS client certificate names, peer address) registered which node\n"
    "                              (re-registrations of a live node marked), reported which failure,\n"
    "                              took which operator action, and every call refused at\n"
    "                              authentication (rate-limited). F is created mode 0600; a symbolic\n"
    "                              link or anything but a regular file is refused. With or without it,\n"
    "                              each record is also logged as a line \"audit: {...}\" on stderr\n"
    "  --help                      this text\n"
    "  --version                   print the version and exit\n"
    "\n"
    "Durations are like 500ms, 1s, 1m30s, 2h; positive, and at most 720h (30 days) unless said\n"
    "otherwise. Logs to stderr, each line \"<UTC time> <INFO|WARNING|ERROR> ckptd-coordinator:\n"
    "<message>\"; says \"listening on <host>:<port>\" once serving, and stops on SIGINT or\n"
    "SIGTERM (exit 0).\n"
    "\n"
    "The state directory is locked (<state-dir>/coordinator.lock, holding the pid) for as long\n"
    "as the coordinator runs: a second coordinator on it exits with status 3, naming the\n"
    "holder. The generated operator token (new at every start) and agent token (kept across\n"
    "restarts; delete the file to have a new one made) are written only once both ports are\n"
    "bound, so a coordinator that fails to start leaves the token files as they were.\n"
    "Exit codes: 1 the storage root, state or audit log could not be opened, 2 bad command line\n"
    "(a value outside its range, or an --audit-log that is a link or not a regular file,\n"
    "included), 3 an address could not be served or the state directory is in use by another\n"
    "coordinator.\n";

namespace {

const std::set<std::string> kValueFlags = {
    // clang-format off
    "listen", "storage-root", "state-dir", "metrics-listen", "heartbeat-interval", "node-lost-after", "hang-floor",
    "every", "initial-every", "durable-every", "keep", "step-deadline", "max-nodes", "max-jobs",
    "max-registration-memory", "forget-after", "operator-token-file", "agent-token-file", "tls-cert", "audit-log",
    "etcd-endpoints", "etcd-prefix", "etcd-lease-ttl", "advertise", "etcd-ca", "etcd-cert", "etcd-key", "etcd-user",
    "etcd-password-file", "import-state",
    "tls-key", "tls-ca",
    "min-interval", "max-interval", "failure-rate", "failure-prior-weight", "failure-mix", "restart-guess",
    "alternative-interval", "interval-hysteresis", "decide-every",
    // clang-format on
};
const std::set<std::string> kBoolFlags = {"help", "insecure-agents"};

struct DurationFlag {
  const char* name;
  absl::Duration* value;
  absl::Duration max;
};

struct RealFlag {
  const char* name;
  double* value;
  double low, high;  // exclusive, inclusive
};

// The longest durations the flags take: what the coordinator's arithmetic
// and the agents' heartbeat interval (milliseconds in 32 bits) hold with
// room to spare, and longer than any sensible setting.
constexpr absl::Duration kMaxHeartbeatInterval = absl::Hours(1);
constexpr absl::Duration kMaxDuration = absl::Hours(24 * 30);
constexpr absl::Duration kMaxInterval = absl::Hours(24 * 365);
// The largest fixed or initial interval, in steps, and the most steps kept.
constexpr uint64_t kMaxEvery = uint64_t{1} << 40;
constexpr uint64_t kMaxDurableEvery = 1000;  // policy::TwoLevelInputs::max_durable_every
constexpr int kMaxKeep = 1'000'000;
// The most nodes and jobs a coordinator may be told to track.
constexpr size_t kMaxNodes = 1'000'000;
constexpr size_t kMaxJobs = 100'000;

// The durations, the interval policy's settings and the interval; what
// needs a flag's value from `args` into `options`.
absl::Status ParseOptions(const base::Args& args, CoordinatorOptions& options) {
  for (const DurationFlag& f : {DurationFlag{"heartbeat-interval", &options.heartbeat_interval, kMaxHeartbeatInterval},
                                DurationFlag{"node-lost-after", &options.node_lost_after, kMaxDuration},
                                DurationFlag{"hang-floor", &options.hang_floor, kMaxDuration},
                                DurationFlag{"step-deadline", &options.step_deadline, kMaxDuration},
                                DurationFlag{"restart-guess", &options.restart_guess, kMaxDuration},
                                DurationFlag{"alternative-interval", &options.alternative_interval, kMaxInterval},
                                DurationFlag{"decide-every", &options.decide_every, kMaxDuration},
                                DurationFlag{"forget-after", &options.forget_after, kMaxInterval}}) {
    std::optional<std::string> v = args.Get(f.name);
    if (!v) continue;
    absl::Duration d;
    if (!absl::ParseDuration(*v, &d) || d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.name, ": \"", *v, "\" is not a positive duration (e.g. 500ms, 5s, 30m)"));
    }
    if (d > f.max) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.name, " must be at most ", absl::FormatDuration(f.max), ", got \"", *v, "\""));
    }
    *f.value = d;
  }
  // Bounds: 0 turns one off.
  for (const DurationFlag& f : {DurationFlag{"min-interval", &options.min_interval, kMaxInterval},
                                DurationFlag{"max-interval", &options.max_interval, kMaxInterval}}) {
    std::optional<std::string> v = args.Get(f.name);
    if (!v) continue;
    absl::Duration d;
    if (!absl::ParseDuration(*v, &d) || d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.name, ": \"", *v, "\" is not a duration (e.g. 30s, 2h; 0 for no bound)"));
    }
    if (d > f.max) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.name, " must be at most ", absl::FormatDuration(f.max), ", got \"", *v, "\""));
    }
    *f.value = d;
  }
  if (options.max_interval > absl::ZeroDuration() && options.min_interval > options.max_interval) {
    return absl::InvalidArgumentError("--min-interval is longer than --max-interval");
  }
  for (const RealFlag& f : {RealFlag{"failure-rate", &options.failure_prior.mean_per_gpu_hour, 0, 1e3},
                            RealFlag{"failure-prior-weight", &options.failure_prior.shape, 0, 1e6},
                            RealFlag{"interval-hysteresis", &options.hysteresis, 0, 10}}) {
    std::optional<std::string> v = args.Get(f.name);
    if (!v) continue;
    double x = 0;
    if (!absl::SimpleAtod(*v, &x) || !(x > f.low) || !(x <= f.high)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.name, ": \"", *v, "\" is not a number in (", f.low, ", ", f.high, "]"));
    }
    *f.value = x;
  }
  if (std::optional<std::string> v = args.Get("failure-mix")) {
    absl::StatusOr<policy::FailureMix> mix = policy::ParseFailureMix(*v);
    if (!mix.ok()) return absl::InvalidArgumentError(absl::StrCat("--failure-mix: ", mix.status().message()));
    options.failure_mix = *mix;
  }
  if (options.heartbeat_interval < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("--heartbeat-interval must be at least 1ms");
  }
  if (options.node_lost_after <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("--node-lost-after must be longer than --heartbeat-interval");
  }
  if (args.Has("every") && args.Has("initial-every")) {
    return absl::InvalidArgumentError("--every and --initial-every exclude each other");
  }
  options.interval_automatic = !args.Has("every");
  CKPTD_RETURN_IF_ERROR(args.ReadUint("every", 1, kMaxEvery, &options.every_steps));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("initial-every", 1, kMaxEvery, &options.every_steps));
  if (std::optional<std::string> v = args.Get("durable-every"); v && *v != "auto") {
    CKPTD_RETURN_IF_ERROR(args.ReadUint("durable-every", 1, kMaxDurableEvery, &options.durable_every));
  }
  CKPTD_RETURN_IF_ERROR(args.ReadUint("keep", 1, kMaxKeep, &options.keep_last));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("max-nodes", 1, kMaxNodes, &options.max_nodes));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("max-jobs", 1, kMaxJobs, &options.max_jobs));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("max-registration-memory", uint64_t{1} << 20, uint64_t{1} << 40,
                                      &options.max_registration_bytes, /*allow_suffix=*/true));
  return absl::OkStatus();
}

// The replicated coordinator's flags (--etcd-endpoints given).
absl::Status ParseEtcd(const base::Args& args, CoordinatorFlags& flags) {
#ifndef CKPTD_HAVE_ETCD
  return absl::InvalidArgumentError(
      "--etcd-endpoints: this ckptd-coordinator was built without etcd (its build found no etcd .proto files: "
      "Debian's golang-etcd-server-dev); use --state-dir");
#else
  CoordinatorFlags::Etcd etcd;
  absl::StatusOr<std::vector<std::string>> endpoints = etcd::ParseEndpoints(*args.Get("etcd-endpoints"));
  if (!endpoints.ok()) return absl::InvalidArgumentError(absl::StrCat("--etcd-endpoints: ", endpoints.status().message()));
  etcd.endpoints = *endpoints;
  if (std::optional<std::string> p = args.Get("etcd-prefix")) {
    if (p->empty() || p->front() != '/' || p->back() == '/' || p->size() > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd-prefix \"", *p, "\" must start with / and not end with one, at most 256 bytes "
                       "(e.g. /ckptd/prod)"));
    }
    etcd.prefix = *p;
  }
  if (std::optional<std::string> v = args.Get("etcd-lease-ttl")) {
    absl::Duration d;
    if (!absl::ParseDuration(*v, &d) || d < absl::Seconds(2) || d > absl::Seconds(60) ||
        d != absl::Seconds(absl::ToInt64Seconds(d))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd-lease-ttl: \"", *v, "\" is not a whole number of seconds in 2s..60s"));
    }
    etcd.lease_ttl_seconds = absl::ToInt64Seconds(d);
  }
  const bool cert = args.Has("etcd-cert");
  const bool key = args.Has("etcd-key");
  if (cert != key) return absl::InvalidArgumentError("--etcd-cert and --etcd-key go together");
  if (cert && !args.Has("etcd-ca")) return absl::InvalidArgumentError("--etcd-cert needs --etcd-ca");
  etcd.tls = rpc::TlsFiles{args.Get("etcd-cert").value_or(""), args.Get("etcd-key").value_or(""),
                           args.Get("etcd-ca").value_or("")};
  if (args.Has("etcd-user") != args.Has("etcd-password-file")) {
    return absl::InvalidArgumentError("--etcd-user and --etcd-password-file go together");
  }
  etcd.user = args.Get("etcd-user").value_or("");
  etcd.password_file = args.Get("etcd-password-file").value_or("");
  etcd.import_state = args.Get("import-state").value_or("");
  if (args.Has("import-state") && etcd.import_state.empty()) {
    return absl::InvalidArgumentError("--import-state needs the state directory of the coordinator to import");
  }
  if (std::optional<std::string> a = args.Get("advertise")) {
    absl::StatusOr<std::pair<std::string, uint16_t>> hp = base::ParseHostPort(*a, base::PortUse::kConnect);
    if (!hp.ok() || hp->first.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--advertise: \"", *a, "\" is not host:port"));
    }
    etcd.advertise = *a;
  }
  // Every replica must accept the same credentials: generated tokens would
  // differ from one replica to the next.
  if (!flags.operator_token_file) {
    return absl::InvalidArgumentError(
        "--etcd-endpoints needs --operator-token-file: every replica must hold the same operator token");
  }
  if (!flags.agent_token_file && !flags.insecure_agents) {
    return absl::InvalidArgumentError(
        "--etcd-endpoints needs --agent-token-file (or --insecure-agents): every replica must accept the same "
        "agent token");
  }
  flags.etcd = std::move(etcd);
  return absl::OkStatus();
#endif
}

}  // namespace

absl::StatusOr<CoordinatorFlags> ParseCoordinatorFlags(const std::vector<std::string>& argv) {
  CKPTD_ASSIGN_OR_RETURN(const base::Args args, base::Args::Parse(argv, kValueFlags, kBoolFlags));
  CoordinatorFlags flags;
  if (args.Has("help")) {
    flags.help = true;
    return flags;
  }
  if (!args.positional().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", args.positional()[0], "\""));
  }
  if (!args.Get("listen") || !args.Get("storage-root")) {
    return absl::InvalidArgumentError("--listen, --storage-root and --state-dir (or --etcd-endpoints) are required");
  }
  if (args.Has("state-dir") == args.Has("etcd-endpoints")) {
    return absl::InvalidArgumentError(
        args.Has("state-dir") ? "--state-dir and --etcd-endpoints exclude each other: replicated coordinators "
                                "keep their state in etcd"
                              : "--state-dir (one coordinator) or --etcd-endpoints (replicated) is required");
  }
  if (!args.Has("etcd-endpoints")) {
    for (const char* f : {"etcd-prefix", "etcd-lease-ttl", "advertise", "etcd-ca", "etcd-cert", "etcd-key",
                          "etcd-user", "etcd-password-file", "import-state"}) {
      if (args.Has(f)) return absl::InvalidArgumentError(absl::StrCat("--", f, " needs --etcd-endpoints"));
    }
  }
  flags.listen = *args.Get("listen");
  // Both addresses are checked here, before anything is opened or written.
  if (absl::Status s = base::ParseHostPort(flags.listen, base::PortUse::kListen).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", s.message()));
  }
  flags.storage_root = *args.Get("storage-root");
  flags.state_dir = args.Get("state-dir").value_or("");
  flags.metrics_listen = args.Get("metrics-listen");
  if (flags.metrics_listen) {
    if (absl::Status s = base::ParseHostPort(*flags.metrics_listen, base::PortUse::kListen).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics-listen: ", s.message()));
    }
  }
  flags.operator_token_file = args.Get("operator-token-file");
  flags.agent_token_file = args.Get("agent-token-file");
  flags.insecure_agents = args.Has("insecure-agents");
  if (flags.insecure_agents && flags.agent_token_file) {
    return absl::InvalidArgumentError(
        "--insecure-agents and --agent-token-file exclude each other: an agent token is pointless when agents "
        "need no credential");
  }
  flags.audit_log = args.Get("audit-log");
  if (flags.audit_log && flags.audit_log->empty()) {
    return absl::InvalidArgumentError("--audit-log needs the file to append the audit trail to");
  }
  flags.options.retention_in_tick = false;  // the service removes old steps on a thread of its own
  CKPTD_RETURN_IF_ERROR(ParseOptions(args, flags.options));
  const int tls_flags = args.Has("tls-cert") + args.Has("tls-key") + args.Has("tls-ca");
  if (tls_flags != 0 && tls_flags != 3) {
    return absl::InvalidArgumentError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca");
  }
  if (tls_flags == 3) flags.tls = rpc::TlsFiles{*args.Get("tls-cert"), *args.Get("tls-key"), *args.Get("tls-ca")};
  if (args.Has("etcd-endpoints")) CKPTD_RETURN_IF_ERROR(ParseEtcd(args, flags));
  return flags;
}

}  // namespace ckptd::coordinator
