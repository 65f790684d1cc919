// The real `verifyd` binary's listening sockets (issue 33): TCP and the health port survive a
// connection flood past the descriptor limit (N4: gRPC's own listeners died for good after one
// failed accept, and the kubelet's liveness probe aims at that port), channels opened until the
// descriptors run short are refused RESOURCE_EXHAUSTED while new processes still connect (N6:
// INTERNAL, and nobody could connect), and --tcp / --health-listen with port 0 serve every
// address of their host on the one port they report (N12).
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/service_options.h"
#include "tests/service/daemon_process.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/test_server.h"

namespace verifyd {
namespace {

using testing::DaemonProcess;
using Health = grpc::health::v1::HealthCheckResponse;

const std::string kBinary = testing::DaemonBinary(VERIFYD_BINARY);

std::unique_ptr<DaemonProcess> StartUnderShell(const std::string& prelude,
                                               const std::vector<std::string>& args,
                                               std::string* error) {
  return testing::StartUnderShell(kBinary, prelude, args, error);
}

std::vector<std::string> SmallDaemon(const std::string& address) {
  return {"--listen=" + address,
          "--metrics=",
          "--backend=cpu",
          "--layers=1",
          "--heads=2",
          "--compute-threads=1",
          "--kv-capacity-tokens=1024"};
}

// Health on `target` answers SERVING within `tries` x 100 ms (the daemon closes a flood's
// descriptors as it reads their EOF: recovery, not its speed, is what the callers check).
bool ServingWithin(const std::string& target, int tries) {
  auto channel = testing::MakeChannel(target);
  for (int i = 0; i < tries; ++i) {
    bool ok = false;
    if (testing::CheckHealth(channel, "", &ok) == Health::SERVING && ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// `count` idle TCP connections to 127.0.0.1:port (fewer when this process runs short).
std::vector<int> Flood(int port, int count) {
  std::vector<int> fds;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      break;
    }
    fds.push_back(fd);
  }
  return fds;
}

int PortOf(const std::string& host_port) {
  int port = 0;
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) return 0;
  return port;
}

TEST(DaemonListenersTest, TcpAndHealthSurviveAFloodPastTheDescriptorLimit) {
  const std::string address = testing::TempSocketAddress("tcp-flood");
  std::vector<std::string> args = SmallDaemon(address);
  args.push_back("--tcp=127.0.0.1:0");
  args.push_back("--health-listen=127.0.0.1:0");
  std::string error;
  // The probe: 128 descriptors (soft and hard), 160 connections on each port.
  auto daemon = StartUnderShell("ulimit -n 128", args, &error);
  ASSERT_NE(daemon, nullptr) << error;
  const int tcp = PortOf(daemon->StartupField("tcp"));
  const int health = PortOf(daemon->StartupField("health"));
  ASSERT_GT(tcp, 0) << daemon->startup_line();
  ASSERT_GT(health, 0) << daemon->startup_line();
  for (int round = 0; round < 2; ++round) {
    std::vector<int> held = Flood(tcp, 160);
    std::vector<int> more = Flood(health, 160);
    held.insert(held.end(), more.begin(), more.end());
    ASSERT_GT(held.size(), 128u) << "the flood did not pass the daemon's limit";
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the daemon accept
    for (int fd : held) close(fd);
    EXPECT_TRUE(ServingWithin(absl::StrCat("127.0.0.1:", health), 150))
        << "round " << round << ": the health port no longer answers";
    EXPECT_TRUE(ServingWithin(absl::StrCat("127.0.0.1:", tcp), 150))
        << "round " << round << ": the TCP port no longer answers";
    EXPECT_TRUE(ServingWithin(address, 150)) << "round " << round << ": the Unix socket";
  }
}

TEST(DaemonListenersTest, ChannelsPastTheDescriptorsAreResourceExhaustedAndNewProcessesConnect) {
  const std::string address = testing::TempSocketAddress("chan-fds");
  std::vector<std::string> args = SmallDaemon(address);
  args.push_back("--max-channels=4096");
  args.push_back("--max-channel-bytes=1099511627776");
  std::string error;
  auto daemon = StartUnderShell("ulimit -n 256", args, &error);
  ASSERT_NE(daemon, nullptr) << error;
  // The probe: a channel under a new client id each time, until the daemon refuses (one
  // connection for all: the ids are what a per-client bound would have counted).
  auto connection = testing::MakeChannel(address);
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Channel>> channels;
  absl::Status refused;
  for (int i = 0; i < 300 && refused.ok(); ++i) {
    ClientOptions o;
    o.client_id = absl::StrCat("client-", i);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::FromChannel(connection, o);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<std::unique_ptr<Channel>> channel = (*client)->OpenChannel(2);
    if (!channel.ok()) {
      refused = channel.status();
      break;
    }
    channels.push_back(*std::move(channel));
    clients.push_back(*std::move(client));
  }
  ASSERT_FALSE(refused.ok()) << "300 channels under 256 descriptors";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("descriptors"));
  // A new connection (a new process's) is still accepted and answered.
  EXPECT_TRUE(ServingWithin(address, 50));
  // Closing channels gives their descriptors back.
  for (auto& c : channels) EXPECT_TRUE(c->Close().ok());
  channels.clear();
  ClientOptions o;
  o.client_id = "after";
  std::unique_ptr<Client> after = *Client::FromChannel(connection, o);
  absl::StatusOr<std::unique_ptr<Channel>> reopened = after->OpenChannel(2);
  EXPECT_TRUE(reopened.ok()) << reopened.status();
}

// Every address --tcp's and --health-listen's host resolves to is served on the port the startup
// line reports (here localhost: 127.0.0.1, and ::1 where the host maps it to localhost too).
TEST(DaemonListenersTest, PortZeroServesEveryAddressOnTheReportedPort) {
  const std::string address = testing::TempSocketAddress("port0");
  std::vector<std::string> args = SmallDaemon(address);
  args.push_back("--tcp=localhost:0");
  args.push_back("--health-listen=localhost:0");
  std::string error;
  auto daemon = DaemonProcess::Start(kBinary, args, &error);
  ASSERT_NE(daemon, nullptr) << error;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  ASSERT_EQ(getaddrinfo("localhost", "0", &hints, &found), 0);
  std::vector<std::string> hosts;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    hosts.push_back(ai->ai_family == AF_INET6 ? "[::1]" : "127.0.0.1");
  }
  freeaddrinfo(found);
  ASSERT_FALSE(hosts.empty());
  for (const char* field : {"tcp", "health"}) {
    const int port = PortOf(daemon->StartupField(field));
    ASSERT_GT(port, 0) << daemon->startup_line();
    for (const std::string& host : hosts) {
      EXPECT_TRUE(ServingWithin(absl::StrCat(host, ":", port), 50))
          << field << " does not answer on " << host << ":" << port;
    }
  }
}

}  // namespace
}  // namespace verifyd
