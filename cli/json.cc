#include "cli/json.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckptd::cli {

namespace {

// Decodes one well-formed UTF-8 sequence of 2..4 bytes at s[i]; returns its
// length (0 when the bytes there are not UTF-8) and the code point.
size_t DecodeUtf8(absl::string_view s, size_t i, uint32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t len;
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

}  // namespace

std::string JsonEscape(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      // UTF-8 becomes \u escapes of its code points (surrogate pairs past
      // U+FFFF); a byte that is not UTF-8 is escaped on its own as U+00XX, so
      // any input gives valid, pure-ASCII JSON.
      uint32_t cp = 0;
      if (size_t len = DecodeUtf8(s, i, &cp); len > 0) {
        if (cp >= 0x10000) {
          cp -= 0x10000;
          absl::StrAppendFormat(&out, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else {
          absl::StrAppendFormat(&out, "\\u%04x", cp);
        }
        i += len - 1;
      } else {
        absl::StrAppendFormat(&out, "\\u%04x", c);
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

void JsonWriter::BeginObject() {
  BeforeValue();
  out_ += '{';
  first_.push_back(true);
}
void JsonWriter::EndObject() {
  out_ += '}';
  first_.pop_back();
}
void JsonWriter::BeginArray() {
  BeforeValue();
  out_ += '[';
  first_.push_back(true);
}
void JsonWriter::EndArray() {
  out_ += ']';
  first_.pop_back();
}
void JsonWriter::Key(absl::string_view key) {
  BeforeValue();
  out_ += JsonEscape(key);
  out_ += ':';
  after_key_ = true;
}
void JsonWriter::String(absl::string_view value) {
  BeforeValue();
  out_ += JsonEscape(value);
}
void JsonWriter::Int(int64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
}
void JsonWriter::Uint(uint64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
}
void JsonWriter::Double(double value) {
  BeforeValue();
  if (!std::isfinite(value)) {
    out_ += "null";
  } else {
    absl::StrAppendFormat(&out_, "%.6g", value);
  }
}
void JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
}
void JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
}

}  // namespace ckptd::cli
