#include "storage/manifest.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"  // testing_matchers.h uses its CONCAT macro
#include "base/testing/matchers.h"
#include "format/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/layout.h"
#include "storage/shard_format.h"

namespace ckptd::storage {
namespace {

using ::ckptd::format::Xxh3;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::ckptd::v1::StepManifest;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kWhat[] = "/ckpt/llama/step-1200/MANIFEST";

StepManifest MakeManifest(uint32_t world_size) {
  StepManifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_job("llama-70b");
  m.set_step(1200);
  m.set_world_size(world_size);
  m.set_committed_unix_nanos(1700000000123456789);
  for (uint32_t r = 0; r < world_size; ++r) {
    ckptd::v1::ShardRef* s = m.add_shards();
    s->set_rank(r);
    s->set_file(ShardFileName(r));
    s->set_file_length(4096 * (10 + r));
    s->set_index_xxh3(0x9E3779B97F4A7C15ull * (r + 1));
    s->set_raw_bytes(1000000 + r);
    s->set_stored_bytes(700000 + r);
    s->set_persist_seconds(0.25 * (r + 1));
  }
  (*m.mutable_metadata())["framework"] = "torch";
  (*m.mutable_metadata())["git"] = "de0c53b";
  return m;
}

void ExpectSameManifest(const StepManifest& got, const StepManifest& want) {
  EXPECT_EQ(got.format_version(), want.format_version());
  EXPECT_EQ(got.job(), want.job());
  EXPECT_EQ(got.step(), want.step());
  EXPECT_EQ(got.world_size(), want.world_size());
  EXPECT_EQ(got.committed_unix_nanos(), want.committed_unix_nanos());
  ASSERT_EQ(got.shards_size(), want.shards_size());
  for (int i = 0; i < want.shards_size(); ++i) {
    EXPECT_EQ(got.shards(i).DebugString(), want.shards(i).DebugString()) << "shard " << i;
  }
  EXPECT_EQ(got.metadata_size(), want.metadata_size());
  for (const auto& [k, v] : want.metadata()) {
    auto it = got.metadata().find(k);
    ASSERT_NE(it, got.metadata().end()) << k;
    EXPECT_EQ(it->second, v);
  }
}

// A MANIFEST with a correct header around `payload`.
std::string WithPayload(absl::string_view payload, uint32_t version = kManifestFormatVersion) {
  std::string out(kManifestHeaderBytes, '\0');
  uint8_t* h = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(h, kManifestMagic.data(), 8);
  PutFixed32(h + 8, version);
  PutFixed32(h + 12, static_cast<uint32_t>(payload.size()));
  PutFixed64(h + 16, Xxh3(payload));
  out.append(payload.data(), payload.size());
  return out;
}

TEST(ManifestTest, RoundTrip) {
  for (uint32_t world : {1u, 2u, 8u, 512u}) {
    SCOPED_TRACE(world);
    const StepManifest m = MakeManifest(world);
    const std::string bytes = EncodeManifest(m);
    ASSERT_GE(bytes.size(), kManifestHeaderBytes);
    EXPECT_EQ(bytes.substr(0, 8), "CKPTMNFT");
    EXPECT_EQ(GetFixed32(reinterpret_cast<const uint8_t*>(bytes.data()) + 8), kManifestFormatVersion);
    EXPECT_EQ(GetFixed32(reinterpret_cast<const uint8_t*>(bytes.data()) + 12), bytes.size() - kManifestHeaderBytes);
    EXPECT_EQ(GetFixed64(reinterpret_cast<const uint8_t*>(bytes.data()) + 16),
              Xxh3(absl::string_view(bytes).substr(kManifestHeaderBytes)));
    CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest got, DecodeManifest(bytes, kWhat));
    ExpectSameManifest(got, m);
    // Re-encoding what was decoded gives the same manifest (map order may differ).
    const std::string again = EncodeManifest(got);
    EXPECT_EQ(again.size(), bytes.size());
    CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest twice, DecodeManifest(again, kWhat));
    ExpectSameManifest(twice, m);
  }
}

TEST(ManifestTest, ShardsInAnyOrder) {
  StepManifest m = MakeManifest(4);
  m.mutable_shards()->SwapElements(0, 3);
  m.mutable_shards()->SwapElements(1, 2);
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest got, DecodeManifest(EncodeManifest(m), kWhat));
  ExpectSameManifest(got, m);
}

TEST(ManifestTest, EveryByteFlipIsRejected) {
  const std::string bytes = EncodeManifest(MakeManifest(4));
  ASSERT_GT(bytes.size(), 100u);
  for (size_t off = 0; off < bytes.size(); ++off) {
    for (uint8_t mask : {uint8_t{0x01}, static_cast<uint8_t>(1u << (off % 8)), uint8_t{0x80}, uint8_t{0xFF}}) {
      SCOPED_TRACE(::testing::Message() << "offset " << off << " xor " << static_cast<int>(mask));
      std::string bad = bytes;
      bad[off] = static_cast<char>(static_cast<uint8_t>(bad[off]) ^ mask);
      absl::StatusOr<StepManifest> got = DecodeManifest(bad, kWhat);
      if (off >= 8 && off < 12) {
        // The version field: read as a version this build does not know.
        EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kUnimplemented,
                                           AllOf(StartsWith(kWhat), HasSubstr("manifest version"))));
      } else {
        const char* what = off < 8    ? "not a ckptd manifest"
                           : off < 16 ? "truncated or extended"
                                      : "checksum mismatch";
        EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kDataLoss, AllOf(StartsWith(kWhat), HasSubstr(what))));
      }
      if (HasFailure()) return;
    }
  }
}

TEST(ManifestTest, TruncationAtEveryLength) {
  const std::string bytes = EncodeManifest(MakeManifest(3));
  for (size_t len = 0; len < bytes.size(); ++len) {
    SCOPED_TRACE(len);
    EXPECT_THAT(DecodeManifest(absl::string_view(bytes).substr(0, len), kWhat).status(),
                StatusIs(absl::StatusCode::kDataLoss, AllOf(StartsWith(kWhat), HasSubstr("truncated"))));
    if (HasFailure()) return;
  }
}

TEST(ManifestTest, ExtensionIsDataLoss) {
  const std::string bytes = EncodeManifest(MakeManifest(3));
  for (const std::string& extra : {std::string(1, '\0'), std::string(7, 'x'), std::string(4096, '\0'), bytes}) {
    SCOPED_TRACE(extra.size());
    EXPECT_THAT(DecodeManifest(bytes + extra, kWhat).status(),
                StatusIs(absl::StatusCode::kDataLoss, AllOf(StartsWith(kWhat), HasSubstr("truncated or extended"))));
  }
}

TEST(ManifestTest, GarbageIsDataLoss) {
  std::mt19937_64 rng(7);
  for (size_t size : {0, 1, 23, 24, 25, 100, 4096}) {
    std::string garbage(size, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    EXPECT_THAT(DecodeManifest(garbage, kWhat).status(), StatusIs(absl::StatusCode::kDataLoss, StartsWith(kWhat)))
        << size;
  }
  // A shard file is not a manifest.
  std::string shard(8192, '\0');
  std::memcpy(shard.data(), kShardMagic.data(), 8);
  EXPECT_THAT(DecodeManifest(shard, kWhat).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a ckptd manifest")));
}

TEST(ManifestTest, NewerVersionIsUnimplemented) {
  const std::string payload = MakeManifest(2).SerializeAsString();
  for (uint32_t version : {0u, 2u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(version);
    EXPECT_THAT(DecodeManifest(WithPayload(payload, version), kWhat).status(),
                StatusIs(absl::StatusCode::kUnimplemented,
                         AllOf(StartsWith(kWhat), HasSubstr(absl::StrCat("manifest version ", version)))));
  }
  // A newer header layout with a different length or checksum is still named as a newer version.
  std::string v2 = WithPayload(payload, 2);
  v2.resize(v2.size() + 13, '\x01');
  EXPECT_THAT(DecodeManifest(v2, kWhat).status(),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("manifest version 2")));
  // A payload version that disagrees with the header is corruption.
  StepManifest m = MakeManifest(2);
  m.set_format_version(2);
  EXPECT_THAT(DecodeManifest(EncodeManifest(m), kWhat).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("payload version 2 disagrees with its header")));
}

TEST(ManifestTest, HeaderLengthProblems) {
  const std::string payload = MakeManifest(2).SerializeAsString();
  std::string bad = WithPayload(payload);
  // Length past the limit, and a length that claims more than there is.
  for (uint32_t length : {static_cast<uint32_t>(kMaxManifestBytes + 1), 0xFFFFFFFFu,
                          static_cast<uint32_t>(payload.size() + 1), static_cast<uint32_t>(payload.size() - 1), 0u}) {
    SCOPED_TRACE(length);
    PutFixed32(reinterpret_cast<uint8_t*>(bad.data()) + 12, length);
    EXPECT_THAT(DecodeManifest(bad, kWhat).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(StartsWith(kWhat), HasSubstr(absl::StrCat("says ", length, " payload bytes")))));
  }
  // Payload that does not parse, under a correct checksum.
  EXPECT_THAT(DecodeManifest(WithPayload(std::string(10, '\xff')), kWhat).status(),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(StartsWith(kWhat), HasSubstr("does not parse"))));
  // An empty payload parses as version 0.
  EXPECT_THAT(DecodeManifest(WithPayload(""), kWhat).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("payload version 0")));
}

struct BadManifest {
  const char* what;
  std::function<void(StepManifest&)> mutate;
  std::vector<std::string> substrings;
};

TEST(ManifestTest, InconsistentContentsAreDataLoss) {
  const std::vector<BadManifest> cases = {
      {"world size larger than the shard list", [](StepManifest& m) { m.set_world_size(5); },
       {"lists 4 shards for a world of 5"}},
      {"world size smaller than the shard list", [](StepManifest& m) { m.set_world_size(3); },
       {"lists 4 shards for a world of 3"}},
      {"shard missing", [](StepManifest& m) { m.mutable_shards()->RemoveLast(); }, {"lists 3 shards for a world of 4"}},
      {"world of zero", [](StepManifest& m) {
         m.set_world_size(0);
         m.clear_shards();
       },
       {"lists 0 shards for a world of 0"}},
      {"duplicate rank",
       [](StepManifest& m) {
         m.mutable_shards(2)->set_rank(1);
         m.mutable_shards(2)->set_file(ShardFileName(1));
       },
       {"rank 1 twice or outside its world of 4"}},
      {"rank outside the world",
       [](StepManifest& m) {
         m.mutable_shards(3)->set_rank(4);
         m.mutable_shards(3)->set_file(ShardFileName(4));
       },
       {"rank 4 twice or outside its world of 4"}},
      {"huge rank",
       [](StepManifest& m) {
         m.mutable_shards(0)->set_rank(0xFFFFFFFFu);
       },
       {"rank 4294967295 twice or outside"}},
      {"path traversal", [](StepManifest& m) { m.mutable_shards(0)->set_file("../etc/passwd"); },
       {"rank 0 names file \"../etc/passwd\"", "expected rank-0.shard"}},
      {"absolute path", [](StepManifest& m) { m.mutable_shards(1)->set_file("/etc/passwd"); },
       {"rank 1 names file \"/etc/passwd\""}},
      {"another rank's file", [](StepManifest& m) { m.mutable_shards(0)->set_file("rank-1.shard"); },
       {"rank 0 names file \"rank-1.shard\"", "expected rank-0.shard"}},
      {"leading zero", [](StepManifest& m) { m.mutable_shards(2)->set_file("rank-02.shard"); },
       {"rank 2 names file \"rank-02.shard\""}},
      {"temp file", [](StepManifest& m) { m.mutable_shards(3)->set_file("rank-3.shard.tmp"); },
       {"rank 3 names file \"rank-3.shard.tmp\""}},
      {"subdirectory", [](StepManifest& m) { m.mutable_shards(3)->set_file("x/rank-3.shard"); },
       {"rank 3 names file \"x/rank-3.shard\""}},
      {"empty file name", [](StepManifest& m) { m.mutable_shards(1)->set_file(""); }, {"rank 1 names file \"\""}},
      {"control characters are escaped", [](StepManifest& m) { m.mutable_shards(1)->set_file("rank-1.shard\n"); },
       {"rank 1 names file \"rank-1.shard\\n\""}},
  };
  for (const BadManifest& c : cases) {
    SCOPED_TRACE(c.what);
    StepManifest m = MakeManifest(4);
    c.mutate(m);
    std::vector<::testing::Matcher<std::string>> subs = {StartsWith(std::string(kWhat))};
    for (const std::string& s : c.substrings) subs.push_back(HasSubstr(s));
    EXPECT_THAT(DecodeManifest(EncodeManifest(m), kWhat).status(),
                StatusIs(absl::StatusCode::kDataLoss, ::testing::AllOfArray(subs)));
  }
}

TEST(ManifestTest, EveryPayloadByteFlipUnderAValidChecksumIsSafe) {
  // A manifest damaged before it was checksummed: DecodeManifest either
  // refuses it as kDataLoss or returns a manifest that keeps its invariants.
  const std::string payload = MakeManifest(4).SerializeAsString();
  for (size_t flip = 0; flip < payload.size() * 8; ++flip) {
    SCOPED_TRACE(::testing::Message() << "payload byte " << flip / 8 << " bit " << flip % 8);
    std::string bad = payload;
    bad[flip / 8] ^= static_cast<char>(1 << (flip % 8));
    absl::StatusOr<StepManifest> got = DecodeManifest(WithPayload(bad), kWhat);
    if (!got.ok()) {
      EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kDataLoss, StartsWith(kWhat)));
    } else {
      ASSERT_GT(got->world_size(), 0u);
      ASSERT_EQ(static_cast<uint32_t>(got->shards_size()), got->world_size());
      std::vector<bool> seen(got->world_size());
      for (const ckptd::v1::ShardRef& s : got->shards()) {
        ASSERT_LT(s.rank(), got->world_size());
        EXPECT_FALSE(seen[s.rank()]);
        seen[s.rank()] = true;
        EXPECT_EQ(s.file(), ShardFileName(s.rank()));
      }
    }
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace ckptd::storage
