// ServiceOptions: every daemon setting in one struct. main.cc fills it from flags; nothing below
// main reads a flag, and nothing below the service sees this struct: the layers below take their
// own options (DeviceOptions, KvStoreOptions, CudaBackendOptions), built here and in
// backend_factory.cc.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/compute_backend.h"
#include "executor/device_options.h"
#include "verify/kv_dtype.h"

namespace verifyd {

enum class BackendKind { kAuto, kCpu, kCuda };

absl::StatusOr<BackendKind> ParseBackendKind(const std::string& name);
const char* BackendName(BackendKind kind);
// --kv_dtype: "bf16" or "fp8" (verify/kv_dtype.h).
absl::StatusOr<KvDtype> ParseKvDtype(const std::string& name);

struct ServiceOptions {
  // gRPC address of the Unix socket (or any gRPC URI); "" picks DefaultListenAddress(device).
  std::string listen;
  // Optional host:port; refused unless loopback or allow_remote. Reads only, unless the call
  // carries the admin token (service/call_gate.h).
  std::string tcp;
  bool allow_remote = false;
  // A file holding the token that opens --tcp's state-changing calls (metadata
  // "x-verifyd-admin-token"); "" keeps them closed. A file, never a flag value: argv is readable
  // by every user of the host (/proc/<pid>/cmdline).
  std::string admin_token_file;
  // Optional host:port serving only grpc.health.v1 (for probes from outside the host, such as the
  // kubelet's); any address is allowed, health tells nothing secret.
  std::string health_listen;
  // Prometheus HTTP host:port; "" disables the exporter.
  std::string metrics = "127.0.0.1:9464";
  BackendKind backend = BackendKind::kAuto;
  int device = 0;
  int layers = 4;
  int heads = 16;
  int max_tree_nodes = 1024;
  int64_t kv_capacity_tokens = 65536;
  // > 0: the pool takes this fraction of the backend's memory (free device memory at start for
  // cuda, physical memory for cpu) and kv_capacity_tokens is ignored; 0: kv_capacity_tokens.
  double kv_memory_fraction = 0;
  // The pool's rows (SPEC §1 "KV storage dtype"): bf16 (1152 bytes per token and layer) or
  // DeepSeek's fp8 layout (656). The cpu backend serves fp8; the cuda one stores it
  // (backend/cuda/cuda_kv_storage.h) but the daemon refuses it at start until its GPU tests have
  // passed (service/backend_factory.cc).
  KvDtype kv_dtype = KvDtype::kBf16;
  float softmax_scale = 0.07216878364870322f;  // 1/sqrt(192)
  double lease_seconds = 300;
  int64_t max_message_bytes = 64ll << 20;
  int compute_threads = 0;  // cpu backend; 0 = all cores
  // cuda backend: replay each shape bucket's step as a CUDA graph (false: always eager).
  bool cuda_graphs = true;
  // cuda backend: run the portable flash kernel (sm_80 / sm_120's) even where the Hopper one can.
  bool portable_flash_kernel = false;
  // After each request the executor thread (and Verify's polling thread) polls this long for the
  // next one before it sleeps (0: it sleeps at once; < 0: auto, 2000 when the process may use
  // >= 8 CPUs, else 0). Not a flag (plans/0015): the spin won every measurement on the H200, and
  // the auto rule keeps it off small hosts; tests and benchmarks may set it.
  int64_t executor_spin_us = -1;
  // Live sequences, and entries of their slot tables (every committed position of every
  // sequence: a fork copies its prefix's), past which a new sequence or a Fork is
  // RESOURCE_EXHAUSTED (issue 33 N2). Entries cost 4 bytes of host memory each (and 4 of device
  // memory on cuda); 0 picks 16 x the pool's slots, at least 2^20.
  int64_t max_sequences = 65536;
  int64_t max_slot_table_entries = 0;
  // Requests waiting for the device beyond this get RESOURCE_EXHAUSTED (bounds queued memory).
  int max_queued_requests = 1024;
  // After SIGTERM: seconds health reports NOT_SERVING while still serving, so that probes and load
  // balancers notice before the socket closes.
  double shutdown_delay_seconds = 0;
  // After that: seconds in-flight calls get to finish before they are cancelled.
  double drain_seconds = 30;
  // Bytes of one compaction chunk: the most the executor copies between two queued requests.
  // 0 picks by backend: 4 MiB on cpu (a host memcpy holds the executor), 256 MiB on cuda (the
  // copy itself takes ~160 µs there; per-chunk planning and the wait dominate small chunks).
  int64_t compaction_chunk_bytes = 0;
  // Operations GetCompaction remembers.
  int compaction_history = 64;
  // The data plane's daemon-wide bounds (issue 33 N6): open channels (a thread and a descriptor
  // each), the bytes of their rings in /dev/shm, registered external regions.
  int max_channels = 64;
  int64_t max_channel_bytes = int64_t{256} << 20;
  int max_external_regions = 256;
  // Shared memory for tensors (plans/0010): bytes over all regions (0 disables it) and per region.
  int64_t shm_max_bytes = int64_t{1} << 30;
  int64_t shm_max_region_bytes = int64_t{256} << 20;
};

// The Unix socket default for a device: unix:///run/verifyd/verifyd-<device>.sock. The directory
// must exist and be writable by the daemon (systemd's RuntimeDirectory=, a volume in Kubernetes).
inline constexpr char kDefaultSocketDirectory[] = "/run/verifyd";
std::string DefaultListenAddress(int device);

// Checks every field against its bound; the message names the flag ("--heads = 0 must be >= 1").
absl::Status ValidateServiceOptions(const ServiceOptions& options);

// The pool's capacity in slots: --kv-capacity-tokens, or --kv-memory-fraction of what the backend
// reports (AvailableMemoryBytes) divided by one slot's bytes over all layers (--kv_dtype's row
// bytes x layers: fp8 holds 1152 / 656 = 1.756x the tokens of bf16), at most 2^31 - 1.
absl::StatusOr<int64_t> PoolCapacitySlots(const ServiceOptions& options,
                                          const ComputeBackend& backend);

// --max-slot-table-entries as the store takes it: the flag, or 16 x the pool's slots (at least
// 2^20) when 0.
int64_t SlotTableEntriesBound(int64_t max_slot_table_entries, int64_t capacity_slots);

// The device's options from the flags, for `backend` (the pool's size may depend on its memory).
// The store's messages name the requests' fields (RequestFieldNames).
absl::StatusOr<DeviceOptions> BuildDeviceOptions(const ServiceOptions& options,
                                                 const ComputeBackend& backend);

// True for the addresses 127.0.0.0/8 and ::1, and the name localhost (no other name).
bool IsLoopbackHost(const std::string& host);
// Splits "host:port" or "[v6]:port"; INVALID_ARGUMENT naming `flag` otherwise.
absl::Status SplitHostPort(const std::string& address, const char* flag, std::string* host,
                           int* port);

}  // namespace verifyd
