// The decode-step bench's ways through a real verifyd daemon (SPEC §5, issue 14): the bench is
// the model process; it starts `verifyd --backend=cuda` on the same GPU and prefills one sequence
// from device memory (decode_step_daemon_process.h), then per layer runs its GEMM and Verify:
//   gRPC inline         q and tree KV copied to the host, a Verify RPC, out copied back: the
//                       model's CPU blocks every layer (today's reference path)
//   gRPC shared memory  the same, but q and tree KV copied straight into a daemon-made host
//                       region and out read back from it (VerifySharedInPlace: no bytes in
//                       the messages; plans/0010, 0012)
//   channel, CPU waits  device tensors + a channel descriptor, no flags: the CPU waits for the
//                       model's stream, enqueues, and waits for the completion record
//   channel + stream    device tensors + a channel + stream order: the model's stream writes the
//                       ready flag and waits for done; the CPU enqueues a whole step ahead
// The commit of each step rides on the next step's layer-0 Verify (commit_previous).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tools/bench/decode_step_model.h"

namespace verifyd::decode_step {

enum class DaemonWay { kGrpcInline, kGrpcSharedMemory, kChannelCpuWaits, kChannelStreamOrder };

const char* DaemonWayName(DaemonWay way);

// Starts the daemon at `verifyd_path` sized for `d` (graphs on or off, its --flash-kernel =
// `flash_kernel`: auto or portable), runs `way`, stops it.
absl::StatusOr<Timing> RunThroughDaemon(const Dims& d, DaemonWay way, bool graphs,
                                        const std::string& verifyd_path,
                                        const std::string& flash_kernel);

}  // namespace verifyd::decode_step
