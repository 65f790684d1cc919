#include "tests/client/fake_verifyd.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"

namespace verifyd::test {

bool Rendezvous::ArriveAndWait(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (++arrived_ >= expected_) cv_.notify_all();
  return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                      [&] { return arrived_ >= expected_; });
}

FakeVerifyd::FakeVerifyd(int rank, int64_t max_message_bytes) : rank_(rank) {
  char tmpl[] = "/tmp/verifyd-fake-XXXXXX";
  dir_ = mkdtemp(tmpl);
  target_ = absl::StrCat("unix://", dir_, "/s.sock");
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(target_, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  SetServing(true);
}

FakeVerifyd::~FakeVerifyd() {
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void FakeVerifyd::SetServing(bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

std::vector<uint16_t> FakeVerifyd::AppendedKv(uint64_t sequence, int layer) {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_[{sequence, layer}];
}

grpc::Status FakeVerifyd::Enter() {
  attempts.fetch_add(1);
  if (const int64_t ms = delay_ms.load(); ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  int left = unavailable_left.load();
  while (left > 0 && !unavailable_left.compare_exchange_weak(left, left - 1)) {
  }
  if (left > 0) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "injected: daemon restarting");
  return grpc::Status::OK;
}

grpc::Status FakeVerifyd::Append(grpc::ServerContext*, const v1::AppendRequest* request,
                                 v1::AppendResponse* response) {
  if (grpc::Status s = Enter(); !s.ok()) return s;
  append_messages.fetch_add(1);
  const int64_t bytes = static_cast<int64_t>(request->ByteSizeLong());
  int64_t seen = largest_append_bytes.load();
  while (bytes > seen && !largest_append_bytes.compare_exchange_weak(seen, bytes)) {
  }
  const v1::Tensor& kv = request->kv();
  if (kv.shape_size() != 3 || kv.shape(2) != 576 ||
      static_cast<int64_t>(kv.inline_data().size()) != kv.shape(0) * kv.shape(1) * 576 * 2) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "kv must be [layers, T, 576] bf16");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t row_values = kv.shape(1) * 576;
  uint64_t min_fill = UINT64_MAX;
  for (int64_t l = 0; l < kv.shape(0); ++l) {
    std::vector<uint16_t>& dst = kv_[{request->sequence_id(), request->layer_begin() + l}];
    const size_t old = dst.size();
    dst.resize(old + row_values);
    std::memcpy(dst.data() + old, kv.inline_data().data() + l * row_values * 2, row_values * 2);
    response->add_layer_fill(dst.size() / 576);
    min_fill = std::min<uint64_t>(min_fill, dst.size() / 576);
  }
  response->set_committed_length(min_fill);
  return grpc::Status::OK;
}

grpc::Status FakeVerifyd::Verify(grpc::ServerContext*, const v1::VerifyRequest* request,
                                 v1::VerifyResponse* response) {
  if (grpc::Status s = Enter(); !s.ok()) return s;
  if (verify_rendezvous && !verify_rendezvous->ArriveAndWait(absl::Seconds(5))) {
    return grpc::Status(grpc::StatusCode::ABORTED, "the other ranks never arrived concurrently");
  }
  response->add_committed_length(rank_);
  response->add_committed_length(request->layer());
  return grpc::Status::OK;
}

grpc::Status FakeVerifyd::Commit(grpc::ServerContext*, const v1::CommitRequest* request,
                                 v1::CommitResponse* response) {
  if (grpc::Status s = Enter(); !s.ok()) return s;
  response->set_committed_length(request->commit().commit_length());
  return grpc::Status::OK;
}

grpc::Status FakeVerifyd::Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                  v1::ReleaseResponse* response) {
  if (grpc::Status s = Enter(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kv_.find({request->sequence_id(), 0});
  if (it == kv_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("sequence_id = ", request->sequence_id(), " is not live"));
  }
  response->set_freed_slots(it->second.size() / 576);
  return grpc::Status::OK;
}

grpc::Status FakeVerifyd::Compact(grpc::ServerContext* context, const v1::CompactRequest* request,
                                  v1::CompactResponse* response) {
  if (grpc::Status s = Enter(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto token = context->client_metadata().find("x-verifyd-admin-token");
  last_admin_token = token == context->client_metadata().end()
                         ? ""
                         : std::string(token->second.data(), token->second.size());
  compact_budget_ = request->budget_bytes();
  compaction_polls_ = 0;
  response->set_operation_id("op-1");
  return grpc::Status::OK;
}

grpc::Status FakeVerifyd::GetCompaction(grpc::ServerContext*,
                                        const v1::GetCompactionRequest* request,
                                        v1::CompactionStatus* response) {
  if (grpc::Status s = Enter(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (request->operation_id() != "op-1") {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "operation_id is unknown");
  }
  ++compaction_polls_;
  const bool done = compaction_polls_ >= compaction_polls_until_done;
  response->set_operation_id("op-1");
  response->set_state(done ? v1::CompactionStatus::DONE : v1::CompactionStatus::RUNNING);
  response->set_bytes_planned(compact_budget_);
  response->set_bytes_moved(
      done ? compact_budget_ : compact_budget_ * compaction_polls_ / compaction_polls_until_done);
  return grpc::Status::OK;
}

grpc::Status FakeVerifyd::Stats(grpc::ServerContext*, const v1::StatsRequest*,
                                v1::StatsResponse* response) {
  if (grpc::Status s = Enter(); !s.ok()) return s;
  response->set_backend("fake");
  response->set_layers(3);
  response->set_heads(rank_ + 1);
  return grpc::Status::OK;
}

}  // namespace verifyd::test
