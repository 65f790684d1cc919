#include "client/channel.h"

#include "absl/strings/str_cat.h"
#include "channel/descriptor.h"
#include "channel/ring_ends.h"
#include "channel/ring_file.h"
#include "client/client.h"

namespace verifyd {

struct Channel::State {
  Client* client = nullptr;
  uint64_t id = 0;
  channel::RingMapping mapping;
  channel::RingProducer producer;
  bool closed = false;
};

Channel::Channel(std::unique_ptr<State> state) : state_(std::move(state)) {}

Channel::~Channel() { (void)Close(); }

namespace {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

channel::TensorRef Ref(const Channel::TensorRef& r) {
  return channel::TensorRef{r.region, r.offset};
}
channel::FlagRef Ref(const Channel::Flag& f) {
  return channel::FlagRef{f.region, f.offset, f.value, 0};
}

}  // namespace

absl::Status Channel::EnqueueVerify(const VerifyDescriptor& v) {
  if (state_->closed) return absl::FailedPreconditionError("EnqueueVerify: the channel is closed");
  channel::Descriptor d;
  d.kind = channel::DescriptorKind::kVerify;
  d.id = v.id;
  d.layer = v.layer;
  d.return_lse = v.return_lse;
  d.scale = v.softmax_scale;
  d.q = Ref(v.q);
  d.tree_kv = Ref(v.tree_kv);
  d.out = Ref(v.out);
  d.lse = Ref(v.lse);
  d.ready = Ref(v.ready);
  d.done = Ref(v.done);
  d.sequences.reserve(v.sequences.size());
  for (const Sequence& s : v.sequences) {
    channel::SequenceEntry& e = d.sequences.emplace_back();
    e.sequence_id = s.sequence_id;
    e.parents = s.parents;
    if (s.commit_previous.has_value()) {
      e.has_commit = true;
      e.commit_length = static_cast<uint32_t>(s.commit_previous->size());
      e.accepted_path = *s.commit_previous;
    }
  }
  absl::StatusOr<uint64_t> pushed = state_->producer.Push(d);
  if (!pushed.ok()) {
    return absl::Status(pushed.status().code(),
                        absl::StrCat("EnqueueVerify: ", pushed.status().message()));
  }
  return absl::OkStatus();
}

absl::Status Channel::EnqueueCommit(const CommitDescriptor& c) {
  if (state_->closed) return absl::FailedPreconditionError("EnqueueCommit: the channel is closed");
  channel::Descriptor d;
  d.kind = channel::DescriptorKind::kCommit;
  d.id = c.id;
  channel::SequenceEntry& e = d.sequences.emplace_back();
  e.sequence_id = c.sequence_id;
  e.has_commit = true;
  e.commit_length = static_cast<uint32_t>(c.accepted_path.size());
  e.accepted_path = c.accepted_path;
  absl::StatusOr<uint64_t> pushed = state_->producer.Push(d);
  if (!pushed.ok()) {
    return absl::Status(pushed.status().code(),
                        absl::StrCat("EnqueueCommit: ", pushed.status().message()));
  }
  return absl::OkStatus();
}

std::vector<Channel::Completion> Channel::PollCompletions() {
  std::vector<Completion> out;
  channel::Completion c;
  while (state_->producer.PopCompletion(&c)) {
    out.push_back(Completion{c.descriptor_id, absl::Status(c.code, c.message), c.committed_length});
  }
  return out;
}

absl::StatusOr<Channel::Completion> Channel::WaitCompletion(absl::Duration timeout) {
  if (state_->producer.in_flight() == 0) {
    return absl::FailedPreconditionError("WaitCompletion: nothing is in flight");
  }
  channel::Completion c;
  if (state_->producer.WaitForCompletion(absl::ToChronoNanoseconds(timeout)) &&
      state_->producer.PopCompletion(&c)) {
    return Completion{c.descriptor_id, absl::Status(c.code, c.message), c.committed_length};
  }
  return absl::DeadlineExceededError(
      absl::StrCat("WaitCompletion: no completion within ", absl::FormatDuration(timeout)));
}

void Channel::Heartbeat() { state_->producer.Heartbeat(); }

absl::Status Channel::Close() {
  if (state_ == nullptr || state_->closed) return absl::OkStatus();
  state_->closed = true;
  return state_->client->CloseChannel(state_->id);
}

uint64_t Channel::id() const { return state_->id; }
uint32_t Channel::entries() const { return state_->mapping.view().entries(); }
uint64_t Channel::in_flight() const { return state_->producer.in_flight(); }

absl::StatusOr<std::unique_ptr<Channel>> Client::OpenChannel(uint32_t entries,
                                                             const CallOptions& call) {
  v1::OpenChannelRequest request;
  request.set_entries(entries);
  v1::OpenChannelResponse response;
  absl::Status status = Call("OpenChannel", false, call, [&](grpc::ClientContext& context) {
    return FromGrpcStatus(stub_->OpenChannel(&context, request, &response));
  });
  if (!status.ok()) return status;
  absl::StatusOr<channel::RingMapping> mapping =
      channel::OpenRingFile(response.path(), response.entries());
  if (!mapping.ok()) {
    (void)CloseChannel(response.channel(), call);  // nobody else can use it
    return absl::Status(mapping.status().code(),
                        absl::StrCat("OpenChannel: ", mapping.status().message()));
  }
  auto state = std::make_unique<Channel::State>();
  state->client = this;
  state->id = response.channel();
  state->mapping = *std::move(mapping);
  state->producer = channel::RingProducer(state->mapping.view());
  return std::unique_ptr<Channel>(new Channel(std::move(state)));
}

absl::Status Client::CloseChannel(uint64_t channel, const CallOptions& call) {
  v1::CloseChannelRequest request;
  request.set_channel(channel);
  v1::CloseChannelResponse response;
  return Call("CloseChannel", false, call, [&](grpc::ClientContext& context) {
    return FromGrpcStatus(stub_->CloseChannel(&context, request, &response));
  });
}

absl::StatusOr<v1::PrepareCaptureResponse> Client::PrepareCapture(
    const v1::PrepareCaptureRequest& request, const CallOptions& call) {
  v1::PrepareCaptureResponse response;
  absl::Status status = Call("PrepareCapture", false, call, [&](grpc::ClientContext& context) {
    return FromGrpcStatus(stub_->PrepareCapture(&context, request, &response));
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::RegisterExternalMemoryResponse> Client::RegisterExternalMemory(
    std::string handle, uint64_t bytes, uint32_t device, const CallOptions& call) {
  v1::RegisterExternalMemoryRequest request;
  request.set_handle(std::move(handle));
  request.set_bytes(bytes);
  request.set_device(device);
  v1::RegisterExternalMemoryResponse response;
  absl::Status status =
      Call("RegisterExternalMemory", false, call, [&](grpc::ClientContext& context) {
        return FromGrpcStatus(stub_->RegisterExternalMemory(&context, request, &response));
      });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ReleaseExternalMemoryResponse> Client::ReleaseExternalMemory(
    uint64_t region, const CallOptions& call) {
  v1::ReleaseExternalMemoryRequest request;
  request.set_region(region);
  v1::ReleaseExternalMemoryResponse response;
  absl::Status status =
      Call("ReleaseExternalMemory", false, call, [&](grpc::ClientContext& context) {
        return FromGrpcStatus(stub_->ReleaseExternalMemory(&context, request, &response));
      });
  if (!status.ok()) return status;
  return response;
}

}  // namespace verifyd
