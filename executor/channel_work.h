// What one channel call asks the executor to do (plans/0017), built from a decoded descriptor or
// from a captured step's layer (plans/0033, executor/step_capture.h): its validated call, the
// pointers its refs resolve to in the owner's registered regions, its stream order, and what a
// refusal NaN-fills. Shared by the ring's descriptors and the captured steps so that both answer
// the same codes and messages for the same mistakes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/external_tensors.h"
#include "channel/descriptor.h"
#include "executor/external_regions.h"
#include "executor/request_types.h"
#include "executor/verify_validation.h"

namespace verifyd {

// What one descriptor asks the executor to do.
struct ChannelWork {
  channel::DescriptorKind kind = channel::DescriptorKind::kVerify;
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
                              uint64_t rows, bool guessed, RefResolver& refs, ChannelWork* work);

// Builds the work of a Verify descriptor. Everything the failure path needs (out, lse, ready,
// done) is resolved even when an earlier check failed, so that a refused call still completes.
void PrepareVerify(const channel::Descriptor& d, const ValidationLimits& limits, RefResolver& refs,
                   ChannelWork* work);

void PrepareCommit(const channel::Descriptor& d, const ValidationLimits& limits, ChannelWork* work);

}  // namespace verifyd
