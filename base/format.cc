#include "base/format.h"

#include <cmath>
#include <string>

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
