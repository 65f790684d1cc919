#include "client/group_client.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace verifyd {

// One long-lived thread per rank: starting threads per call would add tens of microseconds to
// every step of a latency-bound decode loop.
class RankWorkers {
 public:
  explicit RankWorkers(int ranks) : queues_(ranks) {
    threads_.reserve(ranks);
    for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~RankWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Runs job(r) on worker r for every rank; returns when all have finished. Calls from several
  // threads interleave safely: each keeps its own completion count.
  void RunAll(const std::function<void(int)>& job) {
    struct Pending {
      std::mutex mu;
      std::condition_variable cv;
      int left = 0;
    } pending;
    pending.left = static_cast<int>(queues_.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t r = 0; r < queues_.size(); ++r) {
        queues_[r].push_back([&job, &pending, r] {
          job(static_cast<int>(r));
          std::lock_guard<std::mutex> l(pending.mu);
          if (--pending.left == 0) pending.cv.notify_one();
        });
      }
    }
    wake_.notify_all();
    std::unique_lock<std::mutex> lock(pending.mu);
    pending.cv.wait(lock, [&] { return pending.left == 0; });
  }

 private:
  void Loop(int r) {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stopping_ || !queues_[r].empty(); });
        if (queues_[r].empty()) return;  // stopping and drained
        task = std::move(queues_[r].front());
        queues_[r].pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<std::deque<std::function<void()>>> queues_;
  std::vector<std::thread> threads_;
};

absl::StatusOr<std::unique_ptr<GroupClient>> GroupClient::Connect(
    const std::vector<std::string>& targets, const ClientOptions& options) {
  std::vector<std::unique_ptr<Client>> ranks;
  for (size_t r = 0; r < targets.size(); ++r) {
    auto client = Client::Connect(targets[r], options);
    if (!client.ok()) return WithRank(static_cast<int>(r), client.status());
    ranks.push_back(std::move(*client));
  }
  return FromClients(std::move(ranks));
}

absl::StatusOr<std::unique_ptr<GroupClient>> GroupClient::FromClients(
    std::vector<std::unique_ptr<Client>> ranks) {
  if (ranks.empty()) return absl::InvalidArgumentError("a group needs at least one rank");
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("ranks[", r, "] must not be null"));
    }
  }
  return std::unique_ptr<GroupClient>(new GroupClient(std::move(ranks)));
}

GroupClient::GroupClient(std::vector<std::unique_ptr<Client>> ranks)
    : ranks_(std::move(ranks)), workers_(std::make_unique<RankWorkers>(size())) {}

GroupClient::~GroupClient() = default;

void GroupClient::RunOnAllRanks(const std::function<void(int)>& job) { workers_->RunAll(job); }

absl::Status GroupClient::WithRank(int rank, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("rank ", rank, ": ", status.message()));
}

std::vector<absl::StatusOr<v1::AppendResponse>> GroupClient::Append(
    const v1::AppendRequest& request, const CallOptions& call) {
  return ForEachRank<v1::AppendResponse>([&](int, Client& c) { return c.Append(request, call); });
}

std::vector<absl::StatusOr<v1::VerifyResponse>> GroupClient::Verify(
    absl::Span<const v1::VerifyRequest> requests, const CallOptions& call) {
  if (static_cast<int>(requests.size()) != size()) {
    const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
        "Verify: requests has ", requests.size(), " entries, must equal the group size ", size()));
    return std::vector<absl::StatusOr<v1::VerifyResponse>>(ranks_.size(), bad);
  }
  return ForEachRank<v1::VerifyResponse>(
      [&](int r, Client& c) { return c.Verify(requests[r], call); });
}

std::vector<absl::StatusOr<v1::CommitResponse>> GroupClient::Commit(
    uint64_t sequence_id, absl::Span<const int32_t> accepted_path, const CallOptions& call) {
  return ForEachRank<v1::CommitResponse>(
      [&](int, Client& c) { return c.Commit(sequence_id, accepted_path, call); });
}

std::vector<absl::StatusOr<v1::ReleaseResponse>> GroupClient::Release(uint64_t sequence_id,
                                                                      const CallOptions& call) {
  return ForEachRank<v1::ReleaseResponse>(
      [&](int, Client& c) { return c.Release(sequence_id, call); });
}

std::vector<absl::StatusOr<v1::ForkResponse>> GroupClient::Fork(uint64_t source_sequence_id,
                                                                uint64_t new_sequence_id,
                                                                uint64_t length,
                                                                const CallOptions& call) {
  return ForEachRank<v1::ForkResponse>(
      [&](int, Client& c) { return c.Fork(source_sequence_id, new_sequence_id, length, call); });
}

std::vector<absl::StatusOr<v1::StatsResponse>> GroupClient::Stats(const CallOptions& call) {
  return ForEachRank<v1::StatsResponse>([&](int, Client& c) { return c.Stats(call); });
}

std::vector<absl::StatusOr<HealthStatus>> GroupClient::Health(const std::string& service,
                                                              const CallOptions& call) {
  return ForEachRank<HealthStatus>([&](int, Client& c) { return c.Health(service, call); });
}

}  // namespace verifyd
