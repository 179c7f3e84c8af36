#include "base/format.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace ckptd::base {

std::string FormatBytes(double bytes, ByteUnits units) {
  if (units == ByteUnits::kGiB) return absl::StrFormat("%.2f GiB", bytes / (1 << 30));
  static const char* kBinaryUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  static const char* kDecimalUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  const bool decimal = units == ByteUnits::kDecimal;
  const double step = decimal ? 1000 : 1024;
  const int largest = decimal ? 6 : 5;
  double v = bytes;
  int u = 0;
  while (v >= step && u < largest) {
    v /= step;
    ++u;
  }
  if (u == 0) return absl::StrFormat("%.0f B", v);
  return decimal ? absl::StrFormat("%.2f %s", v, kDecimalUnits[u]) : absl::StrFormat("%.1f %s", v, kBinaryUnits[u]);
}

std::string IsoTime(int64_t unix_nanos) {
  if (unix_nanos == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixNanos(unix_nanos), absl::UTCTimeZone());
}

namespace {

// Whole seconds from `whole_from`, one decimal from `one_from`, two below.
std::string PlainSeconds(double s, double one_from, double whole_from) {
  if (s < one_from) return absl::StrFormat("%.2f s", s);
  if (s < whole_from) return absl::StrFormat("%.1f s", s);
  return absl::StrFormat("%.0f s", s);
}

}  // namespace

std::string FormatSeconds(double s, DurationStyle style) {
  switch (style) {
    case DurationStyle::kShort:
      if (!std::isfinite(s)) return "-";
      if (s < 0) s = 0;  // clock skew between the coordinator and here
      if (s < 10) return absl::StrFormat("%.1f s", s);
      if (s < 2 * kMinute) return absl::StrFormat("%.0f s", s);
      if (s < 2 * kHour) return absl::StrFormat("%.1f min", s / kMinute);
      if (s < 2 * kDay) return absl::StrFormat("%.1f h", s / kHour);
      return absl::StrFormat("%.1f d", s / kDay);
    case DurationStyle::kSeconds:
      if (!(s > 0) || !std::isfinite(s)) return "-";
      return PlainSeconds(s, 1, 100);
    case DurationStyle::kFigure: {
      if (!std::isfinite(s)) return "-";
      const std::string plain = PlainSeconds(s, 10, 1000);
      if (s >= 2 * kDay) return absl::StrFormat("%s (%.1f d)", plain, s / kDay);
      if (s >= 2 * kHour) return absl::StrFormat("%s (%.2f h)", plain, s / kHour);
      if (s >= 2 * kMinute) return absl::StrFormat("%s (%.1f min)", plain, s / kMinute);
      return plain;
    }
    case DurationStyle::kLabel:
      if (s < kMinute) return absl::StrFormat("%.3g s", s);
      if (s < kHour) return absl::StrFormat("%.3g min", s / kMinute);
      if (s < kDay) return absl::StrFormat("%.3g h", s / kHour);
      return absl::StrFormat("%.3g d", s / kDay);
  }
  return "-";
}

size_t Utf8SequenceAt(absl::string_view s, size_t i, uint32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t len = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    *cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    *cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    *cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (cc & 0x3F);
  }
  if ((len == 2 && *cp < 0x80) || (len == 3 && *cp < 0x800) || (len == 4 && *cp < 0x10000) ||
      (*cp >= 0xD800 && *cp <= 0xDFFF) || *cp > 0x10FFFF) {
    return 0;
  }
  return len;
}

namespace {

// Code points past ASCII that a terminal acts on or that reorder or break
// the text around them: the C1 controls, the bidirectional marks, embeddings,
// overrides and isolates, and the line and paragraph separators.
bool IsUnsafeCodePoint(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string TerminalSafe(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      uint32_t cp = 0;
      const size_t len = Utf8SequenceAt(s, i, &cp);
      if (len == 0) {
        absl::StrAppendFormat(&out, "\\x%02x", c);
      } else if (IsUnsafeCodePoint(cp)) {
        absl::StrAppendFormat(&out, "\\u%04x", cp);
        i += len - 1;
      } else {
        out.append(s.data() + i, len);
        i += len - 1;
      }
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          absl::StrAppendFormat(&out, "\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

}  // namespace ckptd::base
