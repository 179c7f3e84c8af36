#include "objstore/s3_xml.h"

#include <pugixml.hpp>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status_macros.h"

namespace ckptd::objstore {
namespace {

absl::StatusOr<pugi::xml_node> Root(pugi::xml_document& doc, absl::string_view body, const char* name) {
  const pugi::xml_parse_result r = doc.load_buffer(body.data(), body.size());
  if (!r) {
    return absl::DataLossError(absl::StrCat("S3 answered with XML that does not parse (", r.description(), " at byte ",
                                            r.offset, ") where a ", name, " was expected"));
  }
  pugi::xml_node root = doc.child(name);
  if (!root) {
    return absl::DataLossError(
        absl::StrCat("S3 answered with <", doc.first_child().name(), "> where a <", name, "> was expected"));
  }
  return root;
}

std::string Text(const pugi::xml_node& n, const char* child) { return n.child(child).text().as_string(); }

bool Truncated(const pugi::xml_node& n) { return std::string(Text(n, "IsTruncated")) == "true"; }

std::string Escape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace

S3Error ParseError(absl::string_view body) {
  S3Error e;
  pugi::xml_document doc;
  if (!doc.load_buffer(body.data(), body.size())) return e;
  pugi::xml_node err = doc.child("Error");
  if (!err) return e;
  e.code = Text(err, "Code");
  e.message = Text(err, "Message");
  return e;
}

absl::StatusOr<ListPage> ParseListPage(absl::string_view body) {
  pugi::xml_document doc;
  CKPTD_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "ListBucketResult"));
  ListPage p;
  for (pugi::xml_node c : root.children("Contents")) {
    ObjectInfo o;
    o.key = Text(c, "Key");
    if (o.key.empty() || !absl::SimpleAtoi(Text(c, "Size"), &o.size)) {
      return absl::DataLossError("S3 listed an object without a key or a size");
    }
    o.etag = Text(c, "ETag");
    p.objects.push_back(std::move(o));
  }
  for (pugi::xml_node c : root.children("CommonPrefixes")) p.prefixes.push_back(Text(c, "Prefix"));
  p.truncated = Truncated(root);
  p.next_token = Text(root, "NextContinuationToken");
  return p;
}

absl::StatusOr<UploadPage> ParseUploadPage(absl::string_view body) {
  pugi::xml_document doc;
  CKPTD_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "ListMultipartUploadsResult"));
  UploadPage p;
  for (pugi::xml_node u : root.children("Upload")) {
    UploadInfo info;
    info.key = Text(u, "Key");
    info.upload_id = Text(u, "UploadId");
    if (info.key.empty() || info.upload_id.empty()) {
      return absl::DataLossError("S3 listed an upload without a key or an upload id");
    }
    std::string err;
    if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*S%Ez", Text(u, "Initiated"), &info.initiated, &err) &&
        !absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", Text(u, "Initiated"), &info.initiated, &err)) {
      info.initiated = absl::InfinitePast();
    }
    p.uploads.push_back(std::move(info));
  }
  p.truncated = Truncated(root);
  p.next_key_marker = Text(root, "NextKeyMarker");
  p.next_upload_id_marker = Text(root, "NextUploadIdMarker");
  return p;
}

absl::StatusOr<std::string> ParseUploadId(absl::string_view body) {
  pugi::xml_document doc;
  CKPTD_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "InitiateMultipartUploadResult"));
  std::string id = Text(root, "UploadId");
  if (id.empty()) return absl::DataLossError("S3 started an upload without giving its UploadId");
  return id;
}

absl::StatusOr<std::string> ParseCompleteEtag(absl::string_view body) {
  pugi::xml_document doc;
  CKPTD_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "CompleteMultipartUploadResult"));
  return Text(root, "ETag");
}

absl::StatusOr<std::vector<S3Error>> ParseDeleteResult(absl::string_view body) {
  pugi::xml_document doc;
  CKPTD_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "DeleteResult"));
  std::vector<S3Error> out;
  for (pugi::xml_node e : root.children("Error")) out.push_back({Text(e, "Key"), Text(e, "Code"), Text(e, "Message")});
  return out;
}

std::string DeleteRequestXml(absl::Span<const std::string> keys) {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Delete><Quiet>true</Quiet>";
  for (const std::string& k : keys) absl::StrAppend(&out, "<Object><Key>", Escape(k), "</Key></Object>");
  out += "</Delete>";
  return out;
}

std::string CompleteRequestXml(const std::vector<CompletedPart>& parts) {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><CompleteMultipartUpload>";
  for (const CompletedPart& p : parts) {
    absl::StrAppend(&out, "<Part><PartNumber>", p.number, "</PartNumber><ETag>", Escape(p.etag), "</ETag></Part>");
  }
  out += "</CompleteMultipartUpload>";
  return out;
}

}  // namespace ckptd::objstore
