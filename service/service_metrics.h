// Every metric of plans/0003-service-metrics.md, registered once; the service records through
// this class only, the executor through its ExecutorMetrics interface, which this class implements.
// Thread-safe (prometheus-cpp metrics are atomic; family lookups lock).
#pragma once

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "executor/executor_metrics.h"
#include "kvstore/kv_store.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace verifyd {

class ServiceMetrics final : public ExecutorMetrics {
 public:
  ServiceMetrics();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // Once the backend is known (cpu|cuda): verifyd_build_info{version,backend} = 1.
  void SetBuildInfo(const std::string& version, const std::string& backend);
  // Once the backend is known: verifyd_device_info{device, gpu_uuid} = 1, the key of the join
  // with DCGM's series (plans/0003-service-metrics.md). gpu_uuid "" on the cpu backend.
  void SetDeviceInfo(int device, const std::string& gpu_uuid);
  void SetReady(bool ready);
  void SetMpsActive(bool active);
  // One finished RPC: code is the upper-case gRPC code name.
  void RecordRpc(const std::string& method, const char* code, absl::Duration total);
  void RecordQueue(const std::string& method, absl::Duration waited);

  // ExecutorMetrics.
  void RecordKernel(KernelKind kernel, absl::Duration took) override;
  void RecordVerifyBatch(int sequences) override;
  void RecordTreeNodes(int nodes) override;
  void RecordStore(const StoreStats& stats) override;
  void RecordCompactionChunk(int64_t bytes, absl::Duration took) override;
  void RecordCompactionFinished(bool done) override;
  void RecordLeaseExpiries(int64_t count) override;
  // The data plane (plans/0017): registered regions, their bytes, open channels; descriptors
  // completed by result.
  void RecordDataPlane(int regions, uint64_t bytes, int channels) override;
  void RecordChannelDescriptor(bool ok) override;
  // The executor's events go to the log (service/event_log.h).
  void OnLeaseExpired(uint64_t sequence) override;
  void OnChannelOpened(uint64_t channel, const std::string& owner, int entries) override;
  void OnChannelClosed(uint64_t channel, const std::string& owner, const std::string& why) override;
  void OnCompactionFinished(const CompactionOperation& op) override;
  void RecordGraphCapture() override { graph_captures_.Increment(); }
  void RecordGraphReplay() override { graph_replays_.Increment(); }
  void RecordGraphFallback() override { graph_fallbacks_.Increment(); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Family<prometheus::Gauge>& device_info_;
  prometheus::Gauge& ready_;
  prometheus::Gauge& mps_active_;
  prometheus::Family<prometheus::Counter>& rpc_requests_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Family<prometheus::Histogram>& queue_duration_;
  prometheus::Family<prometheus::Histogram>& kernel_duration_;
  prometheus::Histogram& batch_sequences_;
  prometheus::Histogram& tree_nodes_;
  prometheus::Gauge& capacity_tokens_;
  prometheus::Family<prometheus::Gauge>& row_bytes_;
  prometheus::Gauge& pool_bytes_;
  prometheus::Gauge& used_tokens_;
  prometheus::Gauge& pending_tokens_;
  prometheus::Gauge& sequences_;
  prometheus::Gauge& fragment_runs_;
  prometheus::Gauge& fragmented_ratio_;
  prometheus::Gauge& shared_tokens_;
  prometheus::Gauge& shared_references_;
  prometheus::Counter& compaction_bytes_;
  prometheus::Counter& compaction_seconds_;
  prometheus::Family<prometheus::Counter>& compaction_operations_;
  prometheus::Counter& graph_captures_;
  prometheus::Counter& graph_replays_;
  prometheus::Counter& graph_fallbacks_;
  prometheus::Counter& lease_expiries_;
  prometheus::Gauge& external_regions_;
  prometheus::Gauge& external_region_bytes_;
  prometheus::Gauge& channels_;
  prometheus::Family<prometheus::Counter>& channel_descriptors_;
};

}  // namespace verifyd
