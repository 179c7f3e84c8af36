#include "base/format.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace ckptd::base {

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

std::string IsoTime(int64_t unix_nanos) {
  if (unix_nanos == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixNanos(unix_nanos), absl::UTCTimeZone());
}

std::string ShortDuration(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 0) s = 0;  // clock skew between the coordinator and here
  if (s < 10) return absl::StrFormat("%.1f s", s);
  if (s < 120) return absl::StrFormat("%.0f s", s);
  if (s < 7200) return absl::StrFormat("%.1f min", s / 60);
  if (s < 172800) return absl::StrFormat("%.1f h", s / 3600);
  return absl::StrFormat("%.1f d", s / 86400);
}

std::string Seconds(double s) {
  if (!(s > 0) || !std::isfinite(s)) return "-";
  if (s < 1) return absl::StrFormat("%.2f s", s);
  if (s < 100) return absl::StrFormat("%.1f s", s);
  return absl::StrFormat("%.0f s", s);
}

}  // namespace ckptd::base
