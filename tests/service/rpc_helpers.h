// Typed calls through the raw stub that keep the ShadowModel in step with what the daemon
// accepted, and a health check.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "tests/service/health.grpc.pb.h"
#include "tests/service/shadow_model.h"
#include "verifyd/v1/verifyd.grpc.pb.h"

namespace verifyd::testing {

class RpcDriver {
 public:
  RpcDriver(v1::Verifyd::Stub& stub, ShadowModel& model) : stub_(stub), model_(model) {}

  grpc::Status Append(const v1::AppendRequest& request, v1::AppendResponse* response = nullptr);
  // Sends, and on OK accepts into the model and checks every output element: `mismatch` gets ""
  // or the first difference.
  grpc::Status Verify(const v1::VerifyRequest& request, std::string* mismatch,
                      v1::VerifyResponse* response = nullptr);
  grpc::Status Commit(uint64_t sequence, const std::vector<int32_t>& path,
                      v1::CommitResponse* response = nullptr);
  grpc::Status Release(uint64_t sequence, v1::ReleaseResponse* response = nullptr);
  grpc::Status Fork(uint64_t source, uint64_t fork, uint64_t length,
                    v1::ForkResponse* response = nullptr);
  v1::StatsResponse Stats();

  // One decode step: Verify `parts` on every layer (commits ride on layer 0 only); returns the
  // first mismatch or error, "" when every output matched.
  std::string Step(const std::vector<VerifyPart>& parts, bool return_lse);

 private:
  v1::Verifyd::Stub& stub_;
  ShadowModel& model_;
};

// SERVING / NOT_SERVING / ...; UNKNOWN with `ok` false when the call failed.
grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service, bool* ok);

// Polls GetCompaction(`operation_id`) until DONE or FAILED or `timeout`; *status is the last
// answer. Not OK only when a GetCompaction call failed.
grpc::Status WaitForCompaction(v1::Verifyd::Stub& stub, const std::string& operation_id,
                               std::chrono::milliseconds timeout, v1::CompactionStatus* status);

std::unique_ptr<grpc::ClientContext> ContextWithDeadline(std::chrono::milliseconds timeout);

}  // namespace verifyd::testing
