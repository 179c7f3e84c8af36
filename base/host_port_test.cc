#include "base/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
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

TEST(ParseHostPortTest, PortsOutsideTheRangeAreRefusedNotWrapped) {
  for (PortUse use : {PortUse::kListen, PortUse::kConnect}) {
    for (const char* bad :
         {"127.0.0.1:99999", "127.0.0.1:65536", "[::1]:70000", "h:4294967296", "h:18446744073709551617"}) {
      EXPECT_THAT(ParseHostPort(bad, use),
                  StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(bad), HasSubstr("..65535"))))
          << bad;
    }
  }
}

TEST(ParseHostPortTest, PortZeroIsForListeningOnly) {
  using P = std::pair<std::string, uint16_t>;
  EXPECT_THAT(ParseHostPort("127.0.0.1:0", PortUse::kListen), IsOkAndHolds(P("127.0.0.1", 0)));
  EXPECT_THAT(ParseHostPort("127.0.0.1:0"), IsOkAndHolds(P("127.0.0.1", 0)));  // listening is the default
  EXPECT_THAT(ParseHostPort("127.0.0.1:0", PortUse::kConnect),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"127.0.0.1:0\": port must be 1..65535")));
  EXPECT_THAT(ParseHostPort("[::1]:00", PortUse::kConnect),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1..65535")));
  EXPECT_THAT(ParseHostPort("coord:1", PortUse::kConnect), IsOkAndHolds(P("coord", 1)));
  EXPECT_THAT(ParseHostPort("coord:65535", PortUse::kConnect), IsOkAndHolds(P("coord", 65535)));
}

// The port it names can be bound on 127.0.0.1 (it was closed, not kept).
TEST(FreeLoopbackPortTest, NamesAPortThatCanBeBound) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  ASSERT_LE(port, 65535);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << port;
  ::close(fd);
}

}  // namespace
}  // namespace ckptd::base
