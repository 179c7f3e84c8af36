// The agent under a limit on its threads: registrations beyond
// AgentOptions::max_registrations, and registrations and exits when the
// kernel refuses threads (RLIMIT_NPROC, pids.max), which are answered
// kResourceExhausted while the agent keeps serving what it holds.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/agent_core.h"
#include "agent/testing_agent_harness.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "base/testing/users.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Rank 0 of its own one-rank job `job`, registered by process `pid`.
TrainerRegistration OneRank(const std::string& job, int32_t pid = 0) {
  TrainerRegistration r;
  r.job = job;
  r.pid = pid;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 1024)};
  return r;
}

TEST(MaxRegistrations, RegistrationBeyondTheCapIsRefusedNamingIt) {
  storage::MemFileSystem mem;
  CKPTD_ASSERT_OK(mem.CreateDir("/ckpt"));
  AgentOptions options = TestAgentOptions("cap");
  options.max_registrations = 2;
  AgentCore agent(&mem, options);
  const int32_t pid = static_cast<int32_t>(::getpid());
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle a, agent.Register(OneRank("a", pid)));
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle b, agent.Register(OneRank("b", pid)));

  EXPECT_THAT(agent.Register(OneRank("c", pid)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("job c rank 0 is refused"), HasSubstr("2 trainers are registered"),
                             HasSubstr("--max-registrations 2"))));
  EXPECT_EQ(agent.Trainers().size(), 2u);

  // The same process registering its rank again replaces its registration.
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle a2, agent.Register(OneRank("a", pid)));
  EXPECT_NE(a2.trainer_id, a.trainer_id);
  EXPECT_EQ(agent.Trainers().size(), 2u);

  // Once one exits, another fits.
  CKPTD_ASSERT_OK(agent.TrainerExited(b.trainer_id));
  CKPTD_EXPECT_OK(agent.Register(OneRank("c", pid)).status());
}

// The staging segments in /dev/shm named after `prefix` (AgentOptions::
// segment_prefix, "/name").
std::vector<std::string> SegmentsOf(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* e = ::readdir(dir)) {
    if (absl::StartsWith(e->d_name, absl::StrCat(prefix.substr(1), "-"))) names.emplace_back(e->d_name);
  }
  ::closedir(dir);
  return names;
}

// Sets the soft RLIMIT_NPROC (nullopt: back to the hard one, which stays).
std::string SetSoftThreadLimit(std::optional<rlim_t> soft) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NPROC, &limit) != 0) return absl::StrCat("getrlimit: ", std::strerror(errno));
  limit.rlim_cur = soft.value_or(limit.rlim_max);
  if (::setrlimit(RLIMIT_NPROC, &limit) != 0) return absl::StrCat("setrlimit: ", std::strerror(errno));
  return "";
}

// In a child process whose user may start only a few threads: one job keeps
// a step in memory, then jobs register until the kernel refuses a
// persister thread; then three trainers exit while no thread can be
// started. Returns what it saw, one fact a line, or "FAIL: ..." /
// "SKIP: ..." at the first thing that went otherwise.
std::string RegisterUntilThreadsRunOut() {
  storage::MemFileSystem mem;
  if (!mem.CreateDir("/ckpt").ok()) return "FAIL: /ckpt";
  ckptd::testing::CapturingLogger log;
  AgentOptions options = TestAgentOptions("nproc");
  options.logger = &log;
  AgentCore agent(&mem, options);
  std::vector<std::string> out;

  // job-0 keeps step 1 in memory (and on disk).
  absl::StatusOr<TrainerHandle> h0 = agent.Register(OneRank("job-0"));
  if (!h0.ok()) return absl::StrCat("FAIL: job-0 registers: ", h0.status().ToString());
  absl::StatusOr<std::unique_ptr<staging::StagingSegment>> seg0 = staging::StagingSegment::Open(h0->segment);
  if (!seg0.ok()) return absl::StrCat("FAIL: open ", h0->segment, ": ", seg0.status().ToString());
  absl::StatusOr<uint32_t> slot = (*seg0)->AcquireForFill(absl::Seconds(10));
  if (!slot.ok()) return absl::StrCat("FAIL: acquire: ", slot.status().ToString());
  std::memset((*seg0)->slot_data(*slot), 7, h0->slot_bytes);
  if (!(*seg0)->Publish(*slot, 1).ok() || !agent.SnapshotPublished(h0->trainer_id, *slot, 1).ok()) {
    return "FAIL: publish step 1";
  }
  absl::StatusOr<PersistStatus> st = agent.WaitPersisted(h0->trainer_id, 1, absl::Seconds(30));
  if (!st.ok() || st->last_persisted_step != std::optional<uint64_t>(1)) return "FAIL: step 1 not persisted";

  // The attack: registrations until the kernel refuses a thread.
  if (const std::string why = ckptd::testing::LimitNewThreads(7); !why.empty()) return absl::StrCat("SKIP: ", why);
  std::vector<TrainerHandle> hs;
  absl::Status refused;
  for (int j = 1; j <= 64 && refused.ok(); ++j) {
    absl::StatusOr<TrainerHandle> h = agent.Register(OneRank(absl::StrCat("job-", j)));
    if (h.ok()) {
      hs.push_back(*h);
    } else {
      refused = h.status();
    }
  }
  if (refused.ok()) return "FAIL: 64 registrations under the limit, none refused";
  if (hs.size() < 3) return absl::StrCat("FAIL: only ", hs.size(), " registrations before the refusal");
  out.push_back(absl::StrCat("refused: ", refused.ToString()));
  // The refused registration left no segment behind.
  out.push_back(absl::StrCat("segments: ", SegmentsOf(options.segment_prefix).size(), " for ", hs.size() + 1,
                             " registrations"));

  // job-0's memory checkpoint is still there, and served.
  absl::StatusOr<RestoreResult> r = agent.Restore(h0->trainer_id, absl::Seconds(10));
  if (!r.ok()) return absl::StrCat("FAIL: restore of job-0: ", r.status().ToString());
  const uint8_t* data = (*seg0)->slot_data(r->slot);
  const bool intact = std::all_of(data, data + h0->slot_bytes, [](uint8_t b) { return b == 7; });
  out.push_back(absl::StrCat("job-0 restored step ", r->step.value_or(0), " from ",
                             r->source == RestoreSource::kMemory ? "memory" : "elsewhere",
                             intact ? ", intact" : ", NOT intact"));

  // Exits while no thread can be started: job-1's waits for the next exit's
  // thread, job-2's runs on the caller's, job-3's thread finishes both.
  if (const std::string why = SetSoftThreadLimit(1); !why.empty()) return absl::StrCat("FAIL: ", why);
  agent.TrainerDied(hs[0].trainer_id);
  out.push_back(absl::StrCat("while none can start: ",
                             log.Contains(absl::StrCat("cannot start a thread for the exit of trainer ",
                                                       hs[0].trainer_id))
                                 ? "job-1's exit waits"
                                 : "job-1's exit NOT queued"));
  const absl::Status while_none = agent.Register(OneRank("job-late")).status();
  out.push_back(absl::StrCat("registration while none can start: ", absl::StatusCodeToString(while_none.code())));
  if (const std::string why = SetSoftThreadLimit(std::nullopt); !why.empty()) return absl::StrCat("FAIL: ", why);
  if (!agent.TrainerExited(hs[1].trainer_id).ok()) return "FAIL: job-2 exits";
  agent.TrainerDied(hs[2].trainer_id);
  const bool parked = ckptd::testing::Eventually([&agent] { return agent.Memory().parked == 3; });
  out.push_back(absl::StrCat("parked: ", agent.Memory().parked, parked ? "" : " (not 3 within 10 s)"));
  absl::StatusOr<TrainerHandle> again = agent.Register(OneRank("job-again"));
  out.push_back(absl::StrCat("after the exits: ", again.ok() ? "registered" : again.status().ToString()));
  return absl::StrJoin(out, "\n");
}

TEST(ThreadLimit, RegistrationsBeyondTheThreadLimitAreRefusedAndTheAgentKeepsServing) {
  std::string out;
  if (::geteuid() == 0) {
    // Root is exempt from RLIMIT_NPROC: the child becomes a user of the
    // test's own, whose threads nothing else counts.
    const std::vector<uint32_t> ids = ckptd::testing::UnusedIds(24);
    if (ids.size() < 24) GTEST_SKIP() << "no unused uid in 61000..61999";
    out = ckptd::testing::RunAs({.uid = ids[22], .groups = {ids[22]}}, RegisterUntilThreadsRunOut);
  } else {
    out = ckptd::testing::RunInChild(RegisterUntilThreadsRunOut);
  }
  if (absl::StartsWith(out, "SKIP: ")) GTEST_SKIP() << out;
  ASSERT_FALSE(absl::StartsWith(out, "FAIL: ")) << out;
  EXPECT_THAT(out, HasSubstr("refused: RESOURCE_EXHAUSTED: register: job job-"));
  EXPECT_THAT(out, HasSubstr("is refused, no thread for its persister: cannot start a thread for "));
  EXPECT_THAT(out, HasSubstr("Resource temporarily unavailable"));
  const std::vector<std::string> lines = absl::StrSplit(out, '\n');
  ASSERT_GE(lines.size(), 7u) << out;
  // "segments: N for N registrations"
  const std::vector<std::string> words = absl::StrSplit(lines[1], ' ');
  ASSERT_EQ(words.size(), 5u) << lines[1];
  EXPECT_EQ(words[1], words[3]) << "a segment of the refused registration stays in /dev/shm: " << lines[1];
  EXPECT_EQ(lines[2], "job-0 restored step 1 from memory, intact");
  EXPECT_EQ(lines[3], "while none can start: job-1's exit waits");
  EXPECT_EQ(lines[4], "registration while none can start: RESOURCE_EXHAUSTED");
  EXPECT_EQ(lines[5], "parked: 3");
  EXPECT_EQ(lines[6], "after the exits: registered");
}

}  // namespace
}  // namespace ckptd::agent
