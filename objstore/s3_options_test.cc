// Storage-root URLs and the S3 settings read from the environment and the
// AWS CLI's files; no server needed.
#include "objstore/s3_options.h"

#include <fstream>
#include <map>

#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "objstore/s3_client.h"

namespace ckptd::objstore {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(ObjectUrlTest, ParsesBucketsAndKeys) {
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl a, ParseObjectUrl("s3://my-bucket"));
  EXPECT_EQ(a.bucket, "my-bucket");
  EXPECT_EQ(a.key, "");
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl b, ParseObjectUrl("s3://ckpt.v1/runs/llm-7b/"));
  EXPECT_EQ(b.bucket, "ckpt.v1");
  EXPECT_EQ(b.key, "runs/llm-7b");
  EXPECT_EQ(b.ToString(), "s3://ckpt.v1/runs/llm-7b");
  EXPECT_TRUE(IsObjectStoreRoot("s3://x"));
  EXPECT_FALSE(IsObjectStoreRoot("/mnt/s3://x"));
}

TEST(ObjectUrlTest, RefusesHostileOrMalformedUrls) {
  for (const char* bad : {"/local/dir", "s3:/b/k", "s3://", "s3://ab", "s3://UPPER/k", "s3://-bucket/k",
                          "s3://bucket-/k", "s3://bu..cket/k", "s3://bucket_x/k", "s3://bucket/a//b", "s3://bucket/a/../b",
                          "s3://bucket/./b", "s3://bucket/a\\b", "s3://bucket/a\nb", "s3://bucket/a\x7f"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(ParseObjectUrl(bad), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  }
  EXPECT_THAT(ParseObjectUrl("s3://bucket/" + std::string(1025, 'k')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1024")));
  EXPECT_THAT(ParseObjectUrl(std::string("s3://") + std::string(64, 'b')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a valid bucket name")));
}

TEST(S3OptionsTest, TheEnvironmentComesFirst) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      S3Options o, S3OptionsFromEnvironment(Env({{"AWS_ACCESS_KEY_ID", "AKID"},
                                                 {"AWS_SECRET_ACCESS_KEY", "s3cr3t-value"},
                                                 {"AWS_SESSION_TOKEN", "tok3n-value"},
                                                 {"AWS_DEFAULT_REGION", "eu-west-1"},
                                                 {"AWS_ENDPOINT_URL", "http://127.0.0.1:7480/"},
                                                 {"AWS_CA_BUNDLE", "/etc/ca.pem"},
                                                 {"CKPTD_S3_MAX_CONNECTIONS", "32"},
                                                 {"CKPTD_S3_PART_BYTES", "64MiB"}})));
  EXPECT_EQ(o.credentials.access_key_id, "AKID");
  EXPECT_EQ(o.credentials.secret_access_key, "s3cr3t-value");
  EXPECT_EQ(o.credentials.session_token, "tok3n-value");
  EXPECT_EQ(o.credentials.source, "environment");
  EXPECT_EQ(o.region, "eu-west-1");
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:7480");
  EXPECT_EQ(o.addressing, Addressing::kPath) << "any endpoint but AWS's own is path-style";
  EXPECT_EQ(o.ca_file, "/etc/ca.pem");
  EXPECT_EQ(o.max_connections, 32);
  EXPECT_EQ(o.part_bytes, uint64_t{64} << 20);
  // What is printed about it names the key id and where it came from, never a secret.
  EXPECT_THAT(o.Describe(), AllOf(HasSubstr("AKID"), HasSubstr("environment"), HasSubstr("session token"),
                                  Not(HasSubstr("s3cr3t-value")), Not(HasSubstr("tok3n-value"))));
}

TEST(S3OptionsTest, AwsIsVirtualHostedByDefaultAndAddressingCanBeChosen) {
  std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", "A"}, {"AWS_SECRET_ACCESS_KEY", "S"}};
  CKPTD_ASSERT_OK_AND_ASSIGN(S3Options aws, S3OptionsFromEnvironment(Env(env)));
  EXPECT_EQ(aws.addressing, Addressing::kVirtualHosted);
  EXPECT_EQ(aws.region, "us-east-1");
  EXPECT_EQ(aws.EffectiveEndpoint(), "https://s3.us-east-1.amazonaws.com");
  env["CKPTD_S3_ADDRESSING"] = "path";
  CKPTD_ASSERT_OK_AND_ASSIGN(S3Options path, S3OptionsFromEnvironment(Env(env)));
  EXPECT_EQ(path.addressing, Addressing::kPath);
  env["CKPTD_S3_ADDRESSING"] = "sideways";
  EXPECT_THAT(S3OptionsFromEnvironment(Env(env)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sideways")));
}

TEST(S3OptionsTest, TheSharedFilesAndAProfile) {
  ::ckptd::testing::TempDir dir;
  WriteText(dir.Sub("credentials"),
            "# keys\n[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = defaultsecret\n\n"
            "[train]\naws_access_key_id=TRAINKEY\naws_secret_access_key=trainsecret\naws_session_token = T\n");
  WriteText(dir.Sub("config"),
            "[default]\nregion = us-west-2\n[profile train]\nregion = ap-south-1\nendpoint_url = https://minio.lan:9000\n"
            "s3 =\n  addressing_style = virtual\n");
  std::map<std::string, std::string> env = {{"AWS_SHARED_CREDENTIALS_FILE", dir.Sub("credentials")},
                                            {"AWS_CONFIG_FILE", dir.Sub("config")}};
  CKPTD_ASSERT_OK_AND_ASSIGN(S3Options d, S3OptionsFromEnvironment(Env(env)));
  EXPECT_EQ(d.credentials.access_key_id, "DEFAULTKEY");
  EXPECT_EQ(d.region, "us-west-2");
  EXPECT_THAT(d.credentials.source, HasSubstr("profile default"));
  env["AWS_PROFILE"] = "train";
  CKPTD_ASSERT_OK_AND_ASSIGN(S3Options t, S3OptionsFromEnvironment(Env(env)));
  EXPECT_EQ(t.credentials.access_key_id, "TRAINKEY");
  EXPECT_EQ(t.credentials.secret_access_key, "trainsecret");
  EXPECT_EQ(t.credentials.session_token, "T");
  EXPECT_EQ(t.region, "ap-south-1");
  EXPECT_EQ(t.endpoint, "https://minio.lan:9000");
  EXPECT_EQ(t.addressing, Addressing::kVirtualHosted);
  // The environment's region wins over the profile's.
  env["AWS_REGION"] = "eu-central-1";
  CKPTD_ASSERT_OK_AND_ASSIGN(S3Options r, S3OptionsFromEnvironment(Env(env)));
  EXPECT_EQ(r.region, "eu-central-1");
}

TEST(S3OptionsTest, MissingOrMalformedSettingsSayWhereWithoutQuotingSecrets) {
  ::ckptd::testing::TempDir dir;
  EXPECT_THAT(S3OptionsFromEnvironment(Env({{"HOME", dir.path()}})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("no S3 credentials"), HasSubstr(".aws/credentials"), HasSubstr("not found"))));
  EXPECT_THAT(S3OptionsFromEnvironment(Env({{"AWS_ACCESS_KEY_ID", "A"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("set together")));
  WriteText(dir.Sub("credentials"), "[default]\naws_secret_access_key topsecretvalue\n");
  absl::StatusOr<S3Options> bad = S3OptionsFromEnvironment(Env({{"AWS_SHARED_CREDENTIALS_FILE", dir.Sub("credentials")}}));
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     AllOf(HasSubstr("credentials:2"), Not(HasSubstr("topsecretvalue")))));
  std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", "A"}, {"AWS_SECRET_ACCESS_KEY", "S"}};
  for (auto [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"AWS_ENDPOINT_URL", "ftp://host"},
           {"AWS_ENDPOINT_URL", "https://user:pw@host"},
           {"AWS_REGION", "us east"},
           {"CKPTD_S3_MAX_CONNECTIONS", "0"},
           {"CKPTD_S3_MAX_CONNECTIONS", "100000"},
           {"CKPTD_S3_PART_BYTES", "1MiB"},
           {"CKPTD_S3_PART_BYTES", "6GiB"},
           {"CKPTD_S3_PART_BYTES", "lots"},
           {"CKPTD_S3_MAX_ATTEMPTS", "-1"}}) {
    SCOPED_TRACE(name + "=" + value);
    std::map<std::string, std::string> e = env;
    e[name] = value;
    EXPECT_THAT(S3OptionsFromEnvironment(Env(e)), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  }
}

TEST(UriEncodeTest, EncodesAllButUnreservedBytes) {
  EXPECT_EQ(UriEncode("a/b c+d%e~f_g.h-i", true), "a/b%20c%2Bd%25e~f_g.h-i");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9", true), "%C3%A9");
}

}  // namespace
}  // namespace ckptd::objstore
