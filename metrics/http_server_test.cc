#include "metrics/http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"

namespace ckptd::metrics {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A connected client socket, closed on destruction.
class Client {
 public:
  // Connects to `host`:`port`, trying each address of `host`.
  static Client Connect(const char* host, int port) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    Client c;
    if (getaddrinfo(host, std::to_string(port).c_str(), &hints, &addrs) != 0) return c;
    for (const addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        c.fd_ = fd;
        break;
      }
      close(fd);
    }
    freeaddrinfo(addrs);
    // Bounds every read so a hanging server fails the test instead of hanging it.
    timeval tv{30, 0};
    if (c.fd_ >= 0) setsockopt(c.fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return c;
  }
  Client() = default;
  Client(Client&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }

  bool connected() const { return fd_ >= 0; }
  bool Send(absl::string_view data) {
    while (!data.empty()) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  // Everything until the server closes (or the 30 s receive timeout).
  std::string ReadAll() {
    std::string out;
    char buf[4096];
    while (true) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

 private:
  int fd_ = -1;
};

std::string Exchange(int port, absl::string_view request, const char* host = "127.0.0.1") {
  Client c = Client::Connect(host, port);
  if (!c.connected()) return "<connect failed>";
  c.Send(request);
  return c.ReadAll();
}

std::string Body(absl::string_view response) {
  const size_t end = response.find("\r\n\r\n");
  return end == absl::string_view::npos ? "" : std::string(response.substr(end + 4));
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<CounterFamily*> c = registry_.AddCounter("ckptd_test_total", "A test counter.", {"job"});
    ASSERT_THAT(c, IsOk());
    (*c)->With({"a"})->Increment(3);
  }
  std::unique_ptr<HttpServer> StartServer(HttpServerOptions options = {}) {
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start("127.0.0.1:0", MetricsHandler(registry_), options);
    EXPECT_THAT(server, IsOk());
    if (!server.ok()) return nullptr;
    EXPECT_GT((*server)->port(), 0);
    return *std::move(server);
  }

  Registry registry_;
};

TEST_F(HttpServerTest, ServesMetrics) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string response =
      Exchange(server->port(), "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
  const std::string body = registry_.Render();
  EXPECT_EQ(response, absl::StrCat("HTTP/1.1 200 OK\r\n"
                                   "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                                   "Content-Length: ",
                                   body.size(),
                                   "\r\n"
                                   "Connection: close\r\n"
                                   "\r\n",
                                   body));
  EXPECT_THAT(body, HasSubstr("ckptd_test_total{job=\"a\"} 3\n"));
}

TEST_F(HttpServerTest, AcceptsHttp10BareLineFeedsQueryAndAbsoluteForm) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const char* request : {"GET /metrics HTTP/1.0\r\n\r\n", "GET /metrics HTTP/1.1\n\n",
                              "GET /metrics?name[]=x HTTP/1.1\r\n\r\n",
                              "GET http://example.com:9090/metrics HTTP/1.1\r\n\r\n"}) {
    const std::string response = Exchange(server->port(), request);
    EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n")) << request;
    EXPECT_THAT(response, HasSubstr("ckptd_test_total{job=\"a\"} 3\n")) << request;
  }
}

TEST_F(HttpServerTest, HeadHasHeadersButNoBody) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string response = Exchange(server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr(absl::StrCat("Content-Length: ", registry_.Render().size(), "\r\n")));
  EXPECT_THAT(response, EndsWith("\r\n\r\n"));
}

TEST_F(HttpServerTest, HealthzSaysOk) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string response = Exchange(server->port(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(response), "ok\n");
}

TEST_F(HttpServerTest, UnknownPathIs404) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const char* request : {"GET / HTTP/1.1\r\n\r\n", "GET /metricsx HTTP/1.1\r\n\r\n",
                              "GET /metrics/ HTTP/1.1\r\n\r\n", "GET http://host HTTP/1.1\r\n\r\n"}) {
    const std::string response = Exchange(server->port(), request);
    EXPECT_THAT(response, StartsWith("HTTP/1.1 404 Not Found\r\n")) << request;
    EXPECT_THAT(response, HasSubstr("Connection: close\r\n")) << request;
    EXPECT_EQ(Body(response), "404 Not Found\n") << request;
  }
}

TEST_F(HttpServerTest, OtherMethodsAre405) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const char* request : {"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
                              "DELETE /metrics HTTP/1.1\r\n\r\n", "OPTIONS * HTTP/1.1\r\n\r\n",
                              "get /metrics HTTP/1.1\r\n\r\n"}) {
    const std::string response = Exchange(server->port(), request);
    EXPECT_THAT(response, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n")) << request;
    EXPECT_THAT(response, HasSubstr("\r\nAllow: GET, HEAD\r\n")) << request;
  }
}

TEST_F(HttpServerTest, MalformedRequestLinesAre400) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const char* request :
       {"\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET  /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1 extra\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n", "GET /metrics FTP/1.0\r\n\r\n",
        "G(T /metrics HTTP/1.1\r\n\r\n", "GET /met\x01rics HTTP/1.1\r\n\r\n"}) {
    EXPECT_THAT(Exchange(server->port(), request), StartsWith("HTTP/1.1 400 Bad Request\r\n")) << request;
  }
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/2.0\r\n\r\n"),
              StartsWith("HTTP/1.1 505 HTTP Version Not Supported\r\n"));
}

TEST_F(HttpServerTest, OversizedRequestIs431) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  // Headers that never end...
  EXPECT_THAT(Exchange(server->port(), absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(64 * 1024, 'a'))),
              StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  // ... and complete ones just over the limit.
  const std::string request = absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(8192, 'a'), "\r\n\r\n");
  EXPECT_THAT(Exchange(server->port(), request), StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  // The server still serves.
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServerTest, SurvivesGarbage) {
  HttpServerOptions options;
  options.request_timeout = absl::Milliseconds(50);
  std::unique_ptr<HttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> length(1, 3000);
  for (int round = 0; round < 40; ++round) {
    std::string garbage(static_cast<size_t>(length(rng)), '\0');
    for (char& ch : garbage) ch = static_cast<char>(byte(rng));
    if (round % 2 == 0) garbage += "\r\n\r\n";  // a complete (nonsense) head
    const std::string response = Exchange(server->port(), garbage);
    // An error status; or, for a head that never ends, a silent close at the timeout.
    if (round % 2 == 0 || !response.empty()) {
      EXPECT_THAT(response, StartsWith("HTTP/1.1 4")) << round;
    }
  }
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServerTest, ClientThatClosesEarlyIsHarmless) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  for (int i = 0; i < 20; ++i) {
    Client c = Client::Connect("127.0.0.1", server->port());
    ASSERT_TRUE(c.connected());
    c.Send(i % 2 == 0 ? "GET /metr" : "GET /metrics HTTP/1.1\r\n\r\n");
  }  // closed without reading
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServerTest, SilentClientDoesNotBlockOthers) {
  std::unique_ptr<HttpServer> server = StartServer();  // default 10 s request timeout
  ASSERT_NE(server, nullptr);
  Client silent = Client::Connect("127.0.0.1", server->port());
  ASSERT_TRUE(silent.connected());
  Client partial = Client::Connect("127.0.0.1", server->port());
  ASSERT_TRUE(partial.connected());
  partial.Send("GET /metrics HTTP/1.1\r\nHost: x");
  const absl::Time start = absl::Now();
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(HttpServerTest, SilentClientIsClosedAtTheTimeout) {
  HttpServerOptions options;
  options.request_timeout = absl::Milliseconds(100);
  std::unique_ptr<HttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  Client silent = Client::Connect("127.0.0.1", server->port());
  ASSERT_TRUE(silent.connected());
  const absl::Time start = absl::Now();
  EXPECT_EQ(silent.ReadAll(), "");  // EOF, not the 30 s receive timeout
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitWaitTheirTurn) {
  HttpServerOptions options;
  options.request_timeout = absl::Milliseconds(200);
  options.max_connections = 1;
  std::unique_ptr<HttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  Client silent = Client::Connect("127.0.0.1", server->port());
  ASSERT_TRUE(silent.connected());
  // Served once the silent one has timed out.
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServerTest, StopDoesNotWaitForConnectedClients) {
  HttpServerOptions options;
  options.request_timeout = absl::Minutes(10);
  std::unique_ptr<HttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  Client idle = Client::Connect("127.0.0.1", port);
  ASSERT_TRUE(idle.connected());
  Client partial = Client::Connect("127.0.0.1", port);
  ASSERT_TRUE(partial.connected());
  partial.Send("GET /metr");
  absl::SleepFor(absl::Milliseconds(50));  // let the server accept them
  const absl::Time start = absl::Now();
  server->Stop();
  server->Stop();  // idempotent
  server.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(idle.ReadAll(), "");
  EXPECT_EQ(partial.ReadAll(), "");
  EXPECT_FALSE(Client::Connect("127.0.0.1", port).connected());
}

TEST_F(HttpServerTest, ListensOnLocalhostAndIpv6Loopback) {
  absl::StatusOr<std::unique_ptr<HttpServer>> local = HttpServer::Start("localhost:0", MetricsHandler(registry_));
  ASSERT_THAT(local, IsOk());
  EXPECT_THAT(Exchange((*local)->port(), "GET /metrics HTTP/1.1\r\n\r\n", "localhost"),
              StartsWith("HTTP/1.1 200 OK\r\n"));

  absl::StatusOr<std::unique_ptr<HttpServer>> v6 = HttpServer::Start("[::1]:0", MetricsHandler(registry_));
  if (!v6.ok() && (v6.status().code() == absl::StatusCode::kUnimplemented ||
                   v6.status().code() == absl::StatusCode::kInvalidArgument)) {
    GTEST_SKIP() << "no IPv6 loopback here: " << v6.status();
  }
  ASSERT_THAT(v6, IsOk());
  EXPECT_THAT(Exchange((*v6)->port(), "GET /metrics HTTP/1.1\r\n\r\n", "::1"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServerTest, PortInUseIsUnavailable) {
  std::unique_ptr<HttpServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(HttpServer::Start(absl::StrCat("127.0.0.1:", server->port()), MetricsHandler(registry_)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("Address already in use")));
}

TEST_F(HttpServerTest, CustomHandlerStatusAndContentType) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start("127.0.0.1:0", [](absl::string_view path) {
        if (path == "/bad") return HttpResponse{999, "text/plain\r\nX-Injected: 1", "x"};
        return HttpResponse{503, "application/json", "{}"};
      });
  ASSERT_THAT(server, IsOk());
  EXPECT_EQ(Exchange((*server)->port(), "GET /x HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
            "Connection: close\r\n\r\n{}");
  const std::string bad = Exchange((*server)->port(), "GET /bad HTTP/1.1\r\n\r\n");
  EXPECT_THAT(bad, StartsWith("HTTP/1.1 500 Internal Server Error\r\n"));
  EXPECT_THAT(bad, Not(HasSubstr("X-Injected")));
}

TEST(HttpServerStartTest, RefusesMalformedListenAddresses) {
  for (const char* bad : {"", "9090", "localhost", "localhost:", "host:65536", "host:-1", "host:+1", "host:9O",
                          "host:000009090", "::1:9090", "[::1]", "[::1]9090", "[::1", "[]:80", "a:b:80"}) {
    EXPECT_THAT(HttpServer::Start(bad, [](absl::string_view) { return HttpResponse{}; }),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_))
        << bad;
  }
}

}  // namespace
}  // namespace ckptd::metrics
