#include "service/verify_poller.h"

#include <atomic>
#include <chrono>
#include <cstdint>

namespace verifyd {
namespace {

// Calls waiting for a request at any time: enough for every client of a busy daemon to be
// accepted without waiting for the poller to post the next one.
constexpr int kPostedRequests = 16;

}  // namespace

// One Verify from request to reply. Two tags name it: its address for the request and the reply,
// its address + 1 for AsyncNotifyWhenDone (the low bit is free: the struct is aligned).
struct VerifyPoller::Call {
  grpc::ServerContext context;
  grpc::ByteBuffer request_bytes;  // raw method: VerifydService parses it
  v1::VerifyRequest request;
  v1::VerifyResponse response;
  grpc::ByteBuffer response_bytes;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder{&context};
  bool started = false;  // the request arrived (the done tag comes only for started calls)
  bool replied = false;  // Finish's event came back
  bool done = false;     // the done tag came back
  // Set when the done tag shows a cancelled call (IsCancelled is safe to ask only after that tag
  // came back); the device thread reads it before it runs the call.
  std::atomic<bool> cancelled{false};

  void* tag() { return this; }
  void* done_tag() { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(this) | 1); }
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
  } else {  // never started: the posted calls come back here, none of them started
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) {
      if ((reinterpret_cast<uintptr_t>(tag) & 1) == 0) delete static_cast<Call*>(tag);
    }
  }
}

void VerifyPoller::RequestNext() {
  auto* call = new Call;
  // Before the request: gRPC takes the done tag only then.
  call->context.AsyncNotifyWhenDone(call->done_tag());
  service_->RequestVerify(&call->context, &call->request_bytes, &call->responder, cq_.get(),
                          cq_.get(), call->tag());
}

void VerifyPoller::OnEvent(Call* call, bool done_event, bool ok) {
  if (done_event) {
    // The call ended: replied, or cancelled (client gone, deadline, drain deadline); a Verify
    // still queued then is skipped by the device.
    call->done = true;
    call->cancelled.store(call->context.IsCancelled(), std::memory_order_release);
  } else if (!call->started) {
    if (!ok) {  // the server shut down before a request came: no done tag will follow
      delete call;
      return;
    }
    call->started = true;
    RequestNext();
    service_->VerifyPolled(
        &call->context, &call->request_bytes, &call->request, &call->response,
        [call] { return call->cancelled.load(std::memory_order_acquire); },
        [call](const grpc::Status& status) {
          bool own_buffer = false;
          if (status.ok() && grpc::SerializationTraits<v1::VerifyResponse>::Serialize(
                                 call->response, &call->response_bytes, &own_buffer)
                                 .ok()) {
            call->responder.Finish(call->response_bytes, status, call->tag());
          } else {
            call->responder.FinishWithError(
                status.ok()
                    ? grpc::Status(grpc::StatusCode::INTERNAL, "the reply did not serialize")
                    : status,
                call->tag());
          }
        });
    return;
  } else {
    call->replied = true;
  }
  if (call->replied && call->done) delete call;
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
    const auto bits = reinterpret_cast<uintptr_t>(tag);
    OnEvent(reinterpret_cast<Call*>(bits & ~uintptr_t{1}), (bits & 1) != 0, ok);
  }
}

}  // namespace verifyd
