#include "tests/service/soak_lanes.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "channel/ring.h"

namespace verifyd::testing {
namespace {

// Long enough for a loaded 2-core CI box with a compaction in the queue; a wedge still fails.
constexpr absl::Duration kCallTimeout = absl::Seconds(30);

absl::Span<const uint16_t> Bf16Span(const v1::Tensor& t) {
  return {reinterpret_cast<const uint16_t*>(t.inline_data().data()), t.inline_data().size() / 2};
}

}  // namespace

const char* LaneName(Lane lane) {
  switch (lane) {
    case Lane::kGrpc:
      return "grpc";
    case Lane::kSharedMemory:
      return "shared memory";
    case Lane::kChannel:
      return "channel";
  }
  return "?";
}

uint64_t SoakLanes::RegionFileBytes(int64_t max_total_q, int heads) {
  const uint64_t bytes =
      std::max(SharedVerifyBytes(max_total_q, heads, true), LayoutFor(max_total_q, heads).end);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

uint64_t SoakLanes::RingFileBytes() { return channel::RingFileBytes(kRingEntries); }

SoakLanes::SoakLanes(Client& client, v1::Verifyd::Stub& stub, ShadowModel& model,
                     int64_t max_total_q)
    : client_(client),
      model_(model),
      rpc_(stub, model),
      region_bytes_(RegionFileBytes(max_total_q, model.heads())) {}

SoakLanes::~SoakLanes() { (void)Close(); }

absl::Status SoakLanes::Renew(uint64_t round) {
  if (channel_ != nullptr) {
    if (absl::Status closed = channel_->Close(); !closed.ok()) return closed;
    channel_.reset();
  }
  if (round % 2 == 0 || !region_.has_value()) {
    if (region_.has_value()) {
      if (absl::Status released = region_->Release(); !released.ok()) return released;
    }
    absl::StatusOr<SharedMemoryRegion> region = client_.CreateSharedMemory(region_bytes_);
    if (!region.ok()) return region.status();
    region_.emplace(std::move(*region));
  }
  if (round % 4 == 0 || scratch_ == nullptr) {
    if (scratch_ != nullptr) {
      if (auto released = client_.ReleaseExternalMemory(external_region_); !released.ok()) {
        return released.status();
      }
    }
    scratch_ = std::make_unique<Scratch>(region_bytes_);
    auto registered = client_.RegisterExternalMemory(scratch_->path(), scratch_->bytes());
    if (!registered.ok()) return registered.status();
    external_region_ = registered->region();
  }
  absl::StatusOr<std::unique_ptr<Channel>> channel = client_.OpenChannel(kRingEntries);
  if (!channel.ok()) return channel.status();
  channel_ = std::move(*channel);
  return absl::OkStatus();
}

absl::Status SoakLanes::Close() {
  absl::Status status;
  if (channel_ != nullptr) status.Update(channel_->Close());
  channel_.reset();
  if (region_.has_value()) status.Update(region_->Release());
  region_.reset();
  if (scratch_ != nullptr) status.Update(client_.ReleaseExternalMemory(external_region_).status());
  scratch_.reset();
  return status;
}

std::string SoakLanes::Step(Lane lane, const std::vector<VerifyPart>& parts, bool return_lse) {
  if (lane == Lane::kGrpc) return rpc_.Step(parts, return_lse);
  for (int layer = 0; layer < model_.layers(); ++layer) {
    std::vector<VerifyPart> layer_parts = parts;
    if (layer > 0) {
      for (VerifyPart& p : layer_parts) p.commit_previous.reset();
    }
    const v1::VerifyRequest request = model_.MakeVerify(layer, layer_parts, return_lse);
    const std::string failure =
        lane == Lane::kChannel ? VerifyOnChannel(request) : VerifyShared(request);
    if (!failure.empty()) return absl::StrCat("layer ", layer, ": ", failure);
  }
  return "";
}

std::string SoakLanes::VerifyShared(const v1::VerifyRequest& request) {
  v1::VerifyRequest bare = request;
  bare.clear_q();
  bare.clear_tree_kv();
  absl::StatusOr<SharedVerifyResult> result =
      client_.VerifyShared(bare, Bf16Span(request.q()), Bf16Span(request.tree_kv()), *region_);
  if (!result.ok()) return absl::StrCat("VerifyShared failed: ", result.status().ToString());
  model_.AcceptVerify(request);
  // The answer names ranges of the region; the model checks inline bytes.
  v1::VerifyResponse inlined = result->response;
  inlined.mutable_out()->set_inline_data(result->out.data(), result->out.size() * 2);
  if (request.return_lse()) {
    inlined.mutable_lse()->set_inline_data(result->lse.data(), result->lse.size() * 4);
  }
  return model_.CheckVerify(request, inlined);
}

std::string SoakLanes::VerifyOnChannel(const v1::VerifyRequest& request) {
  const Channel::VerifyDescriptor d =
      DescriptorFor(request, external_region_, *scratch_, ++flag_value_, ++descriptor_id_);
  // The scheduler's "q is ready", then the descriptor.
  scratch_->word(d.ready.offset).store(d.ready.value, std::memory_order_release);
  if (absl::Status queued = channel_->EnqueueVerify(d); !queued.ok()) {
    return absl::StrCat("EnqueueVerify failed: ", queued.ToString());
  }
  absl::StatusOr<Channel::Completion> c = channel_->WaitCompletion(kCallTimeout);
  if (!c.ok()) return absl::StrCat("no completion: ", c.status().ToString());
  if (c->id != d.id) return absl::StrCat("completion ", c->id, " for descriptor ", d.id);
  if (!c->status.ok()) return absl::StrCat("channel Verify failed: ", c->status.ToString());
  if (scratch_->word(d.done.offset).load(std::memory_order_acquire) != d.done.value) {
    return "the done flag was not written before the completion";
  }
  model_.AcceptVerify(request);
  return model_.CheckVerify(request, ResponseFrom(request, *scratch_, model_));
}

std::string SoakLanes::Commit(Lane lane, uint64_t sequence, const std::vector<int32_t>& path) {
  if (lane != Lane::kChannel) {
    const grpc::Status status = rpc_.Commit(sequence, path);
    return status.ok() ? "" : absl::StrCat("Commit failed: ", status.error_message());
  }
  if (absl::Status queued = channel_->EnqueueCommit({++descriptor_id_, sequence, path});
      !queued.ok()) {
    return absl::StrCat("EnqueueCommit failed: ", queued.ToString());
  }
  absl::StatusOr<Channel::Completion> c = channel_->WaitCompletion(kCallTimeout);
  if (!c.ok()) return absl::StrCat("no commit completion: ", c.status().ToString());
  if (!c->status.ok()) return absl::StrCat("channel Commit failed: ", c->status.ToString());
  model_.AcceptCommit(sequence, path);
  if (c->committed_length != static_cast<uint64_t>(model_.committed_length(sequence))) {
    return absl::StrCat("channel Commit: committed_length ", c->committed_length, ", model ",
                        model_.committed_length(sequence));
  }
  return "";
}

}  // namespace verifyd::testing
