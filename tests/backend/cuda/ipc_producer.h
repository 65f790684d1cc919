// The test side of tests/backend/cuda/ipc_producer_main.cu: starts the producer as a real second
// process (fork + exec), reads its IPC handle, and drives its steps over pipes with a timeout, so
// that a test whose stream order is broken fails instead of hanging.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace verifyd::test {

struct ProducerLayer {
  size_t q_off = 0, q_bytes = 0, kv_off = 0, kv_bytes = 0, out_off = 0, out_bytes = 0;
  size_t ready_off = 0, done_off = 0;
  uint32_t value = 0;
};

class IpcProducer {
 public:
  // Starts `binary <bytes>` and reads its handle (64 raw bytes).
  static absl::StatusOr<std::unique_ptr<IpcProducer>> Start(const std::string& binary,
                                                            size_t bytes);
  // Sends quit, waits for the process (kills it when it does not end).
  ~IpcProducer();

  const std::string& handle() const { return handle_; }
  // Sends a step (the producer enqueues it at once and answers when its stream is done).
  absl::Status SendStep(const std::string& in_path, const std::string& out_path, uint64_t delay_us,
                        const std::vector<ProducerLayer>& layers);
  // Waits up to `timeout` for the step's answer; DEADLINE_EXCEEDED when none came.
  absl::Status AwaitStep(std::chrono::milliseconds timeout);

 private:
  IpcProducer() = default;
  absl::StatusOr<std::string> ReadLine(std::chrono::milliseconds timeout);
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string buffered_;
  std::string handle_;
};

}  // namespace verifyd::test
