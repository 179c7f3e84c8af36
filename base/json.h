// A minimal streaming JSON writer for command and benchmark output (no parsing).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckptd::base {

// Usage: JsonWriter w; w.BeginObject(); w.Key("a"); w.Int(1); w.EndObject(); w.str().
// Commas are inserted automatically.
class JsonWriter {
 public:
  void BeginObject();
  void EndObject();
  void BeginArray();
  void EndArray();
  void Key(absl::string_view key);
  void String(absl::string_view value);
  void Int(int64_t value);
  void Uint(uint64_t value);
  void Double(double value);  // non-finite values are written as null
  void Bool(bool value);
  void Null();

  // Key + value shorthands.
  void Field(absl::string_view key, absl::string_view value) { Key(key); String(value); }
  void Field(absl::string_view key, const char* value) { Key(key); String(value); }
  void Field(absl::string_view key, uint64_t value) { Key(key); Uint(value); }
  void Field(absl::string_view key, int64_t value) { Key(key); Int(value); }
  void Field(absl::string_view key, int value) { Key(key); Int(value); }
  void Field(absl::string_view key, uint32_t value) { Key(key); Uint(value); }
  void Field(absl::string_view key, double value) { Key(key); Double(value); }
  void Field(absl::string_view key, bool value) { Key(key); Bool(value); }

  const std::string& str() const { return out_; }

 private:
  void BeforeValue();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

std::string JsonEscape(absl::string_view s);

}  // namespace ckptd::base
