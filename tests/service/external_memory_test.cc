// What RegisterExternalMemory maps on the cpu backend (issue 33 N3, N5, N12): only a sealed memfd
// of the calling process (base/sealed_memfd.h). Before, the daemon mapped any file its user could
// open: a client that truncated its registered file killed the daemon with SIGBUS (N3, this test
// process would have died), and a group member on the socket could make the daemon write the
// daemon user's own files (N5). A directory answered NOT_FOUND and a NUL byte in the handle
// registered the path before it (N12). Every refusal names the handle and changes nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/sealed_memfd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/rpc_helpers.h"

namespace verifyd {
namespace {

using testing::Harness;
using ::testing::HasSubstr;
using testing::Scratch;

std::string ProcFd(int fd) { return absl::StrCat("/proc/", getpid(), "/fd/", fd); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A refused registration: its code and message, and no region left behind.
void ExpectRefused(Harness& h, const std::string& handle, uint64_t bytes, absl::StatusCode code,
                   const std::string& expect) {
  SCOPED_TRACE(handle);
  absl::StatusOr<v1::RegisterExternalMemoryResponse> r =
      h.client->RegisterExternalMemory(handle, bytes);
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(expect));
  EXPECT_EQ(h.Stats().external_regions(), 0u);
}

TEST(ExternalMemoryTest, AFileTheClientCouldTruncateIsNeverMapped) {
  Harness h(testing::SmallOptions("ext-truncate"));
  ASSERT_TRUE(h.server.status().ok());
  // The probe: a 4 MiB file in /dev/shm, registered, truncated, then Append from it.
  const std::string path = absl::StrCat("/dev/shm/verifyd-ext-truncate-", getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4 << 20), 0);
  ExpectRefused(h, path, 4 << 20, absl::StatusCode::kInvalidArgument,
                absl::StrCat("handle = '", path, "' must be /proc/", getpid(), "/fd/<n>"));
  // The same file through a descriptor of ours: a file, not a sealed memfd.
  ExpectRefused(h, ProcFd(fd), 4 << 20, absl::StatusCode::kInvalidArgument,
                "is not a memfd sealed against shrinking");
  // Had either been mapped: this truncation, then the Append below, was a SIGBUS.
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  unlink(path.c_str());

  // A sealed memfd cannot shrink under the daemon's mapping: the truncation is refused.
  absl::StatusOr<int> sealed = CreateSealedMemfd("ext-test", 4 << 20);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  auto* data =
      static_cast<uint8_t*>(mmap(nullptr, 4 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, *sealed, 0));
  ASSERT_NE(data, MAP_FAILED);
  absl::StatusOr<v1::RegisterExternalMemoryResponse> registered =
      h.client->RegisterExternalMemory(ProcFd(*sealed), 4 << 20);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_NE(ftruncate(*sealed, 0), 0);
  EXPECT_EQ(errno, EPERM);
  v1::AppendRequest append = h.model.MakeAppend(5, 13);
  std::memcpy(data + 4096, append.kv().inline_data().data(), append.kv().inline_data().size());
  v1::AppendRequest external = append;
  external.mutable_kv()->mutable_external_memory()->set_region(registered->region());
  external.mutable_kv()->mutable_external_memory()->set_offset(4096);
  ASSERT_TRUE(h.client->Append(external).ok());
  h.model.AcceptAppend(append);
  testing::RpcDriver driver(h.server.stub(), h.model);
  std::string mismatch;
  ASSERT_TRUE(
      driver.Verify(h.model.MakeVerify(1, {{5, {-1, 0, 0}, std::nullopt}}, true), &mismatch).ok());
  EXPECT_EQ(mismatch, "");
  munmap(data, 4 << 20);
  close(*sealed);
}

TEST(ExternalMemoryTest, NoFileOfTheDaemonsUserCanBeNamed) {
  Harness h(testing::SmallOptions("ext-files"));
  ASSERT_TRUE(h.server.status().ok());
  // A private file of the daemon's user (the issue's /tmp/x/config.txt, mode 0600).
  char dir[] = "/tmp/verifyd-ext-files-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string config = absl::StrCat(dir, "/config.txt");
  {
    std::ofstream out(config);
    out << "listen = unix:///run/verifyd/verifyd-0.sock\n";
  }
  ASSERT_EQ(chmod(config.c_str(), 0600), 0);
  const std::string before = ReadFile(config);
  ExpectRefused(h, config, 16, absl::StatusCode::kInvalidArgument, "must be /proc/");
  const int fd = open(config.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ExpectRefused(h, ProcFd(fd), 16, absl::StatusCode::kInvalidArgument,
                "is not a memfd sealed against shrinking");
  close(fd);
  // Descriptors of another process (the daemon's own, "self"; init's) are not the caller's.
  ExpectRefused(h, "/proc/self/fd/0", 16, absl::StatusCode::kInvalidArgument, "must be /proc/");
  ExpectRefused(h, "/proc/1/fd/0", 16, absl::StatusCode::kInvalidArgument,
                "a descriptor of the calling process");
  ExpectRefused(h, ProcFd(3) + "/../../../etc/passwd", 16, absl::StatusCode::kInvalidArgument,
                "must be /proc/");
  EXPECT_EQ(ReadFile(config), before);
  unlink(config.c_str());
  rmdir(dir);
}

TEST(ExternalMemoryTest, DirectoriesNulBytesAndUnsealedMemoryAreInvalidArguments) {
  Harness h(testing::SmallOptions("ext-forms"));
  ASSERT_TRUE(h.server.status().ok());
  const int dir = open("/tmp", O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dir, 0);
  ExpectRefused(h, ProcFd(dir), 64, absl::StatusCode::kInvalidArgument, "cannot open");
  close(dir);
  ExpectRefused(h, ProcFd(99999), 64, absl::StatusCode::kNotFound, "cannot open");
  // A NUL byte: the path before it is a good handle, which must not be what gets registered.
  Scratch good(1 << 16);
  std::string with_nul = good.path();
  with_nul.push_back('\0');
  with_nul += "trailing";
  ExpectRefused(h, with_nul, 64, absl::StatusCode::kInvalidArgument, "NUL byte at offset");
  // A memfd without the seal, and one sealed with a hole where pages should be.
  const int unsealed = memfd_create("ext-unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(unsealed, 1 << 16), 0);
  ExpectRefused(h, ProcFd(unsealed), 1 << 16, absl::StatusCode::kInvalidArgument,
                "is not a memfd sealed against shrinking");
  ASSERT_EQ(fcntl(unsealed, F_ADD_SEALS, kMemfdSeals), 0);
  ExpectRefused(h, ProcFd(unsealed), 1 << 16, absl::StatusCode::kInvalidArgument,
                "allocate them (posix_fallocate) before registering");
  close(unsealed);
  // The good one registers.
  EXPECT_TRUE(h.client->RegisterExternalMemory(good.path(), good.bytes()).ok());
  EXPECT_EQ(h.Stats().external_regions(), 1u);
}

}  // namespace
}  // namespace verifyd
