// The CPU backend's side of the data plane (external_tensors.h): a region is a file mapped
// MAP_SHARED (a /dev/shm file standing in for device memory), the ready flag is polled with a
// bounded wait, the done flag is a store-release. CI runs every path above the backend on this.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backend/external_tensors.h"

namespace verifyd {

// Maps the first handle.bytes bytes of a sealed memfd of the registering process, named
// /proc/<handle.client_pid>/fd/<n> (base/sealed_memfd.h: it cannot shrink under the mapping, and
// no file of the daemon's user can be named). INVALID_ARGUMENT naming the field for any other
// handle (a NUL byte, another process's descriptor, a directory, a file that is no sealed memfd,
// one shorter than `bytes` or with pages not allocated); FAILED_PRECONDITION when the caller's
// process is unknown (not on the Unix socket); NOT_FOUND when the descriptor does not exist;
// PERMISSION_DENIED when the daemon's user may not open it.
absl::StatusOr<std::unique_ptr<ExternalRegion>> OpenCpuExternalRegion(
    const ExternalMemoryHandle& handle);

// Waits until *ready.word >= ready.value (acquire): spins briefly, then yields, then sleeps in
// short steps; DEADLINE_EXCEEDED after `timeout`, so a scheduler that never signals (or died)
// cannot hold the executor forever; ABORTED as soon as *cancelled (the channel closed). No flag:
// returns at once.
absl::Status WaitReadyFlag(const ExternalFlag& ready, absl::Duration timeout,
                           const std::atomic<bool>* cancelled = nullptr);

// Stores done.value with release, when there is a done flag.
void WriteDoneFlag(const ExternalFlag& done);

// NaN into failure.out and failure.lse (quiet NaN: bf16 0x7FC0, fp32 quiet NaN).
void FillOutputsWithNan(const ExternalFailure& failure);

}  // namespace verifyd
