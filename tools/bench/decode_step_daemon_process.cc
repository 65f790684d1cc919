#include "tools/bench/decode_step_daemon_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "tools/bench/decode_step_fill.h"
#include "verify/mla_dims.h"

namespace verifyd::decode_step {
namespace {

constexpr int kPrefillChunk = 8192;  // tokens per Append (x layers x 1152 bytes in one region)

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const std::string& path, const Dims& d,
                                                      bool graphs,
                                                      const std::string& flash_kernel) {
  auto daemon = std::unique_ptr<Daemon>(new Daemon());
  daemon->socket_ = absl::StrCat("/tmp/verifyd-decode-step-", getpid(), ".sock");
  std::vector<std::string> args = {path,
                                   "--backend=cuda",
                                   absl::StrCat("--listen=", daemon->target()),
                                   "--metrics=",
                                   absl::StrCat("--layers=", d.layers),
                                   absl::StrCat("--heads=", d.heads),
                                   absl::StrCat("--max-tree-nodes=", std::max(d.nodes, 64)),
                                   absl::StrCat("--kv-capacity-tokens=", d.capacity()),
                                   absl::StrCat("--cuda-graphs=", graphs ? "on" : "off"),
                                   absl::StrCat("--flash-kernel=", flash_kernel),
                                   "--drain-seconds=1"};
  daemon->pid_ = fork();
  if (daemon->pid_ < 0) return absl::InternalError("fork failed");
  if (daemon->pid_ == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  ClientOptions options;
  options.client_id = "decode-step-bench";
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon->target(), options);
    if (client.ok() && (*client)->Stats().ok()) {
      daemon->client_ = *std::move(client);
      return daemon;
    }
    int status = 0;
    if (waitpid(daemon->pid_, &status, WNOHANG) == daemon->pid_) {
      daemon->pid_ = -1;
      return absl::InternalError(absl::StrCat(path, " exited (status ", status, ") at start"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError("the daemon did not answer Stats within 120 s");
}

Daemon::~Daemon() {
  client_.reset();
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
}

std::string Daemon::target() const { return absl::StrCat("unix://", socket_); }

absl::StatusOr<uint64_t> Register(Client& client, void* device_memory, uint64_t bytes) {
  cudaIpcMemHandle_t handle;
  VERIFYD_CUDA_CHECK(cudaIpcGetMemHandle(&handle, device_memory));
  VERIFYD_ASSIGN_OR_RETURN(
      v1::RegisterExternalMemoryResponse registered,
      client.RegisterExternalMemory(
          std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)), bytes));
  return registered.region();
}

absl::Status Prefill(Client& client, const Dims& d, cudaStream_t stream) {
  const uint64_t bytes = uint64_t{kPrefillChunk} * d.layers * kKvDim * 2;
  void* chunk = nullptr;
  VERIFYD_CUDA_CHECK(cudaMalloc(&chunk, bytes));
  VERIFYD_RETURN_IF_ERROR(FillRandom(chunk, static_cast<int64_t>(bytes / 2), 7, 1.f, stream));
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(stream));
  VERIFYD_ASSIGN_OR_RETURN(uint64_t region, Register(client, chunk, bytes));
  for (int at = 0; at < d.prefix; at += kPrefillChunk) {
    const int tokens = std::min(kPrefillChunk, d.prefix - at);
    v1::AppendRequest request;
    request.set_sequence_id(kSequence);
    request.set_layer_begin(0);
    if (at == 0) {
      request.set_create(true);
    } else {
      request.set_expected_fill(static_cast<uint64_t>(at));
    }
    v1::Tensor* kv = request.mutable_kv();
    kv->set_dtype(v1::DTYPE_BF16);
    kv->add_shape(d.layers);
    kv->add_shape(tokens);
    kv->add_shape(kKvDim);
    kv->mutable_external_memory()->set_region(region);
    kv->mutable_external_memory()->set_offset(0);
    VERIFYD_RETURN_IF_ERROR(client.Append(request).status());
  }
  VERIFYD_RETURN_IF_ERROR(client.ReleaseExternalMemory(region).status());
  VERIFYD_CUDA_CHECK(cudaFree(chunk));
  return absl::OkStatus();
}

}  // namespace verifyd::decode_step
