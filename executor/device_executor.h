// DeviceExecutor: serializes all work on a device's state. Handlers enqueue tasks and return;
// tasks run in order on the executor thread. Between tasks (and when idle) it runs one step of
// background work (compaction chunks), so background work never holds the queue for longer than
// one step, and a periodic tick (lease expiry, gauges). At most one piece of work (task,
// background step, tick) runs at any time, always on the executor thread (running idle requests
// on the caller's thread was measured slower on the H200 and removed: plans/0015).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace verifyd {

struct ExecutorHooks {
  // Runs one bounded step; returns true when more background work is waiting.
  std::function<bool()> background_step = [] { return false; };
  // Called every `tick_period` (and once at the end of the drain).
  std::function<void()> tick = [] {};
  absl::Duration tick_period = absl::Seconds(1);
  // Tasks waiting beyond this are refused: each holds a request of up to --max-message-bytes.
  int max_queued = 1024;
  // After each piece of work the thread polls for the next task this long before it sleeps on
  // the condition variable: a task queued within the window starts without a thread wake-up
  // (~20 µs on the H200's VM, plans/0012), at the price of a busy core while traffic flows.
  absl::Duration spin = absl::ZeroDuration();
};

class DeviceExecutor {
 public:
  explicit DeviceExecutor(ExecutorHooks hooks);
  ~DeviceExecutor();  // Drains.
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  void Start();
  // Queues `task`. UNAVAILABLE once draining has begun, RESOURCE_EXHAUSTED when max_queued tasks
  // are waiting; the task is dropped then.
  absl::Status Submit(std::function<void()> task);
  // Queues `task` ahead of every waiting task (refusals as Submit's): it runs right after the
  // piece of work in progress. For reads that must answer while the queue is long (Stats, a
  // liveness signal), never for anything whose order against other requests matters.
  absl::Status SubmitFirst(std::function<void()> task);
  // Wakes the thread so it looks for background work.
  void NotifyBackgroundWork();
  // Tasks waiting now (not the one running).
  int queued() const { return queued_.load(std::memory_order_relaxed); }
  // Runs every queued task, then stops the thread. Background work left is abandoned.
  void Drain();

 private:
  absl::Status Enqueue(std::function<void()> task, bool first);
  void Loop();
  // Polls until a task is queued, background work is pending, a drain begins, or `spin` has
  // passed since now.
  void SpinForWork() const;

  ExecutorHooks hooks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  // queue_.size(), readable without the lock (the spin polls it); written under mu_.
  std::atomic<int> queued_{0};
  // background_pending_ and draining_, readable without the lock (the spin polls them).
  std::atomic<bool> background_hint_{false};
  std::atomic<bool> draining_hint_{false};
  bool draining_ = false;
  bool background_pending_ = false;
  std::thread thread_;
};

}  // namespace verifyd
