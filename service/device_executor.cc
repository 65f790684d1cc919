#include "service/device_executor.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace verifyd {

DeviceExecutor::DeviceExecutor(ExecutorHooks hooks) : hooks_(std::move(hooks)) {}

DeviceExecutor::~DeviceExecutor() { Drain(); }

void DeviceExecutor::Start() {
  thread_ = std::thread([this] { Loop(); });
}

absl::Status DeviceExecutor::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return absl::UnavailableError("verifyd is shutting down");
    if (static_cast<int>(queue_.size()) >= hooks_.max_queued) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the device queue holds ", queue_.size(),
                       " requests, the most --max-queued-requests allows; retry later"));
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return absl::OkStatus();
}

void DeviceExecutor::NotifyBackgroundWork() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    background_pending_ = true;
  }
  cv_.notify_one();
}

void DeviceExecutor::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void DeviceExecutor::Loop() {
  absl::Time next_tick = absl::Now() + hooks_.tick_period;
  for (;;) {
    std::function<void()> task;
    bool run_background = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait_for = std::chrono::nanoseconds(
          absl::ToInt64Nanoseconds(std::max(next_tick - absl::Now(), absl::ZeroDuration())));
      cv_.wait_for(lock, wait_for,
                   [&] { return !queue_.empty() || draining_ || background_pending_; });
      if (!queue_.empty()) {
        task = std::move(queue_.front());
        queue_.pop_front();
      } else if (draining_) {
        break;
      }
      run_background = background_pending_;
      background_pending_ = false;
    }
    if (task) task();
    // One background step after each task keeps compaction moving under steady traffic.
    if (run_background) {
      const bool more = hooks_.background_step();
      if (more) {
        std::lock_guard<std::mutex> lock(mu_);
        background_pending_ = true;
      }
    }
    if (absl::Now() >= next_tick) {
      hooks_.tick();
      next_tick = absl::Now() + hooks_.tick_period;
    }
  }
  hooks_.tick();
}

}  // namespace verifyd
