// The S3 XML documents the client reads and writes.
#include "objstore/s3_xml.h"

#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::objstore {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

TEST(S3XmlTest, ReadsAListPageWithPrefixesAndAContinuation) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      ListPage p, ParseListPage("<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                                "<Name>b</Name><IsTruncated>true</IsTruncated><NextContinuationToken>tok</NextContinuationToken>"
                                "<Contents><Key>r/a &amp; b</Key><Size>12</Size><ETag>\"e1\"</ETag></Contents>"
                                "<CommonPrefixes><Prefix>r/step-1/</Prefix></CommonPrefixes></ListBucketResult>"));
  ASSERT_EQ(p.objects.size(), 1u);
  EXPECT_EQ(p.objects[0].key, "r/a & b");
  EXPECT_EQ(p.objects[0].size, 12u);
  EXPECT_EQ(p.objects[0].etag, "\"e1\"");
  EXPECT_EQ(p.prefixes, std::vector<std::string>{"r/step-1/"});
  EXPECT_TRUE(p.truncated);
  EXPECT_EQ(p.next_token, "tok");
}

TEST(S3XmlTest, RefusesWhatItCannotTrust) {
  EXPECT_THAT(ParseListPage("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("size")));
  EXPECT_THAT(ParseListPage("<ListBucketResult><Contents>"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("parse")));
  EXPECT_THAT(ParseUploadId("<Error><Code>X</Code></Error>"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("<Error>")));
  EXPECT_THAT(ParseUploadId("<InitiateMultipartUploadResult></InitiateMultipartUploadResult>"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("UploadId")));
  EXPECT_THAT(ParseUploadPage("<ListMultipartUploadsResult><Upload><Key>k</Key></Upload></ListMultipartUploadsResult>"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("upload id")));
}

TEST(S3XmlTest, ReadsUploadsErrorsAndDeleteResults) {
  CKPTD_ASSERT_OK_AND_ASSIGN(
      UploadPage u, ParseUploadPage("<ListMultipartUploadsResult><IsTruncated>false</IsTruncated><Upload><Key>k</Key>"
                                    "<UploadId>id-1</UploadId><Initiated>2026-12-06T07:00:00.000Z</Initiated></Upload>"
                                    "</ListMultipartUploadsResult>"));
  ASSERT_EQ(u.uploads.size(), 1u);
  EXPECT_EQ(u.uploads[0].upload_id, "id-1");
  EXPECT_EQ(absl::FormatTime("%Y-%m-%d %H:%M", u.uploads[0].initiated, absl::UTCTimeZone()), "2026-12-06 07:00");
  S3Error e = ParseError("<Error><Code>SlowDown</Code><Message>Please reduce</Message></Error>");
  EXPECT_EQ(e.code, "SlowDown");
  EXPECT_EQ(e.message, "Please reduce");
  EXPECT_EQ(ParseError("not xml").code, "");
  CKPTD_ASSERT_OK_AND_ASSIGN(
      std::vector<S3Error> failed,
      ParseDeleteResult("<DeleteResult><Deleted><Key>a</Key></Deleted><Error><Key>b</Key><Code>AccessDenied</Code>"
                        "<Message>no</Message></Error></DeleteResult>"));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].key, "b");
  EXPECT_EQ(failed[0].code, "AccessDenied");
}

TEST(S3XmlTest, WritesRequestsWithKeysEscaped) {
  const std::vector<std::string> keys = {"a<b", "c&d"};
  EXPECT_EQ(DeleteRequestXml(keys),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Delete><Quiet>true</Quiet><Object><Key>a&lt;b</Key></Object>"
            "<Object><Key>c&amp;d</Key></Object></Delete>");
  EXPECT_THAT(CompleteRequestXml({{1, "\"e1\""}, {2, "\"e2\""}}),
              HasSubstr("<Part><PartNumber>2</PartNumber><ETag>&quot;e2&quot;</ETag></Part>"));
}

}  // namespace
}  // namespace ckptd::objstore
