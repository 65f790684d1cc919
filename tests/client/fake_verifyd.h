// An in-process verifyd.v1.Verifyd server on a temporary Unix socket, for client tests.
//
// It keeps appended KV per sequence and layer (so chunked appends can be checked byte for byte),
// counts attempts per method, and can inject UNAVAILABLE, delays and a rendezvous of concurrent
// Verify calls (to prove a group call really runs its ranks at once).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "verifyd/v1/verifyd.grpc.pb.h"

namespace verifyd::test {

// Shared by several servers: Verify waits until `expected` calls are inside at once.
class Rendezvous {
 public:
  explicit Rendezvous(int expected) : expected_(expected) {}
  // True when all arrived before the timeout.
  bool ArriveAndWait(absl::Duration timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int expected_;
  int arrived_ = 0;
};

class FakeVerifyd final : public v1::Verifyd::Service {
 public:
  // rank: returned as VerifyResponse.committed_length[0], so group tests can see who answered.
  FakeVerifyd(int rank, int64_t max_message_bytes);
  ~FakeVerifyd() override;

  const std::string& target() const { return target_; }
  void SetServing(bool serving);

  // Injections (set before calls).
  std::atomic<int> unavailable_left{0};  // next N calls of any method fail UNAVAILABLE
  std::atomic<int64_t> delay_ms{0};      // every call sleeps this long first
  std::shared_ptr<Rendezvous> verify_rendezvous;
  int compaction_polls_until_done = 3;

  // Observations.
  std::atomic<int> attempts{0};  // calls of any method, failed ones included
  std::atomic<int> append_messages{0};
  std::atomic<int64_t> largest_append_bytes{0};
  std::string last_admin_token;
  // kv[sequence][layer]: appended rows, concatenated.
  std::vector<uint16_t> AppendedKv(uint64_t sequence, int layer);

  grpc::Status Append(grpc::ServerContext*, const v1::AppendRequest*, v1::AppendResponse*) override;
  grpc::Status Verify(grpc::ServerContext*, const v1::VerifyRequest*, v1::VerifyResponse*) override;
  grpc::Status Commit(grpc::ServerContext*, const v1::CommitRequest*, v1::CommitResponse*) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest*,
                       v1::ReleaseResponse*) override;
  grpc::Status Compact(grpc::ServerContext*, const v1::CompactRequest*,
                       v1::CompactResponse*) override;
  grpc::Status GetCompaction(grpc::ServerContext*, const v1::GetCompactionRequest*,
                             v1::CompactionStatus*) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse*) override;

 private:
  // Counts the attempt, sleeps the delay, and consumes an injected UNAVAILABLE.
  grpc::Status Enter();

  int rank_;
  std::string dir_, target_;
  std::mutex mu_;
  std::map<std::pair<uint64_t, int>, std::vector<uint16_t>> kv_;
  uint64_t compact_budget_ = 0;
  int compaction_polls_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace verifyd::test
