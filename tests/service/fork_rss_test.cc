// Issue 33 N2 through the real binary with its default bounds: the probe, 3,000 Forks of a
// 60,000-token sequence. Unbounded, each Fork copied the prefix's slot table (4 bytes a position,
// 240 KB) and the daemon's RSS grew 192 -> 883 MB while no KV slot moved. Now the default
// --max-slot-table-entries (16 x the pool's slots, at least 2^20) admits the forks that fit and
// refuses the rest RESOURCE_EXHAUSTED naming the flag, the daemon's RSS (read from
// /proc/<pid>/statm) grows by at most the bound's 4 MiB of tables plus slack, and it still
// answers: a Verify over a fork matches the float64 reference.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/append_chunking.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/daemon_process.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "tests/testing/test_seed.h"

namespace verifyd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::ShadowModel;
using testing::VerifyPart;

const std::string kBinary = testing::DaemonBinary(VERIFYD_BINARY);

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

int64_t RssOf(pid_t pid) {
  std::ifstream statm(absl::StrCat("/proc/", pid, "/statm"));
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(ForkRssTest, ThreeThousandForksOfASixtyThousandTokenSequenceStayWithinTheDefaultBound) {
  constexpr int kLength = 60'000, kForks = 3000;
  constexpr int64_t kCapacity = 65'536;
  // The default bound: 16 x 65,536 slots = 2^20 entries; the source holds 60,000 of them.
  constexpr int64_t kBound = int64_t{1} << 20;
  constexpr int kFit = static_cast<int>((kBound - kLength) / kLength);  // 16
  const std::string address = testing::TempSocketAddress("fork-rss");
  std::string error;
  // Under ASan the daemon keeps freed blocks in its quarantine (256 MiB by default), so 3,000
  // calls' freed buffers would read as growth: the daemon gets a small one (its environment only
  // matters at its start, so this process's own ASan is unchanged).
  const char* asan = getenv("ASAN_OPTIONS");
  const std::string asan_before = asan != nullptr ? asan : "";
  if (kSanitized) {
    setenv("ASAN_OPTIONS",
           (asan_before.empty() ? "" : asan_before + ":").append("quarantine_size_mb=8").c_str(),
           1);
  }
  auto daemon = DaemonProcess::Start(
      kBinary,
      {"--listen=" + address, "--metrics=", "--backend=cpu", "--layers=1", "--heads=2",
       absl::StrCat("--kv-capacity-tokens=", kCapacity), "--softmax-scale=0.0625",
       "--compute-threads=1", "--log-level=warning"},  // 2,984 refusals: not a line each
      &error);
  if (kSanitized) {
    if (asan != nullptr) {
      setenv("ASAN_OPTIONS", asan_before.c_str(), 1);
    } else {
      unsetenv("ASAN_OPTIONS");
    }
  }
  ASSERT_NE(daemon, nullptr) << error;
  auto stub = v1::Verifyd::NewStub(testing::MakeChannel(address));
  ShadowModel model(1, 2, 0.0625f, static_cast<uint32_t>(test::TestSeed()));
  testing::RpcDriver rpc(*stub, model);

  v1::AppendRequest whole = model.MakeAppend(1, kLength);
  SetExpectedPosition(AppendPosition::Create(), &whole);
  auto chunks = SplitAppend(whole, 4 << 20);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  for (const v1::AppendRequest& chunk : *chunks) {
    auto context = testing::ContextWithDeadline(std::chrono::milliseconds(60000));
    v1::AppendResponse response;
    ASSERT_TRUE(stub->Append(context.get(), chunk, &response).ok());
  }
  model.AcceptAppend(whole);

  const int64_t rss_before = RssOf(daemon->pid());
  int forked = 0;
  for (int k = 0; k < kForks; ++k) {
    const uint64_t id = 10 + static_cast<uint64_t>(k);
    // The raw stub: the shadow copies a fork's 69 MB of rows, so only the two checked below join
    // it.
    v1::ForkRequest request;
    request.set_source_sequence_id(1);
    request.set_new_sequence_id(id);
    request.set_length(kLength);
    v1::ForkResponse response;
    auto context = testing::ContextWithDeadline(std::chrono::milliseconds(30000));
    const grpc::Status status = stub->Fork(context.get(), request, &response);
    if (status.ok()) {
      ++forked;
      continue;
    }
    ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    ASSERT_THAT(status.error_message(),
                HasSubstr(absl::StrCat(
                    "new_sequence_id = ", id, ": ", kLength, " more slot-table entries would make ",
                    int64_t{kLength} * (kFit + 2), ", past --max-slot-table-entries = ", kBound)));
  }
  const int64_t grown = RssOf(daemon->pid()) - rss_before;
  EXPECT_EQ(forked, kFit);
  // 4 bytes an entry (4 MiB at the bound) and each fork's bookkeeping, with 16 MiB for gRPC's
  // buffers and the allocator (under ASan 48 MiB: its 8 MiB quarantine and redzones); unbounded,
  // 3,000 forks took ~690 MB.
  EXPECT_LE(grown, kBound * 4 + (kSanitized ? int64_t{48} << 20 : int64_t{16} << 20))
      << "RSS grew " << grown << " bytes over " << forked << " forks";
  std::printf("forks %d of %d admitted, daemon RSS %lld -> %lld bytes (%+lld)\n", forked, kForks,
              static_cast<long long>(rss_before), static_cast<long long>(rss_before + grown),
              static_cast<long long>(grown));

  // Still serving, and the forks' shared prefix is the source's: a step over two forks matches.
  model.AcceptFork(1, 10, kLength);
  model.AcceptFork(1, 10 + kFit - 1, kLength);
  EXPECT_EQ(rpc.Step({VerifyPart{10, model.RandomParents(4), std::nullopt},
                      VerifyPart{10 + kFit - 1, model.RandomParents(3), std::nullopt}},
                     true),
            "");
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
}

}  // namespace
}  // namespace verifyd
