// A thread-safe registry of Prometheus metric families (counters, gauges,
// histograms with labels) and its text exposition (format 0.0.4).
//
//   Registry registry;
//   CKPTD_ASSIGN_OR_RETURN(CounterFamily* committed,
//       registry.AddCounter("ckptd_checkpoints_committed_total", "Checkpoints committed.", {"job"}));
//   committed->With({"job-a"})->Increment();
//   std::string text = registry.Render();
//
// Registration validates names and returns a Status (kInvalidArgument for a
// bad name or bucket list, kAlreadyExists for a clashing registration); it is
// expected at start-up. The hot path is lock-free: a child returned by With()
// is updated with atomics, and With() on an existing label set takes the
// family's mutex without allocating. Cache the child pointer where it matters.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ckptd::metrics {

// A monotonically increasing value. Thread-safe.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `v`. A negative or NaN `v` is ignored: counters only go up.
  void Increment(double v = 1.0);
  // Raises the value to `total` (nothing when it is there already): for a
  // counter that mirrors a total kept elsewhere, read at each scrape.
  void IncrementTo(double total);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that can go up and down. Thread-safe.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into buckets with fixed upper bounds (inclusive), plus
// their sum and count. Thread-safe.
class Histogram {
 public:
  // `bounds` is strictly increasing and finite, and must outlive this object
  // (the family owns it).
  explicit Histogram(absl::Span<const double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // A NaN observation counts only in the +Inf bucket (and makes the sum NaN).
  void Observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;  // equals cumulative_counts.back()
  };
  // Not atomic across buckets with concurrent Observe() calls, but always
  // self-consistent: cumulative counts never decrease and count is the +Inf one.
  Snapshot Read() const;

 private:
  absl::Span<const double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// What all families share: name, help, type, label names. Owned by a Registry.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends this family's exposition (HELP, TYPE and one sample line per
  // child, children in label-value order) to `out`. Nothing if no children.
  virtual void Render(std::string& out) const = 0;

 protected:
  FamilyBase(std::string family_name, std::string help_text, MetricType type, std::vector<std::string> labels)
      : name_(std::move(family_name)),
        help_(std::move(help_text)),
        type_(type),
        label_names_(std::move(labels)) {}

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
};

// Orders label-value tuples; transparent so lookups by string_view don't allocate.
struct LabelValuesLess {
  using is_transparent = void;
  bool operator()(absl::Span<const std::string> a, absl::Span<const std::string> b) const;
  bool operator()(absl::Span<const std::string> a, absl::Span<const absl::string_view> b) const;
  bool operator()(absl::Span<const absl::string_view> a, absl::Span<const std::string> b) const;
};

// A family of children of type T (Counter, Gauge or Histogram), one child per
// distinct tuple of label values.
template <typename T>
class Family final : public FamilyBase {
 public:
  // Use Registry::AddCounter/AddGauge/AddHistogram.
  Family(std::string family_name, std::string help_text, MetricType type, std::vector<std::string> labels,
         std::vector<double> bounds);

  // The child for `label_values`, one per label name in order, created at
  // first use. The pointer stays valid until Remove()/Clear() drops that
  // child or the registry is destroyed. Label values should be UTF-8 (invalid
  // bytes render as U+FFFD). A wrong number of values is a programming error:
  // it asserts in debug builds; release builds pad with "" or drop extras.
  T* With(absl::Span<const absl::string_view> label_values = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops one child / all children, so they are no longer rendered (for
  // label values that went away, e.g. a deleted job). Invalidates pointers
  // to the dropped children. A family without labels keeps its one child.
  void Remove(absl::Span<const absl::string_view> label_values) ABSL_LOCKS_EXCLUDED(mu_);
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  void Render(std::string& out) const ABSL_LOCKS_EXCLUDED(mu_) override;

  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>, LabelValuesLess> children_ ABSL_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry;

// Keeps a collector registered; unregisters it on destruction (waiting for a
// Render() that is running it). Must not outlive the registry.
class CollectorHandle {
 public:
  CollectorHandle() = default;
  CollectorHandle(CollectorHandle&& other) noexcept;
  CollectorHandle& operator=(CollectorHandle&& other) noexcept;
  ~CollectorHandle();

  // Unregisters now; the handle becomes empty.
  void Reset();

 private:
  friend class Registry;
  CollectorHandle(Registry* registry, uint64_t id) : registry_(registry), id_(id) {}
  Registry* registry_ = nullptr;
  uint64_t id_ = 0;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a family, or returns the existing one when `name` was
  // registered before with the same type, label names (and bounds); the help
  // text of a repeated registration is ignored. Errors:
  //  kInvalidArgument: `name` is not [a-zA-Z_:][a-zA-Z0-9_:]*, a label name is
  //    not [a-zA-Z_][a-zA-Z0-9_]*, starts with "__", repeats, or is "le" for a
  //    histogram; or `bounds` is not strictly increasing and finite (a
  //    trailing +Inf is allowed and implied anyway).
  //  kAlreadyExists: `name` is registered with another type, labels or bounds.
  // The family lives as long as the registry.
  absl::StatusOr<CounterFamily*> AddCounter(absl::string_view name, absl::string_view help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(absl::string_view name, absl::string_view help,
                                        std::vector<std::string> label_names = {});
  absl::StatusOr<HistogramFamily*> AddHistogram(absl::string_view name, absl::string_view help,
                                                std::vector<double> bounds,
                                                std::vector<std::string> label_names = {});

  // Registers `collector` to run at the start of every Render(), in
  // registration order, so an owner can set gauges from its own state. Renders
  // run collectors one at a time. A collector may register families and
  // update children, but must not call Render() or AddCollector() or destroy
  // a CollectorHandle.
  [[nodiscard]] CollectorHandle AddCollector(std::function<void()> collector)
      ABSL_LOCKS_EXCLUDED(collect_mu_);

  // Runs the collectors, then returns the exposition of every family in name
  // order, in the Prometheus text format 0.0.4.
  std::string Render() ABSL_LOCKS_EXCLUDED(collect_mu_, mu_);

 private:
  friend class CollectorHandle;
  void RemoveCollector(uint64_t id) ABSL_LOCKS_EXCLUDED(collect_mu_);

  template <typename F>
  absl::StatusOr<F*> Add(absl::string_view name, absl::string_view help, MetricType type,
                         std::vector<std::string> label_names, std::vector<double> bounds)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Lock order: collect_mu_, then mu_, then a family's mutex.
  absl::Mutex collect_mu_;
  std::map<uint64_t, std::function<void()>> collectors_ ABSL_GUARDED_BY(collect_mu_);
  uint64_t next_collector_id_ ABSL_GUARDED_BY(collect_mu_) = 1;

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>, std::less<>> families_ ABSL_GUARDED_BY(mu_);
};

// Formats `v` as the exposition format expects: "+Inf", "-Inf", "NaN",
// integers up to 2^53 without exponent or fraction, otherwise the shortest
// text that reads back as `v`.
std::string FormatValue(double v);

// Escapes for a label value (backslash, double quote, newline) and for help
// text (backslash, newline); invalid UTF-8 becomes U+FFFD.
std::string EscapeLabelValue(absl::string_view s);
std::string EscapeHelp(absl::string_view s);

bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);

}  // namespace ckptd::metrics
