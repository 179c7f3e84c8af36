#include "objstore/s3_options.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace ckptd::objstore {
namespace {

constexpr size_t kMaxKeyBytes = 1024;

bool ValidBucketName(absl::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-')) return false;
  }
  auto alnum = [](char c) { return absl::ascii_islower(c) || absl::ascii_isdigit(c); };
  return alnum(b.front()) && alnum(b.back()) && !absl::StrContains(b, "..");
}

// One INI file of the AWS CLI: section -> key -> value. Keys are lower-case;
// an indented line continues a nested block (`s3 =` sub-settings), which is
// read as "s3.<key>".
using IniFile = std::map<std::string, std::map<std::string, std::string>>;

absl::StatusOr<std::optional<IniFile>> ReadIni(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::optional<IniFile>();
  IniFile ini;
  std::string section, nested, line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l.front() == '[') {
      if (l.back() != ']') {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": a section header without ']'"));
      }
      section = std::string(absl::StripAsciiWhitespace(l.substr(1, l.size() - 2)));
      nested.clear();
      continue;
    }
    const size_t eq = l.find('=');
    if (eq == absl::string_view::npos || section.empty()) {
      // Never quote the line: it may hold a secret.
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": expected `key = value` inside a [section]"));
    }
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(l.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(l.substr(eq + 1)));
    if (!indented) nested.clear();
    if (indented && !nested.empty()) key = absl::StrCat(nested, ".", key);
    if (!indented && value.empty()) nested = key;
    ini[section][key] = std::move(value);
  }
  return std::optional<IniFile>(std::move(ini));
}

std::string HomeFile(const EnvLookup& env, absl::string_view relative) {
  std::optional<std::string> home = env("HOME");
  if (!home || home->empty()) return "";
  return absl::StrCat(*home, "/", relative);
}

absl::StatusOr<uint64_t> ParseByteCount(absl::string_view name, absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  uint64_t unit = 1;
  for (auto [suffix, mult] : {std::pair<absl::string_view, uint64_t>{"KiB", uint64_t{1} << 10},
                              {"MiB", uint64_t{1} << 20},
                              {"GiB", uint64_t{1} << 30}}) {
    if (absl::ConsumeSuffix(&t, suffix)) {
      unit = mult;
      break;
    }
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(t, &n) || n == 0 || n > (uint64_t{5} << 30) / unit) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", text, ": expected a size such as 67108864, 64MiB or 1GiB, at most 5GiB"));
  }
  return n * unit;
}

absl::StatusOr<int> ParseCount(absl::string_view name, absl::string_view text, int lo, int hi) {
  int n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < lo || n > hi) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", text, ": expected a whole number from ", lo, " to ", hi));
  }
  return n;
}

}  // namespace

bool IsObjectStoreRoot(absl::string_view root) { return absl::StartsWith(root, kS3Scheme); }

std::string ObjectUrl::ToString() const {
  return key.empty() ? absl::StrCat(kS3Scheme, bucket) : absl::StrCat(kS3Scheme, bucket, "/", key);
}

absl::StatusOr<ObjectUrl> ParseObjectUrl(absl::string_view url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, kS3Scheme)) {
    return absl::InvalidArgumentError(absl::StrCat("`", url, "` is not an object store URL (s3://bucket/prefix)"));
  }
  const size_t slash = rest.find('/');
  ObjectUrl out;
  out.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucketName(out.bucket)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", url, "`: `", out.bucket,
                     "` is not a valid bucket name (3 to 63 of a-z 0-9 . -, starting and ending with a letter or "
                     "digit)"));
  }
  if (slash == absl::string_view::npos) return out;
  absl::string_view key = rest.substr(slash + 1);
  while (!key.empty() && key.back() == '/') key.remove_suffix(1);
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("`", url.substr(0, 64), "...`: the key is ", key.size(),
                                                   " bytes, over the limit of ", kMaxKeyBytes));
  }
  for (char c : key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') {
      return absl::InvalidArgumentError(
          absl::StrCat("`", absl::CHexEscape(url), "`: a key may not hold control characters or '\\'"));
    }
  }
  if (!key.empty()) {
    for (absl::string_view part : absl::StrSplit(key, '/')) {
      if (part.empty() || part == "." || part == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat("`", url, "`: a key may not hold empty, '.' or '..' components"));
      }
    }
  }
  out.key = std::string(key);
  return out;
}

std::string S3Options::EffectiveEndpoint() const {
  if (!endpoint.empty()) return endpoint;
  return absl::StrCat("https://s3.", region, ".amazonaws.com");
}

std::string S3Options::Describe() const {
  return absl::StrCat(
      "endpoint ", EffectiveEndpoint(), ", region ", region, ", ",
      addressing == Addressing::kPath ? "path-style" : "virtual-hosted", " addressing, credentials ",
      credentials.empty() ? std::string("none") : absl::StrCat(credentials.access_key_id, " from ", credentials.source),
      credentials.session_token.empty() ? "" : " (with a session token)");
}

EnvLookup ProcessEnvironment() {
  return [](absl::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::StatusOr<S3Options> S3OptionsFromEnvironment(const EnvLookup& env) {
  S3Options o;
  auto get = [&](absl::string_view name) -> std::string {
    std::optional<std::string> v = env(name);
    return v ? *v : std::string();
  };
  std::string profile = get("AWS_PROFILE");
  if (profile.empty()) profile = "default";

  // The config file: [profile NAME], or [default].
  std::string config_path = get("AWS_CONFIG_FILE");
  if (config_path.empty()) config_path = HomeFile(env, ".aws/config");
  std::map<std::string, std::string> config;
  if (!config_path.empty()) {
    CKPTD_ASSIGN_OR_RETURN(std::optional<IniFile> ini, ReadIni(config_path));
    if (ini) {
      auto it = ini->find(profile == "default" ? "default" : absl::StrCat("profile ", profile));
      if (it == ini->end()) it = ini->find(profile);
      if (it != ini->end()) config = it->second;
    }
  }
  auto from_config = [&](const std::string& key) {
    auto it = config.find(key);
    return it == config.end() ? std::string() : it->second;
  };

  o.credentials.access_key_id = get("AWS_ACCESS_KEY_ID");
  o.credentials.secret_access_key = get("AWS_SECRET_ACCESS_KEY");
  o.credentials.session_token = get("AWS_SESSION_TOKEN");
  if (!o.credentials.access_key_id.empty() || !o.credentials.secret_access_key.empty()) {
    if (o.credentials.access_key_id.empty() || o.credentials.secret_access_key.empty()) {
      return absl::InvalidArgumentError(
          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together (one of them is empty)");
    }
    o.credentials.source = "environment";
  } else {
    std::string path = get("AWS_SHARED_CREDENTIALS_FILE");
    if (path.empty()) path = HomeFile(env, ".aws/credentials");
    std::optional<IniFile> ini;
    if (!path.empty()) {
      CKPTD_ASSIGN_OR_RETURN(ini, ReadIni(path));
    }
    auto it = ini ? ini->find(profile) : IniFile::const_iterator();
    std::map<std::string, std::string> section;
    if (ini && it != ini->end()) section = it->second;
    // The config file may hold keys too.
    for (const char* k : {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}) {
      if (section.count(k) == 0 && config.count(k) != 0) section[k] = config[k];
    }
    o.credentials.access_key_id = section["aws_access_key_id"];
    o.credentials.secret_access_key = section["aws_secret_access_key"];
    o.credentials.session_token = section["aws_session_token"];
    if (o.credentials.access_key_id.empty() || o.credentials.secret_access_key.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no S3 credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and profile `", profile,
                       "` has no aws_access_key_id and aws_secret_access_key in ",
                       path.empty() ? "~/.aws/credentials" : path, ini ? "" : " (not found)"));
    }
    o.credentials.source = absl::StrCat("profile ", profile, " of ", path);
  }

  o.region = get("AWS_REGION");
  if (o.region.empty()) o.region = get("AWS_DEFAULT_REGION");
  if (o.region.empty()) o.region = from_config("region");
  if (o.region.empty()) o.region = "us-east-1";
  for (char c : o.region) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_')) {
      return absl::InvalidArgumentError(absl::StrCat("region `", o.region, "`: expected letters, digits and '-'"));
    }
  }

  o.endpoint = get("AWS_ENDPOINT_URL_S3");
  if (o.endpoint.empty()) o.endpoint = get("AWS_ENDPOINT_URL");
  if (o.endpoint.empty()) o.endpoint = from_config("endpoint_url");
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  if (!o.endpoint.empty() && !absl::StartsWith(o.endpoint, "http://") && !absl::StartsWith(o.endpoint, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint `", o.endpoint, "`: expected http://host[:port] or https://host[:port]"));
  }
  if (absl::StrContains(o.endpoint, "@")) {
    return absl::InvalidArgumentError("the endpoint URL may not carry user information (credentials go elsewhere)");
  }

  o.ca_file = get("AWS_CA_BUNDLE");
  if (o.ca_file.empty()) o.ca_file = from_config("ca_bundle");

  // Path-style for any endpoint but AWS's own.
  o.addressing = o.endpoint.empty() || absl::StrContains(o.endpoint, ".amazonaws.com") ? Addressing::kVirtualHosted
                                                                                       : Addressing::kPath;
  std::string style = get("CKPTD_S3_ADDRESSING");
  if (style.empty()) style = from_config("s3.addressing_style");
  if (style == "path") {
    o.addressing = Addressing::kPath;
  } else if (style == "virtual") {
    o.addressing = Addressing::kVirtualHosted;
  } else if (!style.empty() && style != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("CKPTD_S3_ADDRESSING=", style, ": expected path, virtual or auto"));
  }

  if (std::string v = get("CKPTD_S3_MAX_CONNECTIONS"); !v.empty()) {
    CKPTD_ASSIGN_OR_RETURN(o.max_connections, ParseCount("CKPTD_S3_MAX_CONNECTIONS", v, 1, 256));
  }
  if (std::string v = get("CKPTD_S3_MAX_ATTEMPTS"); !v.empty()) {
    CKPTD_ASSIGN_OR_RETURN(o.max_attempts, ParseCount("CKPTD_S3_MAX_ATTEMPTS", v, 1, 20));
  }
  if (std::string v = get("CKPTD_S3_PART_BYTES"); !v.empty()) {
    CKPTD_ASSIGN_OR_RETURN(o.part_bytes, ParseByteCount("CKPTD_S3_PART_BYTES", v));
    if (o.part_bytes < (uint64_t{5} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CKPTD_S3_PART_BYTES=", v, ": S3 parts are at least 5MiB (5242880 bytes)"));
    }
  }
  return o;
}

}  // namespace ckptd::objstore
