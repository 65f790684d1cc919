#include "service/message_size.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace verifyd {

int ReceiveCeiling(int64_t max_message_bytes) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  return static_cast<int>(std::min(kIntMax, std::max<int64_t>(max_message_bytes, 0) * 2));
}

absl::Status CheckRequestSize(const char* method, uint64_t request_bytes,
                              int64_t max_message_bytes) {
  if (request_bytes <= static_cast<uint64_t>(max_message_bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(method, ": the request has ", request_bytes,
                   " bytes, more than --max-message-bytes = ", max_message_bytes,
                   "; split it (the clients split Append themselves when their "
                   "max_message_bytes matches the daemon's)"));
}

}  // namespace verifyd
