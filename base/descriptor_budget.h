// DescriptorBudget: whether the process may open more descriptors and still keep `reserve` of its
// limit free for the work that must not fail for want of one (accepting a new connection,
// answering health, the metrics exporter, a shared-memory map). Every resource a client can make
// the daemon hold a descriptor for (connections, channels, regions) asks it first.
//
// It counts without scanning /proc/self/fd per question (issue 33 N6: with 8,000 connections
// waiting, the scan at every accept made a new process's health wait 20 s): the count of the last
// scan plus what was opened since (closes since are not subtracted, so it errs on the full side),
// and a question it would refuse scans again first, at most once per `rescan`. Thread-safe;
// header-only (the service's acceptor and the executor's channel table share one).
#pragma once

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace verifyd {

// Descriptors the process holds now (one scan of /proc/self/fd), and its soft limit.
inline int64_t OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int64_t count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own descriptor
}

inline int64_t DescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<int64_t>(limit.rlim_cur);
}

// What stays free: the daemon's own work (gRPC makes wake-up descriptors per thread, a scrape
// takes one, a region maps through one for a moment).
inline int64_t DescriptorReserveFor(int64_t limit) {
  return std::clamp<int64_t>(limit / 8, 16, 256);
}

class DescriptorBudget {
 public:
  explicit DescriptorBudget(int64_t limit = DescriptorLimit(),
                            std::chrono::milliseconds rescan = std::chrono::milliseconds(20))
      : limit_(limit), reserve_(DescriptorReserveFor(limit)), rescan_(rescan) {
    Scan(std::chrono::steady_clock::now());
  }

  // True when `more` descriptors not counted yet (about to be opened, or just opened) leave
  // `reserve` free. `opened`, when >= 0, is one of them the caller just got: the lowest free
  // number, so every descriptor below it is open too.
  bool HasRoom(int64_t more, int opened = -1) {
    if (opened >= 0 && limit_ - (int64_t{opened} + 1) < reserve_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (limit_ - (counted_ + since_) - more >= reserve_) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - scanned_at_ < rescan_) return false;
    Scan(now);
    return limit_ - (counted_ + since_) - more >= reserve_;
  }
  // After opening `n` descriptors that stay open (a connection, a channel's lock).
  void Opened(int64_t n = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    since_ += n;
  }

  int64_t limit() const { return limit_; }
  int64_t reserve() const { return reserve_; }
  // Scans of /proc/self/fd so far (the constructor's included).
  int64_t scans() const {
    std::lock_guard<std::mutex> lock(mu_);
    return scans_;
  }
  // The count as of the last scan plus what was opened since (for messages).
  int64_t counted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counted_ + since_;
  }

 private:
  void Scan(std::chrono::steady_clock::time_point now) {
    counted_ = OpenDescriptors();
    since_ = 0;
    ++scans_;
    scanned_at_ = now;
  }

  const int64_t limit_;
  const int64_t reserve_;
  const std::chrono::milliseconds rescan_;
  mutable std::mutex mu_;
  int64_t counted_ = 0;
  int64_t since_ = 0;
  int64_t scans_ = 0;
  std::chrono::steady_clock::time_point scanned_at_;
};

}  // namespace verifyd
