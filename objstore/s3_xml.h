// The XML documents of the S3 API that the client reads and writes, with
// pugixml. Readers check what they rely on and say what was missing.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "objstore/s3_client.h"

namespace ckptd::objstore {

struct S3Error {
  std::string key;  // DeleteObjects: the key it is about
  std::string code;
  std::string message;
};

struct ListPage {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> prefixes;
  bool truncated = false;
  std::string next_token;
};

struct UploadPage {
  std::vector<UploadInfo> uploads;
  bool truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};

// <Error><Code/><Message/></Error>; empty fields when `body` is not one.
S3Error ParseError(absl::string_view body);
// ListObjectsV2's ListBucketResult.
absl::StatusOr<ListPage> ParseListPage(absl::string_view body);
// ListMultipartUploadsResult.
absl::StatusOr<UploadPage> ParseUploadPage(absl::string_view body);
// InitiateMultipartUploadResult's UploadId.
absl::StatusOr<std::string> ParseUploadId(absl::string_view body);
// CompleteMultipartUploadResult's ETag.
absl::StatusOr<std::string> ParseCompleteEtag(absl::string_view body);
// DeleteResult: the keys S3 did not delete, with why.
absl::StatusOr<std::vector<S3Error>> ParseDeleteResult(absl::string_view body);

// <Delete><Quiet>true</Quiet><Object><Key>..</Key></Object>...</Delete>
std::string DeleteRequestXml(absl::Span<const std::string> keys);
// <CompleteMultipartUpload><Part><PartNumber/><ETag/></Part>...</...>
std::string CompleteRequestXml(const std::vector<CompletedPart>& parts);

}  // namespace ckptd::objstore
