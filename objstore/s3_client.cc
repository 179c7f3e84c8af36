#include "objstore/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "objstore/s3_xml.h"

namespace ckptd::objstore {
namespace {

constexpr size_t kDeleteBatch = 1000;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

bool Unreserved(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~'; }

// A random wait in [0, cap): "full jitter".
absl::Duration Jitter(absl::Duration cap) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const int64_t us = absl::ToInt64Microseconds(cap);
  if (us <= 0) return absl::ZeroDuration();
  return absl::Microseconds(std::uniform_int_distribution<int64_t>(0, us - 1)(rng));
}

bool RetryableCurl(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

bool RetryableHttp(long status, absl::string_view code) {
  return status == 500 || status == 502 || status == 503 || status == 504 || status == 429 ||
         (status == 400 && code == "RequestTimeout");
}

std::string Md5Base64(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_md5(), nullptr);
  return absl::Base64Escape(absl::string_view(reinterpret_cast<const char*>(digest), len));
}

}  // namespace

std::string UriEncode(absl::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (Unreserved(c) || (keep_slash && c == '/')) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "%", absl::AsciiStrToUpper(absl::BytesToHexString(absl::string_view(&c, 1))));
    }
  }
  return out;
}

// One libcurl easy handle: its connection stays open between requests.
class S3Client::Handle {
 public:
  Handle() : curl_(curl_easy_init()) {}
  ~Handle() {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
  }
  CURL* get() { return curl_; }

 private:
  CURL* const curl_;
};

struct S3Client::Request {
  std::string method;
  std::string what;
  std::string bucket;
  std::string key;
  std::vector<std::pair<std::string, std::string>> query;  // sorted by name
  std::vector<std::string> headers;
  absl::string_view body;  // sent with PUT and POST
  // GET into a caller's buffer: exactly `sink_len` bytes are expected.
  char* sink = nullptr;
  uint64_t sink_len = 0;

  std::string Url() const {
    return key.empty() ? absl::StrCat(kS3Scheme, bucket) : absl::StrCat(kS3Scheme, bucket, "/", key);
  }
};

S3Client::Request S3Client::MakeRequest(std::string method, std::string what, std::string bucket, std::string key,
                                        std::vector<std::pair<std::string, std::string>> query) {
  S3Client::Request r;
  r.method = std::move(method);
  r.what = std::move(what);
  r.bucket = std::move(bucket);
  r.key = std::move(key);
  r.query = std::move(query);
  return r;
}

struct S3Client::Response {
  long status = 0;
  std::string body;  // what was not written to the sink (errors, XML)
  uint64_t sunk = 0;
  bool overflow = false;
  std::string etag;
  std::optional<uint64_t> content_length;
  std::string error_code;  // S3's <Code>, when the body held an <Error>
  std::string error_message;
};

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3Options options, FaultHook fault) {
  GlobalInit();
  if (options.credentials.empty()) {
    return absl::FailedPreconditionError("no S3 credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)");
  }
  if (options.max_connections < 1) options.max_connections = 1;
  if (options.max_attempts < 1) options.max_attempts = 1;
  std::unique_ptr<S3Client> client(new S3Client(std::move(options), std::move(fault)));
  return client;
}

S3Client::S3Client(S3Options options, FaultHook fault) : options_(std::move(options)), fault_(std::move(fault)) {
  scheme_host_ = options_.EffectiveEndpoint();
  sigv4_ = absl::StrCat("aws:amz:", options_.region, ":s3");
  userpwd_ = absl::StrCat(options_.credentials.access_key_id, ":", options_.credentials.secret_access_key);
}

S3Client::~S3Client() {
  // Overwrite the secret before the memory goes back.
  std::fill(userpwd_.begin(), userpwd_.end(), '\0');
}

S3ClientStats S3Client::stats() const {
  return {requests_.load(), retries_.load(), bytes_up_.load(), bytes_down_.load()};
}

std::unique_ptr<S3Client::Handle> S3Client::TakeHandle() {
  {
    absl::MutexLock l(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Handle> h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  return std::make_unique<Handle>();
}

void S3Client::ReturnHandle(std::unique_ptr<Handle> handle) {
  absl::MutexLock l(&mu_);
  // Keep as many as may be busy at once; close the rest.
  if (static_cast<int>(idle_.size()) < options_.max_connections * 2) idle_.push_back(std::move(handle));
}

std::string S3Client::Url(const Request& req) const {
  std::string url;
  const std::string key = UriEncode(req.key, /*keep_slash=*/true);
  if (options_.addressing == Addressing::kVirtualHosted) {
    const size_t host_at = scheme_host_.find("://") + 3;
    url = absl::StrCat(scheme_host_.substr(0, host_at), req.bucket, ".", scheme_host_.substr(host_at), "/", key);
  } else {
    // The bucket itself is "/bucket", not "/bucket/" (an object with an empty key).
    url = req.key.empty() ? absl::StrCat(scheme_host_, "/", req.bucket) : absl::StrCat(scheme_host_, "/", req.bucket, "/", key);
  }
  if (!req.query.empty()) {
    url.push_back('?');
    bool first = true;
    for (const auto& [name, value] : req.query) {
      if (!first) url.push_back('&');
      first = false;
      // "name=" even without a value: the canonical form SigV4 signs.
      absl::StrAppend(&url, UriEncode(name, false), "=", UriEncode(value, false));
    }
  }
  return url;
}

absl::Status S3Client::ErrorOf(const Request& req, const Response& resp) const {
  std::string detail = absl::StrCat("HTTP ", resp.status);
  if (!resp.error_code.empty()) absl::StrAppend(&detail, " ", resp.error_code);
  if (!resp.error_message.empty()) absl::StrAppend(&detail, ": ", resp.error_message);
  const std::string msg = absl::StrCat("S3 ", req.method, " ", req.Url(), " (", req.what, "): ", detail);
  const std::string& code = resp.error_code;
  switch (resp.status) {
    case 404:
      return absl::NotFoundError(msg);
    case 403:
      if (code == "SignatureDoesNotMatch" || code == "InvalidAccessKeyId" || code == "ExpiredToken" ||
          code == "InvalidToken" || code == "TokenRefreshRequired" || code == "InvalidSecurity") {
        return absl::UnauthenticatedError(msg);
      }
      return absl::PermissionDeniedError(msg);
    case 400:
      if (code == "ExpiredToken" || code == "InvalidToken") return absl::UnauthenticatedError(msg);
      return absl::InvalidArgumentError(msg);
    case 412:
      return absl::FailedPreconditionError(msg);
    case 416:
      return absl::DataLossError(absl::StrCat(msg, " (the range is past the end of the object)"));
    case 409:
      return absl::FailedPreconditionError(msg);
    default:
      if (resp.status >= 500 || resp.status == 429) return absl::UnavailableError(msg);
      return absl::InvalidArgumentError(msg);
  }
}

namespace {

struct Transfer {
  absl::string_view body;
  size_t sent = 0;
  char* sink = nullptr;
  uint64_t sink_len = 0;
  CURL* curl = nullptr;
  std::string* text = nullptr;
  uint64_t* sunk = nullptr;
  bool* overflow = nullptr;
  std::string* etag = nullptr;
  std::optional<uint64_t>* content_length = nullptr;
};

size_t ReadBody(char* out, size_t size, size_t nmemb, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = std::min(size * nmemb, t->body.size() - t->sent);
  std::memcpy(out, t->body.data() + t->sent, n);
  t->sent += n;
  return n;
}

int SeekBody(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->body.size()) return CURL_SEEKFUNC_FAIL;
  t->sent = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t WriteBody(char* data, size_t size, size_t nmemb, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * nmemb;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->sink != nullptr && status >= 200 && status < 300) {
    if (*t->sunk + n > t->sink_len) {
      *t->overflow = true;
      return 0;  // aborts the transfer
    }
    std::memcpy(t->sink + *t->sunk, data, n);
    *t->sunk += n;
    return n;
  }
  // Error documents and XML answers are small; cap what is kept.
  if (t->text->size() < (16u << 20)) t->text->append(data, n);
  return n;
}

size_t ReadHeader(char* data, size_t size, size_t nmemb, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * nmemb;
  absl::string_view line(data, n);
  if (absl::StartsWith(line, "HTTP/")) {  // a new response (after a 100 Continue)
    t->etag->clear();
    t->content_length->reset();
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return n;
  const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
  absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  if (name == "etag") {
    *t->etag = std::string(value);
  } else if (name == "content-length") {
    uint64_t v = 0;
    if (absl::SimpleAtoi(value, &v)) *t->content_length = v;
  }
  return n;
}

}  // namespace

absl::StatusOr<S3Client::Response> S3Client::SendOnce(Request& req, Handle& handle, bool* retryable) {
  *retryable = false;
  Response resp;
  CURL* curl = handle.get();
  if (curl == nullptr) return absl::ResourceExhaustedError("libcurl could not make a handle");
  curl_easy_reset(curl);
  Transfer t;
  t.body = req.body;
  t.sink = req.sink;
  t.sink_len = req.sink_len;
  t.curl = curl;
  t.text = &resp.body;
  t.sunk = &resp.sunk;
  t.overflow = &resp.overflow;
  t.etag = &resp.etag;
  t.content_length = &resp.content_length;

  const std::string url = Url(req);
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  // No wait for "100 Continue" before each part's body. (An empty "Expect:"
  // header would remove it, but libcurl signs that header and then does not
  // send it, and the signature no longer matches.)
  curl_easy_setopt(curl, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options_.low_speed_bytes));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(absl::ToInt64Seconds(options_.low_speed_time)));
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(curl, CURLOPT_USERPWD, userpwd_.c_str());
  if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &ReadHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);

  curl_slist* headers = nullptr;
  // The body is not hashed into the signature (as boto3 does over https);
  // libcurl otherwise signs no payload hash and S3 refuses the request.
  // ckptd checksums every block itself and verifies it when read.
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  for (const std::string& h : req.headers) headers = curl_slist_append(headers, h.c_str());
  if (!options_.credentials.session_token.empty()) {
    const std::string token = absl::StrCat("x-amz-security-token: ", options_.credentials.session_token);
    headers = curl_slist_append(headers, token.c_str());
  }
  if (req.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, &ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, &SeekBody);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (req.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, req.body.data() != nullptr ? req.body.data() : "");
  } else if (req.method == "DELETE") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  const CURLcode code = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (code != CURLE_OK && !(code == CURLE_WRITE_ERROR && resp.overflow)) {
    *retryable = RetryableCurl(code);
    // errbuf may quote the URL, which holds no secret; the credentials are
    // never part of it.
    return absl::UnavailableError(absl::StrCat("S3 ", req.method, " ", req.Url(), " (", req.what,
                                               "): ", errbuf[0] != 0 ? errbuf : curl_easy_strerror(code)));
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
  if (req.method == "PUT" || req.method == "POST") bytes_up_.fetch_add(req.body.size(), std::memory_order_relaxed);
  bytes_down_.fetch_add(resp.sunk + resp.body.size(), std::memory_order_relaxed);
  if (resp.status < 200 || resp.status >= 300 ||
      absl::StrContains(absl::string_view(resp.body).substr(0, 512), "<Error>")) {
    S3Error e = ParseError(resp.body);
    resp.error_code = e.code;
    resp.error_message = e.message;
    if (resp.status >= 200 && resp.status < 300 && !e.code.empty()) {
      // CompleteMultipartUpload answers 200 and may still have failed.
      resp.status = e.code == "SlowDown" || e.code == "InternalError" ? 503 : 400;
    }
    *retryable = RetryableHttp(resp.status, resp.error_code);
  }
  return resp;
}

absl::StatusOr<S3Client::Response> S3Client::Send(Request& req) {
  absl::Status last;
  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    if (attempt > 1) {
      retries_.fetch_add(1, std::memory_order_relaxed);
      absl::Duration cap = options_.base_backoff * (int64_t{1} << std::min(attempt - 2, 20));
      absl::SleepFor(Jitter(std::min(cap, options_.max_backoff)));
    }
    bool retryable = false;
    absl::StatusOr<Response> resp;
    if (fault_) {
      RequestInfo info{req.method, req.what, req.bucket, req.key, attempt};
      if (int fake = fault_(info); fake != 0) {
        requests_.fetch_add(1, std::memory_order_relaxed);
        Response r;
        r.status = fake;
        r.error_code = fake == 503 ? "SlowDown" : "InjectedFault";
        r.error_message = fake == 503 ? "Please reduce your request rate." : "a fault the test hook made";
        retryable = RetryableHttp(r.status, r.error_code);
        resp = std::move(r);
        if (!retryable) return resp;
        last = ErrorOf(req, *resp);
        continue;
      }
    }
    std::unique_ptr<Handle> handle = TakeHandle();
    resp = SendOnce(req, *handle, &retryable);
    if (resp.ok() || retryable) ReturnHandle(std::move(handle));  // a broken handle is dropped
    if (!retryable) return resp;
    last = resp.ok() ? ErrorOf(req, *resp) : resp.status();
  }
  return absl::Status(last.code(), absl::StrCat(last.message(), " (failed ", options_.max_attempts,
                                                options_.max_attempts == 1 ? " time)" : " times, with backoff)"));
}

// The request helpers: each returns the response when it succeeded, the
// mapped error otherwise.
// `parsed`, the XML answer to `req`; an error that names the request.
template <typename T, typename Req>
absl::StatusOr<T> AnswerTo(const Req& req, absl::StatusOr<T> parsed) {
  if (parsed.ok()) return parsed;
  return absl::Status(parsed.status().code(), absl::StrCat("S3 ", req.method, " ", req.Url(), " (", req.what,
                                                           "): ", parsed.status().message()));
}

#define CKPTD_S3_SEND(resp, req)                    \
  CKPTD_ASSIGN_OR_RETURN(Response resp, Send(req)); \
  if (resp.status < 200 || resp.status >= 300) return ErrorOf(req, resp)

absl::Status S3Client::HeadBucket(const std::string& bucket) {
  Request req = MakeRequest("HEAD", "head-bucket", bucket, "");
  CKPTD_ASSIGN_OR_RETURN(Response resp, Send(req));
  if (resp.status == 404) {
    return absl::NotFoundError(absl::StrCat("bucket ", bucket, " does not exist at ", options_.EffectiveEndpoint(),
                                            " (ckptd does not create buckets)"));
  }
  if (resp.status == 403) {
    return absl::PermissionDeniedError(absl::StrCat("bucket ", bucket, " at ", options_.EffectiveEndpoint(),
                                                    ": access denied to ", options_.credentials.access_key_id,
                                                    " (wrong key, secret or token, or no permission)"));
  }
  if (resp.status < 200 || resp.status >= 300) return ErrorOf(req, resp);
  return absl::OkStatus();
}

absl::Status S3Client::CreateBucket(const std::string& bucket) {
  Request req = MakeRequest("PUT", "create-bucket", bucket, "");
  CKPTD_ASSIGN_OR_RETURN(Response resp, Send(req));
  if (resp.status == 409 && resp.error_code == "BucketAlreadyOwnedByYou") return absl::OkStatus();
  if (resp.status < 200 || resp.status >= 300) return ErrorOf(req, resp);
  return absl::OkStatus();
}

absl::StatusOr<ObjectInfo> S3Client::Head(const std::string& bucket, const std::string& key) {
  Request req = MakeRequest("HEAD", "head", bucket, key);
  CKPTD_S3_SEND(resp, req);
  if (!resp.content_length) {
    return absl::DataLossError(absl::StrCat("S3 HEAD ", req.Url(), ": no Content-Length in the answer"));
  }
  return ObjectInfo{key, *resp.content_length, resp.etag};
}

absl::Status S3Client::GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n,
                                void* buf, const std::string& if_match) {
  if (n == 0) return absl::OkStatus();
  Request req = MakeRequest("GET", "get-range", bucket, key);
  req.headers.push_back(absl::StrCat("Range: bytes=", offset, "-", offset + n - 1));
  if (!if_match.empty()) req.headers.push_back(absl::StrCat("If-Match: ", if_match));
  req.sink = static_cast<char*>(buf);
  req.sink_len = n;
  CKPTD_S3_SEND(resp, req);
  if (resp.overflow || resp.sunk != n || (resp.status != 206 && !(offset == 0))) {
    return absl::DataLossError(absl::StrCat("S3 GET ", req.Url(), " bytes ", offset, "-", offset + n - 1, ": got ",
                                            resp.sunk, resp.overflow ? "+" : "", " of ", n, " bytes (HTTP ",
                                            resp.status, "): the object is truncated or changed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Client::Get(const std::string& bucket, const std::string& key) {
  Request req = MakeRequest("GET", "get", bucket, key);
  CKPTD_S3_SEND(resp, req);
  return std::move(resp.body);
}

absl::StatusOr<std::string> S3Client::Put(const std::string& bucket, const std::string& key, absl::string_view data,
                                          bool if_none_match) {
  Request req = MakeRequest("PUT", "put", bucket, key);
  req.body = data;
  if (if_none_match) req.headers.push_back("If-None-Match: *");
  CKPTD_ASSIGN_OR_RETURN(Response resp, Send(req));
  if (if_none_match && resp.status == 412) {
    return absl::AlreadyExistsError(absl::StrCat(req.Url(), " already exists"));
  }
  if (resp.status < 200 || resp.status >= 300) return ErrorOf(req, resp);
  return resp.etag;
}

absl::Status S3Client::Delete(const std::string& bucket, const std::string& key) {
  Request req = MakeRequest("DELETE", "delete", bucket, key);
  CKPTD_ASSIGN_OR_RETURN(Response resp, Send(req));
  if (resp.status == 404) return absl::OkStatus();
  if (resp.status < 200 || resp.status >= 300) return ErrorOf(req, resp);
  return absl::OkStatus();
}

absl::Status S3Client::DeleteMany(const std::string& bucket, const std::vector<std::string>& keys) {
  for (size_t at = 0; at < keys.size(); at += kDeleteBatch) {
    const size_t end = std::min(keys.size(), at + kDeleteBatch);
    const std::string body = DeleteRequestXml(absl::MakeConstSpan(keys).subspan(at, end - at));
    Request req = MakeRequest("POST", "delete-objects", bucket, "", {{"delete", ""}});
    req.body = body;
    req.headers.push_back(absl::StrCat("Content-MD5: ", Md5Base64(body)));
    req.headers.push_back("Content-Type: application/xml");
    CKPTD_S3_SEND(resp, req);
    CKPTD_ASSIGN_OR_RETURN(std::vector<S3Error> failed, AnswerTo(req, ParseDeleteResult(resp.body)));
    for (const S3Error& e : failed) {
      if (e.code == "NoSuchKey") continue;
      return absl::UnavailableError(absl::StrCat("S3 delete-objects in s3://", bucket, ": ", e.key,
                                                 " was not deleted: ", e.code, " ", e.message,
                                                 failed.size() > 1 ? " (and others)" : ""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Client::CreateUpload(const std::string& bucket, const std::string& key) {
  Request req = MakeRequest("POST", "create-upload", bucket, key, {{"uploads", ""}});
  CKPTD_S3_SEND(resp, req);
  return AnswerTo(req, ParseUploadId(resp.body));
}

absl::StatusOr<std::string> S3Client::UploadPart(const std::string& bucket, const std::string& key,
                                                 const std::string& upload_id, int part_number,
                                                 absl::string_view data) {
  Request req = MakeRequest("PUT", absl::StrCat("upload-part ", part_number), bucket, key,
                            {{"partNumber", absl::StrCat(part_number)}, {"uploadId", upload_id}});
  req.body = data;
  CKPTD_S3_SEND(resp, req);
  if (resp.etag.empty()) {
    return absl::DataLossError(absl::StrCat("S3 PUT ", req.Url(), " (", req.what, "): no ETag in the answer"));
  }
  return resp.etag;
}

absl::StatusOr<std::string> S3Client::CompleteUpload(const std::string& bucket, const std::string& key,
                                                     const std::string& upload_id,
                                                     const std::vector<CompletedPart>& parts) {
  const std::string body = CompleteRequestXml(parts);
  Request req = MakeRequest("POST", absl::StrCat("complete-upload of ", parts.size(), " parts"), bucket, key,
                            {{"uploadId", upload_id}});
  req.body = body;
  req.headers.push_back("Content-Type: application/xml");
  CKPTD_S3_SEND(resp, req);
  return AnswerTo(req, ParseCompleteEtag(resp.body));
}

absl::Status S3Client::AbortUpload(const std::string& bucket, const std::string& key, const std::string& upload_id) {
  Request req = MakeRequest("DELETE", "abort-upload", bucket, key, {{"uploadId", upload_id}});
  CKPTD_ASSIGN_OR_RETURN(Response resp, Send(req));
  if (resp.status == 404) return absl::OkStatus();  // already gone
  if (resp.status < 200 || resp.status >= 300) return ErrorOf(req, resp);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UploadInfo>> S3Client::ListUploads(const std::string& bucket, const std::string& prefix) {
  std::vector<UploadInfo> out;
  std::string key_marker, id_marker;
  for (int page = 0; page < 100000; ++page) {
    Request req = MakeRequest("GET", "list-uploads", bucket, "");
    if (!key_marker.empty()) req.query.push_back({"key-marker", key_marker});
    req.query.push_back({"prefix", prefix});
    if (!id_marker.empty()) req.query.push_back({"upload-id-marker", id_marker});
    req.query.push_back({"uploads", ""});
    CKPTD_S3_SEND(resp, req);
    CKPTD_ASSIGN_OR_RETURN(UploadPage p, AnswerTo(req, ParseUploadPage(resp.body)));
    for (UploadInfo& u : p.uploads) out.push_back(std::move(u));
    if (!p.truncated) return out;
    if (p.next_key_marker.empty()) {
      return absl::DataLossError(
          absl::StrCat("S3 list-uploads of s3://", bucket, "/", prefix, ": a truncated page without a next marker"));
    }
    key_marker = std::move(p.next_key_marker);
    id_marker = std::move(p.next_upload_id_marker);
  }
  return absl::ResourceExhaustedError("S3 list-uploads: too many pages");
}

absl::StatusOr<ListResult> S3Client::List(const std::string& bucket, const std::string& prefix,
                                          const std::string& delimiter, int max_keys) {
  ListResult out;
  std::string token;
  for (int page = 0; page < 1000000; ++page) {
    Request req = MakeRequest("GET", "list", bucket, "");
    if (!token.empty()) req.query.push_back({"continuation-token", token});
    if (!delimiter.empty()) req.query.push_back({"delimiter", delimiter});
    req.query.push_back({"list-type", "2"});
    if (max_keys > 0) req.query.push_back({"max-keys", absl::StrCat(max_keys)});
    req.query.push_back({"prefix", prefix});
    CKPTD_S3_SEND(resp, req);
    CKPTD_ASSIGN_OR_RETURN(ListPage p, AnswerTo(req, ParseListPage(resp.body)));
    for (ObjectInfo& o : p.objects) out.objects.push_back(std::move(o));
    for (std::string& s : p.prefixes) out.prefixes.push_back(std::move(s));
    if (!p.truncated || max_keys > 0) return out;
    if (p.next_token.empty()) {
      return absl::DataLossError(
          absl::StrCat("S3 list of s3://", bucket, "/", prefix, ": a truncated page without a continuation token"));
    }
    token = std::move(p.next_token);
  }
  return absl::ResourceExhaustedError("S3 list: too many pages");
}

}  // namespace ckptd::objstore
