#include "backend/cuda/host_copy_pool.h"

#include <algorithm>
#include <cstring>

namespace verifyd {

HostCopyPool::HostCopyPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

HostCopyPool::~HostCopyPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void HostCopyPool::RunChunks(const Job& job) {
  // An emptied job (a worker that woke after its copy was over) must not touch the counters: they
  // may already belong to the next copy.
  if (job.chunks == 0) return;
  const size_t per_chunk = (job.bytes + job.chunks - 1) / job.chunks;
  for (int c; (c = next_chunk_.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) {
    const size_t begin = static_cast<size_t>(c) * per_chunk;
    const size_t end = std::min(job.bytes, begin + per_chunk);
    if (begin < end) std::memcpy(job.dst + begin, job.src + begin, end - begin);
    chunks_done_.fetch_add(1, std::memory_order_release);
  }
}

void HostCopyPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      // Counted under the lock, so the caller cannot return while this worker may still copy.
      workers_in_job_.fetch_add(1, std::memory_order_relaxed);
    }
    RunChunks(job);
    workers_in_job_.fetch_sub(1, std::memory_order_release);
  }
}

void HostCopyPool::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (workers_.empty() || bytes < kParallelBytes) {
    std::memcpy(dst, src, bytes);
    return;
  }
  Job job;
  job.dst = static_cast<uint8_t*>(dst);
  job.src = static_cast<const uint8_t*>(src);
  job.bytes = bytes;
  // Chunks of at least 64 KB, a few per thread so that a late-waking worker costs little.
  job.chunks = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(threads()) * 4, (bytes + 65535) / 65536));
  {
    std::lock_guard<std::mutex> lock(mu_);
    next_chunk_.store(0, std::memory_order_relaxed);
    chunks_done_.store(0, std::memory_order_relaxed);
    job_ = job;
    ++generation_;
  }
  wake_.notify_all();
  RunChunks(job);
  // Workers that woke for this job finish their chunk; one that takes it after the last chunk
  // was claimed finds none. Both conditions, then emptying the job, in one critical section: no
  // worker can join the job afterwards, so none touches the buffers after the return.
  for (;;) {
    if (chunks_done_.load(std::memory_order_acquire) == job.chunks) {
      std::lock_guard<std::mutex> lock(mu_);
      if (workers_in_job_.load(std::memory_order_acquire) == 0) {
        job_ = Job{};
        return;
      }
    }
    std::this_thread::yield();
  }
}

}  // namespace verifyd
