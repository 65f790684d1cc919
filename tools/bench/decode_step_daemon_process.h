// The decode-step bench's verifyd daemon (tools/bench/decode_step_bench.cc): `verifyd
// --backend=cuda` started as a child process on the same GPU and sized for the bench's dims (it
// inherits the environment, so under MPS both are MPS clients), the bench's one sequence
// prefilled from device memory (Append naming a registered region: no host copy), and the
// registration of the model's device memory. Every way through a daemon starts and prefills it
// this way (decode_step_daemon.h, decode_step_captured.h), so their rows differ only in how each
// layer is handed over.
#pragma once

#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "tools/bench/decode_step_model.h"

namespace verifyd::decode_step {

// The bench's one sequence.
inline constexpr uint64_t kSequence = 1;

// The daemon process; stopped (SIGTERM, then waited for) when this goes away.
class Daemon {
 public:
  // Starts `path` sized for `d` (graphs on or off, --flash-kernel=`flash_kernel`) and waits until
  // it answers Stats (120 s at most).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const std::string& path, const Dims& d,
                                                       bool graphs,
                                                       const std::string& flash_kernel);
  ~Daemon();
  Client& client() { return *client_; }
  // Where it listens ("unix:///tmp/..."), for another process of the bench to connect.
  std::string target() const;

 private:
  Daemon() = default;
  pid_t pid_ = -1;
  std::string socket_;
  std::unique_ptr<Client> client_;
};

// Registers [device_memory, device_memory + bytes) (its CUDA IPC handle) with the daemon.
absl::StatusOr<uint64_t> Register(Client& client, void* device_memory, uint64_t bytes);

// Creates kSequence with L = d.prefix tokens x every layer of random KV, Append by Append from a
// registered device buffer.
absl::Status Prefill(Client& client, const Dims& d, cudaStream_t stream);

}  // namespace verifyd::decode_step
