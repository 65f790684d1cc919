// BENCH_CUDA: the benchmarks' check of a CUDA runtime call. A benchmark has nothing to recover, so
// a failed call prints file:line, the call and CUDA's message, and ends the program (the product's
// code returns an absl::Status instead: base/cuda_check.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define BENCH_CUDA(expr)                                                        \
  do {                                                                          \
    cudaError_t err_ = (expr);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                                   \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)
