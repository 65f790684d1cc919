// DeviceExecutor: the one thread that owns a device's state. Handlers enqueue tasks and return;
// tasks run in order. Between tasks (and when idle) the executor runs one step of background work
// (compaction chunks), so background work never holds the queue for longer than one step, and a
// periodic tick (lease expiry, gauges).
#pragma once

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
  // Wakes the thread so it looks for background work.
  void NotifyBackgroundWork();
  // Runs every queued task, then stops the thread. Background work left is abandoned.
  void Drain();

 private:
  void Loop();

  ExecutorHooks hooks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool draining_ = false;
  bool background_pending_ = false;
  std::thread thread_;
};

}  // namespace verifyd
