#include "service/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <chrono>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "service/event_log.h"

namespace verifyd {

SystemdNotifier::SystemdNotifier(std::function<absl::Status(absl::Duration)> alive)
    : alive_(std::move(alive)) {}

SystemdNotifier::~SystemdNotifier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SystemdNotifier::Ready(const std::string& status) {
  sd_notify(0, absl::StrCat("READY=1\nSTATUS=", status).c_str());
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    const absl::Duration period = absl::Microseconds(static_cast<int64_t>(usec)) / 3;
    thread_ = std::thread([this, period] { Watchdog(period); });
  }
}

void SystemdNotifier::Stopping() {
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
}

void SystemdNotifier::Watchdog(absl::Duration period) {
  bool reported = false;
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, absl::ToChronoNanoseconds(period), [&] { return done_; })) return;
      stopping = stopping_;
    }
    // The probe waits at most one period, so a ping is never later than two periods (of three).
    const absl::Status alive = stopping ? absl::OkStatus() : alive_(period);
    if (alive.ok()) {
      sd_notify(0, "WATCHDOG=1");
      reported = false;
    } else if (!reported) {
      event_log::Warning("watchdog_not_pinged",
                         absl::StrCat("reason=", event_log::Quote(alive.message())));
      reported = true;
    }
  }
}

}  // namespace verifyd
