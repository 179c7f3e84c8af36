// ckptd-demo-trainer: a deterministic CPU trainer in which all five state
// components matter, checkpointed through the node's agent. Parameters are
// trained with Adam on a synthetic, shuffled data set; gradients accumulate
// over micro-batches (the step counts micro-batches, so a snapshot can land
// mid-accumulation); a saved RNG adds dropout-like noise; a data cursor walks
// the shuffled epochs. The last line is `final_step=<n> digest=<hex>`, a
// digest of all five components: a resumed run must print the same one.
// With --sharded the ranks train one model split over them instead, which a
// job may restore onto another number of ranks (docs/elastic.md).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/flags.h"
#include "base/limits.h"
#include "base/version.h"
#include "client/client.h"
#include "format/checksum.h"

namespace {

const char kUsage[] =
    "usage: ckptd-demo-trainer --socket <path> --job <name> --steps <n> --state-mb <m>\n"
    "                          [--rank r --world-size w] [--every k] [--accum a] [--step-ms t]\n"
    "                          [--skip-restore COMPONENT] [--agent-wait-ms t] [--pace-file PATH]\n"
    "                          [--sharded] [--help] [--version]\n"
    "\n"
    "Ranges: --steps 1..2^62, --state-mb 1..65536 (MiB of state), --world-size\n"
    "1..1048576 (default 1), --rank 0..world-size - 1 (default 0), --every 0..2^40,\n"
    "--accum 1..1000000, --step-ms 0..3600000, --agent-wait-ms 0..86400000. A\n"
    "value outside its range is a usage error (exit 2).\n"
    "\n"
    "Restores from the newest committed step when there is one, trains to step n\n"
    "(micro-batches; an optimizer step every a of them, default 4), snapshots\n"
    "every k steps (default 10; 0: never), and prints, as its last line,\n"
    "final_step=<n> digest=<hex> train_s=<seconds of the training loop>.\n"
    "--step-ms slows each step down (for tests that kill the trainer mid-run).\n"
    "--pace-file: while PATH exists and holds an integer in 0..3600000, each step\n"
    "takes that many milliseconds instead of --step-ms (read at every step; the\n"
    "demo slows its job down this way while drills strike it).\n"
    "--agent-wait-ms keeps trying to reach an agent that is not up yet (default 0:\n"
    "train without checkpoints at once); ranks of a multi-node job that restart\n"
    "with their agent should wait for it.\n"
    "--skip-restore PARAMS|GRADS|OPTIMIZER|RNG|DATA_CURSOR drops that component\n"
    "after a restore (tests use it to show that every component matters).\n"
    "--sharded: the ranks train one model of --state-mb MiB (all ranks together)\n"
    "split over them, each rank its part of the elements (global shape and\n"
    "offsets declared to ckptd), with the same data, RNG and cursor on every rank:\n"
    "what the job computes does not depend on the number of ranks, and a restart\n"
    "with another number restores from a checkpoint of any. digest= is then this\n"
    "rank's part of the job's digest: the sum of every rank's (mod 2^64, hex) is\n"
    "the same for any number of ranks.\n"
    "\n"
    "When the node's agent reports to a coordinator, the coordinator's schedule\n"
    "replaces --every, and when it detects a failure of the job (a rank died or\n"
    "hung, a node was lost) the trainer exits with status 75: its launcher starts\n"
    "every rank again, and all of them restore the same committed step.\n";

// The coordinator asked every rank to restart (EX_TEMPFAIL).
constexpr int kExitRestart = 75;

// The ranges of the numeric flags (kUsage states them).
constexpr uint64_t kMaxSteps = uint64_t{1} << 62;  // the coordinator's largest step
constexpr uint64_t kMaxStateMb = 65536;            // 64 GiB of training state
constexpr uint64_t kMaxEvery = uint64_t{1} << 40;  // as the coordinator's --every
constexpr int kMaxAccum = 1'000'000;
constexpr uint64_t kMaxStepMs = 3'600'000;        // 1 h
constexpr uint64_t kMaxAgentWaitMs = 86'400'000;  // 1 day

constexpr uint64_t kDatasetSize = 997;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

struct Cursor {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t seed = 12345;
};

struct Adam {
  uint64_t t = 0;
};

struct State {
  std::vector<float> params, grads, m, v;
  Adam adam;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  Cursor cursor;
  uint64_t first = 0;  // global index of params[0] (--sharded)

  // Every rank reads its own shuffle of the data with its own noise, so the
  // ranks' states differ (a restore of another rank's shard would show).
  State(size_t n, uint32_t rank) : params(n), grads(n), m(n), v(n) {
    rng ^= Mix(rank) * (rank != 0);
    cursor.seed += rank;
    for (size_t i = 0; i < n; ++i) params[i] = static_cast<float>(static_cast<int64_t>(Mix(i) % 2001) - 1000) * 1e-4f;
  }
  // --sharded: elements [first, first + n) of one model, the data, noise and
  // cursor the job's (the same on every rank).
  State(size_t n, uint64_t first_index) : params(n), grads(n), m(n), v(n), first(first_index) {
    for (size_t i = 0; i < n; ++i) {
      params[i] = static_cast<float>(static_cast<int64_t>(Mix(first + i) % 2001) - 1000) * 1e-4f;
    }
  }

  uint64_t NextRandom() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  }

  // The sample the cursor points at: a permutation of the data set per epoch.
  uint64_t NextSample() {
    const uint64_t s = Mix(cursor.seed ^ Mix(cursor.epoch * kDatasetSize + cursor.position)) % kDatasetSize;
    if (++cursor.position == kDatasetSize) {
      cursor.position = 0;
      ++cursor.epoch;
    }
    return s;
  }

  void MicroStep() {
    const uint64_t sample = NextSample();
    const float target = static_cast<float>(sample % 17) * 0.01f;
    const uint64_t drop = NextRandom();
    for (size_t i = 0; i < params.size(); ++i) {
      // Dropout-like: every element's use of this sample depends on the RNG.
      const uint64_t g = first + i;
      if (((drop >> (g % 61)) & 3) == 0) continue;
      grads[i] += params[i] - target * static_cast<float>((g % 7) + 1);
    }
  }

  void OptimizerStep(int accum) {
    ++adam.t;
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1 - std::pow(b1, static_cast<float>(adam.t));
    const float c2 = 1 - std::pow(b2, static_cast<float>(adam.t));
    for (size_t i = 0; i < params.size(); ++i) {
      const float g = grads[i] / static_cast<float>(accum);
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      params[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      grads[i] = 0;
    }
  }

  std::string Digest() const {
    std::string all;
    auto add = [&all](const void* p, size_t n) { all.append(static_cast<const char*>(p), n); };
    add(params.data(), params.size() * 4);
    add(grads.data(), grads.size() * 4);
    add(m.data(), m.size() * 4);
    add(v.data(), v.size() * 4);
    add(&adam, sizeof(adam));
    add(&rng, sizeof(rng));
    add(&cursor, sizeof(cursor));
    return ckptd::format::ChecksumHex(ckptd::format::Xxh3(all));
  }

  // --sharded: this rank's part of the job's digest. Each element adds a
  // hash of its global index, its array and its bits, so the sum over the
  // ranks is the same however the elements are split; rank 0 adds the
  // job-wide optimizer step, RNG and cursor once.
  uint64_t DigestPart(bool with_shared) const {
    uint64_t sum = 0;
    const std::vector<float>* arrays[] = {&params, &grads, &m, &v};
    for (uint64_t a = 0; a < 4; ++a) {
      const std::vector<float>& x = *arrays[a];
      for (size_t i = 0; i < x.size(); ++i) {
        uint32_t bits = 0;
        std::memcpy(&bits, &x[i], sizeof(bits));
        sum += Mix(Mix(((first + i) << 2) | a) ^ bits);
      }
    }
    if (with_shared) {
      std::string shared;
      auto add = [&shared](const void* p, size_t n) { shared.append(static_cast<const char*>(p), n); };
      add(&adam, sizeof(adam));
      add(&rng, sizeof(rng));
      add(&cursor, sizeof(cursor));
      sum += ckptd::format::Xxh3(shared);
    }
    return sum;
  }
};

ckptd::client::BufferSpec Spec(std::string name, ckptd::v1::Component c, ckptd::v1::DType d, uint64_t n, void* p) {
  ckptd::client::BufferSpec b;
  b.name = std::move(name);
  b.component = c;
  b.dtype = d;
  b.shape = {n};
  b.data = p;
  return b;
}

// A part of one global array: `n` of `total` elements from `first`.
ckptd::client::BufferSpec Slice(std::string name, ckptd::v1::Component c, uint64_t n, uint64_t total, uint64_t first,
                                void* p) {
  ckptd::client::BufferSpec b = Spec(std::move(name), c, ckptd::v1::FLOAT32, n, p);
  b.global_shape = {total};
  b.offsets = {first};
  return b;
}

// The time a step takes: what `pace_file` holds while it exists and holds a
// number in range, else `step_ms`.
uint64_t StepMs(const std::string& pace_file, uint64_t step_ms) {
  if (pace_file.empty()) return step_ms;
  std::ifstream in(pace_file);
  uint64_t ms = 0;
  if (!(in >> ms) || ms > kMaxStepMs) return step_ms;
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  using ckptd::base::Args;
  std::vector<std::string> argv_list(argv + 1, argv + argc);
  if (ckptd::base::AsksForVersion(argv_list)) {
    std::cout << ckptd::base::VersionLine("ckptd-demo-trainer") << "\n";
    return 0;
  }
  absl::StatusOr<Args> args = Args::Parse(argv_list,
                                          {"socket", "job", "steps", "state-mb", "rank", "world-size", "every", "accum",
                                           "step-ms", "skip-restore", "agent-wait-ms", "pace-file"},
                                          {"help", "sharded"});
  if (args.ok() && args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  auto usage = [](const std::string& why) {
    std::cerr << "ckptd-demo-trainer: " << why << "\n" << kUsage;
    return ckptd::base::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  if (!args->Get("socket") || !args->Get("job")) return usage("--socket and --job are required");
  if (!args->positional().empty()) return usage("unexpected argument \"" + args->positional()[0] + "\"");
  // Every number is parsed wide and checked against what the trainer and the
  // agent handle before it is narrowed (kUsage states the ranges).
  uint64_t steps = 0, state_mb = 0, every = 10, step_ms = 0, agent_wait_ms = 0;
  uint32_t rank = 0, world_size = 1;
  int accum = 4;
  for (const absl::Status& s :
       {args->ReadUint("steps", 1, kMaxSteps, &steps), args->ReadUint("state-mb", 1, kMaxStateMb, &state_mb),
        args->ReadUint("world-size", 1, ckptd::base::kMaxWorldSize, &world_size),
        args->ReadUint("every", 0, kMaxEvery, &every), args->ReadUint("accum", 1, kMaxAccum, &accum),
        args->ReadUint("step-ms", 0, kMaxStepMs, &step_ms),
        args->ReadUint("agent-wait-ms", 0, kMaxAgentWaitMs, &agent_wait_ms)}) {
    if (!s.ok()) return usage(std::string(s.message()));
  }
  // The rank's range is the world's.
  if (absl::Status s = args->ReadUint("rank", 0, world_size - 1, &rank); !s.ok()) {
    return usage(absl::StrCat(s.message(), " (--world-size is ", world_size, ")"));
  }
  if (!args->Get("steps") || !args->Get("state-mb")) return usage("--steps and --state-mb are required");
  const std::string skip = args->Get("skip-restore").value_or("");
  const std::string pace_file = args->Get("pace-file").value_or("");
  if (!skip.empty() && skip != "PARAMS" && skip != "GRADS" && skip != "OPTIMIZER" && skip != "RNG" &&
      skip != "DATA_CURSOR") {
    return usage("--skip-restore must be one of PARAMS, GRADS, OPTIMIZER, RNG, DATA_CURSOR, got \"" + skip + "\"");
  }

  // state-mb counts parameters + gradients + two Adam moments, 4 bytes each:
  // at most kMaxStateMb MiB, so the product cannot overflow.
  static_assert(kMaxStateMb <= (UINT64_MAX >> 20) / 16);
  const bool sharded = args->Has("sharded");
  const uint64_t total = std::max<uint64_t>(1, state_mb * (uint64_t{1} << 20) / 16);
  // --sharded: rank r holds its part of `total` (the first total % world
  // ranks one element more); a rank may hold none.
  const uint64_t first =
      sharded ? rank * (total / world_size) + std::min<uint64_t>(rank, total % world_size) : 0;
  if (sharded && total < world_size) {
    return usage(absl::StrCat("--sharded: ", total, " elements (--state-mb ", state_mb, ") cannot be split over ",
                              world_size, " ranks"));
  }
  const size_t n = sharded ? total / world_size + (rank < total % world_size ? 1 : 0) : total;
  std::optional<State> allocated;
  try {
    if (sharded) {
      allocated.emplace(n, first);
    } else {
      allocated.emplace(n, rank);
    }
  } catch (const std::bad_alloc&) {  // the one exception a size the user chose may raise
    std::cerr << "ckptd-demo-trainer: cannot allocate " << state_mb << " MiB of training state (--state-mb)\n";
    return 1;
  }
  State& state = *allocated;
  ckptd::client::ClientOptions options;
  options.socket = *args->Get("socket");
  options.job = *args->Get("job");
  options.rank = rank;
  options.world_size = world_size;
  options.every_steps = every;
  options.connect_wait = absl::Milliseconds(static_cast<int64_t>(agent_wait_ms));
  options.slot_wait = absl::Seconds(30);
  std::vector<ckptd::client::BufferSpec> specs;
  if (sharded) {
    specs = {Slice("model.params", ckptd::v1::PARAMS, n, total, first, state.params.data()),
             Slice("model.grads", ckptd::v1::GRADS, n, total, first, state.grads.data()),
             Slice("adam.m", ckptd::v1::OPTIMIZER, n, total, first, state.m.data()),
             Slice("adam.v", ckptd::v1::OPTIMIZER, n, total, first, state.v.data())};
  } else {
    specs = {Spec("model.params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, n, state.params.data()),
             Spec("model.grads", ckptd::v1::GRADS, ckptd::v1::FLOAT32, n, state.grads.data()),
             Spec("adam.m", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, n, state.m.data()),
             Spec("adam.v", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, n, state.v.data())};
  }
  for (ckptd::client::BufferSpec& b : std::vector<ckptd::client::BufferSpec>{
      Spec("adam.t", ckptd::v1::OPTIMIZER, ckptd::v1::BYTES, sizeof(Adam), &state.adam),
      Spec("rng", ckptd::v1::RNG, ckptd::v1::BYTES, sizeof(state.rng), &state.rng),
      Spec("data.cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, sizeof(Cursor), &state.cursor)}) {
    specs.push_back(std::move(b));
  }

  uint64_t start = 0;
  absl::StatusOr<std::unique_ptr<ckptd::client::Client>> client = ckptd::client::Client::Connect(options, specs);
  if (!client.ok()) {
    // A weak dependency: train anyway, without checkpoints.
    std::cerr << "ckptd-demo-trainer: checkpointing unavailable: " << client.status().message() << "\n";
  } else {
    absl::StatusOr<std::optional<uint64_t>> restored = (*client)->Restore();
    if (!restored.ok()) {
      std::cerr << "ckptd-demo-trainer: restore failed: " << restored.status().message() << "\n";
      return 1;
    }
    if (*restored) {
      start = **restored;
      if (!skip.empty()) {
        // A fresh state is one more allocation of the (checked) state size.
        std::optional<State> fresh_state;
        try {
          if (sharded) {
            fresh_state.emplace(n, first);
          } else {
            fresh_state.emplace(n, rank);
          }
        } catch (const std::bad_alloc&) {
          std::cerr << "ckptd-demo-trainer: cannot allocate " << state_mb << " MiB for --skip-restore\n";
          return 1;
        }
        const State& fresh = *fresh_state;
        if (skip == "PARAMS") state.params = fresh.params;
        if (skip == "GRADS") state.grads = fresh.grads;
        if (skip == "OPTIMIZER") {
          state.m = fresh.m;
          state.v = fresh.v;
          state.adam = fresh.adam;
        }
        if (skip == "RNG") state.rng = fresh.rng;
        if (skip == "DATA_CURSOR") state.cursor = fresh.cursor;
      }
      std::cerr << "ckptd-demo-trainer: restored step " << start << "\n";
    }
  }
  const absl::Time train_start = absl::Now();
  for (uint64_t step = start + 1; step <= steps; ++step) {
    state.MicroStep();
    if (step % accum == 0) state.OptimizerStep(accum);
    if (client.ok() && (*client)->ShouldSnapshot(step)) {
      absl::StatusOr<ckptd::client::SnapshotResult> r = (*client)->Snapshot(step);
      if (!r.ok()) std::cerr << "ckptd-demo-trainer: snapshot " << step << ": " << r.status().message() << "\n";
    }
    if (client.ok() && (*client)->restart_requested()) {
      // Another rank failed: every rank goes back to the same committed step.
      std::cerr << "ckptd-demo-trainer: the coordinator asks the job to restart (at step " << step << ")\n";
      return kExitRestart;
    }
    if (const uint64_t ms = StepMs(pace_file, step_ms); ms > 0) {
      absl::SleepFor(absl::Milliseconds(static_cast<int64_t>(ms)));
    }
  }
  const double train_s = absl::ToDoubleSeconds(absl::Now() - train_start);
  std::cerr << absl::StrFormat("ckptd-demo-trainer: %d steps in %.3f s (%.3f ms/step), %d snapshots\n", steps - start,
                               train_s, 1e3 * train_s / std::max<uint64_t>(steps - start, 1),
                               client.ok() ? (*client)->snapshots_taken() : 0);
  const std::string digest = sharded ? absl::StrFormat("%016x", state.DigestPart(rank == 0)) : state.Digest();
  std::cout << "final_step=" << steps << " digest=" << digest << " train_s=" << absl::StrFormat("%.6f", train_s)
            << std::endl;
  return 0;
}
