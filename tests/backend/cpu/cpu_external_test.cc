// The CPU backend's data plane (backend/cpu/cpu_external.h): regions are mapped files; a Verify on
// external tensors writes the tree KV and computes the same bytes as ComputeVerify, within bf16
// rounding of the float64 reference; the ready wait is bounded and cancellable; every failure
// NaN-fills the outputs and still writes the done flag.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_external.h"
#include "base/sealed_memfd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstore/kv_storage.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

constexpr double kBf16HalfUlp = 1.0 / 256;

// A sealed memfd of `bytes` (base/sealed_memfd.h), what the cpu backend maps; closed at the end.
class Memfd {
 public:
  explicit Memfd(uint64_t bytes) {
    absl::StatusOr<int> fd = CreateSealedMemfd("cpu-external-test", bytes);
    EXPECT_TRUE(fd.ok()) << fd.status();
    fd_ = fd.value_or(-1);
  }
  ~Memfd() { close(fd_); }
  int fd() const { return fd_; }
  std::string path() const { return MemfdHandle(fd_); }
  ExternalMemoryHandle Handle(uint64_t bytes) const { return {path(), bytes, 0, getpid()}; }

 private:
  int fd_ = -1;
};

TEST(CpuExternalRegionTest, OpenRefusesWhatItCannotMap) {
  Memfd file(4096);
  const std::string mine = absl::StrCat("/proc/", getpid(), "/fd/");
  struct Case {
    ExternalMemoryHandle handle;
    absl::StatusCode code;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {{"", 4096, 0, getpid()}, absl::StatusCode::kInvalidArgument, "handle is empty"},
      {file.Handle(0), absl::StatusCode::kInvalidArgument, "bytes = 0 must be > 0"},
      {{file.path(), 64, 0, 0}, absl::StatusCode::kFailedPrecondition, "the Unix socket"},
      {{mine + "99999", 64, 0, getpid()}, absl::StatusCode::kNotFound, "cannot open"},
      {{"/dev/shm", 64, 0, getpid()}, absl::StatusCode::kInvalidArgument, "must be /proc/"},
      {{file.path(), 64, 0, getpid() + 1},
       absl::StatusCode::kInvalidArgument,
       "a descriptor of the calling process"},
      {{file.path() + std::string(1, '\0') + "x", 64, 0, getpid()},
       absl::StatusCode::kInvalidArgument,
       "NUL byte"},
      {file.Handle(8192), absl::StatusCode::kInvalidArgument,
       "bytes = 8192 must be <= the 4096 bytes of"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<ExternalRegion>> r = OpenCpuExternalRegion(c.handle);
    EXPECT_EQ(r.status().code(), c.code) << c.expect << ": " << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.expect));
  }
}

TEST(CpuExternalRegionTest, TheMappingIsTheMemfd) {
  Memfd file(8192);
  absl::StatusOr<std::unique_ptr<ExternalRegion>> r = OpenCpuExternalRegion(file.Handle(8192));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->bytes(), 8192u);
  auto* mine =
      static_cast<uint8_t*>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd(), 0));
  std::mt19937 rng(test::TestSeed());
  for (int i = 0; i < 8192; ++i) mine[i] = static_cast<uint8_t>(rng());
  EXPECT_EQ(std::memcmp(mine, (*r)->data(), 8192), 0);
  static_cast<uint8_t*>((*r)->data())[100] ^= 0xFF;
  EXPECT_EQ(std::memcmp(mine, (*r)->data(), 8192), 0);
  munmap(mine, 8192);
}

// One random problem laid out as the data plane sees it: the pool holds every prefix row, the
// tree rows are garbage until the call writes tree_kv; q, tree_kv, out, lse and two flags live in
// one mapped region.
struct ExternalCase {
  test::HostProblem hp;
  std::vector<int32_t> tree_slots;
  std::unique_ptr<Memfd> file;
  std::unique_ptr<ExternalRegion> region;
  CpuBackend backend{2, absl::Milliseconds(300)};
  std::unique_ptr<KvStorage> storage;
  ExternalVerify call;
  uint32_t* ready = nullptr;
  uint32_t* done = nullptr;
};

std::unique_ptr<ExternalCase> MakeCase(uint64_t seed) {
  auto c = std::make_unique<ExternalCase>();
  std::mt19937_64 rng(seed);
  std::vector<test::SequenceSpec> specs;
  const int batch = 1 + static_cast<int>(rng() % 3);
  for (int b = 0; b < batch; ++b) {
    specs.push_back({static_cast<int>(rng() % 200), 1 + static_cast<int>(rng() % 12),
                     static_cast<test::TreeShape>(rng() % 4)});
  }
  c->hp = test::MakeRandomProblem(specs, 4, seed, /*scattered=*/true, 16);
  test::HostProblem& hp = c->hp;
  for (int b = 0; b < hp.batch(); ++b) {
    for (int32_t i = hp.slot_indptr[b] + hp.prefix_len[b]; i < hp.slot_indptr[b + 1]; ++i) {
      c->tree_slots.push_back(hp.slots[i]);
    }
  }
  const int64_t tq = hp.total_q(), rows = tq * hp.num_heads;
  const uint64_t q_at = 0, kv_at = q_at + rows * kKvDim * 2, out_at = kv_at + tq * kKvDim * 2,
                 lse_at = out_at + rows * kVDim * 2, flags_at = lse_at + rows * 4,
                 bytes = flags_at + 64;
  c->file = std::make_unique<Memfd>(bytes);
  c->region = *OpenCpuExternalRegion(c->file->Handle(bytes));
  auto* base = static_cast<uint8_t*>(c->region->data());
  std::memcpy(base + q_at, hp.q.data(), hp.q.size() * 2);
  for (int64_t r = 0; r < tq; ++r) {
    std::memcpy(base + kv_at + r * kKvDim * 2, hp.kv.data() + int64_t{c->tree_slots[r]} * kKvDim,
                kKvDim * 2);
  }
  std::memset(base + out_at, 0xFF, rows * kVDim * 2);
  c->storage = *c->backend.CreateStorage(1, hp.num_slots);
  std::vector<int32_t> all(hp.num_slots);
  for (int32_t s = 0; s < hp.num_slots; ++s) all[s] = s;
  EXPECT_TRUE(c->storage->WriteRows(0, all, hp.kv.data()).ok());
  std::vector<bf16_bits> junk(kKvDim, 0x3F80);  // 1.0: wrong unless the call writes tree_kv
  for (int32_t s : c->tree_slots) EXPECT_TRUE(c->storage->WriteRows(0, {&s, 1}, junk.data()).ok());
  c->call.layer = 0;
  c->call.problem = hp.problem();
  c->call.problem.q = reinterpret_cast<const bf16_bits*>(base + q_at);
  c->call.problem.out = reinterpret_cast<bf16_bits*>(base + out_at);
  c->call.problem.lse = reinterpret_cast<float*>(base + lse_at);
  c->call.tree_kv = reinterpret_cast<const bf16_bits*>(base + kv_at);
  c->call.tree_slots = c->tree_slots;
  c->ready = reinterpret_cast<uint32_t*>(base + flags_at);
  c->done = reinterpret_cast<uint32_t*>(base + flags_at + 4);
  c->call.order.ready = {c->ready, 7};
  c->call.order.done = {c->done, 9};
  return c;
}

bool AllNan(const bf16_bits* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if ((out[i] & 0x7F80) != 0x7F80 || (out[i] & 0x7F) == 0) return false;
  }
  return true;
}

// The ready flag arrives from another thread after the call started; the result equals
// ComputeVerify on the original problem byte for byte and the float64 reference within bf16.
TEST(CpuExternalVerifyTest, MatchesComputeVerifyAndTheFloat64Reference) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  for (int i = 0; i < 4; ++i) {
    std::unique_ptr<ExternalCase> c = MakeCase(seed + i);
    std::thread scheduler([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::atomic_ref<uint32_t>(*c->ready).store(7, std::memory_order_release);
    });
    const absl::Status s = c->backend.ComputeVerifyExternal(c->call, {});
    scheduler.join();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(std::atomic_ref<uint32_t>(*c->done).load(), 9u);

    CpuBackend plain(2);
    std::unique_ptr<KvStorage> storage = *plain.CreateStorage(1, c->hp.num_slots);
    std::vector<int32_t> all(c->hp.num_slots);
    for (int32_t k = 0; k < c->hp.num_slots; ++k) all[k] = k;
    ASSERT_TRUE(storage->WriteRows(0, all, c->hp.kv.data()).ok());
    c->hp.Poison();
    ASSERT_TRUE(plain.ComputeVerify(0, c->hp.problem()).ok());
    const int64_t rows = int64_t{c->hp.total_q()} * c->hp.num_heads;
    EXPECT_EQ(std::memcmp(c->hp.out.data(), c->call.problem.out, rows * kVDim * 2), 0);
    EXPECT_EQ(std::memcmp(c->hp.lse.data(), c->call.problem.lse, rows * 4), 0);

    std::vector<double> ref_out, ref_lse;
    test::ComputeVerifyF64(c->hp.problem(), &ref_out, &ref_lse);
    EXPECT_LE(
        test::RelativeError({c->call.problem.out, static_cast<size_t>(rows * kVDim)}, ref_out),
        kBf16HalfUlp);
    EXPECT_LE(test::RelativeError({c->call.problem.lse, static_cast<size_t>(rows)}, ref_lse), 1e-5);
  }
}

TEST(CpuExternalVerifyTest, ReadyThatNeverComesFailsBoundedWithNanAndDone) {
  std::unique_ptr<ExternalCase> c = MakeCase(test::TestSeed());
  std::atomic_ref<uint32_t>(*c->ready).store(6);  // one short
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = c->backend.ComputeVerifyExternal(c->call, {});
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("the ready flag stayed 6 < 7 for 300ms"));
  EXPECT_GE(waited, std::chrono::milliseconds(290));
  EXPECT_LT(waited, std::chrono::seconds(5));
  const int64_t rows = int64_t{c->hp.total_q()} * c->hp.num_heads;
  EXPECT_TRUE(AllNan(c->call.problem.out, rows * kVDim));
  for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(std::isnan(c->call.problem.lse[r]));
  EXPECT_EQ(std::atomic_ref<uint32_t>(*c->done).load(), 9u);
}

TEST(CpuExternalVerifyTest, CancelEndsTheReadyWaitWithAborted) {
  std::unique_ptr<ExternalCase> c = MakeCase(test::TestSeed());
  std::atomic<bool> cancelled{false};
  c->call.order.cancelled = &cancelled;
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    cancelled = true;
  });
  const absl::Status s = c->backend.ComputeVerifyExternal(c->call, {});
  closer.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(AllNan(c->call.problem.out, int64_t{c->hp.total_q()} * c->hp.num_heads * kVDim));
  EXPECT_EQ(std::atomic_ref<uint32_t>(*c->done).load(), 9u);
}

TEST(CpuExternalVerifyTest, ComputeErrorsStillNanAndDone) {
  std::unique_ptr<ExternalCase> c = MakeCase(test::TestSeed());
  std::atomic_ref<uint32_t>(*c->ready).store(100);  // >= 7: ready
  c->call.layer = 3;                                // the pool has one layer
  const absl::Status s = c->backend.ComputeVerifyExternal(c->call, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(AllNan(c->call.problem.out, int64_t{c->hp.total_q()} * c->hp.num_heads * kVDim));
  EXPECT_EQ(std::atomic_ref<uint32_t>(*c->done).load(), 9u);
}

TEST(CpuExternalVerifyTest, FailVerifyExternalWaitsForReadyThenNansAndWritesDone) {
  std::unique_ptr<ExternalCase> c = MakeCase(test::TestSeed());
  const int64_t rows = int64_t{c->hp.total_q()} * c->hp.num_heads;
  ExternalFailure f{c->call.problem.out, rows * kVDim, c->call.problem.lse, rows, c->call.order};
  std::thread scheduler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    // The outputs are still the scheduler's before ready: nothing NaN yet.
    EXPECT_FALSE(AllNan(c->call.problem.out, 1) && std::isnan(c->call.problem.lse[0]));
    EXPECT_EQ(std::atomic_ref<uint32_t>(*c->done).load(), 0u);
    std::atomic_ref<uint32_t>(*c->ready).store(7, std::memory_order_release);
  });
  c->call.problem.lse[0] = 1.f;
  EXPECT_TRUE(c->backend.FailVerifyExternal(f).ok());
  scheduler.join();
  EXPECT_TRUE(AllNan(c->call.problem.out, rows * kVDim));
  EXPECT_TRUE(std::isnan(c->call.problem.lse[0]));
  EXPECT_EQ(std::atomic_ref<uint32_t>(*c->done).load(), 9u);
}

// Issue 33 N8, the channel's part: the scheduler keeps rewriting an element of its q and of its
// tree_kv between a good value and NaN while the calls run. Whatever it catches, a call that
// answers OK kept only finite rows in the pool and produced finite outputs, and a refused one
// NaN-filled its outputs: the check and the compute read the same private copy. (Checking the
// region and then reading it again let a NaN through between the two.)
TEST(CpuExternalVerifyTest, TensorsRewrittenDuringTheCallNeverReachThePoolOrTheOutputs) {
  std::unique_ptr<ExternalCase> c = MakeCase(test::TestSeed());
  std::atomic_ref<uint32_t>(*c->ready).store(7, std::memory_order_release);
  const int64_t tq = c->hp.total_q(), rows = tq * c->hp.num_heads;
  std::mt19937_64 rng(test::TestSeed());
  auto* q_word = const_cast<bf16_bits*>(c->call.problem.q) + rng() % (rows * kKvDim);
  auto* kv_word = const_cast<bf16_bits*>(c->call.tree_kv) + rng() % (tq * kKvDim);
  const bf16_bits q_good = *q_word, kv_good = *kv_word;
  // Good and NaN in turns of tens of microseconds (longer than a check, shorter than a compute):
  // many calls pass the check, and a later read of the region by the same call would meet a NaN.
  std::atomic<bool> stop{false};
  std::thread scheduler([&] {
    const auto start = std::chrono::steady_clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
      const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
      const bool bad = (us / 25) % 4 == 3;
      std::atomic_ref<bf16_bits>(*q_word).store(bad ? 0x7fc0 : q_good, std::memory_order_relaxed);
      std::atomic_ref<bf16_bits>(*kv_word).store(bad ? 0x7fc0 : kv_good, std::memory_order_relaxed);
    }
  });
  // Stops the scheduler however the test ends.
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joiner() {
      stop.store(true);
      thread.join();
    }
  } joiner{stop, scheduler};
  // At least 400 calls, and on until 50 were answered: on a loaded machine the scheduler thread
  // can be switched out for milliseconds right after writing its NaN, and every call in that
  // window is (rightly) refused. The deadline only ends a run whose rewrites never stop being NaN.
  int refused = 0, answered = 0;
  std::vector<bf16_bits> pool_rows(static_cast<size_t>(tq) * kKvDim);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int call = 0; call < 400 || (answered < 50 && std::chrono::steady_clock::now() < deadline);
       ++call) {
    const absl::Status s = c->backend.ComputeVerifyExternal(c->call, {});
    if (s.ok()) {
      ++answered;
      ASSERT_TRUE(c->storage->ReadRows(0, c->tree_slots, pool_rows.data()).ok());
      ASSERT_EQ(FirstOutOfBound(pool_rows.data(), tq * kKvDim), -1)
          << "call " << call << " answered OK with a NaN in the pool";
      for (int64_t i = 0; i < rows * kVDim; ++i) {
        ASSERT_TRUE(std::isfinite(Bf16ToFloat(c->call.problem.out[i])))
            << "call " << call << " answered OK with out[" << i << "] not finite";
      }
    } else {
      ++refused;
      ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      ASSERT_TRUE(AllNan(c->call.problem.out, rows * kVDim));
    }
  }
  std::cout << answered << " calls answered, " << refused << " refused\n";
  EXPECT_GT(answered, 0) << "the scheduler's rewrites left no call to answer";
}

}  // namespace
}  // namespace verifyd
