// The ways a soak client (tests/service/soak.cc) sends its decode steps and commits: gRPC with
// inline tensors, a daemon-made shared-memory region (/dev/shm), and a channel over registered
// memory (the data plane, plans/0017; the cpu backend's sealed memfd stands in for device memory).
// Every Verify's outputs are checked element by element against the float64 shadow model, whatever
// the lane. The region, the registered memory and the channel are remade every few rounds, so a
// long soak also churns the daemon's /dev/shm files, channel threads and descriptors.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/channel.h"
#include "client/client.h"
#include "client/shared_memory_region.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"

namespace verifyd::testing {

enum class Lane { kGrpc = 0, kSharedMemory = 1, kChannel = 2 };
inline constexpr int kLanes = 3;
const char* LaneName(Lane lane);

class SoakLanes {
 public:
  // `max_total_q`: the most tree nodes one step carries (sizes the region and the scratch).
  SoakLanes(Client& client, v1::Verifyd::Stub& stub, ShadowModel& model, int64_t max_total_q);
  ~SoakLanes();

  // Remakes the channel every round, the shared-memory region every second round and the
  // registered memory every fourth (first call: all three). Not OK when the daemon refused.
  absl::Status Renew(uint64_t round);
  // Closes the channel and releases the region and the registered memory.
  absl::Status Close();

  // The most bytes of /dev/shm one SoakLanes holds at a time: its region (rounded to pages, as
  // tmpfs sizes it) and its channel's ring. The soak bounds the daemon's files by these.
  static uint64_t RegionFileBytes(int64_t max_total_q, int heads);
  static uint64_t RingFileBytes();

  // One decode step of `parts` on every layer through `lane` (riding commits on layer 0 only):
  // "" when every call succeeded and every output matched the reference, else what went wrong.
  std::string Step(Lane lane, const std::vector<VerifyPart>& parts, bool return_lse);
  // Commit alone: gRPC for kGrpc and kSharedMemory (shared memory has no commit), a commit
  // descriptor for kChannel. "" or what went wrong; the model follows on success.
  std::string Commit(Lane lane, uint64_t sequence, const std::vector<int32_t>& path);

 private:
  std::string VerifyShared(const v1::VerifyRequest& request);
  std::string VerifyOnChannel(const v1::VerifyRequest& request);

  Client& client_;
  ShadowModel& model_;
  RpcDriver rpc_;
  static constexpr uint32_t kRingEntries = 2;  // one call in flight at a time, and one spare
  const uint64_t region_bytes_;
  std::optional<SharedMemoryRegion> region_;
  std::unique_ptr<Scratch> scratch_;
  uint64_t external_region_ = 0;
  std::unique_ptr<Channel> channel_;
  uint32_t flag_value_ = 0;
  uint64_t descriptor_id_ = 0;
};

}  // namespace verifyd::testing
