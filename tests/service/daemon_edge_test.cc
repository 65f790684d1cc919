// The real `verifyd` binary against the edge's defects of issue 17 (plans/0015 has the probe
// table): a killed client's queued Verify calls are not computed and are counted CANCELLED; a
// SIGTERM with a full queue ends within the drain; a connection flood past the descriptor limit
// leaves a daemon that still accepts; the socket is never looser than 0660; the health listener
// serves health alone; the admin token comes from a private file; --help and --version answer.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/service_options.h"
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

const std::string kBinary = testing::DaemonBinary(VERIFYD_BINARY);

// The test client to kill; VERIFYD_DYING_CLIENT points elsewhere (the GPU bundle).
const std::string kDyingClient = [] {
  const char* env = std::getenv("VERIFYD_DYING_CLIENT");
  return std::string(env != nullptr && *env != '\0' ? env : DYING_CLIENT_BINARY);
}();

// Heavy enough on the CPU backend with one thread that the calls behind the first one are still
// queued when the test acts (each takes tens of ms or more; sending all of them takes µs).
constexpr int kTokens = 4096;
constexpr int kNodes = 32;
constexpr int kCalls = 64;

std::vector<std::string> HeavyDaemonFlags(const std::string& address) {
  return {"--listen=" + address, "--backend=cpu",         "--layers=1",
          "--heads=16",          "--compute-threads=1",   "--kv-capacity-tokens=8192",
          "--max-tree-nodes=64", "--softmax-scale=0.0625"};
}

double VerifyCount(const std::string& metrics, const char* code) {
  // A code not seen yet has no line: 0 calls.
  return testing::PrometheusSample(
             testing::HttpGet(metrics, "/metrics"),
             absl::StrCat("verifyd_rpc_requests_total{code=\"", code, "\",method=\"Verify\"}"))
      .value_or(0);
}

std::unique_ptr<DaemonProcess> StartUnderShell(const std::string& prelude,
                                               const std::vector<std::string>& args,
                                               std::string* error) {
  return testing::StartUnderShell(kBinary, prelude, args, error);
}

// Reads the dying client's "sent" line (its first reply came back).
bool WaitForLine(FILE* out, std::string* line) {
  char buffer[256];
  if (fgets(buffer, sizeof(buffer), out) == nullptr) return false;
  *line = buffer;
  return true;
}

TEST(DaemonEdgeTest, AKilledClientsQueuedVerifiesAreNotComputedAndCountCancelled) {
  const std::string address = testing::TempSocketAddress("dying");
  std::vector<std::string> flags = HeavyDaemonFlags(address);
  flags.push_back("--metrics=127.0.0.1:0");
  std::string error;
  auto daemon = DaemonProcess::Start(kBinary, flags, &error);
  ASSERT_NE(daemon, nullptr) << error;
  const std::string metrics = daemon->MetricsAddress();

  // The client runs in a process of its own, so that SIGKILL closes its connection the way a
  // crashed scheduler does.
  const std::string command = absl::StrCat(kDyingClient, " ", address, " ", kTokens, " ", kNodes,
                                           " ", kCalls, " & echo $!");
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string pid_line, sent;
  ASSERT_TRUE(WaitForLine(out, &pid_line));
  int pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(pid_line), &pid)) << pid_line;
  ASSERT_TRUE(WaitForLine(out, &sent)) << "the client printed nothing";
  EXPECT_THAT(sent, HasSubstr("sent ok"));
  kill(pid, SIGKILL);
  pclose(out);

  // Another client's Verify queues behind whatever the dead one left; when it is answered, each
  // dead call has been either run or skipped.
  auto channel = testing::MakeChannel(address);
  auto stub = v1::Verifyd::NewStub(channel);
  ShadowModel model(1, 16, 0.0625f, 11);
  testing::RpcDriver driver(*stub, model);
  ASSERT_TRUE(driver.Append(model.MakeAppend(2, 64)).ok());
  std::string mismatch;
  ASSERT_TRUE(
      driver
          .Verify(model.MakeVerify(0, {VerifyPart{2, model.RandomParents(8), std::nullopt}}, true),
                  &mismatch)
          .ok());
  EXPECT_EQ(mismatch, "");
  const double ok = VerifyCount(metrics, "OK");
  const double cancelled = VerifyCount(metrics, "CANCELLED");
  // The dead calls that reached the daemon (under load a few may still sit in the client's send
  // buffer at the kill) ended one way or the other. The first ran, and the calls the device
  // started before gRPC had read the closed connection (1 to ~5 seen on a loaded 2-core box); the
  // old handler ran every one of them and counted them OK.
  EXPECT_LE(ok + cancelled, kCalls + 1) << "ok " << ok << " cancelled " << cancelled;
  EXPECT_LE(ok, kCalls / 4) << "calls of a dead client were computed";
  // At least a quarter skipped (seen 59 of 64 here; a loaded 2-core box leaves more of them in the
  // dead client's send buffer): the skip path ran, it did not merely find nothing to skip.
  EXPECT_GE(cancelled, kCalls / 4) << "ok " << ok << " cancelled " << cancelled;
}

TEST(DaemonEdgeTest, SigtermWithAFullQueueEndsWithinTheDrain) {
  const std::string address = testing::TempSocketAddress("fullq");
  std::vector<std::string> flags = HeavyDaemonFlags(address);
  flags.insert(flags.end(), {"--metrics=", "--shutdown-delay-seconds=0", "--drain-seconds=1"});
  std::string error;
  auto daemon = DaemonProcess::Start(kBinary, flags, &error);
  ASSERT_NE(daemon, nullptr) << error;
  auto stub = v1::Verifyd::NewStub(testing::MakeChannel(address));
  ShadowModel model(1, 16, 0.0625f, 13);
  testing::RpcDriver driver(*stub, model);
  ASSERT_TRUE(driver.Append(model.MakeAppend(1, kTokens)).ok());
  const v1::VerifyRequest request =
      model.MakeVerify(0, {VerifyPart{1, model.RandomParents(kNodes), std::nullopt}}, false);
  grpc::CompletionQueue cq;
  struct Pending {
    grpc::ClientContext context;
    v1::VerifyResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::VerifyResponse>> reader;
  };
  std::vector<std::unique_ptr<Pending>> calls;
  for (int i = 0; i < kCalls; ++i) {
    auto p = std::make_unique<Pending>();
    p->context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    p->reader = stub->AsyncVerify(&p->context, request, &cq);
    p->reader->Finish(&p->response, &p->status, p.get());
    calls.push_back(std::move(p));
  }
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(static_cast<Pending*>(tag)->status.ok())
      << static_cast<Pending*>(tag)->status.error_message();
  daemon->Signal(SIGTERM);
  // Old behaviour: every queued call was computed before the exit (kCalls x a heavy call, past
  // the drain by far). Now the drain's deadline cancels what is left and the device skips it.
  int answered_ok = 1;
  for (int i = 1; i < kCalls; ++i) {
    ASSERT_TRUE(cq.Next(&tag, &ok));
    const grpc::Status& status = static_cast<Pending*>(tag)->status;
    if (status.ok()) {
      ++answered_ok;
    } else {
      EXPECT_THAT(status.error_code(),
                  ::testing::AnyOf(grpc::StatusCode::CANCELLED, grpc::StatusCode::UNAVAILABLE))
          << status.error_message();
    }
  }
  EXPECT_LT(answered_ok, kCalls / 2) << "the queue was computed past --drain-seconds";
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
}

TEST(DaemonEdgeTest, AConnectionFloodPastTheDescriptorLimitLeavesTheDaemonAccepting) {
  const std::string address = testing::TempSocketAddress("flood");
  std::string error;
  auto daemon = StartUnderShell(
      // 256 (soft and hard): room for the CUDA driver's own descriptors where --backend=auto picks
      // cuda (under 64 the driver's baseline alone left no connection room: plans/0015).
      "ulimit -n 256",
      {"--listen=" + address, "--metrics=", "--layers=1", "--heads=2", "--compute-threads=1",
       "--kv-capacity-tokens=1024"},
      &error);
  ASSERT_NE(daemon, nullptr) << error;
  const std::string path = UnixSocketPath(address);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // More idle connections than the daemon has descriptors.
  std::vector<int> fds;
  for (int i = 0; i < 320; ++i) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << i;
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the daemon accept them
  for (int fd : fds) close(fd);
  // A fresh connection gets answered: health SERVING and Stats.
  auto channel = testing::MakeChannel(address);
  bool ok = false;
  Health::ServingStatus health = Health::UNKNOWN;
  // The daemon closes the flood's fds as it reads EOF. Up to 15 s: on the H200, after the suite's
  // earlier daemons, once more than 5 s (alone it takes under 1 s); recovery, not its speed, is
  // what this checks.
  for (int i = 0; i < 150 && !ok; ++i) {
    health = testing::CheckHealth(channel, "", &ok);
    if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(ok) << "the daemon no longer accepts connections";
  EXPECT_EQ(health, Health::SERVING);
  auto stub = v1::Verifyd::NewStub(channel);
  auto context = testing::ContextWithDeadline(std::chrono::seconds(10));
  v1::StatsResponse stats;
  const grpc::Status status = stub->Stats(context.get(), v1::StatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(stats.free_tokens(), 1024u);
}

TEST(DaemonEdgeTest, TheSocketIsNeverLooserThan0660EvenUnderUmask000) {
  const std::string address = testing::TempSocketAddress("umask");
  const std::string path = UnixSocketPath(address);
  // Watch the path from before the start: every mode ever seen there must be 0660.
  std::atomic<bool> stop{false};
  std::set<unsigned> modes;
  std::thread watcher([&] {
    while (!stop) {
      struct stat st {};
      if (lstat(path.c_str(), &st) == 0) modes.insert(st.st_mode & 0777);
    }
  });
  std::string error;
  auto daemon = StartUnderShell("umask 000",
                                {"--listen=" + address, "--metrics=", "--layers=1", "--heads=2",
                                 "--compute-threads=1", "--kv-capacity-tokens=1024"},
                                &error);
  stop = true;
  watcher.join();
  ASSERT_NE(daemon, nullptr) << error;
  // The watcher may not have been scheduled between the socket's appearance and the start's
  // return (seen on a loaded 2-core machine: an empty set): the socket as it stands now, too.
  struct stat now {};
  ASSERT_EQ(lstat(path.c_str(), &now), 0) << path;
  modes.insert(now.st_mode & 0777);
  EXPECT_THAT(modes, ::testing::ElementsAre(0660u));
  // Nothing of the private bind directory is left next to the socket.
  const std::string dir = path.substr(0, path.rfind('/'));
  std::string listing;
  EXPECT_EQ(
      testing::RunToExit(
          "/bin/sh", {"-c", "ls -a " + dir + " | grep -c '^.verifyd-bind-' >&2 || true"}, &listing),
      0);
  EXPECT_EQ(absl::StripAsciiWhitespace(listing), "0");
  // The default address is not in /tmp, where another user could take the name first.
  EXPECT_FALSE(absl::StartsWith(DefaultListenAddress(0), "unix:///tmp/"));
}

TEST(DaemonEdgeTest, TheHealthListenerServesHealthAlone) {
  const std::string address = testing::TempSocketAddress("hl");
  std::string error;
  auto daemon = DaemonProcess::Start(
      kBinary,
      {"--listen=" + address, "--metrics=", "--health-listen=127.0.0.1:0", "--layers=1",
       "--heads=2", "--compute-threads=1", "--kv-capacity-tokens=1024"},
      &error);
  ASSERT_NE(daemon, nullptr) << error;
  const std::string health_address = daemon->StartupField("health");
  ASSERT_FALSE(health_address.empty()) << daemon->startup_line();
  auto channel = testing::MakeChannel(health_address);
  bool ok = false;
  EXPECT_EQ(testing::CheckHealth(channel, "", &ok), Health::SERVING);
  EXPECT_TRUE(ok);
  EXPECT_EQ(testing::CheckHealth(channel, "verifyd.v1.Verifyd", &ok), Health::SERVING);
  auto stub = v1::Verifyd::NewStub(channel);
  {
    auto context = testing::ContextWithDeadline(std::chrono::seconds(10));
    v1::StatsResponse stats;
    EXPECT_EQ(stub->Stats(context.get(), v1::StatsRequest(), &stats).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    auto context = testing::ContextWithDeadline(std::chrono::seconds(10));
    v1::AppendResponse response;
    ShadowModel model(1, 2, 0.0625f, 3);
    EXPECT_EQ(stub->Append(context.get(), model.MakeAppend(1, 4), &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  // SIGTERM turns it NOT_SERVING with the socket's health.
  daemon->Signal(SIGTERM);
  bool saw_not_serving = false;
  for (int i = 0; i < 100 && !saw_not_serving; ++i) {
    saw_not_serving = testing::CheckHealth(channel, "", &ok) == Health::NOT_SERVING && ok;
    if (!saw_not_serving) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  channel.reset();
  stub.reset();
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
}

TEST(DaemonEdgeTest, TheAdminTokenComesFromAPrivateFileOnly) {
  std::string output;
  // No flag takes the token itself: argv is readable by every user of the host.
  EXPECT_NE(testing::RunToExit(kBinary, {"--admin-token=s3cret"}, &output), 0);
  output.clear();
  const std::string path = testing::WriteTokenFile("s3cret");
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  const std::string address = testing::TempSocketAddress("token");
  EXPECT_EQ(
      testing::RunToExit(
          kBinary, {"--listen=" + address, "--metrics=", "--admin-token-file=" + path}, &output),
      1);
  EXPECT_THAT(output, HasSubstr("is readable by every user (mode 0644)"));
  output.clear();
  EXPECT_EQ(
      testing::RunToExit(
          kBinary, {"--listen=" + address, "--metrics=", "--admin-token-file=/nonexistent/token"},
          &output),
      1);
  EXPECT_THAT(output,
              HasSubstr("--admin-token-file = '/nonexistent/token' is not a readable file"));
  unlink(path.c_str());
}

TEST(DaemonEdgeTest, HelpListsTheFlagsAndVersionAnswers) {
  std::string output;
  // absl prints --help and --version to stdout; RunToExit keeps stderr: go through the shell.
  EXPECT_EQ(testing::RunToExit("/bin/sh", {"-c", "\"$0\" --help >&2", kBinary}, &output), 1);
  for (const char* flag : {"--listen", "--tcp", "--admin_token_file", "--health_listen",
                           "--drain_seconds", "--layers"}) {
    EXPECT_THAT(output, HasSubstr(flag));
  }
  EXPECT_THAT(output, ::testing::Not(HasSubstr("No flags matched")));
  output.clear();
  EXPECT_EQ(testing::RunToExit("/bin/sh", {"-c", "\"$0\" --version >&2", kBinary}, &output), 0);
  EXPECT_THAT(output, ::testing::StartsWith("verifyd "));
}

}  // namespace
}  // namespace verifyd
