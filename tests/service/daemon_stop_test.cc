// Issue 33 N12: how long SIGTERM takes when the daemon holds everything a stop must undo — a
// channel whose call waits for a ready flag that never comes (the cpu backend waits up to 10 s
// for one), a registered region, a scrape connection kept alive on /metrics, the TCP and health
// listeners. The issue saw the exit lag the "stopped" line by up to 10 s; the stop must end
// within the drain and a little more, exit 0, and leave the channel's call completed ABORTED or
// refused, never hanging the scheduler.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/channel.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/service/daemon_process.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"

namespace verifyd {
namespace {

using testing::DaemonProcess;
using testing::Scratch;

const std::string kBinary = testing::DaemonBinary(VERIFYD_BINARY);

// A connection to host:port that asked for /metrics with keep-alive and stays open: -1 on failure.
int KeptAliveScrape(const std::string& host_port) {
  const std::vector<std::string> parts = absl::StrSplit(host_port, ':');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n";
  if (write(fd, get.data(), get.size()) != static_cast<ssize_t>(get.size())) {
    close(fd);
    return -1;
  }
  char buffer[4096];
  (void)read(fd, buffer, sizeof(buffer));  // the answer's start: the server serves this connection
  return fd;
}

TEST(DaemonStopTest, SigtermEndsWithinTheDrainWithAChannelCallWaitingForItsReadyFlag) {
  const std::string address = testing::TempSocketAddress("stop");
  std::string error;
  auto daemon =
      DaemonProcess::Start(kBinary,
                           {"--listen=" + address, "--metrics=127.0.0.1:0", "--tcp=127.0.0.1:0",
                            "--health-listen=127.0.0.1:0", "--backend=cpu", "--layers=1",
                            "--heads=2", "--kv-capacity-tokens=1024", "--compute-threads=1",
                            "--shutdown-delay-seconds=0", "--drain-seconds=1"},
                           &error);
  ASSERT_NE(daemon, nullptr) << error;
  const int scrape = KeptAliveScrape(daemon->MetricsAddress());
  ASSERT_GE(scrape, 0) << daemon->startup_line();

  ClientOptions o;
  o.client_id = "stopping-scheduler";
  std::unique_ptr<Client> client = *Client::FromChannel(testing::MakeChannel(address), o);
  testing::ShadowModel model(1, 2, 0.0625f, 3);
  const v1::AppendRequest append = model.MakeAppend(1, 16);
  ASSERT_TRUE(client->Append(append).ok());
  model.AcceptAppend(append);
  Scratch scratch(1 << 20);
  auto registered = client->RegisterExternalMemory(scratch.path(), scratch.bytes());
  ASSERT_TRUE(registered.ok()) << registered.status();
  absl::StatusOr<std::unique_ptr<Channel>> channel = client->OpenChannel(4);
  ASSERT_TRUE(channel.ok()) << channel.status();
  const v1::VerifyRequest request = model.MakeVerify(0, {{1, {-1, 0}, std::nullopt}}, false);
  const Channel::VerifyDescriptor d =
      testing::DescriptorFor(request, registered->region(), scratch, 5, 1);
  ASSERT_TRUE((*channel)->EnqueueVerify(d).ok());               // its ready flag stays 0
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // taken, and waiting

  const auto signalled = std::chrono::steady_clock::now();
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(std::chrono::seconds(30)), 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  // The drain (1 s) and the listeners', channels' and exporter's teardown (~0.5 s measured).
  EXPECT_LT(seconds, 4.0) << "SIGTERM took " << seconds << " s to end the daemon";
  std::printf("SIGTERM to exit: %.2f s\n", seconds);
  // The scheduler is not left hanging: the call completes (ABORTED: the channel closed) or the
  // channel reports the daemon gone.
  absl::StatusOr<Channel::Completion> c = (*channel)->WaitCompletion(absl::Seconds(5));
  if (c.ok()) EXPECT_FALSE(c->status.ok());
  close(scrape);
}

}  // namespace
}  // namespace verifyd
