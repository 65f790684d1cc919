#include "executor/channel_work.h"

#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using channel::Descriptor;
using channel::DescriptorKind;

void Keep(absl::Status* first, const absl::Status& status) {
  if (first->ok() && !status.ok()) *first = status;
}

}  // namespace

FailureTargets ResolveFailure(const channel::TensorRef& out, const channel::TensorRef* lse,
                              const channel::FlagRef& ready, const channel::FlagRef& done,
                              uint64_t rows, bool guessed, RefResolver& refs, ChannelWork* work) {
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

void PrepareVerify(const Descriptor& d, const ValidationLimits& limits, RefResolver& refs,
                   ChannelWork* work) {
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

void PrepareCommit(const Descriptor& d, const ValidationLimits& limits, ChannelWork* work) {
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

}  // namespace verifyd
