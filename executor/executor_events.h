// What the executor tells an operator, one event at a time (the service writes each as one line
// of the daemon's log: service/event_log.h). Every method does nothing unless overridden, so a
// tool or a test that drives the executor's parts hears nothing.
#pragma once

#include <cstdint>
#include <string>

namespace verifyd {

struct CompactionOperation;

class ExecutorEvents {
 public:
  virtual ~ExecutorEvents() = default;
  // The lease released `sequence` (no call named it for the lease's length).
  virtual void OnLeaseExpired(uint64_t /*sequence*/) {}
  virtual void OnChannelOpened(uint64_t /*channel*/, const std::string& /*owner*/,
                               int /*entries*/) {}
  // `why`: the client closed it, its lease ran out, the daemon stops.
  virtual void OnChannelClosed(uint64_t /*channel*/, const std::string& /*owner*/,
                               const std::string& /*why*/) {}
  // A compaction ended: done (its note says why it stopped) or failed (its error).
  virtual void OnCompactionFinished(const CompactionOperation& /*op*/) {}
};

}  // namespace verifyd
