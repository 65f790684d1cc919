#include "executor/device_executor.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace verifyd {

DeviceExecutor::DeviceExecutor(ExecutorHooks hooks) : hooks_(std::move(hooks)) {}

DeviceExecutor::~DeviceExecutor() { Drain(); }

void DeviceExecutor::Start() {
  thread_ = std::thread([this] { Loop(); });
}

absl::Status DeviceExecutor::Submit(std::function<void()> task) {
  return Enqueue(std::move(task), /*first=*/false);
}

absl::Status DeviceExecutor::SubmitFirst(std::function<void()> task) {
  return Enqueue(std::move(task), /*first=*/true);
}

absl::Status DeviceExecutor::Enqueue(std::function<void()> task, bool first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return absl::UnavailableError("verifyd is shutting down");
    if (static_cast<int>(queue_.size()) >= hooks_.max_queued) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the device queue holds ", queue_.size(),
                       " requests, the most --max-queued-requests allows; retry later"));
    }
    if (first) {
      queue_.push_front(std::move(task));
    } else {
      queue_.push_back(std::move(task));
    }
    queued_.store(static_cast<int>(queue_.size()), std::memory_order_release);
  }
  cv_.notify_one();
  return absl::OkStatus();
}

void DeviceExecutor::NotifyBackgroundWork() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    background_pending_ = true;
    background_hint_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

void DeviceExecutor::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    draining_hint_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void DeviceExecutor::SpinForWork() const {
  if (hooks_.spin <= absl::ZeroDuration()) return;
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(hooks_.spin);
  // Background work or a drain ends the spin as a task does: a compaction must not wait out the
  // window between its chunks.
  while (queued_.load(std::memory_order_acquire) == 0 &&
         !background_hint_.load(std::memory_order_acquire) &&
         !draining_hint_.load(std::memory_order_acquire) &&
         std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

void DeviceExecutor::Loop() {
  absl::Time next_tick = absl::Now() + hooks_.tick_period;
  for (;;) {
    SpinForWork();
    std::function<void()> task;
    bool run_background = false;
    bool run_tick = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait_for = std::chrono::nanoseconds(
          absl::ToInt64Nanoseconds(std::max(next_tick - absl::Now(), absl::ZeroDuration())));
      cv_.wait_for(lock, wait_for,
                   [&] { return !queue_.empty() || draining_ || background_pending_; });
      if (!queue_.empty()) {
        task = std::move(queue_.front());
        queue_.pop_front();
        queued_.store(static_cast<int>(queue_.size()), std::memory_order_relaxed);
      } else if (draining_) {
        break;
      }
      run_background = background_pending_;
      background_pending_ = false;
      background_hint_.store(false, std::memory_order_relaxed);
      run_tick = absl::Now() >= next_tick;
      if (!task && !run_background && !run_tick) continue;
    }
    if (task) task();
    // One background step after each task keeps compaction moving under steady traffic.
    bool more = false;
    if (run_background) more = hooks_.background_step();
    if (run_tick || absl::Now() >= next_tick) {
      hooks_.tick();
      next_tick = absl::Now() + hooks_.tick_period;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (more) {
      background_pending_ = true;
      background_hint_.store(true, std::memory_order_release);
    }
  }
  hooks_.tick();
}

}  // namespace verifyd
