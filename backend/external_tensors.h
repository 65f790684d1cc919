// The co-located data plane's view of a backend (SPEC §3.1): memory another process on the same
// GPU registered with the daemon, Verify calls whose tensors live there, and the device-memory
// flags through which the scheduler's stream and the daemon's order each other.
//
// A scheduler registers its buffers once; a Verify then names q, tree_kv, out and lse by region
// and offset. The CUDA backend opens a CUDA IPC memory handle (device pointers, no host copy);
// the CPU backend opens a POSIX shared-memory file standing in for device memory, so that CI
// exercises every path above the backend. Flags are uint32 words in a region: the scheduler's
// stream writes `ready_value` to the ready flag once q and tree_kv are in place and waits for the
// done flag to reach `done_value`; the backend waits for the ready flag before it reads anything
// and writes the done flag after its last write, on success and on failure alike (a failed call
// fills its outputs with NaN first), so the scheduler never hangs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "verify/bf16.h"
#include "verify/verify_problem.h"

namespace verifyd {

// What identifies memory another process registered.
struct ExternalMemoryHandle {
  // CUDA backend: the 64 bytes of a cudaIpcMemHandle_t. CPU backend: /proc/<pid>/fd/<n>, a
  // descriptor of the registering process that is a sealed memfd (base/sealed_memfd.h) whose
  // first `bytes` bytes are the region.
  std::string handle;
  uint64_t bytes = 0;
  int device = 0;  // the CUDA device the memory is on; ignored by the CPU backend
  // The registering process as the daemon's socket saw it (SO_PEERCRED); 0 when unknown (TCP).
  // The CPU backend opens descriptors of this process only.
  int64_t client_pid = 0;
};

// An opened region: `data` is a device pointer (cuda) or a host pointer (cpu), valid until the
// object is destroyed. Destroying it closes the mapping; the caller guarantees no call uses it.
class ExternalRegion {
 public:
  virtual ~ExternalRegion() = default;
  virtual void* data() const = 0;
  virtual uint64_t bytes() const = 0;
};

// A flag word the backend waits on or writes, inside an opened region (4-byte aligned).
struct ExternalFlag {
  uint32_t* word = nullptr;  // device pointer (cuda) or host pointer (cpu); null: no flag
  uint32_t value = 0;
};

// The stream order of one call: wait for `ready` (word >= value) before reading, write `done`
// after the last write.
struct ExternalOrder {
  ExternalFlag ready;
  ExternalFlag done;
  // Set by the daemon when the call's channel closes (the scheduler went away): a backend whose
  // ready wait blocks a host thread (cpu) stops waiting and fails the call with ABORTED. Null:
  // none.
  const std::atomic<bool>* cancelled = nullptr;
};

// One Verify on external tensors. `problem` is a VerifyProblem whose q/out/lse point into opened
// regions (problem.kv and the slot arrays are filled by the backend / the caller as for
// ComputeVerify); `tree_kv` [total_q][576] bf16 lies in an opened region too and is written into
// `tree_slots` (one per tree node, batch order) of `layer` before attention, inside the same
// stream order.
// SPEC §1's value check of a call whose q and tree_kv the host cannot read before the call runs
// (device memory, written by the scheduler's stream after the call was enqueued): the device
// checks them in the call's own stream order, NaN-fills the outputs of a refused call, and the
// answer reaches the host later, through this. Thread-safe; the executor and a channel thread
// ask it.
class ExternalValueCheck {
 public:
  virtual ~ExternalValueCheck() = default;
  // OK or INVALID_ARGUMENT (CheckValueBound's message, naming the tensor), or nullopt while the
  // device has not run the call yet. Never blocks.
  virtual std::optional<absl::Status> Poll() = 0;
  // The same, waiting for the device as long as it takes (the call's ready flag first: a caller
  // waits only for a call whose scheduler raises it, or whose channel's close releases it).
  virtual absl::Status Wait() = 0;
};

struct ExternalVerify {
  int layer = 0;
  VerifyProblem problem;
  const bf16_bits* tree_kv = nullptr;
  absl::Span<const int32_t> tree_slots;
  ExternalOrder order;
  // VerifyCall::reserved_sms: SMs the attention's grid leaves to the caller's resident kernel.
  int reserved_sms = 0;
  // Out, optional: a backend that checks q and tree_kv on the device sets it when the call was
  // enqueued; its answer is the call's (OK means: computed; INVALID_ARGUMENT: its outputs are
  // NaN and its tree rows must not be committed). Left null, the returned Status is the answer.
  std::shared_ptr<ExternalValueCheck>* value_check = nullptr;
};

// A call that fails before its compute (bad input found after the descriptor was taken, a channel
// closed under it): its outputs become NaN and its done flag is written, in the same order as a
// computed call (after the ready flag, when there is one), so the scheduler's stream never hangs
// and never reads stale outputs as results. Null pointers: nothing to fill.
struct ExternalFailure {
  bf16_bits* out = nullptr;  // [out_elements] bf16, set to NaN
  int64_t out_elements = 0;
  float* lse = nullptr;  // [lse_elements] fp32, set to NaN
  int64_t lse_elements = 0;
  ExternalOrder order;
};

}  // namespace verifyd
