// Smoke runs of `ckptd-bench register` and `ckptd-bench restore` with tiny
// sizes: checks what they report, not how fast anything was.
#include "bench/restore_bench.h"

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "base/flags.h"
#include "client/fake_device_copier.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#if CKPTD_HAVE_OBJSTORE
#include "objstore/storage_root.h"
#include "objstore/testing_rgw.h"
#include "storage/posix_file_system.h"
#endif

namespace ckptd::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

google::protobuf::Struct ParseJson(const std::string& text) {
  google::protobuf::Struct json;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &json).ok()) << text;
  return json;
}

TEST(RegisterBenchTest, SecondRegistrationTakesTheParkedSegmentOver) {
  std::ostringstream out, err;
  // 3 buffers of 40 MiB in 2 slots: above 64 MiB, allocated in the background.
  ASSERT_EQ(RunRegisterBench({"--bytes", "40M", "--buffers", "3", "--repeat", "1", "--json"}, out, err),
            base::kExitOk)
      << err.str();
  const google::protobuf::Struct json = ParseJson(out.str());
  const auto& f = json.fields();
  for (const char* key : {"bytes", "buffers", "slots", "segment_bytes", "rounds", "first_register_s", "ready_s",
                          "first_snapshot_s", "again_register_s", "again_reused", "again_target_s",
                          "again_target_met"}) {
    EXPECT_TRUE(f.contains(key)) << key << " missing from " << out.str();
  }
  EXPECT_EQ(f.at("buffers").number_value(), 3);
  EXPECT_GE(f.at("segment_bytes").number_value(), 2 * 40.0 * (1 << 20));
  EXPECT_TRUE(f.at("again_reused").bool_value()) << out.str();
  EXPECT_GE(f.at("ready_s").number_value(), f.at("first_register_s").number_value());
}

TEST(RestoreBenchTest, EachTierRestoresVerifiedBytesFromWhereItShould) {
  for (const auto& [from, source] : std::vector<std::pair<std::string, std::string>>{
           {"memory", "memory"}, {"local", "node-local"}, {"root", "storage-root"}}) {
    std::ostringstream out, err;
    ASSERT_EQ(RunRestoreBench({"--bytes", "3M", "--from", from, "--repeat", "2", "--json"}, out, err), base::kExitOk)
        << from << ": " << err.str();
    const google::protobuf::Struct json = ParseJson(out.str());
    const auto& f = json.fields();
    EXPECT_EQ(f.at("source").string_value(), source) << out.str();
    EXPECT_TRUE(f.at("source_as_expected").bool_value()) << out.str();
    EXPECT_TRUE(f.at("verified").bool_value());
    EXPECT_EQ(f.at("rounds").number_value(), 2);
    EXPECT_GT(f.at("restore_s").number_value(), 0);
    EXPECT_TRUE(f.contains(from == "memory" ? "memcpy_s" : "read_s")) << out.str();
    EXPECT_EQ(f.contains("target_met"), from == "memory") << out.str();
  }
}

// --cuda through a copier whose "device" memory is host memory: the restart
// and the rollback restore verified bytes onto the device from the agent's
// memory, and the yardsticks run.
TEST(RestoreBenchTest, DeviceRestoresAreVerifiedAndMeasuredBesideCudaMemcpy) {
  client::FakeDeviceCopier fake;
  std::ostringstream out, err;
  ASSERT_EQ(RunRestoreBench({"--bytes", "3M", "--cuda", "0", "--repeat", "2", "--json"}, out, err, &fake),
            base::kExitOk)
      << err.str();
  const google::protobuf::Struct json = ParseJson(out.str());
  const auto& f = json.fields();
  EXPECT_EQ(f.at("device").string_value(), "cuda:0");
  EXPECT_EQ(f.at("source").string_value(), "memory") << out.str();
  EXPECT_TRUE(f.at("source_as_expected").bool_value());
  EXPECT_TRUE(f.at("verified").bool_value());
  for (const char* key : {"restore_s", "rollback_s", "cuda_memcpy_s", "pageable_memcpy_s", "host_register_s", "ratio",
                          "rollback_ratio", "restore_vs_pageable", "target_ratio", "target_met",
                          "rollback_target_met"}) {
    EXPECT_TRUE(f.contains(key)) << key << " missing from " << out.str();
  }
  EXPECT_GT(f.at("restore_s").number_value(), 0);
  EXPECT_GT(f.at("rollback_s").number_value(), 0);
  EXPECT_EQ(f.at("target_ratio").number_value(), 1.2);
  // The writer's snapshots lock their slots (and after a restore the slots
  // are locked in the background), the yardstick its pattern: everything is
  // unlocked again.
  EXPECT_GE(fake.locks(), 2 * 2);
  EXPECT_EQ(fake.locked(), 0);
  EXPECT_EQ(fake.live(), 0);  // both device buffers freed
  EXPECT_EQ(fake.calls_on_no_device(), 0);
  // The text report says both ratios.
  std::ostringstream text, text_err;
  ASSERT_EQ(RunRestoreBench({"--bytes", "1M", "--cuda", "0", "--repeat", "1"}, text, text_err, &fake), base::kExitOk)
      << text_err.str();
  EXPECT_THAT(text.str(), HasSubstr("onto cuda:0 (read from memory, bytes verified)"));
  EXPECT_THAT(text.str(), HasSubstr("page-locked cudaMemcpy (target <= 1.2x"));
}

// Without a usable device (no GPU here, or no CUDA in the build) --cuda
// fails at once, naming it.
TEST(RestoreBenchTest, CudaWithoutADeviceIsAClearError) {
  if (client::NewCudaCopier().ok()) GTEST_SKIP() << "this machine has a CUDA device";
  std::ostringstream out, err;
  EXPECT_EQ(RunRestoreBench({"--bytes", "1M", "--cuda", "0"}, out, err), base::kExitFailed);
  EXPECT_THAT(err.str(), HasSubstr("--cuda 0: "));
  EXPECT_EQ(out.str(), "");
}

TEST(RestoreBenchTest, BadArgumentsAreUsageErrorsNamingTheFlag) {
  struct Case {
    bool restore;
    std::vector<std::string> argv;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {true, {"--bytes", "1M", "--from", "disk"}, "--from must be memory, peer, local or root, got \"disk\""},
           {true, {"--bytes", "2T"}, "--bytes must be a size in 1..1T"},
           {true, {"--bytes", "1M", "--repeat", "0"}, "--repeat must be an integer in 1..100"},
           {true, {"--from", "root"}, "--bytes is required"},
           {true, {"--bytes", "1M", "--from", "root", "--cuda", "0"}, "--cuda goes with --from memory"},
           {true, {"--bytes", "1M", "--cuda", "1024"}, "--cuda must be an integer in 0..1023"},
           {true, {"--bytes", "1M", "--root", "s3://bench/r"}, "--root goes with --from local or --from root"},
           {true, {"--bytes", "1M", "--from", "peer", "--root", "s3://bench/r"}, "--root goes with --from local"},
           {true, {"--bytes", "1M", "--cuda", "0", "--root", "s3://bench/r"}, "--root goes with --from local"},
           {false, {"--bytes", "1M", "--slots", "17"}, "--slots must be an integer in 1..16"},
           {false, {"--bytes", "1M", "--buffers", "1025"}, "--buffers must be an integer in 1..1024"},
           {false, {"--bytes", "2", "--buffers", "3"}, "cannot be cut into 3 buffers"},
       }) {
    std::ostringstream out, err;
    EXPECT_EQ(c.restore ? RunRestoreBench(c.argv, out, err) : RunRegisterBench(c.argv, out, err), base::kExitUsage)
        << c.message;
    EXPECT_THAT(err.str(), HasSubstr(c.message));
  }
}

// A --root that cannot be opened fails before anything runs, naming --root
// and what is wrong with it (no S3 server needed: neither gets that far).
TEST(RestoreBenchTest, AnUnusableRootIsAClearFailure) {
  for (const auto& [root, message] : std::vector<std::pair<std::string, std::string>>{
           {"/tmp/a-folder", "--root: `/tmp/a-folder` is not an object store location (s3://bucket/prefix)"},
           {"s3://No_Such/r", "--root: "}}) {
    std::ostringstream out, err;
    EXPECT_EQ(RunRestoreBench({"--bytes", "1M", "--from", "root", "--root", root}, out, err), base::kExitFailed)
        << root;
    EXPECT_THAT(err.str(), HasSubstr(message));
    EXPECT_EQ(out.str(), "");
  }
}

#if CKPTD_HAVE_OBJSTORE
// The AWS_* variables that lead this process to the tests' RGW, as long as
// this object lives.
class RgwEnvironment {
 public:
  explicit RgwEnvironment(const objstore::S3Options& s3) {
    Set("AWS_ENDPOINT_URL_S3", s3.endpoint);
    Set("AWS_REGION", s3.region);
    Set("AWS_ACCESS_KEY_ID", s3.credentials.access_key_id);
    Set("AWS_SECRET_ACCESS_KEY", s3.credentials.secret_access_key);
  }
  ~RgwEnvironment() {
    for (const std::string& name : names_) ::unsetenv(name.c_str());
  }

 private:
  void Set(const std::string& name, const std::string& value) {
    ASSERT_EQ(::setenv(name.c_str(), value.c_str(), 1), 0);
    names_.push_back(name);
  }
  std::vector<std::string> names_;
};

// --root on the tests' RGW: --from root restores verified bytes from the
// object store and says why the S3 yardstick is missing (s3_transfer.py lies
// beside ckptd-bench, not beside this test); --from local reads the tier in
// front of it. Each run removes its job from the bucket.
TEST(RestoreBenchTest, ObjectStoreRootRestoresVerifiedBytes) {
  CKPTD_REQUIRE_RGW(rgw);
  RgwEnvironment env(rgw.options);
  const std::string root = objstore::testing::UniqueRoot(rgw, "restore");
  for (const auto& [from, source] :
       std::vector<std::pair<std::string, std::string>>{{"root", "storage-root"}, {"local", "node-local"}}) {
    std::ostringstream out, err;
    ASSERT_EQ(RunRestoreBench({"--bytes", "3M", "--from", from, "--root", root, "--repeat", "2", "--json"}, out, err),
              base::kExitOk)
        << from << ": " << err.str();
    const google::protobuf::Struct json = ParseJson(out.str());
    const auto& f = json.fields();
    EXPECT_EQ(f.at("source").string_value(), source) << out.str();
    EXPECT_TRUE(f.at("verified").bool_value());
    EXPECT_THAT(f.at("root").string_value(), HasSubstr(root + " (endpoint " + rgw.options.endpoint));
    EXPECT_THAT(f.at("root").string_value(), Not(HasSubstr(rgw.options.credentials.secret_access_key)));
    EXPECT_GT(f.at("restore_s").number_value(), 0);
    if (from == "root") {
      EXPECT_GT(f.at("restore_gbps").number_value(), 0);
      EXPECT_THAT(f.at("s3_client_missing").string_value(), HasSubstr("s3_transfer.py is missing"));
      for (const char* key : {"s3_client_gbps", "restore_vs_s3_client", "read_s", "ratio", "resident_after_evict"}) {
        EXPECT_FALSE(f.contains(key)) << key << " in " << out.str();
      }
    } else {
      EXPECT_TRUE(f.contains("read_s")) << out.str();
      EXPECT_FALSE(f.contains("s3_client_missing")) << out.str();
    }
  }
  // Nothing of either run is left below the root.
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  absl::StatusOr<objstore::StorageRoot> opened = objstore::OpenStorageRoot(root, posix.get());
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<std::vector<storage::FileInfo>> left = opened->fs->ListDir(opened->path);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty()) << left->front().name;
}
#endif

}  // namespace
}  // namespace ckptd::bench
