// A strict JSON syntax check for tests of command output.
#pragma once

#include <cstddef>

#include "absl/strings/string_view.h"

namespace ckptd::testing {

// A strict recursive-descent check that `s` is exactly one JSON value (RFC 8259).
class JsonChecker {
 public:
  explicit JsonChecker(absl::string_view s) : s_(s) {}
  bool Valid() {
    SkipWs();
    if (!Value(0)) return false;
    SkipWs();
    return pos_ == s_.size();
  }

 private:
  void SkipWs() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Literal(absl::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) return false;
    pos_ += lit.size();
    return true;
  }
  bool Value(int depth) {
    if (depth > 64 || pos_ >= s_.size()) return false;
    switch (s_[pos_]) {
      case '{': return Object(depth);
      case '[': return Array(depth);
      case '"': return String();
      case 't': return Literal("true");
      case 'f': return Literal("false");
      case 'n': return Literal("null");
      default: return Number();
    }
  }
  bool Object(int depth) {
    Eat('{');
    SkipWs();
    if (Eat('}')) return true;
    while (true) {
      SkipWs();
      if (!String()) return false;
      SkipWs();
      if (!Eat(':')) return false;
      SkipWs();
      if (!Value(depth + 1)) return false;
      SkipWs();
      if (Eat('}')) return true;
      if (!Eat(',')) return false;
    }
  }
  bool Array(int depth) {
    Eat('[');
    SkipWs();
    if (Eat(']')) return true;
    while (true) {
      SkipWs();
      if (!Value(depth + 1)) return false;
      SkipWs();
      if (Eat(']')) return true;
      if (!Eat(',')) return false;
    }
  }
  bool String() {
    if (!Eat('"')) return false;
    while (pos_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c != '\\') continue;
      if (pos_ >= s_.size()) return false;
      const char e = s_[pos_++];
      if (e == 'u') {
        for (int i = 0; i < 4; ++i) {
          if (pos_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos_++]))) return false;
        }
      } else if (absl::string_view("\"\\/bfnrt").find(e) == absl::string_view::npos) {
        return false;
      }
    }
    return false;
  }
  bool Digits() {
    const size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    return pos_ > start;
  }
  bool Number() {
    Eat('-');
    if (Eat('0')) {
      // no leading zeros
    } else if (!Digits()) {
      return false;
    }
    if (Eat('.') && !Digits()) return false;
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (!Eat('+')) Eat('-');
      if (!Digits()) return false;
    }
    return true;
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

inline bool IsValidJson(absl::string_view s) { return JsonChecker(s).Valid(); }

}  // namespace ckptd::testing
