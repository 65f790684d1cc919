// A second process for the data plane's GPU tests: it plays the scheduler. It owns one device
// allocation, exports it as a CUDA IPC handle, and on command enqueues a whole decode step on its
// own stream without blocking per layer: per layer a delay kernel (its "model" work), the copies of
// q and tree KV into its buffers, the ready flag, a wait for the done flag, the copy of out + lse
// back. The test process (the daemon side) opens the handle and serves the step.
//
// Protocol, one line each way (stdin / stdout):
//   started with <bytes>        -> "handle <128 hex digits>"
//   step <in> <out> <delay_us> <n>, then n lines "<q_off> <q_bytes> <kv_off> <kv_bytes>
//        <out_off> <out_bytes> <ready_off> <done_off> <value>"
//                               -> "ok" once the step finished (or "error <why>")
//   <in> holds each layer's q bytes then its tree-KV bytes, in order; <out> gets each layer's
//   out_bytes, in order.
//   quit
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "base/cuda_driver.h"

namespace {

__global__ void SpinKernel(uint64_t nanoseconds) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::cout << "error " << what << ": " << cudaGetErrorName(err) << std::endl;
  return false;
}
bool CheckCu(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return true;
  std::cout << "error " << what << ": CUresult " << static_cast<int>(result) << std::endl;
  return false;
}

struct Layer {
  size_t q_off, q_bytes, kv_off, kv_bytes, out_off, out_bytes, ready_off, done_off;
  uint32_t value;
};

bool RunStep(uint8_t* base, cudaStream_t stream, const verifyd::CudaDriverApi& driver,
             const std::string& in_path, const std::string& out_path, uint64_t delay_us,
             const std::vector<Layer>& layers) {
  size_t in_bytes = 0, out_bytes = 0;
  for (const Layer& l : layers) {
    in_bytes += l.q_bytes + l.kv_bytes;
    out_bytes += l.out_bytes;
  }
  uint8_t *in_host = nullptr, *out_host = nullptr;
  if (!Check(cudaMallocHost(&in_host, in_bytes + 1), "cudaMallocHost") ||
      !Check(cudaMallocHost(&out_host, out_bytes + 1), "cudaMallocHost")) {
    return false;
  }
  std::ifstream in(in_path, std::ios::binary);
  in.read(reinterpret_cast<char*>(in_host), static_cast<std::streamsize>(in_bytes));
  if (!in) {
    std::cout << "error reading " << in_path << std::endl;
    return false;
  }
  // The whole step is enqueued before anything of it runs: the CPU runs ahead.
  size_t in_at = 0, out_at = 0;
  for (const Layer& l : layers) {
    SpinKernel<<<1, 1, 0, stream>>>(delay_us * 1000);
    if (!Check(cudaGetLastError(), "SpinKernel") ||
        !Check(cudaMemcpyAsync(base + l.q_off, in_host + in_at, l.q_bytes, cudaMemcpyHostToDevice,
                               stream),
               "q copy") ||
        !Check(cudaMemcpyAsync(base + l.kv_off, in_host + in_at + l.q_bytes, l.kv_bytes,
                               cudaMemcpyHostToDevice, stream),
               "tree kv copy") ||
        !CheckCu(
            driver.stream_write_value32(stream, reinterpret_cast<CUdeviceptr>(base + l.ready_off),
                                        l.value, CU_STREAM_WRITE_VALUE_DEFAULT),
            "cuStreamWriteValue32") ||
        !CheckCu(
            driver.stream_wait_value32(stream, reinterpret_cast<CUdeviceptr>(base + l.done_off),
                                       l.value, CU_STREAM_WAIT_VALUE_GEQ),
            "cuStreamWaitValue32") ||
        !Check(cudaMemcpyAsync(out_host + out_at, base + l.out_off, l.out_bytes,
                               cudaMemcpyDeviceToHost, stream),
               "out copy")) {
      return false;
    }
    in_at += l.q_bytes + l.kv_bytes;
    out_at += l.out_bytes;
  }
  if (!Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) return false;
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(out_host), static_cast<std::streamsize>(out_bytes));
  cudaFreeHost(in_host);
  cudaFreeHost(out_host);
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " <bytes>\n";
    return 2;
  }
  const size_t bytes = std::stoull(argv[1]);
  absl::StatusOr<const verifyd::CudaDriverApi*> driver = verifyd::GetCudaDriverApi();
  if (!driver.ok()) {
    std::cout << "error " << driver.status().message() << std::endl;
    return 1;
  }
  void* base = nullptr;
  cudaStream_t stream = nullptr;
  cudaIpcMemHandle_t handle;
  // 0xFF everywhere: a read before the producer's copies sees NaN, never plausible zeros.
  if (!Check(cudaMalloc(&base, bytes), "cudaMalloc") ||
      !Check(cudaMemset(base, 0xFF, bytes), "cudaMemset") ||
      !Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize") ||
      !Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !Check(cudaIpcGetMemHandle(&handle, base), "cudaIpcGetMemHandle")) {
    return 1;
  }
  std::string hex;
  const auto* raw = reinterpret_cast<const unsigned char*>(&handle);
  for (size_t i = 0; i < sizeof(handle); ++i) {
    char digits[3];
    std::snprintf(digits, sizeof(digits), "%02x", raw[i]);
    hex += digits;
  }
  std::cout << "handle " << hex << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::string verb;
    words >> verb;
    if (verb == "quit") break;
    if (verb != "step") {
      std::cout << "error unknown command " << verb << std::endl;
      continue;
    }
    std::string in_path, out_path;
    uint64_t delay_us = 0;
    int n = 0;
    words >> in_path >> out_path >> delay_us >> n;
    std::vector<Layer> layers(n);
    for (Layer& l : layers) {
      std::getline(std::cin, line);
      std::istringstream f(line);
      f >> l.q_off >> l.q_bytes >> l.kv_off >> l.kv_bytes >> l.out_off >> l.out_bytes >>
          l.ready_off >> l.done_off >> l.value;
    }
    if (RunStep(static_cast<uint8_t*>(base), stream, **driver, in_path, out_path, delay_us,
                layers)) {
      std::cout << "ok" << std::endl;
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(base);
  return 0;
}
