// What the C handles hold, and the thread-local last error (verifyd_dataplane.h).
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "client/c_api/verifyd_dataplane.h"
#include "client/captured_step.h"
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

struct vd_capture {
  std::unique_ptr<verifyd::CapturedStep> step;
  // CUDA (vd_capture_enable_device): the step area registered with cudaHostRegister and its
  // device address, the device step counter and fault word, the WaitDone bound.
  bool device = false;
  void* area_device = nullptr;
  void* state = nullptr;
  uint64_t done_timeout_ns = 0;
};

namespace verifyd::c_api {

// What vd_capture_enable_device made (cuda_calls.cc; nothing without CUDA).
void ReleaseCaptureDevice(vd_capture* capture);

// Records `status` as the thread's last error and returns -(its code); OK returns 0.
int Fail(const absl::Status& status);
// Fail(INVALID_ARGUMENT) naming a NULL argument of `function`.
int NullArgument(const char* function, const char* argument);
// Copies a completion into the C struct (message cut to VD_MESSAGE_BYTES - 1).
void ToC(const Channel::Completion& from, vd_completion* to);

}  // namespace verifyd::c_api
