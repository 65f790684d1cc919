// ExecutorMetrics: what the executor reports while it works (kernel times, batch shapes, store
// occupancy, compaction, lease expiries, CUDA graph events, the data plane's regions and
// channels). The executor owns the interface; the service implements it with Prometheus
// (service/service_metrics.h), tests with a recording fake.
// Implementations are called from the executor thread and from gRPC threads that run a task
// inline, so they must be thread-safe. The same sink carries the events an operator reads in the
// log (ExecutorEvents: no-ops unless overridden), so they reach the service the same way.
#pragma once

#include <cstdint>

#include "absl/time/time.h"
#include "executor/executor_events.h"
#include "kvstore/kv_store.h"

namespace verifyd {

// What one timed executor step did (the `kernel` label of verifyd_kernel_duration_seconds).
enum class KernelKind { kVerify, kAppend, kCompact };

class ExecutorMetrics : public ExecutorEvents {
 public:
  virtual void RecordKernel(KernelKind kernel, absl::Duration took) = 0;
  // Sequences in one Verify, and tree nodes (Q) of each of them.
  virtual void RecordVerifyBatch(int sequences) = 0;
  virtual void RecordTreeNodes(int nodes) = 0;
  // Occupancy and fragmentation, at every Stats and every executor tick.
  virtual void RecordStore(const StoreStats& stats) = 0;
  // One compaction chunk copied (bytes 0: the final wait for copies in flight).
  virtual void RecordCompactionChunk(int64_t bytes, absl::Duration took) = 0;
  virtual void RecordCompactionFinished(bool done) = 0;
  virtual void RecordLeaseExpiries(int64_t count) = 0;
  virtual void RecordGraphCapture() = 0;
  virtual void RecordGraphReplay() = 0;
  virtual void RecordGraphFallback() = 0;
  // The data plane (plans/0017), at every executor tick: registered external regions, their
  // bytes, open channels. And each channel descriptor completed, by result.
  virtual void RecordDataPlane(int regions, uint64_t bytes, int channels) = 0;
  virtual void RecordChannelDescriptor(bool ok) = 0;
};

// Records nothing: for tools that drive the executor's parts without a daemon around them.
class NoExecutorMetrics final : public ExecutorMetrics {
 public:
  void RecordKernel(KernelKind, absl::Duration) override {}
  void RecordVerifyBatch(int) override {}
  void RecordTreeNodes(int) override {}
  void RecordStore(const StoreStats&) override {}
  void RecordCompactionChunk(int64_t, absl::Duration) override {}
  void RecordCompactionFinished(bool) override {}
  void RecordLeaseExpiries(int64_t) override {}
  void RecordGraphCapture() override {}
  void RecordGraphReplay() override {}
  void RecordGraphFallback() override {}
  void RecordDataPlane(int, uint64_t, int) override {}
  void RecordChannelDescriptor(bool) override {}
};

}  // namespace verifyd
