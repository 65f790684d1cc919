// The decode-step bench's captured way (issue 35 item 3; SPEC §3.1 "Inside the engine's CUDA
// graph", plans/0033): the whole step (the model's 61 GEMMs, per layer the hand-off to verifyd
// through the captured-graph data plane, the commit riding on the next step's record) captured
// ONCE in a CUDA graph and replayed every step, with the trees changing within the bucket and
// the prefix growing.
//
// The daemon is started and the sequence prefilled exactly as for the other daemon ways
// (decode_step_daemon_process.h). The engine then runs in a process of its own,
// decode_step_captured_engine (beside this binary): the captured kernels are reached through
// libverifyd_dataplane.so's C ABI, and that library carries its own copy of the generated protobuf
// messages, which a process that also links the client library (this one) cannot load: protobuf
// aborts on the second registration of verifyd.proto. The engine prints its timing; this side
// checks it exited cleanly and that the daemon's sequence holds what the engine's commits say.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tools/bench/decode_step_model.h"

namespace verifyd::decode_step {

enum class CapturedIo {
  kBucketCopies,  // each layer's q / tree KV copied into the bucket and out back (the adapter's)
  kInPlace,       // the graph verifies the bucket in place (an engine writing into it)
};

const char* CapturedWayName(CapturedIo io);

// Starts the daemon at `verifyd_path` (graphs on, --flash-kernel=`flash_kernel`), prefills, runs
// `engine_path` against it, checks the sequence's committed length, stops the daemon.
absl::StatusOr<Timing> RunCaptured(const Dims& d, CapturedIo io, const std::string& verifyd_path,
                                   const std::string& engine_path, const std::string& flash_kernel);

}  // namespace verifyd::decode_step
