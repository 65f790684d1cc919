// The step area of a captured decode step (plans/0033, SPEC §3.1 "Inside the engine's CUDA
// graph"): one shared-memory file the daemon creates at PrepareCapture and the engine's process
// maps (and, on CUDA, registers with cudaHostRegister so that its captured StepPublish kernel
// writes it directly). Plain layout and the protocol's arithmetic only: no atomics, no absl, so
// that device code (client/c_api's kernels, nvcc) and host code read the same definitions.
//
// Layout, from offset 0 (little-endian):
//   StepAreaHeader                                  kStepHeaderBytes
//   entries [max_batch][StepEntryBytes(max_q)]       the step's sequences, batch order
// An entry is StepEntry, then int32 parents[max_q], then int32 path[max_q] (the accepted path of
// the sequence's previous tree, root first: commit_len of them).
//
// The protocol, per replay of the engine's graph:
//   1. StepPublish (the graph's first node) writes num_seqs and the entries, fences, then stores
//      step_seq = the previous step_seq + 1 (last).
//   2. The daemon's channel thread sees a new step_seq, copies the record, applies its riding
//      commits, and enqueues every captured layer i: wait until ready >= ReadyValue(step, i),
//      compute, then done = ReadyValue(step, i). It stores planned_step = step_seq.
//   3. Per layer the graph's SignalReady writes ready = ReadyValue(step, i) and its WaitDone spins
//      until Reached(done, ReadyValue(step, i)), or until epoch changes (the daemon ended the
//      capture) or a time bound passes (the daemon died): then the layer's outputs are NaN and
//      the engine's error word is set (the adapter raises after the replay).
//   4. When every layer of the step has completed the daemon writes the step's status (code and
//      message of its first failure, if any) and then completed_step = step_seq (last).
// Values wrap modulo 2^32; Reached compares cyclically, as cuStreamWaitValue32's GEQ does.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define VERIFYD_STEP_HD __host__ __device__
#else
#define VERIFYD_STEP_HD
#endif

namespace verifyd::channel {

inline constexpr uint32_t kStepAreaMagic = 0x50'54'53'56;  // "VSTP"
inline constexpr uint32_t kStepAreaVersion = 1;
inline constexpr uint64_t kStepHeaderBytes = 4096;
inline constexpr uint32_t kStepMessageBytes = 224;
// StepEntry::commit_len when nothing rides on the step (a sequence's first step).
inline constexpr int32_t kNoCommit = -1;
// The most sequences one captured bucket may hold: bounds the step area (and the record the
// daemon copies per step) whatever a client asks.
inline constexpr uint32_t kMaxCaptureBatch = 1024;

// Each word another party writes sits on a cache line of its own.
struct StepAreaHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t max_batch;
  uint32_t max_q;
  uint32_t num_layers;  // the captured layers: [layer_begin, layer_begin + num_layers)
  uint32_t layer_begin;
  uint64_t entry_bytes;  // StepEntryBytes(max_q)
  // Daemon: non-zero from PrepareCapture on; 0 once the capture ended (channel closed, lease,
  // shutdown), which a graph still replaying reads as "the daemon restarted".
  alignas(64) uint64_t epoch;
  // Engine (StepPublish): the step whose record is in place; stored after the record.
  alignas(64) uint64_t step_seq;
  // Engine (StepPublish): the record's sequences (an entry each); the daemon refuses a step
  // whose num_seqs is 0 or above max_batch.
  alignas(64) uint32_t num_seqs;
  uint32_t reserved0;
  // Daemon: the last step it took (its record copied).
  alignas(64) uint64_t planned_step;
  // Daemon: the last step whose every layer completed; stored after the status below.
  alignas(64) uint64_t completed_step;
  // Daemon: the last step that failed and why (a gRPC code, the first failure's message).
  uint64_t failed_step;
  uint32_t failed_code;
  uint32_t message_bytes;
  char message[kStepMessageBytes];
};
static_assert(sizeof(StepAreaHeader) <= kStepHeaderBytes);

struct StepEntry {
  uint64_t sequence_id;
  int32_t q_len;       // the tree's nodes, in [1, max_q]
  int32_t commit_len;  // the previous tree's accepted path: kNoCommit, or [0, max_q] nodes
};
static_assert(sizeof(StepEntry) == 16);

VERIFYD_STEP_HD inline uint64_t StepEntryBytes(uint32_t max_q) {
  return (sizeof(StepEntry) + 8 * uint64_t{max_q} + 63) / 64 * 64;
}

VERIFYD_STEP_HD inline uint64_t StepAreaBytes(uint32_t max_batch, uint32_t max_q) {
  return kStepHeaderBytes + uint64_t{max_batch} * StepEntryBytes(max_q);
}

// Entry b of an area starting at `base`, and its two int32 arrays.
VERIFYD_STEP_HD inline StepEntry* StepEntryAt(uint8_t* base, uint64_t entry_bytes, uint32_t b) {
  return reinterpret_cast<StepEntry*>(base + kStepHeaderBytes + b * entry_bytes);
}
VERIFYD_STEP_HD inline int32_t* StepParents(StepEntry* e) {
  return reinterpret_cast<int32_t*>(e + 1);
}
VERIFYD_STEP_HD inline int32_t* StepPath(StepEntry* e, uint32_t max_q) {
  return StepParents(e) + max_q;
}

// The value layer i (of the captured layers) of step `step` raises ready to, and done to.
VERIFYD_STEP_HD inline uint32_t ReadyValue(uint64_t step, uint32_t num_layers, uint32_t i) {
  return static_cast<uint32_t>(step * num_layers + i + 1);
}

// Whether a flag word has reached `value` (cyclic: correct across the 2^32 wrap while the two are
// within 2^31 of each other).
VERIFYD_STEP_HD inline bool Reached(uint32_t word, uint32_t value) {
  return static_cast<int32_t>(word - value) >= 0;
}

// The engine's error word (its device state; the adapter reads it after a replay).
enum CaptureError : uint32_t {
  kCaptureOk = 0,
  kCaptureEpochChanged = 1,  // the step area's epoch is not the captured one: daemon restarted
  kCaptureDoneTimeout = 2,   // a done flag did not come within the bound: the daemon died
};

}  // namespace verifyd::channel
