#include "base/json.h"
#include "base/testing/json_checker.h"

#include <cctype>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsValidJson;

bool IsAscii(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

TEST(JsonCheckerTest, SelfCheck) {
  EXPECT_TRUE(IsValidJson(R"({"a":[1,-2.5e+3,true,false,null,"x\u00e9\n"],"b":{}})"));
  EXPECT_FALSE(IsValidJson(R"({"a":1,})"));
  EXPECT_FALSE(IsValidJson(R"([1,,2])"));
  EXPECT_FALSE(IsValidJson(R"({"a" 1})"));
  EXPECT_FALSE(IsValidJson("\"a\nb\""));
  EXPECT_FALSE(IsValidJson("nan"));
  EXPECT_FALSE(IsValidJson("{}{}"));
  EXPECT_FALSE(IsValidJson("01"));
}

TEST(JsonWriterTest, EmptyContainers) {
  JsonWriter o;
  o.BeginObject();
  o.EndObject();
  EXPECT_EQ(o.str(), "{}");
  JsonWriter a;
  a.BeginArray();
  a.EndArray();
  EXPECT_EQ(a.str(), "[]");
}

TEST(JsonWriterTest, NestsWithCommasBetweenElementsOnly) {
  JsonWriter w;
  w.BeginObject();
  w.Field("a", 1);
  w.Key("b");
  w.BeginArray();
  w.Int(1);
  w.Uint(2);
  w.BeginObject();
  w.EndObject();
  w.BeginArray();
  w.EndArray();
  w.BeginObject();
  w.Field("x", "y");
  w.Field("z", false);
  w.EndObject();
  w.EndArray();
  w.Key("c");
  w.BeginObject();
  w.Key("d");
  w.BeginArray();
  w.BeginArray();
  w.Null();
  w.EndArray();
  w.EndArray();
  w.EndObject();
  w.Field("e", "s");
  w.EndObject();
  EXPECT_EQ(w.str(), R"({"a":1,"b":[1,2,{},[],{"x":"y","z":false}],"c":{"d":[[null]]},"e":"s"})");
  EXPECT_TRUE(IsValidJson(w.str()));
}

TEST(JsonWriterTest, TopLevelArrayOfScalars) {
  JsonWriter w;
  w.BeginArray();
  w.String("a");
  w.Bool(true);
  w.Bool(false);
  w.Null();
  w.Int(-7);
  w.EndArray();
  EXPECT_EQ(w.str(), R"(["a",true,false,null,-7])");
}

TEST(JsonWriterTest, FieldOverloadsPickTheRightType) {
  JsonWriter w;
  w.BeginObject();
  w.Field("cstr", "text");
  w.Field("view", absl::string_view("v"));
  w.Field("std", std::string("s"));
  w.Field("u64", uint64_t{18446744073709551615u});
  w.Field("i64", std::numeric_limits<int64_t>::min());
  w.Field("int", -1);
  w.Field("u32", uint32_t{4294967295u});
  w.Field("dbl", 0.5);
  w.Field("yes", true);
  w.EndObject();
  EXPECT_EQ(w.str(),
            R"({"cstr":"text","view":"v","std":"s","u64":18446744073709551615,"i64":-9223372036854775808,)"
            R"("int":-1,"u32":4294967295,"dbl":0.5,"yes":true})");
  EXPECT_TRUE(IsValidJson(w.str()));
}

TEST(JsonWriterTest, FiniteDoublesAreNumbers) {
  for (double d : {0.0, 1.0, -2.25, 3.14159, 1e-9, 1.5e300, -1e20}) {
    JsonWriter w;
    w.Double(d);
    EXPECT_TRUE(IsValidJson(w.str())) << w.str();
    EXPECT_NE(w.str(), "null");
  }
  JsonWriter w;
  w.Double(2.5);
  EXPECT_EQ(w.str(), "2.5");
}

TEST(JsonWriterTest, NonFiniteDoublesAreNull) {
  JsonWriter w;
  w.BeginArray();
  w.Double(std::numeric_limits<double>::quiet_NaN());
  w.Double(std::numeric_limits<double>::infinity());
  w.Double(-std::numeric_limits<double>::infinity());
  w.EndArray();
  EXPECT_EQ(w.str(), "[null,null,null]");
  JsonWriter f;
  f.BeginObject();
  f.Field("ratio", std::numeric_limits<double>::quiet_NaN());
  f.EndObject();
  EXPECT_EQ(f.str(), R"({"ratio":null})");
}

TEST(JsonEscapeTest, QuotesAndBackslashes) {
  EXPECT_EQ(JsonEscape(""), R"("")");
  EXPECT_EQ(JsonEscape("plain text 123"), R"("plain text 123")");
  EXPECT_EQ(JsonEscape("a\"b"), R"("a\"b")");
  EXPECT_EQ(JsonEscape("a\\b"), R"("a\\b")");
  EXPECT_EQ(JsonEscape("\\\""), R"("\\\"")");
  EXPECT_EQ(JsonEscape("/"), R"("/")");
}

TEST(JsonEscapeTest, ControlCharacters) {
  EXPECT_EQ(JsonEscape("\n\r\t"), R"("\n\r\t")");
  EXPECT_EQ(JsonEscape(absl::string_view("\0", 1)), R"("\u0000")");
  EXPECT_EQ(JsonEscape("\x01"), R"("\u0001")");
  EXPECT_EQ(JsonEscape("\b\f"), R"("\u0008\u000c")");
  EXPECT_EQ(JsonEscape("\x1f"), R"("\u001f")");
  EXPECT_EQ(JsonEscape("\x7f"), R"("\u007f")");
  for (int c = 0; c < 0x20; ++c) {
    const std::string in(1, static_cast<char>(c));
    const std::string out = JsonEscape(in);
    EXPECT_TRUE(IsValidJson(out)) << c;
    for (char o : out) EXPECT_GE(static_cast<unsigned char>(o), 0x20) << c;
  }
}

TEST(JsonEscapeTest, Utf8BecomesCodePointsAndOtherHighBytesAreEscapedOneByOne) {
  EXPECT_EQ(JsonEscape("\x80"), R"("\u0080")");
  EXPECT_EQ(JsonEscape("\xff"), R"("\u00ff")");
  // UTF-8 keeps its meaning; invalid UTF-8 still gives pure-ASCII, valid JSON.
  EXPECT_EQ(JsonEscape("caf\xc3\xa9"), R"("caf\u00e9")");
  EXPECT_EQ(JsonEscape("\xe2\x82\xac"), R"("\u20ac")");
  EXPECT_EQ(JsonEscape("\xf0\x9f\x98\x80"), R"("\ud83d\ude00")");
  EXPECT_EQ(JsonEscape("\xc3"), R"("\u00c3")");             // truncated sequence
  EXPECT_EQ(JsonEscape("\xc0\xaf"), R"("\u00c0\u00af")");  // overlong "/"
  EXPECT_EQ(JsonEscape("\xed\xa0\x80"), R"("\u00ed\u00a0\u0080")");  // surrogate
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  const std::string out = JsonEscape(all);
  EXPECT_TRUE(IsValidJson(out));
  EXPECT_TRUE(IsAscii(out));
}

TEST(JsonWriterTest, KeysAndValuesAreEscaped) {
  JsonWriter w;
  w.BeginObject();
  w.Field("k\"ey\n", "v\\al\x01\xfe");
  w.EndObject();
  EXPECT_EQ(w.str(), R"({"k\"ey\n":"v\\al\u0001\u00fe"})");
  EXPECT_TRUE(IsValidJson(w.str()));
  EXPECT_TRUE(IsAscii(w.str()));
}

}  // namespace
}  // namespace ckptd::base
