// The decode-step bench of SPEC §5 / issue 14: a fake model on the same GPU as verifyd's CUDA
// backend. Per layer the model runs its own GPU work (a bf16 GEMM of ~50 µs, cuBLAS) and then
// Verify for that layer (the tree KV written into the pool, attention over L prefix tokens + the
// tree); after the last layer, a commit (the accepted tree slots join the prefix, fresh tree slots
// for the next step). Ways, all measured in this one run (ratios are against the in-process way
// of the same run):
//   model only       the GEMMs alone (what the model costs without attention)
//   in-process       one process, one stream: the GEMM and ComputeVerifyExternal on the
//                    backend's stream (the lower bound: no flags, no second context)
//   in-process+flags one process, two streams ordered by device-memory flags (the flag cost alone)
//   two processes    the model process owns q / tree KV / out / lse / flags (CUDA IPC); a server
//                    process (this binary, --role=server) opens them and enqueues every layer's
//                    ComputeVerifyExternal ahead; the streams order each other through the flags:
//                    the co-located data plane's device-tensor + stream-order way, driven directly
//                    (the channel will feed the same calls)
// each with graphs on and off; then through a verifyd daemon (decode_step_daemon.h), the last
// ways with the whole step captured once in a CUDA graph and replayed (decode_step_captured.h).
// Run it once plain and once under MPS (tools/device/dataplane_gpu.sh);
// the server inherits the environment, so both processes are MPS clients or neither.
// Prints one table: ms per step, p50 / p99 of the per-layer time (CUDA events on the model's
// stream between consecutive layers), ÷ in-process, per-layer cost over in-process.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kv_storage.h"
#include "base/cuda_check.h"
#include "base/cuda_driver.h"
#include "base/status_macros.h"
#include "tools/bench/decode_step_captured.h"
#include "tools/bench/decode_step_daemon.h"
#include "tools/bench/decode_step_fill.h"
#include "tools/bench/decode_step_model.h"
#include "verify/kv_dtype.h"
#include "verify/mla_dims.h"
#include "verify/tree_mask.h"

ABSL_FLAG(int, layers, 61, "model layers");
ABSL_FLAG(int, prefix, 185000, "L: committed tokens at the first step");
ABSL_FLAG(int, nodes, 16, "Q: tree nodes per step");
ABSL_FLAG(int, heads, 8, "H");
ABSL_FLAG(int, accept, 4, "tree nodes accepted per step (join the prefix at the commit)");
ABSL_FLAG(int, steps, 40, "timed decode steps per way");
ABSL_FLAG(std::string, flash_kernel, "auto",
          "auto|portable: every way's flash kernel (portable: the one sm_120 runs; the daemon "
          "ways pass it as the daemon's --flash-kernel)");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "bf16|fp8: the in-process ways' pool (fp8: DeepSeek's 656-byte rows, read by either "
          "kernel); the daemon ways run bf16 only");
ABSL_FLAG(int, warmup, 5, "untimed steps first (graph warm-up and capture)");
ABSL_FLAG(int, gemm_n, 1024, "the model GEMM is 4096 x gemm_n x 4096 bf16 (1024: ~50 us)");
ABSL_FLAG(std::string, ways,
          "model,inproc,flags,twoproc,grpc,shm,channel,stream,captured,captured_inplace",
          "ways to run, comma-separated (grpc, shm, channel, stream, captured, captured_inplace: "
          "through a verifyd daemon; captured: the step captured once in a CUDA graph, each "
          "layer's tensors copied into the bucket and back; captured_inplace: the same on the "
          "bucket in place)");
ABSL_FLAG(std::string, verifyd, "",
          "the verifyd binary for the daemon ways (default: verifyd next to this binary)");
ABSL_FLAG(std::string, captured_engine, "",
          "the captured ways' engine process (default: decode_step_captured_engine next to this "
          "binary)");
ABSL_FLAG(std::string, role, "model", "model | server (internal: the two-process way's server)");
ABSL_FLAG(std::string, handle, "", "server: the region's IPC handle, hex");
ABSL_FLAG(bool, graphs, true, "server: CUDA graphs");

namespace verifyd {
namespace {

using namespace decode_step;  // NOLINT: the bench's own model pieces

Dims ReadDims() {
  return Dims{absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_prefix), absl::GetFlag(FLAGS_nodes),
              absl::GetFlag(FLAGS_heads),  absl::GetFlag(FLAGS_accept), absl::GetFlag(FLAGS_steps),
              absl::GetFlag(FLAGS_warmup)};
}

// verifyd's side: the backend, its pool (prefilled on the device), one sequence's slot lists and
// tree, and the per-layer call.
class VerifySide {
 public:
  absl::Status Init(const Dims& d, bool graphs) {
    d_ = d;
    CudaBackendOptions options;
    options.cuda_graphs = graphs;
    options.flash_path =
        absl::GetFlag(FLAGS_flash_kernel) == "portable" ? FlashPath::kPortable : FlashPath::kAuto;
    VERIFYD_ASSIGN_OR_RETURN(backend_, CudaBackend::Create(options));
    const bool fp8 = absl::GetFlag(FLAGS_kv_dtype) == "fp8";
    VERIFYD_ASSIGN_OR_RETURN(
        storage_,
        backend_->CreateStorage(d.layers, d.capacity(), fp8 ? KvDtype::kFp8 : KvDtype::kBf16));
    auto& cuda_storage = static_cast<CudaKvStorage&>(*storage_);
    // Prefill: the KV of L tokens × every layer comes from device memory (never the host).
    if (fp8) {
      VERIFYD_RETURN_IF_ERROR(
          FillRandomFp8Rows(const_cast<uint8_t*>(cuda_storage.layer_device_bytes(0)),
                            d.layers * d.capacity(), 7, backend_->stream().get()));
    } else {
      VERIFYD_RETURN_IF_ERROR(FillRandom(const_cast<bf16_bits*>(cuda_storage.layer_device_data(0)),
                                         d.layers * d.capacity() * kKvDim, 7, 1.f,
                                         backend_->stream().get()));
    }
    for (int t = 0; t < d.prefix; ++t) prefix_.push_back(next_slot_++);
    NewTree();
    // A random tree, the same every step (its shape does not change the kernel time).
    std::vector<int32_t> parents(d.nodes);
    for (int i = 0; i < d.nodes; ++i) parents[i] = i == 0 ? -1 : (i * 7 + 3) % i;
    VERIFYD_ASSIGN_OR_RETURN(TreeMask mask, TreeMask::FromParents(parents, d.nodes));
    mask_bits_ = mask.bits();
    qo_indptr_ = {0, d.nodes};
    mask_indptr_ = {0, static_cast<int32_t>(mask_bits_.size())};
    return backend_->stream().Synchronize();
  }
  // One layer on tensors at `base` + the region's offsets; flags null in the one-stream way.
  absl::Status Enqueue(int layer, uint8_t* base, const Region& r, uint32_t value, bool flags) {
    ExternalVerify call;
    call.layer = layer;
    VerifyProblem& p = call.problem;
    p.q = reinterpret_cast<const bf16_bits*>(base + r.q[layer]);
    p.out = reinterpret_cast<bf16_bits*>(base + r.out[layer]);
    p.lse = reinterpret_cast<float*>(base + r.lse[layer]);
    p.num_heads = d_.heads;
    p.scale = 1.f / std::sqrt(192.f);
    p.batch = 1;
    p.total_q = d_.nodes;
    p.qo_indptr = qo_indptr_.data();
    prefix_len_ = static_cast<int32_t>(prefix_.size());
    p.prefix_len = &prefix_len_;
    p.mask_indptr = mask_indptr_.data();
    p.mask_bits = mask_bits_.data();
    call.tree_kv = reinterpret_cast<const bf16_bits*>(base + r.kv[layer]);
    call.tree_slots = tree_;
    if (flags) {
      call.order.ready = {reinterpret_cast<uint32_t*>(base + r.ready), value};
      call.order.done = {reinterpret_cast<uint32_t*>(base + r.done), value};
    }
    const VerifySlotList list{1, 1, prefix_, tree_};
    return backend_->ComputeVerifyExternal(call, absl::MakeConstSpan(&list, 1));
  }
  // The step's commit: the first `accept` tree nodes join the prefix; a fresh tree follows.
  void Commit() {
    prefix_.insert(prefix_.end(), tree_.begin(), tree_.begin() + d_.accept);
    NewTree();
  }
  CudaBackend& backend() { return *backend_; }
  std::string Stats() const {
    const CudaBackendPhaseTimes& t = backend_->phase_times();
    const double calls = std::max<int64_t>(t.calls, 1);
    return absl::StrFormat(
        "host per call %.1f us (check %.1f plan %.1f stage %.1f enqueue %.1f); graphs: %d "
        "replays, %d captures, %d updates; eager %d; staging waits %d",
        (t.check_ns + t.plan_ns + t.stage_ns + t.enqueue_ns) / calls / 1e3,
        t.check_ns / calls / 1e3, t.plan_ns / calls / 1e3, t.stage_ns / calls / 1e3,
        t.enqueue_ns / calls / 1e3, static_cast<int>(backend_->graph_counters().replays),
        static_cast<int>(backend_->graph_counters().captures),
        static_cast<int>(backend_->graph_counters().updates),
        static_cast<int>(backend_->eager_runs()),
        static_cast<int>(backend_->external_counters().staging_waits));
  }

 private:
  void NewTree() {
    tree_.clear();
    for (int i = 0; i < d_.nodes; ++i) tree_.push_back(next_slot_++);
  }
  Dims d_{};
  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<KvStorage> storage_;
  std::vector<int32_t> prefix_, tree_, qo_indptr_, mask_indptr_;
  std::vector<uint64_t> mask_bits_;
  int32_t prefix_len_ = 0;
  int32_t next_slot_ = 0;
};

// One stream (flags=false: the backend's) or two (flags=true: the model's own, ordered by flags).
absl::StatusOr<Timing> RunInProcess(const Dims& d, bool graphs, bool flags, bool with_verify) {
  VerifySide side;
  VERIFYD_RETURN_IF_ERROR(side.Init(d, graphs));
  cudaStream_t verify_stream = side.backend().stream().get();
  cudaStream_t model = verify_stream;
  if (flags) VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&model, cudaStreamNonBlocking));
  const Region r = LayOut(d);
  VERIFYD_ASSIGN_OR_RETURN(uint8_t * base, MakeModelRegion(d, r, model));
  VERIFYD_ASSIGN_OR_RETURN(const CudaDriverApi* driver, GetCudaDriverApi());
  Gemm gemm;
  VERIFYD_RETURN_IF_ERROR(gemm.Init(absl::GetFlag(FLAGS_gemm_n), model));
  LayerClock clock;
  VERIFYD_RETURN_IF_ERROR(clock.Init(d));
  size_t mark = 0;
  for (int s = 0; s < d.total_steps(); ++s) {
    const bool timed = s >= d.warmup;
    if (s == d.warmup) VERIFYD_RETURN_IF_ERROR(clock.Mark(mark++, model));
    for (int l = 0; l < d.layers; ++l) {
      const uint32_t value = static_cast<uint32_t>(s * d.layers + l + 1);
      VERIFYD_RETURN_IF_ERROR(gemm.Run(model));
      if (with_verify) {
        if (flags) {
          VERIFYD_CU_CHECK(driver->stream_write_value32(
              model, reinterpret_cast<CUdeviceptr>(base + r.ready), value, 0));
        }
        VERIFYD_RETURN_IF_ERROR(side.Enqueue(l, base, r, value, flags));
        if (flags) {
          VERIFYD_CU_CHECK(driver->stream_wait_value32(model,
                                                       reinterpret_cast<CUdeviceptr>(base + r.done),
                                                       value, CU_STREAM_WAIT_VALUE_GEQ));
        }
      }
      if (timed) VERIFYD_RETURN_IF_ERROR(clock.Mark(mark++, model));
    }
    side.Commit();
  }
  VERIFYD_ASSIGN_OR_RETURN(Timing t, clock.Read(d));
  VERIFYD_CUDA_CHECK(cudaDeviceSynchronize());
  if (with_verify) std::fprintf(stderr, "  verifyd side: %s\n", side.Stats().c_str());
  VERIFYD_CUDA_CHECK(cudaFree(base));
  if (flags) VERIFYD_CUDA_CHECK(cudaStreamDestroy(model));
  return t;
}

std::string Hex(const void* data, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    absl::StrAppend(&s, absl::Hex(static_cast<const uint8_t*>(data)[i], absl::kZeroPad2));
  return s;
}

// The two-process way: this process is the model; a server process serves Verify.
absl::StatusOr<Timing> RunTwoProcesses(const Dims& d, bool graphs, const char* self) {
  cudaStream_t model;
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&model, cudaStreamNonBlocking));
  const Region r = LayOut(d);
  VERIFYD_ASSIGN_OR_RETURN(uint8_t * base, MakeModelRegion(d, r, model));
  cudaIpcMemHandle_t ipc;
  VERIFYD_CUDA_CHECK(cudaIpcGetMemHandle(&ipc, base));
  VERIFYD_ASSIGN_OR_RETURN(const CudaDriverApi* driver, GetCudaDriverApi());
  Gemm gemm;
  VERIFYD_RETURN_IF_ERROR(gemm.Init(absl::GetFlag(FLAGS_gemm_n), model));
  LayerClock clock;
  VERIFYD_RETURN_IF_ERROR(clock.Init(d));

  int up[2];
  if (pipe(up) != 0) return absl::InternalError("pipe failed");
  std::vector<std::string> args = {self,
                                   "--role=server",
                                   absl::StrCat("--handle=", Hex(&ipc, sizeof(ipc))),
                                   absl::StrCat("--graphs=", graphs),
                                   absl::StrCat("--kv_dtype=", absl::GetFlag(FLAGS_kv_dtype)),
                                   absl::StrCat("--layers=", d.layers),
                                   absl::StrCat("--prefix=", d.prefix),
                                   absl::StrCat("--nodes=", d.nodes),
                                   absl::StrCat("--heads=", d.heads),
                                   absl::StrCat("--accept=", d.accept),
                                   absl::StrCat("--steps=", d.steps),
                                   absl::StrCat("--warmup=", d.warmup)};
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(up[1], STDOUT_FILENO);
    close(up[0]), close(up[1]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(self, argv.data());
    _exit(127);
  }
  close(up[1]);
  // The server says "ready" once its pool is prefilled and the region open.
  char line[64] = {};
  size_t got = 0;
  while (got < sizeof(line) - 1 && read(up[0], line + got, 1) == 1 && line[got] != '\n') ++got;
  close(up[0]);
  if (std::strncmp(line, "ready", 5) != 0) {
    waitpid(pid, nullptr, 0);
    return absl::InternalError(absl::StrCat("the server did not start: '", line, "'"));
  }
  size_t mark = 0;
  for (int s = 0; s < d.total_steps(); ++s) {
    if (s == d.warmup) VERIFYD_RETURN_IF_ERROR(clock.Mark(mark++, model));
    for (int l = 0; l < d.layers; ++l) {
      const uint32_t value = static_cast<uint32_t>(s * d.layers + l + 1);
      VERIFYD_RETURN_IF_ERROR(gemm.Run(model));
      VERIFYD_CU_CHECK(driver->stream_write_value32(
          model, reinterpret_cast<CUdeviceptr>(base + r.ready), value, 0));
      VERIFYD_CU_CHECK(driver->stream_wait_value32(
          model, reinterpret_cast<CUdeviceptr>(base + r.done), value, CU_STREAM_WAIT_VALUE_GEQ));
      if (s >= d.warmup) VERIFYD_RETURN_IF_ERROR(clock.Mark(mark++, model));
    }
  }
  VERIFYD_ASSIGN_OR_RETURN(Timing t, clock.Read(d));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("the server failed (status ", status, ")"));
  }
  VERIFYD_CUDA_CHECK(cudaFree(base));
  VERIFYD_CUDA_CHECK(cudaStreamDestroy(model));
  return t;
}

int Server() {
  const Dims d = ReadDims();
  const std::string hex = absl::GetFlag(FLAGS_handle);
  std::string raw;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    raw.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  VerifySide side;
  BENCH_CHECK(side.Init(d, absl::GetFlag(FLAGS_graphs)));
  const Region r = LayOut(d);
  absl::StatusOr<std::unique_ptr<ExternalRegion>> region =
      side.backend().OpenExternalRegion({raw, r.bytes, 0});
  BENCH_CHECK(region.status());
  auto* base = static_cast<uint8_t*>((*region)->data());
  std::printf("ready\n");
  std::fflush(stdout);
  for (int s = 0; s < d.total_steps(); ++s) {
    for (int l = 0; l < d.layers; ++l) {
      BENCH_CHECK(side.Enqueue(l, base, r, static_cast<uint32_t>(s * d.layers + l + 1), true));
    }
    side.Commit();
  }
  BENCH_CHECK(side.backend().stream().Synchronize());
  std::fprintf(stderr, "  verifyd side: %s\n", side.Stats().c_str());
  return 0;
}

struct Row {
  std::string way;
  Timing t;
};

int Model(const char* self) {
  const Dims d = ReadDims();
  if (absl::GetFlag(FLAGS_kv_dtype) != "bf16" && absl::GetFlag(FLAGS_kv_dtype) != "fp8") {
    std::fprintf(stderr, "--kv_dtype=%s: must be bf16 or fp8\n",
                 absl::GetFlag(FLAGS_kv_dtype).c_str());
    return 2;
  }
  absl::StatusOr<bool> mps = MpsActive(0);
  BENCH_CHECK(mps.status());
  std::printf(
      "decode_step_bench: layers %d, B=1, H=%d, Q=%d, L=%d (+%d per step), %d timed steps "
      "after %d; MPS %s; kv %s\n",
      d.layers, d.heads, d.nodes, d.prefix, d.accept, d.steps, d.warmup, *mps ? "on" : "off",
      absl::GetFlag(FLAGS_kv_dtype).c_str());
  std::fflush(stdout);
  const absl::flat_hash_set<std::string> ways =
      absl::StrSplit(absl::GetFlag(FLAGS_ways), ',', absl::SkipWhitespace());
  auto wants = [&](const char* w) { return ways.contains(w); };
  std::vector<Row> rows;
  auto run = [&](const std::string& name, absl::StatusOr<Timing> t) {
    if (!t.ok()) {
      std::printf("%-28s failed: %s\n", name.c_str(), t.status().ToString().c_str());
      return;
    }
    rows.push_back({name, *t});
    std::fprintf(stderr, "%-28s %.3f ms/step\n", name.c_str(), t->ms_per_step);
  };
  if (wants("model")) run("model only (GEMMs)", RunInProcess(d, true, false, false));
  for (const bool graphs : {true, false}) {
    const char* g = graphs ? "graphs" : "eager";
    if (wants("inproc")) {
      run(absl::StrCat("in-process, ", g), RunInProcess(d, graphs, false, true));
    }
    if (wants("flags")) {
      run(absl::StrCat("in-process+flags, ", g), RunInProcess(d, graphs, true, true));
    }
    if (wants("twoproc")) run(absl::StrCat("two processes, ", g), RunTwoProcesses(d, graphs, self));
  }
  // Through a daemon (graphs on, as deployed): what a scheduler process reaches.
  const std::string dir = std::string(self).substr(0, std::string(self).rfind('/') + 1);
  std::string verifyd = absl::GetFlag(FLAGS_verifyd);
  if (verifyd.empty()) verifyd = dir + "verifyd";
  std::string engine = absl::GetFlag(FLAGS_captured_engine);
  if (engine.empty()) engine = dir + "decode_step_captured_engine";
  const std::pair<const char*, DaemonWay> daemon_ways[] = {
      {"grpc", DaemonWay::kGrpcInline},
      {"shm", DaemonWay::kGrpcSharedMemory},
      {"channel", DaemonWay::kChannelCpuWaits},
      {"stream", DaemonWay::kChannelStreamOrder}};
  for (const auto& [flag, way] : daemon_ways) {
    if (wants(flag) && absl::GetFlag(FLAGS_kv_dtype) != "bf16") {
      std::printf("%-28s skipped: the daemon ways prefill bf16 rows; --kv_dtype=bf16 runs them\n",
                  DaemonWayName(way));
      continue;
    }
    if (wants(flag))
      run(DaemonWayName(way),
          RunThroughDaemon(d, way, true, verifyd, absl::GetFlag(FLAGS_flash_kernel)));
  }
  const std::pair<const char*, CapturedIo> captured_ways[] = {
      {"captured", CapturedIo::kBucketCopies}, {"captured_inplace", CapturedIo::kInPlace}};
  for (const auto& [flag, io] : captured_ways) {
    if (!wants(flag)) continue;
    if (absl::GetFlag(FLAGS_kv_dtype) != "bf16") {
      std::printf("%-28s skipped: the daemon ways prefill bf16 rows; --kv_dtype=bf16 runs them\n",
                  CapturedWayName(io));
      continue;
    }
    run(CapturedWayName(io),
        RunCaptured(d, io, verifyd, engine, absl::GetFlag(FLAGS_flash_kernel)));
  }
  // Ratios against the in-process way with graphs of this run.
  const Row* base = nullptr;
  for (const Row& row : rows) {
    if (row.way == "in-process, graphs") base = &row;
  }
  std::printf(
      "\n| way (MPS %s) | ms/step | layer p50 µs | layer p99 µs | ÷ in-process | "
      "per-layer over in-process µs |\n|---|---|---|---|---|---|\n",
      *mps ? "on" : "off");
  for (const Row& row : rows) {
    std::printf("| %s | %.3f | %.1f | %.1f | ", row.way.c_str(), row.t.ms_per_step, row.t.p50_us,
                row.t.p99_us);
    if (base != nullptr) {
      std::printf("%.3f | %+.1f |\n", row.t.ms_per_step / base->t.ms_per_step,
                  (row.t.ms_per_step - base->t.ms_per_step) * 1e3 / d.layers);
    } else {
      std::printf("- | - |\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace verifyd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "decode_step_bench: needs a CUDA device (%s)\n",
                 counted != cudaSuccess ? cudaGetErrorString(counted) : "none found");
    return 1;
  }
  if (absl::GetFlag(FLAGS_role) == "server") return verifyd::Server();
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  return verifyd::Model(self);
}
