#include "rpc/grpc_status.h"

#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/support/status.h"
#include "gtest/gtest.h"

namespace ckptd::rpc {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;

// Every canonical code but OK, with the name of gRPC's enumerator.
struct CodePair {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};
constexpr CodePair kCodes[] = {
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
};

TEST(GrpcStatusTest, TheTableCoversEveryCanonicalErrorCode) {
  // 1..16: every code there is besides OK (0).
  ASSERT_EQ(std::size(kCodes), 16u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(static_cast<int>(kCodes[i].absl_code), i + 1);
}

TEST(GrpcStatusTest, ToGrpcKeepsCodeAndMessage) {
  for (const CodePair& c : kCodes) {
    const std::string message = absl::StrCat("failed: ", absl::StatusCodeToString(c.absl_code));
    const grpc::Status g = ToGrpcStatus(absl::Status(c.absl_code, message));
    EXPECT_FALSE(g.ok()) << message;
    EXPECT_EQ(g.error_code(), c.grpc_code) << message;
    EXPECT_EQ(g.error_message(), message);
  }
}

TEST(GrpcStatusTest, FromGrpcKeepsCodeAndMessage) {
  for (const CodePair& c : kCodes) {
    const std::string message = absl::StrCat("grpc says ", static_cast<int>(c.grpc_code));
    EXPECT_THAT(FromGrpcStatus(grpc::Status(c.grpc_code, message)), StatusIs(c.absl_code, message));
  }
}

TEST(GrpcStatusTest, RoundTripsEveryCode) {
  for (const CodePair& c : kCodes) {
    const absl::Status s(c.absl_code, absl::StrCat("step 100 of job \"a\": ", static_cast<int>(c.absl_code)));
    EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(s)), s);
    const grpc::Status g(c.grpc_code, "from the wire");
    const grpc::Status back = ToGrpcStatus(FromGrpcStatus(g));
    EXPECT_EQ(back.error_code(), g.error_code());
    EXPECT_EQ(back.error_message(), g.error_message());
  }
}

TEST(GrpcStatusTest, MessagesAreKeptByteForByte) {
  const std::string message = std::string("path /d/\xc3\xa9t\xc3\xa9\n tab\t nul:") + std::string(1, '\0') + "end";
  const absl::Status s(absl::StatusCode::kNotFound, message);
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_message(), message);
  EXPECT_EQ(FromGrpcStatus(g).message(), message);
}

TEST(GrpcStatusTest, ErrorWithAnEmptyMessageStaysAnError) {
  const grpc::Status g = ToGrpcStatus(absl::Status(absl::StatusCode::kInternal, ""));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(g.error_message(), "");
  EXPECT_THAT(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")),
              StatusIs(absl::StatusCode::kUnavailable, ""));
}

TEST(GrpcStatusTest, OkMapsToOk) {
  const grpc::Status g = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(g.ok());
  EXPECT_EQ(g.error_code(), grpc::StatusCode::OK);
  EXPECT_EQ(g.error_message(), "");
  EXPECT_THAT(FromGrpcStatus(grpc::Status::OK), IsOk());
  EXPECT_EQ(FromGrpcStatus(grpc::Status::OK), absl::OkStatus());
  EXPECT_EQ(FromGrpcStatus(grpc::Status()), absl::OkStatus());
}

}  // namespace
}  // namespace ckptd::rpc
