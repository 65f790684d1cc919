// The CUDA entry points (built when the project is built with CUDA): IPC registration of device
// memory and the stream-order helpers, through base/cuda_driver.h (driver entry points resolved by
// the runtime: no libcuda link, so the library loads on a host without a driver and answers with
// an error there).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/cuda_driver.h"
#include "client/c_api/capture_kernels.h"
#include "client/c_api/handles.h"

using verifyd::c_api::Fail;
using verifyd::c_api::NullArgument;

// A CUresult as a Status (INTERNAL naming the call and the driver's error name).
#define CU_STATUS(expr) ::verifyd::CuResultToStatus((expr), #expr, __FILE__, __LINE__)

namespace {

absl::Status Runtime(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // not sticky: keep later calls truthful
  return absl::FailedPreconditionError(
      absl::StrCat(what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

absl::StatusOr<const verifyd::CudaDriverApi*> Driver() { return verifyd::GetCudaDriverApi(); }

// The kernels' arguments of an enabled capture; FAILED_PRECONDITION before
// vd_capture_enable_device.
absl::StatusOr<verifyd::c_api::CaptureKernelArgs> KernelArgs(const vd_capture* c) {
  if (!c->device) {
    return absl::FailedPreconditionError(
        "the capture's device side is not enabled; call vd_capture_enable_device first");
  }
  const verifyd::CapturedStep::Targets& t = c->step->targets();
  verifyd::c_api::CaptureKernelArgs a;
  a.area = static_cast<uint8_t*>(c->area_device);
  a.state = static_cast<verifyd::c_api::CaptureDeviceState*>(c->state);
  a.epoch = c->step->epoch();
  a.num_layers = c->step->num_layers();
  a.ready = t.ready;
  a.done = t.done;
  a.out = t.out;
  a.out_elements = t.out_elements;
  a.lse = t.lse;
  a.lse_elements = t.lse_elements;
  a.done_timeout_ns = c->done_timeout_ns;
  return a;
}

absl::Status LayerIndex(const vd_capture* c, uint32_t i) {
  if (i < c->step->num_layers()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("layer_index = ", i, " must be < num_layers = ", c->step->num_layers()));
}

}  // namespace

namespace verifyd::c_api {

void ReleaseCaptureDevice(vd_capture* capture) {
  if (capture->state != nullptr) (void)cudaFree(capture->state);
  if (capture->area_device != nullptr) (void)cudaHostUnregister(capture->step->area().data());
  capture->state = nullptr;
  capture->area_device = nullptr;
  capture->device = false;
}

}  // namespace verifyd::c_api

extern "C" {

int vd_has_cuda(void) { return 1; }

int vd_register_cuda(vd_client* client, uint64_t device_pointer, uint64_t bytes, uint64_t* region,
                     uint64_t* region_base) {
  if (client == nullptr) return NullArgument("vd_register_cuda", "client");
  if (region == nullptr) return NullArgument("vd_register_cuda", "region");
  if (region_base == nullptr) return NullArgument("vd_register_cuda", "region_base");
  if (bytes == 0) return Fail(absl::InvalidArgumentError("bytes = 0 must be > 0"));
  void* pointer = reinterpret_cast<void*>(device_pointer);
  cudaPointerAttributes attributes{};
  if (absl::Status s =
          Runtime(cudaPointerGetAttributes(&attributes, pointer), "cudaPointerGetAttributes");
      !s.ok()) {
    return Fail(s);
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "device_pointer = 0x", absl::Hex(device_pointer), " is not device memory (cuda ",
        "memory type ", static_cast<int>(attributes.type), "); register a CUDA allocation")));
  }
  absl::StatusOr<const verifyd::CudaDriverApi*> driver = Driver();
  if (!driver.ok()) return Fail(driver.status());
  CUdeviceptr base = 0;
  size_t size = 0;
  if (absl::Status s = CU_STATUS(
          (*driver)->mem_get_address_range(&base, &size, static_cast<CUdeviceptr>(device_pointer)));
      !s.ok()) {
    return Fail(s);
  }
  const uint64_t end = device_pointer + bytes;
  if (end < device_pointer || end > base + size) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("device_pointer = 0x", absl::Hex(device_pointer), " + bytes = ", bytes,
                     " must be inside its allocation [0x", absl::Hex(base), ", +", size, ")")));
  }
  cudaIpcMemHandle_t handle;
  if (absl::Status s = Runtime(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)),
                               "cudaIpcGetMemHandle");
      !s.ok()) {
    return Fail(s);
  }
  auto registered = client->client->RegisterExternalMemory(
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)), end - base,
      static_cast<uint32_t>(attributes.device));
  if (!registered.ok()) return Fail(registered.status());
  *region = registered->region();
  *region_base = base;
  return 0;
}

int vd_stream_write_value32(void* stream, uint64_t device_pointer, uint32_t value) {
  if (device_pointer % 4 != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "device_pointer = 0x", absl::Hex(device_pointer), " must be a multiple of 4")));
  }
  absl::StatusOr<const verifyd::CudaDriverApi*> driver = Driver();
  if (!driver.ok()) return Fail(driver.status());
  return Fail(CU_STATUS((*driver)->stream_write_value32(static_cast<CUstream>(stream),
                                                        static_cast<CUdeviceptr>(device_pointer),
                                                        value, CU_STREAM_WRITE_VALUE_DEFAULT)));
}

int vd_stream_wait_value32(void* stream, uint64_t device_pointer, uint32_t value) {
  if (device_pointer % 4 != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "device_pointer = 0x", absl::Hex(device_pointer), " must be a multiple of 4")));
  }
  absl::StatusOr<const verifyd::CudaDriverApi*> driver = Driver();
  if (!driver.ok()) return Fail(driver.status());
  return Fail(CU_STATUS((*driver)->stream_wait_value32(static_cast<CUstream>(stream),
                                                       static_cast<CUdeviceptr>(device_pointer),
                                                       value, CU_STREAM_WAIT_VALUE_GEQ)));
}

int vd_capture_enable_device(vd_capture* capture, double done_timeout_seconds) {
  if (capture == nullptr) return NullArgument("vd_capture_enable_device", "capture");
  if (capture->device) return 0;
  const verifyd::CapturedStep::Targets& t = capture->step->targets();
  if (t.ready == nullptr || t.done == nullptr || t.out == nullptr) {
    return Fail(absl::InvalidArgumentError(
        "ready_pointer, done_pointer and out_pointer must be the device addresses of the "
        "capture's flags and out"));
  }
  // The kernels write the record straight into the daemon's host memory (mapped, portable: any
  // device of this process may run the graph's nodes).
  void* host = capture->step->area().data();
  if (absl::Status s = Runtime(cudaHostRegister(host, capture->step->area().bytes(),
                                                cudaHostRegisterMapped | cudaHostRegisterPortable),
                               "cudaHostRegister of the step area");
      !s.ok()) {
    return Fail(s);
  }
  capture->area_device = host;  // registered: ReleaseCaptureDevice unregisters it
  void* device_area = nullptr;
  if (absl::Status s = Runtime(cudaHostGetDevicePointer(&device_area, host, 0),
                               "cudaHostGetDevicePointer of the step area");
      !s.ok()) {
    verifyd::c_api::ReleaseCaptureDevice(capture);
    return Fail(s);
  }
  capture->area_device = device_area;
  void* state = nullptr;
  absl::Status s = Runtime(cudaMalloc(&state, sizeof(verifyd::c_api::CaptureDeviceState)),
                           "cudaMalloc of the capture's state");
  if (s.ok()) {
    capture->state = state;
    s = Runtime(cudaMemset(state, 0, sizeof(verifyd::c_api::CaptureDeviceState)),
                "cudaMemset of the capture's state");
  }
  if (!s.ok()) {
    verifyd::c_api::ReleaseCaptureDevice(capture);
    return Fail(s);
  }
  const double seconds =
      std::isfinite(done_timeout_seconds) && done_timeout_seconds > 0 ? done_timeout_seconds : 10;
  capture->done_timeout_ns = static_cast<uint64_t>(seconds * 1e9);
  capture->device = true;
  return 0;
}

int vd_capture_step_publish(vd_capture* capture, void* stream, const vd_step_tensors* tensors) {
  if (capture == nullptr) return NullArgument("vd_capture_step_publish", "capture");
  if (tensors == nullptr) return NullArgument("vd_capture_step_publish", "tensors");
  absl::StatusOr<verifyd::c_api::CaptureKernelArgs> args = KernelArgs(capture);
  if (!args.ok()) return Fail(args.status());
  if (tensors->num_seqs == 0 || tensors->sequence_ids == 0 || tensors->q_lens == 0 ||
      tensors->parents == 0 || tensors->commit_lens == 0 || tensors->paths == 0) {
    return Fail(absl::InvalidArgumentError("every vd_step_tensors pointer must be set"));
  }
  verifyd::c_api::StepTensorPointers p;
  p.num_seqs = reinterpret_cast<const int32_t*>(tensors->num_seqs);
  p.sequence_ids = reinterpret_cast<const int64_t*>(tensors->sequence_ids);
  p.q_lens = reinterpret_cast<const int32_t*>(tensors->q_lens);
  p.parents = reinterpret_cast<const int32_t*>(tensors->parents);
  p.commit_lens = reinterpret_cast<const int32_t*>(tensors->commit_lens);
  p.paths = reinterpret_cast<const int32_t*>(tensors->paths);
  const auto& h = capture->step->area().header();
  return Fail(Runtime(verifyd::c_api::LaunchStepPublish(static_cast<cudaStream_t>(stream), *args,
                                                        h.max_batch, h.max_q, h.entry_bytes, p),
                      "StepPublish"));
}

int vd_capture_signal_ready(vd_capture* capture, void* stream, uint32_t layer_index) {
  if (capture == nullptr) return NullArgument("vd_capture_signal_ready", "capture");
  if (absl::Status s = LayerIndex(capture, layer_index); !s.ok()) return Fail(s);
  absl::StatusOr<verifyd::c_api::CaptureKernelArgs> args = KernelArgs(capture);
  if (!args.ok()) return Fail(args.status());
  return Fail(Runtime(
      verifyd::c_api::LaunchSignalReady(static_cast<cudaStream_t>(stream), *args, layer_index),
      "SignalReady"));
}

int vd_capture_wait_done(vd_capture* capture, void* stream, uint32_t layer_index) {
  if (capture == nullptr) return NullArgument("vd_capture_wait_done", "capture");
  if (absl::Status s = LayerIndex(capture, layer_index); !s.ok()) return Fail(s);
  absl::StatusOr<verifyd::c_api::CaptureKernelArgs> args = KernelArgs(capture);
  if (!args.ok()) return Fail(args.status());
  return Fail(
      Runtime(verifyd::c_api::LaunchWaitDone(static_cast<cudaStream_t>(stream), *args, layer_index),
              "WaitDone"));
}

int vd_capture_error(vd_capture* capture, void* stream, uint32_t* error) {
  if (capture == nullptr) return NullArgument("vd_capture_error", "capture");
  if (error == nullptr) return NullArgument("vd_capture_error", "error");
  if (!capture->device) {
    *error = capture->step->error();
    return 0;
  }
  verifyd::c_api::CaptureDeviceState state{};
  const auto s = static_cast<cudaStream_t>(stream);
  absl::Status status =
      Runtime(cudaMemcpyAsync(&state, capture->state, sizeof(state), cudaMemcpyDeviceToHost, s),
              "reading the capture's fault word");
  if (status.ok()) status = Runtime(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  if (!status.ok()) return Fail(status);
  *error = state.error;
  return 0;
}

}  // extern "C"
