#include "bench/bench_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckptd::bench {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  if (own_) std::filesystem::remove_all(path_, ec);
}

absl::Status ScratchDir::Init(const std::optional<std::string>& dir, const std::string& tag) {
  if (dir) {
    path_ = *dir;
    return absl::OkStatus();
  }
  std::string tmpl = absl::StrCat("/tmp/", tag, "-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("cannot create a temporary folder under /tmp");
  path_ = tmpl;
  own_ = true;
  return absl::OkStatus();
}

std::optional<std::string> Capture(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) return std::nullopt;
  return out;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  const std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

absl::StatusOr<double> RunS3Yardstick(const std::string& op, const std::string& url, const std::string& file) {
  const std::string script = absl::StrCat(SelfDir(), "/s3_transfer.py");
  if (::access(script.c_str(), R_OK) != 0) return absl::NotFoundError(absl::StrCat(script, " is missing"));
  // Its one line of JSON on success; its message (stderr) and a marker when it fails.
  constexpr char kFailed[] = "s3-yardstick-failed";
  const std::optional<std::string> out =
      Capture(absl::StrCat("python3 ", ShellQuote(script), " ", op, " --url ", ShellQuote(url), " --file ",
                           ShellQuote(file), " 2>&1 || echo ", kFailed));
  if (!out) return absl::UnavailableError("the S3 yardstick did not run (no shell?)");
  if (absl::StrContains(*out, kFailed)) {
    return absl::UnavailableError(absl::StrCat("the S3 yardstick failed: ", absl::StripAsciiWhitespace(
                                                                              out->substr(0, out->rfind(kFailed)))));
  }
  const size_t at = out->find("\"gbps\": ");
  double gbps = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtod(out->substr(at + 8, out->find_first_of(",}", at) - at - 8), &gbps)) {
    return absl::InternalError(absl::StrCat("the S3 yardstick printed no speed: ", *out));
  }
  return gbps;
}

std::optional<double> JsonNumberAfter(const std::string& json, const std::string& section, const std::string& key) {
  size_t pos = json.find("\"" + section + "\" : {");
  if (pos == std::string::npos) return std::nullopt;
  pos = json.find("\"" + key + "\"", pos);
  if (pos == std::string::npos) return std::nullopt;
  pos = json.find(':', pos);
  if (pos == std::string::npos) return std::nullopt;
  size_t end = pos + 1;
  while (end < json.size() && (json[end] == ' ' || json[end] == '\t')) ++end;
  const size_t start = end;
  while (end < json.size() && (isdigit(static_cast<unsigned char>(json[end])) || json[end] == '.' || json[end] == 'e' ||
                               json[end] == '-' || json[end] == '+')) {
    ++end;
  }
  double v = 0;
  if (!absl::SimpleAtod(json.substr(start, end - start), &v)) return std::nullopt;
  return v;
}

}  // namespace ckptd::bench
