// A captured decode step's C entry points that need no CUDA (verifyd_dataplane.h, plans/0033):
// PrepareCapture, the host versions of the graph's kernels (the cpu backend), the step's status.
// The kernels themselves are cuda_calls.cc's.
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/c_api/handles.h"

using verifyd::c_api::Fail;
using verifyd::c_api::NullArgument;

namespace {

verifyd::v1::ExternalMemoryRef Ref(const vd_tensor_ref& r) {
  verifyd::v1::ExternalMemoryRef ref;
  ref.set_region(r.region);
  ref.set_offset(r.offset);
  return ref;
}

absl::Duration Seconds(double s) {
  return std::isfinite(s) && s > 0 ? absl::Seconds(s) : absl::Seconds(30);
}

int NoCapture(const char* function) { return NullArgument(function, "capture"); }

}  // namespace

extern "C" {

int vd_capture_prepare(vd_client* client, vd_channel* channel, const vd_capture_desc* desc,
                       vd_capture** out) {
  if (client == nullptr) return NullArgument("vd_capture_prepare", "client");
  if (channel == nullptr) return NullArgument("vd_capture_prepare", "channel");
  if (desc == nullptr) return NullArgument("vd_capture_prepare", "desc");
  if (out == nullptr) return NullArgument("vd_capture_prepare", "out");
  verifyd::v1::PrepareCaptureRequest r;
  r.set_layer_begin(desc->layer_begin);
  r.set_num_layers(desc->num_layers);
  r.set_max_batch(desc->max_batch);
  r.set_max_q(desc->max_q);
  *r.mutable_q() = Ref(desc->q);
  *r.mutable_tree_kv() = Ref(desc->tree_kv);
  *r.mutable_out() = Ref(desc->out);
  *r.mutable_lse() = Ref(desc->lse);
  *r.mutable_ready() = Ref(desc->ready);
  *r.mutable_done() = Ref(desc->done);
  r.set_return_lse(desc->return_lse != 0);
  if (desc->has_softmax_scale != 0) r.set_softmax_scale(desc->softmax_scale);
  // The poison targets' sizes follow from the bucket the daemon accepted.
  verifyd::CapturedStep::Targets t;
  t.ready = reinterpret_cast<uint32_t*>(desc->ready_pointer);
  t.done = reinterpret_cast<const uint32_t*>(desc->done_pointer);
  t.out = reinterpret_cast<uint16_t*>(desc->out_pointer);
  t.lse = reinterpret_cast<float*>(desc->lse_pointer);
  auto prepared = verifyd::CapturedStep::Prepare(*client->client, *channel->channel, r, t);
  if (!prepared.ok()) return Fail(prepared.status());
  auto capture = std::make_unique<vd_capture>();
  capture->step = *std::move(prepared);
  *out = capture.release();
  return 0;
}

void vd_capture_free(vd_capture* capture) {
  if (capture == nullptr) return;
  verifyd::c_api::ReleaseCaptureDevice(capture);
  delete capture;
}

uint64_t vd_capture_epoch(const vd_capture* c) { return c == nullptr ? 0 : c->step->epoch(); }
uint32_t vd_capture_num_layers(const vd_capture* c) {
  return c == nullptr ? 0 : c->step->num_layers();
}
uint32_t vd_capture_max_batch(const vd_capture* c) {
  return c == nullptr ? 0 : c->step->max_batch();
}
uint32_t vd_capture_max_q(const vd_capture* c) { return c == nullptr ? 0 : c->step->max_q(); }

int vd_capture_publish_host(vd_capture* capture, uint32_t num_seqs, const uint64_t* sequence_ids,
                            const int32_t* q_lens, const int32_t* parents,
                            const int32_t* commit_lens, const int32_t* paths, uint64_t* step) {
  if (capture == nullptr) return NoCapture("vd_capture_publish_host");
  if (num_seqs > 0 && (sequence_ids == nullptr || q_lens == nullptr || parents == nullptr ||
                       commit_lens == nullptr || paths == nullptr)) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("an array is NULL with num_seqs = ", num_seqs)));
  }
  const uint32_t max_q = capture->step->max_q();
  std::vector<verifyd::Channel::Sequence> record(num_seqs);
  for (uint32_t b = 0; b < num_seqs; ++b) {
    // Lengths outside the bucket are published as they are (the daemon refuses the step, as it
    // would the kernel's); only what a row holds is read.
    const int32_t q = q_lens[b] < 0 ? 0 : std::min<int32_t>(q_lens[b], max_q);
    record[b].sequence_id = sequence_ids[b];
    record[b].parents.assign(parents + uint64_t{b} * max_q, parents + uint64_t{b} * max_q + q);
    record[b].parents.resize(static_cast<size_t>(std::max(q_lens[b], 0)), 0);
    if (commit_lens[b] >= 0) {
      const int32_t n = std::min<int32_t>(commit_lens[b], max_q);
      record[b].commit_previous.emplace(paths + uint64_t{b} * max_q,
                                        paths + uint64_t{b} * max_q + n);
      record[b].commit_previous->resize(static_cast<size_t>(commit_lens[b]), 0);
    }
  }
  const uint64_t published = capture->step->PublishHost(record);
  if (step != nullptr) *step = published;
  return 0;
}

int vd_capture_signal_ready_host(vd_capture* capture, uint32_t layer_index) {
  if (capture == nullptr) return NoCapture("vd_capture_signal_ready_host");
  if (layer_index >= capture->step->num_layers()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "layer_index = ", layer_index, " must be < num_layers = ", capture->step->num_layers())));
  }
  capture->step->SignalReadyHost(layer_index);
  return 0;
}

int vd_capture_wait_done_host(vd_capture* capture, uint32_t layer_index, double timeout_seconds) {
  if (capture == nullptr) return NoCapture("vd_capture_wait_done_host");
  if (layer_index >= capture->step->num_layers()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "layer_index = ", layer_index, " must be < num_layers = ", capture->step->num_layers())));
  }
  capture->step->WaitDoneHost(layer_index, Seconds(timeout_seconds));
  return 0;
}

int vd_capture_wait_step(vd_capture* capture, uint64_t step, double timeout_seconds) {
  if (capture == nullptr) return NoCapture("vd_capture_wait_step");
  return Fail(capture->step->WaitStep(step, Seconds(timeout_seconds)));
}

}  // extern "C"
