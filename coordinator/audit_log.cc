#include "coordinator/audit_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/json.h"
#include "base/posix_error.h"

namespace ckptd::coordinator {
namespace {

// Longest string value a record carries (request fields, certificate names
// and error messages may hold anything a caller sent).
constexpr size_t kMaxValue = 256;
constexpr size_t kMaxReason = 1024;
// How long the destructor waits for a file that does not take what is queued.
constexpr absl::Duration kCloseWait = absl::Seconds(5);
// While writes fail, or refused calls are left out, a line about it at most
// this often.
constexpr absl::Duration kErrorLogEvery = absl::Minutes(1);

std::string Cut(const std::string& s, size_t max = kMaxValue) {
  if (s.size() <= max) return s;
  return absl::StrCat(s.substr(0, max), "...");
}

// Writes all of `line` to `fd` (O_APPEND: one write each, unless cut short).
absl::Status WriteAll(int fd, const std::string& line, const std::string& path) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::PosixError(absl::StrCat("write audit log ", path), errno);
    if (n == 0) return absl::DataLossError(absl::StrCat("write audit log ", path, ": nothing written"));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Opens `path` for appending, refusing a link or a special file.
absl::StatusOr<int> OpenAuditFile(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "audit log ", path, " is a symbolic link; name the file itself (the audit log is never written through "
                              "a link)"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("audit log ", path, " is not a regular file"));
    }
  } else if (errno != ENOENT) {
    return base::PosixError(absl::StrCat("stat audit log ", path), errno);
  }
  // O_NOFOLLOW and O_NONBLOCK: a link or a FIFO put there since the lstat
  // is refused, not followed or waited on.
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat("audit log ", path, " is a symbolic link; name the file "
                                                                            "itself"));
    }
    if (err == ENXIO) {
      return absl::FailedPreconditionError(absl::StrCat("audit log ", path, " is not a regular file"));
    }
    return base::PosixError(absl::StrCat("open audit log ", path), err);
  }
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);  // nothing written
    return base::PosixError(absl::StrCat("stat audit log ", path), err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);  // nothing written
    return absl::FailedPreconditionError(absl::StrCat("audit log ", path, " is not a regular file"));
  }
  // Writes wait for the disk as usual (O_NONBLOCK was for the open).
  if (const int flags = ::fcntl(fd, F_GETFL); flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);  // nothing written
    return base::PosixError(absl::StrCat("fcntl audit log ", path), err);
  }
  return fd;
}

}  // namespace

// What the writer thread and the AuditLog share. The thread holds it too, so
// that a thread left stuck in write() by the destructor touches nothing freed.
struct AuditLog::Writer {
  Writer(int fd_in, std::string path_in, base::Logger* logger_in, AuditObserver* observer_in, size_t max_queued_in)
      : fd(fd_in), path(std::move(path_in)), logger(logger_in), observer(observer_in), max_queued(max_queued_in) {}
  ~Writer() { ::close(fd); }  // appended lines need no fsync to be kept by the kernel

  // Queues `line`; drops it (a write error) when the queue is full.
  void Push(std::string line) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    if (queue.size() >= max_queued) {
      NoteError(absl::ResourceExhaustedError(
          absl::StrCat("audit log ", path, ": ", queue.size(), " records wait for the file, which is not taking them; "
                       "this one is left out of it (its log line stands)")));
      return;
    }
    queue.push_back(std::move(line));
    ++queued;
  }

  // The thread: writes queued lines until stopped with none left.
  void Run() ABSL_LOCKS_EXCLUDED(mu) {
    while (true) {
      std::string line;
      {
        absl::MutexLock l(&mu);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !queue.empty() || stopping; };
        mu.Await(absl::Condition(&ready));
        if (queue.empty() || abandoned) {
          finished = true;
          return;
        }
        line = std::move(queue.front());
        queue.pop_front();
      }
      const absl::Status written = WriteAll(fd, line, path);
      absl::MutexLock l(&mu);
      if (abandoned) {
        finished = true;
        return;
      }
      ++done;
      if (!written.ok()) {
        NoteError(written);
      } else if (failing) {
        failing = false;
        logger->Warning(absl::StrCat("audit: writing to ", path, " again; ", lost, " records did not reach it"));
        lost = 0;
      }
    }
  }

  // A record lost: counted, and said at the first loss and then once a minute
  // while they go on.
  void NoteError(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (observer != nullptr) observer->OnAuditWriteError();
    ++lost;
    const absl::Time now = absl::Now();  // how often to say so, not what a record says
    if (failing && now - last_error_logged < kErrorLogEvery) return;
    logger->Error(absl::StrCat("audit: ", why.message(), " (", lost,
                               " records lost so far; ckptd_audit_write_errors_total counts them)"));
    failing = true;
    last_error_logged = now;
  }

  const int fd;
  const std::string path;
  base::Logger* const logger;
  AuditObserver* const observer;
  const size_t max_queued;
  absl::Mutex mu;
  std::deque<std::string> queue ABSL_GUARDED_BY(mu);
  uint64_t queued ABSL_GUARDED_BY(mu) = 0;  // lines ever queued
  uint64_t done ABSL_GUARDED_BY(mu) = 0;    // lines written or failed
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // The AuditLog is gone: the logger and observer may be too.
  bool abandoned ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;
  bool failing ABSL_GUARDED_BY(mu) = false;
  uint64_t lost ABSL_GUARDED_BY(mu) = 0;  // since the last line about it
  absl::Time last_error_logged ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(AuditLogOptions options) {
  std::shared_ptr<Writer> writer;
  if (!options.path.empty()) {
    absl::StatusOr<int> fd = OpenAuditFile(options.path);
    if (!fd.ok()) return fd.status();
    base::Logger* logger = options.logger != nullptr ? options.logger : &base::DefaultLogger();
    writer = std::make_shared<Writer>(*fd, options.path, logger, options.observer, std::max<size_t>(1, options.max_queued));
  }
  return std::unique_ptr<AuditLog>(new AuditLog(std::move(options), std::move(writer)));
}

AuditLog::AuditLog(AuditLogOptions options, std::shared_ptr<Writer> writer)
    : options_(std::move(options)),
      path_(options_.path),
      logger_(options_.logger != nullptr ? options_.logger : &base::DefaultLogger()),
      clock_(options_.clock != nullptr ? options_.clock : base::RealClock::Get()),
      writer_(std::move(writer)) {
  absl::MutexLock l(&mu_);
  tokens_ = options_.refused_burst;
  refilled_ = clock_->Now();
  if (writer_ != nullptr) thread_ = std::thread([w = writer_] { w->Run(); });
}

AuditLog::~AuditLog() {
  if (writer_ == nullptr) return;
  Writer& w = *writer_;
  bool stuck = false;
  {
    absl::MutexLock l(&w.mu);
    w.stopping = true;
    if (!w.mu.AwaitWithTimeout(absl::Condition(&w.finished), kCloseWait)) {
      // Stuck in write(): left to finish (or not) on its own.
      w.abandoned = true;
      stuck = true;
      logger_->Error(absl::StrCat("audit: ", path_, " did not take the last ", w.queue.size() + 1,
                                  " records within ", absl::FormatDuration(kCloseWait), "; they are lost"));
    }
  }
  if (stuck) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void AuditLog::Record(const AuditRecord& record) {
  const absl::Time now = clock_->Now();
  uint64_t suppressed = 0;  // left out before this record
  bool left_out = false;
  bool first_left_out = false;
  {
    absl::MutexLock l(&mu_);
    if (!record.authenticated) {
      const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - refilled_));
      tokens_ = std::min(options_.refused_burst, tokens_ + elapsed * options_.refused_per_second);
      refilled_ = now;
      if (tokens_ < 1) {
        left_out = true;
        // Said when they start being left out, at most once a minute.
        first_left_out = suppressed_++ == 0 && now - suppression_logged_ >= kErrorLogEvery;
        if (first_left_out) suppression_logged_ = now;
      } else {
        tokens_ -= 1;
      }
    }
    if (!left_out) suppressed = std::exchange(suppressed_, 0);
  }
  if (left_out) {
    if (options_.observer != nullptr) options_.observer->OnAuditSuppressed();
    if (first_left_out) {
      logger_->Warning(absl::StrCat("audit: calls refused at authentication arrive faster than ",
                                    options_.refused_per_second,
                                    " a second; some are left out of the audit trail (the next record counts them, "
                                    "as does ckptd_audit_records_suppressed_total)"));
    }
    return;
  }
  const std::string line = ToJson(record, now, suppressed);
  const bool granted = record.outcome.ok();
  logger_->Log(granted && !record.notable ? base::LogSeverity::kInfo : base::LogSeverity::kWarning,
               absl::StrCat("audit: ", line));
  if (options_.observer != nullptr) options_.observer->OnAuditRecord(granted);
  if (writer_ != nullptr) writer_->Push(absl::StrCat(line, "\n"));
}

bool AuditLog::Flush(absl::Duration timeout) {
  if (writer_ == nullptr) return true;
  Writer& w = *writer_;
  absl::MutexLock l(&w.mu);
  const uint64_t target = w.queued;
  auto written = [&w, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) { return w.done >= target; };
  return w.mu.AwaitWithTimeout(absl::Condition(&written), timeout);
}

std::string AuditLog::ToJson(const AuditRecord& record, absl::Time time, uint64_t suppressed) {
  base::JsonWriter w;
  w.BeginObject();
  w.Field("time", absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone()));
  w.Field("action", Cut(record.action));
  w.Field("outcome", record.outcome.ok() ? "granted" : "refused");
  w.Field("authenticated", record.authenticated);
  w.Field("credential", Cut(record.identity.credential));
  w.Key("tls_names");
  w.BeginArray();
  for (const std::string& name : record.identity.tls_names) w.String(Cut(name));
  w.EndArray();
  w.Field("peer", Cut(record.identity.peer));
  if (!record.node.empty()) w.Field("node", Cut(record.node));
  if (!record.job.empty()) w.Field("job", Cut(record.job));
  if (record.rank) w.Field("rank", *record.rank);
  if (record.step) w.Field("step", *record.step);
  if (!record.outcome.ok()) {
    w.Field("code", absl::StatusCodeToString(record.outcome.code()));
    w.Field("reason", Cut(std::string(record.outcome.message()), kMaxReason));
  }
  for (const auto& [key, value] : record.details) {
    w.Key(key);
    if (const std::string* s = std::get_if<std::string>(&value)) {
      w.String(Cut(*s, kMaxReason));
    } else if (const uint64_t* n = std::get_if<uint64_t>(&value)) {
      w.Uint(*n);
    } else {
      w.Bool(std::get<bool>(value));
    }
  }
  if (suppressed > 0) w.Field("refused_left_out_before", suppressed);
  w.EndObject();
  return w.str();
}

}  // namespace ckptd::coordinator
