#include "bench/bench_util.h"

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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
