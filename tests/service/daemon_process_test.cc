// The real `verifyd` binary on a temporary socket: flag errors exit 2; health goes SERVING when
// ready and NOT_SERVING on SIGTERM while queued Verify calls still complete (correctly) and the
// process exits 0; leases free a silent client's sequences; /metrics passes promtool.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/verifyd_server.h"
#include "tests/service/daemon_process.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "tests/testing/prometheus_text.h"

namespace verifyd {
namespace {

using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::ShadowModel;
using testing::VerifyPart;
using Health = grpc::health::v1::HealthCheckResponse;

// The build's daemon; VERIFYD_BINARY in the environment points elsewhere (the GPU bundle).
const std::string kBinary = testing::DaemonBinary(VERIFYD_BINARY);

TEST(DaemonProcessTest, InvalidFlagsExitTwo) {
  std::string output;
  EXPECT_EQ(testing::RunToExit(kBinary, {"--heads=0"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--heads = 0 must be in [1, 1024]"));
  output.clear();
  EXPECT_EQ(testing::RunToExit(kBinary, {"--tcp=8.8.8.8:50051"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("is not a loopback address"));
  output.clear();
  EXPECT_EQ(testing::RunToExit(kBinary, {"--max-tree-nodes=2048"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--max-tree-nodes = 2048 must be in [1, 1024]"));
  output.clear();
  EXPECT_EQ(testing::RunToExit(kBinary, {"--shm-max-bytes=-1"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--shm-max-bytes = -1 must be in [0, "));
  output.clear();
  EXPECT_EQ(testing::RunToExit(kBinary, {"--shm-max-region-bytes=100"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--shm-max-region-bytes = 100 must be in [4096, "));
  output.clear();
  EXPECT_EQ(testing::RunToExit(kBinary, {"--flash-kernel=hopper"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--flash-kernel = 'hopper' must be auto or portable"));
  output.clear();
  EXPECT_EQ(testing::RunToExit(kBinary, {"--kv_dtype=fp16"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--kv_dtype = 'fp16' must be bf16"));
}

TEST(DaemonProcessTest, HealthGoesNotServingOnSigterm) {
  const std::string address = testing::TempSocketAddress("health");
  // Health is polled from before the process starts: it may be unreachable or NOT_SERVING, then
  // SERVING, and never goes back before SIGTERM.
  std::atomic<bool> stop{false};
  std::vector<Health::ServingStatus> seen;
  std::thread poller([&] {
    auto channel = testing::MakeChannel(address);
    while (!stop) {
      bool ok = false;
      const Health::ServingStatus status = testing::CheckHealth(channel, "", &ok);
      if (ok && (seen.empty() || seen.back() != status)) seen.push_back(status);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::string error;
  auto daemon =
      DaemonProcess::Start(kBinary,
                           {"--listen=" + address, "--metrics=", "--shutdown-delay-seconds=1",
                            "--layers=1", "--kv-capacity-tokens=4096"},
                           &error);
  ASSERT_NE(daemon, nullptr) << error;
  EXPECT_THAT(daemon->startup_line(), HasSubstr("verifyd listening on " + address));
  // --backend=auto: cuda in a CUDA build with a visible GPU, else cpu.
  EXPECT_THAT(daemon->startup_line(), ::testing::ContainsRegex("backend=(cpu|cuda) "));
  // Which attention kernel the pool runs on: the cpu backend's own, or a CUDA flash kernel.
  const std::string kernel = daemon->StartupField("attention_kernel");
  if (daemon->StartupField("backend") == "cpu") {
    EXPECT_EQ(kernel, "cpu");
  } else {
    EXPECT_THAT(kernel, ::testing::AnyOf("sm90a-wgmma", "portable-mma-sync"));
  }
  struct stat st {};
  ASSERT_EQ(stat(UnixSocketPath(address).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  auto channel = testing::MakeChannel(address);
  bool ok = false;
  EXPECT_EQ(testing::CheckHealth(channel, "verifyd.v1.Verifyd", &ok), Health::SERVING);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop = true;
  poller.join();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), Health::SERVING);
  EXPECT_LE(seen.size(), 2u);
  if (seen.size() == 2) {
    EXPECT_EQ(seen.front(), Health::NOT_SERVING);
  }

  daemon->Signal(SIGTERM);
  bool saw_not_serving = false;
  for (int i = 0; i < 40 && !saw_not_serving; ++i) {
    saw_not_serving =
        testing::CheckHealth(channel, "", &ok) == Health::NOT_SERVING && ok &&
        testing::CheckHealth(channel, "verifyd.v1.Verifyd", &ok) == Health::NOT_SERVING;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(saw_not_serving) << "health must report NOT_SERVING while draining";
  // An idle client answers the server's goodbye only at its next backup poll (seconds); closing
  // it lets the shutdown finish at once.
  channel.reset();
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
  EXPECT_NE(stat(UnixSocketPath(address).c_str(), &st), 0) << "the socket file is removed";
}

TEST(DaemonProcessTest, SigtermFinishesQueuedCallsAndExitsZero) {
  const std::string address = testing::TempSocketAddress("drain");
  std::string error;
  auto daemon = DaemonProcess::Start(
      kBinary,
      {"--listen=" + address, "--metrics=127.0.0.1:0", "--backend=cpu", "--layers=1", "--heads=16",
       "--compute-threads=1", "--kv-capacity-tokens=20000", "--shutdown-delay-seconds=0"},
      &error);
  ASSERT_NE(daemon, nullptr) << error;
  const std::string metrics = daemon->MetricsAddress();
  ASSERT_FALSE(metrics.empty()) << daemon->startup_line();
  auto channel = testing::MakeChannel(address);
  auto stub = v1::Verifyd::NewStub(channel);
  ShadowModel model(1, 16, 1.0f / std::sqrt(192.0f), 5);
  testing::RpcDriver driver(*stub, model);
  constexpr int kSequences = 8;
  std::vector<v1::VerifyRequest> requests;
  for (int s = 0; s < kSequences; ++s) {
    ASSERT_TRUE(driver.Append(model.MakeAppend(s + 1, 1000)).ok());
    requests.push_back(model.MakeVerify(
        0, {VerifyPart{uint64_t(s) + 1, model.RandomParents(16), std::nullopt}}, true));
  }
  // The executor runs the calls one after another (the cpu backend: milliseconds each, so the
  // queue is still there when the signal comes). SIGTERM goes once the first is answered and the
  // daemon's queue holds every other call but the one computing: a caller thread that had not
  // yet sent its request on a loaded machine would otherwise meet a closed socket, which is not
  // what the drain promises.
  std::vector<v1::VerifyResponse> responses(kSequences);
  std::vector<grpc::Status> statuses(kSequences);
  std::atomic<int> finished{0};
  std::vector<std::thread> callers;
  for (int s = 0; s < kSequences; ++s) {
    callers.emplace_back([&, s] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      statuses[s] = stub->Verify(&context, requests[s], &responses[s]);
      ++finished;
    });
  }
  const auto queued_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    const int before = finished.load();
    const double queued =
        testing::PrometheusSample(testing::HttpGet(metrics, "/metrics"), "verifyd_queue_depth")
            .value_or(0.0);
    const int after = finished.load();
    if (before == after && after >= 1 && queued + after + 1 >= kSequences) break;
    ASSERT_LT(after, kSequences) << "every call ended before the queue was seen: nothing to drain";
    ASSERT_LT(std::chrono::steady_clock::now(), queued_deadline)
        << "the calls never all reached the daemon's queue (" << queued << " queued, " << after
        << " answered)";
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  daemon->Signal(SIGTERM);
  EXPECT_LT(finished.load(), kSequences) << "every call ended before SIGTERM: nothing to drain";
  for (auto& t : callers) t.join();
  for (int s = 0; s < kSequences; ++s) {
    SCOPED_TRACE(s);
    ASSERT_TRUE(statuses[s].ok()) << statuses[s].error_message();
    model.AcceptVerify(requests[s]);
    EXPECT_EQ(model.CheckVerify(requests[s], responses[s]), "");
  }
  stub.reset();
  channel.reset();
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
  // New calls are refused once it is gone.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::StatsResponse stats;
  EXPECT_FALSE(v1::Verifyd::NewStub(testing::MakeChannel(address))
                   ->Stats(&context, v1::StatsRequest(), &stats)
                   .ok());
}

// What an operator and a client hear of a lease expiry: the daemon logs it (one levelled line per
// event, with the start, a refused call and the stop), and a later call naming the sequence gets
// a NOT_FOUND that says its lease expired.
TEST(DaemonProcessTest, ALeaseExpiryIsLoggedAndNamedInTheNotFound) {
  const std::string address = testing::TempSocketAddress("expiry");
  const std::string log = absl::StrCat(::testing::TempDir(), "/verifyd-expiry-", getpid(), ".log");
  std::string error;
  auto daemon =
      DaemonProcess::Start(kBinary,
                           {"--listen=" + address, "--metrics=", "--layers=1", "--heads=2",
                            "--kv-capacity-tokens=256", "--lease-seconds=1", "--compute-threads=1"},
                           &error, log);
  ASSERT_NE(daemon, nullptr) << error;
  auto stub = v1::Verifyd::NewStub(testing::MakeChannel(address));
  ShadowModel model(1, 2, 1.0f / std::sqrt(192.0f), 5);
  testing::RpcDriver driver(*stub, model);
  ASSERT_TRUE(driver.Append(model.MakeAppend(4, 9)).ok());
  grpc::Status gone;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gone = driver.Commit(4, {});
  } while (gone.error_code() != grpc::StatusCode::NOT_FOUND &&
           std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(gone.error_message(), HasSubstr("= 4 is not a live sequence: its lease expired at "));
  daemon->Signal(SIGTERM);
  ASSERT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, ::testing::ContainsRegex("Z info start listen=unix://[^ ]+ .*layers=1"));
  EXPECT_THAT(text, HasSubstr(" info lease_expired sequence=4\n"));
  EXPECT_THAT(text, HasSubstr(" info refused method=Commit code=NOT_FOUND count=1 message="));
  EXPECT_THAT(text, HasSubstr(" info stopped\n"));
  unlink(log.c_str());
}

TEST(DaemonProcessTest, LeaseExpiryFreesSilentClientsAndMetricsPassPromtool) {
  const std::string address = testing::TempSocketAddress("lease");
  std::string error;
  auto daemon = DaemonProcess::Start(
      kBinary,
      {"--listen=" + address, "--metrics=127.0.0.1:0", "--layers=2", "--heads=2",
       "--kv-capacity-tokens=1024", "--lease-seconds=1", "--compute-threads=1"},
      &error);
  ASSERT_NE(daemon, nullptr) << error;
  const std::string metrics = daemon->MetricsAddress();
  ASSERT_FALSE(metrics.empty()) << daemon->startup_line();

  auto channel = testing::MakeChannel(address);
  auto stub = v1::Verifyd::NewStub(channel);
  ShadowModel model(2, 2, 1.0f / std::sqrt(192.0f), 17);
  testing::RpcDriver driver(*stub, model);
  ASSERT_TRUE(driver.Append(model.MakeAppend(1, 12)).ok());
  ASSERT_TRUE(driver.Append(model.MakeAppend(2, 7)).ok());
  ASSERT_EQ(driver.Step({VerifyPart{1, {-1, 0, 1}, std::nullopt}}, true), "");
  EXPECT_EQ(driver.Stats().fragmentation().sequences(), 2u);

  // The client goes silent: both sequences expire and their slots return.
  v1::StatsResponse stats;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stats = driver.Stats();
  } while (stats.fragmentation().sequences() != 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(stats.fragmentation().sequences(), 0u);
  EXPECT_EQ(stats.used_tokens(), 0u);
  EXPECT_EQ(stats.free_tokens(), 1024u);

  std::string text;
  for (int i = 0; i < 50; ++i) {
    text = testing::HttpGet(metrics, "/metrics");
    if (testing::PrometheusSample(text, "verifyd_sequences") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(text.empty()) << "no answer from http://" << metrics << "/metrics";
  EXPECT_EQ(testing::PrometheusSample(text, "verifyd_lease_expiries_total"), 2);
  EXPECT_EQ(testing::PrometheusSample(text, "verifyd_sequences"), 0);
  EXPECT_EQ(testing::PrometheusSample(text, "verifyd_kv_capacity_tokens"), 1024);
  EXPECT_EQ(testing::PrometheusSample(text, "verifyd_ready"), 1);
  EXPECT_THAT(text,
              ::testing::ContainsRegex("verifyd_build_info\\{backend=\"(cpu|cuda)\",version=\""));
  // The DCGM join key (plans/0003): "" on cpu, nvidia-smi's form on cuda.
  EXPECT_THAT(text,
              ::testing::ContainsRegex(
                  "verifyd_device_info\\{device=\"0\",gpu_uuid=\""
                  "(GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?\"\\} 1"));
  if (text.find("backend=\"cpu\"") != std::string::npos) {
    EXPECT_THAT(text, HasSubstr("verifyd_device_info{device=\"0\",gpu_uuid=\"\"} 1"));
  }
  EXPECT_THAT(text, HasSubstr("verifyd_rpc_requests_total{code=\"OK\",method=\"Verify\"} 2"));
  EXPECT_THAT(text, HasSubstr("verifyd_verify_tree_nodes_bucket{le=\"4\"} 2"));
  // Every name of plans/0003-service-metrics.md, with its type.
  for (const char* typed : {"verifyd_build_info gauge",
                            "verifyd_device_info gauge",
                            "verifyd_ready gauge",
                            "verifyd_rpc_requests_total counter",
                            "verifyd_rpc_duration_seconds histogram",
                            "verifyd_queue_duration_seconds histogram",
                            "verifyd_kernel_duration_seconds histogram",
                            "verifyd_verify_batch_sequences histogram",
                            "verifyd_verify_tree_nodes histogram",
                            "verifyd_kv_capacity_tokens gauge",
                            "verifyd_kv_used_tokens gauge",
                            "verifyd_kv_pending_tokens gauge",
                            "verifyd_sequences gauge",
                            "verifyd_kv_fragment_runs gauge",
                            "verifyd_kv_fragmented_ratio gauge",
                            "verifyd_compaction_bytes_total counter",
                            "verifyd_compaction_seconds_total counter",
                            "verifyd_compaction_operations_total counter",
                            "verifyd_cuda_graph_captures_total counter",
                            "verifyd_cuda_graph_replays_total counter",
                            "verifyd_cuda_graph_fallbacks_total counter",
                            "verifyd_lease_expiries_total counter"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# TYPE ", typed, "\n")));
  }

  stub.reset();
  channel.reset();
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);

  if (system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not found (Debian package prometheus): /metrics not linted";
  }
  const std::string file =
      absl::StrCat(::testing::TempDir(), "/verifyd-metrics-", getpid(), ".txt");
  std::ofstream(file) << text;
  const std::string command = absl::StrCat("promtool check metrics < ", file, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string lint;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) lint += buffer;
  const int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << lint;
  EXPECT_EQ(lint, "") << "promtool reported problems";
  std::remove(file.c_str());
}

}  // namespace
}  // namespace verifyd
