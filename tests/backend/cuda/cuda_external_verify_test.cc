// CudaBackend on external tensors (the co-located data plane): a real second process (the IPC
// producer, playing the scheduler) owns q, tree KV, out, lse and the flags in its device memory;
// this process opens its IPC handle and serves whole decode steps that the producer enqueued ahead
// on its own stream (a delay kernel before each layer's copies, then the ready flag; a wait for
// the done flag). Checked: every layer against the float64 oracle, the tree KV in the pool, a
// failing call in the middle of a step (the step completes, that layer's outputs are all NaN, the
// error names the field), graphs on and off give identical bytes, the bad-input refusals of
// OpenExternalRegion and ComputeVerifyExternal, and a call refused by the device's value check
// with the good calls after it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/align.h"
#include "base/cuda_driver.h"
#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/backend/cuda/ipc_producer.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

using test::HostProblem;
using test::IpcProducer;
using test::ProducerLayer;

constexpr double kTolerance = 1e-2;
constexpr int kLayers = 3;
constexpr int kHeads = 8;
constexpr uint64_t kDelayUs = 2000;  // the producer's "model" per layer: the daemon waits on it

// One layer's tensors in the producer's region.
struct Placement {
  size_t q = 0, kv = 0, out = 0, lse = 0, end = 0;
};

struct Step {
  std::vector<HostProblem> problems;            // per layer (same shapes, fresh values)
  std::vector<std::vector<int32_t>> trees;      // per layer: the tree slots, batch order
  std::vector<std::vector<bf16_bits>> tree_kv;  // per layer: [total_q][576]
  std::vector<Placement> placed;
  size_t ready = 0, done = 0, bytes = 0;
};

Step MakeStep(uint64_t seed) {
  const std::vector<test::SequenceSpec> seqs = {{1500, 7, test::TreeShape::kRandom},
                                                {333, 16, test::TreeShape::kForest},
                                                {4100, 1, test::TreeShape::kChain}};
  Step step;
  size_t at = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    HostProblem p = test::MakeRandomProblem(seqs, kHeads, seed + layer, /*scattered=*/true, 64);
    std::vector<int32_t> tree;
    std::vector<bf16_bits> rows;
    for (int b = 0; b < p.batch(); ++b) {
      for (int i = 0; i < p.qo_indptr[b + 1] - p.qo_indptr[b]; ++i) {
        const int32_t slot = p.slots[p.slot_indptr[b] + p.prefix_len[b] + i];
        tree.push_back(slot);
        rows.insert(rows.end(), p.kv.begin() + static_cast<int64_t>(slot) * kKvDim,
                    p.kv.begin() + static_cast<int64_t>(slot + 1) * kKvDim);
      }
    }
    Placement pl;
    pl.q = at;
    pl.kv = AlignTo256(pl.q + p.q.size() * sizeof(bf16_bits));
    pl.out = AlignTo256(pl.kv + rows.size() * sizeof(bf16_bits));
    pl.lse = pl.out + p.out.size() * sizeof(bf16_bits);  // out then lse: one copy back
    pl.end = AlignTo256(pl.lse + p.lse.size() * sizeof(float));
    at = pl.end;
    step.problems.push_back(std::move(p));
    step.trees.push_back(std::move(tree));
    step.tree_kv.push_back(std::move(rows));
    step.placed.push_back(pl);
  }
  step.ready = at;
  step.done = at + 256;
  step.bytes = at + 512;
  return step;
}

// The pool as the daemon holds it before the step: every row of the problem, except that the
// tree rows hold NaN until the step's tree-KV write replaces them.
absl::Status FillPool(KvStorage& storage, const Step& step) {
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<bf16_bits> rows = step.problems[layer].kv;
    for (const int32_t slot : step.trees[layer]) {
      std::fill_n(rows.begin() + static_cast<int64_t>(slot) * kKvDim, kKvDim, bf16_bits{0xFFFF});
    }
    const int64_t n = static_cast<int64_t>(rows.size() / kKvDim);
    if (absl::Status s = storage.WriteRows(layer, test::Iota(n), rows.data()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string TempPath(const char* name) {
  return absl::StrCat(::testing::TempDir(), "/", name, "_", getpid());
}

struct StepResult {
  std::vector<absl::Status> statuses;       // per layer
  std::vector<std::vector<bf16_bits>> out;  // per layer
  std::vector<std::vector<float>> lse;      // per layer
};

// A call of `layer` on the tensors placed at `base` (index arrays from `p`, which must outlive
// it), the tree slots `tree`; no flags.
ExternalVerify CallOn(int layer, HostProblem& p, uint8_t* base, const Placement& pl,
                      absl::Span<const int32_t> tree) {
  ExternalVerify call;
  call.layer = layer;
  call.problem = p.problem();
  call.problem.q = reinterpret_cast<const bf16_bits*>(base + pl.q);
  call.problem.out = reinterpret_cast<bf16_bits*>(base + pl.out);
  call.problem.lse = reinterpret_cast<float*>(base + pl.lse);
  call.tree_kv = reinterpret_cast<const bf16_bits*>(base + pl.kv);
  call.tree_slots = tree;
  return call;
}

// Serves one step: the producer enqueues it (flags value base+1 .. base+kLayers), this side
// enqueues every layer's ComputeVerifyExternal without waiting, then both wait. `bad_layer`
// (-1: none) gets a wrong tree slot.
StepResult ServeStep(test::BackendWithStorage& b, IpcProducer& producer, uint8_t* region,
                     const Step& step, uint32_t base, int bad_layer) {
  StepResult result;
  const std::string in_path = TempPath("producer_in"), out_path = TempPath("producer_out");
  {
    std::ofstream in(in_path, std::ios::binary);
    for (int layer = 0; layer < kLayers; ++layer) {
      const HostProblem& p = step.problems[layer];
      in.write(reinterpret_cast<const char*>(p.q.data()), p.q.size() * sizeof(bf16_bits));
      in.write(reinterpret_cast<const char*>(step.tree_kv[layer].data()),
               step.tree_kv[layer].size() * sizeof(bf16_bits));
    }
  }
  std::vector<ProducerLayer> layers;
  for (int layer = 0; layer < kLayers; ++layer) {
    const HostProblem& p = step.problems[layer];
    const Placement& pl = step.placed[layer];
    layers.push_back(ProducerLayer{
        pl.q, p.q.size() * sizeof(bf16_bits), pl.kv, step.tree_kv[layer].size() * sizeof(bf16_bits),
        pl.out, pl.end - pl.out, step.ready, step.done, base + static_cast<uint32_t>(layer) + 1});
  }
  // Outputs poisoned by this side first, so nothing left from an earlier step can pass.
  for (int layer = 0; layer < kLayers; ++layer) {
    const Placement& pl = step.placed[layer];
    EXPECT_EQ(cudaMemset(region + pl.out, 0xFF, pl.end - pl.out), cudaSuccess);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(producer.SendStep(in_path, out_path, kDelayUs, layers).ok());
  for (int layer = 0; layer < kLayers; ++layer) {
    HostProblem p = step.problems[layer];  // host index arrays; tensors in the region
    std::vector<int32_t> tree = step.trees[layer];
    if (layer == bad_layer) tree[tree.size() / 2] = static_cast<int32_t>(p.num_slots) + 5;
    ExternalVerify call = CallOn(layer, p, region, step.placed[layer], tree);
    call.order.ready = {reinterpret_cast<uint32_t*>(region + step.ready), layers[layer].value};
    call.order.done = {reinterpret_cast<uint32_t*>(region + step.done), layers[layer].value};
    result.statuses.push_back(b.backend->ComputeVerifyExternal(call, {}));
  }
  const absl::Status finished = producer.AwaitStep(std::chrono::seconds(60));
  EXPECT_TRUE(finished.ok()) << finished;
  if (!finished.ok()) {
    // Unblock this process's stream before failing: the flags end every wait.
    const uint32_t all = 0xFFFFFFFFu;
    cudaMemcpy(region + step.ready, &all, sizeof(all), cudaMemcpyHostToDevice);
  }
  EXPECT_TRUE(b.backend->stream().Synchronize().ok());
  std::ifstream out(out_path, std::ios::binary);
  for (int layer = 0; layer < kLayers; ++layer) {
    const HostProblem& p = step.problems[layer];
    const Placement& pl = step.placed[layer];
    std::vector<uint8_t> bytes(pl.end - pl.out);
    out.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    result.out.emplace_back(p.out.size());
    result.lse.emplace_back(p.lse.size());
    std::memcpy(result.out.back().data(), bytes.data(), p.out.size() * sizeof(bf16_bits));
    std::memcpy(result.lse.back().data(), bytes.data() + (pl.lse - pl.out),
                p.lse.size() * sizeof(float));
  }
  EXPECT_TRUE(static_cast<bool>(out)) << "the producer's outputs are short";
  unlink(in_path.c_str());
  unlink(out_path.c_str());
  return result;
}

bool AllNan(const std::vector<bf16_bits>& out, const std::vector<float>& lse) {
  for (const bf16_bits v : out) {
    if ((v & 0x7F80) != 0x7F80 || (v & 0x7F) == 0) return false;
  }
  for (const float v : lse) {
    if (!std::isnan(v)) return false;
  }
  return true;
}

// Next to this test when there (the GPU machine's bundle), else where the build put it.
std::string ProducerBinary() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string path(self, static_cast<size_t>(n));
    path = path.substr(0, path.rfind('/') + 1) + "cuda_ipc_producer";
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return VERIFYD_IPC_PRODUCER;
}

// Every step of `steps` through a fresh backend, graphs on or off; returns the last step's
// results. Steps 1.. repeat step 0's inputs (graphs: warm-up, capture, replay).
StepResult RunSteps(bool cuda_graphs, const Step& step, int steps, int bad_layer,
                    int64_t* replays = nullptr) {
  auto made = test::MakeBackend(cuda_graphs, kLayers, step.problems[0].num_slots);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return {};
  auto producer = IpcProducer::Start(ProducerBinary(), step.bytes);
  EXPECT_TRUE(producer.ok()) << producer.status();
  if (!producer.ok()) return {};
  ExternalMemoryHandle handle{(*producer)->handle(), step.bytes, 0};
  auto region = made->backend->OpenExternalRegion(handle);
  EXPECT_TRUE(region.ok()) << region.status();
  if (!region.ok()) return {};
  auto* base = static_cast<uint8_t*>((*region)->data());
  const uint32_t zero[2] = {0, 0};
  EXPECT_EQ(cudaMemcpy(base + step.ready, &zero[0], 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(base + step.done, &zero[1], 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_TRUE(FillPool(*made->storage, step).ok());
  StepResult last;
  for (int s = 0; s < steps; ++s) {
    last = ServeStep(*made, **producer, base, step, static_cast<uint32_t>(s * kLayers),
                     s == steps - 1 ? bad_layer : -1);
    // The tree KV reached the pool (a failed layer's check refused it before anything ran).
    for (int layer = 0; layer < kLayers; ++layer) {
      if (layer == bad_layer && s == steps - 1) continue;
      std::vector<bf16_bits> rows(step.tree_kv[layer].size());
      EXPECT_TRUE(made->storage->ReadRows(layer, step.trees[layer], rows.data()).ok());
      EXPECT_EQ(rows, step.tree_kv[layer]) << "layer " << layer << " step " << s;
    }
  }
  if (replays != nullptr) *replays = made->backend->graph_counters().replays;
  region->reset();
  return last;
}

class CudaExternalVerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaExternalVerifyTest, TwoProcessStepMatchesFloat64GraphsOnAndOffIdentical) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  const Step step = MakeStep(seed);
  int64_t replays = 0;
  const StepResult eager = RunSteps(false, step, 3, -1);
  const StepResult graphed = RunSteps(true, step, 3, -1, &replays);
  ASSERT_EQ(eager.out.size(), static_cast<size_t>(kLayers));
  ASSERT_EQ(graphed.out.size(), static_cast<size_t>(kLayers));
  EXPECT_GT(replays, 0) << "the graph path never replayed";
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_TRUE(eager.statuses[layer].ok()) << eager.statuses[layer];
    EXPECT_TRUE(graphed.statuses[layer].ok()) << graphed.statuses[layer];
    const test::Accuracy acc = test::CompareToF64(HostProblem(step.problems[layer]).problem(),
                                                  eager.out[layer], eager.lse[layer]);
    EXPECT_LT(acc.out, kTolerance) << "layer " << layer;
    EXPECT_LT(acc.lse, kTolerance) << "layer " << layer;
    EXPECT_EQ(eager.out[layer], graphed.out[layer]) << "layer " << layer;
    EXPECT_EQ(0, std::memcmp(eager.lse[layer].data(), graphed.lse[layer].data(),
                             eager.lse[layer].size() * sizeof(float)))
        << "layer " << layer;
  }
}

TEST_F(CudaExternalVerifyTest, FailingCallInTheMiddleSignalsAndFillsNan) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  const Step step = MakeStep(seed);
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs on" : "graphs off");
    const StepResult r = RunSteps(graphs, step, 2, /*bad_layer=*/1);
    ASSERT_EQ(r.out.size(), static_cast<size_t>(kLayers));
    EXPECT_EQ(r.statuses[1].code(), absl::StatusCode::kInvalidArgument) << r.statuses[1];
    EXPECT_NE(r.statuses[1].message().find("tree_slots["), std::string::npos) << r.statuses[1];
    EXPECT_TRUE(AllNan(r.out[1], r.lse[1]));
    for (const int layer : {0, 2}) {
      EXPECT_TRUE(r.statuses[layer].ok()) << r.statuses[layer];
      const test::Accuracy acc = test::CompareToF64(HostProblem(step.problems[layer]).problem(),
                                                    r.out[layer], r.lse[layer]);
      EXPECT_LT(acc.out, kTolerance) << "layer " << layer;
      EXPECT_LT(acc.lse, kTolerance) << "layer " << layer;
    }
  }
}

TEST_F(CudaExternalVerifyTest, OpenExternalRegionRefusesBadHandles) {
  auto made = test::MakeBackend(true, 1, 1024);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& backend = *made->backend;
  auto expect_refused = [&](const ExternalMemoryHandle& h, const std::string& needle) {
    auto region = backend.OpenExternalRegion(h);
    ASSERT_FALSE(region.ok());
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument) << region.status();
    EXPECT_NE(region.status().message().find(needle), std::string::npos) << region.status();
  };
  expect_refused({std::string(10, 'x'), 4096, 0}, "64");
  expect_refused({std::string(64, '\0'), 4096, 1}, "device = 1");
  expect_refused({std::string(64, '\0'), 0, 0}, "bytes = 0");
  std::mt19937_64 rng(test::TestSeed());
  std::string random(64, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  expect_refused({random, 4096, 0}, "does not open");
  // A handle of this process's own allocation does not open here (a CUDA IPC rule).
  void* own = nullptr;
  ASSERT_EQ(cudaMalloc(&own, 4096), cudaSuccess);
  cudaIpcMemHandle_t ipc;
  ASSERT_EQ(cudaIpcGetMemHandle(&ipc, own), cudaSuccess);
  expect_refused({std::string(reinterpret_cast<const char*>(&ipc), 64), 4096, 0}, "does not open");
  ASSERT_EQ(cudaFree(own), cudaSuccess);
  // Larger than the allocation another process exported.
  auto producer = IpcProducer::Start(ProducerBinary(), 1 << 20);
  ASSERT_TRUE(producer.ok()) << producer.status();
  expect_refused({(*producer)->handle(), (1 << 20) * 4 + 1, 0}, "must be <= the allocation");
  auto fits = backend.OpenExternalRegion({(*producer)->handle(), 1 << 20, 0});
  EXPECT_TRUE(fits.ok()) << fits.status();
}

TEST_F(CudaExternalVerifyTest, MisalignedFlagOrTensorIsRefusedWithoutEnqueueing) {
  const Step step = MakeStep(test::TestSeed());
  auto made = test::MakeBackend(true, kLayers, step.problems[0].num_slots);
  ASSERT_TRUE(made.ok()) << made.status();
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, step.bytes), cudaSuccess);
  auto* base = static_cast<uint8_t*>(device);
  HostProblem p = step.problems[0];
  ExternalVerify call = CallOn(0, p, base, step.placed[0], step.trees[0]);
  call.order.ready = {reinterpret_cast<uint32_t*>(base + step.ready + 2), 1};
  absl::Status s = made->backend->ComputeVerifyExternal(call, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("ready flag must be 4-byte aligned"), std::string::npos) << s;
  // A misaligned tensor with usable flags (none here): refused, and the outputs are NaN.
  call.order.ready = {};
  call.problem.q = reinterpret_cast<const bf16_bits*>(base + step.placed[0].q + 2);
  s = made->backend->ComputeVerifyExternal(call, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("q must be 16-byte aligned"), std::string::npos) << s;
  EXPECT_EQ(made->backend->external_counters().calls, 0);
  EXPECT_EQ(made->backend->external_counters().failures, 1);
  ASSERT_TRUE(made->backend->stream().Synchronize().ok());
  std::vector<bf16_bits> out(p.out.size());
  std::vector<float> lse(p.lse.size());
  ASSERT_EQ(cudaMemcpy(out.data(), call.problem.out, out.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse.data(), call.problem.lse, lse.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(AllNan(out, lse));
  ASSERT_EQ(cudaFree(device), cudaSuccess);
}

// A scheduler that dies before writing its ready flag leaves the backend's stream waiting; the
// daemon releases it (ReleaseExternalWait) and the stream goes on: the waiting call computes (here
// on real inputs, so it matches the oracle) and a FailVerifyExternal queued behind it NaN-fills
// its outputs and writes the done flag.
TEST_F(CudaExternalVerifyTest, ReleaseExternalWaitUnblocksTheStream) {
  const Step step = MakeStep(test::TestSeed());
  auto made = test::MakeBackend(true, kLayers, step.problems[0].num_slots);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(FillPool(*made->storage, step).ok());
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, step.bytes), cudaSuccess);
  auto* base = static_cast<uint8_t*>(device);
  ASSERT_EQ(cudaMemset(base, 0xFF, step.bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(base + step.ready, 0, 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(base + step.done, 0, 4), cudaSuccess);
  HostProblem p = step.problems[0];
  const Placement& pl = step.placed[0];
  ASSERT_EQ(cudaMemcpy(base + pl.q, p.q.data(), p.q.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(base + pl.kv, step.tree_kv[0].data(), step.tree_kv[0].size() * 2,
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  auto* ready = reinterpret_cast<uint32_t*>(base + step.ready);
  auto* done = reinterpret_cast<uint32_t*>(base + step.done);
  ExternalVerify call = CallOn(0, p, base, pl, step.trees[0]);
  call.order = {{ready, 7}, {done, 7}};
  ASSERT_TRUE(made->backend->ComputeVerifyExternal(call, {}).ok());
  const Placement& failed = step.placed[1];
  const HostProblem& q1 = step.problems[1];
  const ExternalFailure failure{reinterpret_cast<bf16_bits*>(base + failed.out),
                                static_cast<int64_t>(q1.out.size()),
                                reinterpret_cast<float*>(base + failed.lse),
                                static_cast<int64_t>(q1.lse.size()),
                                {{ready, 8}, {done, 8}}};
  ASSERT_TRUE(made->backend->FailVerifyExternal(failure).ok());
  // Nobody wrote the ready flag: the stream is still waiting.
  EXPECT_EQ(cudaStreamQuery(made->backend->stream().get()), cudaErrorNotReady);
  ASSERT_TRUE(made->backend->ReleaseExternalWait({ready, 8}).ok());
  ASSERT_TRUE(made->backend->stream().Synchronize().ok());
  uint32_t done_value = 0;
  ASSERT_EQ(cudaMemcpy(&done_value, done, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(done_value, 8u);
  std::vector<bf16_bits> out(p.out.size());
  std::vector<float> lse(p.lse.size());
  ASSERT_EQ(cudaMemcpy(out.data(), base + pl.out, out.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse.data(), base + pl.lse, lse.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  const test::Accuracy acc = test::CompareToF64(p.problem(), out, lse);
  EXPECT_LT(acc.out, kTolerance);
  EXPECT_LT(acc.lse, kTolerance);
  std::vector<bf16_bits> failed_out(q1.out.size());
  std::vector<float> failed_lse(q1.lse.size());
  ASSERT_EQ(cudaMemcpy(failed_out.data(), base + failed.out, failed_out.size() * 2,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(failed_lse.data(), base + failed.lse, failed_lse.size() * 4,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(AllNan(failed_out, failed_lse));
  EXPECT_EQ(made->backend->external_counters().calls, 1);
  EXPECT_EQ(made->backend->external_counters().failures, 1);
  // A cancelled channel's call is refused (ABORTED) and still signalled.
  std::atomic<bool> cancelled{true};
  call.order = {{ready, 9}, {done, 9}, &cancelled};
  const absl::Status aborted = made->backend->ComputeVerifyExternal(call, {});
  EXPECT_EQ(aborted.code(), absl::StatusCode::kAborted) << aborted;
  ASSERT_TRUE(made->backend->ReleaseExternalWait({ready, 9}).ok());
  ASSERT_TRUE(made->backend->stream().Synchronize().ok());
  ASSERT_EQ(cudaMemcpy(&done_value, done, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(done_value, 9u);
  ASSERT_EQ(cudaFree(device), cudaSuccess);
}

// SPEC §1 on the device, then the calls after it: a call refused by the value check (out-of-bound
// or NaN values in q, then in tree_kv) answers INVALID_ARGUMENT naming the first bad element as
// the host's check would, and its outputs are all NaN; then more than a ring's worth of good calls
// on the same layer and graph bucket each answer OK and match the float64 oracle. The check's
// device words are re-armed by every call's NaN fill, not by a memset in the graph (plans/0031,
// change 2): a fill that forgot would refuse the good calls (their words still the refused
// call's) and NaN their outputs; a host copy that is not the fill's would answer them wrongly.
TEST_F(CudaExternalVerifyTest, RefusedValuesLeaveNothingForTheCallsAfterThem) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  const Step step = MakeStep(seed);
  const HostProblem& p0 = step.problems[0];
  const Placement& pl = step.placed[0];
  const test::ReferenceF64 reference = test::ComputeReferenceF64(HostProblem(p0).problem());
  const int64_t tq = p0.total_q();
  const std::vector<int64_t> q_shape = {tq, kHeads, kKvDim}, tree_kv_shape = {tq, kKvDim};
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs on" : "graphs off");
    auto made = test::MakeBackend(graphs, kLayers, p0.num_slots);
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_TRUE(FillPool(*made->storage, step).ok());
    void* device = nullptr;
    ASSERT_EQ(cudaMalloc(&device, step.bytes), cudaSuccess);
    auto* base = static_cast<uint8_t*>(device);
    auto upload = [&](const std::vector<bf16_bits>& q, const std::vector<bf16_bits>& tree_kv) {
      ASSERT_EQ(cudaMemcpy(base + pl.q, q.data(), q.size() * 2, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(
          cudaMemcpy(base + pl.kv, tree_kv.data(), tree_kv.size() * 2, cudaMemcpyHostToDevice),
          cudaSuccess);
    };
    // One call on layer 0 (same tensors, same bucket each time), its outputs poisoned first and
    // read back after it: the device's answer.
    std::vector<bf16_bits> out(p0.out.size());
    std::vector<float> lse(p0.lse.size());
    auto call = [&]() -> absl::Status {
      EXPECT_EQ(cudaMemset(base + pl.out, 0xFF, pl.end - pl.out), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      HostProblem p = p0;
      ExternalVerify c = CallOn(0, p, base, pl, step.trees[0]);
      std::shared_ptr<ExternalValueCheck> check;
      c.value_check = &check;
      if (absl::Status enqueued = made->backend->ComputeVerifyExternal(c, {}); !enqueued.ok()) {
        return enqueued;
      }
      if (check == nullptr) return absl::InternalError("no value check was handed back");
      const absl::Status answer = check->Wait();
      EXPECT_TRUE(made->backend->stream().Synchronize().ok());
      EXPECT_EQ(cudaMemcpy(out.data(), base + pl.out, out.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(cudaMemcpy(lse.data(), base + pl.lse, lse.size() * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      return answer;
    };
    auto expect_good = [&](int n, const char* when) {
      for (int k = 0; k < n; ++k) {
        const absl::Status answer = call();
        ASSERT_TRUE(answer.ok()) << when << ", good call " << k << ": " << answer;
        const test::Accuracy acc = test::Compare(reference, out, lse);
        ASSERT_LT(acc.out, kTolerance) << when << ", good call " << k;
        ASSERT_LT(acc.lse, kTolerance) << when << ", good call " << k;
      }
    };
    upload(p0.q, step.tree_kv[0]);
    expect_good(3, "before any refusal");  // graphs: warm-up, capture, replay
    const bf16_bits bad[] = {0x7F80, 0xFF80, 0x7FC1, 0x4781, 0xC900};
    for (const char* field : {"q", "tree_kv"}) {
      SCOPED_TRACE(field);
      const bool in_q = std::string(field) == "q";
      std::vector<bf16_bits> q = p0.q, tree_kv = step.tree_kv[0];
      std::vector<bf16_bits>& target = in_q ? q : tree_kv;
      std::uniform_int_distribution<size_t> at(0, target.size() - 1);
      for (int k = 0; k < 3; ++k) target[at(rng)] = bad[rng() % 5];
      const absl::Status want =
          CheckValueBound(target.data(), in_q ? q_shape : tree_kv_shape, field);
      ASSERT_FALSE(want.ok());
      upload(q, tree_kv);
      const absl::Status refused = call();
      EXPECT_EQ(refused, want) << "the device's answer is the host check's";
      EXPECT_TRUE(AllNan(out, lse)) << "a refused call's outputs are all NaN";
      upload(p0.q, step.tree_kv[0]);
      expect_good(CudaBackend::kExternalStagingRing + 2, "after the refusal");
    }
    // The good calls' tree rows are what the pool holds: nothing of the refused ones stayed.
    std::vector<bf16_bits> rows(step.tree_kv[0].size());
    ASSERT_TRUE(made->storage->ReadRows(0, step.trees[0], rows.data()).ok());
    EXPECT_EQ(rows, step.tree_kv[0]);
    EXPECT_EQ(made->backend->external_counters().calls,
              3 + 2 * (CudaBackend::kExternalStagingRing + 3));
    if (graphs) {
      const GraphCounters counters = made->backend->graph_counters();
      EXPECT_EQ(counters.captures, 1) << "one bucket, one graph, replayed";
      EXPECT_EQ(counters.fallbacks, 0);
      EXPECT_GT(counters.replays, 2 * CudaBackend::kExternalStagingRing);
    }
    ASSERT_EQ(cudaFree(device), cudaSuccess);
  }
}

TEST_F(CudaExternalVerifyTest, MpsAttributeIsReadable) {
  // Whether MPS is on depends on the machine; the attribute must answer either way.
  absl::StatusOr<bool> mps = MpsActive(0);
  ASSERT_TRUE(mps.ok()) << mps.status();
  std::printf("MPS active: %s\n", *mps ? "yes" : "no");
}

}  // namespace
}  // namespace verifyd
