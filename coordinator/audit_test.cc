// The coordinator's audit trail (coordinator/audit_log.h): the attack of a
// token holder who re-registers a live node and reports its trainer dead is
// on record with who did it; operator actions and refused calls are too; the
// --audit-log file is refused when it is a link, and a file that stops taking
// records does not stop the coordinator.
#include "coordinator/audit_log.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/json_checker.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/testing_service_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::rpc::FromGrpcStatus;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

// Counts what the audit log reports (as CoordinatorMetrics does).
class CountingObserver : public AuditObserver {
 public:
  void OnAuditRecord(bool granted) override { ++(granted ? granted_ : refused_); }
  void OnAuditSuppressed() override { ++suppressed_; }
  void OnAuditWriteError() override { ++write_errors_; }
  std::atomic<int> granted_{0}, refused_{0}, suppressed_{0}, write_errors_{0};
};

// The string value of `key` in the JSON object `line` ("" when absent; the
// tests' values hold no escaped quotes).
std::string Field(const std::string& line, const std::string& key) {
  const std::string start = absl::StrCat("\"", key, "\":\"");
  const size_t at = line.find(start);
  if (at == std::string::npos) return "";
  const size_t from = at + start.size();
  return line.substr(from, line.find('"', from) - from);
}

std::vector<std::string> LinesOf(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<std::string> lines = absl::StrSplit(ss.str(), '\n', absl::SkipEmpty());
  return lines;
}

class AuditTest : public ::testing::Test, public ServiceHarness {
 protected:
  AuditTest() { options_.every_steps = 50; }
  void SetUp() override {
    AuditLogOptions ao;
    ao.path = AuditPath();
    ao.logger = &log_;
    ao.observer = &counts_;
    CKPTD_ASSERT_OK_AND_ASSIGN(audit_, AuditLog::Open(ao));
    CoordinatorServiceOptions so = DefaultServiceOptions();
    so.audit_log = audit_.get();
    Start(so);
  }
  void TearDown() override {
    Stop();
    audit_.reset();
  }
  void Fail(const std::string& what) override { ADD_FAILURE() << what; }

  std::string AuditPath() const { return dir_.Sub("audit.jsonl"); }

  // The audit file's records so far, each checked to be one JSON object.
  std::vector<std::string> Records() {
    EXPECT_TRUE(audit_->Flush());
    std::vector<std::string> lines = LinesOf(AuditPath());
    for (const std::string& line : lines) EXPECT_TRUE(::ckptd::testing::JsonChecker(line).Valid()) << line;
    return lines;
  }

  // The records that hold every one of `parts`.
  std::vector<std::string> RecordsWith(const std::vector<std::string>& parts) {
    std::vector<std::string> out;
    for (const std::string& line : Records()) {
      bool all = true;
      for (const std::string& p : parts) all = all && absl::StrContains(line, p);
      if (all) out.push_back(line);
    }
    return out;
  }

  // A stub on a connection of its own (another peer port than the harness's).
  std::unique_ptr<Stub> OtherConnection() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return ckptd::v1::Coordinator::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                                     grpc::InsecureChannelCredentials(), args));
  }

  ckptd::testing::TempDir dir_{"ckptd_audit_"};
  ckptd::testing::CapturingLogger log_;
  CountingObserver counts_;
  std::unique_ptr<AuditLog> audit_;
};

// The attack of the security review: a holder of the agent token registers
// node-a again while its agent is alive (as another agent process), and
// reports node-a's trainer dead. The job restarts; the audit trail says who
// did both, from where, and which registration was replaced.
TEST_F(AuditTest, AReRegistrationOfALiveNodeAndAFailureReportNameWhoMadeThem) {
  // The real agents.
  ckptd::v1::RegisterAgentRequest real = Registration("node-a", {0}, 2);
  real.set_instance(1111);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RegisterAgentResponse registered, AgentCall(&Stub::RegisterAgent, real));
  sessions_["node-a"] = registered.session();
  Register("node-b", {1});

  // The attacker, on a connection of its own.
  std::unique_ptr<Stub> attacker = OtherConnection();
  ckptd::v1::RegisterAgentRequest forged = Registration("node-a", {0}, 2);
  forged.set_instance(6666);
  forged.set_address("host-node-a");
  ckptd::v1::RegisterAgentResponse hijacked;
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAgentToken));
    ASSERT_THAT(FromGrpcStatus(attacker->RegisterAgent(&ctx, forged, &hijacked)), IsOk());
  }
  ckptd::v1::ReportFailureRequest kill = FailureRequest("node-a", 0, ckptd::v1::TRAINER_DIED, 7, "killed by signal 9");
  kill.set_session(hijacked.session());
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAgentToken));
    ckptd::v1::ReportFailureResponse resp;
    ASSERT_THAT(FromGrpcStatus(attacker->ReportFailure(&ctx, kill, &resp)), IsOk());
  }
  // What the attack achieved: node-a declared lost and its trainer dead.
  absl::StatusOr<ckptd::v1::ListEventsResponse> events = Call(&Stub::ListEvents, ckptd::v1::ListEventsRequest());
  ASSERT_THAT(events.status(), IsOk());
  std::map<ckptd::v1::FailureKind, int> kinds;
  for (const auto& e : events->events()) ++kinds[e.kind()];
  EXPECT_EQ(kinds[ckptd::v1::NODE_LOST], 1);
  EXPECT_EQ(kinds[ckptd::v1::TRAINER_DIED], 1);

  // And who did it.
  const std::vector<std::string> first =
      RecordsWith({"\"action\":\"RegisterAgent\"", "\"node\":\"node-a\"", "\"reregistration\":false"});
  ASSERT_THAT(first, SizeIs(1));
  const std::string agent_peer = Field(first[0], "peer");
  EXPECT_THAT(agent_peer, StartsWith("ipv4:127.0.0.1:"));

  const std::vector<std::string> reregistration =
      RecordsWith({"\"action\":\"RegisterAgent\"", "\"node\":\"node-a\"", "\"reregistration\":true"});
  ASSERT_THAT(reregistration, SizeIs(1));
  const std::string& r = reregistration[0];
  EXPECT_THAT(r, HasSubstr("\"outcome\":\"granted\""));
  EXPECT_THAT(r, HasSubstr("\"credential\":\"agent-token\""));
  EXPECT_THAT(r, HasSubstr("\"instance\":6666"));
  EXPECT_THAT(r, HasSubstr("\"agent_restarted\":true"));
  const std::string attacker_peer = Field(r, "peer");
  EXPECT_THAT(attacker_peer, StartsWith("ipv4:127.0.0.1:"));
  EXPECT_NE(attacker_peer, agent_peer);
  EXPECT_EQ(Field(r, "previous_peer"), agent_peer);
  EXPECT_THAT(Field(r, "time"), Not(IsEmpty()));
  EXPECT_THAT(Field(r, "previous_registered"), Not(IsEmpty()));

  const std::vector<std::string> failure = RecordsWith({"\"action\":\"ReportFailure\""});
  ASSERT_THAT(failure, SizeIs(1));
  const std::string& f = failure[0];
  EXPECT_THAT(f, AllOf(HasSubstr("\"outcome\":\"granted\""), HasSubstr("\"credential\":\"agent-token\""),
                       HasSubstr("\"node\":\"node-a\""), HasSubstr(absl::StrCat("\"job\":\"", kJob, "\"")),
                       HasSubstr("\"rank\":0"), HasSubstr("\"step\":7"), HasSubstr("\"kind\":\"trainer_died\""),
                       HasSubstr("\"detail\":\"killed by signal 9\"")));
  EXPECT_EQ(Field(f, "peer"), attacker_peer);

  // The same records as log lines, the re-registration among the warnings.
  EXPECT_TRUE(log_.Contains("audit: {"));
  EXPECT_TRUE(log_.Contains("\"reregistration\":true"));
  EXPECT_TRUE(log_.Contains("\"action\":\"ReportFailure\""));
  EXPECT_EQ(counts_.granted_, 4);  // three registrations, one failure report
  EXPECT_EQ(counts_.refused_, 0);
}

// A registration from the same agent process (its connection came back) is
// a re-registration too, but not a restart.
TEST_F(AuditTest, AnAgentRegisteringAgainIsNoRestart) {
  ckptd::v1::RegisterAgentRequest req = Registration("node-a", {0}, 2);
  req.set_instance(1111);
  ASSERT_THAT(AgentCall(&Stub::RegisterAgent, req).status(), IsOk());
  ASSERT_THAT(AgentCall(&Stub::RegisterAgent, req).status(), IsOk());
  const std::vector<std::string> again = RecordsWith({"\"reregistration\":true"});
  ASSERT_THAT(again, SizeIs(1));
  EXPECT_THAT(again[0], HasSubstr("\"agent_restarted\":false"));
}

TEST_F(AuditTest, OperatorActionsAreRecordedWithTheOperatorsIdentity) {
  Register("node-a", {0});
  Register("node-b", {1});
  ckptd::v1::RequestCheckpointRequest manual;
  manual.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RequestCheckpointResponse target,
                             Call(&Stub::RequestCheckpoint, manual, absl::StrCat("Bearer ", kOperatorToken)));
  const std::vector<std::string> checkpoint = RecordsWith({"\"action\":\"RequestCheckpoint\""});
  ASSERT_THAT(checkpoint, SizeIs(1));
  EXPECT_THAT(checkpoint[0],
              AllOf(HasSubstr("\"outcome\":\"granted\""), HasSubstr("\"authenticated\":true"),
                    HasSubstr("\"credential\":\"operator-token\""), HasSubstr("\"peer\":\"ipv4:127.0.0.1:"),
                    HasSubstr(absl::StrCat("\"job\":\"", kJob, "\"")),
                    HasSubstr(absl::StrCat("\"step\":", target.target_step()))));

  // A drill the coordinator refuses (the agents do not allow drills) is on
  // record as refused, by the operator.
  ckptd::v1::RunDrillRequest drill;
  drill.set_job(kJob);
  drill.set_scenario(ckptd::v1::KILL_TRAINER);
  drill.set_rank(1);
  EXPECT_THAT(Call(&Stub::RunDrill, drill, absl::StrCat("Bearer ", kOperatorToken)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  const std::vector<std::string> drills = RecordsWith({"\"action\":\"RunDrill\""});
  ASSERT_THAT(drills, SizeIs(1));
  EXPECT_THAT(drills[0], AllOf(HasSubstr("\"outcome\":\"refused\""), HasSubstr("\"authenticated\":true"),
                               HasSubstr("\"credential\":\"operator-token\""), HasSubstr("\"rank\":1"),
                               HasSubstr("\"scenario\":\"kill_trainer\""),
                               HasSubstr("\"code\":\"FAILED_PRECONDITION\"")));

  // Verifying a step (which quarantines a damaged one): its start and its end.
  CommitStep(50);
  ckptd::v1::VerifyStepRequest verify;
  verify.set_job(kJob);
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kOperatorToken));
    std::unique_ptr<grpc::ClientReader<ckptd::v1::VerifyProgress>> reader = stub_->VerifyStep(&ctx, verify);
    ckptd::v1::VerifyProgress progress;
    while (reader->Read(&progress)) {
    }
    ASSERT_THAT(FromGrpcStatus(reader->Finish()), IsOk());
  }
  Stop();  // the verification's thread is done with the service
  EXPECT_THAT(RecordsWith({"\"action\":\"VerifyStep\"", "\"credential\":\"operator-token\""}), SizeIs(1));
  const std::vector<std::string> verified = RecordsWith({"\"action\":\"VerifyStepDone\""});
  ASSERT_THAT(verified, SizeIs(1));
  EXPECT_THAT(verified[0], AllOf(HasSubstr("\"outcome\":\"granted\""), HasSubstr("\"step\":50"),
                                 HasSubstr("\"intact\":true"), HasSubstr("\"quarantined\":false")));
}

TEST_F(AuditTest, RefusedCallsAreRecordedAsRefused) {
  // The agent token on an operator call: refused, and named.
  ckptd::v1::RequestCheckpointRequest manual;
  manual.set_job(kJob);
  EXPECT_THAT(Call(&Stub::RequestCheckpoint, manual, absl::StrCat("Bearer ", kAgentToken)).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("operator token is wrong")));
  // No credential at all on an agent call; a wrong token on a heartbeat.
  EXPECT_THAT(Call(&Stub::RegisterAgent, Registration("node-x", {0}, 2)).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
  {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx, "Bearer guessed");
    ASSERT_TRUE(stream->Write(HeartbeatOf("node-y")));
    ckptd::v1::HeartbeatAck ack;
    EXPECT_FALSE(stream->Read(&ack));
    EXPECT_THAT(FromGrpcStatus(stream->Finish()), StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  }
  // Authenticated, but the coordinator refuses: node-a may not report a
  // rank of node-b.
  Register("node-a", {0});
  Register("node-b", {1});
  EXPECT_THAT(AgentCall(&Stub::ReportFailure, FailureRequest("node-a", 1, ckptd::v1::TRAINER_DIED)).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));

  const std::vector<std::string> operator_call = RecordsWith({"\"action\":\"RequestCheckpoint\""});
  ASSERT_THAT(operator_call, SizeIs(1));
  EXPECT_THAT(operator_call[0],
              AllOf(HasSubstr("\"outcome\":\"refused\""), HasSubstr("\"authenticated\":false"),
                    HasSubstr("\"credential\":\"agent-token\""), HasSubstr("\"code\":\"PERMISSION_DENIED\""),
                    HasSubstr("operator token is wrong"), HasSubstr("\"peer\":\"ipv4:127.0.0.1:")));
  const std::vector<std::string> no_credential = RecordsWith({"\"node\":\"node-x\""});
  ASSERT_THAT(no_credential, SizeIs(1));
  EXPECT_THAT(no_credential[0], AllOf(HasSubstr("\"action\":\"RegisterAgent\""), HasSubstr("\"outcome\":\"refused\""),
                                      HasSubstr("\"credential\":\"none\""), HasSubstr("\"code\":\"UNAUTHENTICATED\"")));
  const std::vector<std::string> heartbeat = RecordsWith({"\"action\":\"Heartbeats\""});
  ASSERT_THAT(heartbeat, SizeIs(1));
  EXPECT_THAT(heartbeat[0], AllOf(HasSubstr("\"outcome\":\"refused\""), HasSubstr("\"credential\":\"wrong-token\""),
                                  HasSubstr("\"node\":\"node-y\"")));
  const std::vector<std::string> failure = RecordsWith({"\"action\":\"ReportFailure\""});
  ASSERT_THAT(failure, SizeIs(1));
  EXPECT_THAT(failure[0], AllOf(HasSubstr("\"outcome\":\"refused\""), HasSubstr("\"authenticated\":true"),
                                HasSubstr("\"credential\":\"agent-token\""), HasSubstr("\"rank\":1"),
                                HasSubstr("\"code\":\"PERMISSION_DENIED\"")));
  EXPECT_EQ(counts_.refused_, 4);
  EXPECT_TRUE(log_.Contains("\"outcome\":\"refused\""));
}

// A flood of refused calls leaves a bounded trail: a burst, then a few a
// second; the next record says how many were left out.
TEST(AuditLogTest, RefusedAuthenticationIsRateLimited) {
  ckptd::testing::TempDir dir("ckptd_audit_");
  ckptd::testing::CapturingLogger log;
  CountingObserver counts;
  base::FakeClock clock;
  AuditLogOptions ao;
  ao.path = dir.Sub("audit.jsonl");
  ao.logger = &log;
  ao.clock = &clock;
  ao.observer = &counts;
  ao.refused_burst = 3;
  ao.refused_per_second = 1;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> audit, AuditLog::Open(ao));
  AuditRecord refused;
  refused.action = "RegisterAgent";
  refused.identity.credential = kCredentialWrongToken;
  refused.identity.peer = "ipv4:192.0.2.7:40000";
  refused.authenticated = false;
  refused.outcome = absl::PermissionDeniedError("RegisterAgent: the agent token is wrong");
  for (int i = 0; i < 1000; ++i) audit->Record(refused);
  ASSERT_TRUE(audit->Flush());
  EXPECT_THAT(LinesOf(ao.path), SizeIs(3));
  EXPECT_EQ(counts.refused_, 3);
  EXPECT_EQ(counts.suppressed_, 997);
  EXPECT_TRUE(log.Contains("some are left out of the audit trail"));
  clock.Advance(absl::Seconds(1));
  audit->Record(refused);
  audit->Record(refused);  // no token left
  ASSERT_TRUE(audit->Flush());
  const std::vector<std::string> lines = LinesOf(ao.path);
  ASSERT_THAT(lines, SizeIs(4));
  EXPECT_THAT(lines[3], HasSubstr("\"refused_left_out_before\":997"));
  // Authenticated records are never left out.
  AuditRecord granted;
  granted.action = "ReportFailure";
  granted.identity.credential = kCredentialAgentToken;
  for (int i = 0; i < 10; ++i) audit->Record(granted);
  ASSERT_TRUE(audit->Flush());
  const std::vector<std::string> after = LinesOf(ao.path);
  ASSERT_THAT(after, SizeIs(14));
  EXPECT_THAT(after[4], HasSubstr("\"refused_left_out_before\":1"));
}

TEST(AuditLogTest, TheFileIsCreatedOwnerOnlyAndAppendedTo) {
  ckptd::testing::TempDir dir("ckptd_audit_");
  const std::string path = dir.Sub("audit.jsonl");
  std::ofstream(path) << "{\"earlier\":true}\n";
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ckptd::testing::CapturingLogger log;
  AuditLogOptions ao;
  ao.path = path;
  ao.logger = &log;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> audit, AuditLog::Open(ao));
    AuditRecord r;
    r.action = "RequestCheckpoint";
    audit->Record(r);
  }  // the destructor writes what is queued
  const std::vector<std::string> lines = LinesOf(path);
  ASSERT_THAT(lines, SizeIs(2));
  EXPECT_EQ(lines[0], "{\"earlier\":true}");
  EXPECT_THAT(lines[1], HasSubstr("\"action\":\"RequestCheckpoint\""));

  const std::string fresh = dir.Sub("new.jsonl");
  ao.path = fresh;
  const mode_t old_mask = ::umask(0);
  absl::StatusOr<std::unique_ptr<AuditLog>> created = AuditLog::Open(ao);
  ::umask(old_mask);
  ASSERT_THAT(created.status(), IsOk());
  struct stat st;
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(AuditLogTest, ALinkOrASpecialFileIsRefused) {
  ckptd::testing::TempDir dir("ckptd_audit_");
  const std::string target = dir.Sub("elsewhere");
  std::ofstream(target) << "precious\n";
  const std::string link = dir.Sub("audit.jsonl");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  AuditLogOptions ao;
  ao.path = link;
  EXPECT_THAT(AuditLog::Open(ao).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr(link), HasSubstr("symbolic link"))));
  // A dangling link too: nothing is created through it.
  const std::string dangling = dir.Sub("dangling.jsonl");
  ASSERT_EQ(::symlink(dir.Sub("nowhere").c_str(), dangling.c_str()), 0);
  ao.path = dangling;
  EXPECT_THAT(AuditLog::Open(ao).status(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_NE(::access(dir.Sub("nowhere").c_str(), F_OK), 0);
  EXPECT_THAT(LinesOf(target), ::testing::ElementsAre("precious"));

  const std::string fifo = dir.Sub("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ao.path = fifo;
  EXPECT_THAT(AuditLog::Open(ao).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a regular file")));
  ao.path = dir.path();
  EXPECT_THAT(AuditLog::Open(ao).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a regular file")));
  ao.path = dir.Sub("no-such-dir/audit.jsonl");
  EXPECT_THAT(AuditLog::Open(ao).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-dir")));
}

// The file stops taking records (here: past the process's file size limit,
// as a full disk would): every call is still served, each record is still
// logged, and the lost ones are counted and said.
TEST_F(AuditTest, AnUnwritableAuditFileDoesNotStopService) {
  Register("node-a", {0});
  ASSERT_THAT(Records(), SizeIs(1));
  struct sigaction ignore = {}, before = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &before), 0);
  struct rlimit limit, full;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &full), 0);
  struct stat st;
  ASSERT_EQ(::stat(AuditPath().c_str(), &st), 0);
  limit = full;
  limit.rlim_cur = static_cast<rlim_t>(st.st_size);  // not a byte more
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);

  Register("node-b", {1});
  ckptd::v1::RequestCheckpointRequest manual;
  manual.set_job(kJob);
  EXPECT_THAT(Call(&Stub::RequestCheckpoint, manual, absl::StrCat("Bearer ", kOperatorToken)).status(), IsOk());
  EXPECT_THAT(AgentCall(&Stub::ReportFailure, FailureRequest("node-a", 0, ckptd::v1::TRAINER_DIED)).status(), IsOk());
  EXPECT_TRUE(audit_->Flush());
  EXPECT_EQ(counts_.write_errors_, 3);
  EXPECT_TRUE(log_.Contains("audit: write audit log"));
  EXPECT_TRUE(log_.Contains("\"action\":\"RequestCheckpoint\""));  // its log line stands
  EXPECT_THAT(LinesOf(AuditPath()), SizeIs(1));
  EXPECT_EQ(Status().agents_size(), 2);

  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &full), 0);
  ASSERT_EQ(::sigaction(SIGXFSZ, &before, nullptr), 0);
  Register("node-c", {});
  EXPECT_THAT(Records(), SizeIs(2));
  EXPECT_TRUE(log_.Contains("writing to"));
}

}  // namespace
}  // namespace ckptd::coordinator
