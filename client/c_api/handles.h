// What the C handles hold, and the thread-local last error (verifyd_dataplane.h).
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "client/c_api/verifyd_dataplane.h"
#include "client/channel.h"
#include "client/client.h"

struct vd_client {
  std::unique_ptr<verifyd::Client> client;
};

struct vd_channel {
  std::unique_ptr<verifyd::Channel> channel;
  // Completions read from the ring but not yet handed out (vd_poll_completions' capacity).
  std::deque<verifyd::Channel::Completion> pending;
};

namespace verifyd::c_api {

// Records `status` as the thread's last error and returns -(its code); OK returns 0.
int Fail(const absl::Status& status);
// Fail(INVALID_ARGUMENT) naming a NULL argument of `function`.
int NullArgument(const char* function, const char* argument);
// Copies a completion into the C struct (message cut to VD_MESSAGE_BYTES - 1).
void ToC(const Channel::Completion& from, vd_completion* to);

}  // namespace verifyd::c_api
