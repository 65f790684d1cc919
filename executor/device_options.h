// DeviceOptions: what one device's executor, store and compaction need, as plain values. The
// service builds them from its flags (service/service_options.h); nothing here reads a flag.
#pragma once

#include <cstdint>
#include <string>

#include "base/descriptor_budget.h"
#include "executor/verify_validation.h"
#include "kvstore/kv_store.h"
#include "verify/kv_dtype.h"

namespace verifyd {

struct DeviceOptions {
  // Layers, tree bound, lease, and the names the store's messages give its parameters.
  KvStoreOptions store;
  // The pool's slots, resolved by the caller (at most 2^31 - 1: slots are int32 in slot tables).
  int64_t capacity_slots = 65536;
  // The pool's rows (SPEC §1 "KV storage dtype"): the backend's CreateStorage refuses what it
  // cannot store.
  KvDtype kv_dtype = KvDtype::kBf16;
  // Tasks waiting beyond this are refused (RESOURCE_EXHAUSTED).
  int max_queued_requests = 1024;
  // How long the executor thread polls for the next task before it sleeps; see ExecutorSpinMicros.
  int64_t executor_spin_us = -1;
  // The most one compaction chunk copies; 0: CompactionManager::ChunkBytesFor the backend.
  int64_t compaction_chunk_bytes = 0;
  // Compact operations GetCompaction remembers.
  int compaction_history = 64;
  // The data plane (plans/0017): the device a registration must name (also in the ring files'
  // names), and the bounds a channel's descriptors are validated against: the gRPC path's, so
  // both answer the same (layers and max_tree_nodes equal the store's).
  int device = 0;
  ValidationLimits request_limits;
  // Daemon-wide bounds of the data plane (issue 33 N6): open channels and their rings' bytes,
  // registered external regions.
  int max_channels = 64;
  uint64_t max_channel_bytes = uint64_t{256} << 20;
  int max_external_regions = 256;
  // What the names of the daemon's /dev/shm files start with ("verifyd-<device>-<instance>-",
  // service/shm_instance.h); empty: "verifyd-<device>-".
  std::string shm_name_prefix;
  // The process's descriptors, shared with the service's acceptor (owned by the caller, outlives
  // the device); null: not checked.
  DescriptorBudget* descriptors = nullptr;
};

}  // namespace verifyd
