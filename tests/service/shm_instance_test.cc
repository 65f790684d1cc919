// Issue 33 N10: a daemon that dies without its shutdown (SIGKILL, OOM, a crash) left its /dev/shm
// files behind (tensor regions, channel rings, up to --shm-max-bytes and the rings' bytes), and
// the next start did not remove them: a crash loop filled tmpfs. ShmInstance
// (service/shm_instance.h) names every file after this run and holds a lock while it lives; a start
// removes what dead runs of its device left, and never a live daemon's files.
#include "service/shm_instance.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/channel.h"
#include "client/client.h"
#include "client/shared_memory_region.h"
#include "gtest/gtest.h"
#include "tests/service/daemon_process.h"
#include "tests/service/test_server.h"

namespace verifyd {
namespace {

std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.insert(e->d_name);
  }
  closedir(d);
  return names;
}

void Touch(const std::string& path, int bytes) {
  std::ofstream out(path);
  out << std::string(static_cast<size_t>(bytes), 'x');
}

class ShmInstanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/verifyd-shm-instance-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    for (const std::string& name : Listing(dir_)) unlink((dir_ + "/" + name).c_str());
    rmdir(dir_.c_str());
  }
  // A daemon of `device` that makes `files` files and dies without its shutdown (the lock goes
  // with its process; the files and the lock file stay). Returns the prefix it used.
  std::string DeadRun(int device, int files) {
    int pipe_fds[2];
    EXPECT_EQ(pipe(pipe_fds), 0);
    const pid_t child = fork();
    if (child == 0) {
      absl::StatusOr<std::unique_ptr<ShmInstance>> run = ShmInstance::Create(device, dir_);
      if (!run.ok()) _exit(1);
      for (int i = 0; i < files; ++i) Touch(absl::StrCat(dir_, "/", (*run)->prefix(), i), 100);
      const std::string prefix = (*run)->prefix();
      if (write(pipe_fds[1], prefix.data(), prefix.size()) < 0) _exit(1);
      _exit(0);  // no destructor: SIGKILL's leftovers
    }
    close(pipe_fds[1]);
    char buffer[128] = {};
    const ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
    close(pipe_fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_EQ(WEXITSTATUS(status), 0);
    return std::string(buffer, n > 0 ? static_cast<size_t>(n) : 0);
  }
  std::string dir_;
};

TEST_F(ShmInstanceTest, AStartRemovesWhatDeadRunsLeftAndNothingOfTheLiving) {
  const std::string dead_a = DeadRun(3, 4);
  const std::string dead_b = DeadRun(3, 2);
  ASSERT_TRUE(absl::StartsWith(dead_a, "verifyd-3-"));
  // Another device's dead run, files of an instance without any lock file (its lock already
  // gone), and files that are not the daemon's at all.
  const std::string other_device = DeadRun(4, 1);
  Touch(dir_ + "/verifyd-3-0123456789abcdef-channel-ffff", 10);
  Touch(dir_ + "/verifyd-3-notaninstance-x", 10);
  Touch(dir_ + "/somebody-else", 10);
  // A live run of the same device, with files.
  absl::StatusOr<std::unique_ptr<ShmInstance>> live = ShmInstance::Create(3, dir_);
  ASSERT_TRUE(live.ok()) << live.status();
  // dead_b's start already swept dead_a; this one sweeps dead_b (2 files and its lock) and the
  // lockless instance's file.
  EXPECT_EQ((*live)->swept_files(), 4);
  Touch(absl::StrCat(dir_, "/", (*live)->prefix(), "region"), 10);
  absl::StatusOr<std::unique_ptr<ShmInstance>> second = ShmInstance::Create(3, dir_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->swept_files(), 0) << "a start removed a live daemon's files";
  const std::set<std::string> left = Listing(dir_);
  for (const std::string& name : left) {
    EXPECT_FALSE(absl::StartsWith(name, dead_a)) << name;
    EXPECT_FALSE(absl::StartsWith(name, dead_b)) << name;
  }
  EXPECT_TRUE(left.contains(absl::StrCat((*live)->prefix(), "region")));
  EXPECT_TRUE(left.contains(absl::StrCat(other_device, "0")));
  EXPECT_TRUE(left.contains("verifyd-3-notaninstance-x"));
  EXPECT_TRUE(left.contains("somebody-else"));
  EXPECT_FALSE(left.contains("verifyd-3-0123456789abcdef-channel-ffff"));
  // A clean end takes its lock file with it.
  const std::string lock = (*second)->prefix();
  second->reset();
  for (const std::string& name : Listing(dir_)) {
    EXPECT_FALSE(absl::StartsWith(name, lock.substr(0, lock.size() - 1))) << name;
  }
}

// The daemon: killed with SIGKILL holding a tensor region and a channel ring, then started again
// on the same device: the dead run's files are gone.
TEST(ShmInstanceDaemonTest, ARestartAfterSigkillRemovesTheDeadRunsFiles) {
  constexpr int kDevice = 917;  // its own: nothing else of the suite names /dev/shm after it
  const std::string device_prefix = absl::StrCat("verifyd-", kDevice, "-");
  auto ours = [&] {
    int n = 0;
    for (const std::string& name : Listing("/dev/shm")) n += absl::StartsWith(name, device_prefix);
    return n;
  };
  ASSERT_EQ(ours(), 0) << "files of device " << kDevice << " before the test";
  const std::string binary = testing::DaemonBinary(VERIFYD_BINARY);
  auto args = [&](const std::string& address) {
    return std::vector<std::string>{"--listen=" + address, "--metrics=",
                                    "--backend=cpu",       absl::StrCat("--device=", kDevice),
                                    "--layers=1",          "--heads=2",
                                    "--compute-threads=1", "--kv-capacity-tokens=1024"};
  };
  const std::string address = testing::TempSocketAddress("shm-sweep");
  std::string error;
  auto daemon = testing::DaemonProcess::Start(binary, args(address), &error);
  ASSERT_NE(daemon, nullptr) << error;
  ClientOptions o;
  o.client_id = "sweep";
  std::unique_ptr<Client> client = *Client::Connect(address, o);
  // Held across the kill: their destructors would release them.
  absl::StatusOr<SharedMemoryRegion> region = client->CreateSharedMemory(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::StatusOr<std::unique_ptr<Channel>> channel = client->OpenChannel(4);
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_GE(ours(), 3);  // a region, a ring, the lock
  daemon->Signal(SIGKILL);
  daemon->Wait(std::chrono::seconds(10));
  EXPECT_GE(ours(), 3) << "SIGKILL left nothing to sweep";
  const std::string again = testing::TempSocketAddress("shm-sweep");
  auto next = testing::DaemonProcess::Start(binary, args(again), &error);
  ASSERT_NE(next, nullptr) << error;
  EXPECT_EQ(ours(), 1) << "only the new run's lock should be left";
  next->Signal(SIGTERM);
  EXPECT_EQ(next->Wait(std::chrono::seconds(30)), 0);
  EXPECT_EQ(ours(), 0);
}

}  // namespace
}  // namespace verifyd
