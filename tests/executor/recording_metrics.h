// ExecutorMetrics that remembers what it was told, for tests of what the executor reports.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include "executor/executor_metrics.h"

namespace verifyd::testing {

class RecordingMetrics final : public ExecutorMetrics {
 public:
  void RecordKernel(KernelKind kernel, absl::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++kernels_[kernel];
  }
  void RecordVerifyBatch(int sequences) override {
    ++verify_batches;
    batch_sequences += sequences;
  }
  void RecordTreeNodes(int nodes) override { tree_nodes += nodes; }
  void RecordStore(const StoreStats& stats) override {
    std::lock_guard<std::mutex> lock(mu_);
    last_store_ = stats;
    ++store_records;
  }
  void RecordCompactionChunk(int64_t bytes, absl::Duration) override {
    ++compaction_chunks;
    compaction_bytes += bytes;
  }
  void RecordCompactionFinished(bool done) override {
    ++(done ? compactions_done : compactions_failed);
  }
  void RecordLeaseExpiries(int64_t count) override { lease_expiries += count; }
  void RecordGraphCapture() override { ++graph_captures; }
  void RecordGraphReplay() override { ++graph_replays; }
  void RecordGraphFallback() override { ++graph_fallbacks; }
  void RecordDataPlane(int regions, uint64_t bytes, int channels) override {
    data_plane_regions = regions;
    data_plane_bytes = bytes;
    data_plane_channels = channels;
  }
  void RecordChannelDescriptor(bool ok) override {
    ++(ok ? channel_descriptors_ok : channel_descriptors_failed);
  }

  int64_t kernels(KernelKind kernel) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kernels_.find(kernel);
    return it == kernels_.end() ? 0 : it->second;
  }
  StoreStats last_store() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_store_;
  }

  std::atomic<int64_t> verify_batches{0}, batch_sequences{0}, tree_nodes{0}, store_records{0};
  std::atomic<int64_t> compaction_chunks{0}, compaction_bytes{0};
  std::atomic<int64_t> compactions_done{0}, compactions_failed{0}, lease_expiries{0};
  std::atomic<int64_t> graph_captures{0}, graph_replays{0}, graph_fallbacks{0};
  // The latest RecordDataPlane, and the descriptors completed.
  std::atomic<int64_t> data_plane_regions{0}, data_plane_channels{0};
  std::atomic<uint64_t> data_plane_bytes{0};
  std::atomic<int64_t> channel_descriptors_ok{0}, channel_descriptors_failed{0};

 private:
  mutable std::mutex mu_;
  std::map<KernelKind, int64_t> kernels_;
  StoreStats last_store_;
};

}  // namespace verifyd::testing
