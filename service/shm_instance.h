// ShmInstance: this daemon's share of /dev/shm (issue 33 N10). Every file the daemon creates there
// (tensor regions, channel rings) is named "verifyd-<device>-<instance>-..." where <instance> is 16
// random hex digits of this run, and while the daemon lives it holds an exclusive flock(2) on its
// lock file "verifyd-<device>-<instance>.lock" there. A daemon killed without its shutdown
// (SIGKILL, OOM, a crash) leaves its files behind; a crash loop used to fill tmpfs, up to
// --shm-max-bytes and the rings' bytes per incarnation. At start the next daemon of the device
// removes every file of an instance whose lock nobody holds (or that has no lock file), and that
// lock. Several live daemons on one device (tests, two sockets) never touch each other's files:
// each holds its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace verifyd {

class ShmInstance {
 public:
  // Takes this run's lock, then sweeps what dead daemons of `device` left in `directory`.
  static absl::StatusOr<std::unique_ptr<ShmInstance>> Create(int device,
                                                             std::string directory = "/dev/shm");
  ~ShmInstance();  // releases and removes the lock file
  ShmInstance(const ShmInstance&) = delete;
  ShmInstance& operator=(const ShmInstance&) = delete;

  // "verifyd-<device>-<instance>-": what every name this daemon gives a file starts with.
  const std::string& prefix() const { return prefix_; }
  // Files (and locks) of dead daemons removed at start, and their bytes.
  int64_t swept_files() const { return swept_files_; }
  int64_t swept_bytes() const { return swept_bytes_; }

 private:
  ShmInstance(std::string directory, std::string prefix, std::string lock_path, int lock_fd)
      : directory_(std::move(directory)),
        prefix_(std::move(prefix)),
        lock_path_(std::move(lock_path)),
        lock_fd_(lock_fd) {}
  void Sweep(const std::string& device_prefix);

  const std::string directory_;
  const std::string prefix_;
  const std::string lock_path_;
  const int lock_fd_;
  int64_t swept_files_ = 0;
  int64_t swept_bytes_ = 0;
};

}  // namespace verifyd
