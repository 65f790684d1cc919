#include "executor/channel_server.h"

#include <sys/mman.h>

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
  };
  std::deque<Deferred> deferred;  // guarded by mu
  bool closed = false;            // guarded by mu
  std::atomic<int> deferred_count{0};
  std::shared_ptr<ChannelCounters> counters;
  std::function<void(bool)> on_completion;

  void WriteRecord(const Deferred& d, const absl::Status& status) {
    if (!status.ok()) counters->failed.fetch_add(1, std::memory_order_relaxed);
    if (on_completion) on_completion(status.ok());
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

// What one descriptor asks the executor to do.
struct Work {
  DescriptorKind kind = DescriptorKind::kVerify;
  VerifyCall verify;
  CommitCall commit;
  ExternalOrder order;
  ExternalFailure failure;  // what a refused or failed call NaN-fills, and its flags
  ExternalPins pins;        // the regions the pointers point into, open until the task ends
  absl::Status refused;     // not OK: fail the call instead of running it
};

struct Range {
  const char* field;
  uint64_t region, offset, length;
};

// Resolves the refs of one descriptor in the owner's regions, keeping the first error.
class RefResolver {
 public:
  RefResolver(ExternalRegionTable* regions, const std::string& owner, ExternalPins* pins)
      : regions_(regions), owner_(owner), pins_(pins) {}

  absl::StatusOr<uint8_t*> Tensor(const channel::TensorRef& ref, uint64_t length,
                                  const char* field) {
    absl::StatusOr<uint8_t*> data =
        regions_->Resolve(owner_, ref.region, ref.offset, length, 64, field, pins_);
    if (data.ok()) ranges_.push_back(Range{field, ref.region, ref.offset, length});
    return data;
  }
  // At most `length` bytes, fewer where the region ends first (whole `unit`s): the outputs of a
  // descriptor whose size is only a guess (ClaimedNodes).
  absl::StatusOr<uint8_t*> TensorUpTo(const channel::TensorRef& ref, uint64_t* length,
                                      uint64_t unit, const char* field) {
    absl::StatusOr<std::shared_ptr<const OpenExternalRegion>> region =
        regions_->Find(owner_, ref.region, absl::StrCat(field, ".region"));
    if (region.ok() && ref.offset < (*region)->bytes()) {
      *length = std::min(*length, ((*region)->bytes() - ref.offset) / unit * unit);
    }
    return Tensor(ref, *length, field);
  }
  // Region 0: no flag.
  absl::StatusOr<ExternalFlag> Flag(const channel::FlagRef& ref, const char* field) {
    if (ref.region == 0) return ExternalFlag{};
    absl::StatusOr<uint8_t*> data =
        regions_->Resolve(owner_, ref.region, ref.offset, 4, 4, field, pins_);
    if (!data.ok()) return data.status();
    ranges_.push_back(Range{field, ref.region, ref.offset, 4});
    return ExternalFlag{reinterpret_cast<uint32_t*>(*data), ref.value};
  }
  // Outputs (named in `outputs`) against every other range resolved.
  absl::Status CheckOutputsDisjoint(std::initializer_list<const char*> outputs) const {
    for (const Range& a : ranges_) {
      bool is_output = false;
      for (const char* o : outputs) is_output |= std::string_view(a.field) == o;
      if (!is_output) continue;
      for (const Range& b : ranges_) {
        if (&a == &b || a.region != b.region) continue;
        if (a.offset < b.offset + b.length && b.offset < a.offset + a.length) {
          return absl::InvalidArgumentError(absl::StrCat(
              a.field, " [", a.offset, ", ", a.offset + a.length, ") overlaps ", b.field, " [",
              b.offset, ", ", b.offset + b.length, ") in region ", a.region,
              "; an output may not overlap another output, an input or a flag"));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  ExternalRegionTable* regions_;
  const std::string& owner_;
  ExternalPins* pins_;
  std::vector<Range> ranges_;
};

void Keep(absl::Status* first, const absl::Status& status) {
  if (first->ok() && !status.ok()) *first = status;
}

// What a refused call writes (its outputs' NaN, its done flag) and waits for first (its ready
// flag: until then the outputs are the scheduler's), resolved before any check so that every
// refusal can complete. `rows` = tree nodes x heads; `guessed`: the descriptor did not decode, its
// outputs are cut where their region ends. The resolutions are returned for the caller's errors.
struct FailureTargets {
  absl::StatusOr<ExternalFlag> ready, done;
  absl::StatusOr<uint8_t*> out;
  std::optional<absl::StatusOr<uint8_t*>> lse;  // when the call names one
};
FailureTargets ResolveFailure(const channel::TensorRef& out, const channel::TensorRef* lse,
                              const channel::FlagRef& ready, const channel::FlagRef& done,
                              uint64_t rows, bool guessed, RefResolver& refs, Work* work) {
  FailureTargets t;
  t.done = refs.Flag(done, "done");
  if (t.done.ok()) work->failure.order.done = *t.done;
  t.ready = refs.Flag(ready, "ready");
  if (t.ready.ok()) work->failure.order.ready = *t.ready;
  uint64_t out_bytes = rows * kVDim * 2;
  t.out = guessed ? refs.TensorUpTo(out, &out_bytes, kVDim * 2, "out")
                  : refs.Tensor(out, out_bytes, "out");
  if (t.out.ok()) {
    work->failure.out = reinterpret_cast<bf16_bits*>(*t.out);
    work->failure.out_elements = static_cast<int64_t>(out_bytes / 2);
  }
  if (lse != nullptr) {
    uint64_t lse_bytes = rows * 4;
    t.lse =
        guessed ? refs.TensorUpTo(*lse, &lse_bytes, 4, "lse") : refs.Tensor(*lse, lse_bytes, "lse");
    if (t.lse->ok()) {
      work->failure.lse = reinterpret_cast<float*>(**t.lse);
      work->failure.lse_elements = static_cast<int64_t>(lse_bytes / 4);
    }
  }
  return t;
}

// Builds the work of a Verify descriptor. Everything the failure path needs (out, lse, ready,
// done) is resolved even when an earlier check failed, so that a refused call still completes.
void PrepareVerify(const Descriptor& d, const ValidationLimits& limits, RefResolver& refs,
                   Work* work) {
  VerifyHeaderView view;
  view.layer = d.layer;
  view.return_lse = d.return_lse;
  view.softmax_scale = d.scale;
  uint64_t total_q = 0;  // as the descriptor says, before validation: what the outputs hold
  for (const channel::SequenceEntry& s : d.sequences) {
    VerifySequenceView& v = view.sequences.emplace_back();
    v.sequence_id = s.sequence_id;
    v.parents = s.parents;
    if (s.has_commit) v.commit_previous = CommitSpecView{s.commit_length, s.accepted_path};
    total_q += s.parents.size();
  }
  // The failure path's targets first, so that any refusal below NaN-fills what the descriptor
  // names as outputs and writes its done flag.
  const uint64_t rows = total_q * static_cast<uint64_t>(limits.heads);
  FailureTargets targets = ResolveFailure(d.out, d.return_lse ? &d.lse : nullptr, d.ready, d.done,
                                          rows, /*guessed=*/false, refs, work);
  // The first error in the order of the gRPC request's fields.
  absl::StatusOr<VerifyCall> call = ValidateVerifyHeader(view, limits);
  if (!call.ok()) {
    work->refused = call.status();
    return;
  }
  absl::Status status;
  absl::StatusOr<uint8_t*> q = refs.Tensor(d.q, rows * kKvDim * 2, "q");
  Keep(&status, q.status());
  absl::StatusOr<uint8_t*> tree_kv = refs.Tensor(d.tree_kv, total_q * kKvDim * 2, "tree_kv");
  Keep(&status, tree_kv.status());
  Keep(&status, targets.out.status());
  if (!d.return_lse && d.lse.region != 0) {
    Keep(&status, absl::InvalidArgumentError(
                      "lse.region is set but return_lse is false; set both or neither"));
  }
  if (targets.lse.has_value()) Keep(&status, targets.lse->status());
  Keep(&status, targets.ready.status());
  Keep(&status, targets.done.status());
  if (status.ok()) status = refs.CheckOutputsDisjoint({"out", "lse"});
  if (!status.ok()) {
    work->refused = status;
    return;
  }
  work->verify = *std::move(call);
  VerifyCall& c = work->verify;
  c.q = reinterpret_cast<const bf16_bits*>(*q);
  c.tree_kv = reinterpret_cast<const bf16_bits*>(*tree_kv);
  c.out_destination = work->failure.out;
  c.lse_destination = work->failure.lse;
  work->order.ready = *targets.ready;
  work->order.done = *targets.done;
  work->failure.order = work->order;
}

void PrepareCommit(const Descriptor& d, const ValidationLimits& limits, Work* work) {
  const bool names_memory = d.q.region != 0 || d.tree_kv.region != 0 || d.out.region != 0 ||
                            d.lse.region != 0 || d.ready.region != 0 || d.done.region != 0;
  if (names_memory) {
    work->refused = absl::InvalidArgumentError(
        "a Commit descriptor names no tensors and no flags; its completion record is the answer");
    return;
  }
  const channel::SequenceEntry& s = d.sequences[0];
  if (!s.has_commit || !s.parents.empty()) {
    work->refused = absl::InvalidArgumentError(
        "commit is missing (commit_length = 0 with an empty accepted_path rejects the tree)");
    return;
  }
  work->commit.sequence = s.sequence_id;
  absl::StatusOr<CommitPath> path = DecodeCommit(CommitSpecView{s.commit_length, s.accepted_path},
                                                 "commit", limits.max_tree_nodes);
  if (!path.ok()) {
    work->refused = path.status();
    return;
  }
  work->commit.path = *std::move(path);
}

// ChannelOptions::wait_ready for the call's ready flag, on the channel's thread; a flag that
// never came makes the call a refusal that waits no more.
void WaitReady(const decltype(ChannelOptions::wait_ready)& wait_ready,
               const std::atomic<bool>* cancelled, Work& work) {
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
    if (shared_->WriteAnswered()) {
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
    consumer_.Sleep(shared_->deferred_count.load(std::memory_order_acquire) > 0
                        ? std::chrono::nanoseconds(std::chrono::microseconds(50))
                        : absl::ToChronoNanoseconds(options_.sleep_slice));
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
  const uint64_t activity = header.submit_tail.load(std::memory_order_relaxed) +
                            header.complete_head.load(std::memory_order_relaxed) +
                            header.heartbeat.load(std::memory_order_relaxed);
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
  auto work = std::make_shared<Work>();
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
  // The executor's queue is bounded: a full queue holds this channel (back-pressure) rather than
  // dropping a descriptor that must complete.
  for (;;) {
    const absl::Status queued = device_->Submit(task);
    if (queued.ok()) return;
    if (queued.code() != absl::StatusCode::kResourceExhausted) {
      // Draining: the executor runs nothing more. The record still says why.
      counters_->failed.fetch_add(1, std::memory_order_relaxed);
      shared_->mapping.view().WriteCompletion(number, header.id,
                                              static_cast<uint32_t>(queued.code()),
                                              queued.message().data(), queued.message().size(), 0);
      return;
    }
    if (stop_.load(std::memory_order_acquire) && !closing) {
      // Closing while the queue is full: the record says why; the close fails the rest.
      shared_->mapping.view().WriteCompletion(number, header.id,
                                              static_cast<uint32_t>(queued.code()),
                                              queued.message().data(), queued.message().size(), 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void ChannelServer::Close(absl::StatusCode reason) {
  if (closed_) return;
  closed_ = true;
  // The client's next enqueue fails; a channel that stopped on its own keeps its own reason.
  if (!finished()) consumer_.Close(reason);
  shared_->cancelled.store(true, std::memory_order_relaxed);
  stop_.store(true, std::memory_order_release);
  channel::RingHeader& header = shared_->mapping.view().header();
  header.doorbell.fetch_add(1, std::memory_order_seq_cst);
  channel::FutexWake(&header.doorbell);
  if (thread_.joinable()) thread_.join();
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
