// The thread-local last error and the version entry points.
#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/c_api/handles.h"

namespace verifyd::c_api {
namespace {

struct LastError {
  int code = 0;
  std::string message;
};
thread_local LastError last_error;

}  // namespace

int Fail(const absl::Status& status) {
  if (status.ok()) return 0;
  last_error.code = static_cast<int>(status.code());
  last_error.message = std::string(status.message());
  return -last_error.code;
}

int NullArgument(const char* function, const char* argument) {
  return Fail(absl::InvalidArgumentError(absl::StrCat(function, ": ", argument, " is NULL")));
}

void ToC(const Channel::Completion& from, vd_completion* to) {
  std::memset(to, 0, sizeof(*to));
  to->id = from.id;
  to->committed_length = from.committed_length;
  to->code = static_cast<int32_t>(from.status.code());
  const absl::string_view message = from.status.message();
  const size_t n = std::min<size_t>(message.size(), VD_MESSAGE_BYTES - 1);
  std::memcpy(to->message, message.data(), n);
}

}  // namespace verifyd::c_api

extern "C" {

int vd_abi_version(void) { return VD_ABI_VERSION; }

int vd_last_error_code(void) { return verifyd::c_api::last_error.code; }

const char* vd_last_error(void) { return verifyd::c_api::last_error.message.c_str(); }

}  // extern "C"
