// The co-located data plane end to end on the GPU (issue 14's GPU tests): the real `verifyd`
// binary with the cuda backend, and this process as the scheduler. Its tensors and flags live in
// its own device memory, registered by CUDA IPC handle; its stream copies each layer's q and tree
// KV into place, writes the ready flag and waits for done, with the whole step (every layer)
// enqueued before the CPU looks at a result. Checked: prefill from device memory (Append naming a
// region), every output element against the float64 reference (ShadowModel), commits riding on
// layer 0 and commits through the channel, a failing call in the middle of a step (the step
// completes, that layer's outputs are NaN, the completion has the gRPC path's code), graphs on
// and off giving identical bytes; and a scheduler killed mid-step (its call waits on the device
// for a ready flag that never comes): its death releases the wait and closes its channel within a
// sweep, the lease frees its region, and another scheduler is served throughout.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/align.h"
#include "base/cuda_driver.h"
#include "client/channel.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/service/daemon_process.h"
#include "tests/service/shadow_model.h"
#include "tests/testing/test_seed.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

using testing::DaemonProcess;
using testing::ShadowModel;
using testing::VerifyPart;

constexpr int kLayers = 3;
constexpr int kHeads = 4;
constexpr float kScale = 0.0625f;  // ShadowModel's scale, given to the daemon too
constexpr uint64_t kRegionBytes = 8 << 20;

std::string Binary() { return testing::DaemonBinary(VERIFYD_BINARY); }

bool HaveCudaDevice() {
  int count = 0;
  const bool have = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return have;
}

int64_t TotalQ(const v1::VerifyRequest& r) {
  int64_t q = 0;
  for (const auto& s : r.sequences()) q += s.parents_size();
  return q;
}

// One call's tensors in the scheduler's region: layer l of a step uses slot l, an extra call
// slot kLayers.
struct Slot {
  uint64_t q, tree_kv, out, lse, end;
};
Slot SlotFor(int layer) {
  constexpr uint64_t kSlotBytes = 1 << 20;  // 64 nodes x 4 heads x 576 x 2 B fits many times
  Slot s;
  s.q = uint64_t(layer) * kSlotBytes;
  s.tree_kv = s.q + 64 * kHeads * kKvDim * 2;
  s.out = AlignTo256(s.tree_kv + 64 * kKvDim * 2);
  s.lse = AlignTo256(s.out + 64 * kHeads * kVDim * 2);
  s.end = AlignTo256(s.lse + 64 * kHeads * 4);
  return s;
}
constexpr uint64_t kReady = 7 << 20;
constexpr uint64_t kDone = kReady + 256;
constexpr uint64_t kAppendAt = 4 << 20;

// One Verify of a step: a layer's call, or an extra one that must fail (kTree: another tree than
// the pending one; kQ, kTreeKv: a value out of SPEC §1's bound there).
enum class Bad { kNone, kTree, kQ, kTreeKv };
struct Call {
  int layer, slot;
  v1::VerifyRequest request;
  Bad bad;
  std::string message;  // the gRPC path's answer to a value out of bound
};

// What one run of the scenario produced: every layer's out and lse bytes, in order.
struct RunResult {
  std::vector<std::string> outputs;
  int refused = 0;
};

class Scheduler {
 public:
  Scheduler(const std::string& socket, uint64_t seed) : model_(kLayers, kHeads, kScale, seed) {
    ClientOptions options;
    options.client_id = "gpu-scheduler";
    client_ = *Client::Connect(socket, options);
  }
  ~Scheduler() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (region_ != nullptr) cudaFree(region_);
    cudaFreeHost(host_);
  }

  void SetUp() {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&region_, kRegionBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(region_, 0, kRegionBytes), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&host_, kRegionBytes), cudaSuccess);
    cudaIpcMemHandle_t handle;
    ASSERT_EQ(cudaIpcGetMemHandle(&handle, region_), cudaSuccess);
    absl::StatusOr<v1::RegisterExternalMemoryResponse> reg = client_->RegisterExternalMemory(
        std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)), kRegionBytes);
    ASSERT_TRUE(reg.ok()) << reg.status();
    region_id_ = reg->region();
    absl::StatusOr<std::unique_ptr<Channel>> channel = client_->OpenChannel(16);
    ASSERT_TRUE(channel.ok()) << channel.status();
    channel_ = *std::move(channel);
    absl::StatusOr<const CudaDriverApi*> driver = GetCudaDriverApi();
    ASSERT_TRUE(driver.ok()) << driver.status();
    driver_ = *driver;
  }

  // Sequence 1 inline over gRPC; sequence 2 from the registered device region.
  void Prefill() {
    const v1::AppendRequest inline_append = model_.MakeAppend(1, 300);
    ASSERT_TRUE(client_->Append(inline_append).ok());
    model_.AcceptAppend(inline_append);
    v1::AppendRequest from_device = model_.MakeAppend(2, 41);
    const std::string& bytes = from_device.kv().inline_data();
    ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(region_) + kAppendAt, bytes.data(), bytes.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    v1::AppendRequest sent = from_device;
    sent.mutable_kv()->mutable_external_memory()->set_region(region_id_);
    sent.mutable_kv()->mutable_external_memory()->set_offset(kAppendAt);
    absl::StatusOr<v1::AppendResponse> appended = client_->Append(sent);
    ASSERT_TRUE(appended.ok()) << appended.status();
    model_.AcceptAppend(from_device);
    EXPECT_EQ(appended->committed_length(), 41u);
  }

  // Four steps of kLayers layers for sequences 1 and 2. In step 2 the middle layer's descriptor
  // names a different tree (the gRPC path answers FAILED_PRECONDITION): that call fails, the step
  // goes on.
  RunResult RunSteps() {
    RunResult result;
    std::map<uint64_t, std::vector<int32_t>> pending;
    uint32_t value = 0;
    uint64_t id = 0;
    for (int step = 0; step < 4; ++step) {
      std::vector<VerifyPart> parts;
      for (uint64_t seq : {1, 2}) {
        VerifyPart p;
        p.sequence = seq;
        if (pending.contains(seq) && step != 3) {
          p.commit_previous = model_.RandomPath(pending[seq]);
        }
        p.parents = model_.RandomParents(1 + static_cast<int>(model_.rng()() % 16));
        parts.push_back(p);
      }
      if (step == 3) {
        // Commits through the channel instead of riding on the Verify.
        for (uint64_t seq : {1, 2}) {
          const std::vector<int32_t> path = model_.RandomPath(pending[seq]);
          EXPECT_TRUE(channel_->EnqueueCommit({++id, seq, path}).ok());
          absl::StatusOr<Channel::Completion> c = channel_->WaitCompletion(absl::Seconds(30));
          EXPECT_TRUE(c.ok() && c->status.ok()) << c.status() << " " << c->status;
          model_.AcceptCommit(seq, path);
          EXPECT_EQ(c->committed_length, static_cast<uint64_t>(model_.committed_length(seq)));
        }
      }
      // The whole step is enqueued before anything is read back (the CPU runs a step ahead).
      // In step 2 an extra call after layer 1 names a different tree: it fails (the gRPC path's
      // FAILED_PRECONDITION), its outputs become NaN, and the rest of the step goes on.
      // SPEC §1 on the device: in step 0 (layer 0) and step 1 (layer 2) a call with a value out
      // of bound in tree_kv, resp. q, goes first, the layer's good call after it (the same tree
      // verified again): the bad one answers INVALID_ARGUMENT with the gRPC path's message and
      // NaN outputs, and the next step's riding commits are accepted.
      std::vector<Call> calls;
      for (int layer = 0; layer < kLayers; ++layer) {
        if (layer == 1) {
          for (VerifyPart& p : parts) p.commit_previous.reset();  // commits ride on layer 0
        }
        const bool lse = (step + layer) % 2 == 0;
        const v1::VerifyRequest request = model_.MakeVerify(layer, parts, lse);
        if ((step == 0 && layer == 0) || (step == 1 && layer == 2)) {
          calls.push_back(OutOfBound(request, layer, step == 0 ? Bad::kTreeKv : Bad::kQ));
        }
        calls.push_back({layer, layer, request, Bad::kNone, ""});
        if (step == 2 && layer == 1) calls.push_back({layer, kLayers, request, Bad::kTree, ""});
      }
      for (const Call& call : calls) {
        Channel::VerifyDescriptor d = Place(call.request, call.layer, call.slot, ++value, ++id);
        if (call.bad == Bad::kTree) d.sequences[0].parents.push_back(0);  // not the pending tree
        Status(channel_->EnqueueVerify(d));
      }
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << "the step's stream must finish";
      for (const Call& call : calls) {
        absl::StatusOr<Channel::Completion> c = channel_->WaitCompletion(absl::Seconds(30));
        EXPECT_TRUE(c.ok()) << c.status();
        const Slot s = SlotFor(call.slot);
        const int64_t tq = TotalQ(call.request);
        const auto* out = static_cast<const uint8_t*>(host_) + s.out;
        if (call.bad != Bad::kNone) {
          ++result.refused;
          if (call.bad == Bad::kTree) {
            EXPECT_EQ(c->status.code(), absl::StatusCode::kFailedPrecondition) << c->status;
          } else {
            EXPECT_EQ(c->status.code(), absl::StatusCode::kInvalidArgument) << c->status;
            EXPECT_EQ(c->status.message(), call.message);
          }
          const auto* v = reinterpret_cast<const uint16_t*>(out);
          // The wrong-tree call's tree has one node more than the pending one.
          const int64_t nodes = call.bad == Bad::kTree ? tq + 1 : tq;
          int64_t not_nan = 0;
          for (int64_t i = 0; i < nodes * kHeads * kVDim; ++i) {
            not_nan += (v[i] & 0x7F80) != 0x7F80 || (v[i] & 0x7F) == 0;
          }
          EXPECT_EQ(not_nan, 0) << "the failed call's outputs must all be NaN";
          continue;
        }
        const v1::VerifyRequest& request = call.request;
        EXPECT_TRUE(c->status.ok()) << "layer " << call.layer << ": " << c->status;
        model_.AcceptVerify(request);
        // What the channel wrote, in the gRPC answer's form, for the shared check.
        v1::VerifyResponse response;
        response.mutable_out()->set_dtype(v1::DTYPE_BF16);
        for (int64_t d : {tq, int64_t{kHeads}, int64_t{kVDim}})
          response.mutable_out()->add_shape(d);
        response.mutable_out()->set_inline_data(out, tq * kHeads * kVDim * 2);
        if (request.return_lse()) {
          response.mutable_lse()->set_dtype(v1::DTYPE_FP32);
          response.mutable_lse()->add_shape(tq);
          response.mutable_lse()->add_shape(kHeads);
          response.mutable_lse()->set_inline_data(static_cast<const uint8_t*>(host_) + s.lse,
                                                  tq * kHeads * 4);
        }
        for (const auto& seq : request.sequences()) {
          response.add_committed_length(
              static_cast<uint64_t>(model_.committed_length(seq.sequence_id())));
        }
        EXPECT_EQ(model_.CheckVerify(request, response), "")
            << "step " << step << " layer " << call.layer;
        result.outputs.push_back(response.out().inline_data() + response.lse().inline_data());
      }
      for (const VerifyPart& p : parts) pending[p.sequence] = p.parents;
    }
    return result;
  }

  // `request` with one value beyond SPEC §1's bound in q or tree_kv (an Inf, a NaN or a finite
  // value past 2^16, at a random element), as an extra call into slot kLayers, with the message
  // the gRPC path answers for it.
  Call OutOfBound(v1::VerifyRequest request, int layer, Bad bad) {
    const bool in_q = bad == Bad::kQ;
    v1::Tensor* t = in_q ? request.mutable_q() : request.mutable_tree_kv();
    std::string& bytes = *t->mutable_inline_data();
    const int64_t elements = static_cast<int64_t>(bytes.size() / 2);
    const uint16_t planted[] = {0x7F80, 0xFFC1, 0x4800};  // +Inf, a NaN, 131072
    const int64_t at = static_cast<int64_t>(model_.rng()() % elements);
    const uint16_t v = planted[model_.rng()() % 3];
    std::memcpy(bytes.data() + 2 * at, &v, 2);
    const std::vector<int64_t> shape(t->shape().begin(), t->shape().end());
    const std::string message =
        std::string(CheckValueBound(reinterpret_cast<const bf16_bits*>(bytes.data()), shape,
                                    in_q ? "q" : "tree_kv")
                        .message());
    return Call{layer, kLayers, std::move(request), bad, message};
  }

  void Close() {
    EXPECT_TRUE(channel_->Close().ok());
    EXPECT_TRUE(client_->ReleaseExternalMemory(region_id_).ok());
    absl::StatusOr<v1::StatsResponse> stats = client_->Stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->channels(), 0u);
    EXPECT_EQ(stats->external_regions(), 0u);
  }

 private:
  void Status(const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; }

  // Enqueues on the scheduler's stream: the layer's inputs into place, stale outputs, the ready
  // flag, the wait for done, the outputs back to the host. Returns the layer's descriptor.
  Channel::VerifyDescriptor Place(const v1::VerifyRequest& request, int layer, int slot,
                                  uint32_t value, uint64_t id) {
    const Slot s = SlotFor(slot);
    auto* base = static_cast<uint8_t*>(region_);
    auto* host = static_cast<uint8_t*>(host_);
    const std::string& q = request.q().inline_data();
    const std::string& kv = request.tree_kv().inline_data();
    std::memcpy(host + s.q, q.data(), q.size());
    std::memcpy(host + s.tree_kv, kv.data(), kv.size());
    Status(Cuda(
        cudaMemcpyAsync(base + s.q, host + s.q, s.out - s.q, cudaMemcpyHostToDevice, stream_)));
    Status(Cuda(cudaMemsetAsync(base + s.out, 0x11, s.end - s.out, stream_)));
    Status(Cu(driver_->stream_write_value32(stream_, reinterpret_cast<CUdeviceptr>(base + kReady),
                                            value, 0)));
    Status(Cu(driver_->stream_wait_value32(stream_, reinterpret_cast<CUdeviceptr>(base + kDone),
                                           value, CU_STREAM_WAIT_VALUE_GEQ)));
    Status(Cuda(cudaMemcpyAsync(host + s.out, base + s.out, s.end - s.out, cudaMemcpyDeviceToHost,
                                stream_)));
    Channel::VerifyDescriptor d;
    d.id = id;
    d.layer = static_cast<uint32_t>(layer);
    for (const auto& seq : request.sequences()) {
      Channel::Sequence cs;
      cs.sequence_id = seq.sequence_id();
      cs.parents.assign(seq.parents().begin(), seq.parents().end());
      if (seq.has_commit_previous()) {
        cs.commit_previous.emplace(seq.commit_previous().accepted_path().begin(),
                                   seq.commit_previous().accepted_path().end());
      }
      d.sequences.push_back(std::move(cs));
    }
    d.q = {region_id_, s.q};
    d.tree_kv = {region_id_, s.tree_kv};
    d.out = {region_id_, s.out};
    d.return_lse = request.return_lse();
    if (d.return_lse) d.lse = {region_id_, s.lse};
    d.ready = {region_id_, kReady, value};
    d.done = {region_id_, kDone, value};
    return d;
  }
  static absl::Status Cuda(cudaError_t e) {
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  }
  static absl::Status Cu(CUresult r) {
    return r == CUDA_SUCCESS ? absl::OkStatus()
                             : absl::InternalError(absl::StrCat("CUresult ", static_cast<int>(r)));
  }

  ShadowModel model_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Channel> channel_;
  const CudaDriverApi* driver_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* region_ = nullptr;
  void* host_ = nullptr;
  uint64_t region_id_ = 0;
};

// The daemon both tests start: this bundle's verifyd on cuda, the scheduler's dimensions.
std::vector<std::string> DaemonArgs(const std::string& socket, const std::string& extra) {
  return {"--backend=cuda",
          absl::StrCat("--listen=unix://", socket),
          "--metrics=",
          absl::StrCat("--layers=", kLayers),
          absl::StrCat("--heads=", kHeads),
          absl::StrCat("--softmax-scale=", kScale),
          "--max-tree-nodes=64",
          "--kv-capacity-tokens=8192",
          extra};
}

RunResult RunAgainstDaemon(bool graphs, uint64_t seed) {
  const std::string socket = absl::StrCat("/tmp/verifyd-dp-gpu-", getpid(), graphs ? "-g" : "-e");
  std::string error;
  std::unique_ptr<DaemonProcess> daemon = DaemonProcess::Start(
      Binary(), DaemonArgs(socket, absl::StrCat("--cuda-graphs=", graphs ? "on" : "off")), &error);
  EXPECT_NE(daemon, nullptr) << error;
  if (daemon == nullptr) return {};
  EXPECT_NE(daemon->startup_line().find("backend=cuda"), std::string::npos)
      << daemon->startup_line();
  Scheduler scheduler(absl::StrCat("unix://", socket), static_cast<uint32_t>(seed));
  scheduler.SetUp();
  if (::testing::Test::HasFatalFailure()) return {};
  scheduler.Prefill();
  if (::testing::Test::HasFatalFailure()) return {};
  RunResult result = scheduler.RunSteps();
  scheduler.Close();
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
  return result;
}

TEST(DataPlaneGpuTest, StreamOrderedStepsMatchFloat64AndGraphsOnAndOffAgree) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("VERIFYD_TEST_SEED=", seed));
  const RunResult with_graphs = RunAgainstDaemon(true, seed);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(with_graphs.refused, 3);
  EXPECT_EQ(with_graphs.outputs.size(), size_t{4 * kLayers});
  const RunResult eager = RunAgainstDaemon(false, seed);
  ASSERT_EQ(eager.outputs.size(), with_graphs.outputs.size());
  for (size_t i = 0; i < eager.outputs.size(); ++i) {
    EXPECT_TRUE(eager.outputs[i] == with_graphs.outputs[i]) << "call " << i;
  }
}

// The dying scheduler (this binary again, DYING_SCHEDULER=<socket>): registers memory, opens a
// channel, enqueues one Verify whose ready flag it never writes, says so, and waits to be killed.
int RunDyingScheduler(const std::string& socket) {
  ClientOptions options;
  options.client_id = "dying-scheduler";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket, options);
  void* region = nullptr;
  if (!client.ok() || cudaMalloc(&region, 1 << 20) != cudaSuccess) return 2;
  cudaIpcMemHandle_t handle;
  if (cudaIpcGetMemHandle(&handle, region) != cudaSuccess) return 3;
  absl::StatusOr<v1::RegisterExternalMemoryResponse> reg = (*client)->RegisterExternalMemory(
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)), 1 << 20);
  if (!reg.ok()) return 4;
  absl::StatusOr<std::unique_ptr<Channel>> channel = (*client)->OpenChannel(4);
  if (!channel.ok()) return 5;
  ShadowModel model(kLayers, kHeads, kScale, 5);
  const v1::AppendRequest append = model.MakeAppend(9, 100);
  if (!(*client)->Append(append).ok()) return 6;
  Channel::VerifyDescriptor d;
  d.id = 1;
  d.layer = 0;
  d.sequences.push_back({9, {-1, 0}, std::nullopt});
  d.q = {reg->region(), 0};
  d.tree_kv = {reg->region(), 65536};
  d.out = {reg->region(), 131072};
  d.ready = {reg->region(), 512 << 10, 1};  // never written
  d.done = {reg->region(), (512 << 10) + 256, 1};
  if (!(*channel)->EnqueueVerify(d).ok()) return 7;
  std::printf("enqueued\n");
  std::fflush(stdout);
  pause();
  return 0;
}

// Once the reproduction of a deadlock (plans/0018): the executor launched a kernel for the first
// time behind the dead call's device wait, lazy module loading waited for the device while holding
// the driver's lock, and the sweeper's release needed that lock. The daemon now loads its kernels
// at start, and the scheduler's death is seen through its lock on the ring.
TEST(DataPlaneGpuTest, AKilledSchedulersWaitIsReleasedAndOthersAreServed) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("VERIFYD_TEST_SEED=", seed));
  const std::string socket = absl::StrCat("/tmp/verifyd-dp-kill-", getpid());
  std::string error;
  std::unique_ptr<DaemonProcess> daemon =
      DaemonProcess::Start(Binary(), DaemonArgs(socket, "--lease-seconds=6"), &error);
  ASSERT_NE(daemon, nullptr) << error;
  // The dying scheduler: this binary in a fresh process (CUDA does not survive a fork).
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  const std::string command =
      absl::StrCat("DYING_SCHEDULER=unix://", socket, " ", self, " --gtest_filter=none & echo $!");
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  char line[128] = {};
  ASSERT_NE(fgets(line, sizeof(line), out), nullptr);
  const int pid = std::atoi(line);
  ASSERT_GT(pid, 0);
  ASSERT_NE(fgets(line, sizeof(line), out), nullptr) << "the dying scheduler said nothing";
  ASSERT_EQ(std::string(line), "enqueued\n");
  kill(pid, SIGKILL);
  pclose(out);
  const absl::Time killed = absl::Now();
  std::printf("killed the scheduler (pid %d); daemon pid %d\n", pid, daemon->pid());
  std::fflush(stdout);

  // Another scheduler, served while the dead one's call waits and after the lease ends it.
  ClientOptions options;
  options.client_id = "survivor";
  std::unique_ptr<Client> client = *Client::Connect(absl::StrCat("unix://", socket), options);
  ShadowModel model(kLayers, kHeads, kScale, static_cast<uint32_t>(seed));
  // Served long before the lease (6 s) ends: the scheduler's death is seen within a sweep of
  // the tables (250 ms) through its lock on the channel's ring; its region goes with the lease.
  const absl::Duration bound = absl::Seconds(3);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  v1::StatsResponse stats;
  bool first = true;
  do {
    absl::SleepFor(absl::Milliseconds(250));
    absl::StatusOr<v1::StatsResponse> s = client->Stats(CallOptions{.deadline = absl::Seconds(15)});
    ASSERT_TRUE(s.ok()) << s.status() << " after " << (absl::Now() - killed);
    if (first) {
      std::printf("first Stats answered %s after the kill\n",
                  absl::FormatDuration(absl::Now() - killed).c_str());
      EXPECT_LE(absl::Now() - killed, bound) << "another client waited for the dead one";
      first = false;
    }
    stats = *s;
  } while ((stats.channels() > 0 || stats.external_regions() > 0) && absl::Now() < deadline);
  const v1::AppendRequest append = model.MakeAppend(1, 200);
  const absl::StatusOr<v1::AppendResponse> appended =
      client->Append(append, CallOptions{.deadline = absl::Seconds(10)});
  ASSERT_TRUE(appended.ok()) << appended.status();
  model.AcceptAppend(append);
  EXPECT_EQ(stats.channels(), 0u) << "the dead scheduler's channel outlived its lease";
  EXPECT_EQ(stats.external_regions(), 0u) << "the dead scheduler's region outlived its lease";
  // The device stream went on past the released wait: this Verify computes and is right.
  std::vector<VerifyPart> parts = {VerifyPart{1, model.RandomParents(5), std::nullopt}};
  for (int layer = 0; layer < kLayers; ++layer) {
    const v1::VerifyRequest request = model.MakeVerify(layer, parts, true);
    absl::StatusOr<v1::VerifyResponse> response =
        client->Verify(request, CallOptions{.deadline = absl::Seconds(20)});
    ASSERT_TRUE(response.ok()) << response.status();
    model.AcceptVerify(request);
    EXPECT_EQ(model.CheckVerify(request, *response), "") << "layer " << layer;
  }
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
}

}  // namespace
}  // namespace verifyd

// gtest_main's, plus the dying scheduler's role.
int main(int argc, char** argv) {
  if (const char* socket = std::getenv("DYING_SCHEDULER"); socket != nullptr) {
    return verifyd::RunDyingScheduler(socket);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
