// Large host-to-host copies on several threads: the CUDA backend's q into pinned staging and its
// outputs back out. One thread copies ~10 GB/s; at S5 (B=32 H=8 Q=8) those two copies are 4.4 MB
// per call, ~400 us on one thread, most of the backend's overhead around an 80 us kernel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace verifyd {

class HostCopyPool {
 public:
  // threads: copying threads including the caller's; <= 1 copies on the caller alone.
  explicit HostCopyPool(int threads);
  ~HostCopyPool();
  HostCopyPool(const HostCopyPool&) = delete;
  HostCopyPool& operator=(const HostCopyPool&) = delete;

  // memcpy(dst, src, bytes), split over the threads when large; returns when every byte is
  // copied and no worker touches either buffer any more. One caller at a time.
  void Copy(void* dst, const void* src, size_t bytes);

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Below this a copy stays on the caller: waking a thread costs more than it saves.
  static constexpr size_t kParallelBytes = size_t{256} << 10;

 private:
  struct Job {
    uint8_t* dst = nullptr;
    const uint8_t* src = nullptr;
    size_t bytes = 0;
    int chunks = 0;
  };
  void WorkerLoop();
  void RunChunks(const Job& job);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  Job job_;                  // guarded by mu_ (workers take a copy)
  std::atomic<int> next_chunk_{0};
  std::atomic<int> chunks_done_{0};
  std::atomic<int> workers_in_job_{0};
};

}  // namespace verifyd
