// ServiceMetrics implements the executor's ExecutorMetrics: each call lands in its Prometheus
// series (random counts, so a call recorded twice, or in another series, shows).
#include "service/service_metrics.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ServiceMetrics, EveryExecutorCallReachesItsSeries) {
  std::mt19937 rng(5);
  const auto count = [&rng] { return 1 + static_cast<int>(rng() % 20); };
  ServiceMetrics service;
  ExecutorMetrics& metrics = service;
  const int captures = count(), replays = count(), fallbacks = count();
  for (int i = 0; i < captures; ++i) metrics.RecordGraphCapture();
  for (int i = 0; i < replays; ++i) metrics.RecordGraphReplay();
  for (int i = 0; i < fallbacks; ++i) metrics.RecordGraphFallback();
  const int expiries = count();
  metrics.RecordLeaseExpiries(expiries);
  const int done = count(), failed = count();
  for (int i = 0; i < done; ++i) metrics.RecordCompactionFinished(true);
  for (int i = 0; i < failed; ++i) metrics.RecordCompactionFinished(false);
  const int64_t chunk_bytes = count() * 1152;
  metrics.RecordCompactionChunk(chunk_bytes, absl::Milliseconds(3));
  const int verifies = count(), appends = count();
  for (int i = 0; i < verifies; ++i) {
    metrics.RecordKernel(KernelKind::kVerify, absl::Microseconds(40));
  }
  for (int i = 0; i < appends; ++i) {
    metrics.RecordKernel(KernelKind::kAppend, absl::Microseconds(9));
  }
  const int batch = count(), nodes = count();
  metrics.RecordVerifyBatch(batch);
  metrics.RecordTreeNodes(nodes);
  StoreStats stats;
  stats.capacity_slots = count() * 1000;
  stats.used_slots = count();
  stats.pending_slots = count();
  stats.fragmentation.sequences = count();
  stats.fragmentation.runs = count();
  metrics.RecordStore(stats);
  const int regions = count(), channels = count();
  const uint64_t region_bytes = uint64_t{4096} * count();
  metrics.RecordDataPlane(regions, region_bytes, channels);
  const int descriptors_ok = count(), descriptors_failed = count();
  for (int i = 0; i < descriptors_ok; ++i) metrics.RecordChannelDescriptor(true);
  for (int i = 0; i < descriptors_failed; ++i) metrics.RecordChannelDescriptor(false);

  const std::string text = prometheus::TextSerializer().Serialize(service.registry()->Collect());
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_cuda_graph_captures_total ", captures, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_cuda_graph_replays_total ", replays, "\n")));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("verifyd_cuda_graph_fallbacks_total ", fallbacks, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_lease_expiries_total ", expiries, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_compaction_operations_total{result=\"done\"} ",
                                           done, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "verifyd_compaction_operations_total{result=\"failed\"} ", failed, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_compaction_bytes_total ", chunk_bytes, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "verifyd_kernel_duration_seconds_count{kernel=\"verify\"} ", verifies)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "verifyd_kernel_duration_seconds_count{kernel=\"append\"} ", appends)));
  EXPECT_THAT(text, HasSubstr("verifyd_kernel_duration_seconds_count{kernel=\"compact\"} 0"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_verify_batch_sequences_sum ", batch)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_verify_tree_nodes_sum ", nodes)));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("verifyd_kv_capacity_tokens ", stats.capacity_slots, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_kv_used_tokens ", stats.used_slots, "\n")));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("verifyd_kv_pending_tokens ", stats.pending_slots, "\n")));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("verifyd_sequences ", stats.fragmentation.sequences, "\n")));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("verifyd_kv_fragment_runs ", stats.fragmentation.runs, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_external_regions ", regions, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_external_region_bytes ", region_bytes, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_channels ", channels, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_channel_descriptors_total{result=\"ok\"} ",
                                           descriptors_ok, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_channel_descriptors_total{result=\"failed\"} ",
                                           descriptors_failed, "\n")));
}

// The DCGM join key: one series, gpu_uuid verbatim (the cpu backend's "" included) and the
// device index, set once the backend is known.
TEST(ServiceMetrics, DeviceInfoCarriesTheGpuUuid) {
  ServiceMetrics service;
  const std::string before = prometheus::TextSerializer().Serialize(service.registry()->Collect());
  EXPECT_THAT(before, Not(HasSubstr("verifyd_device_info{")));
  service.SetDeviceInfo(3, "GPU-6d6b1b03-2e4c-1e5f-8a0e-9b8f4d5c607a");
  const std::string text = prometheus::TextSerializer().Serialize(service.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("# TYPE verifyd_device_info gauge"));
  EXPECT_THAT(text, HasSubstr("verifyd_device_info{device=\"3\","
                              "gpu_uuid=\"GPU-6d6b1b03-2e4c-1e5f-8a0e-9b8f4d5c607a\"} 1"));
  ServiceMetrics cpu;
  cpu.SetDeviceInfo(0, "");
  EXPECT_THAT(prometheus::TextSerializer().Serialize(cpu.registry()->Collect()),
              HasSubstr("verifyd_device_info{device=\"0\",gpu_uuid=\"\"} 1"));
}

}  // namespace
}  // namespace verifyd
