// The CUDA entry points of a library built without CUDA: each answers FAILED_PRECONDITION saying
// so (the cpu backend's registration, vd_register_file, needs none of them).
#include "client/c_api/handles.h"

using verifyd::c_api::Fail;

namespace {

int NoCuda(const char* function) {
  return Fail(
      absl::FailedPreconditionError(std::string(function) +
                                    ": libverifyd_dataplane was built without CUDA (configure with "
                                    "-DVERIFYD_CUDA=ON on a host with the CUDA toolkit)"));
}

}  // namespace

namespace verifyd::c_api {

void ReleaseCaptureDevice(vd_capture* capture) { (void)capture; }  // nothing was made

}  // namespace verifyd::c_api

extern "C" {

int vd_has_cuda(void) { return 0; }

int vd_register_cuda(vd_client*, uint64_t, uint64_t, uint64_t*, uint64_t*) {
  return NoCuda("vd_register_cuda");
}

int vd_stream_write_value32(void*, uint64_t, uint32_t) { return NoCuda("vd_stream_write_value32"); }

int vd_stream_wait_value32(void*, uint64_t, uint32_t) { return NoCuda("vd_stream_wait_value32"); }

int vd_capture_enable_device(vd_capture*, double) { return NoCuda("vd_capture_enable_device"); }

int vd_capture_step_publish(vd_capture*, void*, const vd_step_tensors*) {
  return NoCuda("vd_capture_step_publish");
}

int vd_capture_signal_ready(vd_capture*, void*, uint32_t) {
  return NoCuda("vd_capture_signal_ready");
}

int vd_capture_wait_done(vd_capture*, void*, uint32_t) { return NoCuda("vd_capture_wait_done"); }

// Without CUDA only the host versions run: their fault word.
int vd_capture_error(vd_capture* capture, void*, uint32_t* error) {
  if (capture == nullptr) return verifyd::c_api::NullArgument("vd_capture_error", "capture");
  if (error == nullptr) return verifyd::c_api::NullArgument("vd_capture_error", "error");
  *error = capture->step->error();
  return 0;
}

}  // extern "C"
