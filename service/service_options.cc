#include "service/service_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/request_validation.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {

absl::StatusOr<BackendKind> ParseBackendKind(const std::string& name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") return BackendKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("--backend = '", name, "' must be one of auto, cpu, cuda"));
}

absl::StatusOr<KvDtype> ParseKvDtype(const std::string& name) {
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "fp8") return KvDtype::kFp8;
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv_dtype = '", name,
      "' must be bf16 (576 bf16 values, 1152 bytes per token and layer) or fp8 (DeepSeek's FP8 "
      "MLA layout, 656 bytes)"));
}

const char* BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "?";
}

std::string DefaultListenAddress(int device) {
  // Not /tmp: another user could create the name there first and receive the scheduler's calls.
  return absl::StrCat("unix://", kDefaultSocketDirectory, "/verifyd-", device, ".sock");
}

bool IsLoopbackHost(const std::string& host) {
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  // Addresses only: a name such as "127.example.com" resolves wherever its owner wants.
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::Status SplitHostPort(const std::string& address, const char* flag, std::string* host,
                           int* port) {
  std::string port_text;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find("]:");
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " = '", address, "' must be [ipv6]:port"));
    }
    *host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " = '", address, "' must be host:port"));
    }
    *host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port_text, port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = '", address, "': port must be in [0, 65535]"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckRange(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = ", value, " must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(const char* flag, double value) {
  if (!std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " = ", value, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

// The rest of the device serves the kernels' workspace, staging and the CUDA context.
constexpr double kMaxKvMemoryFraction = 0.95;

}  // namespace

absl::Status ValidateServiceOptions(const ServiceOptions& o) {
  if (o.listen.empty()) return absl::InvalidArgumentError("--listen must not be empty");
  VERIFYD_RETURN_IF_ERROR(CheckRange("--device", o.device, 0, 1023));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--layers", o.layers, 1, 4096));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--heads", o.heads, 1, 1024));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--max-tree-nodes", o.max_tree_nodes, 1, kMaxTreeNodes));
  // Slots are int32 in the slot tables.
  VERIFYD_RETURN_IF_ERROR(
      CheckRange("--kv-capacity-tokens", o.kv_capacity_tokens, 1, (int64_t{1} << 31) - 1));
  if (!std::isfinite(o.kv_memory_fraction) || o.kv_memory_fraction < 0 ||
      o.kv_memory_fraction > kMaxKvMemoryFraction) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-memory-fraction = ", o.kv_memory_fraction,
                                                   " must be in [0, ", kMaxKvMemoryFraction, "]"));
  }
  VERIFYD_RETURN_IF_ERROR(CheckPositiveFinite("--softmax-scale", o.softmax_scale));
  if (o.softmax_scale > kMaxSoftmaxScale) {
    return absl::InvalidArgumentError(absl::StrCat("--softmax-scale = ", o.softmax_scale,
                                                   " must be <= ", kMaxSoftmaxScale,
                                                   " (SPEC §1: scores stay finite)"));
  }
  VERIFYD_RETURN_IF_ERROR(CheckPositiveFinite("--lease-seconds", o.lease_seconds));
  // gRPC takes the limit as an int; 64 KiB keeps one Append row plus framing possible.
  VERIFYD_RETURN_IF_ERROR(CheckRange("--max-message-bytes", o.max_message_bytes, int64_t{64} << 10,
                                     (int64_t{1} << 31) - 1));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--compute-threads", o.compute_threads, 0, 4096));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--max-sequences", o.max_sequences, 1, int64_t{1} << 32));
  VERIFYD_RETURN_IF_ERROR(
      CheckRange("--max-slot-table-entries", o.max_slot_table_entries, 0, int64_t{1} << 40));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--max-queued-requests", o.max_queued_requests, 1, 1 << 20));
  if (!std::isfinite(o.shutdown_delay_seconds) || o.shutdown_delay_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shutdown-delay-seconds = ", o.shutdown_delay_seconds, " must be finite and >= 0"));
  }
  VERIFYD_RETURN_IF_ERROR(CheckPositiveFinite("--drain-seconds", o.drain_seconds));
  VERIFYD_RETURN_IF_ERROR(
      CheckRange("--compaction-chunk-bytes", o.compaction_chunk_bytes, 0, int64_t{1} << 40));
  VERIFYD_RETURN_IF_ERROR(CheckRange("compaction_history", o.compaction_history, 1, 1 << 20));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--max-channels", o.max_channels, 0, 4096));
  VERIFYD_RETURN_IF_ERROR(
      CheckRange("--max-channel-bytes", o.max_channel_bytes, 0, int64_t{1} << 40));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--max-external-regions", o.max_external_regions, 0, 65536));
  VERIFYD_RETURN_IF_ERROR(CheckRange("--shm-max-bytes", o.shm_max_bytes, 0, int64_t{1} << 40));
  VERIFYD_RETURN_IF_ERROR(
      CheckRange("--shm-max-region-bytes", o.shm_max_region_bytes, 4096, int64_t{1} << 40));
  if (!o.tcp.empty()) {
    std::string host;
    int port = 0;
    VERIFYD_RETURN_IF_ERROR(SplitHostPort(o.tcp, "--tcp", &host, &port));
    if (!o.allow_remote && !IsLoopbackHost(host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tcp = '", o.tcp, "' is not a loopback address; pass --allow-remote to listen on it"));
    }
  }
  if (!o.health_listen.empty()) {
    std::string host;
    int port = 0;
    VERIFYD_RETURN_IF_ERROR(SplitHostPort(o.health_listen, "--health-listen", &host, &port));
  }
  if (!o.metrics.empty()) {
    std::string host;
    int port = 0;
    VERIFYD_RETURN_IF_ERROR(SplitHostPort(o.metrics, "--metrics", &host, &port));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PoolCapacitySlots(const ServiceOptions& options,
                                          const ComputeBackend& backend) {
  if (options.kv_memory_fraction <= 0) return options.kv_capacity_tokens;
  VERIFYD_ASSIGN_OR_RETURN(const int64_t memory, backend.AvailableMemoryBytes());
  const int64_t row_bytes = KvRowBytes(options.kv_dtype);
  const int64_t slot_bytes = int64_t{options.layers} * row_bytes;
  const auto slots = static_cast<int64_t>(options.kv_memory_fraction * static_cast<double>(memory) /
                                          static_cast<double>(slot_bytes));
  if (slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-memory-fraction = ", options.kv_memory_fraction, " of ", memory,
                     " bytes holds no slot of ", options.layers, " layers x ", row_bytes,
                     " bytes (--kv_dtype=", KvDtypeName(options.kv_dtype), ")"));
  }
  // Slots are int32 in the slot tables.
  return std::min<int64_t>(slots, (int64_t{1} << 31) - 1);
}

int64_t SlotTableEntriesBound(int64_t max_slot_table_entries, int64_t capacity_slots) {
  if (max_slot_table_entries > 0) return max_slot_table_entries;
  // Without forks the tables hold at most the pool's slots; 16 holders per slot on average leave
  // room for heavy prefix sharing at 4 bytes an entry (128 MiB for a 2M-slot pool).
  return std::max<int64_t>(16 * capacity_slots, int64_t{1} << 20);
}

absl::StatusOr<DeviceOptions> BuildDeviceOptions(const ServiceOptions& options,
                                                 const ComputeBackend& backend) {
  DeviceOptions device;
  device.store.num_layers = options.layers;
  device.store.max_tree_nodes = options.max_tree_nodes;
  device.store.lease = absl::Seconds(options.lease_seconds);
  device.store.field_names = RequestFieldNames();
  VERIFYD_ASSIGN_OR_RETURN(device.capacity_slots, PoolCapacitySlots(options, backend));
  device.kv_dtype = options.kv_dtype;
  device.store.max_sequences = options.max_sequences;
  device.store.max_slot_table_entries =
      SlotTableEntriesBound(options.max_slot_table_entries, device.capacity_slots);
  device.max_queued_requests = options.max_queued_requests;
  device.executor_spin_us = options.executor_spin_us;
  device.compaction_chunk_bytes = options.compaction_chunk_bytes;
  device.compaction_history = options.compaction_history;
  device.device = options.device;
  device.request_limits = LimitsFromOptions(options);
  device.max_channels = options.max_channels;
  device.max_channel_bytes = static_cast<uint64_t>(options.max_channel_bytes);
  device.max_external_regions = options.max_external_regions;
  return device;
}

}  // namespace verifyd
