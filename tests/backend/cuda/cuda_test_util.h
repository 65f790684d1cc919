// Shared by the CUDA backend's GPU tests: device detection, a backend with its storage, and the
// accuracy check against the float64 oracle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kv_storage.h"
#include "gtest/gtest.h"
#include "kvstore/kv_storage.h"
#include "tests/testing/problem_builder.h"
#include "tests/testing/test_seed.h"
#include "verify/kv_dtype.h"
#include "verify/verify_problem.h"

namespace verifyd::test {

// True when a CUDA device is visible; GPU tests GTEST_SKIP() otherwise.
bool HaveCudaDevice();

// The fixture of the randomized GPU tests: skipped without a device, rng_ seeded with TestSeed()
// (tests put seed_ in a SCOPED_TRACE, so VERIFYD_TEST_SEED replays a failure).
class SeededCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
    seed_ = TestSeed();
    rng_.seed(seed_);
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

struct BackendWithStorage {
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<KvStorage> storage;  // a CudaKvStorage, created by the backend
  CudaKvStorage& cuda_storage() { return static_cast<CudaKvStorage&>(*storage); }
};
absl::StatusOr<BackendWithStorage> MakeBackend(bool cuda_graphs, int num_layers,
                                               int64_t capacity_slots);
absl::StatusOr<BackendWithStorage> MakeBackend(const CudaBackendOptions& options, int num_layers,
                                               int64_t capacity_slots,
                                               KvDtype dtype = KvDtype::kBf16);

// Relative errors of out and lse against the float64 oracle computed on `reference` (a problem
// over host KV with the same logical content).
struct Accuracy {
  double out = 0, lse = 0;
};
Accuracy CompareToF64(const VerifyProblem& reference, const std::vector<bf16_bits>& out,
                      const std::vector<float>& lse);

// The oracle's outputs, for comparing several runs of one problem to it.
struct ReferenceF64 {
  std::vector<double> out, lse;
};
ReferenceF64 ComputeReferenceF64(const VerifyProblem& reference);
Accuracy Compare(const ReferenceF64& reference, const std::vector<bf16_bits>& out,
                 const std::vector<float>& lse);

// A tmpfs-backed MAP_SHARED mapping (memfd), as the daemon's /dev/shm regions are: what
// CudaBackend::RegisterHostMemory registers in the daemon. data() is null when mapping failed.
class SharedMapping {
 public:
  explicit SharedMapping(size_t bytes);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  uint8_t* data_ = nullptr;
};

// Sequential 0..n-1.
std::vector<int32_t> Iota(int64_t n);

// Every byte of every layer of the two pools (either dtype: the rows as each pool holds them) is
// the same; the first difference is named by layer, slot and byte.
void ExpectSamePools(const HostKvStorage& host, const CudaKvStorage& cuda);

// k distinct slots of [0, capacity), in random order.
std::vector<int32_t> DistinctSlots(std::mt19937_64& rng, int64_t capacity, int k);

// `batch` sequences with prefixes in [0, max_prefix], trees of [1, max_nodes] nodes, any shape.
std::vector<SequenceSpec> RandomSpecs(std::mt19937_64& rng, int batch, int max_prefix,
                                      int max_nodes);

// count bf16 values uniform in [-amplitude, amplitude).
std::vector<bf16_bits> RandomValues(std::mt19937_64& rng, size_t count, float amplitude);

// A random accepted path of a tree: the ancestors of a random node, root first, cut to a random
// length (possibly empty: the whole tree rejected).
std::vector<int32_t> RandomPath(const std::vector<int32_t>& parents, std::mt19937_64& rng);

}  // namespace verifyd::test
