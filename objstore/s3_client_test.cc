// S3Client against a loopback HTTP server that answers what a test tells
// it to: the answers a real store gives rarely or not on demand (an expired
// session token, a server that stops answering, a 500 that persists, a
// truncated listing). What a real store does is in object_file_system_test
// (against the tests' RGW).
#include "objstore/s3_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::objstore {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "SECRETvalue0123456789abcdefghijklmnopqrst";
constexpr char kToken[] = "SESSIONtoken-FQoGZXIvYXdzEJr";

// One HTTP/1.1 server on 127.0.0.1 that answers every request with what
// `answer` returns for its text (headers and body), closing the connection
// after each; nullopt: never answers (holds the connection until stopped).
class CannedServer {
 public:
  using Answer = std::function<std::optional<std::string>(const std::string& request)>;

  explicit CannedServer(Answer answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd_, 64) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on loopback";
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~CannedServer() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    for (int c : held_) ::close(c);
    if (fd_ >= 0) ::close(fd_);
  }

  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  std::vector<std::string> requests() {
    absl::MutexLock l(&mu_);
    return requests_;
  }

  // An S3 error answer.
  static std::string Error(int status, const std::string& reason, const std::string& code, const std::string& msg) {
    const std::string body = absl::StrCat("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>", code,
                                          "</Code><Message>", msg, "</Message><RequestId>1</RequestId></Error>");
    return Reply(status, reason, body);
  }
  static std::string Reply(int status, const std::string& reason, const std::string& body) {
    return absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: application/xml\r\nContent-Length: ",
                        body.size(), "\r\nConnection: close\r\n\r\n", body);
  }

 private:
  void Serve() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string request = ReadRequest(c);
      {
        absl::MutexLock l(&mu_);
        requests_.push_back(request);
      }
      std::optional<std::string> reply = answer_(request);
      if (!reply) {
        held_.push_back(c);
        continue;
      }
      for (size_t at = 0; at < reply->size();) {
        const ssize_t n = ::send(c, reply->data() + at, reply->size() - at, MSG_NOSIGNAL);
        if (n <= 0) break;
        at += static_cast<size_t>(n);
      }
      ::close(c);
    }
  }

  // The request's head and its Content-Length of body.
  std::string ReadRequest(int c) {
    std::string in;
    char buf[4096];
    size_t want = std::string::npos;
    while (!stop_.load() && (want == std::string::npos || in.size() < want)) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (n <= 0) break;
      in.append(buf, static_cast<size_t>(n));
      const size_t end = in.find("\r\n\r\n");
      if (want == std::string::npos && end != std::string::npos) {
        uint64_t length = 0;
        const std::string lower = absl::AsciiStrToLower(in.substr(0, end));
        if (const size_t at = lower.find("\r\ncontent-length:"); at != std::string::npos) {
          (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(lower.substr(at + 17, lower.find("\r\n", at + 2) - at - 17)),
                                 &length);
        }
        want = end + 4 + length;
      }
    }
    return in;
  }

  Answer answer_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<int> held_;  // connections left unanswered (the server thread's)
  absl::Mutex mu_;
  std::vector<std::string> requests_ ABSL_GUARDED_BY(mu_);
};

S3Options OptionsFor(const CannedServer& server) {
  S3Options o;
  o.endpoint = server.endpoint();
  o.addressing = Addressing::kPath;
  o.credentials.access_key_id = "AKIDTESTKEYID0000001";
  o.credentials.secret_access_key = kSecret;
  o.credentials.session_token = kToken;
  o.credentials.source = "test";
  o.base_backoff = absl::Milliseconds(5);
  o.max_backoff = absl::Milliseconds(20);
  return o;
}

std::unique_ptr<S3Client> ClientFor(const S3Options& options) {
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

// No error text may hold the secret key or the session token.
auto WithoutSecrets() { return AllOf(Not(HasSubstr(kSecret)), Not(HasSubstr(kToken))); }

TEST(S3ClientTest, AnExpiredSessionTokenIsAnAuthenticationErrorAtOnceWithoutSecrets) {
  CannedServer server([](const std::string&) {
    return CannedServer::Error(400, "Bad Request", "ExpiredToken", "The provided token has expired.");
  });
  std::unique_ptr<S3Client> client = ClientFor(OptionsFor(server));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> got = client->Get("ckpt", "job/step-1/MANIFEST");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnauthenticated) << got.status();
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr("ExpiredToken"), HasSubstr("token has expired"),
                                            HasSubstr("ckpt/job/step-1/MANIFEST"), WithoutSecrets()));
  // Not retried: new credentials, not patience, fix it.
  const std::vector<std::string> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  // The token went as the header SigV4 signs; the secret never went at all.
  EXPECT_THAT(absl::AsciiStrToLower(requests[0]), HasSubstr(absl::AsciiStrToLower(absl::StrCat("x-amz-security-token: ", kToken))));
  EXPECT_THAT(requests[0], Not(HasSubstr(kSecret)));
  EXPECT_THAT(requests[0], HasSubstr("x-amz-content-sha256: UNSIGNED-PAYLOAD"));
}

TEST(S3ClientTest, RefusedCredentialsArePermissionOrAuthenticationErrors) {
  for (const auto& [code, want] : std::vector<std::pair<std::string, absl::StatusCode>>{
           {"AccessDenied", absl::StatusCode::kPermissionDenied},
           {"SignatureDoesNotMatch", absl::StatusCode::kUnauthenticated},
           {"InvalidAccessKeyId", absl::StatusCode::kUnauthenticated}}) {
    CannedServer server([code = code](const std::string&) {
      return CannedServer::Error(403, "Forbidden", code, "refused");
    });
    std::unique_ptr<S3Client> client = ClientFor(OptionsFor(server));
    ASSERT_NE(client, nullptr);
    absl::StatusOr<std::string> got = client->Get("ckpt", "a");
    EXPECT_EQ(got.status().code(), want) << got.status();
    EXPECT_THAT(got.status().message(), AllOf(HasSubstr(code), WithoutSecrets()));
    EXPECT_EQ(server.requests().size(), 1u) << code;
  }
}

TEST(S3ClientTest, AServerThatStopsAnsweringIsAnErrorNamingTheKeyNotAHang) {
  CannedServer server([](const std::string&) { return std::nullopt; });
  S3Options options = OptionsFor(server);
  options.low_speed_time = absl::Seconds(1);
  options.max_attempts = 2;
  std::unique_ptr<S3Client> client = ClientFor(options);
  ASSERT_NE(client, nullptr);
  std::string buf(100, '\0');
  absl::Status got = client->GetRange("ckpt", "job/step-7/rank-3.shard", 0, buf.size(), buf.data());
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
  EXPECT_THAT(got.message(), AllOf(HasSubstr("ckpt/job/step-7/rank-3.shard"), HasSubstr("failed 2 times"),
                                   WithoutSecrets()));
  EXPECT_EQ(server.requests().size(), 2u);
}

TEST(S3ClientTest, AnInternalErrorThatPersistsIsRetriedABoundedNumberOfTimes) {
  CannedServer server([](const std::string&) {
    return CannedServer::Error(500, "Internal Server Error", "InternalError", "We encountered an internal error.");
  });
  S3Options options = OptionsFor(server);
  options.max_attempts = 3;
  std::unique_ptr<S3Client> client = ClientFor(options);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> put = client->Put("ckpt", "job/step-2/MANIFEST", "payload");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable) << put.status();
  EXPECT_THAT(put.status().message(), AllOf(HasSubstr("HTTP 500"), HasSubstr("InternalError"),
                                            HasSubstr("ckpt/job/step-2/MANIFEST"), HasSubstr("failed 3 times")));
  EXPECT_EQ(server.requests().size(), 3u);
  EXPECT_EQ(client->stats().retries, 2u);
}

TEST(S3ClientTest, ATruncatedListingOrAnErrorInsideA200IsAnErrorNotAnEmptyAnswer) {
  CannedServer lists([](const std::string&) {
    return CannedServer::Reply(200, "OK",
                               "<?xml version=\"1.0\"?><ListBucketResult><Name>ckpt</Name><Contents><Key>job/st");
  });
  std::unique_ptr<S3Client> client = ClientFor(OptionsFor(lists));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ListResult> listed = client->List("ckpt", "job/");
  EXPECT_FALSE(listed.ok());
  EXPECT_THAT(listed.status().message(), HasSubstr("ckpt"));

  // CompleteMultipartUpload may fail after its 200 OK has been sent: the
  // error is in the body.
  CannedServer completes([](const std::string&) {
    return CannedServer::Reply(200, "OK",
                               "<?xml version=\"1.0\"?><Error><Code>InternalError</Code>"
                               "<Message>We encountered an internal error.</Message></Error>");
  });
  S3Options options = OptionsFor(completes);
  options.max_attempts = 2;
  client = ClientFor(options);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> done = client->CompleteUpload("ckpt", "job/step-3/rank-0.shard", "upload-1",
                                                            {CompletedPart{1, "\"etag-1\""}});
  EXPECT_FALSE(done.ok());
  EXPECT_THAT(done.status().message(), AllOf(HasSubstr("InternalError"), HasSubstr("ckpt/job/step-3/rank-0.shard")));
}

}  // namespace
}  // namespace ckptd::objstore
