#include "executor/device.h"

#include <sched.h>

#include <algorithm>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "executor/channel_table.h"

namespace verifyd {

int64_t ExecutorSpinMicros(int64_t requested) {
  if (requested >= 0) return requested;
  // A busy core is cheap on a GPU host and fatal to a 2-core CI machine running its tests. The
  // affinity mask counts the CPUs this process may use (a pod's cpuset), which the host's core
  // count (hardware_concurrency) does not.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int usable = sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                         ? CPU_COUNT(&cpus)
                         : static_cast<int>(std::thread::hardware_concurrency());
  return usable >= 8 ? 2000 : 0;
}

absl::StatusOr<std::unique_ptr<Device>> Device::Create(const DeviceOptions& options,
                                                       std::unique_ptr<ComputeBackend> backend,
                                                       ExecutorMetrics* metrics) {
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOperations> ops,
                           DeviceOperations::Create(options, std::move(backend), metrics));
  return std::unique_ptr<Device>(new Device(options, std::move(ops), metrics));
}

Device::Device(const DeviceOptions& options, std::unique_ptr<DeviceOperations> ops,
               ExecutorMetrics* metrics)
    : ops_(std::move(ops)),
      compactions_(options.compaction_history,
                   options.compaction_chunk_bytes > 0
                       ? options.compaction_chunk_bytes
                       : CompactionManager::ChunkBytesFor(ops_->backend().name()),
                   metrics) {
  capacity_slots_ = ops_->store().allocator().capacity();
  ExecutorHooks hooks;
  hooks.background_step = [this] { return compactions_.Step(ops_->store()); };
  hooks.tick = [this, metrics] {
    ops_->ExpireLeases();
    ops_->RefreshGauges();
    metrics->RecordDataPlane(external_regions_->regions(), external_regions_->total_bytes(),
                             channels_->channels());
  };
  // Expiry lags a lease by at most a quarter of it; gauges refresh at least 4 times a second.
  hooks.tick_period =
      std::clamp(options.store.lease / 4, absl::Milliseconds(20), absl::Milliseconds(250));
  hooks.max_queued = options.max_queued_requests;
  hooks.spin = absl::Microseconds(ExecutorSpinMicros(options.executor_spin_us));
  ExternalRegionLimits region_limits;
  region_limits.device = options.device;
  region_limits.lease = options.store.lease;
  region_limits.max_regions = options.max_external_regions;
  region_limits.descriptors = options.descriptors;
  external_regions_ =
      std::make_unique<ExternalRegionTable>(&ops_->mutable_backend(), region_limits);
  ChannelTableOptions channel_options;
  channel_options.limits = options.request_limits;
  channel_options.lease = options.store.lease;
  channel_options.max_channels = options.max_channels;
  channel_options.max_ring_bytes = options.max_channel_bytes;
  channel_options.descriptors = options.descriptors;
  // A channel thread polls as long as the executor does after its last piece of work (2 ms on
  // hosts with >= 8 cores, plans/0012), at least 50 µs: a scheduler's next layer usually comes
  // within that, and a futex wake-up costs tens of µs on a VM.
  channel_options.spin =
      absl::Microseconds(std::max<int64_t>(50, ExecutorSpinMicros(options.executor_spin_us)));
  channel_options.name_prefix =
      absl::StrCat(options.shm_name_prefix.empty() ? absl::StrCat("verifyd-", options.device, "-")
                                                   : options.shm_name_prefix,
                   "channel-");
  channel_options.on_completion = [metrics](bool ok) { metrics->RecordChannelDescriptor(ok); };
  channel_options.events = metrics;
  // Off the executor (a channel's close): the backend's own thread-safety covers it (plans/0018).
  channel_options.release_wait = [ops = ops_.get()](const ExternalFlag& ready) {
    (void)ops->mutable_backend().ReleaseExternalWait(ready);
  };
  if (ops_->backend().waits_for_ready_on_host()) {
    // On the channel's own thread: a flag that never comes holds that channel, not the executor.
    channel_options.wait_ready = [ops = ops_.get()](const ExternalFlag& ready,
                                                    const std::atomic<bool>* cancelled) {
      return ops->backend().WaitReadyOnHost(ready, cancelled);
    };
  }
  channels_ = std::make_unique<ChannelTable>(channel_options, this, external_regions_.get());
  // Started last: its tick reads the tables.
  executor_ = std::make_unique<DeviceExecutor>(std::move(hooks));
  executor_->Start();
}

Device::~Device() { Drain(); }

absl::Status Device::Submit(std::function<void(DeviceOperations&)> task) {
  return executor_->Submit([this, task = std::move(task)] { task(*ops_); });
}

absl::Status Device::SubmitFirst(std::function<void(DeviceOperations&)> task) {
  return executor_->SubmitFirst([this, task = std::move(task)] { task(*ops_); });
}

std::string Device::StartCompaction(int64_t budget_bytes) {
  std::string id = compactions_.Create(budget_bytes);
  executor_->NotifyBackgroundWork();
  return id;
}

std::optional<CompactionOperation> Device::GetCompaction(const std::string& id) const {
  return compactions_.Get(id);
}

void Device::Drain() {
  if (channels_ != nullptr) channels_->CloseAll(absl::StatusCode::kUnavailable);
  executor_->Drain();
  if (external_regions_ != nullptr) external_regions_->ReleaseAll();
  compactions_.AbandonAll("verifyd shut down before the operation finished");
}

}  // namespace verifyd
