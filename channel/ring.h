// The channel's ring (plans/0017-data-plane.md): one shared-memory file the daemon creates and
// both processes map. Header-only and free of the daemon's rooms, because the client library
// (proto + gRPC + this wire format only) and the executor both use it.
//
// Layout, from offset 0 (all little-endian, x86-64/aarch64 only):
//   RingHeader                                       kRingHeaderBytes
//   descriptor slots [entries][kDescriptorBytes]     what the client enqueues
//   completion slots [entries][kCompletionBytes]     what the daemon answers
// Descriptor n (counting from 0) sits in slot n % entries and its completion in completion slot
// n % entries. The client publishes descriptors by advancing submit_tail (release); the daemon
// copies a descriptor out of the ring before it reads any field (the client may scribble on the
// slot afterwards) and advances submit_head. Completion record n carries `sequence = n + 1`,
// stored last (release): the client reads records in order and knows a slot is filled when its
// sequence matches, so completions may be written out of order (a descriptor refused on the
// channel thread completes before an earlier one the executor still runs). The client frees
// completion slots by advancing complete_head. The daemon takes descriptor n only when
// n - complete_head < entries, so it never overwrites a record the client has not read: a client
// that stops reading completions stops the channel (back-pressure), never loses a record.
//
// Sleeping (the futex protocol): the daemon's channel thread polls while traffic flows; idle, it
// stores consumer_sleeping = 1, a seq_cst fence, re-reads submit_tail and complete_head, and
// futex-waits on `doorbell` (timed, so that it notices close and the lease). The client, after
// publishing (submit_tail or complete_head), fences seq_cst and, when consumer_sleeping is 1,
// bumps doorbell and futex-wakes it. Either the daemon's re-read sees the new index or the client
// sees consumer_sleeping = 1: a wake-up cannot be lost. A client that waits for a completion does
// the same on completion_bell / producer_sleeping, and the daemon wakes it after each record. The
// futex is a shared one (no FUTEX_PRIVATE_FLAG): the two processes map the word at different
// addresses.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace verifyd::channel {

inline constexpr uint32_t kRingMagic = 0x47'4E'52'56;  // "VRNG"
inline constexpr uint32_t kRingVersion = 1;
inline constexpr uint64_t kRingHeaderBytes = 4096;
// One descriptor slot: a Verify of a batch whose sequences, parents and commit paths fit
// (descriptor.h says how many bytes a descriptor needs); a larger batch goes through gRPC.
inline constexpr uint64_t kDescriptorBytes = 8192;
inline constexpr uint64_t kCompletionBytes = 256;
inline constexpr uint32_t kMinEntries = 2;
inline constexpr uint32_t kMaxEntries = 4096;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring indices must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "ring words must be lock-free");

// Each index on a cache line of its own: the two processes write different ones.
struct RingHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t entries;  // a power of two in [kMinEntries, kMaxEntries]
  uint32_t descriptor_bytes;
  uint32_t completion_bytes;
  uint32_t reserved0[11];
  alignas(64) std::atomic<uint64_t> submit_tail;    // client: descriptors published
  alignas(64) std::atomic<uint64_t> submit_head;    // daemon: descriptors taken
  alignas(64) std::atomic<uint64_t> complete_head;  // client: completion records read
  alignas(64) std::atomic<uint32_t> doorbell;       // futex word the daemon sleeps on
  std::atomic<uint32_t> consumer_sleeping;
  // Set once by the daemon (close, lease, shutdown, a malformed ring): no descriptor is taken
  // after it; close_reason says why (a gRPC code).
  alignas(64) std::atomic<uint32_t> closed;
  std::atomic<uint32_t> close_code;
  // Bumped by the client when it reads completions: a client that only polls keeps its lease.
  alignas(64) std::atomic<uint64_t> heartbeat;
  // The same protocol the other way: a client waiting for a completion sleeps on
  // completion_bell with producer_sleeping = 1; the daemon rings it after writing a record.
  alignas(64) std::atomic<uint32_t> completion_bell;
  std::atomic<uint32_t> producer_sleeping;
  // Set to 1 by a client once it holds a shared flock(2) on the ring's file for as long as its
  // process lives: the daemon then learns of the client's death from the lock (RingMapping::
  // ClientGone) within a sweep, not a lease. A client that never sets it keeps the lease alone.
  alignas(64) std::atomic<uint32_t> client_attached;
};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);

// Completion record: `sequence` last, with release.
struct CompletionRecord {
  std::atomic<uint64_t> sequence;  // descriptor number + 1 once written
  uint64_t descriptor_id;          // the client's id of the descriptor
  uint64_t committed_length;       // Commit: the sequence's committed length; Verify: 0
  uint32_t code;                   // absl/gRPC canonical code
  uint32_t message_bytes;          // <= kCompletionMessageBytes
  char message[kCompletionBytes - 32];
};
inline constexpr uint64_t kCompletionMessageBytes = sizeof(CompletionRecord::message);
static_assert(sizeof(CompletionRecord) == kCompletionBytes);

inline bool ValidEntries(uint64_t entries) {
  return entries >= kMinEntries && entries <= kMaxEntries && (entries & (entries - 1)) == 0;
}

inline uint64_t RingFileBytes(uint32_t entries) {
  return kRingHeaderBytes + uint64_t{entries} * (kDescriptorBytes + kCompletionBytes);
}

// Shared (not private) futex calls on a word of the mapping.
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000),
              static_cast<long>(timeout_ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
inline void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

// A view of a mapped ring; both sides use it. It holds no state of its own but the caller's
// private indices, so each side keeps its own copy of what it has written (never re-read from the
// shared header, which the other side could corrupt).
class RingView {
 public:
  RingView() = default;
  RingView(void* base, uint32_t entries)
      : base_(static_cast<uint8_t*>(base)), entries_(entries), mask_(entries - 1) {}

  RingHeader& header() const { return *reinterpret_cast<RingHeader*>(base_); }
  uint32_t entries() const { return entries_; }
  uint8_t* descriptor_slot(uint64_t n) const {
    return base_ + kRingHeaderBytes + (n & mask_) * kDescriptorBytes;
  }
  CompletionRecord& completion_slot(uint64_t n) const {
    return *reinterpret_cast<CompletionRecord*>(base_ + kRingHeaderBytes +
                                                uint64_t{entries_} * kDescriptorBytes +
                                                (n & mask_) * kCompletionBytes);
  }

  // Daemon: a fresh header in a zero-filled file.
  void Initialize() const {
    RingHeader& h = header();
    h.magic = kRingMagic;
    h.version = kRingVersion;
    h.entries = entries_;
    h.descriptor_bytes = static_cast<uint32_t>(kDescriptorBytes);
    h.completion_bytes = static_cast<uint32_t>(kCompletionBytes);
  }
  // Client: the file is a ring of this version and size.
  bool HeaderMatches() const {
    const RingHeader& h = header();
    return h.magic == kRingMagic && h.version == kRingVersion && h.entries == entries_ &&
           h.descriptor_bytes == kDescriptorBytes && h.completion_bytes == kCompletionBytes;
  }

  // Both: after publishing an index, wake the daemon if it sleeps.
  void WakeConsumer() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    RingHeader& h = header();
    if (h.consumer_sleeping.load(std::memory_order_relaxed) != 0) {
      h.doorbell.fetch_add(1, std::memory_order_seq_cst);
      FutexWake(&h.doorbell);
    }
  }

  // Daemon: writes completion record n (the message cut to what fits).
  void WriteCompletion(uint64_t n, uint64_t descriptor_id, uint32_t code, const char* message,
                       size_t message_bytes, uint64_t committed_length) const {
    CompletionRecord& r = completion_slot(n);
    r.descriptor_id = descriptor_id;
    r.committed_length = committed_length;
    r.code = code;
    const size_t m =
        message_bytes < kCompletionMessageBytes ? message_bytes : kCompletionMessageBytes;
    if (m > 0) std::memcpy(r.message, message, m);
    r.message_bytes = static_cast<uint32_t>(m);
    r.sequence.store(n + 1, std::memory_order_release);
    // Wake a client that sleeps waiting for a record (ring.h's protocol, reversed).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    RingHeader& h = header();
    if (h.producer_sleeping.load(std::memory_order_relaxed) != 0) {
      h.completion_bell.fetch_add(1, std::memory_order_seq_cst);
      FutexWake(&h.completion_bell);
    }
  }

 private:
  uint8_t* base_ = nullptr;
  uint32_t entries_ = 0;
  uint64_t mask_ = 0;
};

}  // namespace verifyd::channel
