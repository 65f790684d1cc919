// verifyd::GroupClient: one call to the daemons of every tensor-parallel rank at once.
//
// A TP scheduler holds the same sequences on every rank's daemon (the MLA latent KV is shared by
// all heads, so every rank stores the whole cache) while each rank computes its own heads. A step
// therefore sends the same Append/Commit/Release to all ranks and a per-rank Verify (its own q).
// Calls run concurrently on one worker thread per rank, so a group call takes as long as the
// slowest rank, not the sum; results come back per rank, in rank order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace verifyd {

class RankWorkers;

class GroupClient {
 public:
  // One Client per target, rank r = targets[r].
  static absl::StatusOr<std::unique_ptr<GroupClient>> Connect(
      const std::vector<std::string>& targets, const ClientOptions& options = {});
  static absl::StatusOr<std::unique_ptr<GroupClient>> FromClients(
      std::vector<std::unique_ptr<Client>> ranks);
  ~GroupClient();

  int size() const { return static_cast<int>(ranks_.size()); }
  Client& rank(int r) { return *ranks_[r]; }

  // Runs fn(rank, client) for every rank concurrently and waits for all of them.
  template <typename T>
  std::vector<absl::StatusOr<T>> ForEachRank(
      const std::function<absl::StatusOr<T>(int, Client&)>& fn) {
    std::vector<absl::StatusOr<T>> results(ranks_.size(), absl::UnknownError("not run"));
    RunOnAllRanks([&](int r) { results[r] = fn(r, *ranks_[r]); });
    return results;
  }

  // The same request to every rank.
  std::vector<absl::StatusOr<v1::AppendResponse>> Append(const v1::AppendRequest& request,
                                                         const CallOptions& call = {});
  // requests[r] to rank r; INVALID_ARGUMENT for every rank when the count differs from size().
  std::vector<absl::StatusOr<v1::VerifyResponse>> Verify(
      absl::Span<const v1::VerifyRequest> requests, const CallOptions& call = {});
  std::vector<absl::StatusOr<v1::CommitResponse>> Commit(uint64_t sequence_id,
                                                         absl::Span<const int32_t> accepted_path,
                                                         const CallOptions& call = {});
  std::vector<absl::StatusOr<v1::ReleaseResponse>> Release(uint64_t sequence_id,
                                                           const CallOptions& call = {});
  // Every rank holds the sequence's KV: each forks its own copy of the prefix's slots.
  std::vector<absl::StatusOr<v1::ForkResponse>> Fork(uint64_t source_sequence_id,
                                                     uint64_t new_sequence_id, uint64_t length,
                                                     const CallOptions& call = {});
  std::vector<absl::StatusOr<v1::StatsResponse>> Stats(const CallOptions& call = {});
  std::vector<absl::StatusOr<HealthStatus>> Health(const std::string& service = "",
                                                   const CallOptions& call = {});

  // OK when every rank succeeded; otherwise the lowest failing rank's status, prefixed "rank r: ".
  template <typename T>
  static absl::Status FirstError(const std::vector<absl::StatusOr<T>>& results) {
    for (size_t r = 0; r < results.size(); ++r) {
      if (!results[r].ok()) return WithRank(static_cast<int>(r), results[r].status());
    }
    return absl::OkStatus();
  }

 private:
  explicit GroupClient(std::vector<std::unique_ptr<Client>> ranks);
  void RunOnAllRanks(const std::function<void(int)>& job);
  static absl::Status WithRank(int rank, const absl::Status& status);

  std::vector<std::unique_ptr<Client>> ranks_;
  std::unique_ptr<RankWorkers> workers_;
};

}  // namespace verifyd
