#include "agent/flags.h"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/agent_socket.h"
#include "base/cpu_set.h"
#include "base/flags.h"
#include "base/host_port.h"
#include "base/limits.h"
#include "base/status_macros.h"
#include "base/thread_priority.h"
#include "rpc/coordinator_targets.h"
#include "rpc/operator_token.h"
#include "rpc/tls.h"
#include "storage/layout.h"
#include "storage/shard_writer.h"

namespace ckptd::agent {

const char kAgentUsage[] =
    "usage: ckptd-agent --storage-root <dir|s3://bucket/prefix> [--socket <path>] [--staging-budget <bytes>] [--slots N]\n"
    "                   [--keep N] [--threads N] [--local-cache <dir> [--local-cache-keep N]]\n"
    "                   [--background-priority idle|low|normal] [--starvation-limit <d>] [--cpu-set <list>]\n"
    "                   [--compression auto|zstd|none]\n"
    "                   [--trainer-group <group>] [--memory-budget <bytes|N%>] [--memory-keep-for <d>]\n"
    "                   [--no-memory-tier] [--max-registrations N]\n"
    "                   [--coordinator <host:port> [--node-id <id>] [--agent-token-file <file>]\n"
    "                   [--tls-ca <pem> [--tls-cert <pem> --tls-key <pem>]]\n"
    "                   [--peer-listen <host:port> [--peer-data-port N] [--peer-address <host:port>]\n"
    "                   [--replicas N] [--failure-domain <label>] [--replication-gbps G]]]\n"
    "                   [--metrics-listen <host:port>]\n"
    "                   [--shutdown-grace <d>] [--inject-write-latency <duration>] [--allow-drills]\n"
    "                   [--help] [--version]\n"
    "\n"
    "Serves the trainer ranks of this node over a Unix socket (owner-only):\n"
    "owns their shared-memory staging, persists every published snapshot in\n"
    "the background (per rank, in step order), commits by itself the steps of\n"
    "a job whose ranks all run on this node (one spread over nodes needs\n"
    "--coordinator), and restores the newest committed step that reads back intact.\n"
    "It watches each trainer process to notice its death at once; a trainer in\n"
    "another PID namespace (a pod of its own) is watched by the pid the kernel\n"
    "recorded for its connection, so the agent must see the trainers' processes.\n"
    "\n"
    "  --storage-root <dir>      where checkpoints live (<dir>/<job>/step-<s>/...): a directory, or an\n"
    "                            object store, s3://bucket/prefix (credentials, region and endpoint from\n"
    "                            AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,\n"
    "                            AWS_ENDPOINT_URL or the profile AWS_PROFILE; see docs/operations.md)\n"
    "  --socket <path>           Unix socket to serve on (default: /run/ckptd/agent.sock for root, else\n"
    "                            $XDG_RUNTIME_DIR/ckptd/agent.sock). Its directory is made (0700; 0710\n"
    "                            with --trainer-group) when missing, and must not be writable by other\n"
    "                            users (unless sticky and the agent's own): anyone who could write\n"
    "                            there could take the socket's name first\n"
    "  --staging-budget <bytes>  staging memory per trainer, 1..1T (K/M/G/T suffixes); default:\n"
    "                            --slots slots\n"
    "  --slots N                 staging slots per trainer, 1..63 (default 2)\n"
    "  --keep N                  committed steps kept per job, 1..1000000 (default 2)\n"
    "  --threads N               persist/restore threads, 1..1024 (default: one per core, of\n"
    "                            --cpu-set when given)\n"
    "  --background-priority P   CPU priority of persists (compression and writes): idle (default:\n"
    "                            SCHED_IDLE, else nice 19: only the CPU time trainers leave), low (nice\n"
    "                            19) or normal. Restores always run at normal priority\n"
    "  --starvation-limit D      when persists at idle or low priority have got less than a tenth of\n"
    "                            the CPU they wanted for D (every CPU kept busy), normal-priority\n"
    "                            threads finish their work; 0s: never (default 2s, at most 1h)\n"
    "  --cpu-set <list>          run every thread of the agent on these CPUs, e.g. 0-3,8: CPU numbers\n"
    "                            0..8191 and ranges, each one this process may use (default: all of them)\n"
    "  --compression <mode>      auto (default): compress while that makes a shard durable 1.1 times\n"
    "                            (1.5 times at idle or low priority) as fast as raw writes would, then\n"
    "                            write the rest of it raw; zstd: always; none: never\n"
    "  --local-cache <dir>       node-local tier (e.g. an NVMe mount): each shard is written here\n"
    "                            first and its staging slot handed back, then copied to the storage\n"
    "                            root, where the step commits as usual; restores read the local copy\n"
    "                            when it is the committed shard, else the storage root. A local\n"
    "                            write that fails (full disk) falls back to the storage root\n"
    "  --local-cache-keep N      steps per job kept in the local tier, 1..1000000 (default 2), and\n"
    "                            the newest committed one while newer ones are not committed yet\n"
    "  --memory-budget <b|N%>    all staging memory of this agent together: the trainers' slots and the\n"
    "                            segments left by exited trainers for their successors, 1..1T\n"
    "                            (K/M/G/T suffixes) or 1..90% of this machine's memory (default 50%).\n"
    "                            A registration that does not fit, once the segments of exited\n"
    "                            trainers are released, fails at once\n"
    "  --memory-keep-for <d>     how long the staging of an exited trainer (with the step it kept in\n"
    "                            memory) waits for a restarted trainer of the same job, rank and\n"
    "                            buffers, 1s..168h (default 1h)\n"
    "  --no-memory-tier          free every staging slot after its persist and every segment when its\n"
    "                            trainer exits: restores always read the disk tiers\n"
    "  --max-registrations N     trainers registered with this agent at once, 1..65536 (default 1024);\n"
    "                            more are refused (RESOURCE_EXHAUSTED) until one exits. Each holds two\n"
    "                            threads (three while it exits), all counted against the agent user's\n"
    "                            RLIMIT_NPROC and its cgroup's pids.max\n"
    "  --trainer-group <group>   let this group's processes use the agent: the socket and the\n"
    "                            staging memory become 0660 with this group (name or number);\n"
    "                            the agent must be a member. Default: owner-only (0600)\n"
    "  --coordinator <host:port> report to a ckptd-coordinator (port 1..65535), or to replicated\n"
    "                            ones as host:port,host:port,... (the agent follows their leader):\n"
    "                            it commits every step (also of jobs on this node only), sets the\n"
    "                            schedule and plans restores\n"
    "  --node-id <id>            this node's name for the coordinator (default: the host name)\n"
    "  --agent-token-file <file> file holding the coordinator's agent token, sent with every call\n"
    "                            (its --agent-token-file, or the <state-dir>/agent-token it\n"
    "                            generated); not needed when the client certificate names this\n"
    "                            node, or the coordinator runs with --insecure-agents\n"
    "  --tls-ca <pem>            talk TLS to the coordinator, trusting this CA\n"
    "  --tls-cert/--tls-key <pem> this agent's client certificate and key (the coordinator\n"
    "                            requires one when it runs with mutual TLS; one whose common name\n"
    "                            or a subject alternative name is the node id is this node's\n"
    "                            credential)\n"
    "  --peer-listen <host:port> peer replication (needs --coordinator): serve partners on this TCP\n"
    "                            address (port 0: any free one). After each persist, the step is\n"
    "                            sent from memory to --replicas partner agents the coordinator picks\n"
    "                            in other failure domains, and this agent keeps their copies within\n"
    "                            --memory-budget (its own trainers first); a replacement node's agent\n"
    "                            pulls a lost rank's step from a partner instead of the disk. Calls\n"
    "                            carry the agent token, or with --tls-* both sides present certificates\n"
    "                            of the CA (then --tls-ca, --tls-cert and --tls-key are all needed)\n"
    "  --peer-data-port N        without TLS, the bytes of the copies go over a plain TCP connection\n"
    "                            to this port on --peer-listen's host, opened by a Peer call (which\n"
    "                            carries the credential) with a one-time nonce; 1..65535 (default\n"
    "                            --peer-listen's port + 1, or any free port when that is 0). With\n"
    "                            --tls-* the copies stay on the encrypted gRPC streams and this\n"
    "                            flag is refused\n"
    "  --peer-address <host:port> where partners reach this agent (default: the host --peer-listen\n"
    "                            names, or this host's name when it names every interface, and the\n"
    "                            port it bound)\n"
    "  --replicas N              partners each snapshot goes to, 0..16 (default 1; 0: this agent only\n"
    "                            holds partners' copies)\n"
    "  --failure-domain <label>  what fails together with this node, e.g. its rack (A-Z a-z 0-9 . _ -;\n"
    "                            default: the node alone): partners are picked outside it\n"
    "  --replication-gbps G      cap on the bandwidth replication uses, in Gbit/s, 0..10000 (default\n"
    "                            10; 0: no cap). Sending runs at the lowest CPU priority\n"
    "  --metrics-listen <host:port>  serve Prometheus metrics at http://<host:port>/metrics (port\n"
    "                            0..65535; 0: any free one), /healthz (liveness: \"ok\" while the\n"
    "                            process serves) and /readyz (readiness: 200 once the trainers' socket\n"
    "                            is served and, with --coordinator, the agent is registered with it;\n"
    "                            else 503 saying why). Read-only and unauthenticated: bind it to an\n"
    "                            address only monitoring reaches\n"
    "  --shutdown-grace <d>      on SIGTERM or SIGINT: the time left to persist the snapshots each\n"
    "                            trainer published and that are not yet durable, newest first, then\n"
    "                            older ones while time remains (not those older than a step this\n"
    "                            agent knows is committed; memory checkpoints are not written). A\n"
    "                            write still going after it stops, leaving nothing of the shard on\n"
    "                            disk (a copy from --local-cache too); the log says of each step\n"
    "                            whether it is durable and reported, or stopped. 5s after it, the\n"
    "                            agent exits whatever still runs. 0s..1h (default 25s); keep it a\n"
    "                            few seconds below the time the supervisor waits before SIGKILL (a\n"
    "                            pod's terminationGracePeriodSeconds, 30 s by default; as a sidecar,\n"
    "                            minus the time the trainer takes to stop, which comes first)\n"
    "  --inject-write-latency <d>  testing and drills only: every write (and read) of checkpoint\n"
    "                            data in the storage root sleeps <d> first (e.g. 200ms; at most 1h), so\n"
    "                            a persist stays in flight long enough to kill the agent in the middle\n"
    "                            of it\n"
    "  --allow-drills            testing and drills only: carry out the failure drills the coordinator\n"
    "                            sends (ckptctl drill): SIGKILL or SIGSTOP this node's trainers, kill\n"
    "                            this agent, cut it off from the coordinator, corrupt a byte of a\n"
    "                            committed shard or of a step kept in memory, make checkpoint storage\n"
    "                            fail (EIO, ENOSPC) or slow for a while. Without it, every drill is\n"
    "                            refused with an error report\n"
    "\n"
    "Stops on SIGINT or SIGTERM after persisting, within --shutdown-grace, the snapshots each\n"
    "trainer published, newest first.\n"
    "Exit codes: 1 the storage root or --local-cache could not be created, the agent could not\n"
    "start the threads it needs (RLIMIT_NPROC, pids.max), or it was still stopping 5s after\n"
    "--shutdown-grace ended (it then exits regardless), 2 bad command line\n"
    "(a value outside its range included), 3 the socket or --metrics-listen could not be served\n"
    "(a socket in a directory other users may write to included).\n";

namespace {

const std::set<std::string> kValueFlags = {
    // clang-format off
    "storage-root", "socket", "staging-budget", "slots", "keep", "threads", "coordinator", "node-id", "local-cache",
    "local-cache-keep", "trainer-group", "inject-write-latency", "tls-ca", "tls-cert", "tls-key", "agent-token-file",
    "memory-budget", "memory-keep-for", "peer-listen", "peer-address", "replicas", "failure-domain",
    "replication-gbps", "peer-data-port", "background-priority", "starvation-limit", "cpu-set", "compression",
    "shutdown-grace", "max-registrations", "metrics-listen",
    // clang-format on
};
const std::set<std::string> kBoolFlags = {"help", "allow-drills", "no-memory-tier"};

// The ranges of the numeric flags (documented in kAgentUsage).
constexpr uint32_t kMaxRegistrations = 65536;
constexpr uint64_t kMaxStagingBudget = uint64_t{1} << 40;  // 1 TiB of staging per trainer
// A staging segment's header block holds 63 slot headers
// (staging::StagingSegment::Create refuses more).
constexpr uint32_t kMaxSlots = 63;
constexpr int kMaxKeep = 1'000'000;
// --memory-budget as a share of the machine's memory, in percent.
constexpr uint64_t kDefaultMemoryPercent = 50;
constexpr uint64_t kMaxMemoryPercent = 90;
// (gid_t)-1 means "leave the group alone" to chown(2): never a group.
constexpr uint64_t kMaxGid = uint64_t{UINT32_MAX} - 1;

// --trainer-group: a group number, or the name of a group of this machine.
absl::StatusOr<uint32_t> TrainerGroup(const std::string& group) {
  if (!group.empty() && std::all_of(group.begin(), group.end(), [](char c) { return absl::ascii_isdigit(c); })) {
    uint64_t gid = 0;
    if (!absl::SimpleAtoi(group, &gid) || gid > kMaxGid) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trainer-group must be a group name or a number in 0..", kMaxGid, ", got \"", group, "\""));
    }
    return static_cast<uint32_t>(gid);
  }
  struct group entry;
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  int err;
  // Groups with many members (LDAP) need a larger buffer.
  while ((err = ::getgrnam_r(group.c_str(), &entry, buf.data(), buf.size(), &found)) == ERANGE &&
         buf.size() < (64u << 20)) {
    buf.resize(buf.size() * 4);
  }
  if (err != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--trainer-group: no group \"", group, "\" on this machine",
                                                   err != 0 ? absl::StrCat(" (", std::strerror(err), ")") : ""));
  }
  return static_cast<uint32_t>(found->gr_gid);
}

uint64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// --memory-budget: bytes, or a share of the machine's memory ("40%").
absl::StatusOr<uint64_t> MemoryBudget(const base::Args& args) {
  std::string value = args.Get("memory-budget").value_or(absl::StrCat(kDefaultMemoryPercent, "%"));
  if (!value.empty() && value.back() == '%') {
    uint64_t percent = 0;
    if (!absl::SimpleAtoi(value.substr(0, value.size() - 1), &percent) || percent < 1 ||
        percent > kMaxMemoryPercent) {
      return absl::InvalidArgumentError(absl::StrCat("--memory-budget must be 1..1T bytes or 1..", kMaxMemoryPercent,
                                                     "% of this machine's memory, got \"", value, "\""));
    }
    const uint64_t total = PhysicalMemoryBytes();
    if (total == 0) return absl::InternalError("--memory-budget: this machine's memory size cannot be read");
    return total / 100 * percent;
  }
  uint64_t bytes = 0;
  CKPTD_RETURN_IF_ERROR(args.ReadUint("memory-budget", 1, kMaxStagingBudget, &bytes, /*allow_suffix=*/true));
  return bytes;
}

// Neither --local-cache nor --storage-root may hold the other: the
// coordinator would take the local tier for a job, or the tier would copy
// files onto themselves. Checked before either directory is created (the
// tier's might be in the storage root).
absl::Status CheckApart(const std::string& storage_root, const std::string& local_cache) {
  std::error_code ec1, ec2;
  const std::filesystem::path root = std::filesystem::weakly_canonical(storage_root, ec1);
  const std::filesystem::path tier = std::filesystem::weakly_canonical(local_cache, ec2);
  if (ec1 || ec2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--local-cache ", local_cache, ": cannot resolve it or the storage root (", (ec1 ? ec1 : ec2).message(), ")"));
  }
  auto inside = [](const std::filesystem::path& a, const std::filesystem::path& b) {  // a at or below b
    auto [end_b, at_a] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
    return end_b == b.end();
  };
  if (inside(root, tier) || inside(tier, root)) {
    return absl::InvalidArgumentError(absl::StrCat("--local-cache ", local_cache, " and --storage-root ", storage_root,
                                                   " overlap: the node-local tier must be a directory of its own"));
  }
  return absl::OkStatus();
}

// The coordinator link's options from --coordinator, --node-id,
// --agent-token-file, --tls-* and --allow-drills.
absl::StatusOr<CoordinatorLinkOptions> LinkOptions(const base::Args& args) {
  CoordinatorLinkOptions link;
  link.address = *args.Get("coordinator");
  if (absl::Status s = rpc::ParseCoordinatorAddresses(link.address).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--coordinator: ", s.message()));
  }
  char host[256] = {};
  (void)::gethostname(host, sizeof(host) - 1);  // informational only
  link.host_name = host;
  link.node_id = args.Get("node-id").value_or(std::string(host));
  if (!storage::ValidateJobName(link.node_id).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node-id \"", link.node_id, "\" is not a valid name: use A-Z a-z 0-9 . _ -"));
  }
  if (args.Has("tls-ca") || args.Has("tls-cert") || args.Has("tls-key")) {
    rpc::TlsFiles files;
    files.ca = args.Get("tls-ca").value_or("");
    files.cert = args.Get("tls-cert").value_or("");
    files.key = args.Get("tls-key").value_or("");
    CKPTD_ASSIGN_OR_RETURN(link.credentials, rpc::ChannelCredentialsFromFiles(files));
  }
  if (std::optional<std::string> token_file = args.Get("agent-token-file")) {
    absl::StatusOr<std::string> token = rpc::ReadAgentTokenFile(*token_file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--agent-token-file: ", token.status().message()));
    }
    link.agent_token = *std::move(token);
  }
  link.drills_allowed = args.Has("allow-drills");
  return link;
}

constexpr uint32_t kMaxReplicas = 16;
constexpr uint64_t kMaxPort = 65535;
constexpr double kMaxReplicationGbps = 10000;
constexpr double kDefaultReplicationGbps = 10;

// --peer-listen and what goes with it (with --coordinator).
absl::StatusOr<PeerFlags> PeerOptions(const base::Args& args) {
  PeerFlags peer;
  peer.listen = *args.Get("peer-listen");
  absl::StatusOr<std::pair<std::string, uint16_t>> listen = base::ParseHostPort(peer.listen, base::PortUse::kListen);
  if (!listen.ok()) return absl::InvalidArgumentError(absl::StrCat("--peer-listen: ", listen.status().message()));
  peer.listen_host = listen->first;
  const bool tls = args.Has("tls-ca") || args.Has("tls-cert") || args.Has("tls-key");
  if (tls && args.Has("peer-data-port")) {
    return absl::InvalidArgumentError(
        "--peer-data-port has no use with --tls-*: the copies stay on the encrypted gRPC streams");
  }
  if (args.Has("peer-data-port")) {
    CKPTD_RETURN_IF_ERROR(args.ReadUint("peer-data-port", 1, kMaxPort, &peer.data_port));
    if (peer.data_port == listen->second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer-data-port ", peer.data_port, " is --peer-listen's port: the data lane needs its own"));
    }
  } else if (!tls && listen->second == kMaxPort) {
    return absl::InvalidArgumentError(
        "--peer-listen's port is 65535, so the data lane has no default port: give --peer-data-port");
  } else if (!tls && listen->second != 0) {
    peer.data_port = static_cast<uint16_t>(listen->second + 1);
  }
  if (std::optional<std::string> advertise = args.Get("peer-address")) {
    if (absl::Status s = base::ParseHostPort(*advertise, base::PortUse::kConnect).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--peer-address: ", s.message()));
    }
    peer.advertise = *advertise;
  }
  CKPTD_RETURN_IF_ERROR(args.ReadUint("replicas", 0, kMaxReplicas, &peer.replicas));
  if (std::optional<std::string> domain = args.Get("failure-domain")) {
    if (!storage::ValidateJobName(*domain).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--failure-domain \"", *domain, "\" is not a valid label: 1..128 of A-Z a-z 0-9 . _ -"));
    }
    peer.failure_domain = *domain;
  }
  double gbps = kDefaultReplicationGbps;
  if (std::optional<std::string> g = args.Get("replication-gbps")) {
    if (!absl::SimpleAtod(*g, &gbps) || !(gbps >= 0 && gbps <= kMaxReplicationGbps)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--replication-gbps must be a number in 0..", kMaxReplicationGbps, ", got \"", *g, "\""));
    }
  }
  peer.max_bytes_per_second = gbps * 1e9 / 8;
  if (tls) {
    if (!args.Has("tls-ca") || !args.Has("tls-cert") || !args.Has("tls-key")) {
      return absl::InvalidArgumentError(
          "--peer-listen with TLS needs --tls-ca, --tls-cert and --tls-key: partners check each other's certificate");
    }
    rpc::TlsFiles files;
    files.ca = *args.Get("tls-ca");
    files.cert = *args.Get("tls-cert");
    files.key = *args.Get("tls-key");
    CKPTD_ASSIGN_OR_RETURN(peer.server_credentials, rpc::ServerCredentialsFromFiles(files));
  }
  return peer;
}

// --background-priority, --cpu-set (checked against the CPUs this process
// may use) and --compression.
absl::Status CpuFlags(const base::Args& args, AgentFlags* flags) {
  AgentOptions& options = flags->options;
  absl::StatusOr<base::ThreadPriority> priority =
      base::ParseThreadPriority(args.Get("background-priority").value_or("idle"));
  if (!priority.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--background-priority ", priority.status().message()));
  }
  options.background_priority = *priority;
  CKPTD_ASSIGN_OR_RETURN(const std::optional<absl::Duration> starvation,
                         args.GetDurationInRange("starvation-limit", absl::ZeroDuration(), absl::Hours(1)));
  if (starvation) options.starvation_limit = *starvation;
  if (std::optional<std::string> list = args.Get("cpu-set")) {
    absl::StatusOr<std::vector<int>> cpus = base::ParseCpuList(*list);
    if (!cpus.ok()) return absl::InvalidArgumentError(absl::StrCat("--cpu-set: ", cpus.status().message()));
    absl::StatusOr<std::vector<int>> allowed = base::AllowedCpus();
    if (!allowed.ok()) return absl::InvalidArgumentError(absl::StrCat("--cpu-set: ", allowed.status().message()));
    if (absl::Status s = base::CheckCpusAllowed(*cpus, *allowed); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cpu-set: ", s.message()));
    }
    flags->cpu_set = *std::move(cpus);
    // One thread per CPU of the set, not per CPU of the machine.
    if (!args.Has("threads")) options.io_threads = static_cast<int>(flags->cpu_set.size());
  }
  const std::string compression = args.Get("compression").value_or("auto");
  if (compression != "auto" && compression != "zstd" && compression != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("--compression must be auto, zstd or none, got \"", compression, "\""));
  }
  options.write.encode.compress = compression != "none";
  options.write.adaptive.enabled = compression == "auto";
  // The trainers come first: compression's CPU must buy more than a little
  // durable time.
  if (options.background_priority != base::ThreadPriority::kNormal) {
    options.write.adaptive.margin = storage::kCompressionMarginBesideTraining;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentFlags> ParseAgentFlags(const std::vector<std::string>& argv) {
  CKPTD_ASSIGN_OR_RETURN(const base::Args args, base::Args::Parse(argv, kValueFlags, kBoolFlags));
  AgentFlags flags;
  if (args.Has("help")) {
    flags.help = true;
    return flags;
  }
  if (!args.Get("storage-root")) return absl::InvalidArgumentError("--storage-root is required");
  if (args.Get("socket")) {
    flags.socket = *args.Get("socket");
  } else {
    CKPTD_ASSIGN_OR_RETURN(flags.socket, base::DefaultAgentSocket());
  }
  AgentOptions& options = flags.options;
  options.storage_root = *args.Get("storage-root");
  // Each number is parsed wide and checked against what its consumer
  // handles before it is narrowed.
  CKPTD_RETURN_IF_ERROR(args.ReadUint("staging-budget", 1, kMaxStagingBudget, &options.staging_budget_bytes,
                                      /*allow_suffix=*/true));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("slots", 1, kMaxSlots, &options.slots));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("keep", 1, kMaxKeep, &options.keep_last));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("threads", 1, base::kMaxThreads, &options.io_threads));
  CKPTD_RETURN_IF_ERROR(CpuFlags(args, &flags));
  CKPTD_RETURN_IF_ERROR(args.ReadUint("local-cache-keep", 1, kMaxKeep, &options.local_cache_keep));
  if (args.Get("local-cache-keep") && !args.Get("local-cache")) {
    return absl::InvalidArgumentError("--local-cache-keep needs --local-cache");
  }
  CKPTD_ASSIGN_OR_RETURN(options.memory_budget_bytes, MemoryBudget(args));
  CKPTD_ASSIGN_OR_RETURN(const std::optional<absl::Duration> keep_for,
                         args.GetDurationInRange("memory-keep-for", absl::Seconds(1), absl::Hours(24 * 7)));
  if (keep_for) options.park_for = *keep_for;
  options.keep_in_memory = !args.Has("no-memory-tier");
  CKPTD_RETURN_IF_ERROR(args.ReadUint("max-registrations", 1, kMaxRegistrations, &options.max_registrations));
  if (std::optional<std::string> group = args.Get("trainer-group")) {
    CKPTD_ASSIGN_OR_RETURN(options.trainer_group, TrainerGroup(*group));
  }
  if (std::optional<std::string> local = args.Get("local-cache")) {
    // An object store root cannot overlap a local directory.
    if (!absl::StartsWith(options.storage_root, "s3://")) CKPTD_RETURN_IF_ERROR(CheckApart(options.storage_root, *local));
    options.local_cache = *local;
  }
  flags.allow_drills = args.Has("allow-drills");
  CKPTD_ASSIGN_OR_RETURN(const std::optional<absl::Duration> grace,
                         args.GetDurationInRange("shutdown-grace", absl::ZeroDuration(), absl::Hours(1)));
  if (grace) flags.shutdown_grace = *grace;
  if (args.Get("coordinator")) {
    CKPTD_ASSIGN_OR_RETURN(flags.link, LinkOptions(args));
    options.node_id = flags.link->node_id;
  } else if (args.Get("node-id") || args.Get("tls-ca") || args.Get("tls-cert") || args.Get("tls-key") ||
             args.Get("agent-token-file")) {
    return absl::InvalidArgumentError("--node-id, --agent-token-file and --tls-* need --coordinator");
  }
  if (args.Get("peer-listen")) {
    if (!flags.link) return absl::InvalidArgumentError("--peer-listen needs --coordinator (it picks the partners)");
    CKPTD_ASSIGN_OR_RETURN(flags.peer, PeerOptions(args));
  } else {
    for (const char* f : {"peer-address", "replicas", "failure-domain", "replication-gbps", "peer-data-port"}) {
      if (args.Get(f)) return absl::InvalidArgumentError(absl::StrCat("--", f, " needs --peer-listen"));
    }
  }
  CKPTD_ASSIGN_OR_RETURN(const std::optional<absl::Duration> latency,
                         args.GetDurationInRange("inject-write-latency", absl::Nanoseconds(1), absl::Hours(1)));
  flags.inject_write_latency = latency.value_or(absl::ZeroDuration());
  flags.metrics_listen = args.Get("metrics-listen");
  if (flags.metrics_listen) {
    if (absl::Status s = base::ParseHostPort(*flags.metrics_listen, base::PortUse::kListen).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics-listen: ", s.message()));
    }
  }
  return flags;
}

}  // namespace ckptd::agent
