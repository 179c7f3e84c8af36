#include "base/host_port.h"

#include <string>
#include <utility>

#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ParseHostPortTest, Accepts) {
  using P = std::pair<std::string, uint16_t>;
  EXPECT_THAT(ParseHostPort("127.0.0.1:9090"), IsOkAndHolds(P("127.0.0.1", 9090)));
  EXPECT_THAT(ParseHostPort("[::1]:0"), IsOkAndHolds(P("::1", 0)));
  EXPECT_THAT(ParseHostPort("[fe80::1%eth0]:80"), IsOkAndHolds(P("fe80::1%eth0", 80)));
  EXPECT_THAT(ParseHostPort("localhost:65535"), IsOkAndHolds(P("localhost", 65535)));
  EXPECT_THAT(ParseHostPort(":9090"), IsOkAndHolds(P("", 9090)));
}

TEST(ParseHostPortTest, Rejects) {
  for (const char* bad : {"", "9090", "localhost", "localhost:", "host:65536", "host:-1", "host:+1", "host:9O",
                          "host:000009090", "::1:9090", "[::1]", "[::1]9090", "[::1", "[]:80", "a:b:80"}) {
    EXPECT_THAT(ParseHostPort(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad))) << bad;
  }
}

}  // namespace
}  // namespace ckptd::base
