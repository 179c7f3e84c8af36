#include "metrics/registry.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckptd::metrics {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
}

bool IsValidName(absl::string_view name, bool allow_colon) {
  if (name.empty() || !IsNameStart(name[0], allow_colon)) return false;
  for (char c : name.substr(1)) {
    if (!IsNameStart(c, allow_colon) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Length of the well-formed UTF-8 sequence at the start of `s` (RFC 3629: no
// overlong forms, surrogates or code points above U+10FFFF), or 0.
size_t Utf8SequenceLength(absl::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

void AppendEscaped(std::string& out, absl::string_view s, bool escape_quote) {
  while (!s.empty()) {
    const char c = s[0];
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && escape_quote) {
      out += "\\\"";
    } else {
      const size_t n = Utf8SequenceLength(s);
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD for one invalid byte
        s.remove_prefix(1);
        continue;
      }
      out.append(s.data(), n);
      s.remove_prefix(n);
      continue;
    }
    s.remove_prefix(1);
  }
}

// Appends `{a="x",b="y"}` (with `extra_name="extra_value"` last, if given);
// nothing when there are no labels at all.
void AppendLabels(std::string& out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, absl::string_view extra_name = {},
                  absl::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return;
  out += '{';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"");
    AppendEscaped(out, values[i], /*escape_quote=*/true);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    absl::StrAppend(&out, extra_name, "=\"");
    AppendEscaped(out, extra_value, /*escape_quote=*/true);
    out += '"';
  }
  out += '}';
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

template <typename A, typename B>
bool LexicographicLess(absl::Span<const A> a, absl::Span<const B> b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return absl::string_view(x) < absl::string_view(y);
  });
}

}  // namespace

bool IsValidMetricName(absl::string_view name) { return IsValidName(name, /*allow_colon=*/true); }
bool IsValidLabelName(absl::string_view name) { return IsValidName(name, /*allow_colon=*/false); }

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) <= 9007199254740992.0) {  // 2^53
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round trip
  return std::string(buf, r.ptr);
}

std::string EscapeLabelValue(absl::string_view s) {
  std::string out;
  AppendEscaped(out, s, /*escape_quote=*/true);
  return out;
}

std::string EscapeHelp(absl::string_view s) {
  std::string out;
  AppendEscaped(out, s, /*escape_quote=*/false);
  return out;
}

void Counter::Increment(double v) {
  if (!(v >= 0)) return;  // also NaN
  value_.fetch_add(v, std::memory_order_relaxed);
}

void Counter::IncrementTo(double total) {
  double now = value_.load(std::memory_order_relaxed);
  while (total > now && !value_.compare_exchange_weak(now, total, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(absl::Span<const double> bounds)
    : bounds_(bounds), buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds.size() + 1)) {}

void Histogram::Observe(double v) {
  // Bucket i counts bounds_[i-1] < v <= bounds_[i]; the last one is +Inf.
  const size_t i = std::isnan(v) ? bounds_.size()
                                 : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                                       bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.cumulative_counts.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative_counts[i] = total;
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

bool LabelValuesLess::operator()(absl::Span<const std::string> a, absl::Span<const std::string> b) const {
  return LexicographicLess(a, b);
}
bool LabelValuesLess::operator()(absl::Span<const std::string> a, absl::Span<const absl::string_view> b) const {
  return LexicographicLess(a, b);
}
bool LabelValuesLess::operator()(absl::Span<const absl::string_view> a, absl::Span<const std::string> b) const {
  return LexicographicLess(a, b);
}

template <typename T>
Family<T>::Family(std::string family_name, std::string help_text, MetricType type,
                  std::vector<std::string> labels, std::vector<double> bounds)
    : FamilyBase(std::move(family_name), std::move(help_text), type, std::move(labels)),
      bounds_(std::move(bounds)) {
  // A family without labels has exactly one child, rendered from the start.
  if (label_names().empty()) With({});
}

template <typename T>
T* Family<T>::With(absl::Span<const absl::string_view> label_values) {
  const size_t n = label_names().size();
  assert(label_values.size() == n && "Family::With: one value per label name");
  std::vector<absl::string_view> fixed;
  if (label_values.size() != n) {
    fixed.assign(label_values.begin(), label_values.begin() + std::min(n, label_values.size()));
    fixed.resize(n);
    label_values = fixed;
  }
  absl::MutexLock l(&mu_);
  if (auto it = children_.find(label_values); it != children_.end()) return it->second.get();
  std::vector<std::string> key;
  key.reserve(n);
  for (absl::string_view v : label_values) key.emplace_back(v.data(), v.size());
  std::unique_ptr<T> child;
  if constexpr (std::is_same_v<T, Histogram>) {
    child = std::make_unique<Histogram>(bounds_);
  } else {
    child = std::make_unique<T>();
  }
  return children_.emplace(std::move(key), std::move(child)).first->second.get();
}

template <typename T>
void Family<T>::Remove(absl::Span<const absl::string_view> label_values) {
  if (label_names().empty()) return;
  absl::MutexLock l(&mu_);
  if (auto it = children_.find(label_values); it != children_.end()) children_.erase(it);
}

template <typename T>
void Family<T>::Clear() {
  if (label_names().empty()) return;
  absl::MutexLock l(&mu_);
  children_.clear();
}

template <typename T>
void Family<T>::Render(std::string& out) const {
  absl::MutexLock l(&mu_);
  if (children_.empty()) return;
  if (!help().empty()) {
    absl::StrAppend(&out, "# HELP ", name(), " ");
    AppendEscaped(out, help(), /*escape_quote=*/false);
    out += '\n';
  }
  absl::StrAppend(&out, "# TYPE ", name(), " ", TypeName(type()), "\n");
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = child->Read();
      for (size_t i = 0; i <= bounds_.size(); ++i) {
        absl::StrAppend(&out, name(), "_bucket");
        AppendLabels(out, label_names(), values, "le",
                     i < bounds_.size() ? FormatValue(bounds_[i]) : std::string("+Inf"));
        absl::StrAppend(&out, " ", s.cumulative_counts[i], "\n");
      }
      absl::StrAppend(&out, name(), "_sum");
      AppendLabels(out, label_names(), values);
      absl::StrAppend(&out, " ", FormatValue(s.sum), "\n");
      absl::StrAppend(&out, name(), "_count");
      AppendLabels(out, label_names(), values);
      absl::StrAppend(&out, " ", s.count, "\n");
    } else {
      out += name();
      AppendLabels(out, label_names(), values);
      absl::StrAppend(&out, " ", FormatValue(child->Value()), "\n");
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

CollectorHandle::CollectorHandle(CollectorHandle&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)), id_(other.id_) {}

CollectorHandle& CollectorHandle::operator=(CollectorHandle&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

CollectorHandle::~CollectorHandle() { Reset(); }

void CollectorHandle::Reset() {
  if (registry_ != nullptr) registry_->RemoveCollector(id_);
  registry_ = nullptr;
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(absl::string_view name, absl::string_view help,
                                                    std::vector<std::string> label_names) {
  return Add<CounterFamily>(name, help, MetricType::kCounter, std::move(label_names), {});
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(absl::string_view name, absl::string_view help,
                                                std::vector<std::string> label_names) {
  return Add<GaugeFamily>(name, help, MetricType::kGauge, std::move(label_names), {});
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(absl::string_view name, absl::string_view help,
                                                        std::vector<double> bounds,
                                                        std::vector<std::string> label_names) {
  if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0) bounds.pop_back();
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i - 1] < bounds[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram ", name, ": bucket bounds must be finite and strictly increasing, bound ", i, " is ",
          FormatValue(bounds[i])));
    }
  }
  for (const std::string& l : label_names) {
    if (l == "le") {
      return absl::InvalidArgumentError(absl::StrCat("histogram ", name, ": label name \"le\" is reserved"));
    }
  }
  return Add<HistogramFamily>(name, help, MetricType::kHistogram, std::move(label_names), std::move(bounds));
}

template <typename F>
absl::StatusOr<F*> Registry::Add(absl::string_view name, absl::string_view help, MetricType type,
                                 std::vector<std::string> label_names, std::vector<double> bounds) {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid metric name \"", EscapeLabelValue(name), "\""));
  }
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& l = label_names[i];
    if (!IsValidLabelName(l) || l.rfind("__", 0) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name, ": invalid label name \"", EscapeLabelValue(l), "\""));
    }
    if (std::find(label_names.begin(), label_names.begin() + i, l) != label_names.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("metric ", name, ": label name \"", l, "\" repeats"));
    }
  }
  absl::MutexLock l(&mu_);
  if (auto it = families_.find(name); it != families_.end()) {
    FamilyBase* existing = it->second.get();
    if (existing->type() != type) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric ", name, " is already registered as a ", TypeName(existing->type())));
    }
    if (existing->label_names() != label_names) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric ", name, " is already registered with other label names"));
    }
    F* family = static_cast<F*>(existing);
    if (family->bounds() != bounds) {
      return absl::AlreadyExistsError(absl::StrCat("metric ", name, " is already registered with other buckets"));
    }
    return family;
  }
  auto family = std::make_unique<F>(std::string(name), std::string(help), type, std::move(label_names),
                                    std::move(bounds));
  F* result = family.get();
  families_.emplace(std::string(name), std::move(family));
  return result;
}

CollectorHandle Registry::AddCollector(std::function<void()> collector) {
  absl::MutexLock l(&collect_mu_);
  const uint64_t id = next_collector_id_++;
  collectors_.emplace(id, std::move(collector));
  return CollectorHandle(this, id);
}

void Registry::RemoveCollector(uint64_t id) {
  absl::MutexLock l(&collect_mu_);
  collectors_.erase(id);
}

std::string Registry::Render() {
  {
    absl::MutexLock l(&collect_mu_);
    for (auto& [id, collector] : collectors_) collector();
  }
  std::string out;
  absl::MutexLock l(&mu_);
  for (const auto& [name, family] : families_) family->Render(out);
  return out;
}

}  // namespace ckptd::metrics
