// A minimal HTTP/1.1 server for small GET endpoints such as /metrics.
//
// One thread runs a poll loop over the listening socket and every open
// connection, so a slow or silent client costs a file descriptor, never the
// service of another client. Each connection gets one request and one
// response (`Connection: close`), so there is no keep-alive connection to sit
// idle between requests. Requests are GET or HEAD only; anything malformed,
// oversized or slow gets an error status or is closed, never a crash.
//
// Idle and slow clients cannot starve it (issue 16, item 8: /metrics stopped
// answering with a couple of hundred idle connections open, since a full
// connection table left new connections waiting in the listen backlog):
//   - a connection must deliver its complete request head within
//     `header_timeout` (5 s) of being accepted, and be done within
//     `request_timeout` (10 s); trickling bytes does not extend either;
//   - the listening socket is always served: when `max_connections` are open,
//     a new connection is accepted anyway and the least useful open one is
//     closed to make room (one whose response is already out, else the oldest
//     one that has not sent a complete request, else the writer that has made
//     no progress for longest). Holding connections open therefore never
//     keeps a new one out; it costs at most max_connections + 1 descriptors.
//
// Why not civetweb (Debian's libcivetweb-dev), as the finding suggested: its
// thread model serves each connection on a worker thread (num_threads, 50 by
// default) that blocks in the read of the request until request_timeout_ms
// (30 s by default), and its accept thread waits while the queue to those
// workers is full. Idle connections beyond the worker count therefore starve
// it exactly like the old table did, and no setting of threads and timeouts
// holds the probe (600 idle connections, answer within seconds) short of a
// thread per attacker. Holding the probe needs an event loop that can drop a
// connection, which is what this is: a few hundred lines whose every limit is
// tested in http_server_test.cc, without a new dependency (and its CGI, Lua,
// TLS and file-serving surface) in the coordinator.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd::metrics {

class Registry;

// The content type of the Prometheus text exposition format 0.0.4.
inline constexpr absl::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

struct HttpResponse {
  int status_code = 200;  // outside 100..599 is sent as 500
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

struct HttpServerOptions {
  // A connection that has not delivered its complete request head within this
  // time of being accepted is closed (silent clients, slowloris).
  absl::Duration header_timeout = absl::Seconds(5);
  // A connection that has not delivered its request and taken the response
  // within this time of being accepted is closed.
  absl::Duration request_timeout = absl::Seconds(10);
  // Longest request line plus headers; a longer request gets 431.
  size_t max_request_bytes = 8192;
  // Connections held at once (at least 1). A connection that arrives when
  // this many are open is still accepted, and one of the open ones closed:
  // the first of these that there is, the longest-held first within each:
  // one lingering after its response was sent, one that has not sent a
  // complete request yet, one whose response is being written (the one that
  // has made no progress for longest).
  int max_connections = 64;
};

class HttpServer {
 public:
  // Maps a request path (the request target without query string, e.g.
  // "/metrics") to a response. Called on the server's thread, one request at a
  // time; it must not call Stop(). For HEAD the server drops the body.
  using Handler = std::function<HttpResponse(absl::string_view path)>;

  // Listens on `host_port`: "127.0.0.1:9090", "[::1]:9090", "localhost:9090",
  // ":9090" (all interfaces), port 0 for any free port. A host name listens on
  // the first of its addresses that can be bound. Errors: kInvalidArgument for
  // a malformed address or unknown host, kUnavailable when the port is in use,
  // kPermissionDenied for a privileged port, others from the socket calls.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host_port, Handler handler,
                                                           HttpServerOptions options = {});

  // Stops (see Stop()).
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Closes the listening socket and every open connection, without waiting
  // for clients, and joins the server thread. Idempotent; not from the handler.
  void Stop() ABSL_LOCKS_EXCLUDED(stop_mu_);

  // The bound port (the chosen one when started with port 0).
  int port() const { return port_; }

 private:
  HttpServer(int listen_fd, int wake_fd, int port, Handler handler, HttpServerOptions options);
  void Loop();

  const int listen_fd_;
  const int wake_fd_;  // an eventfd; Stop() writes it to end the poll loop
  const int port_;
  const Handler handler_;
  const HttpServerOptions options_;
  std::atomic<bool> stopping_{false};
  absl::Mutex stop_mu_;
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
};

// Serves `registry`'s Render() at /metrics (kPrometheusContentType), "ok" at
// /healthz (for liveness probes: the process serves), and 404 elsewhere.
// `registry` must outlive the handler.
HttpServer::Handler MetricsHandler(Registry& registry);

// What keeps a process from being ready to serve, in one line; empty: ready.
using Readiness = std::function<std::string()>;

// MetricsHandler, and /readyz (for readiness probes): 200 "ready" while
// `not_ready` says nothing, else 503 with what it says.
HttpServer::Handler MetricsHandler(Registry& registry, Readiness not_ready);

}  // namespace ckptd::metrics
