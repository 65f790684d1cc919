#include "kvstore/slot_allocator.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

std::vector<int32_t> Slots(const std::vector<SlotRun>& runs) {
  std::vector<int32_t> slots;
  for (const SlotRun& run : runs) {
    for (int32_t s = run.begin; s < run.end(); ++s) slots.push_back(s);
  }
  return slots;
}

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> slots;
  for (int32_t s = begin; s < end; ++s) slots.push_back(s);
  return slots;
}

// Allocates everything, then frees the given ranges, leaving exactly those free.
SlotAllocator WithFreeRanges(int64_t capacity, const std::vector<std::pair<int, int>>& ranges) {
  SlotAllocator allocator(capacity);
  EXPECT_TRUE(allocator.Allocate(capacity).ok());
  for (auto [begin, end] : ranges) EXPECT_TRUE(allocator.Free(Range(begin, end)).ok());
  return allocator;
}

TEST(SlotAllocatorTest, HandsOutTheLowestRunThatHoldsTheRequestNotTheShortest) {
  SlotAllocator allocator = WithFreeRanges(100, {{2, 5}, {30, 50}, {60, 65}});
  auto runs = allocator.Allocate(4);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].begin, 30);
  EXPECT_EQ((*runs)[0].length, 4);
  auto small = allocator.Allocate(3);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(Slots(*small), Range(2, 5));
  EXPECT_EQ(allocator.free_slots(), 16 + 5);
  EXPECT_EQ(allocator.largest_free_run(), 16);
}

TEST(SlotAllocatorTest, FallsBackToTheLowestSlotsWhenNoRunHoldsTheRequest) {
  SlotAllocator allocator = WithFreeRanges(12, {{0, 2}, {5, 8}, {10, 12}});
  auto runs = allocator.Allocate(6);
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(Slots(*runs), (std::vector<int32_t>{0, 1, 5, 6, 7, 10}));
  EXPECT_EQ(allocator.free_slots(), 1);
  EXPECT_TRUE(allocator.IsFree(11));
  EXPECT_FALSE(allocator.IsFree(10));
}

TEST(SlotAllocatorTest, ExhaustionNamesTheFieldAndTheCountsAndChangesNothing) {
  SlotAllocator allocator = WithFreeRanges(64, {{3, 9}, {40, 41}});
  auto runs = allocator.Allocate(8, "num_tokens");
  ASSERT_EQ(runs.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(runs.status().message().find("num_tokens"), std::string::npos);
  EXPECT_NE(runs.status().message().find("need 8"), std::string::npos);
  EXPECT_NE(runs.status().message().find("only 7 of 64"), std::string::npos);
  EXPECT_EQ(allocator.free_slots(), 7);
  EXPECT_EQ(allocator.FreeRuns().size(), 2u);
}

TEST(SlotAllocatorTest, DoubleFreeIsInternalAndChangesNothing) {
  SlotAllocator allocator(32);
  ASSERT_TRUE(allocator.Allocate(20).ok());
  ASSERT_TRUE(allocator.Free(Range(4, 8)).ok());
  const std::vector<int32_t> twice_in_one_call = {10, 11, 10};
  EXPECT_EQ(allocator.Free(twice_in_one_call).code(), absl::StatusCode::kInternal);
  const std::vector<int32_t> already_free = {12, 6};
  EXPECT_EQ(allocator.Free(already_free).code(), absl::StatusCode::kInternal);
  const std::vector<int32_t> never_allocated = {25};
  EXPECT_EQ(allocator.Free(never_allocated).code(), absl::StatusCode::kInternal);
  const std::vector<int32_t> out_of_range = {1, 32};
  EXPECT_EQ(allocator.Free(out_of_range).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator.free_slots(), 16);
  EXPECT_FALSE(allocator.IsFree(12));
  EXPECT_FALSE(allocator.IsFree(1));
}

TEST(SlotAllocatorTest, FreeMergesNeighbouringExtents) {
  SlotAllocator allocator = WithFreeRanges(30, {{0, 5}, {10, 15}});
  ASSERT_TRUE(allocator.Free(Range(5, 10)).ok());
  auto runs = allocator.FreeRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].begin, 0);
  EXPECT_EQ(runs[0].length, 15);
  EXPECT_EQ(allocator.largest_free_run(), 15);
}

TEST(SlotAllocatorTest, AllocateAfterExtendsInPlaceOrFallsBackToOneRun) {
  SlotAllocator allocator = WithFreeRanges(100, {{10, 14}, {20, 60}});
  auto in_place = allocator.AllocateAfter(10, 3);
  ASSERT_TRUE(in_place.ok());
  EXPECT_EQ(Slots(*in_place), Range(10, 13));
  // Only one slot is left at 13: the request goes to the lowest run that holds it.
  auto moved = allocator.AllocateAfter(13, 5);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(Slots(*moved), Range(20, 25));
  auto exhausted = allocator.AllocateAfter(25, 100);
  EXPECT_EQ(exhausted.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(SlotAllocatorTest, ReserveTakesExactlyAFreeRange) {
  SlotAllocator allocator = WithFreeRanges(50, {{10, 30}});
  ASSERT_TRUE(allocator.Reserve({15, 5}).ok());
  EXPECT_TRUE(allocator.IsFree(14));
  EXPECT_FALSE(allocator.IsFree(15));
  EXPECT_FALSE(allocator.IsFree(19));
  EXPECT_TRUE(allocator.IsFree(20));
  EXPECT_EQ(allocator.Reserve({18, 4}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(allocator.Reserve({45, 10}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator.free_slots(), 15);
}

// The allocator against a std::vector<bool> whose answers are computed by linear scans.
class AllocatorModel {
 public:
  explicit AllocatorModel(int capacity) : free_(capacity, true) {}

  std::vector<SlotRun> Runs() const {
    std::vector<SlotRun> runs;
    for (int s = 0; s < static_cast<int>(free_.size()); ++s) {
      if (!free_[s]) continue;
      if (!runs.empty() && runs.back().end() == s) {
        ++runs.back().length;
      } else {
        runs.push_back({s, 1});
      }
    }
    return runs;
  }
  int64_t FreeCount() const { return std::count(free_.begin(), free_.end(), true); }
  std::vector<int32_t> ExpectedAllocation(int64_t n) const {
    for (const SlotRun& run : Runs()) {
      if (run.length >= n) return Range(run.begin, run.begin + static_cast<int32_t>(n));
    }
    std::vector<int32_t> slots;
    for (int s = 0; s < static_cast<int>(free_.size()) && static_cast<int64_t>(slots.size()) < n;
         ++s) {
      if (free_[s]) slots.push_back(s);
    }
    return slots;
  }
  void Set(const std::vector<int32_t>& slots, bool value) {
    for (int32_t s : slots) free_[s] = value;
  }
  bool IsFree(int s) const { return free_[s]; }

 private:
  std::vector<bool> free_;
};

TEST(SlotAllocatorTest, RandomizedAgainstABitVectorModel) {
  constexpr int kCapacity = 300;
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  SlotAllocator allocator(kCapacity);
  AllocatorModel model(kCapacity);
  std::vector<int32_t> allocated;
  for (int step = 0; step < 20000; ++step) {
    const int op = rng() % 4;
    if (op == 0) {
      const int64_t n = 1 + rng() % 40;
      auto runs = allocator.Allocate(n);
      if (n > model.FreeCount()) {
        ASSERT_EQ(runs.status().code(), absl::StatusCode::kResourceExhausted);
      } else {
        ASSERT_TRUE(runs.ok()) << runs.status();
        ASSERT_EQ(Slots(*runs), model.ExpectedAllocation(n)) << "step " << step;
        model.Set(Slots(*runs), false);
        for (int32_t s : Slots(*runs)) allocated.push_back(s);
      }
    } else if (op == 1 && !allocated.empty()) {
      std::shuffle(allocated.begin(), allocated.end(), rng);
      const size_t k = 1 + rng() % allocated.size();
      std::vector<int32_t> freed(allocated.end() - k, allocated.end());
      if (rng() % 8 == 0) freed.push_back(freed[0]);  // a double free: must change nothing
      const absl::Status status = allocator.Free(freed);
      if (freed.size() > k) {
        ASSERT_EQ(status.code(), absl::StatusCode::kInternal);
      } else {
        ASSERT_TRUE(status.ok()) << status;
        model.Set(freed, true);
        allocated.resize(allocated.size() - k);
      }
    } else if (op == 2) {
      const int32_t begin = rng() % kCapacity;
      const int32_t length = 1 + rng() % std::min(8, kCapacity - begin);
      bool all_free = true;
      for (int32_t s = begin; s < begin + length; ++s) all_free = all_free && model.IsFree(s);
      const absl::Status status = allocator.Reserve({begin, length});
      ASSERT_EQ(status.ok(), all_free) << status;
      if (all_free) {
        model.Set(Range(begin, begin + length), false);
        for (int32_t s = begin; s < begin + length; ++s) allocated.push_back(s);
      }
    } else if (op == 3) {
      const int32_t hint = rng() % kCapacity;
      const int64_t n = 1 + rng() % 20;
      int64_t run_at_hint = 0;
      while (hint + run_at_hint < kCapacity && model.IsFree(hint + run_at_hint) &&
             (hint == 0 || !model.IsFree(hint - 1))) {
        ++run_at_hint;
      }
      auto runs = allocator.AllocateAfter(hint, n);
      if (n > model.FreeCount()) {
        ASSERT_FALSE(runs.ok());
        continue;
      }
      ASSERT_TRUE(runs.ok());
      const std::vector<int32_t> expected = run_at_hint >= n
                                                ? Range(hint, hint + static_cast<int32_t>(n))
                                                : model.ExpectedAllocation(n);
      ASSERT_EQ(Slots(*runs), expected) << "step " << step;
      model.Set(expected, false);
      for (int32_t s : expected) allocated.push_back(s);
    }
    // The whole state, every step.
    ASSERT_EQ(allocator.free_slots(), model.FreeCount());
    const std::vector<SlotRun> expected_runs = model.Runs();
    const std::vector<SlotRun> runs = allocator.FreeRuns();
    ASSERT_EQ(runs.size(), expected_runs.size()) << "step " << step;
    int64_t largest = 0;
    for (size_t k = 0; k < runs.size(); ++k) {
      ASSERT_EQ(runs[k].begin, expected_runs[k].begin);
      ASSERT_EQ(runs[k].length, expected_runs[k].length);
      largest = std::max<int64_t>(largest, runs[k].length);
    }
    ASSERT_EQ(allocator.largest_free_run(), largest);
    const int64_t probe = 1 + rng() % 50;
    std::optional<SlotRun> found = allocator.FindRun(probe);
    const std::vector<int32_t> lowest = model.ExpectedAllocation(probe);
    const bool fits = !lowest.empty() && lowest.back() - lowest.front() + 1 == probe &&
                      static_cast<int64_t>(lowest.size()) == probe;
    ASSERT_EQ(found.has_value(), fits) << "step " << step;
    if (found) {
      ASSERT_EQ(found->begin, lowest.front());
    }
    const int64_t from = rng() % kCapacity;
    std::optional<SlotRun> expected_from;
    for (const SlotRun& run : expected_runs) {
      if (run.begin >= from && run.length >= probe) {
        expected_from = run;
        break;
      }
    }
    found = allocator.FindRunFrom(probe, from);
    ASSERT_EQ(found.has_value(), expected_from.has_value()) << "step " << step;
    if (found) {
      ASSERT_EQ(found->begin, expected_from->begin);
      ASSERT_EQ(found->length, expected_from->length);
    }
    for (int s = 0; s < kCapacity; s += 7) ASSERT_EQ(allocator.IsFree(s), model.IsFree(s));
  }
}

}  // namespace
}  // namespace verifyd
