#include "metrics/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
  // Connects to `host`:`port`, trying each address of `host`. `timeout` bounds
  // the connect and every send and receive, so that a server that does not
  // answer fails the test instead of hanging it. `receive_buffer` > 0 sets
  // SO_RCVBUF before connecting (a small window: a slow reader).
  static Client Connect(const char* host, int port, absl::Duration timeout = absl::Seconds(30),
                        int receive_buffer = 0) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    Client c;
    if (getaddrinfo(host, std::to_string(port).c_str(), &hints, &addrs) != 0) return c;
    const timeval tv = absl::ToTimeval(timeout);
    for (const addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect() too
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      if (receive_buffer > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        c.fd_ = fd;
        break;
      }
      close(fd);
    }
    freeaddrinfo(addrs);
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
  // Whether the server has closed the connection (EOF or reset) by `deadline`,
  // without having sent anything.
  bool ClosedBy(absl::Time deadline) {
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      const int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      if (poll(&p, 1, ms) <= 0) return false;
      char ch;
      const ssize_t n = recv(fd_, &ch, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
      if (n > 0) return false;
    }
  }
  // Whether the connection is still open and nothing has arrived on it.
  bool OpenAndQuiet() {
    char ch;
    return recv(fd_, &ch, 1, MSG_DONTWAIT) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  // Everything until the server closes (or the receive timeout).
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

std::string Exchange(int port, absl::string_view request, const char* host = "127.0.0.1",
                     absl::Duration timeout = absl::Seconds(30)) {
  Client c = Client::Connect(host, port, timeout);
  if (!c.connected()) return "<connect failed>";
  c.Send(request);
  return c.ReadAll();
}

// A crowd of client sockets, opened with non-blocking connects so that a server
// that does not accept cannot hang the test; closed on destruction.
class Crowd {
 public:
  Crowd() = default;
  Crowd(const Crowd&) = delete;
  Crowd& operator=(const Crowd&) = delete;
  ~Crowd() {
    for (int fd : fds_) close(fd);
  }

  // Starts `n` connects to 127.0.0.1:`port`, waits until each is established
  // or `limit` has passed, then sends `first_bytes` on every established one.
  // Returns how many were established.
  int Open(int port, int n, absl::string_view first_bytes, absl::Duration limit) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::vector<pollfd> pending;
    for (int i = 0; i < n; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      fds_.push_back(fd);
      if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 || errno == EINPROGRESS) {
        pending.push_back({fd, POLLOUT, 0});
      }
    }
    std::vector<int> established;
    const absl::Time deadline = absl::Now() + limit;
    while (!pending.empty()) {
      const int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      if (poll(pending.data(), pending.size(), ms) <= 0) break;
      std::vector<pollfd> still;
      for (const pollfd& p : pending) {
        if (p.revents == 0) {
          still.push_back({p.fd, POLLOUT, 0});
          continue;
        }
        int error = 0;
        socklen_t len = sizeof(error);
        if (getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0) established.push_back(p.fd);
      }
      pending = std::move(still);
    }
    for (int fd : established) {
      if (!first_bytes.empty()) (void)send(fd, first_bytes.data(), first_bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    return static_cast<int>(established.size());
  }

 private:
  std::vector<int> fds_;
};

// Raises the soft limit on open files to at least `want` where the hard limit
// allows; returns the soft limit then in force.
rlim_t RaiseFileLimit(rlim_t want) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < want) {
    limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? want : std::min(want, limit.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur;
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

TEST_F(HttpServerTest, ReadyzSaysWhatIsMissingUntilReady) {
  std::atomic<bool> ready{false};
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      "127.0.0.1:0", MetricsHandler(registry_, [&ready] {
        return ready.load() ? std::string() : "not registered with the coordinator at c:7070: refused\nsecond line";
      }));
  ASSERT_THAT(server, IsOk());
  std::string response = Exchange((*server)->port(), "GET /readyz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  // One line, whatever the reason holds.
  EXPECT_EQ(Body(response), "not registered with the coordinator at c:7070: refused second line\n");
  // Liveness and metrics answer all the same.
  EXPECT_THAT(Exchange((*server)->port(), "GET /healthz HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(Exchange((*server)->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
  ready.store(true);
  response = Exchange((*server)->port(), "GET /readyz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(response), "ready\n");
  // Without a readiness check there is no /readyz.
  std::unique_ptr<HttpServer> plain = StartServer();
  ASSERT_NE(plain, nullptr);
  EXPECT_THAT(Exchange(plain->port(), "GET /readyz HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 Not Found\r\n"));
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

TEST_F(HttpServerTest, ConnectionsBeyondTheCapEvictTheOldestSilentOne) {
  HttpServerOptions options;
  options.header_timeout = absl::Minutes(10);  // only eviction can make room
  options.request_timeout = absl::Minutes(10);
  options.max_connections = 4;
  std::unique_ptr<HttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  std::vector<Client> silent;
  for (int i = 0; i < 4; ++i) {
    silent.push_back(Client::Connect("127.0.0.1", server->port(), absl::Seconds(5)));
    ASSERT_TRUE(silent.back().connected());
  }
  // The table is full of connections that never send; a new one is served at
  // once, and the oldest silent one makes room (the server accepts in the
  // listen backlog's order).
  const absl::Time start = absl::Now();
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n", "127.0.0.1", absl::Seconds(5)),
              StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(silent[0].ClosedBy(absl::Now() + absl::Seconds(5)));
  for (int i = 1; i < 4; ++i) EXPECT_TRUE(silent[i].OpenAndQuiet()) << i;
  // Many more than the cap, one after another: each is served.
  for (int i = 0; i < 20; ++i) {
    ASSERT_THAT(Exchange(server->port(), "GET /healthz HTTP/1.1\r\n\r\n", "127.0.0.1", absl::Seconds(5)),
                StartsWith("HTTP/1.1 200 OK\r\n"))
        << i;
  }
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
  // The server has accepted both: it serves a later connection, and it
  // accepts in the order the listen backlog keeps (first in, first out).
  EXPECT_THAT(Exchange(port, "GET /healthz HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
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

// The probe of issue 16 (item 8): hundreds of connections that send nothing
// or half a request line must not keep Prometheus' scrape out.
TEST_F(HttpServerTest, HundredsOfIdleAndHalfSentConnectionsDoNotStarveMetrics) {
  constexpr int kEach = 300;
  if (RaiseFileLimit(4096) < 2 * kEach + 200) GTEST_SKIP() << "the open-file limit is too low for this test";
  std::unique_ptr<HttpServer> server = StartServer();  // the defaults the coordinator runs with
  ASSERT_NE(server, nullptr);
  Crowd idle;
  Crowd half_sent;
  const int idle_open = idle.Open(server->port(), kEach, "", absl::Seconds(3));
  const int half_open = half_sent.Open(server->port(), kEach, "GET /metr", absl::Seconds(3));
  // Far more than the server holds at once, whether or not it accepts them.
  EXPECT_GE(idle_open + half_open, 2 * HttpServerOptions().max_connections);
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    ASSERT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n", "127.0.0.1", absl::Seconds(5)),
                StartsWith("HTTP/1.1 200 OK\r\n"))
        << i << " (" << idle_open << " idle and " << half_open << " half-sent connections open)";
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << i;
  }
}

TEST_F(HttpServerTest, HeadNotCompleteWithinHeaderTimeoutIsClosed) {
  HttpServerOptions options;
  options.header_timeout = absl::Milliseconds(300);
  options.request_timeout = absl::Minutes(10);
  std::unique_ptr<HttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  // A slowloris client: one byte of the head every 50 ms does not extend it.
  Client trickle = Client::Connect("127.0.0.1", server->port(), absl::Seconds(5));
  ASSERT_TRUE(trickle.connected());
  const std::string head = "GET /metrics HTTP/1.1\r\nX-Slow: " + std::string(1000, 'a');
  const absl::Time start = absl::Now();
  bool closed = false;
  for (size_t i = 0; i < head.size() && !closed && absl::Now() - start < absl::Seconds(5); ++i) {
    closed = !trickle.Send(head.substr(i, 1)) || trickle.ClosedBy(absl::Now() + absl::Milliseconds(50));
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // A head that arrives in time is answered.
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n", "127.0.0.1", absl::Seconds(5)),
              StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST(HttpServerSlowReaderTest, ClientsThatDoNotReadTheirResponseCannotStallOthers) {
  // A response far larger than what the sockets buffer: the server keeps
  // writing to each reader that does not read.
  const std::string big(8 << 20, 'x');
  HttpServerOptions options;
  options.header_timeout = absl::Minutes(10);  // only eviction can make room
  options.request_timeout = absl::Minutes(10);
  options.max_connections = 4;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      "127.0.0.1:0",
      [&big](absl::string_view path) {
        return path == "/big" ? HttpResponse{200, "text/plain", big} : HttpResponse{200, "text/plain", "small\n"};
      },
      options);
  ASSERT_THAT(server, IsOk());
  std::vector<Client> slow;
  for (int i = 0; i < 6; ++i) {
    slow.push_back(Client::Connect("127.0.0.1", (*server)->port(), absl::Seconds(5), /*receive_buffer=*/4096));
    ASSERT_TRUE(slow.back().connected());
    ASSERT_TRUE(slow.back().Send("GET /big HTTP/1.1\r\n\r\n"));
  }  // and never read
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    const std::string response =
        Exchange((*server)->port(), "GET /small HTTP/1.1\r\n\r\n", "127.0.0.1", absl::Seconds(5));
    ASSERT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n")) << i;
    EXPECT_EQ(Body(response), "small\n") << i;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << i;
  }
}

}  // namespace
}  // namespace ckptd::metrics
