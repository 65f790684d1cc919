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

extern "C" {

int vd_has_cuda(void) { return 0; }

int vd_register_cuda(vd_client*, uint64_t, uint64_t, uint64_t*, uint64_t*) {
  return NoCuda("vd_register_cuda");
}

int vd_stream_write_value32(void*, uint64_t, uint32_t) { return NoCuda("vd_stream_write_value32"); }

int vd_stream_wait_value32(void*, uint64_t, uint32_t) { return NoCuda("vd_stream_wait_value32"); }

}  // extern "C"
