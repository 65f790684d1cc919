// A decode step captured in one CUDA graph and replayed (SPEC §3.1 "Inside the engine's CUDA
// graph", plans/0033), on the GPU: the real `verifyd` binary with the cuda backend, and this
// process as the engine, through the data-plane library's C ABI (what Python loads). The graph is
// captured once: StepPublish, then per layer the engine's stand-in work (copies of that layer's
// q and tree KV from staging into the bucket's buffers), SignalReady, WaitDone and a copy of out
// away; it is replayed >= 50 times with trees that change every step (chains, stars, forests,
// bushes), a growing prefix and riding commits, every output element of every layer checked
// against the float64 reference (ShadowModel). Then the channel closes under the graph: the next
// replay's outputs are NaN and the fault word says the capture ended. Skips without a GPU; its
// cpu twin is captured_step_test.cc.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "channel/step_area.h"
#include "client/c_api/verifyd_dataplane.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/service/daemon_process.h"
#include "tests/service/shadow_model.h"
#include "tests/testing/test_seed.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using testing::DaemonProcess;
using testing::ShadowModel;
using testing::VerifyPart;

constexpr int kLayers = 4;
constexpr int kHeads = 4;
constexpr float kScale = 0.0625f;
constexpr uint32_t kMaxBatch = 3;
constexpr uint32_t kMaxQ = 8;
constexpr uint64_t kRows = kMaxBatch * kMaxQ;
constexpr uint64_t kQBytes = kRows * kHeads * kKvDim * 2;
constexpr uint64_t kKvBytes = kRows * kKvDim * 2;
constexpr uint64_t kOutBytes = kRows * kHeads * kVDim * 2;

bool HaveCudaDevice() {
  int count = 0;
  const bool have = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return have;
}

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define ASSERT_VD(expr) ASSERT_EQ((expr), 0) << #expr << ": " << vd_last_error()

// The registered region: the bucket's buffers and the flags (offsets from its base).
struct Bucket {
  uint64_t q = 0, tree_kv = 0, out = 0, ready = 0, done = 0, bytes = 0;
};
Bucket BucketLayout() {
  Bucket b;
  b.q = 0;
  b.tree_kv = (b.q + kQBytes + 255) / 256 * 256;
  b.out = (b.tree_kv + kKvBytes + 255) / 256 * 256;
  b.ready = (b.out + kOutBytes + 255) / 256 * 256;
  b.done = b.ready + 256;
  b.bytes = b.done + 256;
  return b;
}

// Trees of every shape the bucket allows.
std::vector<int32_t> Tree(int shape, int nodes, ShadowModel& model) {
  std::vector<int32_t> p(nodes);
  for (int i = 0; i < nodes; ++i) {
    if (shape % 4 == 0) p[i] = i - 1;
    if (shape % 4 == 1) p[i] = i == 0 ? -1 : 0;
    if (shape % 4 == 2) p[i] = i % 3 == 0 ? -1 : i - 1;
  }
  return shape % 4 == 3 ? model.RandomParents(nodes) : p;
}

TEST(DataPlaneCapturedGpuTest, AGraphReplayedStepAfterStepMatchesFloat64) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("VERIFYD_TEST_SEED=", seed));
  const std::string socket = absl::StrCat("/tmp/verifyd-dp-captured-", getpid());
  std::string error;
  std::unique_ptr<DaemonProcess> daemon = DaemonProcess::Start(
      testing::DaemonBinary(VERIFYD_BINARY),
      {"--backend=cuda", absl::StrCat("--listen=unix://", socket),
       "--metrics=", absl::StrCat("--layers=", kLayers), absl::StrCat("--heads=", kHeads),
       absl::StrCat("--softmax-scale=", kScale), "--max-tree-nodes=64",
       "--kv-capacity-tokens=8192"},
      &error);
  ASSERT_NE(daemon, nullptr) << error;
  ShadowModel model(kLayers, kHeads, kScale, static_cast<uint32_t>(seed));
  ClientOptions options;
  options.client_id = "captured-engine";
  std::unique_ptr<Client> client = *Client::Connect(absl::StrCat("unix://", socket), options);
  const std::vector<uint64_t> sequences = {1, 2, 3};
  for (uint64_t s : sequences) {
    const v1::AppendRequest append = model.MakeAppend(s, 50 + 70 * static_cast<int>(s));
    ASSERT_TRUE(client->Append(append).ok());
    model.AcceptAppend(append);
  }

  // The engine's memory: the registered bucket, staging for each layer's inputs, each layer's
  // copy of out, and the step tensors StepPublish reads.
  const Bucket b = BucketLayout();
  uint8_t* region = nullptr;
  uint8_t* staging = nullptr;  // per layer: q then tree_kv
  uint8_t* outs = nullptr;     // per layer: out
  uint8_t* step = nullptr;
  const uint64_t stage_bytes = kQBytes + kKvBytes;
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&region), b.bytes));
  ASSERT_CUDA(cudaMemset(region, 0, b.bytes));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&staging), kLayers * stage_bytes));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&outs), kLayers * kOutBytes));
  // num_seqs [1] | ids int64 [B] | q_lens [B] | parents [B][Q] | commit_lens [B] | paths [B][Q]
  struct StepHost {
    int32_t num_seqs;
    int32_t pad;
    int64_t ids[kMaxBatch];
    int32_t q_lens[kMaxBatch];
    int32_t parents[kMaxBatch][kMaxQ];
    int32_t commit_lens[kMaxBatch];
    int32_t paths[kMaxBatch][kMaxQ];
  };
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&step), sizeof(StepHost)));
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  vd_client* vc = nullptr;
  ASSERT_VD(vd_connect(absl::StrCat("unix://", socket).c_str(), "captured-engine", "", 30, &vc));
  uint64_t region_id = 0, base = 0;
  ASSERT_VD(vd_register_cuda(vc, reinterpret_cast<uint64_t>(region), b.bytes, &region_id, &base));
  ASSERT_EQ(base, reinterpret_cast<uint64_t>(region));
  vd_channel* channel = nullptr;
  ASSERT_VD(vd_channel_open(vc, 8, &channel));
  vd_capture_desc desc{};
  desc.max_batch = kMaxBatch;
  desc.max_q = kMaxQ;
  desc.q = {region_id, b.q};
  desc.tree_kv = {region_id, b.tree_kv};
  desc.out = {region_id, b.out};
  desc.ready = {region_id, b.ready};
  desc.done = {region_id, b.done};
  desc.ready_pointer = reinterpret_cast<uint64_t>(region + b.ready);
  desc.done_pointer = reinterpret_cast<uint64_t>(region + b.done);
  desc.out_pointer = reinterpret_cast<uint64_t>(region + b.out);
  vd_capture* capture = nullptr;
  ASSERT_VD(vd_capture_prepare(vc, channel, &desc, &capture));
  ASSERT_EQ(vd_capture_num_layers(capture), uint32_t{kLayers});
  ASSERT_VD(vd_capture_enable_device(capture, 10.0));

  // Capture once.
  StepHost* d = reinterpret_cast<StepHost*>(step);
  vd_step_tensors tensors{
      reinterpret_cast<uint64_t>(&d->num_seqs),   reinterpret_cast<uint64_t>(d->ids),
      reinterpret_cast<uint64_t>(d->q_lens),      reinterpret_cast<uint64_t>(d->parents),
      reinterpret_cast<uint64_t>(d->commit_lens), reinterpret_cast<uint64_t>(d->paths)};
  cudaGraph_t graph;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_VD(vd_capture_step_publish(capture, stream, &tensors));
  for (int layer = 0; layer < kLayers; ++layer) {
    uint8_t* in = staging + layer * stage_bytes;
    ASSERT_CUDA(cudaMemcpyAsync(region + b.q, in, kQBytes, cudaMemcpyDeviceToDevice, stream));
    ASSERT_CUDA(cudaMemcpyAsync(region + b.tree_kv, in + kQBytes, kKvBytes,
                                cudaMemcpyDeviceToDevice, stream));
    ASSERT_VD(vd_capture_signal_ready(capture, stream, layer));
    ASSERT_VD(vd_capture_wait_done(capture, stream, layer));
    ASSERT_CUDA(cudaMemcpyAsync(outs + layer * kOutBytes, region + b.out, kOutBytes,
                                cudaMemcpyDeviceToDevice, stream));
  }
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::map<uint64_t, std::vector<int32_t>> pending;
  std::vector<uint8_t> host_outs(kLayers * kOutBytes);
  std::vector<uint8_t> host_stage(kLayers * stage_bytes);
  for (int s = 1; s <= 56; ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s));
    std::vector<VerifyPart> parts;
    StepHost h{};
    h.num_seqs = static_cast<int32_t>(sequences.size());
    for (size_t k = 0; k < sequences.size(); ++k) {
      VerifyPart p;
      p.sequence = sequences[k];
      if (pending.contains(p.sequence)) p.commit_previous = model.RandomPath(pending[p.sequence]);
      p.parents = Tree(s + static_cast<int>(k), 1 + model.rng()() % kMaxQ, model);
      h.ids[k] = static_cast<int64_t>(p.sequence);
      h.q_lens[k] = static_cast<int32_t>(p.parents.size());
      std::copy(p.parents.begin(), p.parents.end(), h.parents[k]);
      h.commit_lens[k] = p.commit_previous ? static_cast<int32_t>(p.commit_previous->size()) : -1;
      if (p.commit_previous)
        std::copy(p.commit_previous->begin(), p.commit_previous->end(), h.paths[k]);
      parts.push_back(p);
    }
    // Every layer's inputs, as the model's projections would leave them in staging.
    std::vector<v1::VerifyRequest> requests;
    for (int layer = 0; layer < kLayers; ++layer) {
      if (layer == 1) {
        for (VerifyPart& p : parts) p.commit_previous.reset();
      }
      requests.push_back(model.MakeVerify(layer, parts, false));
      model.AcceptVerify(requests.back());
      const v1::VerifyRequest& r = requests.back();
      std::memcpy(host_stage.data() + layer * stage_bytes, r.q().inline_data().data(),
                  r.q().inline_data().size());
      std::memcpy(host_stage.data() + layer * stage_bytes + kQBytes,
                  r.tree_kv().inline_data().data(), r.tree_kv().inline_data().size());
    }
    ASSERT_CUDA(cudaMemcpyAsync(step, &h, sizeof(h), cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaMemcpyAsync(staging, host_stage.data(), host_stage.size(),
                                cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaMemsetAsync(outs, 0x11, kLayers * kOutBytes, stream));  // stale, not NaN
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(
        cudaMemcpyAsync(host_outs.data(), outs, host_outs.size(), cudaMemcpyDeviceToHost, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    uint32_t fault = 1;
    ASSERT_VD(vd_capture_error(capture, stream, &fault));
    ASSERT_EQ(fault, channel::kCaptureOk);
    ASSERT_VD(vd_capture_wait_step(capture, static_cast<uint64_t>(s), 30));
    for (int layer = 0; layer < kLayers; ++layer) {
      const v1::VerifyRequest& r = requests[layer];
      int64_t tq = 0;
      for (const auto& seq : r.sequences()) tq += seq.parents_size();
      v1::VerifyResponse response;
      response.mutable_out()->set_dtype(v1::DTYPE_BF16);
      for (int64_t dim : {tq, int64_t{kHeads}, int64_t{kVDim}}) {
        response.mutable_out()->add_shape(dim);
      }
      response.mutable_out()->set_inline_data(host_outs.data() + layer * kOutBytes,
                                              tq * kHeads * kVDim * 2);
      for (const auto& seq : r.sequences()) {
        response.add_committed_length(
            static_cast<uint64_t>(model.committed_length(seq.sequence_id())));
      }
      EXPECT_EQ(model.CheckVerify(r, response), "") << "layer " << layer;
    }
    for (const VerifyPart& p : parts) pending[p.sequence] = p.parents;
  }

  // The capture ends under the graph (its channel closes): the next replay raises no flag the
  // daemon would wait for, its outputs are NaN and the fault word says why.
  ASSERT_VD(vd_channel_close(channel));
  ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  ASSERT_CUDA(
      cudaMemcpyAsync(host_outs.data(), outs, host_outs.size(), cudaMemcpyDeviceToHost, stream));
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  uint32_t fault = 0;
  ASSERT_VD(vd_capture_error(capture, stream, &fault));
  EXPECT_EQ(fault, channel::kCaptureEpochChanged);
  const auto* bits = reinterpret_cast<const uint16_t*>(host_outs.data());
  for (uint64_t k = 0; k < host_outs.size() / 2; ++k) {
    ASSERT_EQ(bits[k] & 0x7FC0, 0x7FC0) << "element " << k;
  }

  vd_capture_free(capture);
  vd_disconnect(vc);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(step);
  cudaFree(outs);
  cudaFree(staging);
  cudaFree(region);
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
}

}  // namespace
}  // namespace verifyd
