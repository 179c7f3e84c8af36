// What the coordinator knows of one job, and the rules that keep it
// consistent: its ranks and their progress, pending, aborted, committed and
// quarantined steps, the restore round, the schedule's generation, and the
// measurements the interval policy reads. A private part of CoordinatorCore,
// which holds its mutex around every call (the class itself is not
// thread-safe) and decides what to do; this class keeps the bookkeeping right.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckptd/v1/coordinator.pb.h"
#include "policy/interval_policy.h"

namespace ckptd::coordinator::internal {

// A duration a rank or agent reports (a step time, a stall, a persist) beyond
// this is no measurement: no checkpoint or step takes a day, and one such
// value would lift every rank's hang limit (the job's step time feeds them).
inline constexpr double kMaxReportedSeconds = 86400;
// Incarnations count a job's restore rounds: one a report names beyond this
// (a round a second for 136 years) is corrupt, and the job's count stays far
// from wrapping.
inline constexpr uint64_t kMaxIncarnation = uint64_t{1} << 32;

// A rank of the job, as its agent last told.
struct Rank {
  std::string node_id;
  int32_t pid = 0;
  bool alive = false;
  bool has_progress = false;
  bool hung = false;
  uint64_t step = 0;
  absl::Time last_progress;
  double step_seconds = 0;
  double step_seconds_idle = 0;        // with no persist of the rank in flight
  double step_seconds_persisting = 0;  // with one
  uint64_t skipped = 0;
};

// A step some ranks have reported durable.
struct PendingStep {
  absl::Time first_report;
  absl::Time last_report;
  uint64_t incarnation = 0;
  std::map<uint32_t, ckptd::v1::ShardRef> shards;
  bool committing = false;
  // The slowest rank's: what the step cost the job.
  double max_stall = 0;
  double max_persist = 0;
  // Written by emergency persists (Job::Emergency): its timings are not the
  // policy's measurements.
  bool emergency = false;
};

// The ranks' agreement on what to restore after a restart.
struct RestoreRound {
  std::optional<uint64_t> step;  // nullopt: fresh start
  std::set<uint32_t> ok;
  bool go = false;
  // The trainer of each rank that asked in this round ("<node>#<agent
  // process instance>#<agent's trainer id>", when its agent said): the same
  // rank asking again as another trainer was restarted.
  std::map<uint32_t, std::string> askers;
  // Where each rank that loaded `step` read it from (as its agent said).
  std::map<uint32_t, ckptd::v1::RestoreSource> sources;
  // The ranks that read `step` resharded, and the world size that saved it.
  std::map<uint32_t, uint32_t> resharded_from;
  // `step` is a memory checkpoint: no MANIFEST, copies in memory only.
  bool memory = false;
  // Taken over from the job's record (another coordinator opened it): who
  // asked and who loaded are not known, only the step and `go`.
  bool recovered = false;
};

struct AbortedStep {
  uint64_t incarnation = 0;  // the step's reports up to this incarnation are void
  std::string reason;
};

// A restart that completed, for drill reports.
struct Resume {
  absl::Time failed;
  absl::Time resumed;
  std::optional<uint64_t> restored;  // nullopt: fresh start
  uint64_t step_at_failure = 0;
  ckptd::v1::RestoreSummary sources;  // where each rank read `restored`
};

class Job {
 public:
  // A job first heard of now: schedule generation 1, saved at once.
  static std::unique_ptr<Job> Create(const std::string& name, uint32_t world_size, uint64_t every_steps,
                                     uint64_t durable_every = 0);
  // A job a previous coordinator saved; the recent means of its
  // measurements seed the policy's windows.
  static std::unique_ptr<Job> Recovered(const ckptd::v1::JobRecord& record);
  // A job known only from committed steps in storage.
  static std::unique_ptr<Job> Discovered(const std::string& name, uint32_t world_size, uint64_t every_steps,
                                         uint64_t durable_every = 0);

  const std::string& name() const { return record_.job(); }
  uint32_t world_size() const { return record_.world_size(); }
  uint64_t incarnation() const { return record_.schedule().incarnation(); }
  ckptd::v1::JobState state() const { return record_.schedule().state(); }
  const ckptd::v1::JobRecord& record() const { return record_; }
  const ckptd::v1::Schedule& schedule() const { return record_.schedule(); }
  const std::map<uint32_t, Rank>& ranks() const { return ranks_; }
  const std::map<uint64_t, PendingStep>& pending() const { return pending_; }
  const std::set<uint64_t>& committed() const { return committed_; }
  const std::map<uint64_t, std::string>& quarantined() const { return quarantined_; }
  const std::map<uint64_t, AbortedStep>& aborted() const { return aborted_; }
  const std::optional<RestoreRound>& round() const { return round_; }
  // The round under way once every rank loaded its step: the step, and where
  // each rank read it (with its node); nullopt before, and for a fresh start.
  std::optional<ckptd::v1::RestoreSummary> RoundSummary() const;
  const std::deque<Resume>& resumes() const { return resumes_; }
  const policy::RecentWindow& stalls() const { return stalls_; }
  const policy::RecentWindow& persists() const { return persists_; }
  const policy::RecentWindow& restarts() const { return restarts_; }
  bool verifying(uint64_t step) const { return verifying_.contains(step); }
  absl::Time last_decided() const { return last_decided_; }
  void set_last_decided(absl::Time t) { last_decided_ = t; }
  // When a rank of the job last ran (or the coordinator first heard of it).
  absl::Time last_alive() const { return last_alive_; }
  void set_last_alive(absl::Time t) { last_alive_ = t; }
  bool verifying_any() const { return !verifying_.empty(); }
  // Shards its agents could not persist since this coordinator started, and
  // the newest one's detail and time (not saved: a count for operators).
  struct PersistFailures {
    uint64_t count = 0;
    std::string last_detail;
    absl::Time last;
  };
  const PersistFailures& persist_failures() const { return persist_failures_; }
  void NotePersistFailure(const std::string& detail, absl::Time now) {
    ++persist_failures_.count;
    persist_failures_.last_detail = detail;
    persist_failures_.last = now;
  }

  // When the job's newest commit was made (a MANIFEST written, or found
  // written at recovery); InfinitePast: none known.
  absl::Time last_commit() const { return last_commit_; }
  void NoteCommitTime(absl::Time when) { last_commit_ = std::max(last_commit_, when); }

  // The newest committed step that is not quarantined.
  std::optional<uint64_t> NewestUsable() const;
  // The highest step any rank (alive or not) reported.
  uint64_t FastestStep() const;
  bool AnyRankAlive() const;

  // --- Recovery: a committed step and the shards its MANIFEST names.
  void RecoverCommitted(uint64_t step, const google::protobuf::RepeatedPtrField<ckptd::v1::ShardRef>& shards);

  // --- Membership.
  // The whole job came back with another world size: its ranks start over,
  // and steps the old world was still writing are aborted (none of its ranks
  // runs to finish them). kFailedPrecondition while a rank is alive or a
  // step is being committed.
  absl::Status Resize(uint32_t world_size);
  // What Resize(world_size) would answer, changing nothing.
  absl::Status CheckResize(uint32_t world_size) const;
  // A rank its agent registered (what it knew of the rank's progress stays).
  void RegisterRank(uint32_t rank, const std::string& node, int32_t pid);
  // A rank its agent's heartbeat lists: a new one when it was dead, or runs
  // elsewhere or as another process.
  // Returns whether the job had finished (finished()) before: the rank
  // registered again after its run ended.
  bool RefreshRank(uint32_t rank, const std::string& node, int32_t pid);
  // Every rank of the world left while the job ran, with no failure: each
  // trainer said goodbye (its rank is gone from its agent's heartbeat), so
  // the run finished. A rank that registers again ends it (RefreshRank).
  bool finished() const;
  // Why this run's restores should be told that the job's name was used by
  // a run that finished (set when a rank registered again after it, see
  // RefreshRank); it goes out with every restore plan until this run
  // commits a step of its own. Empty: nothing to tell. Not persisted: a
  // coordinator that restarts meanwhile forgets it (its log keeps it).
  const std::string& reuse_warning() const { return reuse_warning_; }
  void set_reuse_warning(std::string why) { reuse_warning_ = std::move(why); }
  // The rank, if it runs on `node`, is no longer alive.
  void RankGone(uint32_t rank, const std::string& node);
  void MarkHung(uint32_t rank);

  // --- Progress.
  // Records a rank's progress and step times, and ends a restart at the
  // first step past the restored one. False (nothing changed) when the rank
  // does not run on `node`.
  bool RecordProgress(const std::string& node, const ckptd::v1::RankProgress& progress, absl::Time now);
  // Adds the GPU time of `ranks_alive` ranks over `elapsed` seconds, and
  // saves the commits' counters (MarkCommitted) with the next record.
  void Tick(uint32_t ranks_alive, double elapsed);

  // --- The schedule (each change raises its generation).
  // A rank passed the manual target `missed` before it heard of it: moves it
  // to `lead` steps ahead of the fastest rank. False when `missed` is no
  // manual target.
  bool RetargetMissed(uint64_t missed, uint64_t lead);
  // Adds a manual checkpoint at `target`, keeping at most 64 targets that
  // are not far behind `fastest`. False when it was there already.
  bool AddManualTarget(uint64_t target, uint64_t fastest);
  // A new rule: every `every_steps` from `start_step`, every
  // `durable_every`-th of them durable (0 or 1: all), and the one-off
  // targets `extra_steps` (durable) and `memory_steps`.
  void SetRule(uint64_t every_steps, uint64_t durable_every, uint64_t start_step,
               const std::vector<uint64_t>& extra_steps, const std::vector<uint64_t>& memory_steps = {},
               uint64_t durable_phase = 0);

  // --- Shards and commits.
  // Whether a rank's report may name `incarnation`: kFailedPrecondition when
  // it is later than the job's and this coordinator opened a restore round
  // of the job (it issued every incarnation since, so no rank can know of a
  // later one). Before that, the job's count may be behind the ranks'.
  absl::Status CheckIncarnation(uint64_t incarnation) const;
  // A rank counts incarnations further than the job does, and the job's
  // count is not this coordinator's own yet (it lost its database, or
  // stopped before saving the last round): the job takes the rank's count.
  // REQUIRES: CheckIncarnation(incarnation) is ok, incarnation <=
  // kMaxIncarnation.
  void RaiseIncarnation(uint64_t incarnation);
  // Adds a rank's durable shard of `step`. True when it completes the step,
  // which is then committing until EndCommit.
  bool AddShard(uint64_t step, const ckptd::v1::ShardRef& shard, double stall_seconds, uint64_t incarnation,
                absl::Time now);
  // Aborts a step (pending or not): its reports of this incarnation are void
  // from now on. False, and nothing changes, while the step is committing.
  bool AbortStep(uint64_t step, const std::string& why);
  void EndCommit(uint64_t step);
  // The step committed with the slowest rank's stall and persist time
  // (measured: false for an emergency persist's, which the policy does not
  // learn from). Memory checkpoints at or before it are no longer needed.
  void MarkCommitted(uint64_t step, double stall, double persist, bool measured = true);

  // The shards of the committed `step` (its MANIFEST's), for matching the
  // copies agents hold in memory (CommittedShard).
  void SetCommittedShards(uint64_t step, const std::vector<ckptd::v1::ShardRef>& shards);
  // Retention removed the committed step.
  void DropCommitted(uint64_t step) {
    committed_.erase(step);
    committed_shards_.erase(step);
  }
  // The committed `step`'s shard of `rank` as its MANIFEST names it: a copy
  // in memory with the same (file_length, index_xxh3) is of that shard.
  // nullopt when the step is not committed or its shards are not known.
  struct ShardDigest {
    uint64_t file_length = 0;
    uint64_t index_xxh3 = 0;
  };
  std::optional<ShardDigest> CommittedShard(uint64_t step, uint32_t rank) const;

  // --- Memory checkpoints (Schedule.durable_every): a rank's snapshot kept
  // in its agent's memory, reported with the digest of the shard a raw write
  // of it would be; complete when every rank reported it. Only memory
  // checkpoints newer than the newest durable step are kept, at most
  // kMaxMemorySteps; they live in the coordinator's memory only.
  struct MemoryStep {
    std::map<uint32_t, ShardDigest> shards;
    double max_stall = 0;
    uint64_t incarnation = 0;
    bool complete = false;
  };
  static constexpr size_t kMaxMemorySteps = 8;
  // Adds a rank's report; true when it completes the step (its stall is
  // then measured like a committed step's). False for a step no newer than
  // the newest durable one.
  bool AddMemoryShard(uint64_t step, uint32_t rank, ShardDigest digest, double stall_seconds, uint64_t incarnation);
  const std::map<uint64_t, MemoryStep>& memory_steps() const { return memory_steps_; }
  // Forgets a memory checkpoint (a copy of it failed to load).
  void DropMemoryStep(uint64_t step);

  // --- Emergency persist (ckptd.v1.PersistOrder): after a failure, the
  // newest memory checkpoint newer than every durable step is written to
  // storage from the copies that survived, each rank's by the node holding
  // its copy, and commits like any step. It ends when the step commits or a
  // newer one does, or the step is aborted or no longer a memory checkpoint
  // (a copy failed to load, a restore went to an older step).
  struct Emergency {
    uint64_t step = 0;
    uint64_t incarnation = 0;  // the memory checkpoint's reports'
    // rank -> the node ordered to write its copy (ranks already written
    // need none).
    std::map<uint32_t, std::string> holders;
  };
  const std::optional<Emergency>& emergency() const { return emergency_; }
  void SetEmergency(std::optional<Emergency> emergency) { emergency_ = std::move(emergency); }
  // Adds an emergency persist's shard of `step` (pending like any other, its
  // timings not measured). True when it completes the step.
  bool AddEmergencyShard(uint64_t step, const ckptd::v1::ShardRef& shard, absl::Time now);
  std::vector<uint64_t> PendingBefore(uint64_t step) const;
  // Pending steps after `step` (all of them for nullopt).
  std::vector<uint64_t> PendingAfter(std::optional<uint64_t> step) const;
  // Pending steps not committing whose first report is older than `deadline`.
  std::vector<uint64_t> PendingPastDeadline(absl::Time now, absl::Duration deadline) const;

  // --- Failures and restore rounds.
  // The job stops for a restart (once per restart: false when it already
  // was restarting).
  bool Restart(absl::Time now);
  // What caused the restart under way, for the failure-rate estimate by
  // class (policy/two_level.h): a trainer that died or hung is a process
  // failure, one lost node a node failure, a second node lost before the
  // job runs again a wide one. The restart counts once, in the widest class
  // seen (moved up as failures arrive). No-op when not restarting.
  void ClassifyFailure(ckptd::v1::FailureKind kind, const std::string& node);
  // The failures counted per class, oldest records' unclassified ones as
  // process failures.
  std::array<uint64_t, 3> FailuresByClass() const;
  // Every rank restores from the newest usable step (or the memory
  // checkpoint `memory_step`, newer than it, whose copies the caller found),
  // in a new incarnation. Memory checkpoints after the round's step are
  // forgotten.
  void StartRestoreRound(std::optional<uint64_t> memory_step = std::nullopt);
  // A round taken over from the record (Recovered) whose step a newer
  // committed step passed (found in storage after the record was saved) is
  // over: forgotten, so that the ranks' next plans open a new one.
  void EndRoundTakenOverIfPast();
  // Whether a plan request of `rank` needs a new round.
  bool NeedsNewRound(uint32_t rank, bool has_attempt) const;
  // Whether `asker` (the trainer asking for `rank`'s plan: "<node>#<instance>#<id>",
  // empty when unknown) running as process `pid` on `node` is another
  // trainer than the one known to run the rank: the one that asked in the
  // round under way, else the one whose progress was recorded. False when
  // neither is known.
  bool IsNewTrainer(uint32_t rank, const std::string& asker, const std::string& node, int32_t pid) const;
  // Whether `asker` (non-empty) already asked for `rank` in the round under way.
  bool AskedBefore(uint32_t rank, const std::string& asker) const;
  // Whether any rank reported a step past 0 since the last restart (the job
  // runs).
  bool AnyRankProgressing() const;
  // `asker` asks for `rank` in the round under way (empty: unknown).
  void TakePart(uint32_t rank, const std::string& asker);
  // A rank's turn in the round under way, and the plan it gets: it starts
  // fresh; it has not loaded the round's step yet; it loaded it intact.
  ckptd::v1::RestorePlanResponse StartsFresh(uint32_t rank);
  ckptd::v1::RestorePlanResponse NotLoaded(uint32_t rank);
  // `saved_world_size` > 0: it read the step resharded, saved by that many
  // ranks.
  ckptd::v1::RestorePlanResponse Loaded(uint32_t rank,
                                        ckptd::v1::RestoreSource source = ckptd::v1::RESTORE_SOURCE_UNSPECIFIED,
                                        uint32_t saved_world_size = 0);
  // The rank, as `asker`, read the round's `step` again from `source` (the
  // copy it loaded first failed its trainer's check): where it read it
  // changes, also in the record of the resume when the job resumed already.
  // kFailedPrecondition unless `asker` loaded `step` in the round under way.
  absl::Status Reread(uint32_t rank, const std::string& asker, uint64_t step, ckptd::v1::RestoreSource source,
                      uint32_t saved_world_size = 0);
  // The round's step was found damaged (and quarantined): every rank falls
  // back to the newest usable step, in the same incarnation.
  ckptd::v1::RestorePlanResponse FallBack();
  ckptd::v1::RestorePlanResponse Plan() const;
  // Marks a committed step damaged: never restored again, kept by retention.
  void Quarantine(uint64_t step, const std::string& reason) { quarantined_[step] = reason; }
  // The operator allowed a fresh start over the committed steps up to `step`
  // (storage::CheckpointStore::AllowFreshStart).
  void AllowFreshStartOver(uint64_t step) { fresh_allowed_over_ = step; }
  // Whether a fresh start now would pass over committed steps (all
  // quarantined) that the operator has not allowed it to.
  bool FreshStartNeedsConsent() const;
  // Why a restart is held back ("" when it is not); true when that is news.
  bool SetRestoreBlocked(const std::string& why);
  const std::string& restore_blocked() const { return restore_blocked_; }

  // --- Verification: retention leaves a pinned step alone.
  void Pin(uint64_t step) { ++verifying_[step]; }
  void Unpin(uint64_t step);

  // --- Saving.
  bool dirty() const { return dirty_; }
  void MarkChanged() { dirty_ = true; }
  // The record to save now: at once after a decision, every few seconds
  // when only timings changed; nullopt when nothing is due.
  std::optional<ckptd::v1::JobRecord> RecordToSave(absl::Time now);

 private:
  // Rank `rank` of the round under way read its step resharded, saved by
  // `saved_world_size` ranks (0: read as saved).
  void NoteResharded(uint32_t rank, uint32_t saved_world_size);
  // The round under way into the record, to be saved at once (a coordinator
  // taking the job over reads it: RestoreRoundRecord).
  void RecordRound();
  Job() = default;
  void ScheduleChanged();
  void ForgetProgress();

  ckptd::v1::JobRecord record_;  // world size, schedule (with the incarnation), timings, counters
  std::map<uint32_t, Rank> ranks_;
  std::map<uint64_t, PendingStep> pending_;
  std::set<uint64_t> committed_;
  std::map<uint64_t, MemoryStep> memory_steps_;
  std::optional<Emergency> emergency_;
  // Per committed step (from its commit or its MANIFEST at recovery), the
  // digest of each rank's shard, by rank (file_length 0: none named).
  std::map<uint64_t, std::vector<ShardDigest>> committed_shards_;
  std::map<uint64_t, std::string> quarantined_;  // step -> why
  // Committed steps being verified (a count per step): retention leaves them
  // alone until the verification ends; the next commit drops them if due.
  std::map<uint64_t, int> verifying_;
  std::map<uint64_t, AbortedStep> aborted_;
  std::optional<RestoreRound> round_;
  std::optional<uint64_t> fresh_allowed_over_;
  std::string restore_blocked_;
  // This coordinator opened a restore round of the job: the incarnation is
  // its own count, which no report may exceed (CheckIncarnation).
  bool incarnation_issued_ = false;
  // Changed schedule, counters or world size: saved at once. Changed
  // timings only: saved every few seconds. The counters of a commit: saved
  // by the next Tick, so that the answer to the report that completed the
  // step does not wait for a database sync (the step itself is durable in
  // its MANIFEST, which Recover reads back).
  bool dirty_ = false;
  bool timings_dirty_ = false;
  bool save_at_tick_ = false;
  absl::Time last_saved_;
  // The interval policy's measurements: per committed checkpoint the slowest
  // rank's stall and persist time; per restart the time from the failure to
  // the first step after it. `failed_at_`: a restart is under way.
  policy::RecentWindow stalls_, persists_, restarts_;
  std::optional<absl::Time> failed_at_;
  uint64_t step_at_failure_ = 0;  // the fastest rank's, when failed_at_ was set
  std::string reuse_warning_;  // reuse_warning()
  // The restart under way: its class so far (-1: none counted yet) and the
  // nodes it lost.
  int restart_class_ = -1;
  std::set<std::string> restart_lost_nodes_;
  absl::Time last_decided_;
  absl::Time last_alive_;
  // The restarts that completed, newest last (a few).
  std::deque<Resume> resumes_;
  absl::Time last_commit_ = absl::InfinitePast();
  PersistFailures persist_failures_;
};

}  // namespace ckptd::coordinator::internal
