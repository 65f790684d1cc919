// VerifyPoller: Verify served through gRPC's completion-queue API by one thread of ours that polls
// the queue. While traffic flows the thread polls without sleeping (the executor's spin window),
// so a request is read the moment it arrives and no thread on Verify's path waits for a wake-up:
// the handler validates on this thread and queues the work, the device thread runs it and writes
// the reply itself (Finish), and this thread only recycles the call afterwards. Idle longer than
// the window, it blocks in the queue like any gRPC thread.
// Why this handler alone: it measured the fastest at S1 on the H200 (plans/0012; the callback and
// synchronous handlers are gone, plans/0015). Each call asks AsyncNotifyWhenDone, so that a client
// that goes away (or the drain deadline) marks its queued call cancelled and the device skips it.
#pragma once

#include <memory>
#include <thread>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "service/verifyd_service.h"

namespace verifyd {

class VerifyPoller {
 public:
  // `cq` comes from ServerBuilder::AddCompletionQueue. spin: how long the thread polls after an
  // event before it blocks.
  VerifyPoller(VerifydService* service, std::unique_ptr<grpc::ServerCompletionQueue> cq,
               absl::Duration spin);
  ~VerifyPoller();  // Stop()
  VerifyPoller(const VerifyPoller&) = delete;
  VerifyPoller& operator=(const VerifyPoller&) = delete;

  // After Server::BuildAndStart.
  void Start();
  // After Server::Shutdown returned and the device drained (every call has been finished):
  // shuts the queue down, frees the calls left, joins the thread.
  void Stop();

 private:
  struct Call;
  void RequestNext();
  void Loop();
  // Handles one event of `call`; deletes it after its last.
  void OnEvent(Call* call, bool done_event, bool ok);

  VerifydService* service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  const absl::Duration spin_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace verifyd
