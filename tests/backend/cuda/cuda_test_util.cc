#include "tests/backend/cuda/cuda_test_util.h"

#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "base/status_macros.h"
#include "tests/testing/problem_builder.h"

namespace verifyd::test {

SharedMapping::SharedMapping(size_t bytes) : bytes_(bytes) {
  const int fd = memfd_create("verifyd-test-region", 0);
  if (fd < 0) return;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data != MAP_FAILED) data_ = static_cast<uint8_t*>(data);
  }
  close(fd);
}

SharedMapping::~SharedMapping() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

bool HaveCudaDevice() {
  int count = 0;
  const bool have = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return have;
}

absl::StatusOr<BackendWithStorage> MakeBackend(bool cuda_graphs, int num_layers,
                                               int64_t capacity_slots) {
  CudaBackendOptions options;
  options.cuda_graphs = cuda_graphs;
  return MakeBackend(options, num_layers, capacity_slots);
}

absl::StatusOr<BackendWithStorage> MakeBackend(const CudaBackendOptions& options, int num_layers,
                                               int64_t capacity_slots, KvDtype dtype) {
  BackendWithStorage made;
  VERIFYD_ASSIGN_OR_RETURN(made.backend, CudaBackend::Create(options));
  VERIFYD_ASSIGN_OR_RETURN(made.storage,
                           made.backend->CreateStorage(num_layers, capacity_slots, dtype));
  return made;
}

ReferenceF64 ComputeReferenceF64(const VerifyProblem& reference) {
  ReferenceF64 r;
  ComputeVerifyF64(reference, &r.out, &r.lse);
  return r;
}

Accuracy Compare(const ReferenceF64& reference, const std::vector<bf16_bits>& out,
                 const std::vector<float>& lse) {
  Accuracy a;
  a.out = RelativeError(out, reference.out);
  a.lse = RelativeError(lse, reference.lse);
  return a;
}

Accuracy CompareToF64(const VerifyProblem& reference, const std::vector<bf16_bits>& out,
                      const std::vector<float>& lse) {
  return Compare(ComputeReferenceF64(reference), out, lse);
}

std::vector<int32_t> Iota(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

void ExpectSamePools(const HostKvStorage& host, const CudaKvStorage& cuda) {
  ASSERT_EQ(host.row_bytes(), cuda.row_bytes());
  const size_t row_bytes = static_cast<size_t>(host.row_bytes());
  const std::vector<int32_t> all = Iota(host.capacity_slots());
  std::vector<uint8_t> got(all.size() * row_bytes);
  for (int layer = 0; layer < host.num_layers(); ++layer) {
    ASSERT_TRUE(cuda.ReadEncodedRows(layer, all, got.data()).ok());
    const uint8_t* want = host.layer_bytes(layer);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "layer " << layer << " slot " << i / row_bytes << " byte "
                                 << i % row_bytes;
    }
  }
}

std::vector<int32_t> DistinctSlots(std::mt19937_64& rng, int64_t capacity, int k) {
  std::vector<int32_t> all = Iota(capacity);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(k);
  return all;
}

std::vector<SequenceSpec> RandomSpecs(std::mt19937_64& rng, int batch, int max_prefix,
                                      int max_nodes) {
  std::vector<SequenceSpec> specs;
  for (int b = 0; b < batch; ++b) {
    specs.push_back({static_cast<int>(rng() % (max_prefix + 1)),
                     1 + static_cast<int>(rng() % max_nodes), static_cast<TreeShape>(rng() % 4)});
  }
  return specs;
}

std::vector<bf16_bits> RandomValues(std::mt19937_64& rng, size_t count, float amplitude) {
  std::uniform_real_distribution<float> u(-amplitude, amplitude);
  std::vector<bf16_bits> v(count);
  for (bf16_bits& x : v) x = FloatToBf16(u(rng));
  return v;
}

std::vector<int32_t> RandomPath(const std::vector<int32_t>& parents, std::mt19937_64& rng) {
  std::vector<int32_t> path;
  for (int32_t node = static_cast<int32_t>(rng() % parents.size()); node >= 0;
       node = parents[node]) {
    path.push_back(node);
  }
  std::reverse(path.begin(), path.end());
  path.resize(rng() % (path.size() + 1));
  return path;
}

}  // namespace verifyd::test
