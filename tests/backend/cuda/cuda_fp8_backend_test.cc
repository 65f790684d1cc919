// CudaBackend with an fp8 pool (--kv_dtype=fp8) end to end: rows written bf16 are quantized on the
// device exactly as the host quantizes them, and Verify over the pool matches the float64 oracle
// and the CPU reference on the dequantized KV (both read problem.kv_fp8: the rows as the host
// quantized them) within SPEC §1's 1e-2; graphs on and off, both flash kernels, prefix and tree
// rows alike, and the data plane's tree KV from device memory (ComputeVerifyExternal), which the
// device quantizes into the pool inside the call. GPU tests: they skip without a device, and
// they need the attention kernels' fp8 load (kernels/, issue 34).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/testing/problem_builder.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/verify_reference.h"

namespace verifyd {
namespace {

using test::HostProblem;
using test::MakeRandomProblem;
using test::RandomSpecs;

constexpr double kTolerance = 1e-2;
constexpr int kLayers = 2;

// The problem's pool as the host quantizes it, [num_slots][656].
std::vector<uint8_t> QuantizedPool(const HostProblem& host) {
  std::vector<uint8_t> pool(static_cast<size_t>(host.num_slots) * kFp8RowBytes);
  for (int64_t s = 0; s < host.num_slots; ++s) {
    QuantizeFp8Row(host.kv.data() + s * kKvDim, pool.data() + s * kFp8RowBytes);
  }
  return pool;
}

// The host problem over the quantized pool: what the references read.
VerifyProblem OverPool(HostProblem& host, const std::vector<uint8_t>& pool) {
  VerifyProblem p = host.problem();
  p.kv = nullptr;
  p.kv_fp8 = pool.data();
  return p;
}

// The CPU reference's out on the quantized pool (into a copy's buffers), as float64 values.
std::vector<double> CpuReferenceOut(HostProblem host, const std::vector<uint8_t>& pool) {
  EXPECT_TRUE(ComputeVerifyReference(OverPool(host, pool)).ok());
  std::vector<double> out(host.out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = Bf16ToFloat(host.out[i]);
  return out;
}

// The device pool's bytes of `layer` equal the host's quantization, every byte.
void ExpectPoolIsTheHostQuantization(const CudaKvStorage& storage, int layer,
                                     const std::vector<uint8_t>& want) {
  std::vector<uint8_t> got(want.size());
  ASSERT_TRUE(
      storage.ReadEncodedRows(layer, test::Iota(storage.capacity_slots()), got.data()).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "slot " << i / kFp8RowBytes << " byte " << i % kFp8RowBytes;
  }
}

using CudaFp8BackendTest = test::SeededCudaTest;

TEST_F(CudaFp8BackendTest, RandomBatchesMatchTheReferencesOnTheDequantizedKv) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  struct Case {
    int batch, max_prefix, max_nodes, heads;
  };
  const Case cases[] = {{1, 0, 16, 8},     {1, 3000, 257, 8}, {3, 2000, 64, 4},
                        {8, 1200, 16, 16}, {1, 8000, 9, 64},  {2, 2000, 1024, 1}};
  for (const Case& c : cases) {
    for (bool scattered : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "batch=" << c.batch << " heads=" << c.heads << " scattered=" << scattered);
      HostProblem host = MakeRandomProblem(RandomSpecs(rng_, c.batch, c.max_prefix, c.max_nodes),
                                           c.heads, rng_(), scattered, /*extra_slots=*/37);
      const std::vector<uint8_t> pool = QuantizedPool(host);
      const test::ReferenceF64 oracle = test::ComputeReferenceF64(OverPool(host, pool));
      const std::vector<double> cpu = CpuReferenceOut(host, pool);
      for (const FlashPath path : {FlashPath::kAuto, FlashPath::kPortable}) {
        for (bool graphs : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << "graphs=" << graphs << " portable=" << (path == FlashPath::kPortable));
          CudaBackendOptions options;
          options.cuda_graphs = graphs;
          options.flash_path = path;
          auto made = test::MakeBackend(options, kLayers, host.num_slots, KvDtype::kFp8);
          ASSERT_TRUE(made.ok()) << made.status();
          const int layer = static_cast<int>(rng_() % kLayers);
          // bf16 rows in, quantized on the device (prefix and tree rows alike).
          ASSERT_TRUE(
              made->storage->WriteRows(layer, test::Iota(host.num_slots), host.kv.data()).ok());
          ExpectPoolIsTheHostQuantization(made->cuda_storage(), layer, pool);
          // With graphs: warm-up, another bucket's warm-up, capture, pure replay.
          for (bool with_lse : {true, false, true, true}) {
            host.Poison();
            VerifyProblem p = host.problem();
            if (!with_lse) p.lse = nullptr;
            const absl::Status s = made->backend->ComputeVerify(layer, p);
            ASSERT_TRUE(s.ok()) << s;
            const test::Accuracy acc = test::Compare(oracle, host.out, host.lse);
            EXPECT_LE(acc.out, kTolerance);
            if (with_lse) EXPECT_LE(acc.lse, kTolerance);
            EXPECT_LE(test::RelativeError(host.out, cpu), kTolerance);
          }
          EXPECT_EQ(made->backend->graph_counters().fallbacks, 0);
        }
      }
    }
  }
}

// The data plane's call on an fp8 pool: q, tree KV, out and lse in device memory; the tree rows
// reach the pool quantized by the call itself (the pool's tree slots held other rows before).
TEST_F(CudaFp8BackendTest, ExternalTreeKvIsQuantizedIntoThePool) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "graphs=" << graphs);
    HostProblem host = MakeRandomProblem(RandomSpecs(rng_, 3, 1500, 100), 8, rng_(),
                                         /*scattered=*/true, /*extra_slots=*/37);
    const std::vector<uint8_t> pool = QuantizedPool(host);
    const test::ReferenceF64 oracle = test::ComputeReferenceF64(OverPool(host, pool));
    auto made = test::MakeBackend(CudaBackendOptions{.cuda_graphs = graphs}, kLayers,
                                  host.num_slots, KvDtype::kFp8);
    ASSERT_TRUE(made.ok()) << made.status();
    const int layer = 1;
    // The tree slots (batch order) and their rows; the pool gets other rows there first.
    std::vector<int32_t> tree_slots;
    std::vector<bf16_bits> tree_kv;
    for (int b = 0; b < host.batch(); ++b) {
      const int q = host.qo_indptr[b + 1] - host.qo_indptr[b];
      for (int i = 0; i < q; ++i) {
        const int32_t slot = host.slots[host.slot_indptr[b] + host.prefix_len[b] + i];
        tree_slots.push_back(slot);
        tree_kv.insert(tree_kv.end(), host.kv.begin() + int64_t{slot} * kKvDim,
                       host.kv.begin() + int64_t{slot + 1} * kKvDim);
      }
    }
    std::vector<bf16_bits> stale = host.kv;
    for (const int32_t slot : tree_slots) {
      for (int d = 0; d < kKvDim; ++d) stale[int64_t{slot} * kKvDim + d] ^= 0x0040;
    }
    ASSERT_TRUE(made->storage->WriteRows(layer, test::Iota(host.num_slots), stale.data()).ok());
    // The device tensors.
    const size_t q_bytes = host.q.size() * 2, kv_bytes = tree_kv.size() * 2,
                 out_bytes = host.out.size() * 2, lse_bytes = host.lse.size() * 4;
    void* q = nullptr;
    void* kv = nullptr;
    void* out = nullptr;
    void* lse = nullptr;
    ASSERT_EQ(cudaMalloc(&q, q_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&kv, kv_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, out_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&lse, lse_bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(q, host.q.data(), q_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(kv, tree_kv.data(), kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    for (int call_index = 0; call_index < 3; ++call_index) {  // graphs: warm-up, capture, replay
      ASSERT_EQ(cudaMemset(out, 0xFF, out_bytes), cudaSuccess);
      ASSERT_EQ(cudaMemset(lse, 0xFF, lse_bytes), cudaSuccess);
      ExternalVerify call;
      call.layer = layer;
      call.problem = host.problem();
      call.problem.q = static_cast<const bf16_bits*>(q);
      call.problem.out = static_cast<bf16_bits*>(out);
      call.problem.lse = static_cast<float*>(lse);
      call.tree_kv = static_cast<const bf16_bits*>(kv);
      call.tree_slots = tree_slots;
      const absl::Status s = made->backend->ComputeVerifyExternal(call, {});
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE(made->backend->stream().Synchronize().ok());
      ASSERT_EQ(cudaMemcpy(host.out.data(), out, out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(host.lse.data(), lse, lse_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      const test::Accuracy acc = test::Compare(oracle, host.out, host.lse);
      EXPECT_LE(acc.out, kTolerance);
      EXPECT_LE(acc.lse, kTolerance);
    }
    ExpectPoolIsTheHostQuantization(made->cuda_storage(), layer, pool);
    EXPECT_EQ(made->backend->external_counters().failures, 0);
    for (void* p : {q, kv, out, lse}) ASSERT_EQ(cudaFree(p), cudaSuccess);
  }
}

}  // namespace
}  // namespace verifyd
