// What the data-plane tests through the daemon's socket share (data_plane_test.cc and
// data_plane_defense_test.cc): the scheduler's memory on the cpu backend, one Verify's layout in
// it, the descriptor of a gRPC request, reading the outputs back, and a daemon with its client.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "client/channel.h"
#include "client/client.h"
#include "client/host_memory.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd::testing {

// Polls `done` every `every` until it holds or `limit` has passed; returns how long that took.
template <typename Done>
std::chrono::steady_clock::duration PollUntil(
    Done done, std::chrono::milliseconds limit,
    std::chrono::milliseconds every = std::chrono::milliseconds(5)) {
  const auto start = std::chrono::steady_clock::now();
  while (!done() && std::chrono::steady_clock::now() - start < limit) {
    std::this_thread::sleep_for(every);
  }
  return std::chrono::steady_clock::now() - start;
}

// A sealed memfd this process maps: the scheduler's "device memory" on the cpu backend.
class Scratch {
 public:
  explicit Scratch(uint64_t bytes) : memory_(*HostMemory::Create(bytes)) {}
  uint8_t* data() const { return memory_.data(); }
  uint64_t bytes() const { return memory_.bytes(); }
  std::string path() const { return memory_.handle(); }
  std::atomic_ref<uint32_t> word(uint64_t offset) const {
    return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(memory_.data() + offset));
  }

 private:
  HostMemory memory_;
};

uint64_t Align64(uint64_t x);

// Where one Verify's tensors and flags sit in the scratch region.
struct Layout {
  uint64_t q, tree_kv, out, lse, ready, done, end;
};
Layout LayoutFor(int64_t total_q, int64_t heads);

int64_t TotalQ(const v1::VerifyRequest& r);

// The descriptor of `request` (its tensors copied into `scratch`), flags at `value`.
Channel::VerifyDescriptor DescriptorFor(const v1::VerifyRequest& request, uint64_t region,
                                        const Scratch& scratch, uint32_t value, uint64_t id);

// What the channel wrote, as a VerifyResponse (inline bytes), for ShadowModel::CheckVerify.
v1::VerifyResponse ResponseFrom(const v1::VerifyRequest& request, const Scratch& scratch,
                                const ShadowModel& model);

bool OutputsAreNan(const Scratch& scratch, int64_t total_q, int64_t heads, bool lse);

ServiceOptions OnCpu(ServiceOptions options);

struct Harness {
  // The cpu backend on every machine: a sealed memfd stands in for device memory here (the cuda
  // backend's regions are IPC handles: data_plane_gpu_test).
  explicit Harness(ServiceOptions options);
  static uint32_t Seed();
  void AppendSequence(uint64_t id, int tokens);
  v1::StatsResponse Stats() { return *client->Stats(); }

  TestServer server;
  ShadowModel model;
  std::unique_ptr<Client> client;
};

absl::Status RawStatus(const grpc::Status& s);

// Runs one descriptor on `channel` and waits for its completion; the flag is raised first (the
// scheduler's "q is ready").
Channel::Completion RunOnChannel(Channel& channel, const Channel::VerifyDescriptor& d,
                                 const Scratch& scratch);

}  // namespace verifyd::testing
