#include "base/json.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/format.h"

namespace ckptd::base {

std::string JsonEscape(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      // UTF-8 becomes \u escapes of its code points (surrogate pairs past
      // U+FFFF); a byte that is not UTF-8 is escaped on its own as U+00XX, so
      // any input gives valid, pure-ASCII JSON.
      uint32_t cp = 0;
      if (size_t len = Utf8SequenceAt(s, i, &cp); len > 0) {
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

}  // namespace ckptd::base
