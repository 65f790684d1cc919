#include "executor/channel_server.h"

#include <sys/mman.h>
#include <sys/prctl.h>

#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "verify/mla_dims.h"

namespace verifyd {

struct ChannelServer::Shared {
  explicit Shared(channel::RingMapping m) : mapping(std::move(m)) {}
  channel::RingMapping mapping;
  std::atomic<bool> cancelled{false};
  // The ready flags of the last calls handed to the backend, in descriptor order: on a backend
  // whose wait sits on a device stream (cuda), a call returns before the device saw its flag, and
  // closing the channel must release those waits (ChannelOptions::release_wait). Bounded: a call
  // older than the backend's staging depth (64 layers, plans/0018) has run.
  // Each flag keeps its call's regions open (pins), so a release never writes into memory a
  // ReleaseExternalMemory or a lease already dropped.
  struct Enqueued {
    ExternalFlag ready;
    ExternalPins pins;
  };
  std::mutex mu;
  std::deque<Enqueued> enqueued_ready;
  void RecordEnqueued(const ExternalFlag& ready, const ExternalPins& pins) {
    if (ready.word == nullptr) return;
    std::lock_guard<std::mutex> lock(mu);
    enqueued_ready.push_back(Enqueued{ready, pins});
    if (enqueued_ready.size() > 256) enqueued_ready.pop_front();
  }

  // Verify calls whose answer the device gives later (their inputs' SPEC §1 check,
  // ExternalValueCheck), in descriptor order: the channel thread writes each record once its
  // answer is in (WriteAnswered). After the close nobody polls, so a call deferred then is
  // answered at once.
  struct Deferred {
    uint64_t number = 0;
    uint64_t id = 0;
    std::shared_ptr<ExternalValueCheck> check;
    // A captured step's layer answers through this instead of a ring record (empty: the ring).
    std::function<void(const absl::Status&)> answer;
  };
  std::deque<Deferred> deferred;  // guarded by mu
  bool closed = false;            // guarded by mu
  std::atomic<int> deferred_count{0};
  std::shared_ptr<ChannelCounters> counters;
  std::function<void(bool)> on_completion;

  void WriteRecord(const Deferred& d, const absl::Status& status) {
    if (!status.ok()) counters->failed.fetch_add(1, std::memory_order_relaxed);
    if (on_completion) on_completion(status.ok());
    if (d.answer) {
      d.answer(status);
      return;
    }
    mapping.view().WriteCompletion(d.number, d.id, static_cast<uint32_t>(status.code()),
                                   status.message().data(), status.message().size(), 0);
  }
  void Defer(Deferred d) {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) {
      WriteRecord(d, d.check->Poll().value_or(absl::AbortedError(
                         "the channel closed before the device checked this call's q and "
                         "tree_kv (SPEC §1); its tree layer is not committed until verified "
                         "again")));
      return;
    }
    deferred.push_back(std::move(d));
    deferred_count.fetch_add(1, std::memory_order_release);
  }
  // Writes the records whose answers are in, in order; true when it wrote any.
  bool WriteAnswered() {
    if (deferred_count.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lock(mu);
    bool wrote = false;
    while (!deferred.empty()) {
      std::optional<absl::Status> answer = deferred.front().check->Poll();
      if (!answer) break;
      WriteRecord(deferred.front(), *answer);
      deferred.pop_front();
      deferred_count.fetch_sub(1, std::memory_order_release);
      wrote = true;
    }
    return wrote;
  }
  // The close: what is still unanswered is answered now (the device may be behind a released
  // wait; the client is going away).
  void AnswerAllNow() {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    for (const Deferred& d : deferred) {
      WriteRecord(d, d.check->Poll().value_or(absl::AbortedError(
                         "the channel closed before the device checked this call's q and "
                         "tree_kv (SPEC §1); its tree layer is not committed until verified "
                         "again")));
    }
    deferred.clear();
    deferred_count.store(0, std::memory_order_release);
  }
};

namespace {

using channel::Descriptor;
using channel::DescriptorKind;

// ChannelOptions::wait_ready for the call's ready flag, on the channel's thread; a flag that
// never came makes the call a refusal that waits no more.
void WaitReady(const decltype(ChannelOptions::wait_ready)& wait_ready,
               const std::atomic<bool>* cancelled, ChannelWork& work) {
  ExternalFlag& ready = work.refused.ok() ? work.order.ready : work.failure.order.ready;
  if (ready.word == nullptr) return;
  const absl::Status waited = wait_ready(ready, cancelled);
  if (waited.ok()) return;  // the backend's own wait finds the flag up
  // DEADLINE_EXCEEDED, or ABORTED when the channel closed: the call fails without another wait.
  if (work.refused.ok()) work.refused = waited;
  work.failure.order.ready = ExternalFlag{};
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChannelServer>> ChannelServer::Open(uint64_t id, std::string name,
                                                                   ChannelOptions options,
                                                                   Device* device,
                                                                   ExternalRegionTable* regions) {
  absl::StatusOr<channel::RingMapping> mapping = channel::CreateRingFile(name, options.entries);
  if (!mapping.ok()) return mapping.status();
  std::unique_ptr<ChannelServer> server(new ChannelServer(id, std::move(name), std::move(options),
                                                          device, regions, *std::move(mapping)));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

ChannelServer::ChannelServer(uint64_t id, std::string name, ChannelOptions options, Device* device,
                             ExternalRegionTable* regions, channel::RingMapping mapping)
    : id_(id),
      name_(std::move(name)),
      options_(std::move(options)),
      device_(device),
      regions_(regions),
      shared_(std::make_shared<Shared>(std::move(mapping))),
      counters_(std::make_shared<ChannelCounters>()),
      consumer_(shared_->mapping.view()) {
  shared_->counters = counters_;
  shared_->on_completion = options_.on_completion;
}

ChannelServer::~ChannelServer() { Close(absl::StatusCode::kCancelled); }

void ChannelServer::Loop() {
  using Clock = std::chrono::steady_clock;
  // Naps of 20 us (a captured step rings no doorbell; capture_poll) must end near 20 us: the
  // default timer slack (50 us) let one end ~70 us late, and the step's first layer waited for
  // it (the captured rows' p99, plans/0033). 1 us of slack on this thread only.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  std::vector<uint8_t> copy(channel::kDescriptorBytes);
  const auto spin = absl::ToChronoNanoseconds(options_.spin);
  auto spin_until = Clock::now() + spin;
  while (!stop_.load(std::memory_order_acquire)) {
    uint64_t number = 0;
    std::string why;
    const channel::RingConsumer::Take take = consumer_.TryTake(copy.data(), &number, &why);
    if (take == channel::RingConsumer::Take::kTaken) {
      Handle(copy.data(), number, /*closing=*/false);
      spin_until = Clock::now() + spin;
      continue;
    }
    if (shared_->WriteAnswered() || PollCapture()) {
      spin_until = Clock::now() + spin;
      continue;
    }
    if (take == channel::RingConsumer::Take::kCorrupt) {
      // A client that writes impossible indices gets its channel closed; nothing else changes.
      consumer_.Close(absl::StatusCode::kDataLoss);
      finished_.store(true, std::memory_order_release);
      return;
    }
    if (Clock::now() < spin_until) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    // While the device owes answers, a short nap: each is a record the client may wait for.
    // With a capture attached, naps as short as its poll: a step rings no doorbell.
    auto nap = absl::ToChronoNanoseconds(options_.sleep_slice);
    if (shared_->deferred_count.load(std::memory_order_acquire) > 0) {
      nap = std::min<std::chrono::nanoseconds>(nap, std::chrono::microseconds(50));
    }
    if (has_capture_.load(std::memory_order_acquire)) {
      nap = std::min(nap, absl::ToChronoNanoseconds(options_.capture_poll));
    }
    consumer_.Sleep(nap);
    spin_until = Clock::now() + spin;
  }
}

bool ChannelServer::ExpireIfIdle(std::chrono::steady_clock::time_point now) {
  if (finished()) return true;
  if (shared_->mapping.ClientGone()) {
    // The client's process ended (its lock on the ring went with it): what it left waiting is
    // released now rather than when the lease runs out, since a device wait it left may hold
    // every other client's synchronous work on this GPU (plans/0018).
    consumer_.Close(absl::StatusCode::kCancelled);
    shared_->cancelled.store(true, std::memory_order_relaxed);
    finished_.store(true, std::memory_order_release);
    return true;
  }
  const channel::RingHeader& header = shared_->mapping.view().header();
  const uint64_t activity =
      header.submit_tail.load(std::memory_order_relaxed) +
      header.complete_head.load(std::memory_order_relaxed) +
      header.heartbeat.load(std::memory_order_relaxed) +
      (has_capture_.load(std::memory_order_acquire) ? capture()->published() : 0);
  if (activity != seen_activity_ || last_activity_ == std::chrono::steady_clock::time_point{}) {
    seen_activity_ = activity;
    last_activity_ = now;
    return false;
  }
  if (now - last_activity_ <= absl::ToChronoNanoseconds(options_.lease)) return false;
  // The scheduler went away (or forgot the channel): its lease ends the channel. The ready wait
  // of a call it left behind is cancelled here, not on the channel thread, which may be the one
  // waiting (it runs calls inline when the device is idle).
  consumer_.Close(absl::StatusCode::kDeadlineExceeded);
  shared_->cancelled.store(true, std::memory_order_relaxed);
  finished_.store(true, std::memory_order_release);
  return true;
}

void ChannelServer::Handle(const uint8_t* copy, uint64_t number, bool closing) {
  const channel::DescriptorHeader header = channel::PeekHeader(copy);
  auto work = std::make_shared<ChannelWork>();
  RefResolver refs(regions_, options_.owner, &work->pins);
  absl::StatusOr<Descriptor> d = channel::Decode(copy);
  if (!d.ok()) {
    work->refused = d.status();
    // The body is unreadable, but its outputs and flags may still be reachable: NaN into as many
    // rows as its sequence headers claim (issue 33 N9), after its ready flag, then done.
    const uint64_t nodes =
        channel::ClaimedNodes(copy, static_cast<uint64_t>(options_.limits.max_tree_nodes));
    const bool lse = (header.flags & channel::kFlagReturnLse) != 0 || header.lse.region != 0;
    (void)ResolveFailure(header.out, lse ? &header.lse : nullptr, header.ready, header.done,
                         nodes * static_cast<uint64_t>(options_.limits.heads), /*guessed=*/true,
                         refs, work.get());
  } else {
    work->kind = d->kind;
    if (d->kind == DescriptorKind::kVerify) {
      PrepareVerify(*d, options_.limits, refs, work.get());
    } else {
      PrepareCommit(*d, options_.limits, work.get());
    }
  }
  if (closing) {
    work->refused = absl::AbortedError("the channel closed before this descriptor ran");
    // Nobody may be left waiting: the fill and the flag do not wait for the ready flag.
    work->failure.order.ready = ExternalFlag{};
  }
  work->order.cancelled = &shared_->cancelled;
  work->failure.order.cancelled = &shared_->cancelled;
  if (options_.wait_ready && !closing) WaitReady(options_.wait_ready, &shared_->cancelled, *work);

  auto task = [shared = shared_, counters = counters_, work, number, id = header.id,
               on_completion = options_.on_completion](DeviceOperations& ops) {
    absl::Status status;
    uint64_t committed = 0;
    if (!work->refused.ok()) {
      // Recorded before the backend sees it: a close while the call is in there (the executor
      // may block behind the device's wait for this very flag) must still release it.
      shared->RecordEnqueued(work->failure.order.ready, work->pins);
      status = ops.FailExternal(work->failure, work->refused);
    } else if (work->kind == DescriptorKind::kCommit) {
      absl::StatusOr<CommitResult> result = ops.Commit(work->commit);
      status = result.status();
      if (result.ok()) committed = static_cast<uint64_t>(result->committed_length);
      counters->commits.fetch_add(1, std::memory_order_relaxed);
    } else {
      shared->RecordEnqueued(work->order.ready, work->pins);
      absl::StatusOr<VerifyResult> verified = ops.VerifyExternal(work->verify, work->order);
      counters->verifies.fetch_add(1, std::memory_order_relaxed);
      if (verified.ok() && verified->value_check != nullptr) {
        // The device answers this one (its inputs' check): the channel thread writes the record.
        shared->Defer({number, id, std::move(verified->value_check)});
        shared->mapping.view().WakeConsumer();
        return;
      }
      status = verified.status();
    }
    if (!status.ok()) counters->failed.fetch_add(1, std::memory_order_relaxed);
    if (on_completion) on_completion(status.ok());
    shared->mapping.view().WriteCompletion(number, id, static_cast<uint32_t>(status.code()),
                                           status.message().data(), status.message().size(),
                                           committed);
  };
  Submit(std::move(task), closing, [&](const absl::Status& queued) {
    counters_->failed.fetch_add(1, std::memory_order_relaxed);
    shared_->mapping.view().WriteCompletion(number, header.id, static_cast<uint32_t>(queued.code()),
                                            queued.message().data(), queued.message().size(), 0);
  });
}

void ChannelServer::Submit(std::function<void(DeviceOperations&)> task, bool closing,
                           const std::function<void(const absl::Status&)>& refused) {
  // The executor's queue is bounded: a full queue holds this channel (back-pressure) rather than
  // dropping a call that must complete.
  for (;;) {
    const absl::Status queued = device_->Submit(task);
    if (queued.ok()) return;
    // Draining: the executor runs nothing more; or closing while the queue is full (the close
    // fails the rest). The caller's record still says why.
    if (queued.code() != absl::StatusCode::kResourceExhausted ||
        (stop_.load(std::memory_order_acquire) && !closing)) {
      refused(queued);
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::shared_ptr<StepCapture> ChannelServer::capture() const {
  std::lock_guard<std::mutex> lock(capture_mu_);
  return capture_;
}

absl::Status ChannelServer::AttachCapture(std::shared_ptr<StepCapture> capture) {
  std::lock_guard<std::mutex> lock(capture_mu_);
  if (capture_closed_ || finished()) {
    return absl::FailedPreconditionError(
        absl::StrCat("channel = ", id_, " is closed; open another for the capture"));
  }
  if (capture_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("channel = ", id_, " already serves a captured bucket (epoch ",
                     capture_->info().epoch, "); open a channel per captured bucket"));
  }
  capture_ = std::move(capture);
  has_capture_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

uint64_t ChannelServer::capture_bytes() const {
  std::shared_ptr<StepCapture> c = capture();
  return c == nullptr ? 0 : c->info().bytes;
}

bool ChannelServer::PollCapture() {
  if (!has_capture_.load(std::memory_order_acquire)) return false;
  std::shared_ptr<StepCapture> capture = this->capture();
  std::optional<StepCapture::Step> step = capture->Take();
  if (!step.has_value()) return false;
  // Every layer, in order, exactly as a descriptor's call: the same waits, task and failures;
  // only the answer goes to the step's status instead of a ring record.
  for (uint32_t i = 0; i < step->layers.size(); ++i) {
    std::shared_ptr<ChannelWork> work = step->layers[i];
    work->order.cancelled = &shared_->cancelled;
    work->failure.order.cancelled = &shared_->cancelled;
    if (options_.wait_ready) WaitReady(options_.wait_ready, &shared_->cancelled, *work);
    auto answer = [capture, seq = step->seq, i](const absl::Status& status) {
      capture->LayerDone(seq, i, status);
    };
    auto task = [shared = shared_, counters = counters_, work, answer, capture, seq = step->seq,
                 on_completion = options_.on_completion](DeviceOperations& ops) {
      absl::Status status;
      if (work->refused.ok() && capture->StepFailed(seq)) {
        // All or nothing past the first failure: a layer after a refused one (its riding commit,
        // say) would leave the sequence's pending tree half written.
        work->refused = absl::AbortedError(absl::StrCat("an earlier layer of step ", seq,
                                                        " failed; its later layers are not "
                                                        "computed"));
      }
      if (!work->refused.ok()) {
        shared->RecordEnqueued(work->failure.order.ready, work->pins);
        status = ops.FailExternal(work->failure, work->refused);
      } else {
        shared->RecordEnqueued(work->order.ready, work->pins);
        absl::StatusOr<VerifyResult> verified = ops.VerifyExternal(work->verify, work->order);
        counters->verifies.fetch_add(1, std::memory_order_relaxed);
        if (verified.ok() && verified->value_check != nullptr) {
          shared->Defer({0, 0, std::move(verified->value_check), answer});
          shared->mapping.view().WakeConsumer();
          return;
        }
        status = verified.status();
      }
      if (!status.ok()) counters->failed.fetch_add(1, std::memory_order_relaxed);
      if (on_completion) on_completion(status.ok());
      answer(status);
    };
    Submit(std::move(task), /*closing=*/false, [&](const absl::Status& queued) {
      counters_->failed.fetch_add(1, std::memory_order_relaxed);
      answer(queued);
    });
  }
  return true;
}

void ChannelServer::Close(absl::StatusCode reason) {
  if (closed_) return;
  closed_ = true;
  {
    std::lock_guard<std::mutex> lock(capture_mu_);
    capture_closed_ = true;  // no capture attaches from now on
  }
  // The client's next enqueue fails; a channel that stopped on its own keeps its own reason.
  if (!finished()) consumer_.Close(reason);
  shared_->cancelled.store(true, std::memory_order_relaxed);
  stop_.store(true, std::memory_order_release);
  channel::RingHeader& header = shared_->mapping.view().header();
  header.doorbell.fetch_add(1, std::memory_order_seq_cst);
  channel::FutexWake(&header.doorbell);
  if (thread_.joinable()) thread_.join();
  // A graph still replaying learns from the epoch that the capture is over (its waits give up,
  // its outputs are NaN); the engine raises and prepares again.
  if (std::shared_ptr<StepCapture> c = capture(); c != nullptr) c->End();
  shared_->AnswerAllNow();
  // What was published before the close completes with ABORTED, so no done flag stays unwritten.
  std::vector<uint8_t> copy(channel::kDescriptorBytes);
  for (;;) {
    uint64_t number = 0;
    std::string why;
    if (consumer_.TryTake(copy.data(), &number, &why) != channel::RingConsumer::Take::kTaken) {
      break;
    }
    Handle(copy.data(), number, /*closing=*/true);
  }
  // Waits the backend may still hold on a device stream for flags nobody will write now; in
  // descriptor order, so a flag used by several calls ends at its last value.
  if (options_.release_wait) {
    std::deque<Shared::Enqueued> waiting;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      waiting.swap(shared_->enqueued_ready);
    }
    for (const Shared::Enqueued& e : waiting) options_.release_wait(e.ready);
  }
  shm_unlink(name_.c_str());
}

}  // namespace verifyd
