#include "tools/fake_scheduler/channel_lane.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "verify/mla_dims.h"

namespace verifyd::sched {
namespace {

uint64_t Align64(uint64_t x) { return (x + 63) / 64 * 64; }

}  // namespace

absl::StatusOr<std::unique_ptr<ChannelLane>> ChannelLane::Open(Client& client, uint64_t bytes,
                                                               uint32_t device) {
  std::unique_ptr<ChannelLane> lane(new ChannelLane());
  lane->client_ = &client;
  lane->bytes_ = Align64(bytes) + 128;  // the two flags on a line of their own
  absl::StatusOr<HostMemory> memory = HostMemory::Create(lane->bytes_);
  if (!memory.ok()) return memory.status();
  lane->memory_ = *std::move(memory);
  lane->data_ = lane->memory_.data();
  absl::StatusOr<v1::RegisterExternalMemoryResponse> registered =
      client.RegisterExternalMemory(lane->memory_.handle(), lane->bytes_, device);
  if (!registered.ok()) return registered.status();
  lane->region_ = registered->region();
  absl::StatusOr<std::unique_ptr<Channel>> channel = client.OpenChannel(4);
  if (!channel.ok()) return channel.status();
  lane->channel_ = *std::move(channel);
  return lane;
}

ChannelLane::~ChannelLane() {
  if (channel_ != nullptr) (void)channel_->Close();
  if (region_ != 0) (void)client_->ReleaseExternalMemory(region_);
}

absl::StatusOr<v1::VerifyResponse> ChannelLane::Verify(const v1::VerifyRequest& request,
                                                       absl::Span<const bf16_bits> q,
                                                       absl::Span<const bf16_bits> tree_kv,
                                                       int heads,
                                                       absl::Span<const int64_t> committed) {
  const uint64_t total_q = tree_kv.size() / kKvDim;
  const uint64_t rows = total_q * static_cast<uint64_t>(heads);
  const uint64_t q_at = 0, kv_at = Align64(q.size() * 2),
                 out_at = Align64(kv_at + tree_kv.size() * 2),
                 lse_at = Align64(out_at + rows * kVDim * 2), end = Align64(lse_at + rows * 4);
  const uint64_t ready_at = bytes_ - 128, done_at = bytes_ - 64;
  if (end > ready_at) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Verify needs ", end, " bytes, the lane has ", ready_at));
  }
  std::memcpy(data_ + q_at, q.data(), q.size() * 2);
  std::memcpy(data_ + kv_at, tree_kv.data(), tree_kv.size() * 2);
  Channel::VerifyDescriptor d;
  d.id = ++step_;
  d.layer = request.layer();
  for (const v1::VerifySequence& s : request.sequences()) {
    Channel::Sequence& seq = d.sequences.emplace_back();
    seq.sequence_id = s.sequence_id();
    seq.parents.assign(s.parents().begin(), s.parents().end());
    if (s.has_commit_previous()) {
      seq.commit_previous.emplace(s.commit_previous().accepted_path().begin(),
                                  s.commit_previous().accepted_path().end());
    }
  }
  d.q = {region_, q_at};
  d.tree_kv = {region_, kv_at};
  d.out = {region_, out_at};
  d.return_lse = request.return_lse();
  if (d.return_lse) d.lse = {region_, lse_at};
  if (request.has_softmax_scale()) d.softmax_scale = request.softmax_scale();
  d.ready = {region_, ready_at, step_};
  d.done = {region_, done_at, step_};
  // What a scheduler's stream does once q and tree_kv are in place.
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(data_ + ready_at))
      .store(step_, std::memory_order_release);
  if (absl::Status queued = channel_->EnqueueVerify(d); !queued.ok()) return queued;
  absl::StatusOr<Channel::Completion> c = channel_->WaitCompletion(absl::Seconds(60));
  if (!c.ok()) return c.status();
  if (c->id != d.id) {
    return absl::InternalError(absl::StrCat("completion of descriptor ", c->id, ", want ", d.id));
  }
  if (!c->status.ok()) return c->status;
  const uint32_t done =
      std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(data_ + done_at)).load();
  if (done != step_) {
    return absl::InternalError(
        absl::StrCat("the done flag is ", done, " after the completion, want ", step_));
  }
  v1::VerifyResponse response;
  v1::Tensor* out = response.mutable_out();
  out->set_dtype(v1::DTYPE_BF16);
  for (int64_t dim : {int64_t(total_q), int64_t{heads}, int64_t{kVDim}}) out->add_shape(dim);
  out->set_inline_data(data_ + out_at, rows * kVDim * 2);
  if (d.return_lse) {
    v1::Tensor* lse = response.mutable_lse();
    lse->set_dtype(v1::DTYPE_FP32);
    lse->add_shape(static_cast<int64_t>(total_q));
    lse->add_shape(heads);
    lse->set_inline_data(data_ + lse_at, rows * 4);
  }
  for (int64_t n : committed) response.add_committed_length(static_cast<uint64_t>(n));
  return response;
}

}  // namespace verifyd::sched
