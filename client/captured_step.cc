#include "client/captured_step.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"

namespace verifyd {
namespace {

constexpr uint16_t kBf16Nan = 0x7FC0;

uint32_t LoadWord(const uint32_t* word) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).load(std::memory_order_acquire);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CapturedStep>> CapturedStep::Prepare(
    Client& client, const Channel& channel, v1::PrepareCaptureRequest request, Targets targets,
    const CallOptions& call) {
  request.set_channel(channel.id());
  absl::StatusOr<v1::PrepareCaptureResponse> info = client.PrepareCapture(request, call);
  if (!info.ok()) return info.status();
  absl::StatusOr<channel::StepAreaMapping> area =
      channel::OpenStepAreaFile(info->step_area(), info->step_area_bytes());
  if (!area.ok()) {
    return absl::Status(area.status().code(),
                        absl::StrCat("PrepareCapture: ", area.status().message()));
  }
  // What a fault NaN-fills: the bucket's whole outputs, unless the caller said less.
  const uint64_t rows = uint64_t{area->header().max_batch} * area->header().max_q * info->heads();
  // 512: the output row (SPEC §1; the client library does not link verify/).
  if (targets.out != nullptr && targets.out_elements == 0) targets.out_elements = rows * 512;
  if (targets.lse != nullptr && targets.lse_elements == 0) targets.lse_elements = rows;
  return std::unique_ptr<CapturedStep>(
      new CapturedStep(*std::move(info), *std::move(area), targets));
}

uint64_t CapturedStep::PublishHost(const std::vector<Channel::Sequence>& sequences) {
  channel::StepAreaHeader& h = area_.header();
  const uint32_t max_q = h.max_q;
  const uint32_t n = static_cast<uint32_t>(
      std::min<size_t>(sequences.size(), std::numeric_limits<uint32_t>::max()));
  for (uint32_t b = 0; b < std::min(n, h.max_batch); ++b) {
    const Channel::Sequence& s = sequences[b];
    channel::StepEntry* e = channel::StepEntryAt(area_.data(), h.entry_bytes, b);
    e->sequence_id = s.sequence_id;
    e->q_len = static_cast<int32_t>(s.parents.size());
    // copy_n, not memcpy: an empty vector's data() may be null, which memcpy may not take.
    std::copy_n(s.parents.data(), std::min<size_t>(s.parents.size(), max_q),
                channel::StepParents(e));
    if (s.commit_previous.has_value()) {
      e->commit_len = static_cast<int32_t>(s.commit_previous->size());
      std::copy_n(s.commit_previous->data(), std::min<size_t>(s.commit_previous->size(), max_q),
                  channel::StepPath(e, max_q));
    } else {
      e->commit_len = channel::kNoCommit;
    }
  }
  std::atomic_ref<uint32_t>(h.num_seqs).store(n, std::memory_order_relaxed);
  // Last, with release: the record is in place once step_seq says so (StepPublish's fence).
  channel::StepAreaMapping::Store(h.step_seq, ++step_);
  return step_;
}

void CapturedStep::Poison() {
  for (uint64_t k = 0; targets_.out != nullptr && k < targets_.out_elements; ++k) {
    targets_.out[k] = kBf16Nan;
  }
  for (uint64_t k = 0; targets_.lse != nullptr && k < targets_.lse_elements; ++k) {
    targets_.lse[k] = std::numeric_limits<float>::quiet_NaN();
  }
}

void CapturedStep::SignalReadyHost(uint32_t i) {
  if (error_ == channel::kCaptureOk &&
      channel::StepAreaMapping::Load(area_.header().epoch) != epoch_) {
    error_ = channel::kCaptureEpochChanged;
  }
  if (error_ != channel::kCaptureOk) {
    Poison();
    return;  // nobody serves this capture any more: no flag to raise
  }
  std::atomic_ref<uint32_t>(*targets_.ready)
      .store(channel::ReadyValue(step_, num_layers(), i), std::memory_order_release);
}

void CapturedStep::WaitDoneHost(uint32_t i, absl::Duration bound) {
  const uint32_t value = channel::ReadyValue(step_, num_layers(), i);
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(bound);
  auto pause = std::chrono::nanoseconds(100);
  while (error_ == channel::kCaptureOk) {
    if (channel::Reached(LoadWord(targets_.done), value)) return;
    if (channel::StepAreaMapping::Load(area_.header().epoch) != epoch_) {
      error_ = channel::kCaptureEpochChanged;
    } else if (std::chrono::steady_clock::now() > deadline) {
      error_ = channel::kCaptureDoneTimeout;
    } else {
      std::this_thread::sleep_for(pause);  // the kernel's nanosleep back-off
      pause = std::min<std::chrono::nanoseconds>(pause * 2, std::chrono::microseconds(50));
    }
  }
  Poison();
}

absl::Status CapturedStep::WaitStep(uint64_t step, absl::Duration timeout) const {
  const channel::StepAreaHeader& h = area_.header();
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  for (;;) {
    if (channel::StepAreaMapping::Load(h.completed_step) >= step) break;
    if (channel::StepAreaMapping::Load(h.epoch) != epoch_) {
      return absl::FailedPreconditionError(
          absl::StrCat("the capture ended before step ", step,
                       " completed (its channel closed or the daemon "
                       "restarted); prepare the capture again"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", step, " did not complete within ", absl::FormatDuration(timeout),
          " (the daemon planned step ", channel::StepAreaMapping::Load(h.planned_step), ")"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (h.failed_step == step) {
    const uint32_t m = std::min(h.message_bytes, channel::kStepMessageBytes);
    return absl::Status(static_cast<absl::StatusCode>(h.failed_code), std::string(h.message, m));
  }
  return absl::OkStatus();
}

}  // namespace verifyd
