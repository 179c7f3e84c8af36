#include "rpc/fetch_ticket.h"

#include <string>

#include "gtest/gtest.h"

namespace ckptd::rpc {
namespace {

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";

TEST(FetchTicket, IsAKeyedHashOfItsFields) {
  const std::string t = FetchTicket(kKey, "node-b", "job", 3, 7);
  EXPECT_EQ(t.size(), kFetchTicketBytes);
  EXPECT_EQ(t, FetchTicket(kKey, "node-b", "job", 3, 7)) << "the same fields make the same ticket";
  EXPECT_NE(t, FetchTicket("another key", "node-b", "job", 3, 7));
}

TEST(FetchTicket, IsValidOnlyForItsNodeAndCopyUnderItsKey) {
  const std::string t = FetchTicket(kKey, "node-b", "job", 3, 7);
  EXPECT_TRUE(FetchTicketValid(t, kKey, "node-b", "job", 3, 7));
  EXPECT_FALSE(FetchTicketValid(t, kKey, "node-c", "job", 3, 7)) << "another node";
  EXPECT_FALSE(FetchTicketValid(t, kKey, "node-b", "job2", 3, 7)) << "another job";
  EXPECT_FALSE(FetchTicketValid(t, kKey, "node-b", "job", 4, 7)) << "another rank";
  EXPECT_FALSE(FetchTicketValid(t, kKey, "node-b", "job", 3, 8)) << "another step";
  EXPECT_FALSE(FetchTicketValid(t, "0123456789abcdef0123456789abcdeF", "node-b", "job", 3, 7)) << "another key";
  EXPECT_FALSE(FetchTicketValid(t, "", "node-b", "job", 3, 7)) << "no key: nothing is valid";
  EXPECT_FALSE(FetchTicketValid("", kKey, "node-b", "job", 3, 7));
  EXPECT_FALSE(FetchTicketValid(t.substr(0, 31), kKey, "node-b", "job", 3, 7));
  std::string flipped = t;
  flipped[5] ^= 1;
  EXPECT_FALSE(FetchTicketValid(flipped, kKey, "node-b", "job", 3, 7));
  // The fields cannot be shifted into each other.
  EXPECT_NE(FetchTicket(kKey, "node-bj", "ob", 3, 7), t);
  EXPECT_NE(FetchTicket(kKey, "node-b", "job", 0, uint64_t{3} << 32), FetchTicket(kKey, "node-b", "job", 3, 0));
}

}  // namespace
}  // namespace ckptd::rpc
