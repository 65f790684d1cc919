// The two ends of a ring (ring.h has the layout and the protocol): the producer is the client's
// (enqueue descriptors, read completions), the consumer the daemon's (take descriptors, sleep when
// idle). Each end keeps its own indices privately and treats what the other side wrote as
// untrusted: an index that went backwards or jumped past the ring is a corrupt ring, not a crash.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "channel/descriptor.h"
#include "channel/ring.h"

namespace verifyd::channel {

struct Completion {
  uint64_t number = 0;  // the descriptor's place in the channel, from 0
  uint64_t descriptor_id = 0;
  uint64_t committed_length = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
};

class RingProducer {
 public:
  RingProducer() = default;
  explicit RingProducer(const RingView& view) : view_(view) {}

  // Back-pressure: RESOURCE_EXHAUSTED when `entries` descriptors are enqueued whose completions
  // were not read yet (read some with PopCompletion, then retry); FAILED_PRECONDITION once the
  // daemon closed the channel; INVALID_ARGUMENT when the descriptor does not fit a slot. Nothing
  // is published on an error. Returns the descriptor's number.
  absl::StatusOr<uint64_t> Push(const Descriptor& d) {
    RingHeader& h = view_.header();
    if (h.closed.load(std::memory_order_acquire) != 0) return Closed();
    if (tail_ - read_ >= view_.entries()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the channel holds ", view_.entries(),
                       " descriptors whose completions were not read; read completions, then "
                       "retry"));
    }
    const absl::Status encoded = Encode(d, view_.descriptor_slot(tail_));
    if (!encoded.ok()) return encoded;
    const uint64_t number = tail_++;
    h.submit_tail.store(tail_, std::memory_order_release);
    view_.WakeConsumer();
    return number;
  }

  // The next completion in descriptor order, if written. Frees its slot for the daemon.
  bool PopCompletion(Completion* out) {
    CompletionRecord& r = view_.completion_slot(read_);
    if (read_ == tail_ || r.sequence.load(std::memory_order_acquire) != read_ + 1) return false;
    out->number = read_;
    out->descriptor_id = r.descriptor_id;
    out->committed_length = r.committed_length;
    out->code = static_cast<absl::StatusCode>(r.code);
    const uint32_t m = r.message_bytes < kCompletionMessageBytes
                           ? r.message_bytes
                           : static_cast<uint32_t>(kCompletionMessageBytes);
    out->message.assign(r.message, m);
    ++read_;
    RingHeader& h = view_.header();
    h.complete_head.store(read_, std::memory_order_release);
    h.heartbeat.fetch_add(1, std::memory_order_relaxed);
    view_.WakeConsumer();  // the daemon may wait for this slot
    return true;
  }

  // Waits until the next completion is written or `timeout` passes: polls for `spin` first (a
  // record due within microseconds costs no system call), then sleeps on the completion futex, so
  // a long call does not take a core from the daemon computing it. True when a record is there
  // (PopCompletion then returns it).
  bool WaitForCompletion(std::chrono::nanoseconds timeout,
                         std::chrono::nanoseconds spin = std::chrono::microseconds(20)) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto ready = [&] {
      return read_ != tail_ &&
             view_.completion_slot(read_).sequence.load(std::memory_order_acquire) == read_ + 1;
    };
    while (Clock::now() - start < spin) {
      if (ready()) return true;
    }
    RingHeader& h = view_.header();
    for (;;) {
      if (ready()) return true;
      const auto left = timeout - (Clock::now() - start);
      if (left <= std::chrono::nanoseconds::zero()) return false;
      const uint32_t bell = h.completion_bell.load(std::memory_order_seq_cst);
      h.producer_sleeping.store(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      // A short slice: the daemon could have closed the channel without writing the record.
      if (!ready()) {
        FutexWait(&h.completion_bell, bell, std::min<int64_t>(left.count(), int64_t{10'000'000}));
      }
      h.producer_sleeping.store(0, std::memory_order_relaxed);
    }
  }

  // Keeps the channel's lease while nothing is enqueued or read.
  void Heartbeat() const { view_.header().heartbeat.fetch_add(1, std::memory_order_relaxed); }

  bool closed() const { return view_.header().closed.load(std::memory_order_acquire) != 0; }
  uint64_t in_flight() const { return tail_ - read_; }
  uint64_t enqueued() const { return tail_; }

 private:
  absl::Status Closed() const {
    const auto code =
        static_cast<absl::StatusCode>(view_.header().close_code.load(std::memory_order_relaxed));
    return absl::FailedPreconditionError(absl::StrCat("the channel is closed (",
                                                      absl::StatusCodeToString(code),
                                                      "); open another with OpenChannel"));
  }

  RingView view_;
  uint64_t tail_ = 0;  // descriptors published
  uint64_t read_ = 0;  // completions read
};

class RingConsumer {
 public:
  enum class Take { kTaken, kEmpty, kCompletionsFull, kCorrupt };

  RingConsumer() = default;
  explicit RingConsumer(const RingView& view) : view_(view) {}

  // Copies the next published descriptor into `copy` (kDescriptorBytes) when its completion slot
  // is free; *number is its place. kCorrupt when the client's indices are impossible (`why` says
  // which): the caller closes the channel.
  Take TryTake(uint8_t* copy, uint64_t* number, std::string* why) {
    RingHeader& h = view_.header();
    const uint64_t tail = h.submit_tail.load(std::memory_order_acquire);
    const uint64_t read = h.complete_head.load(std::memory_order_acquire);
    if (tail < head_ || tail - head_ > view_.entries()) {
      *why = absl::StrCat("submit_tail = ", tail, " is outside [", head_, ", ",
                          head_ + view_.entries(), "]");
      return Take::kCorrupt;
    }
    if (read > head_) {
      *why = absl::StrCat("complete_head = ", read, " is past the ", head_, " descriptors taken");
      return Take::kCorrupt;
    }
    if (tail == head_) return Take::kEmpty;
    if (head_ - read >= view_.entries()) return Take::kCompletionsFull;
    std::memcpy(copy, view_.descriptor_slot(head_), kDescriptorBytes);
    *number = head_++;
    h.submit_head.store(head_, std::memory_order_release);
    return Take::kTaken;
  }

  // The idle wait: announces sleeping, re-checks for work, then futex-waits at most `timeout`.
  // Returns early when descriptors arrive, a completion slot is freed, or the doorbell rings.
  void Sleep(std::chrono::nanoseconds timeout) {
    RingHeader& h = view_.header();
    const uint32_t bell = h.doorbell.load(std::memory_order_seq_cst);
    h.consumer_sleeping.store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!HasWork()) FutexWait(&h.doorbell, bell, timeout.count());
    h.consumer_sleeping.store(0, std::memory_order_relaxed);
  }

  // Published descriptors whose completion slot is free (or an index to complain about).
  bool HasWork() const {
    RingHeader& h = view_.header();
    const uint64_t tail = h.submit_tail.load(std::memory_order_acquire);
    const uint64_t read = h.complete_head.load(std::memory_order_acquire);
    return tail != head_ && (read > head_ || head_ - read < view_.entries());
  }

  // Closes the ring for the client (it learns on its next enqueue) with `code` as the reason.
  void Close(absl::StatusCode code) {
    RingHeader& h = view_.header();
    h.close_code.store(static_cast<uint32_t>(code), std::memory_order_relaxed);
    h.closed.store(1, std::memory_order_seq_cst);
  }

  uint64_t taken() const { return head_; }
  const RingView& view() const { return view_; }

 private:
  RingView view_;
  uint64_t head_ = 0;  // descriptors taken
};

}  // namespace verifyd::channel
