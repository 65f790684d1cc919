#include "tests/service/rpc_helpers.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace verifyd::testing {

std::unique_ptr<grpc::ClientContext> ContextWithDeadline(std::chrono::milliseconds timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  return context;
}

namespace {
constexpr std::chrono::milliseconds kTimeout{30000};
}

grpc::Status RpcDriver::Append(const v1::AppendRequest& request, v1::AppendResponse* response) {
  v1::AppendResponse local;
  if (response == nullptr) response = &local;
  auto context = ContextWithDeadline(kTimeout);
  grpc::Status status = stub_.Append(context.get(), request, response);
  if (status.ok()) model_.AcceptAppend(request);
  return status;
}

grpc::Status RpcDriver::Verify(const v1::VerifyRequest& request, std::string* mismatch,
                               v1::VerifyResponse* response) {
  v1::VerifyResponse local;
  if (response == nullptr) response = &local;
  auto context = ContextWithDeadline(kTimeout);
  grpc::Status status = stub_.Verify(context.get(), request, response);
  if (status.ok()) {
    model_.AcceptVerify(request);
    *mismatch = model_.CheckVerify(request, *response);
  }
  return status;
}

grpc::Status RpcDriver::Commit(uint64_t sequence, const std::vector<int32_t>& path,
                               v1::CommitResponse* response) {
  v1::CommitResponse local;
  if (response == nullptr) response = &local;
  v1::CommitRequest request;
  request.set_sequence_id(sequence);
  request.mutable_commit()->set_commit_length(static_cast<uint32_t>(path.size()));
  for (int32_t n : path) request.mutable_commit()->add_accepted_path(n);
  auto context = ContextWithDeadline(kTimeout);
  grpc::Status status = stub_.Commit(context.get(), request, response);
  if (status.ok()) model_.AcceptCommit(sequence, path);
  return status;
}

grpc::Status RpcDriver::Release(uint64_t sequence, v1::ReleaseResponse* response) {
  v1::ReleaseResponse local;
  if (response == nullptr) response = &local;
  v1::ReleaseRequest request;
  request.set_sequence_id(sequence);
  auto context = ContextWithDeadline(kTimeout);
  grpc::Status status = stub_.Release(context.get(), request, response);
  if (status.ok()) model_.AcceptRelease(sequence);
  return status;
}

grpc::Status RpcDriver::Fork(uint64_t source, uint64_t fork, uint64_t length,
                             v1::ForkResponse* response) {
  v1::ForkResponse local;
  if (response == nullptr) response = &local;
  v1::ForkRequest request;
  request.set_source_sequence_id(source);
  request.set_new_sequence_id(fork);
  request.set_length(length);
  auto context = ContextWithDeadline(kTimeout);
  grpc::Status status = stub_.Fork(context.get(), request, response);
  if (status.ok()) model_.AcceptFork(source, fork, static_cast<int64_t>(length));
  return status;
}

v1::StatsResponse RpcDriver::Stats() {
  v1::StatsResponse response;
  auto context = ContextWithDeadline(kTimeout);
  grpc::Status status = stub_.Stats(context.get(), v1::StatsRequest(), &response);
  if (!status.ok()) response.set_backend("error: " + status.error_message());
  return response;
}

std::string RpcDriver::Step(const std::vector<VerifyPart>& parts, bool return_lse) {
  for (int layer = 0; layer < model_.layers(); ++layer) {
    std::vector<VerifyPart> layer_parts = parts;
    if (layer > 0) {
      for (auto& p : layer_parts) p.commit_previous.reset();
    }
    const v1::VerifyRequest request = model_.MakeVerify(layer, layer_parts, return_lse);
    std::string mismatch;
    grpc::Status status = Verify(request, &mismatch);
    if (!status.ok()) {
      return absl::StrCat("layer ", layer, ": Verify failed: ", status.error_message());
    }
    if (!mismatch.empty()) return absl::StrCat("layer ", layer, ": ", mismatch);
  }
  return "";
}

grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service, bool* ok) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  auto context = ContextWithDeadline(std::chrono::milliseconds(2000));
  const grpc::Status status = stub->Check(context.get(), request, &response);
  *ok = status.ok();
  return status.ok() ? response.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

grpc::Status WaitForCompaction(v1::Verifyd::Stub& stub, const std::string& operation_id,
                               std::chrono::milliseconds timeout, v1::CompactionStatus* status) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    grpc::ClientContext context;
    v1::GetCompactionRequest get;
    get.set_operation_id(operation_id);
    const grpc::Status s = stub.GetCompaction(&context, get, status);
    if (!s.ok() || status->state() == v1::CompactionStatus::DONE ||
        status->state() == v1::CompactionStatus::FAILED ||
        std::chrono::steady_clock::now() >= deadline) {
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace verifyd::testing
