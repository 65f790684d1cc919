// The flags become each layer's options here (service/service_options.h): the pool's capacity from
// --kv-capacity-tokens or a fraction of the backend's memory, and every DeviceOptions field from
// its flag.
#include "service/service_options.h"

#include <algorithm>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "executor/device_operations.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/request_validation.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

// A CPU backend that reports a chosen amount of memory (or cannot tell).
class MemoryReportingBackend : public CpuBackend {
 public:
  explicit MemoryReportingBackend(absl::StatusOr<int64_t> memory)
      : CpuBackend(1), memory_(std::move(memory)) {}
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override { return memory_; }

 private:
  absl::StatusOr<int64_t> memory_;
};

TEST(PoolCapacity, FromTokensOrFromAFractionOfTheBackendsMemory) {
  ServiceOptions options;
  options.layers = 61;
  options.kv_capacity_tokens = 777;
  const int64_t slot_bytes = 61 * kKvRowBytes;  // 70272 B
  const MemoryReportingBackend h200(int64_t{141} << 30);
  EXPECT_EQ(*PoolCapacitySlots(options, h200), 777) << "fraction 0: the token flag";
  options.kv_memory_fraction = 0.9;
  EXPECT_EQ(*PoolCapacitySlots(options, h200),
            static_cast<int64_t>(0.9 * static_cast<double>(int64_t{141} << 30) / slot_bytes));
  // A tiny fraction of a small memory holds no slot: the flag and the sizes are named.
  const MemoryReportingBackend small(100000);
  options.kv_memory_fraction = 0.5;
  const absl::Status none = PoolCapacitySlots(options, small).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.message()),
              HasSubstr("--kv-memory-fraction = 0.5 of 100000 bytes holds no slot of 61 layers"));
  // Slots are int32: a pool of more slots than that is cut to 2^31 - 1.
  options.layers = 1;
  const MemoryReportingBackend huge(int64_t{1} << 50);
  EXPECT_EQ(*PoolCapacitySlots(options, huge), (int64_t{1} << 31) - 1);
  // A backend that cannot tell refuses the flag rather than guessing.
  const MemoryReportingBackend unknown(absl::UnimplementedError("cannot tell"));
  EXPECT_EQ(PoolCapacitySlots(options, unknown).status().code(), absl::StatusCode::kUnimplemented);
}

// The real CPU backend sizes the store from the host's physical memory.
TEST(PoolCapacity, TheStoreGetsTheResolvedCapacity) {
  ServiceOptions options;
  options.layers = 2;
  options.heads = 1;
  options.kv_memory_fraction = 1e-6;
  NoExecutorMetrics metrics;
  CpuBackend reference(1);
  const absl::StatusOr<int64_t> memory = reference.AvailableMemoryBytes();
  ASSERT_TRUE(memory.ok()) << memory.status();
  const int64_t expected =
      static_cast<int64_t>(1e-6 * static_cast<double>(*memory) / (2 * kKvRowBytes));
  ASSERT_GE(expected, 1);
  auto backend = std::make_unique<CpuBackend>(1);
  const absl::StatusOr<DeviceOptions> device = BuildDeviceOptions(options, *backend);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(device->capacity_slots, expected);
  auto ops = DeviceOperations::Create(*device, std::move(backend), &metrics);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ((*ops)->store().allocator().capacity(), expected);
}

// Every DeviceOptions field comes from its flag (random values, so a swapped pair shows), and the
// store names the requests' fields.
TEST(DeviceOptionsFromFlags, EveryFieldFromItsFlag) {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    ServiceOptions options;
    options.layers = 1 + static_cast<int>(rng() % 100);
    options.max_tree_nodes = 1 + static_cast<int>(rng() % kMaxTreeNodes);
    options.kv_capacity_tokens = 1 + static_cast<int64_t>(rng() % 100000);
    options.lease_seconds = 0.5 + static_cast<double>(rng() % 1000);
    options.max_queued_requests = 1 + static_cast<int>(rng() % 5000);
    options.executor_spin_us = static_cast<int64_t>(rng() % 3000) - 1;
    options.compaction_chunk_bytes = static_cast<int64_t>(rng() % (int64_t{1} << 30));
    options.compaction_history = 1 + static_cast<int>(rng() % 500);
    options.device = static_cast<int>(rng() % 1024);
    options.heads = 1 + static_cast<int>(rng() % 1024);
    options.softmax_scale = 0.01f + static_cast<float>(rng() % 1000) / 1000.f;
    options.max_message_bytes = (int64_t{64} << 10) + static_cast<int64_t>(rng() % (1 << 30));
    options.max_sequences = 1 + static_cast<int64_t>(rng() % 100000);
    options.max_slot_table_entries =
        round % 2 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % (int64_t{1} << 30));
    const absl::StatusOr<DeviceOptions> device = BuildDeviceOptions(options, CpuBackend(1));
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(device->store.num_layers, options.layers);
    EXPECT_EQ(device->store.max_tree_nodes, options.max_tree_nodes);
    EXPECT_EQ(device->store.lease, absl::Seconds(options.lease_seconds));
    EXPECT_EQ(device->capacity_slots, options.kv_capacity_tokens);
    EXPECT_EQ(device->max_queued_requests, options.max_queued_requests);
    EXPECT_EQ(device->store.max_sequences, options.max_sequences);
    // 0: 16 holders per pool slot on average, at least 2^20 entries.
    EXPECT_EQ(device->store.max_slot_table_entries,
              options.max_slot_table_entries > 0
                  ? options.max_slot_table_entries
                  : std::max<int64_t>(16 * options.kv_capacity_tokens, int64_t{1} << 20));
    EXPECT_EQ(device->store.field_names.max_sequences, "--max-sequences");
    EXPECT_EQ(device->store.field_names.max_slot_table_entries, "--max-slot-table-entries");
    EXPECT_EQ(device->executor_spin_us, options.executor_spin_us);
    EXPECT_EQ(device->compaction_chunk_bytes, options.compaction_chunk_bytes);
    EXPECT_EQ(device->compaction_history, options.compaction_history);
    // The data plane's: a registration's device, a channel descriptor's bounds (the gRPC path's).
    EXPECT_EQ(device->device, options.device);
    EXPECT_EQ(device->request_limits.layers, options.layers);
    EXPECT_EQ(device->request_limits.heads, options.heads);
    EXPECT_EQ(device->request_limits.max_tree_nodes, options.max_tree_nodes);
    EXPECT_EQ(device->request_limits.default_scale, options.softmax_scale);
    EXPECT_EQ(device->request_limits.max_message_bytes, options.max_message_bytes);
    EXPECT_EQ(device->store.field_names.sequence, RequestFieldNames().sequence);
    EXPECT_EQ(device->store.field_names.items, "sequences");
    EXPECT_EQ(device->store.field_names.item_sequence, "sequence_id");
    EXPECT_EQ(device->store.field_names.item_commit, "commit_previous");
    EXPECT_EQ(device->store.field_names.num_tokens, "kv.shape[1]");
  }
}

}  // namespace
}  // namespace verifyd
