// Mutual TLS between the coordinator and its clients, with a throw-away CA
// made by `openssl` at test time (skipped when openssl is not on PATH).
#include "rpc/tls.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/env.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "storage/mem_file_system.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::rpc::FromGrpcStatus;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

using ::ckptd::testing::FindOnPath;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Makes, in `dir`: ca.pem/ca.key (the test CA), server.pem/key (localhost,
// 127.0.0.1), client.pem/key (common name node-a), san-client.pem/key (common
// name ckptd-agent, subject alternative names node-s and node-t),
// odd-client.pem/key (common name node-a"x), all three nodes' (OU=ckptd-node),
// operator-client.pem/key (common name node-a, OU=ckptd-operator), and other-ca.pem with
// rogue-client.pem/key signed by that other CA. Returns "" or openssl's output.
std::string MakeCertificates(const std::string& openssl, const std::string& dir) {
  const std::string o = absl::StrCat("'", openssl, "'");
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string ca_ext = "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign";
  const std::string script = absl::StrCat(
      "set -e; cd '", dir, "'\n",
      o, " req -x509 ", ec, " -keyout ca.key -out ca.pem -days 2 -subj /CN=ckptd-test-ca ", ca_ext, "\n",
      o, " req -x509 ", ec, " -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=ckptd-other-ca ", ca_ext, "\n",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext\n",
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n",
      o, " req ", ec, " -keyout server.key -out server.csr -subj /CN=localhost\n",
      o, " x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2",
      " -extfile server.ext\n",
      o, " req ", ec, " -keyout client.key -out client.csr -subj /CN=node-a/OU=ckptd-node\n",
      o, " x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2",
      " -extfile client.ext\n",
      "printf 'subjectAltName=DNS:node-s,DNS:node-t\\nextendedKeyUsage=clientAuth\\n' > san-client.ext\n",
      o, " req ", ec, " -keyout san-client.key -out san-client.csr -subj /CN=ckptd-agent/OU=ckptd-node\n",
      o, " x509 -req -in san-client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out san-client.pem -days 2",
      " -extfile san-client.ext\n",
      o, " req ", ec, " -keyout odd-client.key -out odd-client.csr -subj '/CN=node-a\"x/OU=ckptd-node'\n",
      o, " x509 -req -in odd-client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out odd-client.pem -days 2",
      " -extfile client.ext\n",
      // An operator's certificate that happens to carry a node's name.
      o, " req ", ec, " -keyout operator-client.key -out operator-client.csr -subj /CN=node-a/OU=ckptd-operator\n",
      o, " x509 -req -in operator-client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out operator-client.pem",
      " -days 2 -extfile client.ext\n",
      o, " req ", ec, " -keyout rogue-client.key -out rogue-client.csr -subj /CN=rogue\n",
      o, " x509 -req -in rogue-client.csr -CA other-ca.pem -CAkey other-ca.key -CAcreateserial",
      " -out rogue-client.pem -days 2 -extfile client.ext\n");
  const std::string script_path = dir + "/make-certs.sh";
  std::ofstream(script_path) << script;
  const std::string log = dir + "/openssl.log";
  const int rc = std::system(absl::StrCat("sh '", script_path, "' > '", log, "' 2>&1").c_str());
  if (rc == 0) return "";
  return absl::StrCat("openssl failed (", rc, "):\n", ReadAll(log));
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string openssl = FindOnPath("openssl");
    if (openssl.empty()) {
      GTEST_SKIP() << "openssl is not on PATH (Debian package openssl; scripts/install-deps.sh installs it)";
    }
    char tmpl[] = "/tmp/ckptd-tls-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::string failed = MakeCertificates(openssl, dir_);
    ASSERT_EQ(failed, "");

    core_ = std::make_unique<CoordinatorCore>(&store_, state_.get(), &clock_, CoordinatorOptions());
    CKPTD_ASSERT_OK(core_->Recover());
    AuditLogOptions audit_options;
    audit_options.logger = &audit_lines_;
    CKPTD_ASSERT_OK_AND_ASSIGN(audit_, AuditLog::Open(audit_options));
    service_ = std::make_unique<CoordinatorService>(
        core_.get(),
        CoordinatorServiceOptions{.operator_token = "t", .agent_token = kAgentToken, .audit_log = audit_.get()});
    CKPTD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ServerCredentials> creds,
                               rpc::ServerCredentialsFromFiles({File("server.pem"), File("server.key"), File("ca.pem")}));
    CKPTD_ASSERT_OK_AND_ASSIGN(server_, StartCoordinatorServer("127.0.0.1:0", service_.get(), creds));
  }
  void TearDown() override {
    ShutdownCoordinatorServer(server_.server.get());
    service_.reset();
    core_.reset();
    if (!dir_.empty()) {
      const int rc = std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
      (void)rc;  // a temp dir left behind fails nothing
    }
  }

  std::string File(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  // GetClusterStatus over a channel with `creds`, naming the server "localhost".
  absl::Status Probe(std::shared_ptr<grpc::ChannelCredentials> creds) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_.port), creds, args);
    std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = ckptd::v1::Coordinator::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ckptd::v1::GetClusterStatusResponse resp;
    return FromGrpcStatus(stub->GetClusterStatus(&ctx, ckptd::v1::GetClusterStatusRequest(), &resp));
  }

  // Client credentials presenting `name`.pem/key.
  std::shared_ptr<grpc::ChannelCredentials> Client(const std::string& name) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        rpc::ChannelCredentialsFromFiles({File(name + ".pem"), File(name + ".key"), File("ca.pem")});
    EXPECT_THAT(creds.status(), IsOk());
    return creds.ok() ? *creds : nullptr;
  }

  std::unique_ptr<ckptd::v1::Coordinator::Stub> StubWith(std::shared_ptr<grpc::ChannelCredentials> creds) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return ckptd::v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_.port), creds, args));
  }

  // Registers `node` (rank 0 of a 1-rank job) over a channel with `creds`,
  // with `authorization` metadata unless it is empty.
  absl::Status RegisterAs(std::shared_ptr<grpc::ChannelCredentials> creds, const std::string& node,
                          const std::string& authorization = "") {
    std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = StubWith(std::move(creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id(node);
    ckptd::v1::RankInfo* rank = req.add_ranks();
    rank->set_job(absl::StrCat("job-", node));
    rank->set_world_size(1);
    rank->set_pid(1000);
    ckptd::v1::RegisterAgentResponse resp;
    return FromGrpcStatus(stub->RegisterAgent(&ctx, req, &resp));
  }

  // The ids of the registered agents.
  std::vector<std::string> Agents() {
    std::vector<std::string> out;
    const ckptd::v1::GetClusterStatusResponse status = core_->ClusterStatus();
    for (const auto& a : status.agents()) out.push_back(a.node_id());
    return out;
  }

  static constexpr char kAgentToken[] = "agent-token-for-tls";

  std::string dir_;
  storage::MemFileSystem fs_;
  storage::CheckpointStore store_{&fs_, "/ckpt"};
  std::unique_ptr<StateStore> state_ = NewMemStateStore();
  base::RealClock clock_;
  ::ckptd::testing::CapturingLogger audit_lines_;  // the audit trail's log lines
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<CoordinatorCore> core_;
  std::unique_ptr<CoordinatorService> service_;
  CoordinatorServer server_;
};

TEST_F(TlsTest, AgentWithAClientCertificateConnects) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ChannelCredentials> creds,
                             rpc::ChannelCredentialsFromFiles({File("client.pem"), File("client.key"), File("ca.pem")}));
  EXPECT_THAT(Probe(creds), IsOk());
}

TEST_F(TlsTest, ClientWithoutACertificateIsRefused) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ChannelCredentials> creds,
                             rpc::ChannelCredentialsFromFiles({"", "", File("ca.pem")}));
  EXPECT_THAT(Probe(creds), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(TlsTest, ClientCertificateOfAnotherCaIsRefused) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<grpc::ChannelCredentials> creds,
      rpc::ChannelCredentialsFromFiles({File("rogue-client.pem"), File("rogue-client.key"), File("ca.pem")}));
  EXPECT_THAT(Probe(creds), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

// Connections that connect and never start TLS are closed at the handshake
// timeout, each freeing its file; a real client still gets in.
TEST_F(TlsTest, ConnectionsThatNeverFinishTheirHandshakeAreClosed) {
  CoordinatorService second(core_.get(), CoordinatorServiceOptions{.operator_token = "t", .agent_token = kAgentToken});
  CKPTD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ServerCredentials> creds,
                             rpc::ServerCredentialsFromFiles({File("server.pem"), File("server.key"), File("ca.pem")}));
  CKPTD_ASSERT_OK_AND_ASSIGN(CoordinatorServer quick,
                             StartCoordinatorServer("127.0.0.1:0", &second, creds, absl::Seconds(2)));
  std::vector<int> silent;
  for (int i = 0; i < 50; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(quick.port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    silent.push_back(fd);
  }
  const absl::Time start = absl::Now();
  int closed = 0;
  for (int fd : silent) {
    pollfd p = {fd, POLLIN, 0};
    const absl::Duration left = absl::Seconds(8) - (absl::Now() - start);
    char byte;
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(left)))) == 1 &&
        ::recv(fd, &byte, 1, 0) <= 0) {
      ++closed;
    }
    ::close(fd);
  }
  // At 2 s, well before the 8 s waited for (gRPC's own default is 120 s).
  EXPECT_EQ(closed, 50);
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = ckptd::v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", quick.port), Client("client"), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ckptd::v1::GetClusterStatusResponse resp;
  EXPECT_THAT(FromGrpcStatus(stub->GetClusterStatus(&ctx, ckptd::v1::GetClusterStatusRequest(), &resp)), IsOk());
  ShutdownCoordinatorServer(quick.server.get());
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  EXPECT_THAT(Probe(grpc::InsecureChannelCredentials()), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(TlsTest, ServerOfAnotherCaIsNotTrusted) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<grpc::ChannelCredentials> creds,
      rpc::ChannelCredentialsFromFiles({File("client.pem"), File("client.key"), File("other-ca.pem")}));
  EXPECT_THAT(Probe(creds), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

// Issue 16: a certificate is the credential of the node it names, and of no other.
TEST_F(TlsTest, ACertificateSpeaksForTheNodeItNamesOnly) {
  // Common name node-a.
  EXPECT_THAT(RegisterAs(Client("client"), "node-a"), IsOk());
  EXPECT_THAT(RegisterAs(Client("client"), "node-b"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       ::testing::AllOf(HasSubstr("RegisterAgent: the client certificate names \"node-a\""),
                                        HasSubstr("not node \"node-b\""))));
  // Subject alternative names node-s and node-t (common name ckptd-agent).
  EXPECT_THAT(RegisterAs(Client("san-client"), "node-s"), IsOk());
  EXPECT_THAT(RegisterAs(Client("san-client"), "node-t"), IsOk());
  EXPECT_THAT(RegisterAs(Client("san-client"), "node-a"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("\"node-s\", \"node-t\"")));
  // A name with a quote in it is escaped, not taken for the end of the name.
  EXPECT_THAT(RegisterAs(Client("odd-client"), "node-a"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("names \"node-a\\\"x\"")));
  EXPECT_THAT(Agents(), ::testing::UnorderedElementsAre("node-a", "node-s", "node-t"));

  // A heartbeat for another node ends the stream.
  std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = StubWith(Client("client"));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->Heartbeats(&ctx);
  ckptd::v1::Heartbeat hb;
  hb.set_node_id("node-a");
  ASSERT_TRUE(stream->Write(hb));
  ckptd::v1::HeartbeatAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  hb.set_node_id("node-b");
  ASSERT_TRUE(stream->Write(hb));
  EXPECT_FALSE(stream->Read(&ack));
  EXPECT_THAT(FromGrpcStatus(stream->Finish()),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("Heartbeats: the client certificate names")));
}

// An operator's certificate of the same CA is no node's credential, even
// when its name is the node's.
TEST_F(TlsTest, AnOperatorsCertificateIsNoNodes) {
  EXPECT_THAT(RegisterAs(Client("operator-client"), "node-a"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       ::testing::AllOf(HasSubstr("names node \"node-a\" but is no node's"),
                                        HasSubstr("OU=ckptd-operator"), HasSubstr("has no OU=ckptd-node"))));
  EXPECT_THAT(Agents(), ::testing::IsEmpty());
  // With the agent token it may act as any node, as the token may.
  EXPECT_THAT(RegisterAs(Client("operator-client"), "node-a", absl::StrCat("Bearer ", kAgentToken)), IsOk());
}

TEST(SubjectNamesUnitTest, OnlyAWholeOrganizationalUnit) {
  EXPECT_TRUE(rpc::SubjectNamesUnit("CN=node-01,OU=ckptd-node", "ckptd-node"));
  EXPECT_TRUE(rpc::SubjectNamesUnit("OU=ckptd-node,CN=node-01,O=Example", "ckptd-node"));
  EXPECT_TRUE(rpc::SubjectNamesUnit("CN=node-01+OU=ckptd-node", "ckptd-node"));
  EXPECT_FALSE(rpc::SubjectNamesUnit("CN=node-01,OU=ckptd-nodes", "ckptd-node"));
  EXPECT_FALSE(rpc::SubjectNamesUnit("CN=OU=ckptd-node", "ckptd-node"));
  EXPECT_FALSE(rpc::SubjectNamesUnit("CN=a\\,OU=ckptd-node", "ckptd-node"));  // an escaped comma is the name's
  EXPECT_FALSE(rpc::SubjectNamesUnit("", "ckptd-node"));
}

TEST_F(TlsTest, TheAgentTokenSpeaksForAnyNodeOverTls) {
  EXPECT_THAT(RegisterAs(Client("client"), "node-b", absl::StrCat("Bearer ", kAgentToken)), IsOk());
  // A token that is presented decides, even beside a certificate naming the node.
  EXPECT_THAT(RegisterAs(Client("client"), "node-a", "Bearer wrong"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("agent token is wrong")));
  // The operator token is no agent credential.
  EXPECT_THAT(RegisterAs(Client("client"), "node-c", "Bearer t"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("agent token is wrong")));
  EXPECT_THAT(Agents(), ::testing::ElementsAre("node-b"));
}

// The audit trail names the certificate a call came with, whether it let
// the call in or not, and beside a token.
TEST_F(TlsTest, AuditRecordsNameTheClientCertificate) {
  EXPECT_THAT(RegisterAs(Client("client"), "node-a"), IsOk());
  EXPECT_THAT(RegisterAs(Client("san-client"), "node-a"), StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(RegisterAs(Client("san-client"), "node-b", absl::StrCat("Bearer ", kAgentToken)), IsOk());
  std::vector<std::string> records;
  for (const std::string& line : audit_lines_.lines()) {
    if (absl::StartsWith(line, "audit: ")) records.push_back(line);
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_THAT(records[0], ::testing::AllOf(HasSubstr("\"outcome\":\"granted\""),
                                           HasSubstr("\"credential\":\"client-certificate\""),
                                           HasSubstr("\"tls_names\":[\"node-a\"]"), HasSubstr("\"node\":\"node-a\"")));
  EXPECT_THAT(records[1], ::testing::AllOf(HasSubstr("\"outcome\":\"refused\""),
                                           HasSubstr("\"credential\":\"client-certificate\""),
                                           HasSubstr("\"tls_names\":[\"ckptd-agent\",\"node-s\",\"node-t\"]"),
                                           HasSubstr("\"node\":\"node-a\"")));
  EXPECT_THAT(records[2], ::testing::AllOf(HasSubstr("\"outcome\":\"granted\""),
                                           HasSubstr("\"credential\":\"agent-token\""),
                                           HasSubstr("\"tls_names\":[\"ckptd-agent\",\"node-s\",\"node-t\"]"),
                                           HasSubstr("\"node\":\"node-b\"")));
}

TEST_F(TlsTest, MissingOrBadFilesAreClearErrors) {
  const std::string missing = File("nope.pem");
  EXPECT_THAT(rpc::ServerCredentialsFromFiles({missing, File("server.key"), File("ca.pem")}),
              StatusIs(absl::StatusCode::kNotFound, ::testing::AllOf(HasSubstr("--tls-cert"), HasSubstr(missing))));
  EXPECT_THAT(rpc::ServerCredentialsFromFiles({File("server.pem"), File("server.key"), ""}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-ca: no file given")));
  std::ofstream(File("junk.pem")) << "not a certificate\n";
  EXPECT_THAT(rpc::ServerCredentialsFromFiles({File("server.pem"), File("junk.pem"), File("ca.pem")}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds no PEM block")));
  EXPECT_THAT(rpc::ServerCredentialsFromFiles({File("server.pem"), File("server.key"), dir_}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
  EXPECT_THAT(rpc::ChannelCredentialsFromFiles({File("client.pem"), "", File("ca.pem")}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("both --tls-cert and --tls-key")));
  EXPECT_THAT(rpc::ChannelCredentialsFromFiles({"", "", missing}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(File("client.key").c_str(), 0), 0);
    EXPECT_THAT(rpc::ChannelCredentialsFromFiles({File("client.pem"), File("client.key"), File("ca.pem")}),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("client.key")));
  }
}

TEST_F(TlsTest, KeyThatDoesNotMatchTheCertificateFailsAtStart) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ServerCredentials> creds,
                             rpc::ServerCredentialsFromFiles({File("server.pem"), File("client.key"), File("ca.pem")}));
  EXPECT_THAT(StartCoordinatorServer("127.0.0.1:0", service_.get(), creds),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("TLS files")));
}

}  // namespace
}  // namespace ckptd::coordinator
