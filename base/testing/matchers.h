// gMock matchers for absl::Status in tests: StatusIs(code, message_matcher), IsOk().
#pragma once

#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"

namespace ckptd::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = ::ckptd::testing::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

MATCHER(IsOk, "is ok") {
  const absl::Status& s = ::ckptd::testing::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.ok();
}

MATCHER_P(IsOkAndHolds, value_matcher, "is ok and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace ckptd::testing

#define CKPTD_ASSERT_OK(expr) ASSERT_THAT((expr), ::ckptd::testing::IsOk())
#define CKPTD_EXPECT_OK(expr) EXPECT_THAT((expr), ::ckptd::testing::IsOk())
// Assigns the value of a StatusOr expression or fails the test.
#define CKPTD_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  CKPTD_ASSERT_OK_AND_ASSIGN_IMPL_(CKPTD_STATUS_CONCAT_(ckptd_t_sor_, __LINE__), lhs, expr)
#define CKPTD_ASSERT_OK_AND_ASSIGN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                     \
  ASSERT_THAT(var.status(), ::ckptd::testing::IsOk());   \
  lhs = std::move(var).value()
