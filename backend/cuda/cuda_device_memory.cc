#include "backend/cuda/cuda_device_memory.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"

namespace verifyd {

absl::StatusOr<std::shared_ptr<CudaStream>> CudaStream::Create(int device) {
  VERIFYD_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::shared_ptr<CudaStream>(new CudaStream(device, stream));
}

CudaStream::~CudaStream() {
  if (stream_ == nullptr) return;
  // Destructors cannot report; the stream is drained so no queued copy outlives its buffers.
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

absl::Status CudaStream::MakeDeviceCurrent() const {
  VERIFYD_CUDA_CHECK(cudaSetDevice(device_));
  return absl::OkStatus();
}

absl::Status CudaStream::Synchronize() const {
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

absl::Status DeviceBuffer::AllocateExact(size_t bytes, const char* what) {
  if (ptr_ != nullptr) {
    VERIFYD_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    capacity_ = 0;
  }
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // else a later launch check would report this refusal as its own error
    ptr_ = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", bytes, " bytes of device memory, which cudaMalloc refused"));
  }
  VERIFYD_CUDA_CHECK(err);
  capacity_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<bool> DeviceBuffer::Reserve(size_t bytes, const CudaStream& stream) {
  if (bytes <= capacity_) return false;
  const size_t grown = std::max(bytes, 2 * capacity_);
  VERIFYD_RETURN_IF_ERROR(stream.Synchronize());
  void* fresh = nullptr;
  VERIFYD_CUDA_CHECK(cudaMalloc(&fresh, grown));
  // Defined bytes from the start: copies move whole size bands (CopyBytesFor) and alignment gaps
  // that no kernel writes; they never reach an answer, but compute-sanitizer's initcheck (kept in
  // the device runbook) would report them. Only on growth, so the cost is one memset per doubling.
  VERIFYD_CUDA_CHECK(cudaMemsetAsync(fresh, 0, grown, stream.get()));
  if (ptr_ != nullptr) VERIFYD_CUDA_CHECK(cudaFree(ptr_));
  ptr_ = fresh;
  capacity_ = grown;
  return true;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

absl::StatusOr<bool> PinnedBuffer::Reserve(size_t bytes, const CudaStream& stream) {
  if (bytes <= capacity_) return false;
  if (device_ptr_ != nullptr) return absl::FailedPreconditionError("a mapped buffer never grows");
  const size_t grown = std::max(bytes, 2 * capacity_);
  VERIFYD_RETURN_IF_ERROR(stream.Synchronize());
  void* fresh = nullptr;
  VERIFYD_CUDA_CHECK(cudaMallocHost(&fresh, grown));
  if (ptr_ != nullptr) VERIFYD_CUDA_CHECK(cudaFreeHost(ptr_));
  ptr_ = fresh;
  capacity_ = grown;
  return true;
}

absl::Status PinnedBuffer::ReserveKeeping(size_t bytes, size_t keep_bytes) {
  if (bytes <= capacity_) return absl::OkStatus();
  if (device_ptr_ != nullptr) return absl::FailedPreconditionError("a mapped buffer never grows");
  const size_t grown = std::max(bytes, 2 * capacity_);
  void* fresh = nullptr;
  VERIFYD_CUDA_CHECK(cudaMallocHost(&fresh, grown));
  if (ptr_ != nullptr) {
    std::memcpy(fresh, ptr_, std::min(keep_bytes, capacity_));
    VERIFYD_CUDA_CHECK(cudaFreeHost(ptr_));
  }
  ptr_ = fresh;
  capacity_ = grown;
  return absl::OkStatus();
}

absl::Status PinnedBuffer::AllocateMapped(size_t bytes) {
  if (ptr_ != nullptr || bytes == 0) {
    return absl::FailedPreconditionError(
        "AllocateMapped: once, on an empty buffer, a non-zero size");
  }
  VERIFYD_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocMapped));
  capacity_ = bytes;
  // Owned from here: a failure below leaves it to the destructor.
  VERIFYD_CUDA_CHECK(cudaHostGetDevicePointer(&device_ptr_, ptr_, 0));
  return absl::OkStatus();
}

}  // namespace verifyd
