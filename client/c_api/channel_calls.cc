// Descriptors in (vd_enqueue_verify / vd_enqueue_commit) and completions out (poll / wait).
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/c_api/handles.h"

using verifyd::Channel;
using verifyd::c_api::Fail;
using verifyd::c_api::NullArgument;
using verifyd::c_api::ToC;

namespace {

Channel::TensorRef Ref(const vd_tensor_ref& r) { return Channel::TensorRef{r.region, r.offset}; }
Channel::Flag Ref(const vd_flag& f) { return Channel::Flag{f.region, f.offset, f.value}; }

// The C descriptor as the C++ one; INVALID_ARGUMENT naming the field when an array is NULL.
absl::Status FromC(const vd_verify_desc& c, Channel::VerifyDescriptor* d) {
  if (c.num_sequences > 0 && c.sequences == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequences is NULL with num_sequences = ", c.num_sequences));
  }
  d->id = c.id;
  d->layer = c.layer;
  d->q = Ref(c.q);
  d->tree_kv = Ref(c.tree_kv);
  d->out = Ref(c.out);
  d->lse = Ref(c.lse);
  d->return_lse = c.return_lse != 0;
  if (c.has_softmax_scale != 0) d->softmax_scale = c.softmax_scale;
  d->ready = Ref(c.ready);
  d->done = Ref(c.done);
  d->sequences.reserve(c.num_sequences);
  for (uint32_t i = 0; i < c.num_sequences; ++i) {
    const vd_sequence& s = c.sequences[i];
    if (s.num_parents > 0 && s.parents == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sequences[", i, "].parents is NULL with ",
                                                     "num_parents = ", s.num_parents));
    }
    if (s.has_commit != 0 && s.commit_length > 0 && s.commit_path == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sequences[", i, "].commit_path is NULL ",
                                                     "with commit_length = ", s.commit_length));
    }
    Channel::Sequence& e = d->sequences.emplace_back();
    e.sequence_id = s.sequence_id;
    e.parents.assign(s.parents, s.parents + s.num_parents);
    if (s.has_commit != 0) {
      e.commit_previous.emplace(s.commit_path, s.commit_path + s.commit_length);
    }
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

int vd_enqueue_verify(vd_channel* channel, const vd_verify_desc* descriptor) {
  if (channel == nullptr) return NullArgument("vd_enqueue_verify", "channel");
  if (descriptor == nullptr) return NullArgument("vd_enqueue_verify", "descriptor");
  Channel::VerifyDescriptor d;
  if (absl::Status s = FromC(*descriptor, &d); !s.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("vd_enqueue_verify: ", s.message())));
  }
  return Fail(channel->channel->EnqueueVerify(d));
}

int vd_enqueue_commit(vd_channel* channel, uint64_t id, uint64_t sequence_id,
                      const int32_t* accepted_path, uint32_t length) {
  if (channel == nullptr) return NullArgument("vd_enqueue_commit", "channel");
  if (length > 0 && accepted_path == nullptr) {
    return NullArgument("vd_enqueue_commit", "accepted_path");
  }
  Channel::CommitDescriptor d;
  d.id = id;
  d.sequence_id = sequence_id;
  if (length > 0) d.accepted_path.assign(accepted_path, accepted_path + length);
  return Fail(channel->channel->EnqueueCommit(d));
}

int vd_poll_completions(vd_channel* channel, vd_completion* out, uint32_t capacity) {
  if (channel == nullptr) return NullArgument("vd_poll_completions", "channel");
  if (capacity > 0 && out == nullptr) return NullArgument("vd_poll_completions", "out");
  for (Channel::Completion& c : channel->channel->PollCompletions()) {
    channel->pending.push_back(std::move(c));
  }
  uint32_t n = 0;
  while (n < capacity && !channel->pending.empty()) {
    ToC(channel->pending.front(), &out[n++]);
    channel->pending.pop_front();
  }
  return static_cast<int>(n);
}

int vd_wait_completion(vd_channel* channel, double timeout_seconds, vd_completion* out) {
  if (channel == nullptr) return NullArgument("vd_wait_completion", "channel");
  if (out == nullptr) return NullArgument("vd_wait_completion", "out");
  if (channel->pending.empty()) {
    const absl::Duration timeout = std::isfinite(timeout_seconds) && timeout_seconds > 0
                                       ? absl::Seconds(timeout_seconds)
                                       : absl::ZeroDuration();
    absl::StatusOr<Channel::Completion> next = channel->channel->WaitCompletion(timeout);
    if (!next.ok()) return Fail(next.status());
    channel->pending.push_back(*std::move(next));
  }
  ToC(channel->pending.front(), out);
  channel->pending.pop_front();
  return 0;
}

}  // extern "C"
