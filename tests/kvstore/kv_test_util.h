// Shared by the kvstore tests: seeds and KV rows derived from a hash (random, never zero, cheap).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kvstore/kv_store.h"
#include "tests/testing/test_seed.h"
#include "verify/bf16.h"
#include "verify/kv_fp8_check.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/slot_copy_check.h"

namespace verifyd {

// gtest prints FragmentationStats field by field when a comparison fails.
inline void PrintTo(const FragmentationStats& s, std::ostream* os) {
  *os << "{sequences " << s.sequences << ", tokens " << s.tokens << ", runs " << s.runs
      << ", outside first run " << s.tokens_outside_first_run << "}";
}

}  // namespace verifyd

namespace verifyd::testing_kv {

using ::verifyd::test::TestSeed;  // VERIFYD_TEST_SEED reproduces a run

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// `count` rows of 576 values; row r's content is a function of (tag, r) only. Bit patterns are
// arbitrary (the store moves bits, it never does arithmetic), and bit 0x4000 keeps each value != 0.
inline std::vector<bf16_bits> HashedRows(uint64_t tag, int64_t count) {
  std::vector<bf16_bits> rows(static_cast<size_t>(count) * kKvDim);
  for (int64_t r = 0; r < count; ++r) {
    uint64_t h = SplitMix64(tag * 0x100000001b3ull + static_cast<uint64_t>(r));
    for (int i = 0; i < kKvDim; i += 4) {
      h = SplitMix64(h);
      for (int k = 0; k < 4; ++k) {
        rows[r * kKvDim + i + k] = static_cast<bf16_bits>((h >> (16 * k)) | 0x4000u);
      }
    }
  }
  return rows;
}

// The same within SPEC §1's bound (|v| <= 2^16, no NaN/Inf), for stores that do arithmetic on
// their rows (an fp8 store quantizes): the exponent keeps to [2^-8, 2^15), the value != 0.
inline std::vector<bf16_bits> HashedBoundedRows(uint64_t tag, int64_t count) {
  std::vector<bf16_bits> rows = HashedRows(tag, count);
  for (bf16_bits& v : rows) {
    const int exponent = 119 + ((v >> 7) & 0x1F) % 23;  // biased: 2^-8 .. 2^14
    v = static_cast<bf16_bits>((v & 0x807F) | (exponent << 7));
  }
  return rows;
}

// `count` rows in the fp8 layout (verify/kv_fp8_layout.h) that pass its value check: hashed codes
// with the NaN codes replaced, positive finite scales < 2^4, bounded rope values.
inline std::vector<uint8_t> HashedFp8Rows(uint64_t tag, int64_t count) {
  std::vector<uint8_t> rows(static_cast<size_t>(count) * kFp8RowBytes);
  const std::vector<bf16_bits> bits = HashedBoundedRows(tag ^ 0xf8f8f8f8ull, count);
  for (int64_t r = 0; r < count; ++r) {
    uint8_t* row = rows.data() + r * kFp8RowBytes;
    std::memcpy(row, bits.data() + r * kKvDim, kVDim);  // the first 256 values' bytes as codes
    for (int i = 0; i < kVDim; ++i) {
      if (IsE4m3Nan(row[i])) row[i] ^= 0x01;
    }
    for (int g = 0; g < kFp8Groups; ++g) {
      const float scale = std::ldexp(1.f + (bits[r * kKvDim + 300 + g] & 0x7F) / 128.f,
                                     (bits[r * kKvDim + 310 + g] % 16) - 12);
      std::memcpy(row + kFp8ScalesOffset + 4 * g, &scale, sizeof(scale));
    }
    std::memcpy(row + kFp8RopeOffset, bits.data() + r * kKvDim + kVDim, kRopeDim * 2);
  }
  return rows;
}

// Whether every row passes SPEC §1's checks for fp8 input (verify/kv_fp8_check.h).
inline bool Fp8RowsValid(const std::vector<uint8_t>& rows) {
  const int64_t count = static_cast<int64_t>(rows.size()) / kFp8RowBytes;
  const int64_t shape[] = {count};
  return CheckFp8Rows(rows.data(), count, 0, shape, "kv").ok();
}

// The store's fragmentation figures from scratch: a walk of every committed slot list from the
// first position the sequence accounts (plans/0019: a shared slot counts once, with its oldest
// holder), the reference for the figures KvStore keeps incrementally.
inline FragmentationStats WalkFragmentation(const KvStore& store) {
  FragmentationStats stats;
  for (SequenceId id : store.Sequences()) {
    std::vector<int32_t> slots = *store.CommittedSlots(id);
    slots.erase(slots.begin(), slots.begin() + *store.AccountedBegin(id));
    ++stats.sequences;
    if (slots.empty()) continue;
    size_t first_run = 1;
    while (first_run < slots.size() && slots[first_run] == slots[first_run - 1] + 1) ++first_run;
    int64_t runs = 1;
    for (size_t p = 1; p < slots.size(); ++p) runs += slots[p] != slots[p - 1] + 1;
    stats.tokens += static_cast<int64_t>(slots.size());
    stats.runs += runs;
    stats.tokens_outside_first_run += static_cast<int64_t>(slots.size() - first_run);
  }
  return stats;
}

// Runs for KvStorage::CopyRuns that obey its contract: [0, capacity) cut into pieces of
// 1..max_length slots, shuffled and paired (source piece, destination piece, the shorter length),
// so no destination meets another run's source or destination. With a spare piece, one source
// is copied a second time. Each layer's expected pool is what copying slot by slot gives.
inline std::vector<SlotRunCopy> RandomDisjointRuns(std::mt19937_64& rng, int64_t capacity,
                                                   int32_t max_length) {
  std::vector<std::pair<int32_t, int32_t>> pieces;  // begin, length
  for (int64_t begin = 0; begin < capacity;) {
    const auto length = static_cast<int32_t>(
        std::min<int64_t>(1 + static_cast<int64_t>(rng() % max_length), capacity - begin));
    pieces.emplace_back(static_cast<int32_t>(begin), length);
    begin += length;
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  std::vector<SlotRunCopy> runs;
  for (size_t i = 0; i + 1 < pieces.size(); i += 2) {
    runs.push_back(
        {pieces[i].first, pieces[i + 1].first, std::min(pieces[i].second, pieces[i + 1].second)});
  }
  if (pieces.size() % 2 == 1 && !runs.empty()) {
    runs.push_back(
        {runs[0].src_begin, pieces.back().first, std::min(runs[0].length, pieces.back().second)});
  }
  return runs;
}

// What CopyRuns must do to one layer's [capacity][576] rows.
inline void CopyRunsReference(const std::vector<SlotRunCopy>& runs, std::vector<bf16_bits>& rows) {
  const std::vector<bf16_bits> before = rows;
  for (const SlotRunCopy& run : runs) {
    std::copy_n(before.begin() + static_cast<int64_t>(run.src_begin) * kKvDim,
                static_cast<int64_t>(run.length) * kKvDim,
                rows.begin() + static_cast<int64_t>(run.dst_begin) * kKvDim);
  }
}

}  // namespace verifyd::testing_kv
