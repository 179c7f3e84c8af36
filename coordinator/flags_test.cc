#include "coordinator/flags.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;
using ::testing::StartsWith;

// The required flags, then `more`.
std::vector<std::string> With(std::vector<std::string> more) {
  std::vector<std::string> args = {"--listen",  "127.0.0.1:7000", "--storage-root",
                                   "/srv/ckpt", "--state-dir",    "/var/lib/ckptd"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// A command line that must fail with kInvalidArgument saying `text`.
MATCHER_P(FailsNaming, text, "") {
  return ::testing::ExplainMatchResult(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(text)), arg.status(),
                                       result_listener);
}

TEST(CoordinatorFlagsTest, DefaultsWithOnlyTheRequiredFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags flags, ParseCoordinatorFlags(With({})));
  EXPECT_FALSE(flags.help);
  EXPECT_EQ(flags.listen, "127.0.0.1:7000");
  EXPECT_EQ(flags.storage_root, "/srv/ckpt");
  EXPECT_EQ(flags.state_dir, "/var/lib/ckptd");
  EXPECT_EQ(flags.metrics_listen, std::nullopt);
  EXPECT_EQ(flags.operator_token_file, std::nullopt);
  EXPECT_EQ(flags.agent_token_file, std::nullopt);
  EXPECT_FALSE(flags.insecure_agents);
  EXPECT_FALSE(flags.tls.has_value());
  // The options' own defaults, but for retention, which the service runs.
  const CoordinatorOptions defaults;
  const CoordinatorOptions& o = flags.options;
  EXPECT_FALSE(o.retention_in_tick);
  EXPECT_TRUE(defaults.retention_in_tick);
  EXPECT_EQ(o.heartbeat_interval, defaults.heartbeat_interval);
  EXPECT_EQ(o.node_lost_after, defaults.node_lost_after);
  EXPECT_EQ(o.hang_floor, defaults.hang_floor);
  EXPECT_EQ(o.step_deadline, defaults.step_deadline);
  EXPECT_EQ(o.restart_guess, defaults.restart_guess);
  EXPECT_EQ(o.alternative_interval, defaults.alternative_interval);
  EXPECT_EQ(o.decide_every, defaults.decide_every);
  EXPECT_EQ(o.min_interval, defaults.min_interval);
  EXPECT_EQ(o.max_interval, defaults.max_interval);
  EXPECT_EQ(o.failure_prior.mean_per_gpu_hour, defaults.failure_prior.mean_per_gpu_hour);
  EXPECT_EQ(o.failure_prior.shape, defaults.failure_prior.shape);
  EXPECT_EQ(o.hysteresis, defaults.hysteresis);
  EXPECT_TRUE(o.interval_automatic);
  EXPECT_EQ(o.every_steps, 100u);
  EXPECT_EQ(o.keep_last, 2);
}

TEST(CoordinatorFlagsTest, EachFlagReachesItsOption) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags flags, ParseCoordinatorFlags(With({"--metrics-listen",
                                                                                 ":9100",
                                                                                 "--operator-token-file",
                                                                                 "/etc/ckptd/token",
                                                                                 "--heartbeat-interval",
                                                                                 "250ms",
                                                                                 "--node-lost-after",
                                                                                 "3s",
                                                                                 "--hang-floor",
                                                                                 "90s",
                                                                                 "--step-deadline",
                                                                                 "20m",
                                                                                 "--restart-guess",
                                                                                 "7m",
                                                                                 "--alternative-interval",
                                                                                 "45m",
                                                                                 "--decide-every",
                                                                                 "15s",
                                                                                 "--min-interval",
                                                                                 "0",
                                                                                 "--max-interval",
                                                                                 "2h",
                                                                                 "--failure-rate",
                                                                                 "1e-5",
                                                                                 "--failure-prior-weight",
                                                                                 "4",
                                                                                 "--failure-mix",
                                                                                 "0.5,0.3,0.2",
                                                                                 "--interval-hysteresis",
                                                                                 "0.5",
                                                                                 "--initial-every",
                                                                                 "40",
                                                                                 "--keep",
                                                                                 "6"})));
  EXPECT_THAT(flags.metrics_listen, Optional(std::string(":9100")));
  EXPECT_THAT(flags.operator_token_file, Optional(std::string("/etc/ckptd/token")));
  const CoordinatorOptions& o = flags.options;
  EXPECT_EQ(o.heartbeat_interval, absl::Milliseconds(250));
  EXPECT_EQ(o.node_lost_after, absl::Seconds(3));
  EXPECT_EQ(o.hang_floor, absl::Seconds(90));
  EXPECT_EQ(o.step_deadline, absl::Minutes(20));
  EXPECT_EQ(o.restart_guess, absl::Minutes(7));
  EXPECT_EQ(o.alternative_interval, absl::Minutes(45));
  EXPECT_EQ(o.decide_every, absl::Seconds(15));
  EXPECT_EQ(o.min_interval, absl::ZeroDuration());
  EXPECT_EQ(o.max_interval, absl::Hours(2));
  EXPECT_DOUBLE_EQ(o.failure_prior.mean_per_gpu_hour, 1e-5);
  EXPECT_DOUBLE_EQ(o.failure_prior.shape, 4);
  EXPECT_DOUBLE_EQ(o.failure_mix.process, 0.5);
  EXPECT_DOUBLE_EQ(o.failure_mix.node, 0.3);
  EXPECT_DOUBLE_EQ(o.failure_mix.wide, 0.2);
  EXPECT_DOUBLE_EQ(o.hysteresis, 0.5);
  EXPECT_TRUE(o.interval_automatic);
  EXPECT_EQ(o.every_steps, 40u);
  EXPECT_EQ(o.keep_last, 6);
  EXPECT_FALSE(o.retention_in_tick);
}

TEST(CoordinatorFlagsTest, EveryFixesTheInterval) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags flags, ParseCoordinatorFlags(With({"--every=25"})));
  EXPECT_FALSE(flags.options.interval_automatic);
  EXPECT_EQ(flags.options.every_steps, 25u);
}

TEST(CoordinatorFlagsTest, DurableEveryFixesKOrLeavesItToThePolicy) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags fixed, ParseCoordinatorFlags(With({"--durable-every", "4"})));
  EXPECT_EQ(fixed.options.durable_every, 4u);
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags automatic, ParseCoordinatorFlags(With({"--durable-every", "auto"})));
  EXPECT_EQ(automatic.options.durable_every, 0u);
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags bound, ParseCoordinatorFlags(With({"--durable-every", "1000"})));
  EXPECT_EQ(bound.options.durable_every, 1000u);
  for (const char* bad : {"0", "1001", "-1", "two", "", "18446744073709551616"}) {
    EXPECT_THAT(ParseCoordinatorFlags(With({"--durable-every", bad})), FailsNaming("--durable-every")) << bad;
  }
}

TEST(CoordinatorFlagsTest, TlsNeedsAllThreeFiles) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      CoordinatorFlags flags,
      ParseCoordinatorFlags(With({"--tls-cert", "/c.pem", "--tls-key", "/k.pem", "--tls-ca", "/ca.pem"})));
  ASSERT_TRUE(flags.tls.has_value());
  EXPECT_EQ(flags.tls->cert, "/c.pem");
  EXPECT_EQ(flags.tls->key, "/k.pem");
  EXPECT_EQ(flags.tls->ca, "/ca.pem");
  for (const std::vector<std::string>& partial : std::vector<std::vector<std::string>>{
           {"--tls-cert", "/c.pem"}, {"--tls-key", "/k.pem"}, {"--tls-cert", "/c.pem", "--tls-ca", "/ca.pem"}}) {
    EXPECT_THAT(ParseCoordinatorFlags(With(partial)),
                FailsNaming("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca"))
        << partial[0];
  }
}

TEST(CoordinatorFlagsTest, RequiredFlagsAndStrayArguments) {
  EXPECT_THAT(ParseCoordinatorFlags({"--listen", "127.0.0.1:0"}),
              FailsNaming("--listen, --storage-root and --state-dir (or --etcd-endpoints) are required"));
  EXPECT_THAT(ParseCoordinatorFlags({"--storage-root", "/r", "--state-dir", "/s"}), FailsNaming("are required"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"serve"})), FailsNaming("unexpected argument \"serve\""));
}

TEST(CoordinatorFlagsTest, BadDurationsNameTheFlag) {
  for (const char* flag : {"--heartbeat-interval", "--node-lost-after", "--hang-floor", "--step-deadline",
                           "--restart-guess", "--alternative-interval", "--decide-every"}) {
    EXPECT_THAT(ParseCoordinatorFlags(With({flag, "soon"})),
                FailsNaming(std::string(flag) + ": \"soon\" is not a positive duration (e.g. 500ms, 5s, 30m)"));
    EXPECT_THAT(ParseCoordinatorFlags(With({flag, "0s"})), FailsNaming(std::string(flag) + ": \"0s\""));
    EXPECT_THAT(ParseCoordinatorFlags(With({flag, "-5s"})), FailsNaming(std::string(flag) + ": \"-5s\""));
    EXPECT_THAT(ParseCoordinatorFlags(With({flag, "inf"})), FailsNaming(std::string(flag) + ": \"inf\""));
  }
  // The interval's bounds may be 0 (no bound), not negative.
  EXPECT_THAT(ParseCoordinatorFlags(With({"--max-interval", "-1s"})),
              FailsNaming("--max-interval: \"-1s\" is not a duration (e.g. 30s, 2h; 0 for no bound)"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--min-interval", "x"})), FailsNaming("--min-interval: \"x\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--min-interval", "2h", "--max-interval", "1h"})),
              FailsNaming("--min-interval is longer than --max-interval"));
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags unbounded,
                             ParseCoordinatorFlags(With({"--min-interval", "2h", "--max-interval", "0"})));
  EXPECT_EQ(unbounded.options.max_interval, absl::ZeroDuration());
}

TEST(CoordinatorFlagsTest, HeartbeatAndLossMustFit) {
  EXPECT_THAT(ParseCoordinatorFlags(With({"--heartbeat-interval", "500us"})),
              FailsNaming("--heartbeat-interval must be at least 1ms"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--heartbeat-interval", "5s"})),
              FailsNaming("--node-lost-after must be longer than --heartbeat-interval"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--heartbeat-interval", "2s", "--node-lost-after", "2s"})),
              FailsNaming("--node-lost-after must be longer than --heartbeat-interval"));
}

TEST(CoordinatorFlagsTest, BadNumbersNameTheFlag) {
  EXPECT_THAT(ParseCoordinatorFlags(With({"--failure-rate", "-1"})),
              FailsNaming("--failure-rate: \"-1\" is not a number in (0, 1000]"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--failure-rate", "nan"})), FailsNaming("--failure-rate: \"nan\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--failure-rate", "1001"})), FailsNaming("--failure-rate: \"1001\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--failure-mix", "0.5,0.5"})),
              FailsNaming("--failure-mix: a failure mix is three fractions"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--failure-mix", "0.5,0.5,0"})),
              FailsNaming("--failure-mix: the failure mix's wide fraction must be positive and finite, got 0"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--failure-prior-weight", "0"})),
              FailsNaming("--failure-prior-weight: \"0\" is not a number in (0, 1e+06]"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--interval-hysteresis", "x"})),
              FailsNaming("--interval-hysteresis: \"x\" is not a number in (0, 10]"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--keep", "two"})),
              FailsNaming("--keep must be an integer in 1..1000000, got \"two\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--every", "-3"})),
              FailsNaming("--every must be an integer in 1..1099511627776, got \"-3\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--every", "0"})),
              FailsNaming("--every must be an integer in 1..1099511627776, got \"0\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--initial-every", "0"})),
              FailsNaming("--initial-every must be an integer in 1..1099511627776, got \"0\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--keep", "0"})),
              FailsNaming("--keep must be an integer in 1..1000000, got \"0\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--keep", "1000001"})),
              FailsNaming("--keep must be an integer in 1..1000000"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--max-nodes", "0"})),
              FailsNaming("--max-nodes must be an integer in 1..1000000, got \"0\""));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--max-jobs", "100001"})),
              FailsNaming("--max-jobs must be an integer in 1..100000"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--forget-after", "8761h"})), FailsNaming("--forget-after must be at most"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--forget-after", "0s"})), FailsNaming("--forget-after"));
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags limits, ParseCoordinatorFlags(With({"--max-nodes", "64", "--max-jobs",
                                                                                   "8", "--forget-after", "48h"})));
  EXPECT_EQ(limits.options.max_nodes, 64u);
  EXPECT_EQ(limits.options.max_jobs, 8u);
  EXPECT_EQ(limits.options.forget_after, absl::Hours(48));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--every", "1099511627777"})),
              FailsNaming("--every must be an integer in 1..1099511627776"));
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags largest,
                             ParseCoordinatorFlags(With({"--every", "1099511627776", "--keep", "1000000"})));
  EXPECT_EQ(largest.options.every_steps, uint64_t{1} << 40);
  EXPECT_EQ(largest.options.keep_last, 1000000);
}

TEST(CoordinatorFlagsTest, AgentCredentialFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags token,
                             ParseCoordinatorFlags(With({"--agent-token-file", "/etc/ckptd/agent-token"})));
  EXPECT_THAT(token.agent_token_file, Optional(std::string("/etc/ckptd/agent-token")));
  EXPECT_FALSE(token.insecure_agents);
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags open, ParseCoordinatorFlags(With({"--insecure-agents"})));
  EXPECT_TRUE(open.insecure_agents);
  EXPECT_EQ(open.agent_token_file, std::nullopt);
  EXPECT_THAT(ParseCoordinatorFlags(With({"--insecure-agents", "--agent-token-file", "/etc/ckptd/agent-token"})),
              FailsNaming("--insecure-agents and --agent-token-file exclude each other"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--insecure-agents=yes"})), FailsNaming("--insecure-agents takes no value"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--agent-token-file"})), FailsNaming("--agent-token-file needs a value"));
}

TEST(CoordinatorFlagsTest, AuditLogNamesTheFile) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags none, ParseCoordinatorFlags(With({})));
  EXPECT_EQ(none.audit_log, std::nullopt);
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags audit,
                             ParseCoordinatorFlags(With({"--audit-log", "/var/log/ckptd/audit.jsonl"})));
  EXPECT_THAT(audit.audit_log, Optional(std::string("/var/log/ckptd/audit.jsonl")));
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags equals, ParseCoordinatorFlags(With({"--audit-log=/tmp/a.jsonl"})));
  EXPECT_THAT(equals.audit_log, Optional(std::string("/tmp/a.jsonl")));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--audit-log"})), FailsNaming("--audit-log needs a value"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--audit-log="})), FailsNaming("--audit-log needs"));
}

TEST(CoordinatorFlagsTest, EveryAndInitialEveryExcludeEachOther) {
  EXPECT_THAT(ParseCoordinatorFlags(With({"--every", "10", "--initial-every", "7"})),
              FailsNaming("--every and --initial-every exclude each other"));
}

TEST(CoordinatorFlagsTest, CommandLineErrors) {
  EXPECT_THAT(ParseCoordinatorFlags(With({"--frobnicate"})), FailsNaming("unknown flag --frobnicate"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--keep"})), FailsNaming("--keep needs a value"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--help=1"})), FailsNaming("--help takes no value"));
}

TEST(CoordinatorFlagsTest, HelpNeedsNothingElse) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags flags, ParseCoordinatorFlags({"--help"}));
  EXPECT_TRUE(flags.help);
  // As before the flags moved out of main(): --help wins over bad values and
  // stray arguments, not over a command line that does not parse.
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags with_bad_value, ParseCoordinatorFlags({"--keep", "0", "x", "--help"}));
  EXPECT_TRUE(with_bad_value.help);
  EXPECT_THAT(ParseCoordinatorFlags({"--help", "--frobnicate"}), FailsNaming("unknown flag --frobnicate"));
}

TEST(CoordinatorFlagsTest, UsageNamesEveryFlag) {
  const std::string usage = kCoordinatorUsage;
  EXPECT_THAT(usage,
              StartsWith("usage: ckptd-coordinator --listen <host:port> --storage-root <dir|s3://bucket/prefix>\n"));
  for (const char* flag : {"--listen",
                           "--storage-root",
                           "--state-dir",
                           "--metrics-listen",
                           "--heartbeat-interval",
                           "--node-lost-after",
                           "--hang-floor",
                           "--every",
                           "--keep",
                           "--step-deadline",
                           "--max-nodes",
                           "--max-jobs",
                           "--forget-after",
                           "--operator-token-file",
                           "--agent-token-file",
                           "--insecure-agents",
                           "--tls-cert",
                           "--tls-key",
                           "--tls-ca",
                           "--help",
                           "--initial-every",
                           "--min-interval",
                           "--max-interval",
                           "--failure-rate",
                           "--failure-prior-weight",
                           "--failure-mix",
                           "--restart-guess",
                           "--alternative-interval",
                           "--interval-hysteresis",
                           "--decide-every",
                           "--etcd-endpoints",
                           "--etcd-prefix",
                           "--etcd-lease-ttl",
                           "--advertise",
                           "--etcd-ca",
                           "--etcd-cert",
                           "--etcd-key",
                           "--etcd-user",
                           "--etcd-password-file",
                           "--audit-log"}) {
    EXPECT_THAT(usage, HasSubstr(flag));
    // Every flag the usage names is one the parser knows.
    EXPECT_THAT(ParseCoordinatorFlags({flag, "x"}).status(),
                Not(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag"))))
        << flag;
  }
}

// Issue 16, finding 9: numbers the coordinator would truncate, wrap or
// overflow are usage errors naming the flag and the range.
TEST(CoordinatorFlagsTest, NumbersOutsideWhatTheCoordinatorHandlesAreRefused) {
  struct Case {
    std::vector<std::string> flags;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           // 2^32 steps kept was keep_last 0 in an int; 2^64 + 1 does not parse.
           {{"--keep", "4294967296"}, "--keep must be an integer in 1..1000000, got \"4294967296\""},
           {{"--keep", "18446744073709551617"}, "--keep must be an integer in 1..1000000"},
           {{"--every", "18446744073709551615"}, "--every must be an integer in 1..1099511627776"},
           // 50 days of heartbeat interval is more milliseconds than 32 bits hold.
           {{"--heartbeat-interval", "1200h", "--node-lost-after", "1300h"},
            "--heartbeat-interval must be at most 1h, got \"1200h\""},
           {{"--node-lost-after", "721h"}, "--node-lost-after must be at most 720h, got \"721h\""},
           {{"--hang-floor", "99999999h"}, "--hang-floor must be at most 720h"},
           {{"--step-deadline", "1000h"}, "--step-deadline must be at most 720h"},
           {{"--restart-guess", "1000h"}, "--restart-guess must be at most 720h"},
           {{"--decide-every", "1000h"}, "--decide-every must be at most 720h"},
           {{"--alternative-interval", "8761h"}, "--alternative-interval must be at most 8760h"},
           {{"--max-interval", "8761h"}, "--max-interval must be at most 8760h"},
           {{"--min-interval", "8761h", "--max-interval", "0"}, "--min-interval must be at most 8760h"},
           {{"--listen", "127.0.0.1:99999"}, "--listen: \"127.0.0.1:99999\": port must be 0..65535"},
           {{"--listen", "127.0.0.1:65536"}, "--listen: \"127.0.0.1:65536\": port must be 0..65535"},
           {{"--listen", "7070"}, "--listen: \"7070\" is not host:port"},
           {{"--metrics-listen", "[::1]:4294967296"}, "--metrics-listen: \"[::1]:4294967296\": port must be 0..65535"},
       }) {
    // A later --listen replaces the one With() gives.
    EXPECT_THAT(ParseCoordinatorFlags(With(c.flags)), FailsNaming(c.message)) << c.flags[0] << " " << c.flags[1];
  }
}

TEST(CoordinatorFlagsTest, TheEndsOfEveryRangeAreAccepted) {
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorFlags top, ParseCoordinatorFlags(With({"--listen",
                                                                               ":65535",
                                                                               "--metrics-listen",
                                                                               "[::1]:0",
                                                                               "--heartbeat-interval",
                                                                               "1h",
                                                                               "--node-lost-after",
                                                                               "720h",
                                                                               "--hang-floor",
                                                                               "720h",
                                                                               "--step-deadline",
                                                                               "720h",
                                                                               "--restart-guess",
                                                                               "720h",
                                                                               "--decide-every",
                                                                               "720h",
                                                                               "--alternative-interval",
                                                                               "8760h",
                                                                               "--min-interval",
                                                                               "8760h",
                                                                               "--max-interval",
                                                                               "8760h",
                                                                               "--initial-every",
                                                                               "1099511627776",
                                                                               "--keep",
                                                                               "1000000"})));
  EXPECT_EQ(top.listen, ":65535");
  EXPECT_EQ(top.options.heartbeat_interval, absl::Hours(1));
  EXPECT_EQ(top.options.node_lost_after, absl::Hours(720));
  EXPECT_EQ(top.options.max_interval, absl::Hours(8760));
  EXPECT_EQ(top.options.every_steps, uint64_t{1} << 40);
  EXPECT_EQ(top.options.keep_last, 1000000);
  CKPTD_ASSERT_OK_AND_ASSIGN(
      CoordinatorFlags bottom,
      ParseCoordinatorFlags(With({"--heartbeat-interval", "1ms", "--every", "1", "--keep", "1"})));
  EXPECT_EQ(bottom.options.heartbeat_interval, absl::Milliseconds(1));
  EXPECT_EQ(bottom.options.every_steps, 1u);
  EXPECT_EQ(bottom.options.keep_last, 1);
}

}  // namespace
}  // namespace ckptd::coordinator

namespace ckptd::coordinator {
namespace {

// Replicated coordinators: the required flags with etcd instead of a state
// directory, and both tokens from files, then `more`.
std::vector<std::string> Replicated(std::vector<std::string> more) {
  std::vector<std::string> args = {"--listen",           "127.0.0.1:7000",  "--storage-root",     "/srv/ckpt",
                                   "--etcd-endpoints",   "e1:2379,e2:2379", "--operator-token-file", "/etc/op",
                                   "--agent-token-file", "/etc/ag"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

#ifdef CKPTD_HAVE_ETCD
TEST(CoordinatorFlagsTest, EtcdFlagsReachTheirSettings) {
  absl::StatusOr<CoordinatorFlags> f = ParseCoordinatorFlags(Replicated({}));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->etcd.has_value());
  EXPECT_THAT(f->etcd->endpoints, ::testing::ElementsAre("e1:2379", "e2:2379"));
  EXPECT_EQ(f->etcd->prefix, "/ckptd/default");
  EXPECT_EQ(f->etcd->lease_ttl_seconds, 3);
  EXPECT_TRUE(f->state_dir.empty());
  f = ParseCoordinatorFlags(Replicated({"--etcd-prefix", "/ckptd/prod", "--etcd-lease-ttl", "10s", "--advertise",
                                        "coord-0.example:7000", "--etcd-ca", "/ca", "--etcd-cert", "/c", "--etcd-key",
                                        "/k", "--etcd-user", "ckptd", "--etcd-password-file", "/pw"}));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->etcd->prefix, "/ckptd/prod");
  EXPECT_EQ(f->etcd->lease_ttl_seconds, 10);
  EXPECT_EQ(f->etcd->advertise, "coord-0.example:7000");
  EXPECT_EQ(f->etcd->tls.ca, "/ca");
  EXPECT_EQ(f->etcd->tls.cert, "/c");
  EXPECT_EQ(f->etcd->tls.key, "/k");
  EXPECT_EQ(f->etcd->user, "ckptd");
  EXPECT_EQ(f->etcd->password_file, "/pw");
  EXPECT_TRUE(f->etcd->import_state.empty());
  f = ParseCoordinatorFlags(Replicated({"--import-state", "/var/lib/ckptd/coordinator"}));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->etcd->import_state, "/var/lib/ckptd/coordinator");
  // With --insecure-agents, no agent token file is needed.
  EXPECT_TRUE(ParseCoordinatorFlags({"--listen", ":7000", "--storage-root", "/r", "--etcd-endpoints", "e:2379",
                                     "--operator-token-file", "/op", "--insecure-agents"})
                  .ok());
}

TEST(CoordinatorFlagsTest, EtcdFlagsThatDoNotFitAreRefused) {
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--state-dir", "/s"})),
              FailsNaming("--state-dir and --etcd-endpoints exclude each other"));
  EXPECT_THAT(ParseCoordinatorFlags({"--listen", ":1", "--storage-root", "/r"}),
              FailsNaming("--state-dir (one coordinator) or --etcd-endpoints (replicated) is required"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--etcd-prefix", "/x"})), FailsNaming("--etcd-prefix needs --etcd-endpoints"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--advertise", "h:1"})), FailsNaming("--advertise needs --etcd-endpoints"));
  EXPECT_THAT(ParseCoordinatorFlags(With({"--import-state", "/s"})),
              FailsNaming("--import-state needs --etcd-endpoints"));
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--import-state", ""})),
              FailsNaming("--import-state needs the state directory"));
  EXPECT_THAT(ParseCoordinatorFlags({"--listen", ":1", "--storage-root", "/r", "--etcd-endpoints", "e:2379",
                                     "--agent-token-file", "/ag"}),
              FailsNaming("needs --operator-token-file"));
  EXPECT_THAT(ParseCoordinatorFlags({"--listen", ":1", "--storage-root", "/r", "--etcd-endpoints", "e:2379",
                                     "--operator-token-file", "/op"}),
              FailsNaming("needs --agent-token-file"));
  std::vector<std::string> args = Replicated({});
  args[5] = "e1:2379,nonsense";
  EXPECT_THAT(ParseCoordinatorFlags(args), FailsNaming("--etcd-endpoints: etcd endpoint \"nonsense\""));
  for (const char* prefix : {"", "ckptd", "/ckptd/"}) {
    EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--etcd-prefix", prefix})), FailsNaming("--etcd-prefix")) << prefix;
  }
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--etcd-prefix", "/" + std::string(300, 'p')})),
              FailsNaming("at most 256 bytes"));
  for (const char* ttl : {"1s", "61s", "2500ms", "x", "0s"}) {
    EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--etcd-lease-ttl", ttl})),
                FailsNaming("--etcd-lease-ttl: \"" + std::string(ttl) + "\""));
  }
  EXPECT_TRUE(ParseCoordinatorFlags(Replicated({"--etcd-lease-ttl", "2s"})).ok());
  EXPECT_TRUE(ParseCoordinatorFlags(Replicated({"--etcd-lease-ttl", "1m"})).ok());
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--etcd-cert", "/c"})), FailsNaming("--etcd-cert and --etcd-key"));
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--etcd-cert", "/c", "--etcd-key", "/k"})),
              FailsNaming("--etcd-cert needs --etcd-ca"));
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--etcd-user", "u"})),
              FailsNaming("--etcd-user and --etcd-password-file go together"));
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--advertise", ":7000"})), FailsNaming("--advertise"));
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({"--advertise", "h:0"})), FailsNaming("--advertise"));
}
#else
TEST(CoordinatorFlagsTest, WithoutEtcdInTheBuildEtcdEndpointsAreRefused) {
  EXPECT_THAT(ParseCoordinatorFlags(Replicated({})), FailsNaming("built without etcd"));
}
#endif

}  // namespace
}  // namespace ckptd::coordinator
