// Device: one GPU's (or the CPU backend's) state and the executor thread that owns it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "executor/compaction_manager.h"
#include "executor/device_executor.h"
#include "executor/device_operations.h"
#include "executor/device_options.h"
#include "executor/executor_metrics.h"
#include "executor/external_regions.h"

namespace verifyd {

class ChannelTable;

// DeviceOptions::executor_spin_us resolved: `requested` when >= 0, else 2000 µs when the process
// may run on >= 8 CPUs (its affinity mask: a container's cpuset, not the host's core count), 0 on
// fewer.
int64_t ExecutorSpinMicros(int64_t requested);

class Device {
 public:
  // Builds the backend's storage and the store, and starts the executor.
  static absl::StatusOr<std::unique_ptr<Device>> Create(const DeviceOptions& options,
                                                        std::unique_ptr<ComputeBackend> backend,
                                                        ExecutorMetrics* metrics);
  ~Device();

  // Runs `task` on the executor thread; see DeviceExecutor::Submit for refusals.
  absl::Status Submit(std::function<void(DeviceOperations&)> task);
  // Runs `task` on the executor thread before every waiting task (DeviceExecutor::SubmitFirst).
  absl::Status SubmitFirst(std::function<void(DeviceOperations&)> task);
  // Queues a Compact operation and returns its id at once.
  std::string StartCompaction(int64_t budget_bytes);
  std::optional<CompactionOperation> GetCompaction(const std::string& id) const;
  // Closes every channel (their published descriptors complete ABORTED), finishes every queued
  // task, abandons unfinished compactions, stops the thread, drops the external regions.
  void Drain();

  // Requests waiting for the executor thread now.
  int queued() const { return executor_->queued(); }

  // The data plane (plans/0017): memory clients registered, and their channels.
  ExternalRegionTable& external_regions() { return *external_regions_; }
  ChannelTable& channels() { return *channels_; }

  const char* backend_name() const { return ops_->backend().name(); }
  bool mps_active() const { return ops_->backend().mps_active(); }
  // The pool's slots (DeviceOptions::capacity_slots); fixed.
  int64_t capacity_slots() const { return capacity_slots_; }

 private:
  Device(const DeviceOptions& options, std::unique_ptr<DeviceOperations> ops,
         ExecutorMetrics* metrics);

  std::unique_ptr<DeviceOperations> ops_;
  int64_t capacity_slots_ = 0;
  CompactionManager compactions_;
  std::unique_ptr<DeviceExecutor> executor_;
  std::unique_ptr<ExternalRegionTable> external_regions_;
  std::unique_ptr<ChannelTable> channels_;
};

}  // namespace verifyd
