// SPEC §1 on the device (kernels/value_bound_check.h): the first out-of-bound element of a tensor
// with its value, exactly as the host's FirstOutOfBound finds it, also with the slot-table scatter
// in the same launch; and the NaN fill of a refused call's outputs, which leaves a clean call's
// outputs untouched and hands the words to the host, re-arming them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/value_bound_check.h"
#include "tests/kernels/device_problem.h"
#include "verify/value_bound.h"

namespace verifyd::test {
namespace {

// Random finite values inside [-2^16, 2^16] (every exponent up to 2^15, both signs).
std::vector<bf16_bits> InsideBound(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<int> exponent(0, 127 + 15), mantissa(0, 127), sign(0, 1);
  std::vector<bf16_bits> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = static_cast<bf16_bits>((sign(rng) << 15) | (exponent(rng) << 7) | mantissa(rng));
  }
  return v;
}

const bf16_bits kBad[] = {0x7F80, 0xFF80, 0x7FC1, 0x4781, 0xC900};  // ±Inf, NaN, past 2^16

// Three bad values at random places of v (none when v is empty).
void PlantBad(std::mt19937_64& rng, std::vector<bf16_bits>& v) {
  if (v.empty()) return;
  std::uniform_int_distribution<size_t> at(0, v.size() - 1);
  for (int k = 0; k < 3; ++k) v[at(rng)] = kBad[rng() % 5];
}

// found[t] is what the host's FirstOutOfBound finds in *tensors[t]: its index and value, or none.
void ExpectFirsts(const unsigned long long found[2], const std::vector<bf16_bits>* tensors[2]) {
  for (int t = 0; t < 2; ++t) {
    const std::vector<bf16_bits>& v = *tensors[t];
    const int64_t want = v.empty() ? -1 : FirstOutOfBound(v.data(), static_cast<int64_t>(v.size()));
    if (want < 0) {
      EXPECT_EQ(found[t], kNoneOutOfBound) << "tensor " << t << " is clean";
    } else {
      EXPECT_EQ(OutOfBoundIndex(found[t]), want) << "tensor " << t;
      EXPECT_EQ(OutOfBoundBits(found[t]), v[static_cast<size_t>(want)]) << "tensor " << t;
    }
  }
}

unsigned long long RunFirst(const std::vector<bf16_bits>& data) {
  DeviceBuffer d_data, d_first;
  EXPECT_TRUE(d_data.Allocate(data.size() * 2 + 16).ok());
  EXPECT_TRUE(d_data.Upload(data.data(), data.size() * 2).ok());
  EXPECT_TRUE(d_first.Allocate(8).ok());
  EXPECT_EQ(cudaMemset(d_first.get(), 0xff, 8), cudaSuccess);
  auto* first = static_cast<unsigned long long*>(d_first.get());
  EXPECT_TRUE(LaunchFirstOutOfBound(static_cast<const bf16_bits*>(d_data.get()),
                                    static_cast<int64_t>(data.size()), first, nullptr)
                  .ok());
  unsigned long long found = 0;
  EXPECT_EQ(cudaMemcpy(&found, first, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  return found;
}

TEST(ValueBoundCheck, FindsTheFirstBadElementAndItsValueAsTheHostDoes) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Sizes around the 8-value words and the tail, and one past a full grid's stride.
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{577}, int64_t{16 * 8 * 576},
                    int64_t{1024 * 256 * 8 + 13}}) {
    std::vector<bf16_bits> data = InsideBound(rng, n);
    EXPECT_EQ(RunFirst(data), kNoneOutOfBound) << "n = " << n << ": a clean tensor";
    // Several bad values (+Inf, -Inf, NaN, just past 2^16, far past): the first one wins.
    PlantBad(rng, data);
    const int64_t want = FirstOutOfBound(data.data(), n);
    ASSERT_GE(want, 0);
    const unsigned long long found = RunFirst(data);
    ASSERT_NE(found, kNoneOutOfBound) << "n = " << n;
    EXPECT_EQ(OutOfBoundIndex(found), want) << "n = " << n;
    EXPECT_EQ(OutOfBoundBits(found), data[static_cast<size_t>(want)]) << "n = " << n;
  }
  // 2^16 itself is inside; the next value up is not.
  EXPECT_EQ(RunFirst({kMaxInputMagnitudeBits, 0xC780}), kNoneOutOfBound);
  EXPECT_EQ(OutOfBoundIndex(RunFirst({kMaxInputMagnitudeBits, 0x4781})), 1);
}

// Two tensors in one launch (a verify call's q and tree_kv) answer exactly as two launches would:
// each its own first bad element and value, a clean one none, whichever is longer.
TEST(ValueBoundCheck, TwoTensorsInOneLaunchAnswerEachAsAlone) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (auto [na, nb] : {std::pair<int64_t, int64_t>{16 * 8 * 576, 16 * 576},
                        {16 * 576 + 3, 33 * 64 * 576},
                        {577, 0}}) {
    for (int dirty = 0; dirty < 4; ++dirty) {  // bit 0: a has bad values, bit 1: b has
      std::vector<bf16_bits> a = InsideBound(rng, na), b = InsideBound(rng, nb);
      if (dirty & 1) PlantBad(rng, a);
      if (dirty & 2) PlantBad(rng, b);
      DeviceBuffer d_a, d_b, d_firsts;
      ASSERT_TRUE(d_a.Allocate(a.size() * 2 + 16).ok() && d_a.Upload(a.data(), a.size() * 2).ok());
      ASSERT_TRUE(d_b.Allocate(b.size() * 2 + 16).ok());
      if (nb > 0) ASSERT_TRUE(d_b.Upload(b.data(), b.size() * 2).ok());
      ASSERT_TRUE(d_firsts.Allocate(16).ok());
      ASSERT_EQ(cudaMemset(d_firsts.get(), 0xff, 16), cudaSuccess);
      auto* firsts = static_cast<unsigned long long*>(d_firsts.get());
      ASSERT_TRUE(LaunchFirstOutOfBoundOfTwo(static_cast<const bf16_bits*>(d_a.get()), na,
                                             static_cast<const bf16_bits*>(d_b.get()), nb, firsts,
                                             nullptr)
                      .ok());
      unsigned long long found[2] = {0, 0};
      ASSERT_EQ(cudaMemcpy(found, firsts, 16, cudaMemcpyDeviceToHost), cudaSuccess);
      const std::vector<bf16_bits>* tensors[2] = {&a, &b};
      ExpectFirsts(found, tensors);
    }
  }
}

// A slot-table upload as the backend packs it: runs over disjoint places of an arena, each run's
// values random; `want` is the arena after placing it over `arena`.
struct ScatterUpload {
  SlotScatterHeader header;
  std::vector<SlotScatterRun> runs;
  std::vector<int32_t> values;
  std::vector<int32_t> want;
};

ScatterUpload RandomScatter(std::mt19937_64& rng, int num_values,
                            const std::vector<int32_t>& arena) {
  ScatterUpload u;
  u.want = arena;
  const int64_t arena_n = static_cast<int64_t>(arena.size());
  // Split [0, num_values) into runs; give each a disjoint place, in shuffled order, with gaps.
  std::vector<int> lengths;
  for (int left = num_values; left > 0;) {
    const int len = std::min<int>(left, 1 + static_cast<int>(rng() % 700));
    lengths.push_back(len);
    left -= len;
  }
  std::vector<int> order(lengths.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = static_cast<int>(r);
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t slack = arena_n - num_values;
  std::vector<int64_t> place(lengths.size());
  int64_t at = 0;
  for (int r : order) {
    at += static_cast<int64_t>(rng() % static_cast<uint64_t>(slack / (2 * lengths.size()) + 1));
    place[static_cast<size_t>(r)] = at;
    at += lengths[static_cast<size_t>(r)];
  }
  EXPECT_LE(at, arena_n);
  int begin = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    u.runs.push_back(SlotScatterRun{static_cast<int32_t>(place[r]), begin});
    for (int k = 0; k < lengths[r]; ++k) {
      const int32_t v = static_cast<int32_t>(rng() % (1u << 30));
      u.values.push_back(v);
      u.want[static_cast<size_t>(place[r] + k)] = v;
    }
    begin += lengths[r];
  }
  u.header = SlotScatterHeader{static_cast<int32_t>(u.runs.size()), num_values};
  return u;
}

// A scatter upload's three arrays in device memory, and the launch's arguments over them.
struct DeviceScatter {
  DeviceBuffer header, runs, values;
  bool Upload(const ScatterUpload& u) {
    return header.Allocate(sizeof(SlotScatterHeader)).ok() &&
           header.Upload(&u.header, sizeof(SlotScatterHeader)).ok() &&
           runs.Allocate(u.runs.size() * sizeof(SlotScatterRun)).ok() &&
           runs.Upload(u.runs.data(), u.runs.size() * sizeof(SlotScatterRun)).ok() &&
           values.Allocate(u.values.size() * 4).ok() &&
           values.Upload(u.values.data(), u.values.size() * 4).ok();
  }
  SlotScatterArgs Args(void* arena) const {
    return SlotScatterArgs{static_cast<const SlotScatterHeader*>(header.get()),
                           static_cast<const SlotScatterRun*>(runs.get()),
                           static_cast<const int32_t*>(values.get()), static_cast<int32_t*>(arena)};
  }
};

// The slot-table scatter rides in the check's launch (plans/0031, change 2): one launch gives the
// words of the check alone and the arena of the scatter alone (and of the host's placement), every
// element compared, clean tensors or not.
TEST(ValueBoundCheck, ScatterAndCheckInOneLaunchAnswerEachAsAlone) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Case {
    int num_values;
    int64_t na, nb;
  };
  for (const Case c :
       {Case{1, 16 * 8 * 576, 16 * 576}, Case{300, 577, 0},
        Case{100000, 16 * 576 + 3, 33 * 64 * 576}, Case{4097, 1024 * 256 * 8 + 13, 5}}) {
    for (int dirty = 0; dirty < 4; ++dirty) {  // bit 0: a has bad values, bit 1: b has
      SCOPED_TRACE("num_values=" + std::to_string(c.num_values) + " na=" + std::to_string(c.na) +
                   " nb=" + std::to_string(c.nb) + " dirty=" + std::to_string(dirty));
      std::vector<bf16_bits> a = InsideBound(rng, c.na), b = InsideBound(rng, c.nb);
      if (dirty & 1) PlantBad(rng, a);
      if (dirty & 2) PlantBad(rng, b);
      std::vector<int32_t> arena(static_cast<size_t>(3 * c.num_values + 1000));
      for (auto& x : arena) x = -static_cast<int32_t>(rng() % 1000) - 1;
      const ScatterUpload upload = RandomScatter(rng, c.num_values, arena);

      DeviceBuffer d_a, d_b;
      DeviceScatter d_scatter;
      ASSERT_TRUE(d_a.Allocate(a.size() * 2 + 16).ok() && d_a.Upload(a.data(), a.size() * 2).ok());
      ASSERT_TRUE(d_b.Allocate(b.size() * 2 + 16).ok());
      if (c.nb > 0) ASSERT_TRUE(d_b.Upload(b.data(), b.size() * 2).ok());
      ASSERT_TRUE(d_scatter.Upload(upload));
      const FirstOutOfBoundArgs check_of = {static_cast<const bf16_bits*>(d_a.get()), c.na,
                                            static_cast<const bf16_bits*>(d_b.get()), c.nb,
                                            nullptr};
      // Runs one launch: the scatter (into a fresh copy of `arena`) and/or the check.
      auto run = [&](bool scatter, bool check, std::vector<int32_t>* arena_out,
                     unsigned long long* words_out) {
        DeviceBuffer d_arena, d_firsts;
        ASSERT_TRUE(d_arena.Allocate(arena.size() * 4).ok() &&
                    d_arena.Upload(arena.data(), arena.size() * 4).ok());
        ASSERT_TRUE(d_firsts.Allocate(16).ok());
        ASSERT_EQ(cudaMemset(d_firsts.get(), 0xff, 16), cudaSuccess);
        SlotScatterArgs scatter_args;
        if (scatter) {
          scatter_args = d_scatter.Args(d_arena.get());
        }
        FirstOutOfBoundArgs check_args;
        if (check) {
          check_args = check_of;
          check_args.firsts = static_cast<unsigned long long*>(d_firsts.get());
        }
        ASSERT_TRUE(LaunchSlotScatterAndFirstOutOfBound(scatter_args, check_args, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        arena_out->resize(arena.size());
        ASSERT_EQ(
            cudaMemcpy(arena_out->data(), d_arena.get(), arena.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
        ASSERT_EQ(cudaMemcpy(words_out, d_firsts.get(), 16, cudaMemcpyDeviceToHost), cudaSuccess);
      };
      std::vector<int32_t> fused_arena, scatter_arena, check_arena;
      unsigned long long fused_words[2], scatter_words[2], check_words[2];
      run(true, true, &fused_arena, fused_words);
      run(true, false, &scatter_arena, scatter_words);
      run(false, true, &check_arena, check_words);
      EXPECT_EQ(fused_arena, scatter_arena) << "the fused launch's arena is the scatter's alone";
      EXPECT_EQ(fused_arena, upload.want) << "the arena is the host's placement";
      EXPECT_EQ(check_arena, arena) << "a check alone leaves the arena";
      EXPECT_EQ(scatter_words[0], kNoneOutOfBound) << "a scatter alone leaves the words armed";
      EXPECT_EQ(scatter_words[1], kNoneOutOfBound) << "a scatter alone leaves the words armed";
      for (int t = 0; t < 2; ++t) {
        EXPECT_EQ(fused_words[t], check_words[t]) << "tensor " << t << ": the check's words alone";
      }
      const std::vector<bf16_bits>* tensors[2] = {&a, &b};
      ExpectFirsts(fused_words, tensors);
    }
  }
}

// The bf16 tree-KV write rides in the same launch (plans/0031, change 4): with the scatter and
// the check, or alone, the pool holds each tree row at its slot (every element of every row of
// the pool compared: the written ones equal the rows, the others unchanged, out-of-range slots
// skipped), and the check's words are the check's alone, clean or not.
TEST(ValueBoundCheck, TreeWriteInTheLaunchPlacesEveryRowAndLeavesTheRest) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const int total_q : {1, 16, 129, 1024}) {
    for (const bool dirty : {false, true}) {
      SCOPED_TRACE("total_q=" + std::to_string(total_q) + " dirty=" + std::to_string(dirty));
      const int64_t num_slots = 3 * total_q + 17;
      std::vector<bf16_bits> pool = InsideBound(rng, num_slots * 576);
      std::vector<bf16_bits> rows = InsideBound(rng, int64_t{total_q} * 576);
      if (dirty) PlantBad(rng, rows);
      // Distinct slots in random order, one of them out of range (skipped by the write).
      std::vector<int32_t> order(static_cast<size_t>(num_slots));
      for (int64_t i = 0; i < num_slots; ++i) order[static_cast<size_t>(i)] = int32_t(i);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> slots(order.begin(), order.begin() + total_q);
      if (total_q > 1) slots[rng() % slots.size()] = int32_t(num_slots + rng() % 5);
      std::vector<bf16_bits> want = pool;
      for (int r = 0; r < total_q; ++r) {
        const int32_t s = slots[static_cast<size_t>(r)];
        if (s < 0 || s >= num_slots) continue;
        std::copy_n(rows.begin() + int64_t{r} * 576, 576, want.begin() + int64_t{s} * 576);
      }
      DeviceBuffer d_pool, d_rows, d_slots, d_firsts, d_arena;
      DeviceScatter d_scatter;
      ASSERT_TRUE(d_pool.Allocate(pool.size() * 2).ok() &&
                  d_pool.Upload(pool.data(), pool.size() * 2).ok());
      ASSERT_TRUE(d_rows.Allocate(rows.size() * 2).ok() &&
                  d_rows.Upload(rows.data(), rows.size() * 2).ok());
      ASSERT_TRUE(d_slots.Allocate(slots.size() * 4).ok() &&
                  d_slots.Upload(slots.data(), slots.size() * 4).ok());
      ASSERT_TRUE(d_firsts.Allocate(16).ok());
      ASSERT_EQ(cudaMemset(d_firsts.get(), 0xff, 16), cudaSuccess);
      std::vector<int32_t> arena(static_cast<size_t>(3 * total_q + 1000));
      for (auto& x : arena) x = -static_cast<int32_t>(rng() % 1000) - 1;
      const ScatterUpload upload = RandomScatter(rng, total_q, arena);
      ASSERT_TRUE(d_arena.Allocate(arena.size() * 4).ok() &&
                  d_arena.Upload(arena.data(), arena.size() * 4).ok());
      ASSERT_TRUE(d_scatter.Upload(upload));
      const SlotScatterArgs scatter = d_scatter.Args(d_arena.get());
      const TreeRowWriteArgs tree{static_cast<bf16_bits*>(d_pool.get()), num_slots,
                                  static_cast<const bf16_bits*>(d_rows.get()), total_q,
                                  static_cast<const int32_t*>(d_slots.get())};
      const FirstOutOfBoundArgs check{static_cast<const bf16_bits*>(d_rows.get()),
                                      int64_t{total_q} * 576, nullptr, 0,
                                      static_cast<unsigned long long*>(d_firsts.get())};
      ASSERT_TRUE(LaunchSlotScatterAndFirstOutOfBound(scatter, check, nullptr, tree).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<bf16_bits> got(pool.size());
      ASSERT_EQ(cudaMemcpy(got.data(), d_pool.get(), got.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(got, want) << "the pool after the launch";
      std::vector<int32_t> got_arena(arena.size());
      ASSERT_EQ(
          cudaMemcpy(got_arena.data(), d_arena.get(), got_arena.size() * 4, cudaMemcpyDeviceToHost),
          cudaSuccess);
      EXPECT_EQ(got_arena, upload.want) << "the scatter beside the write";
      unsigned long long words[2];
      ASSERT_EQ(cudaMemcpy(words, d_firsts.get(), 16, cudaMemcpyDeviceToHost), cudaSuccess);
      const std::vector<bf16_bits>* tensors[2] = {&rows, nullptr};
      const std::vector<bf16_bits> none;
      tensors[1] = &none;
      ExpectFirsts(words, tensors);
      // The write alone (no scatter, no check) places the same rows.
      ASSERT_TRUE(d_pool.Upload(pool.data(), pool.size() * 2).ok());
      ASSERT_TRUE(LaunchSlotScatterAndFirstOutOfBound(SlotScatterArgs{}, FirstOutOfBoundArgs{},
                                                      nullptr, tree)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got.data(), d_pool.get(), got.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(got, want) << "the write alone";
      TreeRowWriteArgs unaligned = tree;
      unaligned.rows = static_cast<const bf16_bits*>(d_rows.get()) + 1;
      EXPECT_FALSE(LaunchSlotScatterAndFirstOutOfBound(SlotScatterArgs{}, FirstOutOfBoundArgs{},
                                                       nullptr, unaligned)
                       .ok());
    }
  }
}

// Mapped pinned host memory for the fill's hand-off: the host's pointer and the device's.
class MappedWords {
 public:
  MappedWords() {
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host_), 16, cudaHostAllocMapped),
              cudaSuccess);
    EXPECT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0), cudaSuccess);
  }
  ~MappedWords() { cudaFreeHost(host_); }
  MappedWords(const MappedWords&) = delete;
  MappedWords& operator=(const MappedWords&) = delete;
  volatile unsigned long long* host() const { return host_; }
  unsigned long long* device() const { return device_; }

 private:
  unsigned long long* host_ = nullptr;
  unsigned long long* device_ = nullptr;
};

// The fill: NaN over a refused call's outputs (a clean call's untouched), and the words handed
// to the host's mapped copy only when a check found something (a clean call writes nothing at
// all: the host's copy keeps what the host armed it with). Nothing is re-armed: the device's words
// are as the check left them, so a second run of the same launch (a graph's replay) gives the same
// answer. Grids of one CTA (nothing to fill) up to a full one.
TEST(ValueBoundCheck, NanFillOnlyWhenACheckFoundSomething) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(TestSeed());
  for (auto [out_n, lse_n] : {std::pair<int64_t, int64_t>{33 * 8 * 512, 33 * 8},
                              {0, 0},
                              {5, 0},
                              {int64_t{1024} * 256 * 3 + 7, 1024}}) {
    const std::vector<bf16_bits> out = InsideBound(rng, out_n);
    std::vector<float> lse(static_cast<size_t>(lse_n));
    for (auto& x : lse) x = std::uniform_real_distribution<float>(-50, 50)(rng);
    for (int bad = 0; bad < 4; ++bad) {  // bit 0: q's word found something, bit 1: tree_kv's
      SCOPED_TRACE("out_n=" + std::to_string(out_n) + " bad=" + std::to_string(bad));
      DeviceBuffer d_out, d_lse, d_firsts;
      ASSERT_TRUE(d_out.Allocate(out.size() * 2 + 2).ok());
      if (out_n > 0) ASSERT_TRUE(d_out.Upload(out.data(), out.size() * 2).ok());
      ASSERT_TRUE(d_lse.Allocate(lse.size() * 4 + 4).ok());
      if (lse_n > 0) ASSERT_TRUE(d_lse.Upload(lse.data(), lse.size() * 4).ok());
      const unsigned long long firsts[2] = {
          bad & 1 ? (uint64_t{77} << 16) | 0xFF80 : kNoneOutOfBound,
          bad & 2 ? (uint64_t{12345} << 16) | 0x7F80 : kNoneOutOfBound};
      ASSERT_TRUE(d_firsts.Allocate(16).ok() && d_firsts.Upload(firsts, 16).ok());
      MappedWords host_words;
      constexpr unsigned long long kArmed = 0x5a5a5a5a5a5a5a5aull;  // not kNoneOutOfBound: seen
      for (int replay = 0; replay < 2; ++replay) {
        SCOPED_TRACE("replay=" + std::to_string(replay));
        host_words.host()[0] = kArmed;
        host_words.host()[1] = kArmed;
        ASSERT_TRUE(LaunchNanIfOutOfBound(static_cast<unsigned long long*>(d_firsts.get()), 2,
                                          host_words.device(), static_cast<bf16_bits*>(d_out.get()),
                                          out_n, static_cast<float*>(d_lse.get()), lse_n, nullptr)
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (int k = 0; k < 2; ++k) {
          EXPECT_EQ(host_words.host()[k], bad ? firsts[k] : kArmed)
              << "the host's copy of word " << k;
        }
        unsigned long long device_words[2] = {0, 0};
        ASSERT_EQ(cudaMemcpy(device_words, d_firsts.get(), 16, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(device_words[0], firsts[0]) << "the device's words are left as found";
        EXPECT_EQ(device_words[1], firsts[1]) << "the device's words are left as found";
      }
      // A count or output the launcher must refuse, naming what is missing.
      const absl::Status no_host =
          LaunchNanIfOutOfBound(static_cast<unsigned long long*>(d_firsts.get()), 2, nullptr,
                                static_cast<bf16_bits*>(d_out.get()), out_n, nullptr, 0, nullptr);
      EXPECT_FALSE(no_host.ok());
      EXPECT_NE(no_host.message().find("host_firsts"), std::string::npos) << no_host;
      EXPECT_FALSE(LaunchNanIfOutOfBound(static_cast<unsigned long long*>(d_firsts.get()), 3,
                                         host_words.device(), nullptr, 0, nullptr, 0, nullptr)
                       .ok());
      // The outputs after both runs: NaN if the first found something, else as they were.
      std::vector<bf16_bits> got_out(out.size());
      std::vector<float> got_lse(lse.size());
      ASSERT_EQ(cudaMemcpy(got_out.data(), d_out.get(), out.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got_lse.data(), d_lse.get(), lse.size() * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      int64_t wrong = 0;
      for (int64_t i = 0; i < out_n; ++i) {
        const bool nan = (got_out[i] & 0x7F80) == 0x7F80 && (got_out[i] & 0x7F) != 0;
        wrong += bad ? !nan : got_out[i] != out[i];
      }
      for (int64_t i = 0; i < lse_n; ++i) {
        wrong += bad ? !std::isnan(got_lse[i]) : std::memcmp(&got_lse[i], &lse[i], 4) != 0;
      }
      EXPECT_EQ(wrong, 0) << (bad ? "a refused call's outputs must all be NaN"
                                  : "a clean call's outputs must stay as they were");
    }
  }
}

}  // namespace
}  // namespace verifyd::test
