// ChannelLane: one worker thread's data plane on one daemon (--channel, plans/0017). A sealed
// memfd (client/host_memory.h) stands in for the scheduler's device memory on the cpu backend: it
// is registered with the daemon (RegisterExternalMemory) and a channel is opened; each Verify
// writes q and tree_kv into it, raises the ready flag, enqueues the descriptor, waits for the
// completion (and checks the done flag), and reads out / lse back as an inline VerifyResponse so
// that the scheduler's reference check is the same for every mode.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/host_memory.h"
#include "verify/bf16.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd::sched {

class ChannelLane {
 public:
  // `bytes`: room for the largest Verify's q | tree_kv | out | lse; `device` the daemon's.
  static absl::StatusOr<std::unique_ptr<ChannelLane>> Open(Client& client, uint64_t bytes,
                                                           uint32_t device);
  ~ChannelLane();

  // `request` carries layer, sequences (with their riding commits), return_lse and the scale;
  // `committed` each sequence's committed length, which the channel does not report.
  absl::StatusOr<v1::VerifyResponse> Verify(const v1::VerifyRequest& request,
                                            absl::Span<const bf16_bits> q,
                                            absl::Span<const bf16_bits> tree_kv, int heads,
                                            absl::Span<const int64_t> committed);

 private:
  ChannelLane() = default;
  Client* client_ = nullptr;
  HostMemory memory_;  // the sealed memfd the daemon maps (cpu backend)
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t region_ = 0;
  std::unique_ptr<Channel> channel_;
  uint32_t step_ = 0;
};

}  // namespace verifyd::sched
