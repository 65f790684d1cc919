#include "service/verify_poller.h"

#include <chrono>

namespace verifyd {
namespace {

// Calls waiting for a request at any time: enough for every client of a busy daemon to be
// accepted without waiting for the poller to post the next one.
constexpr int kPostedRequests = 16;

}  // namespace

// One Verify from request to reply; its address is the tag of both of its events.
struct VerifyPoller::Call {
  enum class Stage { kRequested, kFinishing };
  Stage stage = Stage::kRequested;
  grpc::ServerContext context;
  v1::VerifyRequest request;
  v1::VerifyResponse response;
  grpc::ServerAsyncResponseWriter<v1::VerifyResponse> responder{&context};
};

VerifyPoller::VerifyPoller(VerifydService* service, std::unique_ptr<grpc::ServerCompletionQueue> cq,
                           absl::Duration spin)
    : service_(service), cq_(std::move(cq)), spin_(spin) {}

VerifyPoller::~VerifyPoller() { Stop(); }

void VerifyPoller::Start() {
  for (int i = 0; i < kPostedRequests; ++i) RequestNext();
  thread_ = std::thread([this] { Loop(); });
}

void VerifyPoller::Stop() {
  if (stopped_) return;
  stopped_ = true;
  cq_->Shutdown();
  if (thread_.joinable()) {
    thread_.join();
  } else {  // never started: the posted calls come back here
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) delete static_cast<Call*>(tag);
  }
}

void VerifyPoller::RequestNext() {
  auto* call = new Call;
  service_->RequestPolledVerify(&call->context, &call->request, &call->responder, cq_.get(), call);
}

void VerifyPoller::Loop() {
  const auto spin = absl::ToChronoNanoseconds(spin_);
  auto last_event = std::chrono::steady_clock::now();
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    const auto now = std::chrono::steady_clock::now();
    grpc::CompletionQueue::NextStatus status;
    if (now - last_event < spin) {
      // A zero deadline still polls the transport once: whatever arrived is read here.
      status = cq_->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (status == grpc::CompletionQueue::TIMEOUT) continue;
    } else {
      status =
          cq_->Next(&tag, &ok) ? grpc::CompletionQueue::GOT_EVENT : grpc::CompletionQueue::SHUTDOWN;
    }
    if (status == grpc::CompletionQueue::SHUTDOWN) return;
    last_event = std::chrono::steady_clock::now();
    auto* call = static_cast<Call*>(tag);
    if (call->stage == Call::Stage::kFinishing || !ok) {
      // The reply went out (or the server shut down before a request came): the call is done.
      delete call;
      continue;
    }
    RequestNext();
    call->stage = Call::Stage::kFinishing;
    service_->VerifyPolled(&call->context, &call->request, &call->response,
                           [call](const grpc::Status& status) {
                             call->responder.Finish(call->response, status, call);
                           });
  }
}

}  // namespace verifyd
