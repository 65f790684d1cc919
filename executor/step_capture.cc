#include "executor/step_capture.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/random.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// The bucket's own fields; fills spec->num_layers when 0.
absl::Status CheckBucket(CaptureSpec* spec, const ValidationLimits& limits) {
  const uint32_t layers = static_cast<uint32_t>(limits.layers);
  if (spec->layer_begin >= layers) {
    return Invalid(
        absl::StrCat("layer_begin = ", spec->layer_begin, " must be < --layers = ", layers));
  }
  if (spec->num_layers == 0) spec->num_layers = layers - spec->layer_begin;
  if (spec->num_layers > layers - spec->layer_begin) {
    return Invalid(absl::StrCat("layer_begin = ", spec->layer_begin, " + num_layers = ",
                                spec->num_layers, " must be <= --layers = ", layers));
  }
  if (spec->max_batch == 0 || spec->max_batch > channel::kMaxCaptureBatch) {
    return Invalid(absl::StrCat("max_batch = ", spec->max_batch, " must be in [1, ",
                                channel::kMaxCaptureBatch, "]"));
  }
  if (spec->max_q == 0 || spec->max_q > static_cast<uint32_t>(limits.max_tree_nodes)) {
    return Invalid(absl::StrCat("max_q = ", spec->max_q, " must be in [1, --max-tree-nodes = ",
                                limits.max_tree_nodes, "]: the daemon cannot serve this bucket"));
  }
  if (!spec->return_lse && spec->lse.region != 0) {
    return Invalid("lse.region is set but return_lse is false; set both or neither");
  }
  if (spec->ready.region == spec->done.region && spec->ready.offset == spec->done.offset) {
    return Invalid("done names the ready word; the two flags must be different words");
  }
  // softmax_scale by Verify's own rule (the same message): a one-node call of the first layer.
  VerifyHeaderView probe;
  probe.layer = spec->layer_begin;
  probe.softmax_scale = spec->softmax_scale;
  static const int32_t kRoot[] = {-1};
  probe.sequences.push_back(VerifySequenceView{1, kRoot, std::nullopt});
  absl::StatusOr<VerifyCall> call = ValidateVerifyHeader(probe, limits);
  return call.status();
}

// Every ref at the bucket's largest step, the way a descriptor's are checked.
absl::Status CheckRefs(const CaptureSpec& spec, const ValidationLimits& limits,
                       ExternalRegionTable* regions, const std::string& owner) {
  const uint64_t rows = uint64_t{spec.max_batch} * spec.max_q;
  const uint64_t heads = static_cast<uint64_t>(limits.heads);
  ExternalPins pins;
  RefResolver refs(regions, owner, &pins);
  absl::Status status = refs.Tensor(spec.q, rows * heads * kKvDim * 2, "q").status();
  if (status.ok()) status = refs.Tensor(spec.tree_kv, rows * kKvDim * 2, "tree_kv").status();
  if (status.ok()) status = refs.Tensor(spec.out, rows * heads * kVDim * 2, "out").status();
  if (status.ok() && spec.return_lse) {
    status = refs.Tensor(spec.lse, rows * heads * 4, "lse").status();
  }
  if (status.ok()) {
    if (spec.ready.region == 0) return Invalid("ready.region must be set");
    status = refs.Flag(spec.ready, "ready").status();
  }
  if (status.ok()) {
    if (spec.done.region == 0) return Invalid("done.region must be set");
    status = refs.Flag(spec.done, "done").status();
  }
  if (status.ok()) status = refs.CheckOutputsDisjoint({"out", "lse", "done"});
  return status;
}

}  // namespace

absl::StatusOr<std::shared_ptr<StepCapture>> StepCapture::Create(CaptureSpec spec,
                                                                 const ValidationLimits& limits,
                                                                 ExternalRegionTable* regions,
                                                                 const std::string& owner,
                                                                 const std::string& area_name) {
  if (absl::Status s = CheckBucket(&spec, limits); !s.ok()) return s;
  if (absl::Status s = CheckRefs(spec, limits, regions, owner); !s.ok()) return s;
  const uint64_t epoch = RandomNonzeroId();
  absl::StatusOr<channel::StepAreaMapping> area = channel::CreateStepAreaFile(
      area_name, spec.max_batch, spec.max_q, spec.layer_begin, spec.num_layers, epoch);
  if (!area.ok()) return area.status();
  CaptureInfo info{epoch, area_name, area->bytes(), spec.layer_begin, spec.num_layers};
  return std::shared_ptr<StepCapture>(
      new StepCapture(std::move(spec), limits, regions, owner, *std::move(area), std::move(info)));
}

StepCapture::StepCapture(CaptureSpec spec, const ValidationLimits& limits,
                         ExternalRegionTable* regions, std::string owner,
                         channel::StepAreaMapping area, CaptureInfo info)
    : spec_(std::move(spec)),
      limits_(limits),
      regions_(regions),
      owner_(std::move(owner)),
      area_(std::move(area)),
      info_(std::move(info)) {}

StepCapture::~StepCapture() { End(); }

uint64_t StepCapture::published() const {
  return channel::StepAreaMapping::Load(area_.header().step_seq);
}

absl::Status StepCapture::CopyRecord(std::vector<channel::SequenceEntry>* sequences) const {
  const channel::StepAreaHeader& h = area_.header();
  const uint32_t n =
      std::atomic_ref<uint32_t>(const_cast<uint32_t&>(h.num_seqs)).load(std::memory_order_acquire);
  if (n == 0 || n > spec_.max_batch) {
    return Invalid(absl::StrCat("num_seqs = ", n, " must be in [1, max_batch = ", spec_.max_batch,
                                "] (the captured bucket)"));
  }
  sequences->resize(n);
  for (uint32_t b = 0; b < n; ++b) {
    // A private copy of the entry before any field is read: the engine owns the area.
    channel::StepEntry e;
    uint8_t* base = area_.data();
    channel::StepEntry* shared = channel::StepEntryAt(base, h.entry_bytes, b);
    std::memcpy(&e, shared, sizeof(e));
    if (e.q_len < 1 || static_cast<uint32_t>(e.q_len) > spec_.max_q) {
      return Invalid(absl::StrCat("sequences[", b, "].q_len = ", e.q_len,
                                  " must be in [1, max_q = ", spec_.max_q,
                                  "] (the captured bucket)"));
    }
    if (e.commit_len < channel::kNoCommit || e.commit_len > static_cast<int32_t>(spec_.max_q)) {
      return Invalid(absl::StrCat("sequences[", b, "].commit_len = ", e.commit_len,
                                  " must be -1 (no commit) or in [0, max_q = ", spec_.max_q, "]"));
    }
    channel::SequenceEntry& s = (*sequences)[b];
    s.sequence_id = e.sequence_id;
    s.parents.resize(static_cast<size_t>(e.q_len));
    std::copy_n(channel::StepParents(shared), s.parents.size(), s.parents.data());
    s.has_commit = e.commit_len != channel::kNoCommit;
    if (s.has_commit) {
      s.commit_length = static_cast<uint32_t>(e.commit_len);
      s.accepted_path.resize(static_cast<size_t>(e.commit_len));
      // copy_n, not memcpy: an empty path's data() may be null, which memcpy may not take.
      std::copy_n(channel::StepPath(shared, spec_.max_q), s.accepted_path.size(),
                  s.accepted_path.data());
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<ChannelWork> StepCapture::LayerWork(
    uint64_t seq, uint32_t i, const std::vector<channel::SequenceEntry>& sequences,
    const absl::Status& record) const {
  auto work = std::make_shared<ChannelWork>();
  RefResolver refs(regions_, owner_, &work->pins);
  const uint32_t value = channel::ReadyValue(seq, spec_.num_layers, i);
  channel::FlagRef ready = spec_.ready;
  channel::FlagRef done = spec_.done;
  ready.value = value;
  done.value = value;
  if (!record.ok()) {
    // The record is not trusted for sizes: the bucket's whole outputs become NaN.
    const uint64_t rows = uint64_t{spec_.max_batch} * spec_.max_q * limits_.heads;
    (void)ResolveFailure(spec_.out, spec_.return_lse ? &spec_.lse : nullptr, ready, done, rows,
                         /*guessed=*/false, refs, work.get());
    work->refused = record;
    return work;
  }
  channel::Descriptor d;
  d.kind = channel::DescriptorKind::kVerify;
  d.id = seq;
  d.layer = spec_.layer_begin + i;
  d.sequences = sequences;
  if (i > 0) {
    // The commits ride on the step's first layer only (the adapter's protocol, plans/0033).
    for (channel::SequenceEntry& s : d.sequences) {
      s.has_commit = false;
      s.commit_length = 0;
      s.accepted_path.clear();
    }
  }
  d.return_lse = spec_.return_lse;
  d.scale = spec_.softmax_scale;
  d.q = spec_.q;
  d.tree_kv = spec_.tree_kv;
  d.out = spec_.out;
  d.lse = spec_.return_lse ? spec_.lse : channel::TensorRef{};
  d.ready = ready;
  d.done = done;
  PrepareVerify(d, limits_, refs, work.get());
  // The engine's WaitDone kernel sits on one SM for the whole call (under MPS, beside this
  // call's kernels); a grid of one CTA per SM would leave one CTA waiting for that SM.
  work->verify.reserved_sms = 1;
  return work;
}

std::optional<StepCapture::Step> StepCapture::Take() {
  const uint64_t seq = published();
  if (seq == taken_) return std::nullopt;
  taken_ = seq;
  std::vector<channel::SequenceEntry> sequences;
  const absl::Status record = CopyRecord(&sequences);
  channel::StepAreaMapping::Store(area_.header().planned_step, seq);
  Step step;
  step.seq = seq;
  for (uint32_t i = 0; i < spec_.num_layers; ++i) {
    if (i < 2 || !record.ok()) {
      step.layers.push_back(LayerWork(seq, i, sequences, record));
      continue;
    }
    // Past the first two, a layer's work differs from layer 1's only in its index and its flags'
    // values (the commits ride on layer 0): a patched copy, instead of checking the same record
    // and resolving the same refs again, which for 61 layers held layer 0 back (plans/0033).
    auto work = std::make_shared<ChannelWork>(*step.layers[1]);
    const uint32_t value = channel::ReadyValue(seq, spec_.num_layers, i);
    work->verify.layer = static_cast<int>(spec_.layer_begin + i);
    for (ExternalOrder* order : {&work->order, &work->failure.order}) {
      order->ready.value = value;
      order->done.value = value;
    }
    step.layers.push_back(std::move(work));
  }
  std::lock_guard<std::mutex> lock(mu_);
  progress_.push_back(Progress{seq, spec_.num_layers, absl::OkStatus()});
  // Bounded: a step's layers all complete (a refused one too), so only steps whose layers are
  // still queued stay; a client cannot publish ahead of its own done waits.
  return step;
}

void StepCapture::LayerDone(uint64_t seq, uint32_t i, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(progress_.begin(), progress_.end(),
                         [seq](const Progress& p) { return p.seq == seq; });
  if (it == progress_.end()) return;
  if (!status.ok() && it->first.ok()) {
    it->first = absl::Status(
        status.code(),
        absl::StrCat("step ", seq, " layer ", spec_.layer_begin + i, ": ", status.message()));
  }
  if (--it->remaining > 0) return;
  channel::StepAreaHeader& h = area_.header();
  if (!it->first.ok()) {
    const absl::string_view m = it->first.message();
    const size_t n = std::min<size_t>(m.size(), channel::kStepMessageBytes);
    std::memcpy(h.message, m.data(), n);
    h.message_bytes = static_cast<uint32_t>(n);
    h.failed_code = static_cast<uint32_t>(it->first.code());
    h.failed_step = seq;
  }
  // Last, with release: the status above is in place once completed_step says so.
  if (seq > channel::StepAreaMapping::Load(h.completed_step)) {
    channel::StepAreaMapping::Store(h.completed_step, seq);
  }
  progress_.erase(it);
}

bool StepCapture::StepFailed(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Progress& p : progress_) {
    if (p.seq == seq) return !p.first.ok();
  }
  return false;
}

void StepCapture::End() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  ended_ = true;
  channel::StepAreaMapping::Store(area_.header().epoch, 0);
  shm_unlink(info_.path.c_str());
}

}  // namespace verifyd
