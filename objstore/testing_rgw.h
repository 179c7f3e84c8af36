// The test suite's S3 server: the Ceph RADOS Gateway that tests/s3/rgw.sh
// starts for a ctest run (the `rgw` fixture), found through the env file it
// writes, named by $CKPTD_TEST_RGW_ENV.
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "objstore/s3_options.h"

namespace ckptd::objstore::testing {

struct TestRgw {
  S3Options options;
  std::string bucket;  // made for this test binary, empty at first
};

// The RGW of this run with a fresh bucket, or nullopt and `why` not.
std::optional<TestRgw> FindTestRgw(std::string* why);

// A root nobody else uses: "s3://<bucket>/<name>-<random>".
std::string UniqueRoot(const TestRgw& rgw, absl::string_view name);

}  // namespace ckptd::objstore::testing

// In a test body: `rgw` becomes the TestRgw, or the test is skipped saying why.
#define CKPTD_REQUIRE_RGW(rgw)                                                         \
  std::string rgw##_why;                                                               \
  std::optional<::ckptd::objstore::testing::TestRgw> rgw##_found =                     \
      ::ckptd::objstore::testing::FindTestRgw(&rgw##_why);                             \
  if (!rgw##_found) GTEST_SKIP() << "no S3 server for this test: " << rgw##_why;       \
  const ::ckptd::objstore::testing::TestRgw& rgw = *rgw##_found
