// systemd's service protocol (Type=notify; libsystemd's sd_notify): READY=1 once the daemon
// serves, STOPPING=1 when the drain begins, and WATCHDOG=1 every third of WatchdogSec= while the
// device thread still runs a task handed to it (a wedged device thread stops the pings and systemd
// restarts the daemon). Outside systemd ($NOTIFY_SOCKET unset) every call does nothing.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace verifyd {

class SystemdNotifier {
 public:
  // `alive(timeout)`: OK when the daemon proved alive within `timeout` (VerifydServer::Probe).
  explicit SystemdNotifier(std::function<absl::Status(absl::Duration)> alive);
  ~SystemdNotifier();  // ends the watchdog thread
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // READY=1 with a STATUS= line; starts the watchdog when systemd asked for one.
  void Ready(const std::string& status);
  // STOPPING=1. The watchdog keeps pinging without probing: the drain is bounded by
  // --drain-seconds and the unit's TimeoutStopSec, and the device refuses new work while draining.
  void Stopping();

 private:
  void Watchdog(absl::Duration period);

  std::function<absl::Status(absl::Duration)> alive_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace verifyd
