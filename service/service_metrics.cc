#include "service/service_metrics.h"

#include "service/event_log.h"

namespace verifyd {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// plans/0003-service-metrics.md: latency buckets fit for microseconds, in seconds.
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const Histogram::BucketBoundaries kBuckets = {
      10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3,
      10e-3, 20e-3, 50e-3, 100e-3, 200e-3, 500e-3, 1.0,  2.0,  5.0};
  return kBuckets;
}

const Histogram::BucketBoundaries& CountBuckets() {
  static const Histogram::BucketBoundaries kBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  return kBuckets;
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

const char* KernelLabel(KernelKind kernel) {
  switch (kernel) {
    case KernelKind::kVerify:
      return "verify";
    case KernelKind::kAppend:
      return "append";
    case KernelKind::kCompact:
      return "compact";
  }
  return "verify";
}

}  // namespace

ServiceMetrics::ServiceMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      build_info_(BuildGauge()
                      .Name("verifyd_build_info")
                      .Help("Build and backend of this daemon (always 1).")
                      .Register(*registry_)),
      device_info_(BuildGauge()
                       .Name("verifyd_device_info")
                       .Help("The device this daemon serves (always 1): gpu_uuid joins with "
                             "DCGM's UUID label.")
                       .Register(*registry_)),
      ready_(BuildGauge()
                 .Name("verifyd_ready")
                 .Help("1 while health is SERVING.")
                 .Register(*registry_)
                 .Add({})),
      mps_active_(BuildGauge()
                      .Name("verifyd_mps_active")
                      .Help("1 when the daemon's GPU work runs as an MPS client (plans/0018).")
                      .Register(*registry_)
                      .Add({})),
      rpc_requests_(BuildCounter()
                        .Name("verifyd_rpc_requests_total")
                        .Help("Finished RPCs by method and gRPC status code.")
                        .Register(*registry_)),
      rpc_duration_(BuildHistogram()
                        .Name("verifyd_rpc_duration_seconds")
                        .Help("RPC time from handler entry to completion.")
                        .Register(*registry_)),
      queue_duration_(BuildHistogram()
                          .Name("verifyd_queue_duration_seconds")
                          .Help("Time a request waited for the device executor.")
                          .Register(*registry_)),
      kernel_duration_(BuildHistogram()
                           .Name("verifyd_kernel_duration_seconds")
                           .Help("Compute time of one executor step.")
                           .Register(*registry_)),
      batch_sequences_(BuildHistogram()
                           .Name("verifyd_verify_batch_sequences")
                           .Help("Sequences per Verify.")
                           .Register(*registry_)
                           .Add({}, CountBuckets())),
      tree_nodes_(BuildHistogram()
                      .Name("verifyd_verify_tree_nodes")
                      .Help("Tree nodes (Q) per sequence per Verify.")
                      .Register(*registry_)
                      .Add({}, CountBuckets())),
      capacity_tokens_(BuildGauge()
                           .Name("verifyd_kv_capacity_tokens")
                           .Help("KV pool capacity in slots.")
                           .Register(*registry_)
                           .Add({})),
      row_bytes_(BuildGauge()
                     .Name("verifyd_kv_bytes_per_token")
                     .Help("Bytes of one token's KV row on one layer, labelled by the pool's "
                           "dtype (--kv_dtype): 1152 bf16, 656 fp8.")
                     .Register(*registry_)),
      pool_bytes_(BuildGauge()
                      .Name("verifyd_kv_pool_bytes")
                      .Help("Bytes of the KV pool: capacity tokens x layers x bytes per token.")
                      .Register(*registry_)
                      .Add({})),
      used_tokens_(BuildGauge()
                       .Name("verifyd_kv_used_tokens")
                       .Help("KV slots in use (committed + pending).")
                       .Register(*registry_)
                       .Add({})),
      pending_tokens_(BuildGauge()
                          .Name("verifyd_kv_pending_tokens")
                          .Help("KV slots held by pending trees.")
                          .Register(*registry_)
                          .Add({})),
      sequences_(BuildGauge()
                     .Name("verifyd_sequences")
                     .Help("Live sequences.")
                     .Register(*registry_)
                     .Add({})),
      fragment_runs_(BuildGauge()
                         .Name("verifyd_kv_fragment_runs")
                         .Help("Maximal runs of consecutive slots, summed over sequences.")
                         .Register(*registry_)
                         .Add({})),
      fragmented_ratio_(BuildGauge()
                            .Name("verifyd_kv_fragmented_ratio")
                            .Help("Share of committed tokens outside their sequence's first run.")
                            .Register(*registry_)
                            .Add({})),
      shared_tokens_(BuildGauge()
                         .Name("verifyd_kv_shared_tokens")
                         .Help("Committed KV slots held by two or more sequences (Fork).")
                         .Register(*registry_)
                         .Add({})),
      shared_references_(BuildGauge()
                             .Name("verifyd_kv_shared_references")
                             .Help("References to shared slots (sum of their holder counts).")
                             .Register(*registry_)
                             .Add({})),
      compaction_bytes_(BuildCounter()
                            .Name("verifyd_compaction_bytes_total")
                            .Help("Bytes copied by compaction.")
                            .Register(*registry_)
                            .Add({})),
      compaction_seconds_(BuildCounter()
                              .Name("verifyd_compaction_seconds_total")
                              .Help("Time spent copying for compaction.")
                              .Register(*registry_)
                              .Add({})),
      compaction_operations_(BuildCounter()
                                 .Name("verifyd_compaction_operations_total")
                                 .Help("Finished Compact operations by result.")
                                 .Register(*registry_)),
      graph_captures_(BuildCounter()
                          .Name("verifyd_cuda_graph_captures_total")
                          .Help("CUDA graph captures (0 on cpu).")
                          .Register(*registry_)
                          .Add({})),
      graph_replays_(BuildCounter()
                         .Name("verifyd_cuda_graph_replays_total")
                         .Help("CUDA graph replays (0 on cpu).")
                         .Register(*registry_)
                         .Add({})),
      graph_fallbacks_(BuildCounter()
                           .Name("verifyd_cuda_graph_fallbacks_total")
                           .Help("Eager executions where a graph was wanted.")
                           .Register(*registry_)
                           .Add({})),
      lease_expiries_(BuildCounter()
                          .Name("verifyd_lease_expiries_total")
                          .Help("Sequences released by lease expiry.")
                          .Register(*registry_)
                          .Add({})),
      external_regions_(BuildGauge()
                            .Name("verifyd_external_regions")
                            .Help("Memory regions clients registered (the data plane).")
                            .Register(*registry_)
                            .Add({})),
      external_region_bytes_(BuildGauge()
                                 .Name("verifyd_external_region_bytes")
                                 .Help("Bytes of the registered external regions.")
                                 .Register(*registry_)
                                 .Add({})),
      channels_(BuildGauge()
                    .Name("verifyd_channels")
                    .Help("Open data-plane channels.")
                    .Register(*registry_)
                    .Add({})),
      channel_descriptors_(BuildCounter()
                               .Name("verifyd_channel_descriptors_total")
                               .Help("Channel descriptors completed, by result.")
                               .Register(*registry_)) {
  channel_descriptors_.Add({{"result", "ok"}});
  channel_descriptors_.Add({{"result", "failed"}});
  // Both results exist from the start so that rate() sees the first operation.
  compaction_operations_.Add({{"result", "done"}});
  compaction_operations_.Add({{"result", "failed"}});
  for (KernelKind k : {KernelKind::kVerify, KernelKind::kAppend, KernelKind::kCompact}) {
    kernel_duration_.Add({{"kernel", KernelLabel(k)}}, LatencyBuckets());
  }
}

void ServiceMetrics::SetBuildInfo(const std::string& version, const std::string& backend) {
  build_info_.Add({{"version", version}, {"backend", backend}}).Set(1);
}

void ServiceMetrics::SetDeviceInfo(int device, const std::string& gpu_uuid) {
  device_info_.Add({{"device", std::to_string(device)}, {"gpu_uuid", gpu_uuid}}).Set(1);
}

void ServiceMetrics::SetReady(bool ready) { ready_.Set(ready ? 1 : 0); }

void ServiceMetrics::SetMpsActive(bool active) { mps_active_.Set(active ? 1 : 0); }

void ServiceMetrics::RecordRpc(const std::string& method, const char* code, absl::Duration total) {
  rpc_requests_.Add({{"method", method}, {"code", code}}).Increment();
  rpc_duration_.Add({{"method", method}}, LatencyBuckets()).Observe(Seconds(total));
}

void ServiceMetrics::RecordQueue(const std::string& method, absl::Duration waited) {
  queue_duration_.Add({{"method", method}}, LatencyBuckets()).Observe(Seconds(waited));
}

void ServiceMetrics::RecordKernel(KernelKind kernel, absl::Duration took) {
  kernel_duration_.Add({{"kernel", KernelLabel(kernel)}}, LatencyBuckets()).Observe(Seconds(took));
}

void ServiceMetrics::RecordVerifyBatch(int sequences) { batch_sequences_.Observe(sequences); }

void ServiceMetrics::RecordTreeNodes(int nodes) { tree_nodes_.Observe(nodes); }

void ServiceMetrics::RecordStore(const StoreStats& stats) {
  capacity_tokens_.Set(static_cast<double>(stats.capacity_slots));
  row_bytes_.Add({{"dtype", KvDtypeName(stats.kv_dtype)}})
      .Set(static_cast<double>(stats.row_bytes));
  pool_bytes_.Set(static_cast<double>(stats.pool_bytes));
  used_tokens_.Set(static_cast<double>(stats.used_slots));
  pending_tokens_.Set(static_cast<double>(stats.pending_slots));
  sequences_.Set(static_cast<double>(stats.fragmentation.sequences));
  fragment_runs_.Set(static_cast<double>(stats.fragmentation.runs));
  fragmented_ratio_.Set(stats.fragmentation.fragmented_ratio());
  shared_tokens_.Set(static_cast<double>(stats.shared_slots));
  shared_references_.Set(static_cast<double>(stats.shared_references));
}

void ServiceMetrics::RecordCompactionChunk(int64_t bytes, absl::Duration took) {
  compaction_bytes_.Increment(static_cast<double>(bytes));
  compaction_seconds_.Increment(Seconds(took));
}

void ServiceMetrics::RecordCompactionFinished(bool done) {
  compaction_operations_.Add({{"result", done ? "done" : "failed"}}).Increment();
}

void ServiceMetrics::RecordDataPlane(int regions, uint64_t bytes, int channels) {
  external_regions_.Set(regions);
  external_region_bytes_.Set(static_cast<double>(bytes));
  channels_.Set(channels);
}

void ServiceMetrics::RecordChannelDescriptor(bool ok) {
  channel_descriptors_.Add({{"result", ok ? "ok" : "failed"}}).Increment();
}

void ServiceMetrics::RecordLeaseExpiries(int64_t count) {
  lease_expiries_.Increment(static_cast<double>(count));
}

void ServiceMetrics::OnLeaseExpired(uint64_t sequence) { event_log::LeaseExpired(sequence); }

void ServiceMetrics::OnChannelOpened(uint64_t channel, const std::string& owner, int entries) {
  event_log::ChannelOpened(channel, owner, entries);
}

void ServiceMetrics::OnChannelClosed(uint64_t channel, const std::string& owner,
                                     const std::string& why) {
  event_log::ChannelClosed(channel, owner, why);
}

void ServiceMetrics::OnCompactionFinished(const CompactionOperation& op) {
  event_log::CompactionFinished(op);
}

}  // namespace verifyd
