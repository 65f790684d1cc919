// Host-only checks of the CUDA backend's bookkeeping: the packed staging layout (every array lands
// intact, aligned, without overlap, the slot lists read back from the arena after the scatter, and
// the one upload ends where the partials begin), its stability over a decode band, and the plan
// cache (hits return the same plan, misses plan anew).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_graph_cache.h"
#include "backend/cuda/cuda_plan_cache.h"
#include "backend/cuda/cuda_slot_mirror.h"
#include "backend/cuda/cuda_verify_staging.h"
#include "kernels/split_planner.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::HostProblem;
using test::MakeRandomProblem;
using test::SequenceSpec;
using test::TreeShape;

template <typename T>
std::vector<T> Read(const std::vector<uint8_t>& buffer, const T* ptr, size_t count) {
  const auto* base = buffer.data();
  const auto* at = reinterpret_cast<const uint8_t*>(ptr);
  EXPECT_GE(at, base);
  EXPECT_LE(at + count * sizeof(T), base + buffer.size());
  std::vector<T> values(count);
  std::memcpy(values.data(), at, count * sizeof(T));
  return values;
}

TEST(VerifyStaging, EveryArrayRoundTripsThroughTheLayout) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 5);
    std::vector<SequenceSpec> specs;
    for (int b = 0; b < batch; ++b) {
      specs.push_back({static_cast<int>(rng() % 300), 1 + static_cast<int>(rng() % 130),
                       static_cast<TreeShape>(rng() % 4)});
    }
    const int heads = 1 + static_cast<int>(rng() % 9);
    HostProblem host = MakeRandomProblem(specs, heads, rng(), /*scattered=*/true, 17);
    VerifyProblem p = host.problem();
    if (trial % 2 == 1) p.lse = nullptr;
    absl::StatusOr<SplitPlan> plan = PlanSplits(
        host.prefix_len,
        [&] {
          std::vector<int32_t> q(batch);
          for (int b = 0; b < batch; ++b) q[b] = host.qo_indptr[b + 1] - host.qo_indptr[b];
          return q;
        }(),
        heads, 1 + static_cast<int>(rng() % 140));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const WorkspaceLayout ws = LayoutWorkspace(*plan);
    const std::vector<uint8_t> packed = PackPlan(*plan, ws);

    // The slot lists as a store would give them, through a mirror: the first call uploads every
    // list whole.
    std::vector<VerifySlotList> lists;
    for (int b = 0; b < batch; ++b) {
      const int32_t* at = host.slots.data() + host.slot_indptr[b];
      const size_t n = static_cast<size_t>(host.prefix_len[b]);
      const size_t q = static_cast<size_t>(host.qo_indptr[b + 1] - host.qo_indptr[b]);
      lists.push_back({static_cast<SequenceId>(b + 1), 1, {at, n}, {at + n, q}});
    }
    SlotMirror mirror(1 << 16);
    absl::StatusOr<const SlotMirrorPlan*> slots = mirror.Plan(lists, host.num_slots);
    ASSERT_TRUE(slots.ok()) << slots.status();
    ASSERT_EQ((*slots)->num_values, static_cast<int64_t>(host.slots.size()));

    const VerifyStagingLayout layout =
        LayoutVerifyStaging(p, (*slots)->num_values, packed.size(), ws.total_bytes);
    for (size_t offset :
         {layout.q, layout.qo_indptr, layout.prefix_len, layout.slot_indptr, layout.tree_slots,
          layout.value_words, layout.slot_header, layout.slot_runs, layout.slot_values,
          layout.mask_indptr, layout.mask_bits, layout.workspace, layout.lse}) {
      EXPECT_EQ(offset % 256, 0u);
    }
    EXPECT_GE(layout.slot_value_capacity, static_cast<size_t>((*slots)->num_values));
    EXPECT_LE(layout.slot_values + layout.slot_value_capacity * 4, layout.mask_indptr);
    EXPECT_LE(layout.slot_runs + batch * sizeof(SlotScatterRun), layout.slot_values);
    // The tree rows' slots lie in the upload (after the index arrays, before the slot region).
    EXPECT_GE(layout.tree_slots, layout.slot_indptr + (batch + 1) * sizeof(int32_t));
    EXPECT_LE(layout.tree_slots + static_cast<size_t>(p.total_q) * 4, layout.value_words);
    // So do the value check's two words, which the upload arms (between the tree slots and the
    // slot region, inside the copy whatever the direct copies skip).
    EXPECT_LE(layout.value_words + 16, layout.slot_header);
    EXPECT_GE(layout.value_words, layout.qo_indptr);
    EXPECT_EQ(layout.upload_bytes, layout.workspace + ws.partial_o_offset);
    EXPECT_EQ(layout.input_bytes,
              std::max(layout.workspace + ws.total_bytes, layout.upload_copy_bytes));
    EXPECT_EQ(layout.upload_copy_bytes, CopyBytesFor(layout.upload_bytes));
    EXPECT_EQ(layout.output_copy_bytes, CopyBytesFor(layout.output_bytes));
    const size_t rows = static_cast<size_t>(p.total_q) * heads;
    EXPECT_EQ(layout.out_bytes, rows * kVDim * 2);
    EXPECT_EQ(layout.lse_bytes, p.lse != nullptr ? rows * 4 : 0u);
    EXPECT_GE(layout.lse, layout.out_bytes);

    // Staging filled with a pattern first: whatever Fill leaves out would show up as 0xA5.
    std::vector<uint8_t> staging(layout.upload_bytes, 0xA5);
    VerifyProblem without_lists = p;  // the backend never reads them in this form
    without_lists.slots = nullptr;
    without_lists.slot_indptr = nullptr;
    FillVerifyStaging(layout, without_lists, (*slots)->list_offset, packed, staging.data());
    WriteSlotUploads(lists, **slots,
                     reinterpret_cast<SlotScatterHeader*>(&staging[layout.slot_header]),
                     reinterpret_cast<SlotScatterRun*>(&staging[layout.slot_runs]),
                     reinterpret_cast<int32_t*>(&staging[layout.slot_values]));
    std::vector<uint8_t> device_inputs(layout.input_bytes, 0);
    std::memcpy(device_inputs.data(), staging.data(), staging.size());
    std::vector<uint8_t> device_outputs(layout.output_bytes, 0);
    std::vector<int32_t> arena(mirror.arena_entries(), -1);
    const VerifyProblem d = PlaceVerifyProblem(layout, without_lists, device_inputs.data(),
                                               device_outputs.data(), arena.data());

    EXPECT_EQ(Read(device_inputs, d.q, host.q.size()), host.q);
    EXPECT_EQ(Read(device_inputs, d.qo_indptr, batch + 1), host.qo_indptr);
    EXPECT_EQ(Read(device_inputs, d.prefix_len, batch), host.prefix_len);
    const std::vector<int32_t> offsets = Read(device_inputs, d.slot_indptr, batch);
    EXPECT_EQ(offsets, (*slots)->list_offset);
    EXPECT_EQ(d.slots, arena.data());
    // The scatter's work on the host: every list then reads back at slots + slot_indptr[b].
    const auto* header =
        reinterpret_cast<const SlotScatterHeader*>(&device_inputs[layout.slot_header]);
    const auto* runs = reinterpret_cast<const SlotScatterRun*>(&device_inputs[layout.slot_runs]);
    const auto* values = reinterpret_cast<const int32_t*>(&device_inputs[layout.slot_values]);
    ASSERT_EQ(header->num_values, (*slots)->num_values);
    ASSERT_EQ(header->num_runs, batch);
    for (int r = 0; r < header->num_runs; ++r) {
      const int end = r + 1 < header->num_runs ? runs[r + 1].value_begin : header->num_values;
      for (int i = runs[r].value_begin; i < end; ++i) {
        arena[runs[r].arena_offset + (i - runs[r].value_begin)] = values[i];
      }
    }
    for (int b = 0; b < batch; ++b) {
      const int len = host.slot_indptr[b + 1] - host.slot_indptr[b];
      EXPECT_EQ(std::vector<int32_t>(arena.begin() + offsets[b], arena.begin() + offsets[b] + len),
                std::vector<int32_t>(host.slots.begin() + host.slot_indptr[b],
                                     host.slots.begin() + host.slot_indptr[b + 1]))
          << "sequence " << b;
    }
    EXPECT_EQ(Read(device_inputs, d.mask_indptr, batch + 1), host.mask_indptr);
    EXPECT_EQ(Read(device_inputs, d.mask_bits, host.mask_bits.size()), host.mask_bits);
    EXPECT_EQ(Read(device_inputs,
                   reinterpret_cast<const uint8_t*>(device_inputs.data()) + layout.workspace,
                   packed.size()),
              packed);
    EXPECT_EQ(reinterpret_cast<uint8_t*>(d.out), device_outputs.data() + layout.out);
    if (p.lse != nullptr) {
      EXPECT_EQ(reinterpret_cast<uint8_t*>(d.lse) + layout.lse_bytes,
                device_outputs.data() + layout.output_bytes);
    } else {
      EXPECT_EQ(d.lse, nullptr);
    }
    // Scalars and the pool are untouched.
    EXPECT_EQ(d.kv, p.kv);
    EXPECT_EQ(d.num_slots, p.num_slots);
    EXPECT_EQ(d.batch, p.batch);
    EXPECT_EQ(d.total_q, p.total_q);
    EXPECT_EQ(d.num_heads, p.num_heads);
    EXPECT_EQ(d.scale, p.scale);
  }
}

// What a decode step changes (prefix lengths, the slot values uploaded within their band, the
// plan's item data) must not change the layout: a graph keyed on it would be re-captured every
// step.
TEST(VerifyStaging, LayoutDependsOnlyOnShapesCountsAndBands) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 8);
    const int nodes = 1 + static_cast<int>(rng() % 64);
    std::vector<SequenceSpec> specs(batch, SequenceSpec{0, nodes, TreeShape::kRandom});
    for (SequenceSpec& spec : specs) spec.prefix_len = 100 + static_cast<int>(rng() % 500);
    HostProblem first = MakeRandomProblem(specs, 8, rng(), true, 3);
    for (SequenceSpec& spec : specs) spec.prefix_len += 1 + static_cast<int>(rng() % nodes);
    HostProblem later = MakeRandomProblem(specs, 8, rng(), true, 3);
    const size_t plan_bytes = 256 * (1 + rng() % 8), workspace = plan_bytes + (rng() % 100000);
    const VerifyStagingLayout a =
        LayoutVerifyStaging(first.problem(), rng() % 1025, plan_bytes, workspace);
    const VerifyStagingLayout b =
        LayoutVerifyStaging(later.problem(), rng() % 1025, plan_bytes, workspace);
    EXPECT_EQ(a, b) << "trial " << trial;
    // A cold call (whole lists) takes a larger band: a different layout, as it must.
    const VerifyStagingLayout cold =
        LayoutVerifyStaging(later.problem(), later.slots.size() + 2000, plan_bytes, workspace);
    EXPECT_NE(cold, b);
    EXPECT_GE(cold.slot_value_capacity, later.slots.size() + 2000);
  }
}

TEST(SplitPlanCache, HitsReturnTheRememberedPlanAndMissesPlanAnew) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  SplitPlanCache cache(/*num_sms=*/132, /*capacity=*/3);
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back({static_cast<int32_t>(100 + rng() % 50000)});
  prefixes[1][0] = prefixes[0][0] + 1;  // neighbours must not collide
  const std::vector<int32_t> q = {static_cast<int32_t>(1 + rng() % 256)};
  std::vector<uint64_t> ids;
  for (const auto& prefix : prefixes) {
    absl::StatusOr<const CachedPlan*> got = cache.Get(prefix, q, 16);
    ASSERT_TRUE(got.ok()) << got.status();
    absl::StatusOr<SplitPlan> fresh = PlanSplits(prefix, q, 16, 132);
    ASSERT_TRUE(fresh.ok());
    EXPECT_EQ((*got)->packed, PackPlan(*fresh, LayoutWorkspace(*fresh)));
    ids.push_back((*got)->id);
  }
  EXPECT_EQ(cache.plans_made(), 4);
  // prefixes[1..3] are remembered (capacity 3): same ids, no planning.
  for (int i = 3; i >= 1; --i) {
    absl::StatusOr<const CachedPlan*> again = cache.Get(prefixes[i], q, 16);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)->id, ids[i]);
  }
  EXPECT_EQ(cache.plans_made(), 4);
  // Other heads is another shape; prefixes[0] was evicted.
  ASSERT_TRUE(cache.Get(prefixes[1], q, 8).ok());
  absl::StatusOr<const CachedPlan*> evicted = cache.Get(prefixes[0], q, 16);
  ASSERT_TRUE(evicted.ok());
  EXPECT_NE((*evicted)->id, ids[0]);
  EXPECT_EQ(cache.plans_made(), 6);
}

// A captured layer's call leaves SMs to the engine's resident kernel: its plan is the planner's
// on the SMs left, keyed apart from the same shape's full-device plan, and never on zero SMs.
TEST(SplitPlanCache, ReservedSmsArePlannedAroundAndKeyedApart) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  SplitPlanCache cache(/*num_sms=*/132, /*capacity=*/4);
  const std::vector<int32_t> prefix = {static_cast<int32_t>(60000 + rng() % 150000)};
  const std::vector<int32_t> q = {static_cast<int32_t>(1 + rng() % 64)};
  absl::StatusOr<const CachedPlan*> full = cache.Get(prefix, q, 8);
  ASSERT_TRUE(full.ok()) << full.status();
  const uint64_t full_id = (*full)->id;
  absl::StatusOr<const CachedPlan*> reserved = cache.Get(prefix, q, 8, /*reserved_sms=*/1);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_NE((*reserved)->id, full_id);
  absl::StatusOr<SplitPlan> fresh = PlanSplits(prefix, q, 8, 131);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*reserved)->packed, PackPlan(*fresh, LayoutWorkspace(*fresh)));
  // The full plan is still remembered under its own key.
  absl::StatusOr<const CachedPlan*> again = cache.Get(prefix, q, 8);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->id, full_id);
  // More reserved than the device has: one SM is planned on, not none.
  absl::StatusOr<const CachedPlan*> all = cache.Get(prefix, q, 8, /*reserved_sms=*/500);
  ASSERT_TRUE(all.ok()) << all.status();
  absl::StatusOr<SplitPlan> one = PlanSplits(prefix, q, 8, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*all)->packed, PackPlan(*one, LayoutWorkspace(*one)));
  EXPECT_EQ(cache.plans_made(), 3);
}

TEST(VerifyStaging, CopySizesCoverTheBytesWithAtMostAnEighthMore) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  EXPECT_EQ(CopyBytesFor(0), 4096u);
  EXPECT_EQ(CopyBytesFor(4097), 4608u);
  for (int i = 0; i < 100000; ++i) {
    const size_t bytes = 1 + rng() % (size_t{1} << (1 + rng() % 34));
    const size_t copy = CopyBytesFor(bytes);
    ASSERT_GE(copy, bytes);
    ASSERT_LE(copy, std::max<size_t>(4096, bytes + bytes / 8)) << bytes;
    // Idempotent: a band's copy size is its own band's size, so all sizes of a band agree.
    ASSERT_EQ(CopyBytesFor(copy), copy) << bytes;
  }
}

// RegisteredHostRanges against a brute-force model: a query is direct only when it lies wholly
// inside one registered range (not across two adjacent ones, not past an end).
TEST(RegisteredHostRanges, ContainsExactlyWhatLiesInsideOneRange) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> memory(1 << 16);
  uint8_t* base = memory.data();
  RegisteredHostRanges ranges;
  std::vector<std::pair<size_t, size_t>> model;  // [begin, end) offsets
  auto model_contains = [&](size_t begin, size_t bytes) {
    for (const auto& [b, e] : model) {
      if (bytes > 0 && begin >= b && begin + bytes <= e) return true;
    }
    return false;
  };
  auto model_overlaps = [&](size_t begin, size_t bytes) {
    for (const auto& [b, e] : model) {
      if (begin < e && b < begin + bytes) return true;
    }
    return false;
  };
  EXPECT_EQ(ranges.Add(nullptr, 10).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ranges.Add(base, 0).code(), absl::StatusCode::kInvalidArgument);
  for (int step = 0; step < 4000; ++step) {
    const size_t begin = rng() % memory.size();
    const size_t bytes = 1 + rng() % std::min<size_t>(memory.size() - begin, 4096);
    switch (rng() % 4) {
      case 0: {  // add
        const absl::Status added = ranges.Add(base + begin, bytes);
        if (model_overlaps(begin, bytes)) {
          EXPECT_EQ(added.code(), absl::StatusCode::kAlreadyExists) << begin << "+" << bytes;
        } else {
          ASSERT_TRUE(added.ok()) << added;
          model.emplace_back(begin, begin + bytes);
        }
        break;
      }
      case 1: {  // remove one, or a pointer that starts none
        if (!model.empty() && rng() % 2 == 0) {
          const size_t i = rng() % model.size();
          EXPECT_TRUE(ranges.Remove(base + model[i].first));
          EXPECT_FALSE(ranges.Remove(base + model[i].first));
          model.erase(model.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          const bool starts_one = std::any_of(model.begin(), model.end(),
                                              [&](const auto& r) { return r.first == begin; });
          EXPECT_EQ(ranges.Remove(base + begin), starts_one);
          if (starts_one) {
            model.erase(std::find_if(model.begin(), model.end(),
                                     [&](const auto& r) { return r.first == begin; }));
          }
        }
        break;
      }
      default: {  // queries, often at the edges of a range
        size_t at = begin, len = bytes;
        if (!model.empty() && rng() % 2 == 0) {
          const auto& [b, e] = model[rng() % model.size()];
          at = b + rng() % (e - b);
          len = (e - at) + static_cast<size_t>(static_cast<int>(rng() % 3) - 1);  // to the end ±1
          if (len == 0) len = 1;
        }
        EXPECT_EQ(ranges.Contains(base + at, len), model_contains(at, len)) << at << "+" << len;
        EXPECT_FALSE(ranges.Contains(base + at, 0));
      }
    }
    ASSERT_EQ(ranges.size(), model.size());
  }
  EXPECT_FALSE(ranges.Contains(nullptr, 1));
}

// The direct path on the host: q straight from the caller plus the staged rest of the upload puts
// the same bytes in the device inputs as the all-staged upload; the staged readback plus the
// direct output copies put every output byte where the caller wants it, and nothing else is
// written into the caller's memory.
TEST(VerifyStaging, DirectCopiesAndTheStagedRestMoveEveryByteOnce) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 48; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 4);
    std::vector<SequenceSpec> specs;
    for (int b = 0; b < batch; ++b) {
      specs.push_back({static_cast<int>(rng() % 200), 1 + static_cast<int>(rng() % 40),
                       static_cast<TreeShape>(rng() % 4)});
    }
    HostProblem host = MakeRandomProblem(specs, 1 + static_cast<int>(rng() % 8), rng(), true, 5);
    const int mode = trial % 8;  // bit 0: q registered, bit 1: out, bit 2: lse
    const bool with_lse = trial % 16 < 8 || (mode & 4) != 0;
    VerifyProblem p = host.problem();
    if (!with_lse) p.lse = nullptr;
    const VerifyStagingLayout layout = LayoutVerifyStaging(p, 0, 512, 4096);

    // A "region": q, out and lse at random 64-byte-aligned places, with guard bytes around them.
    const size_t guard = 64 * (1 + rng() % 4);
    std::vector<uint8_t> region(layout.q_bytes + layout.out_bytes + layout.lse_bytes + 4 * guard);
    for (uint8_t& byte : region) byte = static_cast<uint8_t>(rng());
    const std::vector<uint8_t> region_before = region;
    uint8_t* q_at = region.data() + guard;
    uint8_t* out_at = q_at + layout.q_bytes + guard;
    uint8_t* lse_at = out_at + layout.out_bytes + guard;
    RegisteredHostRanges ranges;
    ASSERT_TRUE(ranges.Add(region.data(), region.size()).ok());
    std::vector<bf16_bits> out_vector(host.out.size());
    std::vector<float> lse_vector(host.lse.size());
    VerifyProblem caller = p;
    if (mode & 1) {
      std::memcpy(q_at, host.q.data(), layout.q_bytes);
      caller.q = reinterpret_cast<const bf16_bits*>(q_at);
    }
    caller.out = (mode & 2) ? reinterpret_cast<bf16_bits*>(out_at) : out_vector.data();
    if (with_lse) caller.lse = (mode & 4) ? reinterpret_cast<float*>(lse_at) : lse_vector.data();

    const DirectCopies direct = ChooseDirectCopies(layout, caller, ranges);
    EXPECT_EQ(direct.q, (mode & 1) != 0);
    EXPECT_EQ(direct.out, (mode & 2) != 0);
    EXPECT_EQ(direct.lse, with_lse && (mode & 4) != 0);
    // One byte past the region is not inside it.
    VerifyProblem shifted = caller;
    shifted.q =
        reinterpret_cast<const bf16_bits*>(region.data() + region.size() - layout.q_bytes + 2);
    EXPECT_FALSE(ChooseDirectCopies(layout, shifted, ranges).q);

    // Inputs: all-staged reference vs direct q + staged rest.
    const std::vector<uint8_t> plan(512, static_cast<uint8_t>(rng()));
    const std::vector<int32_t> offsets(batch, 7);
    std::vector<uint8_t> staged(layout.upload_copy_bytes, 0xA5),
        split(layout.upload_copy_bytes, 0xA5);
    FillVerifyStaging(layout, p, offsets, plan, staged.data());
    FillVerifyStaging(layout, caller, offsets, plan, split.data(), nullptr, !direct.q);
    if (direct.q) {  // the q region of the staging is left alone
      EXPECT_TRUE(std::all_of(split.begin(), split.begin() + layout.q_bytes,
                              [](uint8_t v) { return v == 0xA5; }));
    }
    std::vector<uint8_t> inputs_reference(layout.upload_copy_bytes, 0x11);
    std::vector<uint8_t> inputs(layout.upload_copy_bytes, 0x11);
    std::memcpy(inputs_reference.data(), staged.data(), layout.upload_copy_bytes);
    if (direct.q) std::memcpy(inputs.data() + layout.q, caller.q, layout.q_bytes);
    const StagedCopy upload = StagedUpload(layout, direct);
    ASSERT_LE(upload.offset + upload.bytes, layout.upload_copy_bytes);
    EXPECT_EQ(upload.offset + upload.bytes, layout.upload_copy_bytes);
    std::memcpy(inputs.data() + upload.offset, split.data() + upload.offset, upload.bytes);
    // Everything but the alignment padding after q (never read) is the same.
    EXPECT_EQ(std::memcmp(inputs.data(), inputs_reference.data(), layout.q_bytes), 0);
    EXPECT_EQ(
        std::memcmp(inputs.data() + layout.qo_indptr, inputs_reference.data() + layout.qo_indptr,
                    layout.upload_bytes - layout.qo_indptr),
        0);

    // Outputs: random device bytes; the staged readback then the host copies of what was staged.
    std::vector<uint8_t> device_outputs(layout.output_copy_bytes);
    for (uint8_t& byte : device_outputs) byte = static_cast<uint8_t>(rng());
    std::vector<uint8_t> host_outputs(layout.output_copy_bytes, 0x5A);
    const StagedCopy readback = StagedOutputs(layout, direct);
    ASSERT_LE(readback.offset + readback.bytes, layout.output_copy_bytes);
    if (!direct.out && (!with_lse || !direct.lse)) {
      EXPECT_EQ(readback.bytes, layout.output_copy_bytes) << "the banded size when all staged";
    }
    if (direct.out && (!with_lse || direct.lse)) EXPECT_EQ(readback.bytes, 0u);
    std::memcpy(host_outputs.data() + readback.offset, device_outputs.data() + readback.offset,
                readback.bytes);
    const uint8_t* out_source = direct.out ? device_outputs.data() : host_outputs.data();
    std::memcpy(caller.out, out_source + layout.out, layout.out_bytes);
    if (with_lse) {
      const uint8_t* lse_source = direct.lse ? device_outputs.data() : host_outputs.data();
      std::memcpy(caller.lse, lse_source + layout.lse, layout.lse_bytes);
    }
    EXPECT_EQ(std::memcmp(caller.out, device_outputs.data() + layout.out, layout.out_bytes), 0);
    if (with_lse) {
      EXPECT_EQ(std::memcmp(caller.lse, device_outputs.data() + layout.lse, layout.lse_bytes), 0);
    }
    // The region outside the tensors this call owns there is as it was.
    for (size_t i = 0; i < region.size(); ++i) {
      const uint8_t* at = region.data() + i;
      const bool in_out = (mode & 2) && at >= out_at && at < out_at + layout.out_bytes;
      const bool in_lse = with_lse && (mode & 4) && at >= lse_at && at < lse_at + layout.lse_bytes;
      const bool in_q = (mode & 1) && at >= q_at && at < q_at + layout.q_bytes;
      if (!in_out && !in_lse && !in_q) ASSERT_EQ(region[i], region_before[i]) << "byte " << i;
    }
  }
}

TEST(VerifyGraphBucket, TotalQRoundsUpToAPowerOfTwo) {
  EXPECT_EQ(TotalQBucket(1), 8);
  EXPECT_EQ(TotalQBucket(8), 8);
  EXPECT_EQ(TotalQBucket(9), 16);
  EXPECT_EQ(TotalQBucket(257), 512);
  EXPECT_EQ(TotalQBucket(1024), 1024);
}

}  // namespace
}  // namespace verifyd
