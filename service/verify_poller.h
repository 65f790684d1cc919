// VerifyPoller: Verify served through gRPC's completion-queue API by one thread of ours that polls
// the queue (--verify-handler=polled, the default). While traffic flows the thread polls without
// sleeping (the executor's spin window), so a request is read the moment it arrives and no thread
// on Verify's path waits for a wake-up: the handler validates on this thread and queues the work,
// the device thread runs it and writes the reply itself (Finish), and this thread only recycles
// the call afterwards. Idle longer than the window, it blocks in the queue like any gRPC thread.
// Why: on a VM a wake-up can cost tens of µs, and gRPC 1.51's callback handlers measured ~40-80
// µs more per round trip than a plain synchronous call (plans/0012). On the H200 it was the
// fastest of the three handlers at S1 in one session's runs and level with the callback one in
// another.
#pragma once

#include <memory>
#include <thread>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "service/verifyd_service.h"

namespace verifyd {

class VerifyPoller {
 public:
  // `cq` comes from ServerBuilder::AddCompletionQueue; `service` is registered with
  // VerifyHandler::kPolled. spin: how long the thread polls after an event before it blocks.
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

  VerifydService* service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  const absl::Duration spin_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace verifyd
