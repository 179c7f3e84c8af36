// StateStore in an embedded SQLite database: one connection guarded by a
// mutex, statements prepared once, every value bound (never spliced into SQL).
// Tables keep the columns the queries filter on beside the serialized proto.
#include <fcntl.h>  // AT_FDCWD
#include <sqlite3.h>
#include <unistd.h>  // faccessat

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>  // strtoll
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/posix_error.h"
#include "base/status_macros.h"
#include "coordinator/state_store.h"
#include "coordinator/state_store_internal.h"
#include "storage/file_system.h"
#include "storage/posix_file_system.h"

namespace ckptd::coordinator {
namespace {

using ckptd::v1::CommitIntent;
using ckptd::v1::DrillRecord;
using ckptd::v1::FailureEvent;
using ckptd::v1::FailureKind;
using ckptd::v1::JobRecord;
using ckptd::v1::QuarantinedStep;

// PRAGMA application_id of a ckptd state database ("ckpd").
constexpr int32_t kApplicationId = 0x636b7064;

// Schema version 1. Steps (uint64) are stored as their int64 bit pattern.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE events(
  id INTEGER PRIMARY KEY,        -- append order; contiguous (only the oldest are deleted)
  unix_nanos INTEGER NOT NULL,
  job BLOB NOT NULL,
  kind INTEGER NOT NULL,
  event BLOB NOT NULL            -- ckptd.v1.FailureEvent
);
CREATE INDEX events_by_time ON events(unix_nanos);
CREATE INDEX events_by_job_time ON events(job, unix_nanos);
CREATE TABLE jobs(
  job BLOB PRIMARY KEY NOT NULL,
  updated_unix_nanos INTEGER NOT NULL,
  record BLOB NOT NULL           -- ckptd.v1.JobRecord
) WITHOUT ROWID;
CREATE TABLE quarantine(
  job BLOB NOT NULL,
  step INTEGER NOT NULL,
  unix_nanos INTEGER NOT NULL,
  record BLOB NOT NULL,          -- ckptd.v1.QuarantinedStep
  PRIMARY KEY(job, step)
) WITHOUT ROWID;
)sql";

// Added to schema version 1 (created when missing, in a database of an
// earlier build; builds before it ignore the table). Drill ids (uint64,
// below 2^63: they start at a time in seconds times 2^20) as they are.
constexpr const char* kDrillsTable = R"sql(
CREATE TABLE IF NOT EXISTS drills(
  id INTEGER PRIMARY KEY,
  record BLOB NOT NULL           -- ckptd.v1.DrillRecord
);
)sql";

// Added to schema version 1 like the drills table: each job's commit intent.
constexpr const char* kCommitIntentsTable = R"sql(
CREATE TABLE IF NOT EXISTS commit_intents(
  job BLOB PRIMARY KEY,
  record BLOB NOT NULL           -- ckptd.v1.CommitIntent
) WITHOUT ROWID;
)sql";

// The status code for what the caller should do next; I/O errors go through
// the one errno mapping.
absl::StatusCode CodeForSqlite(int rc, int system_errno) {
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return absl::StatusCode::kPermissionDenied;
    case SQLITE_TOOBIG:
    case SQLITE_RANGE:
    case SQLITE_MISMATCH:
      return absl::StatusCode::kInvalidArgument;
    case SQLITE_CANTOPEN:
      if (system_errno != 0) return base::PosixError("", system_errno).code();
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_IOERR:
      if (system_errno != 0) return base::PosixError("", system_errno).code();
      return absl::StatusCode::kDataLoss;
    default:
      return absl::StatusCode::kInternal;
  }
}

// "<db path>: <what>: <sqlite's message> (sqlite error <code>)", plus advice
// for a damaged file. `db` may be null.
absl::Status SqliteError(const std::string& db_path, absl::string_view what, sqlite3* db, int rc) {
  const int system_errno = db != nullptr ? sqlite3_system_errno(db) : 0;
  const char* message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string text = absl::StrCat(db_path, ": ", what, ": ", message, " (sqlite error ", rc, ")");
  if ((rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT) {
    absl::StrAppend(&text,
                    "; the coordinator state database is not an SQLite database or is damaged: "
                    "move it aside to start with empty coordinator state");
  }
  return absl::Status(CodeForSqlite(rc, system_errno), text);
}

struct DbCloser {
  // close_v2: the handle goes once the last statement is finalized.
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, DbCloser>;

struct StmtFinalizer {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using StmtPtr = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// Resets a statement and drops its bindings when the scope ends.
class StmtScope {
 public:
  explicit StmtScope(sqlite3_stmt* s) : s_(s) {}
  ~StmtScope() {
    // The error of the last step was already reported by the caller.
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  StmtScope(const StmtScope&) = delete;
  StmtScope& operator=(const StmtScope&) = delete;

 private:
  sqlite3_stmt* s_;
};

// A zero-length value is bound as an empty BLOB, never as NULL.
int BindBytes(sqlite3_stmt* s, int index, absl::string_view bytes) {
  if (bytes.empty()) return sqlite3_bind_zeroblob(s, index, 0);
  return sqlite3_bind_blob64(s, index, bytes.data(), bytes.size(), SQLITE_TRANSIENT);
}

absl::string_view ColumnBytes(sqlite3_stmt* s, int column) {
  const void* data = sqlite3_column_blob(s, column);
  const int n = sqlite3_column_bytes(s, column);
  if (data == nullptr || n <= 0) return {};
  return absl::string_view(static_cast<const char*>(data), static_cast<size_t>(n));
}

int64_t ClampToInt64(size_t n) {
  return n > static_cast<size_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                       : static_cast<int64_t>(n);
}

class SqliteStateStore final : public StateStore {
 public:
  SqliteStateStore(std::string path, const StateStoreOptions& options, DbPtr db)
      : path_(std::move(path)), max_events_(std::max<size_t>(options.max_events, 1)), db_(std::move(db)) {}

  // Prepares every statement and drops events beyond the cap (which may have
  // shrunk since the last run).
  absl::Status Init() {
    absl::MutexLock lock(&mu_);
    struct {
      StmtPtr* stmt;
      const char* sql;
    } const statements[] = {
        {&begin_, "BEGIN IMMEDIATE"},
        {&commit_, "COMMIT"},
        {&rollback_, "ROLLBACK"},
        {&insert_event_, "INSERT INTO events(unix_nanos, job, kind, event) VALUES(?1, ?2, ?3, ?4)"},
        {&trim_events_, "DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?1"},
        {&list_events_, "SELECT id, event FROM events ORDER BY unix_nanos DESC, id DESC LIMIT ?1"},
        {&list_job_events_,
         "SELECT id, event FROM events WHERE job = ?1 ORDER BY unix_nanos DESC, id DESC LIMIT ?2"},
        {&count_by_kind_, "SELECT kind, COUNT(*) FROM events WHERE unix_nanos >= ?1 GROUP BY kind"},
        {&count_job_by_kind_,
         "SELECT kind, COUNT(*) FROM events WHERE job = ?2 AND unix_nanos >= ?1 GROUP BY kind"},
        {&put_job_, "INSERT OR REPLACE INTO jobs(job, updated_unix_nanos, record) VALUES(?1, ?2, ?3)"},
        {&list_jobs_, "SELECT job, record FROM jobs ORDER BY job"},
        {&delete_job_, "DELETE FROM jobs WHERE job = ?1"},
        {&delete_quarantine_, "DELETE FROM quarantine WHERE job = ?1"},
        {&put_quarantine_,
         "INSERT INTO quarantine(job, step, unix_nanos, record) VALUES(?1, ?2, ?3, ?4) "
         "ON CONFLICT(job, step) DO NOTHING"},
        {&list_quarantine_, "SELECT job, step, record FROM quarantine"},
        {&list_job_quarantine_, "SELECT job, step, record FROM quarantine WHERE job = ?1"},
        {&put_drill_, "INSERT OR REPLACE INTO drills(id, record) VALUES(?1, ?2)"},
        {&trim_drills_, "DELETE FROM drills WHERE id < (SELECT id FROM drills ORDER BY id DESC LIMIT 1 OFFSET ?1)"},
        {&list_drills_, "SELECT id, record FROM drills ORDER BY id"},
        {&put_intent_, "INSERT OR REPLACE INTO commit_intents(job, record) VALUES(?1, ?2)"},
        {&list_intents_, "SELECT job, record FROM commit_intents ORDER BY job"},
        {&delete_intent_, "DELETE FROM commit_intents WHERE job = ?1"},
    };
    for (const auto& [stmt, sql] : statements) {
      sqlite3_stmt* raw = nullptr;
      const int rc = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
      if (rc != SQLITE_OK) {
        sqlite3_finalize(raw);
        return Error(absl::StrCat("prepare \"", sql, "\""), rc);
      }
      stmt->reset(raw);
    }
    return TrimEvents();
  }

  absl::Status AppendEvent(const FailureEvent& event) override {
    CKPTD_ASSIGN_OR_RETURN(const std::string bytes, internal::SerializeForStore(event));
    absl::MutexLock lock(&mu_);
    CKPTD_RETURN_IF_ERROR(Run(begin_, "append event: begin"));
    absl::Status status = InsertEvent(event, bytes);
    if (status.ok()) status = TrimEvents();
    if (status.ok()) status = Run(commit_, "append event: commit");
    if (!status.ok()) RollbackIfOpen();
    return status;
  }

  absl::StatusOr<std::vector<FailureEvent>> ListEvents(absl::string_view job, size_t limit) override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = job.empty() ? list_events_.get() : list_job_events_.get();
    StmtScope scope(s);
    int limit_index = 1;
    if (!job.empty()) {
      CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 1, job)));
      limit_index = 2;
    }
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(s, limit_index, ClampToInt64(limit))));
    std::vector<FailureEvent> out;
    for (;;) {
      CKPTD_ASSIGN_OR_RETURN(const bool row, Step(s, "list events"));
      if (!row) break;
      FailureEvent& event = out.emplace_back();
      const absl::string_view bytes = ColumnBytes(s, 1);
      if (!event.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return Damaged(absl::StrCat("event row ", sqlite3_column_int64(s, 0)));
      }
    }
    return out;
  }

  absl::StatusOr<absl::flat_hash_map<FailureKind, uint64_t>> CountEventsByKind(absl::string_view job,
                                                                              absl::Time since) override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = job.empty() ? count_by_kind_.get() : count_job_by_kind_.get();
    StmtScope scope(s);
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(s, 1, absl::ToUnixNanos(since))));
    if (!job.empty()) CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 2, job)));
    absl::flat_hash_map<FailureKind, uint64_t> counts;
    for (;;) {
      CKPTD_ASSIGN_OR_RETURN(const bool row, Step(s, "count events"));
      if (!row) break;
      counts[static_cast<FailureKind>(sqlite3_column_int(s, 0))] +=
          static_cast<uint64_t>(sqlite3_column_int64(s, 1));
    }
    return counts;
  }

  absl::Status PutJob(const JobRecord& record) override {
    if (record.job().empty()) return absl::InvalidArgumentError("PutJob: the record names no job");
    CKPTD_ASSIGN_OR_RETURN(const std::string bytes, internal::SerializeForStore(record));
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = put_job_.get();
    StmtScope scope(s);
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 1, record.job())));
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(s, 2, record.updated_unix_nanos())));
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 3, bytes)));
    return StepDone(s, "put job");
  }

  absl::StatusOr<std::vector<JobRecord>> ListJobs() override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = list_jobs_.get();
    StmtScope scope(s);
    std::vector<JobRecord> out;
    for (;;) {
      CKPTD_ASSIGN_OR_RETURN(const bool row, Step(s, "list jobs"));
      if (!row) break;
      JobRecord& record = out.emplace_back();
      const absl::string_view bytes = ColumnBytes(s, 1);
      if (!record.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return Damaged(absl::StrCat("the record of job \"", absl::CHexEscape(ColumnBytes(s, 0)), "\""));
      }
    }
    return out;
  }

  absl::Status DeleteJob(absl::string_view job) override {
    absl::MutexLock lock(&mu_);
    for (sqlite3_stmt* s : {delete_job_.get(), delete_quarantine_.get(), delete_intent_.get()}) {
      StmtScope scope(s);
      CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 1, job)));
      CKPTD_RETURN_IF_ERROR(StepDone(s, "delete job"));
    }
    return absl::OkStatus();
  }

  absl::Status PutQuarantine(const QuarantinedStep& q) override {
    if (q.job().empty()) return absl::InvalidArgumentError("PutQuarantine: the step names no job");
    CKPTD_ASSIGN_OR_RETURN(const std::string bytes, internal::SerializeForStore(q));
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = put_quarantine_.get();
    StmtScope scope(s);
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 1, q.job())));
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(s, 2, static_cast<int64_t>(q.step()))));
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(s, 3, q.unix_nanos())));
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 4, bytes)));
    return StepDone(s, "put quarantined step");
  }

  absl::StatusOr<std::vector<QuarantinedStep>> ListQuarantined(absl::string_view job) override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = job.empty() ? list_quarantine_.get() : list_job_quarantine_.get();
    StmtScope scope(s);
    if (!job.empty()) CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 1, job)));
    std::vector<QuarantinedStep> out;
    for (;;) {
      CKPTD_ASSIGN_OR_RETURN(const bool row, Step(s, "list quarantined steps"));
      if (!row) break;
      QuarantinedStep& q = out.emplace_back();
      const absl::string_view bytes = ColumnBytes(s, 2);
      if (!q.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return Damaged(absl::StrCat("quarantined step ", static_cast<uint64_t>(sqlite3_column_int64(s, 1)),
                                    " of job \"", absl::CHexEscape(ColumnBytes(s, 0)), "\""));
      }
    }
    // Sorted here: SQLite would order steps as signed integers.
    std::sort(out.begin(), out.end(), [](const QuarantinedStep& a, const QuarantinedStep& b) {
      if (a.job() != b.job()) return a.job() < b.job();
      return a.step() < b.step();
    });
    return out;
  }

  absl::Status PutDrill(const DrillRecord& d) override {
    if (d.id() == 0) return absl::InvalidArgumentError("PutDrill: the drill has no id");
    if (d.id() > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat("PutDrill: drill id ", d.id(), " is above 2^63 - 1"));
    }
    CKPTD_ASSIGN_OR_RETURN(const std::string bytes, internal::SerializeForStore(d));
    absl::MutexLock lock(&mu_);
    CKPTD_RETURN_IF_ERROR(Run(begin_, "put drill: begin"));
    absl::Status status = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      sqlite3_stmt* put = put_drill_.get();
      StmtScope put_scope(put);
      CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(put, 1, static_cast<int64_t>(d.id()))));
      CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(put, 2, bytes)));
      CKPTD_RETURN_IF_ERROR(StepDone(put, "put drill"));
      sqlite3_stmt* trim = trim_drills_.get();
      StmtScope trim_scope(trim);
      CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(trim, 1, static_cast<int64_t>(kMaxStoredDrills - 1))));
      return StepDone(trim, "drop old drills");
    }();
    if (status.ok()) status = Run(commit_, "put drill: commit");
    if (!status.ok()) RollbackIfOpen();
    return status;
  }

  absl::StatusOr<std::vector<DrillRecord>> ListDrills() override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = list_drills_.get();
    StmtScope scope(s);
    std::vector<DrillRecord> out;
    for (;;) {
      CKPTD_ASSIGN_OR_RETURN(const bool row, Step(s, "list drills"));
      if (!row) break;
      DrillRecord& d = out.emplace_back();
      const absl::string_view bytes = ColumnBytes(s, 1);
      if (!d.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return Damaged(absl::StrCat("drill ", sqlite3_column_int64(s, 0)));
      }
    }
    return out;
  }

  absl::Status PutCommitIntent(const CommitIntent& c) override {
    if (c.job().empty()) return absl::InvalidArgumentError("PutCommitIntent: the intent names no job");
    CKPTD_ASSIGN_OR_RETURN(const std::string bytes, internal::SerializeForStore(c));
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = put_intent_.get();
    StmtScope scope(s);
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 1, c.job())));
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 2, bytes)));
    return StepDone(s, "put commit intent");
  }

  absl::StatusOr<std::vector<CommitIntent>> ListCommitIntents() override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* s = list_intents_.get();
    StmtScope scope(s);
    std::vector<CommitIntent> out;
    for (;;) {
      CKPTD_ASSIGN_OR_RETURN(const bool row, Step(s, "list commit intents"));
      if (!row) break;
      CommitIntent& c = out.emplace_back();
      const absl::string_view bytes = ColumnBytes(s, 1);
      if (!c.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return Damaged(absl::StrCat("commit intent of job \"", absl::CHexEscape(ColumnBytes(s, 0)), "\""));
      }
    }
    return out;
  }

 private:
  absl::Status Error(absl::string_view what, int rc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return SqliteError(path_, what, db_.get(), rc);
  }
  absl::Status Check(absl::string_view what, int rc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return rc == SQLITE_OK ? absl::OkStatus() : Error(what, rc);
  }
  absl::Status Damaged(absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat(path_, ": ", what, " does not parse; the coordinator state database is damaged"));
  }

  // True: a row is ready; false: done.
  absl::StatusOr<bool> Step(sqlite3_stmt* s, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return Error(what, rc);
  }
  // Runs a statement that returns no rows.
  absl::Status StepDone(sqlite3_stmt* s, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CKPTD_ASSIGN_OR_RETURN(const bool row, Step(s, what));
    if (row) return absl::InternalError(absl::StrCat(path_, ": ", what, ": unexpected result row"));
    return absl::OkStatus();
  }
  absl::Status Run(const StmtPtr& stmt, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StmtScope scope(stmt.get());
    return StepDone(stmt.get(), what);
  }

  absl::Status InsertEvent(const FailureEvent& event, absl::string_view bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    sqlite3_stmt* s = insert_event_.get();
    StmtScope scope(s);
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(s, 1, event.unix_nanos())));
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 2, event.job())));
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int(s, 3, static_cast<int>(event.kind()))));
    CKPTD_RETURN_IF_ERROR(Check("bind", BindBytes(s, 4, bytes)));
    return StepDone(s, "insert event");
  }

  // After a failed write in a transaction.
  void RollbackIfOpen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (sqlite3_get_autocommit(db_.get()) != 0) return;  // SQLite already rolled back
    // The first failure is what the caller needs to see; a failed rollback
    // leaves SQLite to roll back when the connection closes.
    Run(rollback_, "rollback").IgnoreError();
  }

  // Drops the oldest appended events beyond the cap (ids are contiguous).
  absl::Status TrimEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    sqlite3_stmt* s = trim_events_.get();
    StmtScope scope(s);
    CKPTD_RETURN_IF_ERROR(Check("bind", sqlite3_bind_int64(s, 1, ClampToInt64(max_events_))));
    return StepDone(s, "drop old events");
  }

  const std::string path_;
  const size_t max_events_;
  absl::Mutex mu_;
  // Declared before the statements, so that they are finalized first.
  DbPtr db_ ABSL_GUARDED_BY(mu_);
  StmtPtr begin_ ABSL_GUARDED_BY(mu_);
  StmtPtr commit_ ABSL_GUARDED_BY(mu_);
  StmtPtr rollback_ ABSL_GUARDED_BY(mu_);
  StmtPtr insert_event_ ABSL_GUARDED_BY(mu_);
  StmtPtr trim_events_ ABSL_GUARDED_BY(mu_);
  StmtPtr list_events_ ABSL_GUARDED_BY(mu_);
  StmtPtr list_job_events_ ABSL_GUARDED_BY(mu_);
  StmtPtr count_by_kind_ ABSL_GUARDED_BY(mu_);
  StmtPtr count_job_by_kind_ ABSL_GUARDED_BY(mu_);
  StmtPtr put_job_ ABSL_GUARDED_BY(mu_);
  StmtPtr list_jobs_ ABSL_GUARDED_BY(mu_);
  StmtPtr delete_job_ ABSL_GUARDED_BY(mu_);
  StmtPtr delete_quarantine_ ABSL_GUARDED_BY(mu_);
  StmtPtr put_quarantine_ ABSL_GUARDED_BY(mu_);
  StmtPtr list_quarantine_ ABSL_GUARDED_BY(mu_);
  StmtPtr list_job_quarantine_ ABSL_GUARDED_BY(mu_);
  StmtPtr put_drill_ ABSL_GUARDED_BY(mu_);
  StmtPtr trim_drills_ ABSL_GUARDED_BY(mu_);
  StmtPtr list_drills_ ABSL_GUARDED_BY(mu_);
  StmtPtr put_intent_ ABSL_GUARDED_BY(mu_);
  StmtPtr list_intents_ ABSL_GUARDED_BY(mu_);
  StmtPtr delete_intent_ ABSL_GUARDED_BY(mu_);
};

// Runs static SQL (no bound values) during open.
absl::Status Exec(sqlite3* db, const std::string& path, const char* sql, absl::string_view what) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &message);
  sqlite3_free(message);  // sqlite3_errmsg still holds it for SqliteError
  if (rc != SQLITE_OK) return SqliteError(path, what, db, rc);
  return absl::OkStatus();
}

// The single value a query (a pragma, a count) returns.
absl::StatusOr<std::string> QueryValue(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db, sql, -1, &raw, nullptr);
  StmtPtr s(raw);
  if (rc != SQLITE_OK) return SqliteError(path, sql, db, rc);
  rc = sqlite3_step(s.get());
  if (rc != SQLITE_ROW) {
    if (rc == SQLITE_DONE) return absl::InternalError(absl::StrCat(path, ": ", sql, ": no result"));
    return SqliteError(path, sql, db, rc);
  }
  const unsigned char* text = sqlite3_column_text(s.get(), 0);
  std::string value = text != nullptr ? reinterpret_cast<const char*>(text) : "";
  rc = sqlite3_step(s.get());
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return SqliteError(path, sql, db, rc);
  return value;
}

absl::StatusOr<int64_t> QueryInt(sqlite3* db, const std::string& path, const char* sql) {
  CKPTD_ASSIGN_OR_RETURN(const std::string value, QueryValue(db, path, sql));
  return std::strtoll(value.c_str(), nullptr, 10);
}

// Refuses a database of another application or of a newer schema.
absl::Status CheckOwnership(int64_t application_id, int64_t version, const std::string& path) {
  if (application_id != kApplicationId) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": not a ckptd coordinator state database (application_id ", application_id,
        ", schema version ", version, "); point --state-dir elsewhere or move the file aside"));
  }
  if (version > kStateSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the coordinator state database has schema version ", version,
        ", newer than this build supports (", kStateSchemaVersion,
        "); run a newer ckptd coordinator or use another --state-dir"));
  }
  if (version < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": the coordinator state database has no schema version"));
  }
  return absl::OkStatus();
}

// The tables added to schema version 1 (drills, commit intents), in a
// database an earlier build made (a write only when one is missing).
absl::Status AddLaterTables(sqlite3* db, const std::string& path) {
  for (const auto& [name, sql] : {std::pair<const char*, const char*>{"drills", kDrillsTable},
                                  std::pair<const char*, const char*>{"commit_intents", kCommitIntentsTable}}) {
    CKPTD_ASSIGN_OR_RETURN(
        const int64_t has,
        QueryInt(db, path,
                 absl::StrCat("SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name = '", name, "'").c_str()));
    if (has != 0) continue;
    CKPTD_RETURN_IF_ERROR(Exec(db, path, sql, absl::StrCat("add the ", name, " table")));
  }
  return absl::OkStatus();
}

// Checks the schema of an existing database or creates it in a fresh one.
absl::Status PrepareSchema(sqlite3* db, const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(int64_t application_id, QueryInt(db, path, "PRAGMA application_id"));
  CKPTD_ASSIGN_OR_RETURN(int64_t version, QueryInt(db, path, "PRAGMA user_version"));
  if (application_id != 0 || version != 0) {
    CKPTD_RETURN_IF_ERROR(CheckOwnership(application_id, version, path));
    return AddLaterTables(db, path);
  }

  // Looks fresh: create the schema, checking again under the write lock in
  // case another process got there first.
  CKPTD_RETURN_IF_ERROR(Exec(db, path, "BEGIN IMMEDIATE", "create schema: begin"));
  absl::Status status = [&]() -> absl::Status {
    CKPTD_ASSIGN_OR_RETURN(application_id, QueryInt(db, path, "PRAGMA application_id"));
    CKPTD_ASSIGN_OR_RETURN(version, QueryInt(db, path, "PRAGMA user_version"));
    if (application_id != 0 || version != 0) return CheckOwnership(application_id, version, path);
    CKPTD_ASSIGN_OR_RETURN(const int64_t tables,
                           QueryInt(db, path, "SELECT COUNT(*) FROM sqlite_schema"));
    if (tables != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": not a ckptd coordinator state database (it has ", tables,
                       " schema objects but no ckptd application_id); point --state-dir elsewhere "
                       "or move the file aside"));
    }
    CKPTD_RETURN_IF_ERROR(Exec(db, path, kSchemaV1, "create schema"));
    CKPTD_RETURN_IF_ERROR(Exec(db, path, kDrillsTable, "create schema: drills"));
    CKPTD_RETURN_IF_ERROR(Exec(db, path, kCommitIntentsTable, "create schema: commit intents"));
    CKPTD_RETURN_IF_ERROR(Exec(db, path, absl::StrCat("PRAGMA application_id = ", kApplicationId).c_str(),
                               "create schema: application_id"));
    CKPTD_RETURN_IF_ERROR(Exec(db, path, absl::StrCat("PRAGMA user_version = ", kStateSchemaVersion).c_str(),
                               "create schema: user_version"));
    return Exec(db, path, "COMMIT", "create schema: commit");
  }();
  if (!status.ok() && sqlite3_get_autocommit(db) == 0) {
    // The first failure is what the caller needs; the connection is closed next.
    Exec(db, path, "ROLLBACK", "create schema: rollback").IgnoreError();
  }
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(const std::string& state_dir,
                                                                 const StateStoreOptions& options) {
  if (state_dir.empty()) return absl::InvalidArgumentError("the coordinator state directory is not set");
  if (sqlite3_threadsafe() == 0) {
    return absl::FailedPreconditionError("the SQLite library was built without thread support");
  }

  // The directory: created with its parents when missing, and made durable.
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem({.use_io_uring = false});
  absl::StatusOr<storage::FileInfo> info = fs->Stat(state_dir);
  if (!info.ok() && !absl::IsNotFound(info.status())) return info.status();
  // Stat does not follow links; one here is the operator's (the state on
  // another disk), and SQLite opens through it.
  if (info.ok() && !info->is_directory && info->type != storage::FileType::kSymlink) {
    return absl::FailedPreconditionError(
        absl::StrCat("coordinator state directory ", state_dir, " exists and is not a directory"));
  }
  if (!info.ok()) {
    CKPTD_RETURN_IF_ERROR(storage::CreateDirs(fs.get(), state_dir));
    CKPTD_RETURN_IF_ERROR(fs->SyncDir(storage::DirName(state_dir)));
  }

  // SQLite creates the database, its WAL and its shared-memory index beside
  // each other; its own error for a read-only directory does not say why.
  if (::faccessat(AT_FDCWD, state_dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    return base::PosixError(
        absl::StrCat("coordinator state directory ", state_dir, " is not writable"), errno);
  }

  const std::string path = storage::JoinPath(state_dir, kStateDbFileName);
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  DbPtr db(raw);  // closed on every return below unless handed to the store
  if (rc != SQLITE_OK) return SqliteError(path, "open", db.get(), rc);
  sqlite3_extended_result_codes(db.get(), 1);
  if (sqlite3_db_readonly(db.get(), "main") == 1) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": the coordinator state database is read-only"));
  }
  const int busy_ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options.busy_timeout), 0, std::numeric_limits<int>::max()));
  if (const int brc = sqlite3_busy_timeout(db.get(), busy_ms); brc != SQLITE_OK) {
    return SqliteError(path, "busy_timeout", db.get(), brc);
  }

  // The first statement reads the header: a file that is not a database
  // fails here.
  CKPTD_ASSIGN_OR_RETURN(const std::string mode, QueryValue(db.get(), path, "PRAGMA journal_mode = WAL"));
  if (mode != "wal") {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": cannot use write-ahead logging (journal mode is \"", mode,
        "\"); the file system may not support shared memory"));
  }
  // Each commit is synced before it is acknowledged.
  CKPTD_RETURN_IF_ERROR(Exec(db.get(), path, "PRAGMA synchronous = FULL", "PRAGMA synchronous"));
  CKPTD_RETURN_IF_ERROR(PrepareSchema(db.get(), path));

  auto store = std::make_unique<SqliteStateStore>(path, options, std::move(db));
  CKPTD_RETURN_IF_ERROR(store->Init());
  return store;
}

}  // namespace ckptd::coordinator
