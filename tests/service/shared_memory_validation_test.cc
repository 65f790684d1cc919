// Validation of shared-memory tensors against a real registry: every rule of plans/0010 with its
// code and message, the destinations and pins of an accepted call. No server, no store.
#include <cstring>
#include <functional>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/request_validation.h"
#include "service/shared_memory_registry.h"
#include "tests/service/shadow_model.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::ShadowModel;
using testing::VerifyPart;

constexpr int kLayers = 3;
constexpr int kHeads = 4;
constexpr int kTotalQ = 7;  // 4 + 3 nodes below
constexpr uint64_t kQBytes = kTotalQ * kHeads * kKvDim * 2;
constexpr uint64_t kTreeBytes = kTotalQ * kKvDim * 2;
constexpr uint64_t kOutBytes = kTotalQ * kHeads * kVDim * 2;
constexpr uint64_t kLseBytes = kTotalQ * kHeads * 4;
// Layout of the valid request: q | tree_kv | out | lse, each at a multiple of 64.
constexpr uint64_t kTreeOffset = 32256;  // kQBytes rounded up to 64
constexpr uint64_t kOutOffset = kTreeOffset + 8064;
constexpr uint64_t kLseOffset = kOutOffset + kOutBytes;
constexpr uint64_t kRegionBytes = 131072;
static_assert(kTreeOffset >= kQBytes && kTreeOffset % 64 == 0 && kOutOffset % 64 == 0 &&
              kLseOffset % 64 == 0 && kLseOffset + kLseBytes <= kRegionBytes);

ValidationLimits Limits(int64_t max_message_bytes = int64_t{1} << 20) {
  return ValidationLimits{kLayers, kHeads, 16, 0.125f, max_message_bytes};
}

v1::SharedMemoryRef Ref(const std::string& region, uint64_t offset, uint64_t length) {
  v1::SharedMemoryRef ref;
  ref.set_region(region);
  ref.set_offset(offset);
  ref.set_length(length);
  return ref;
}

class SharedMemoryValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto info = registry_.Create(kRegionBytes);
    ASSERT_TRUE(info.ok()) << info.status();
    region_ = info->region;
    auto other = registry_.Create(kRegionBytes);
    ASSERT_TRUE(other.ok()) << other.status();
    other_ = other->region;
    mapping_ = *registry_.Find(region_, "setup");
  }

  // A valid Verify whose q and tree_kv are random bytes in the region, outputs after them.
  v1::VerifyRequest ValidVerify() {
    v1::VerifyRequest r = model_.MakeVerify(
        1, {VerifyPart{11, {-1, 0, 0, 1}, std::nullopt}, VerifyPart{12, {-1, 0, 1}, std::nullopt}},
        true);
    std::memcpy(mapping_->data(), r.q().inline_data().data(), kQBytes);
    std::memcpy(mapping_->data() + kTreeOffset, r.tree_kv().inline_data().data(), kTreeBytes);
    *r.mutable_q()->mutable_shared_memory() = Ref(region_, 0, kQBytes);
    *r.mutable_tree_kv()->mutable_shared_memory() = Ref(region_, kTreeOffset, kTreeBytes);
    *r.mutable_out_shared_memory() = Ref(region_, kOutOffset, kOutBytes);
    *r.mutable_lse_shared_memory() = Ref(region_, kLseOffset, kLseBytes);
    return r;
  }

  SharedMemoryLimits RegistryLimits() {
    SharedMemoryLimits l;
    l.name_prefix = "verifyd-validation-test-";
    return l;
  }

  ShadowModel model_{kLayers, kHeads, 0.125f, 17};
  SharedMemoryRegistry registry_{RegistryLimits()};
  std::string region_, other_;
  std::shared_ptr<MappedSharedMemory> mapping_;
};

TEST_F(SharedMemoryValidationTest, AcceptedCallPointsIntoTheRegionAndPinsIt) {
  const v1::VerifyRequest request = ValidVerify();
  RegionPins pins;
  auto call = ValidateVerify(request, Limits(), &registry_, &pins);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(call->q), mapping_->data());
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(call->tree_kv), mapping_->data() + kTreeOffset);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(call->out_destination), mapping_->data() + kOutOffset);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(call->lse_destination), mapping_->data() + kLseOffset);
  ASSERT_EQ(pins.size(), 4u);
  for (const auto& pin : pins) EXPECT_EQ(pin.get(), mapping_.get());
  // The pins keep the mapping after the region is released.
  ASSERT_TRUE(registry_.Release(region_).ok());
  mapping_.reset();
  std::memset(pins[0]->data(), 0x3c, kRegionBytes);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(call->q)[kRegionBytes - 1], 0x3c);

  // Append's kv in a new region.
  v1::AppendRequest append = model_.MakeAppend(5, 3, 1, 2);
  const std::string kv_bytes = append.kv().inline_data();
  auto info = registry_.Create(kRegionBytes);
  ASSERT_TRUE(info.ok());
  auto fresh = *registry_.Find(info->region, "test");
  std::memcpy(fresh->data() + 128, kv_bytes.data(), kv_bytes.size());
  *append.mutable_kv()->mutable_shared_memory() = Ref(info->region, 128, kv_bytes.size());
  RegionPins append_pins;
  auto appended = ValidateAppend(append, Limits(), &registry_, &append_pins);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(appended->kv), fresh->data() + 128);
  EXPECT_EQ(std::memcmp(appended->kv, kv_bytes.data(), kv_bytes.size()), 0);
  EXPECT_EQ(append_pins.size(), 1u);
}

TEST_F(SharedMemoryValidationTest, OutputsInSharedMemoryDoNotCountAgainstTheMessageLimit) {
  // Inline, out [7, 4, 512] bf16 + lse + 4 KiB framing is ~33 KB: over a 20 KB limit.
  v1::VerifyRequest request = ValidVerify();
  const ValidationLimits small = Limits(20000);
  EXPECT_TRUE(ValidateVerify(request, small, &registry_, nullptr).ok());
  request.clear_out_shared_memory();
  auto refused = ValidateVerify(request, small, &registry_, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(SharedMemoryValidationTest, EveryRuleHasItsCodeAndNamesTheField) {
  using R = v1::VerifyRequest;
  struct Case {
    std::string name;
    std::function<void(R&)> mutate;
    absl::StatusCode code;
    std::string message;
  };
  const auto inv = absl::StatusCode::kInvalidArgument;
  const std::vector<Case> cases = {
      {"q unknown region", [](R& r) { r.mutable_q()->mutable_shared_memory()->set_region("nope"); },
       absl::StatusCode::kNotFound,
       "q.shared_memory.region = 'nope' is not a live shared-memory region"},
      {"q empty region", [](R& r) { r.mutable_q()->mutable_shared_memory()->set_region(""); },
       absl::StatusCode::kNotFound, "q.shared_memory.region = ''"},
      {"q offset misaligned", [](R& r) { r.mutable_q()->mutable_shared_memory()->set_offset(32); },
       inv, "q.shared_memory.offset = 32 must be a multiple of 64"},
      {"q past the region",
       [](R& r) { r.mutable_q()->mutable_shared_memory()->set_offset(kRegionBytes - 64); }, inv,
       "q.shared_memory.offset = 131008 + q.shared_memory.length = 32256 must be <= the 131072 "
       "bytes of region"},
      {"q offset past the region",
       [](R& r) { r.mutable_q()->mutable_shared_memory()->set_offset(kRegionBytes + 64); }, inv,
       "q.shared_memory.offset = 131136"},
      {"q length overflowing",
       [](R& r) { r.mutable_q()->mutable_shared_memory()->set_length(~uint64_t{0}); }, inv,
       "must be <= the 131072 bytes"},
      {"q length", [](R& r) { r.mutable_q()->mutable_shared_memory()->set_length(100); }, inv,
       "q.shared_memory.length = 100 must equal 32256 (shape [7, 4, 576] bf16)"},
      {"tree_kv length",
       [](R& r) { r.mutable_tree_kv()->mutable_shared_memory()->set_length(8064 + 64); }, inv,
       "tree_kv.shared_memory.length = 8128 must equal 8064 (shape [7, 576] bf16)"},
      {"tree_kv unknown",
       [](R& r) { r.mutable_tree_kv()->mutable_shared_memory()->set_region("gone"); },
       absl::StatusCode::kNotFound, "tree_kv.shared_memory.region = 'gone'"},
      {"out unknown", [](R& r) { r.mutable_out_shared_memory()->set_region("gone"); },
       absl::StatusCode::kNotFound, "out_shared_memory.region = 'gone'"},
      {"out misaligned", [](R& r) { r.mutable_out_shared_memory()->set_offset(kOutOffset + 2); },
       inv, "out_shared_memory.offset = 40322 must be a multiple of 64"},
      {"out length", [](R& r) { r.mutable_out_shared_memory()->set_length(kOutBytes - 2); }, inv,
       "out_shared_memory.length = 28670 must equal 28672 (shape [7, 4, 512] bf16)"},
      {"lse length", [](R& r) { r.mutable_lse_shared_memory()->set_length(4); }, inv,
       "lse_shared_memory.length = 4 must equal 112 (shape [7, 4] fp32)"},
      {"lse without return_lse", [](R& r) { r.set_return_lse(false); }, inv,
       "lse_shared_memory is set but return_lse is false"},
      {"out overlaps q", [](R& r) { r.mutable_out_shared_memory()->set_offset(0); }, inv,
       "out_shared_memory [0, 28672) overlaps q.shared_memory [0, 32256)"},
      {"out overlaps tree_kv",
       [](R& r) { r.mutable_out_shared_memory()->set_offset(kTreeOffset + 64); }, inv,
       "out_shared_memory [32320, 60992) overlaps tree_kv.shared_memory [32256, 40320)"},
      {"lse overlaps out", [](R& r) { r.mutable_lse_shared_memory()->set_offset(kLseOffset - 64); },
       inv, "out_shared_memory [40320, 68992) overlaps lse_shared_memory [68928, 69040)"},
      {"lse overlaps q", [](R& r) { r.mutable_lse_shared_memory()->set_offset(64); }, inv,
       "lse_shared_memory [64, 176) overlaps q.shared_memory [0, 32256)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    R request = ValidVerify();
    c.mutate(request);
    RegionPins pins;
    auto result = ValidateVerify(request, Limits(), &registry_, &pins);
    ASSERT_FALSE(result.ok()) << "accepted";
    EXPECT_EQ(result.status().code(), c.code) << result.status();
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(c.message));
  }
  // The same ranges in different regions do not overlap.
  R request = ValidVerify();
  *request.mutable_out_shared_memory() = Ref(other_, 0, kOutBytes);
  *request.mutable_lse_shared_memory() = Ref(other_, kOutBytes, kLseBytes);
  EXPECT_TRUE(ValidateVerify(request, Limits(), &registry_, nullptr).ok());

  v1::AppendRequest append = model_.MakeAppend(5, 3, 1, 2);
  *append.mutable_kv()->mutable_shared_memory() = Ref(region_, 0, 100);
  auto appended = ValidateAppend(append, Limits(), &registry_, nullptr);
  EXPECT_EQ(appended.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(appended.status().message(),
              HasSubstr("kv.shared_memory.length = 100 must equal 6912 (shape [2, 3, 576] bf16)"));
}

}  // namespace
}  // namespace verifyd
