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

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "base/sealed_memfd.h"
#include "client/fp8_rows.h"
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

// A sealed memfd of this process, mapped and registered with h's daemon.
struct RegisteredMemfd {
  RegisteredMemfd(Harness& h, size_t bytes) : bytes(bytes) {
    absl::StatusOr<int> sealed = CreateSealedMemfd("ext-append", bytes);
    EXPECT_TRUE(sealed.ok()) << sealed.status();
    fd = sealed.value_or(-1);
    data = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(data, MAP_FAILED);
    absl::StatusOr<v1::RegisterExternalMemoryResponse> r =
        h.client->RegisterExternalMemory(ProcFd(fd), bytes);
    EXPECT_TRUE(r.ok()) << r.status();
    region = r.ok() ? r->region() : 0;
  }
  ~RegisteredMemfd() {
    munmap(data, bytes);
    close(fd);
  }
  size_t bytes;
  int fd = -1;
  uint8_t* data = nullptr;
  uint64_t region = 0;
};

// A refused Append from registered memory answers as the same rows inline (code and message,
// which names `where`) and keeps nothing: `inline_append` and `registered_append` send them.
void ExpectRefusedAsInline(Harness& h, absl::FunctionRef<absl::Status()> inline_append,
                           absl::FunctionRef<absl::Status()> registered_append,
                           const std::string& where) {
  const uint64_t used = h.Stats().used_tokens();
  const absl::Status inline_status = inline_append();
  const absl::Status registered = registered_append();
  EXPECT_EQ(registered.code(), absl::StatusCode::kInvalidArgument) << registered;
  EXPECT_EQ(registered, inline_status);
  EXPECT_THAT(registered.message(), HasSubstr(where));
  EXPECT_EQ(h.Stats().used_tokens(), used);
}

// Client::AppendKvRegistered: rows that lie in registered memory are appended by region and
// offset, bf16 and fp8 alike; they attend as the same rows inline; a bad value is named word for
// word as inline and nothing is kept; a misaligned offset and an unknown dtype are refused naming
// them.
TEST(ExternalMemoryTest, AppendKvRegisteredTakesRowsWhereTheyLie) {
  Harness h(testing::SmallOptions("ext-append"));
  ASSERT_TRUE(h.server.status().ok());
  RegisteredMemfd mem(h, 4 << 20);
  const v1::AppendRequest append = h.model.MakeAppend(5, 13);
  const std::string& rows = append.kv().inline_data();
  const int64_t layers = append.kv().shape(0);
  std::memcpy(mem.data + 4096, rows.data(), rows.size());
  absl::StatusOr<v1::AppendResponse> done = h.client->AppendKvRegistered(
      5, 0, layers, 13, v1::DTYPE_BF16, mem.region, 4096, AppendPosition::Create());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->committed_length(), 13u);
  h.model.AcceptAppend(append);
  testing::RpcDriver driver(h.server.stub(), h.model);
  std::string mismatch;
  ASSERT_TRUE(
      driver.Verify(h.model.MakeVerify(1, {{5, {-1, 0, 0}, std::nullopt}}, true), &mismatch).ok());
  EXPECT_EQ(mismatch, "");

  // A NaN at [1, 7, 30]: the registered rows' answer is the inline rows' answer.
  std::vector<uint16_t> bad(rows.size() / 2);
  std::memcpy(bad.data(), rows.data(), rows.size());
  bad[(1 * 13 + 7) * 576 + 30] = 0x7fc0;
  std::memcpy(mem.data + 65536, bad.data(), rows.size());
  ExpectRefusedAsInline(
      h,
      [&] { return h.client->AppendKv(6, 0, layers, 13, bad, AppendPosition::Create()).status(); },
      [&] {
        return h.client
            ->AppendKvRegistered(6, 0, layers, 13, v1::DTYPE_BF16, mem.region, 65536,
                                 AppendPosition::Create())
            .status();
      },
      "kv[1, 7, 30] = nan");
  const uint64_t used = h.Stats().used_tokens();

  const absl::StatusOr<v1::AppendResponse> misaligned = h.client->AppendKvRegistered(
      6, 0, layers, 13, v1::DTYPE_BF16, mem.region, 4096 + 32, AppendPosition::Create());
  EXPECT_EQ(misaligned.status().code(), absl::StatusCode::kInvalidArgument) << misaligned.status();
  EXPECT_THAT(misaligned.status().message(), HasSubstr("kv.external_memory"));
  const absl::StatusOr<v1::AppendResponse> fp32 = h.client->AppendKvRegistered(
      6, 0, layers, 13, v1::DTYPE_FP32, mem.region, 4096, AppendPosition::Create());
  EXPECT_EQ(fp32.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fp32.status().message(), HasSubstr("dtype = DTYPE_FP32"));
  EXPECT_EQ(h.Stats().used_tokens(), used);
}

TEST(ExternalMemoryTest, AppendKvRegisteredTakesFp8RowsAsInline) {
  ServiceOptions options = testing::SmallOptions("ext-append-fp8");
  options.kv_dtype = KvDtype::kFp8;
  Harness h(options);
  ASSERT_TRUE(h.server.status().ok());
  RegisteredMemfd mem(h, 4 << 20);
  const v1::AppendRequest append = h.model.MakeAppend(7, 21);
  const std::string& bits = append.kv().inline_data();
  const int64_t layers = append.kv().shape(0);
  std::vector<uint16_t> bf16(bits.size() / 2);
  std::memcpy(bf16.data(), bits.data(), bits.size());
  absl::StatusOr<std::vector<uint8_t>> rows = QuantizeKvRowsFp8(bf16);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::memcpy(mem.data + 8192, rows->data(), rows->size());
  ASSERT_TRUE(h.client->AppendKvFp8(7, 0, layers, 21, *rows, AppendPosition::Create()).ok());
  absl::StatusOr<v1::AppendResponse> done = h.client->AppendKvRegistered(
      8, 0, layers, 21, v1::DTYPE_FP8_MLA, mem.region, 8192, AppendPosition::Create());
  ASSERT_TRUE(done.ok()) << done.status();
  for (int layer = 0; layer < layers; ++layer) {
    v1::VerifyRequest request = h.model.MakeVerify(layer, {{7, {-1, 0, 1}, std::nullopt}}, true);
    absl::StatusOr<v1::VerifyResponse> a = h.client->Verify(request);
    request.mutable_sequences(0)->set_sequence_id(8);
    absl::StatusOr<v1::VerifyResponse> b = h.client->Verify(request);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_EQ(a->out().inline_data(), b->out().inline_data()) << "layer " << layer;
    EXPECT_EQ(a->lse().inline_data(), b->lse().inline_data()) << "layer " << layer;
  }
  // A bad row: named as inline, nothing kept.
  std::vector<uint8_t> bad = *rows;
  bad[(1 * 21 + 4) * 656 + 40] = 0x7F;
  std::memcpy(mem.data + 65536, bad.data(), bad.size());
  ExpectRefusedAsInline(
      h,
      [&] {
        return h.client->AppendKvFp8(9, 0, layers, 21, bad, AppendPosition::Create()).status();
      },
      [&] {
        return h.client
            ->AppendKvRegistered(9, 0, layers, 21, v1::DTYPE_FP8_MLA, mem.region, 65536,
                                 AppendPosition::Create())
            .status();
      },
      "kv[1, 4] byte 40");
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
