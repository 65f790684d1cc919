#include "service/call_gate.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace verifyd {
namespace {

// Equal-time comparison: the token must not leak through response timing.
bool TokenEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--admin-token-file = '", path, "' is not a readable file"));
  }
  if ((st.st_mode & S_IROTH) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--admin-token-file = '", path, "' is readable by every user (mode ",
                     absl::StrFormat("%04o", st.st_mode & 0777), "); make it 0400 or 0440"));
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--admin-token-file = '", path, "' could not be read"));
  }
  std::string token(absl::StripTrailingAsciiWhitespace(text.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--admin-token-file = '", path, "' is empty"));
  }
  return token;
}

absl::Status CallGate::CheckGated(const char* method,
                                  const grpc::ServerContextBase& context) const {
  const std::string peer = context.peer();
  if (is_owner_ ? is_owner_(peer) : peer.starts_with("unix:")) return absl::OkStatus();
  if (admin_token_.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(method,
                     " over TCP needs --admin-token-file on the daemon; use the Unix "
                     "socket instead"));
  }
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAdminTokenMetadata);
  if (it == metadata.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, " over TCP needs metadata \"", kAdminTokenMetadata, "\""));
  }
  if (!TokenEquals(std::string_view(it->second.data(), it->second.size()), admin_token_)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "metadata \"", kAdminTokenMetadata, "\" does not match the daemon's --admin-token-file"));
  }
  return absl::OkStatus();
}

}  // namespace verifyd
