#include "objstore/testing_rgw.h"

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/random.h"
#include "objstore/s3_client.h"

namespace ckptd::objstore::testing {

std::optional<TestRgw> FindTestRgw(std::string* why) {
  const char* file = std::getenv("CKPTD_TEST_RGW_ENV");
  if (file == nullptr || *file == '\0') {
    *why = "CKPTD_TEST_RGW_ENV is not set (ctest sets it; tests/s3/rgw.sh start DIR writes DIR/env)";
    return std::nullopt;
  }
  std::ifstream in(file);
  if (!in) {
    *why = absl::StrCat(file, " does not exist: the RGW fixture did not start (see the ctest s3.rgw_start output)");
    return std::nullopt;
  }
  std::map<std::string, std::string, std::less<>> vars;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    absl::ConsumePrefix(&l, "export ");
    const size_t eq = l.find('=');
    if (eq == absl::string_view::npos) continue;
    std::string value(l.substr(eq + 1));
    if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"')) value = value.substr(1, value.size() - 2);
    vars[std::string(l.substr(0, eq))] = value;
  }
  absl::StatusOr<S3Options> options = S3OptionsFromEnvironment([&](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
  if (!options.ok()) {
    *why = absl::StrCat(file, ": ", options.status().ToString());
    return std::nullopt;
  }
  TestRgw rgw;
  rgw.options = *options;
  rgw.bucket = absl::StrCat("t-", base::RandomHex(8).value_or("0"));
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(rgw.options);
  if (!client.ok()) {
    *why = client.status().ToString();
    return std::nullopt;
  }
  if (absl::Status s = (*client)->CreateBucket(rgw.bucket); !s.ok()) {
    *why = absl::StrCat("cannot make a bucket at ", rgw.options.endpoint, ": ", s.ToString());
    return std::nullopt;
  }
  return rgw;
}

std::string UniqueRoot(const TestRgw& rgw, absl::string_view name) {
  return absl::StrCat(kS3Scheme, rgw.bucket, "/", name, "-", base::RandomHex(6).value_or("0"));
}

}  // namespace ckptd::objstore::testing
