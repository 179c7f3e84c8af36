#include "agent/flags.h"

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/agent_socket.h"
#include "base/cpu_set.h"
#include "base/testing/matchers.h"
#include "base/thread_priority.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::StartsWith;

// The required flags, then `more`.
std::vector<std::string> With(std::vector<std::string> more) {
  std::vector<std::string> args = {"--storage-root", "/srv/ckpt", "--socket", "/run/ckptd/agent.sock"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The message of a command line that must fail with kInvalidArgument.
MATCHER_P(FailsNaming, text, "") {
  return ::testing::ExplainMatchResult(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(text)), arg.status(),
                                       result_listener);
}

std::string HostName() {
  char host[256] = {};
  (void)::gethostname(host, sizeof(host) - 1);
  return host;
}

TEST(AgentFlagsTest, MemoryTierFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags,
                             ParseAgentFlags(With({"--memory-budget", "10G", "--memory-keep-for", "15m"})));
  EXPECT_EQ(flags.options.memory_budget_bytes, uint64_t{10} << 30);
  EXPECT_EQ(flags.options.park_for, absl::Minutes(15));
  CKPTD_ASSERT_OK_AND_ASSIGN(flags, ParseAgentFlags(With({"--memory-budget", "10%", "--no-memory-tier"})));
  const uint64_t ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(flags.options.memory_budget_bytes, ram / 100 * 10);
  EXPECT_FALSE(flags.options.keep_in_memory);
  for (const char* bad : {"0", "0%", "91%", "-5%", "%", "2T", "ten", "5.5%"}) {
    EXPECT_THAT(ParseAgentFlags(With({"--memory-budget", bad})), FailsNaming("--memory-budget")) << bad;
  }
  for (const char* bad : {"0s", "8d", "soon"}) {
    EXPECT_THAT(ParseAgentFlags(With({"--memory-keep-for", bad})), FailsNaming("--memory-keep-for")) << bad;
  }
}

TEST(AgentFlagsTest, MaxRegistrations) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags(With({})));
  EXPECT_EQ(flags.options.max_registrations, 1024u);
  CKPTD_ASSERT_OK_AND_ASSIGN(flags, ParseAgentFlags(With({"--max-registrations", "16"})));
  EXPECT_EQ(flags.options.max_registrations, 16u);
  for (const char* bad : {"0", "65537", "many", "-1"}) {
    EXPECT_THAT(ParseAgentFlags(With({"--max-registrations", bad})), FailsNaming("--max-registrations")) << bad;
  }
}

TEST(AgentFlagsTest, DefaultsWithOnlyTheRequiredFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags(With({})));
  EXPECT_FALSE(flags.help);
  EXPECT_EQ(flags.socket, "/run/ckptd/agent.sock");
  EXPECT_EQ(flags.options.storage_root, "/srv/ckpt");
  EXPECT_EQ(flags.options.staging_budget_bytes, 0u);
  EXPECT_EQ(flags.options.slots, 2u);
  EXPECT_EQ(flags.options.keep_last, 2);
  EXPECT_EQ(flags.options.io_threads, 0);
  EXPECT_EQ(flags.options.trainer_group, std::nullopt);
  EXPECT_EQ(flags.options.local_cache, "");
  EXPECT_EQ(flags.options.local_cache_keep, 2);
  EXPECT_EQ(flags.options.node_id, "");
  EXPECT_EQ(flags.options.coordinator, nullptr);
  EXPECT_EQ(flags.options.local_fs, nullptr);
  EXPECT_FALSE(flags.link.has_value());
  EXPECT_EQ(flags.inject_write_latency, absl::ZeroDuration());
  EXPECT_FALSE(flags.allow_drills);
  EXPECT_EQ(flags.metrics_listen, std::nullopt);  // no metrics endpoint
  // Half the machine's memory for staging, segments of exited trainers kept an hour.
  const uint64_t ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(flags.options.memory_budget_bytes, ram / 100 * 50);
  EXPECT_EQ(flags.options.park_for, absl::Hours(1));
  EXPECT_TRUE(flags.options.keep_in_memory);
  // Persists at idle priority on every CPU, compression while it pays.
  EXPECT_EQ(flags.options.background_priority, base::ThreadPriority::kIdle);
  EXPECT_EQ(flags.options.starvation_limit, absl::Seconds(2));
  EXPECT_EQ(flags.options.write.adaptive.margin, storage::kCompressionMarginBesideTraining);
  EXPECT_TRUE(flags.cpu_set.empty());
  EXPECT_TRUE(flags.options.write.encode.compress);
  EXPECT_TRUE(flags.options.write.adaptive.enabled);
}

TEST(AgentFlagsTest, BackgroundPriorityAndCompression) {
  for (auto [name, priority] : {std::pair{"idle", base::ThreadPriority::kIdle}, {"low", base::ThreadPriority::kLow},
                                {"normal", base::ThreadPriority::kNormal}}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags(With({"--background-priority", name})));
    EXPECT_EQ(flags.options.background_priority, priority) << name;
  }
  for (const char* bad : {"lowest", "", "IDLE", "19"}) {
    EXPECT_THAT(ParseAgentFlags(With({"--background-priority", bad})),
                FailsNaming(absl::StrCat("--background-priority must be idle, low or normal, got \"", bad, "\"")));
  }
  // Compression's bar is higher beside trainers that come first.
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags normal, ParseAgentFlags(With({"--background-priority", "normal"})));
  EXPECT_EQ(normal.options.write.adaptive.margin, storage::AdaptiveCompression().margin);
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags low, ParseAgentFlags(With({"--background-priority", "low"})));
  EXPECT_EQ(low.options.write.adaptive.margin, storage::kCompressionMarginBesideTraining);
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags bounded, ParseAgentFlags(With({"--starvation-limit", "500ms"})));
  EXPECT_EQ(bounded.options.starvation_limit, absl::Milliseconds(500));
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags unbounded, ParseAgentFlags(With({"--starvation-limit", "0s"})));
  EXPECT_EQ(unbounded.options.starvation_limit, absl::ZeroDuration());
  for (const char* bad : {"-1s", "2h", "soon", "", "inf"}) {
    EXPECT_THAT(ParseAgentFlags(With({"--starvation-limit", bad})), FailsNaming("--starvation-limit")) << bad;
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags zstd, ParseAgentFlags(With({"--compression", "zstd"})));
  EXPECT_TRUE(zstd.options.write.encode.compress);
  EXPECT_FALSE(zstd.options.write.adaptive.enabled);
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags none, ParseAgentFlags(With({"--compression", "none"})));
  EXPECT_FALSE(none.options.write.encode.compress);
  EXPECT_FALSE(none.options.write.adaptive.enabled);
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags automatic, ParseAgentFlags(With({"--compression", "auto"})));
  EXPECT_TRUE(automatic.options.write.encode.compress);
  EXPECT_TRUE(automatic.options.write.adaptive.enabled);
  EXPECT_THAT(ParseAgentFlags(With({"--compression", "lz4"})),
              FailsNaming("--compression must be auto, zstd or none, got \"lz4\""));
}

TEST(AgentFlagsTest, CpuSetIsCheckedAgainstTheCpusThisProcessMayUse) {
  CKPTD_ASSERT_OK_AND_ASSIGN(const std::vector<int> allowed, base::AllowedCpus());
  ASSERT_FALSE(allowed.empty());
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags all, ParseAgentFlags(With({"--cpu-set", base::FormatCpuList(allowed)})));
  EXPECT_EQ(all.cpu_set, allowed);
  // The pool has a thread per CPU of the set, unless --threads says otherwise.
  EXPECT_EQ(all.options.io_threads, static_cast<int>(allowed.size()));
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags one, ParseAgentFlags(With({"--cpu-set", absl::StrCat(allowed.back())})));
  EXPECT_EQ(one.cpu_set, std::vector<int>{allowed.back()});
  EXPECT_EQ(one.options.io_threads, 1);
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags more,
                             ParseAgentFlags(With({"--cpu-set", absl::StrCat(allowed.back()), "--threads", "6"})));
  EXPECT_EQ(more.options.io_threads, 6);
  ASSERT_NE(allowed.back(), base::kMaxCpu);
  EXPECT_THAT(ParseAgentFlags(With({"--cpu-set", absl::StrCat(allowed.front(), ",", base::kMaxCpu)})),
              FailsNaming(absl::StrCat("--cpu-set: CPU 8191 is not one this process may use (it may use ",
                                       base::FormatCpuList(allowed), ")")));
  EXPECT_THAT(ParseAgentFlags(With({"--cpu-set", "3-1"})), FailsNaming("--cpu-set: the range \"3-1\" goes down"));
  EXPECT_THAT(ParseAgentFlags(With({"--cpu-set", "0,x"})), FailsNaming("--cpu-set: \"x\" is not a CPU number"));
  EXPECT_THAT(ParseAgentFlags(With({"--cpu-set", ""})), FailsNaming("--cpu-set: an empty CPU list"));
}

TEST(AgentFlagsTest, EachFlagReachesItsOption) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      AgentFlags flags,
      ParseAgentFlags({"--storage-root=/data/root", "--socket", "/tmp/a.sock", "--staging-budget", "8G", "--slots", "3",
                       "--keep", "5", "--threads", "7", "--local-cache", "/nvme/tier", "--local-cache-keep", "4",
                       "--trainer-group", "1234", "--inject-write-latency", "200ms"}));
  EXPECT_EQ(flags.socket, "/tmp/a.sock");
  EXPECT_EQ(flags.options.storage_root, "/data/root");
  EXPECT_EQ(flags.options.staging_budget_bytes, uint64_t{8} << 30);
  EXPECT_EQ(flags.options.slots, 3u);
  EXPECT_EQ(flags.options.keep_last, 5);
  EXPECT_EQ(flags.options.io_threads, 7);
  EXPECT_EQ(flags.options.local_cache, "/nvme/tier");
  EXPECT_EQ(flags.options.local_cache_keep, 4);
  EXPECT_THAT(flags.options.trainer_group, Optional(1234u));
  EXPECT_EQ(flags.inject_write_latency, absl::Milliseconds(200));
  EXPECT_FALSE(flags.link.has_value());
}

TEST(AgentFlagsTest, StagingBudgetTakesPlainBytesAndSuffixes) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags plain, ParseAgentFlags(With({"--staging-budget", "12345"})));
  EXPECT_EQ(plain.options.staging_budget_bytes, 12345u);
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags kib, ParseAgentFlags(With({"--staging-budget", "3k"})));
  EXPECT_EQ(kib.options.staging_budget_bytes, 3u << 10);
}

TEST(AgentFlagsTest, LocalCacheKeepAboveItsRangeIsRefusedNotCapped) {
  EXPECT_THAT(ParseAgentFlags(With({"--local-cache", "/nvme/t", "--local-cache-keep", "99999999999"})),
              FailsNaming("--local-cache-keep must be an integer in 1..1000000, got \"99999999999\""));
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags,
                             ParseAgentFlags(With({"--local-cache", "/nvme/t", "--local-cache-keep", "1000000"})));
  EXPECT_EQ(flags.options.local_cache_keep, 1000000);
}

TEST(AgentFlagsTest, TrainerGroupByName) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags(With({"--trainer-group", "root"})));
  EXPECT_THAT(flags.options.trainer_group, Optional(0u));
  EXPECT_THAT(ParseAgentFlags(With({"--trainer-group", "no-such-group-ckptd-test"})),
              FailsNaming("--trainer-group: no group \"no-such-group-ckptd-test\" on this machine"));
}

TEST(AgentFlagsTest, CoordinatorMakesTheLinkOptions) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags,
                             ParseAgentFlags(With({"--coordinator", "coord:7000", "--node-id", "node-7"})));
  ASSERT_TRUE(flags.link.has_value());
  EXPECT_EQ(flags.link->address, "coord:7000");
  EXPECT_EQ(flags.link->node_id, "node-7");
  EXPECT_EQ(flags.options.node_id, "node-7");
  EXPECT_EQ(flags.link->host_name, HostName());
  EXPECT_EQ(flags.link->credentials, nullptr);
  EXPECT_FALSE(flags.link->drills_allowed);
  EXPECT_FALSE(flags.allow_drills);
}

TEST(AgentFlagsTest, NodeIdDefaultsToTheHostName) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags(With({"--coordinator", "coord:7000"})));
  ASSERT_TRUE(flags.link.has_value());
  EXPECT_EQ(flags.link->node_id, HostName());
  EXPECT_EQ(flags.options.node_id, HostName());
}

TEST(AgentFlagsTest, AllowDrillsReachesTheLinkAndTheFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags alone, ParseAgentFlags(With({"--allow-drills"})));
  EXPECT_TRUE(alone.allow_drills);
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags linked,
                             ParseAgentFlags(With({"--coordinator", "coord:7000", "--allow-drills"})));
  EXPECT_TRUE(linked.allow_drills);
  ASSERT_TRUE(linked.link.has_value());
  EXPECT_TRUE(linked.link->drills_allowed);
}

TEST(AgentFlagsTest, TlsFilesAreReadIntoCredentials) {
  ckptd::testing::TempDir dir("ckptd-agent-flags-");
  const std::string pem = dir.Sub("ca.pem");
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags(With({"--coordinator", "coord:7000", "--tls-ca", pem})));
  ASSERT_TRUE(flags.link.has_value());
  EXPECT_NE(flags.link->credentials, nullptr);

  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "coord:7000", "--tls-ca", dir.Sub("missing.pem")})).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--tls-ca")));
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "coord:7000", "--tls-ca", pem, "--tls-cert", pem})),
              FailsNaming("needs both --tls-cert and --tls-key"));
}

TEST(AgentFlagsTest, BadNumbersNameTheFlag) {
  EXPECT_THAT(ParseAgentFlags(With({"--slots", "two"})),
              FailsNaming("--slots must be an integer in 1..63, got \"two\""));
  EXPECT_THAT(ParseAgentFlags(With({"--staging-budget", "-1G"})),
              FailsNaming("--staging-budget must be a size in 1..1T (bytes, or with K, M, G or T), got \"-1G\""));
  EXPECT_THAT(ParseAgentFlags(With({"--keep", "-2"})),
              FailsNaming("--keep must be an integer in 1..1000000, got \"-2\""));
  EXPECT_THAT(ParseAgentFlags(With({"--threads", "4x"})),
              FailsNaming("--threads must be an integer in 1..1024, got \"4x\""));
  EXPECT_THAT(ParseAgentFlags(With({"--local-cache", "/nvme/t", "--local-cache-keep", "1.5"})),
              FailsNaming("--local-cache-keep must be an integer in 1..1000000, got \"1.5\""));
  // Only the staging budget takes a suffix.
  EXPECT_THAT(ParseAgentFlags(With({"--slots", "2K"})), FailsNaming("--slots must be an integer in 1..63, got \"2K\""));
}

TEST(AgentFlagsTest, OutOfRangeValuesAreRefused) {
  EXPECT_THAT(ParseAgentFlags(With({"--slots", "0"})), FailsNaming("--slots must be an integer in 1..63, got \"0\""));
  EXPECT_THAT(ParseAgentFlags(With({"--local-cache", "/nvme/t", "--local-cache-keep", "0"})),
              FailsNaming("--local-cache-keep must be an integer in 1..1000000, got \"0\""));
  EXPECT_THAT(
      ParseAgentFlags(With({"--inject-write-latency", "soon"})),
      FailsNaming("--inject-write-latency must be a duration in 1ns..1h (like 500ms, 30s, 1h30m), got \"soon\""));
  EXPECT_THAT(ParseAgentFlags(With({"--inject-write-latency", "0s"})), FailsNaming("--inject-write-latency must be"));
  EXPECT_THAT(ParseAgentFlags(With({"--inject-write-latency", "inf"})), FailsNaming("--inject-write-latency must be"));
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "coord:7000", "--node-id", "bad/name"})),
              FailsNaming("--node-id \"bad/name\" is not a valid name"));
}

TEST(AgentFlagsTest, FlagsThatNeedAnother) {
  EXPECT_THAT(ParseAgentFlags({"--socket", "/run/ckptd/s"}), FailsNaming("--storage-root is required"));
  EXPECT_THAT(ParseAgentFlags(With({"--local-cache-keep", "3"})),
              FailsNaming("--local-cache-keep needs --local-cache"));
  for (const char* flag : {"--node-id", "--tls-ca", "--agent-token-file"}) {
    EXPECT_THAT(ParseAgentFlags(With({flag, "/n"})),
                FailsNaming("--node-id, --agent-token-file and --tls-* need --coordinator"))
        << flag;
  }
}

TEST(AgentFlagsTest, AgentTokenFileIsReadIntoTheLink) {
  ckptd::testing::TempDir dir("ckptd-agent-flags-");
  const std::string path = dir.Sub("agent-token");
  std::ofstream(path) << "  s3cret-agent-token\n";
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags,
                             ParseAgentFlags(With({"--coordinator", "coord:7000", "--agent-token-file", path})));
  ASSERT_TRUE(flags.link.has_value());
  EXPECT_EQ(flags.link->agent_token, "s3cret-agent-token");
  // Without the flag the link carries no token.
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags none, ParseAgentFlags(With({"--coordinator", "coord:7000"})));
  EXPECT_EQ(none.link->agent_token, "");
  // A file that cannot be read, or holds no valid token, is a usage error naming the flag and the file.
  const std::string missing = dir.Sub("missing");
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "coord:7000", "--agent-token-file", missing})),
              FailsNaming(absl::StrCat("--agent-token-file: open agent token file ", missing)));
  const std::string empty = dir.Sub("empty");
  std::ofstream(empty) << "\n";
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "coord:7000", "--agent-token-file", empty})),
              FailsNaming(absl::StrCat("--agent-token-file: agent token file ", empty, " is empty")));
  const std::string spaced = dir.Sub("spaced");
  std::ofstream(spaced) << "two words\n";
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "coord:7000", "--agent-token-file", spaced})),
              FailsNaming("--agent-token-file: agent token in"));
}

TEST(AgentFlagsTest, LocalCacheMustNotOverlapTheStorageRoot) {
  ckptd::testing::TempDir dir("ckptd-agent-flags-");
  const std::string root = dir.Sub("root");
  for (const std::string& local : {root, root + "/tier", dir.path(), root + "/../root/x"}) {
    EXPECT_THAT(ParseAgentFlags({"--storage-root", root, "--socket", "/tmp/s", "--local-cache", local}),
                FailsNaming("overlap: the node-local tier must be a directory of its own"))
        << local;
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags apart, ParseAgentFlags({"--storage-root", root, "--socket", "/tmp/s",
                                                                "--local-cache", dir.Sub("tier")}));
  EXPECT_EQ(apart.options.local_cache, dir.Sub("tier"));
}

TEST(AgentFlagsTest, CommandLineErrors) {
  EXPECT_THAT(ParseAgentFlags(With({"--frobnicate"})), FailsNaming("unknown flag --frobnicate"));
  EXPECT_THAT(ParseAgentFlags(With({"--slots"})), FailsNaming("--slots needs a value"));
  EXPECT_THAT(ParseAgentFlags(With({"--allow-drills=yes"})), FailsNaming("--allow-drills takes no value"));
}

TEST(AgentFlagsTest, HelpNeedsNothingElse) {
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags({"--help"}));
  EXPECT_TRUE(flags.help);
  // As before the flags moved out of main(): --help wins over bad values, not
  // over a command line that does not parse.
  CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags with_bad_value, ParseAgentFlags({"--slots", "zero", "--help"}));
  EXPECT_TRUE(with_bad_value.help);
  EXPECT_THAT(ParseAgentFlags({"--help", "--frobnicate"}), FailsNaming("unknown flag --frobnicate"));
}

TEST(AgentFlagsTest, PeerReplicationFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      AgentFlags flags,
      ParseAgentFlags(With({"--coordinator", "coord:7000", "--peer-listen", "0.0.0.0:7100", "--peer-address",
                            "node7.example.org:7100", "--replicas", "2", "--failure-domain", "rack-3",
                            "--replication-gbps", "2.5"})));
  ASSERT_TRUE(flags.peer.has_value());
  EXPECT_EQ(flags.peer->listen, "0.0.0.0:7100");
  EXPECT_EQ(flags.peer->advertise, "node7.example.org:7100");
  EXPECT_EQ(flags.peer->replicas, 2u);
  EXPECT_EQ(flags.peer->failure_domain, "rack-3");
  EXPECT_DOUBLE_EQ(flags.peer->max_bytes_per_second, 2.5e9 / 8);
  EXPECT_EQ(flags.peer->server_credentials, nullptr);
  EXPECT_EQ(flags.peer->listen_host, "0.0.0.0");
  EXPECT_EQ(flags.peer->data_port, 7101) << "the data lane: --peer-listen's port + 1 by default";
  CKPTD_ASSERT_OK_AND_ASSIGN(flags, ParseAgentFlags(With({"--coordinator", "c:1", "--peer-listen", "[::1]:7100",
                                                          "--peer-data-port", "9000"})));
  EXPECT_EQ(flags.peer->listen_host, "::1");
  EXPECT_EQ(flags.peer->data_port, 9000);
  // Defaults: one partner, 10 Gbit/s, the node its own domain.
  CKPTD_ASSERT_OK_AND_ASSIGN(flags, ParseAgentFlags(With({"--coordinator", "c:1", "--peer-listen", ":0"})));
  ASSERT_TRUE(flags.peer.has_value());
  EXPECT_EQ(flags.peer->replicas, 1u);
  EXPECT_DOUBLE_EQ(flags.peer->max_bytes_per_second, 10e9 / 8);
  EXPECT_EQ(flags.peer->failure_domain, "");
  EXPECT_EQ(flags.peer->data_port, 0) << "any free port, as for --peer-listen";
  EXPECT_EQ(flags.peer->listen_host, "");
  CKPTD_ASSERT_OK_AND_ASSIGN(flags, ParseAgentFlags(With({"--coordinator", "c:1", "--peer-listen", ":0",
                                                          "--replication-gbps", "0", "--replicas", "0"})));
  EXPECT_EQ(flags.peer->max_bytes_per_second, 0);
  EXPECT_EQ(flags.peer->replicas, 0u);
  // Without --peer-listen nothing of it.
  CKPTD_ASSERT_OK_AND_ASSIGN(flags, ParseAgentFlags(With({"--coordinator", "c:1"})));
  EXPECT_FALSE(flags.peer.has_value());

  EXPECT_THAT(ParseAgentFlags(With({"--peer-listen", ":7100"})), FailsNaming("--peer-listen needs --coordinator"));
  for (const char* f :
       {"--peer-address", "--replicas", "--failure-domain", "--replication-gbps", "--peer-data-port"}) {
    EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "c:1", f, "1"})), FailsNaming("needs --peer-listen")) << f;
  }
  const std::vector<std::string> peer = {"--coordinator", "c:1", "--peer-listen", ":0"};
  auto with_peer = [&](std::vector<std::string> more) {
    std::vector<std::string> args = peer;
    args.insert(args.end(), more.begin(), more.end());
    return ParseAgentFlags(With(args));
  };
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "c:1", "--peer-listen", "host:70000"})),
              FailsNaming("--peer-listen"));
  EXPECT_THAT(with_peer({"--peer-address", "host:0"}), FailsNaming("--peer-address"));
  EXPECT_THAT(with_peer({"--replicas", "17"}), FailsNaming("--replicas"));
  for (const char* bad : {"0", "65536", "-1", "x", ""}) {
    EXPECT_THAT(with_peer({"--peer-data-port", bad}), FailsNaming("--peer-data-port")) << bad;
  }
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "c:1", "--peer-listen", ":7100", "--peer-data-port", "7100"})),
              FailsNaming("--peer-data-port 7100 is --peer-listen's port"));
  EXPECT_THAT(ParseAgentFlags(With({"--coordinator", "c:1", "--peer-listen", ":65535"})),
              FailsNaming("give --peer-data-port"));
  CKPTD_EXPECT_OK(ParseAgentFlags(
      With({"--coordinator", "c:1", "--peer-listen", ":65535", "--peer-data-port", "65534"})).status());
  for (const char* bad : {"-1", "10001", "nan", "inf", "fast", ""}) {
    EXPECT_THAT(with_peer({"--replication-gbps", bad}), FailsNaming("--replication-gbps")) << bad;
  }
  const std::string too_long(200, 'r');
  for (const char* bad : {"../rack", "rack 1", "", too_long.c_str()}) {
    EXPECT_THAT(with_peer({"--failure-domain", bad}), FailsNaming("--failure-domain")) << bad;
  }
  // TLS for partners needs the whole set: each side checks the other's certificate.
  ckptd::testing::TempDir dir("ckptd-agent-flags-");
  const std::string pem = dir.Sub("ca.pem");
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  EXPECT_THAT(with_peer({"--tls-ca", pem}), FailsNaming("--tls-ca, --tls-cert and --tls-key"));
  // With TLS the copies stay on the encrypted streams: no data lane port.
  EXPECT_THAT(with_peer({"--tls-ca", pem, "--tls-cert", pem, "--tls-key", pem, "--peer-data-port", "7200"}),
              FailsNaming("--peer-data-port has no use with --tls-*"));
}

TEST(AgentFlagsTest, MetricsListenTakesAHostAndPort) {
  for (const char* good : {"127.0.0.1:9091", ":9091", "[::1]:0", "localhost:65535", "0.0.0.0:9091"}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(AgentFlags flags, ParseAgentFlags(With({"--metrics-listen", good})));
    EXPECT_THAT(flags.metrics_listen, Optional(std::string(good)));
  }
  // With a coordinator too, as any other agent flag.
  CKPTD_ASSERT_OK_AND_ASSIGN(
      AgentFlags flags,
      ParseAgentFlags(With({"--metrics-listen", ":9091", "--coordinator", "coord:7070", "--node-id", "n1"})));
  EXPECT_THAT(flags.metrics_listen, Optional(std::string(":9091")));
  // A usage error naming the flag (main() exits base::kExitUsage).
  for (const char* bad :
       {"9091", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1", "::1:9091", "host:port", ""}) {
    EXPECT_THAT(ParseAgentFlags(With({"--metrics-listen", bad})), FailsNaming("--metrics-listen: ")) << bad;
  }
  EXPECT_THAT(ParseAgentFlags(With({"--metrics-listen"})), FailsNaming("--metrics-listen"));
}

TEST(AgentFlagsTest, UsageNamesEveryFlag) {
  const std::string usage = kAgentUsage;
  EXPECT_THAT(usage, StartsWith("usage: ckptd-agent --storage-root <dir|s3://bucket/prefix> [--socket <path>]"));
  for (const char* flag : {"--storage-root",
                           "--socket",
                           "--staging-budget",
                           "--slots",
                           "--keep",
                           "--threads",
                           "--local-cache",
                           "--local-cache-keep",
                           "--trainer-group",
                           "--coordinator",
                           "--node-id",
                           "--tls-ca",
                           "--tls-cert",
                           "--tls-key",
                           "--inject-write-latency",
                           "--allow-drills",
                           "--agent-token-file",
                           "--memory-budget",
                           "--memory-keep-for",
                           "--no-memory-tier",
                           "--max-registrations",
                           "--peer-listen",
                           "--peer-address",
                           "--replicas",
                           "--failure-domain",
                           "--replication-gbps",
                           "--peer-data-port",
                           "--background-priority",
                           "--starvation-limit",
                           "--cpu-set",
                           "--compression",
                           "--metrics-listen"}) {
    EXPECT_THAT(usage, HasSubstr(flag));
    // Every flag the usage names is one the parser knows (it may still need others).
    EXPECT_THAT(ParseAgentFlags(With({flag, "x"})).status(),
                ::testing::Not(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag"))))
        << flag;
  }
}

// Issue 16, finding 9: numbers that were truncated, wrapped or overflowed.
TEST(AgentFlagsTest, NumbersOutsideWhatTheAgentHandlesAreUsageErrorsNotTruncated) {
  struct Case {
    std::vector<std::string> flags;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           // 2^32 + 2 became 2 slots, 2^31 threads a negative count, 2^32 keep 0.
           {{"--slots", "4294967298"}, "--slots must be an integer in 1..63, got \"4294967298\""},
           {{"--slots", "64"}, "--slots must be an integer in 1..63"},
           {{"--keep", "0"}, "--keep must be an integer in 1..1000000, got \"0\""},
           {{"--keep", "4294967296"}, "--keep must be an integer in 1..1000000, got \"4294967296\""},
           {{"--keep", "2147483648"}, "--keep must be an integer in 1..1000000"},
           {{"--threads", "100000"}, "--threads must be an integer in 1..1024, got \"100000\""},
           {{"--threads", "2147483648"}, "--threads must be an integer in 1..1024"},
           {{"--threads", "0"}, "--threads must be an integer in 1..1024, got \"0\""},
           {{"--staging-budget", "0"}, "--staging-budget must be a size in 1..1T"},
           {{"--staging-budget", "2T"}, "--staging-budget must be a size in 1..1T"},
           {{"--staging-budget", "16777216T"}, "--staging-budget must be a size in 1..1T"},  // 2^64 bytes
           {{"--local-cache", "/nvme/t", "--local-cache-keep", "4294967297"},
            "--local-cache-keep must be an integer in 1..1000000"},
           {{"--trainer-group", "4294967295"}, "--trainer-group must be a group name or a number in 0..4294967294"},
           {{"--trainer-group", "99999999999999999999"}, "--trainer-group must be a group name or a number"},
           {{"--coordinator", "127.0.0.1:99999"}, "--coordinator: \"127.0.0.1:99999\": port must be 1..65535"},
           {{"--coordinator", "127.0.0.1:0"}, "--coordinator: \"127.0.0.1:0\": port must be 1..65535"},
           {{"--coordinator", "coord"}, "--coordinator: \"coord\" is not host:port"},
           {{"--inject-write-latency", "2h"}, "--inject-write-latency must be a duration in 1ns..1h"},
           {{"--cpu-set", "8192"}, "--cpu-set: \"8192\" is not a CPU number 0..8191"},
           {{"--cpu-set", "4294967296"}, "--cpu-set: \"4294967296\" is not a CPU number 0..8191"},
       }) {
    EXPECT_THAT(ParseAgentFlags(With(c.flags)), FailsNaming(c.message)) << c.flags[0];
  }
}

TEST(AgentFlagsTest, TheEndsOfEveryRangeAreAccepted) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      AgentFlags top,
      ParseAgentFlags(With({"--staging-budget", "1T", "--slots", "63", "--keep", "1000000", "--threads", "1024",
                            "--local-cache", "/nvme/t", "--local-cache-keep", "1000000", "--trainer-group",
                            "4294967294", "--coordinator", "[::1]:65535", "--inject-write-latency", "1h"})));
  EXPECT_EQ(top.options.staging_budget_bytes, uint64_t{1} << 40);
  EXPECT_EQ(top.options.slots, 63u);
  EXPECT_EQ(top.options.keep_last, 1000000);
  EXPECT_EQ(top.options.io_threads, 1024);
  EXPECT_EQ(top.options.local_cache_keep, 1000000);
  EXPECT_THAT(top.options.trainer_group, Optional(4294967294u));
  EXPECT_EQ(top.inject_write_latency, absl::Hours(1));
  CKPTD_ASSERT_OK_AND_ASSIGN(
      AgentFlags bottom, ParseAgentFlags(With({"--staging-budget", "1", "--slots", "1", "--keep", "1", "--threads", "1",
                                               "--local-cache", "/nvme/t", "--local-cache-keep", "1", "--trainer-group",
                                               "0", "--coordinator", "coord:1"})));
  EXPECT_EQ(bottom.options.staging_budget_bytes, 1u);
  EXPECT_EQ(bottom.options.slots, 1u);
  EXPECT_EQ(bottom.options.keep_last, 1);
  EXPECT_EQ(bottom.options.io_threads, 1);
  EXPECT_EQ(bottom.options.local_cache_keep, 1);
  EXPECT_THAT(bottom.options.trainer_group, Optional(0u));
}

TEST(AgentFlagsTest, TheSocketDefaultsToAPrivateRuntimeDirectory) {
  absl::StatusOr<std::string> expected = base::DefaultAgentSocket();
  absl::StatusOr<AgentFlags> flags = ParseAgentFlags({"--storage-root", "/srv/ckpt"});
  if (!expected.ok()) {
    EXPECT_THAT(flags, StatusIs(expected.status().code(), HasSubstr("pass --socket")));
    return;
  }
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->socket, *expected);
  EXPECT_EQ(flags->socket.find("/tmp"), std::string::npos);
}

}  // namespace
}  // namespace ckptd::agent
