// libverifyd_dataplane's C ABI (client/c_api/verifyd_dataplane.h) against the real daemon binary
// on the cpu backend: argument and thread-local errors, registration and ownership, a channel's
// completions (poll capacity, wait), a refused Verify's NaN outputs and done flag, and the CUDA
// entry points' answers on a host without a GPU. The numerics are the Python tests' (every
// element against float64, python/tests/test_dataplane.py) and data_plane_test's.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sealed_memfd.h"
#include "client/c_api/verifyd_dataplane.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/daemon_process.h"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using verifyd::testing::DaemonProcess;

constexpr int kHeads = 2;

std::string LastError() { return vd_last_error(); }

// A sealed memfd mapped here (base/sealed_memfd.h): the cpu backend's "device memory".
class ShmFile {
 public:
  explicit ShmFile(size_t bytes) : bytes_(bytes) {
    absl::StatusOr<int> fd = verifyd::CreateSealedMemfd("c-api-test", bytes);
    EXPECT_TRUE(fd.ok()) << fd.status();
    fd_ = fd.value_or(-1);
    data_ = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
  }
  ~ShmFile() {
    munmap(data_, bytes_);
    close(fd_);
  }
  std::string path() const { return verifyd::MemfdHandle(fd_); }
  size_t bytes() const { return bytes_; }
  char* data() const { return data_; }
  std::atomic<uint32_t>& word(uint64_t offset) {
    return *reinterpret_cast<std::atomic<uint32_t>*>(data_ + offset);
  }

 private:
  int fd_ = -1;
  size_t bytes_;
  char* data_;
};

class CApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat("/tmp/verifyd-c-api-", getpid()));
    mkdir(dir_->c_str(), 0700);
    target_ = new std::string(absl::StrCat("unix://", *dir_, "/verifyd.sock"));
    std::string error;
    daemon_ = DaemonProcess::Start(
                  VERIFYD_BINARY,
                  {"--listen=" + *target_, "--metrics=", "--backend=cpu", "--layers=2",
                   absl::StrCat("--heads=", kHeads), "--max_tree_nodes=64",
                   "--kv_capacity_tokens=4096", "--compute_threads=1", "--drain_seconds=2"},
                  &error)
                  .release();
    ASSERT_NE(daemon_, nullptr) << error;
  }
  static void TearDownTestSuite() {
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);
      EXPECT_EQ(daemon_->Wait(std::chrono::seconds(10)), 0);
      delete daemon_;
    }
    rmdir(dir_->c_str());
  }
  vd_client* Connect(const char* id) {
    vd_client* c = nullptr;
    EXPECT_EQ(vd_connect(target_->c_str(), id, nullptr, 10.0, &c), 0) << LastError();
    return c;
  }

  static std::string* dir_;
  static std::string* target_;
  static DaemonProcess* daemon_;
};
std::string* CApiTest::dir_ = nullptr;
std::string* CApiTest::target_ = nullptr;
DaemonProcess* CApiTest::daemon_ = nullptr;

TEST(CApiLocalTest, VersionNullArgumentsAndThreadLocalErrors) {
  EXPECT_EQ(vd_abi_version(), VD_ABI_VERSION);
  vd_client* c = nullptr;
  EXPECT_EQ(vd_connect(nullptr, nullptr, nullptr, 0, &c), -3);
  EXPECT_EQ(vd_last_error_code(), 3);
  EXPECT_EQ(LastError(), "vd_connect: target is NULL");
  EXPECT_EQ(vd_connect("", nullptr, nullptr, 0, &c), -3);
  EXPECT_THAT(LastError(), HasSubstr("target"));
  // Another thread sees its own (no) error.
  int other_code = -1;
  std::string other_message = "unset";
  std::thread([&] {
    other_code = vd_last_error_code();
    other_message = vd_last_error();
  }).join();
  EXPECT_EQ(other_code, 0);
  EXPECT_EQ(other_message, "");
  EXPECT_EQ(vd_poll_completions(nullptr, nullptr, 0), -3);
  EXPECT_EQ(LastError(), "vd_poll_completions: channel is NULL");
  EXPECT_EQ(vd_channel_close(nullptr), 0);
  vd_disconnect(nullptr);
}

TEST(CApiLocalTest, UnavailableDaemonAndCudaEntryPoints) {
  vd_client* c = nullptr;
  ASSERT_EQ(vd_connect("unix:///nonexistent/verifyd.sock", "x", nullptr, 2.0, &c), 0);
  EXPECT_STREQ(vd_client_id(c), "x");
  uint64_t region = 0;
  EXPECT_EQ(vd_register_file(c, "/dev/shm/none", 64, 0, &region), -14);
  EXPECT_THAT(LastError(), StartsWith("RegisterExternalMemory: "));
  vd_channel* ch = nullptr;
  EXPECT_EQ(vd_channel_open(c, 4, &ch), -14);
  EXPECT_EQ(ch, nullptr);
  vd_disconnect(c);
  if (vd_has_cuda() == 0) {
    EXPECT_EQ(vd_stream_write_value32(nullptr, 4096, 1), -9);
    EXPECT_THAT(LastError(), HasSubstr("built without CUDA"));
    EXPECT_EQ(vd_stream_wait_value32(nullptr, 4096, 1), -9);
    EXPECT_EQ(vd_register_cuda(nullptr, 4096, 64, &region, &region), -9);
  } else {
    EXPECT_EQ(vd_stream_write_value32(nullptr, 4098, 1), -3);
    EXPECT_THAT(LastError(), HasSubstr("must be a multiple of 4"));
    EXPECT_EQ(vd_register_cuda(nullptr, 4096, 64, &region, &region), -3);
    EXPECT_EQ(LastError(), "vd_register_cuda: client is NULL");
  }
}

TEST_F(CApiTest, RegistrationOwnershipAndRelease) {
  ShmFile file(1 << 16);
  vd_client* a = Connect("scheduler-a");
  vd_client* b = Connect("scheduler-b");
  uint64_t region = 0;
  ASSERT_EQ(vd_register_file(a, file.path().c_str(), file.bytes(), 0, &region), 0) << LastError();
  EXPECT_NE(region, 0u);
  EXPECT_EQ(vd_release_memory(b, region, nullptr), -7);  // PERMISSION_DENIED
  EXPECT_THAT(LastError(), HasSubstr("belongs to another client"));
  EXPECT_EQ(vd_register_file(a, file.path().c_str(), file.bytes() * 2, 0, &region), -3);
  uint64_t bytes = 0;
  EXPECT_EQ(vd_release_memory(a, region, &bytes), 0) << LastError();
  EXPECT_EQ(bytes, file.bytes());
  EXPECT_EQ(vd_release_memory(a, region, nullptr), -5);  // NOT_FOUND
  vd_disconnect(a);
  vd_disconnect(b);
}

TEST_F(CApiTest, RefusedDescriptorsCompleteWithNanAndDone) {
  // Layout: q [2, H, 576] | tree_kv [2, 576] | out [2, H, 512] | lse [2, H] | flags.
  ShmFile file(1 << 20);
  vd_client* c = Connect(nullptr);
  uint64_t region = 0;
  ASSERT_EQ(vd_register_file(c, file.path().c_str(), file.bytes(), 0, &region), 0) << LastError();
  const uint64_t q = 0, kv = 8192, out = 16384, lse = 32768, ready = 65536, done = 65600;
  std::memset(file.data() + out, 0x3f, 2 * kHeads * 512 * 2);
  vd_channel* ch = nullptr;
  ASSERT_EQ(vd_channel_open(c, 4, &ch), 0) << LastError();
  EXPECT_EQ(vd_channel_entries(ch), 4u);
  const int32_t parents[] = {-1, 0};
  vd_sequence s{};
  s.sequence_id = 424242;  // never appended
  s.parents = parents;
  s.num_parents = 2;
  vd_verify_desc d{};
  d.id = 77;
  d.layer = 1;
  d.num_sequences = 1;
  d.sequences = &s;
  d.q = {region, q};
  d.tree_kv = {region, kv};
  d.out = {region, out};
  d.lse = {region, lse};
  d.return_lse = 1;
  d.ready = {region, ready, 3, 0};
  d.done = {region, done, 3, 0};
  file.word(ready).store(3);
  ASSERT_EQ(vd_enqueue_verify(ch, &d), 0) << LastError();
  const int32_t path[] = {0};
  ASSERT_EQ(vd_enqueue_commit(ch, 78, 424242, path, 1), 0) << LastError();
  EXPECT_EQ(vd_channel_in_flight(ch), 2u);
  // Both complete; a poll of capacity 1 keeps the second for the next call.
  vd_completion first{};
  ASSERT_EQ(vd_wait_completion(ch, 10.0, &first), 0) << LastError();
  EXPECT_EQ(first.id, 77u);
  EXPECT_EQ(first.code, 5);  // NOT_FOUND, the gRPC Verify's code for an unknown sequence
  EXPECT_THAT(first.message, HasSubstr("424242"));
  EXPECT_EQ(file.word(done).load(), 3u);
  const uint16_t* out_bits = reinterpret_cast<const uint16_t*>(file.data() + out);
  for (int i = 0; i < 2 * kHeads * 512; ++i) {
    ASSERT_EQ(out_bits[i] & 0x7f80, 0x7f80) << i;  // NaN (exponent all ones, mantissa set)
    ASSERT_NE(out_bits[i] & 0x7f, 0) << i;
  }
  const float* lse_values = reinterpret_cast<const float*>(file.data() + lse);
  for (int i = 0; i < 2 * kHeads; ++i) ASSERT_TRUE(std::isnan(lse_values[i])) << i;
  vd_completion polled[1];
  int n = 0;
  for (int tries = 0; tries < 1000 && n == 0; ++tries) {
    n = vd_poll_completions(ch, polled, 1);
    if (n == 0) usleep(10000);
  }
  ASSERT_EQ(n, 1) << LastError();
  EXPECT_EQ(polled[0].id, 78u);
  EXPECT_EQ(polled[0].code, 5);
  EXPECT_EQ(vd_channel_in_flight(ch), 0u);
  EXPECT_EQ(vd_wait_completion(ch, 0.01, &first), -9);  // nothing in flight
  // A NULL array with a count is named.
  d.sequences = nullptr;
  EXPECT_EQ(vd_enqueue_verify(ch, &d), -3);
  EXPECT_THAT(LastError(), HasSubstr("sequences is NULL with num_sequences = 1"));
  EXPECT_EQ(vd_channel_close(ch), 0) << LastError();
  EXPECT_EQ(vd_release_memory(c, region, nullptr), 0) << LastError();
  vd_disconnect(c);
}

}  // namespace
