// verifyd: flags -> ServiceOptions -> VerifydServer; SIGTERM/SIGINT drain and exit 0.
// Exit codes: 0 clean shutdown, 1 startup failure, 2 invalid flags.
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "service/backend_factory.h"
#include "service/event_log.h"
#include "service/service_options.h"
#include "service/systemd_notify.h"
#include "service/verifyd_server.h"

#ifndef VERIFYD_VERSION
#define VERIFYD_VERSION "0.0.0"
#endif

ABSL_FLAG(std::string, log_level, "info",
          "the least level of the event log on stderr: debug, info, warning or error");
ABSL_FLAG(int64_t, log_refused_every, 100,
          "the event log writes the first refused call of each method and code, then one in this "
          "many");
ABSL_FLAG(std::string, listen, "",
          "gRPC address of the Unix socket (default unix:///run/verifyd/verifyd-<device>.sock)");
ABSL_FLAG(std::string, tcp, "",
          "optional host:port for TCP (loopback unless --allow-remote); reads only without the "
          "admin token");
ABSL_FLAG(bool, allow_remote, false, "allow --tcp on a non-loopback address");
ABSL_FLAG(std::string, admin_token_file, "",
          "file (not world-readable) holding the token that --tcp callers send in metadata "
          "x-verifyd-admin-token for every call that changes state");
ABSL_FLAG(std::string, health_listen, "",
          "optional host:port serving only grpc.health.v1, for probes (any address)");
ABSL_FLAG(std::string, metrics, "127.0.0.1:9464",
          "Prometheus HTTP host:port (port 0 picks one); empty disables");
ABSL_FLAG(std::string, backend, "auto", "auto|cpu|cuda");
ABSL_FLAG(int, device, 0, "GPU index this daemon serves");
ABSL_FLAG(int, layers, 4, "model layers whose KV this daemon keeps");
ABSL_FLAG(int, heads, 16, "attention heads on this GPU");
ABSL_FLAG(int, max_tree_nodes, 1024, "most draft-tree nodes per sequence (<= 1024)");
ABSL_FLAG(int64_t, kv_capacity_tokens, 65536, "KV pool capacity in token slots");
ABSL_FLAG(double, kv_memory_fraction, 0,
          "> 0: size the KV pool to this fraction of free device memory (cuda) or physical memory "
          "(cpu), in [0, 0.95], instead of --kv-capacity-tokens");
ABSL_FLAG(
    std::string, kv_dtype, "bf16",
    "bf16|fp8: the KV pool's rows: 576 bf16 values (1152 bytes per token and layer) or "
    "DeepSeek's FP8 MLA layout (656 bytes: 512 e4m3 + 4 float32 scales + 64 bf16 rope; "
    "bf16 rows are quantized as they are stored); the cpu backend (the cuda one refuses it at "
    "start until its GPU tests have passed: plans/0030)");
ABSL_FLAG(double, softmax_scale, 1.0 / std::sqrt(192.0), "default attention scale");
ABSL_FLAG(double, lease_seconds, 300, "a sequence untouched this long is released");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20, "gRPC receive and send limit");
ABSL_FLAG(int, compute_threads, 0, "cpu backend threads (0: every core)");
ABSL_FLAG(int64_t, max_sequences, 65536,
          "live sequences at most: a new sequence or a Fork past it gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_slot_table_entries, 0,
          "slot-table entries at most (every committed position of every sequence, a fork's "
          "shared prefix included; 4 bytes each): a Fork or Append past it gets "
          "RESOURCE_EXHAUSTED (0: 16 x the pool's slots, at least 2^20)");
ABSL_FLAG(int, max_queued_requests, 1024,
          "requests waiting for the device beyond this get RESOURCE_EXHAUSTED");
ABSL_FLAG(double, shutdown_delay_seconds, 0,
          "after SIGTERM, seconds health reports NOT_SERVING before the socket closes");
ABSL_FLAG(double, drain_seconds, 30, "after that, seconds in-flight calls get to finish");
ABSL_FLAG(int64_t, compaction_chunk_bytes, 0,
          "most bytes one compaction step copies between requests (0: 4 MiB cpu, 256 MiB cuda)");
ABSL_FLAG(int, max_channels, 64,
          "data plane: open channels at most, daemon-wide (a thread and a descriptor each)");
ABSL_FLAG(int64_t, max_channel_bytes, int64_t{256} << 20,
          "data plane: bytes of /dev/shm the open channels' rings take at most, daemon-wide");
ABSL_FLAG(int, max_external_regions, 256,
          "data plane: registered external regions at most, daemon-wide");
ABSL_FLAG(int64_t, shm_max_bytes, int64_t{1} << 30,
          "shared memory for tensors: most bytes over all regions (0 disables it)");
ABSL_FLAG(int64_t, shm_max_region_bytes, int64_t{256} << 20,
          "shared memory for tensors: most bytes of one region");
ABSL_FLAG(std::string, cuda_graphs, "on",
          "on|off: replay the per-step work as CUDA graphs per shape bucket (cuda backend)");
ABSL_FLAG(
    std::string, flash_kernel, "auto",
    "auto|portable: the flash kernel (cuda backend). auto: the sm_90a one on Hopper, else the "
    "portable one; portable: the kernel sm_80 and sm_120 run, also on Hopper (to reproduce "
    "the product GPU's path)");

namespace {

// The documented spelling is --kv-capacity-tokens; absl flags are identifiers, so dashes in a
// flag's name become underscores (values are left alone).
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t k = 2; k < end; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
  }
  return args;
}

absl::StatusOr<verifyd::ServiceOptions> OptionsFromFlags() {
  verifyd::ServiceOptions o;
  o.device = absl::GetFlag(FLAGS_device);
  o.listen = absl::GetFlag(FLAGS_listen);
  if (o.listen.empty()) o.listen = verifyd::DefaultListenAddress(o.device);
  o.tcp = absl::GetFlag(FLAGS_tcp);
  o.allow_remote = absl::GetFlag(FLAGS_allow_remote);
  o.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  o.health_listen = absl::GetFlag(FLAGS_health_listen);
  o.metrics = absl::GetFlag(FLAGS_metrics);
  absl::StatusOr<verifyd::BackendKind> backend =
      verifyd::ParseBackendKind(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) return backend.status();
  o.backend = *backend;
  o.layers = absl::GetFlag(FLAGS_layers);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.max_tree_nodes = absl::GetFlag(FLAGS_max_tree_nodes);
  o.kv_capacity_tokens = absl::GetFlag(FLAGS_kv_capacity_tokens);
  o.kv_memory_fraction = absl::GetFlag(FLAGS_kv_memory_fraction);
  absl::StatusOr<verifyd::KvDtype> kv_dtype = verifyd::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return kv_dtype.status();
  o.kv_dtype = *kv_dtype;
  o.softmax_scale = static_cast<float>(absl::GetFlag(FLAGS_softmax_scale));
  o.lease_seconds = absl::GetFlag(FLAGS_lease_seconds);
  const std::string graphs = absl::GetFlag(FLAGS_cuda_graphs);
  if (graphs != "on" && graphs != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-graphs = '", graphs, "' must be on or off"));
  }
  o.cuda_graphs = graphs == "on";
  const std::string flash = absl::GetFlag(FLAGS_flash_kernel);
  if (flash != "auto" && flash != "portable") {
    return absl::InvalidArgumentError(
        absl::StrCat("--flash-kernel = '", flash, "' must be auto or portable"));
  }
  o.portable_flash_kernel = flash == "portable";
  o.compaction_chunk_bytes = absl::GetFlag(FLAGS_compaction_chunk_bytes);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.compute_threads = absl::GetFlag(FLAGS_compute_threads);
  o.max_sequences = absl::GetFlag(FLAGS_max_sequences);
  o.max_slot_table_entries = absl::GetFlag(FLAGS_max_slot_table_entries);
  o.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  o.shutdown_delay_seconds = absl::GetFlag(FLAGS_shutdown_delay_seconds);
  o.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  o.max_channels = absl::GetFlag(FLAGS_max_channels);
  o.max_channel_bytes = absl::GetFlag(FLAGS_max_channel_bytes);
  o.max_external_regions = absl::GetFlag(FLAGS_max_external_regions);
  o.shm_max_bytes = absl::GetFlag(FLAGS_shm_max_bytes);
  o.shm_max_region_bytes = absl::GetFlag(FLAGS_shm_max_region_bytes);
  absl::Status valid = verifyd::ValidateServiceOptions(o);
  if (!valid.ok()) return valid;
  valid = verifyd::CheckBackendCompiled(o.backend);
  if (!valid.ok()) return valid;
  return o;
}

// gRPC 1.51's listener gives up after one failed accept, and every connection is a descriptor:
// take the whole hard limit the supervisor allows (systemd's LimitNOFILE, a container's ulimit).
void RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Every kernel loaded when CUDA starts, not at its first launch: loading a kernel lazily waits
  // for the device, and a device stream may be waiting on a flag that only a scheduler (or the
  // channel sweeper's release, which needs the driver lock the loading thread holds) will write.
  // A scheduler killed mid-step deadlocked the daemon that way on the H200 (plans/0018). Set
  // before anything touches CUDA; it changes when kernels load, not what they compute.
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/1);
  absl::SetProgramUsageMessage(
      "verifyd: per-GPU verify attention for tree speculative decoding (MLA)\n"
      "usage: verifyd [--listen=unix:///run/verifyd/verifyd-0.sock] [--backend=cuda] ...");
  // --help lists the daemon's flags (absl's default looks for a file named after the binary);
  // --version prints the build's version.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "service/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return std::string("verifyd ") + VERIFYD_VERSION + "\n"; };
  absl::SetFlagsUsageConfig(usage);
  std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());

  namespace event_log = verifyd::event_log;
  if (absl::Status level = event_log::SetLevel(absl::GetFlag(FLAGS_log_level)); !level.ok()) {
    event_log::Error("bad_flags", absl::StrCat("reason=", event_log::Quote(level.message())));
    return 2;
  }
  event_log::SetRefusedEvery(absl::GetFlag(FLAGS_log_refused_every));
  absl::StatusOr<verifyd::ServiceOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    event_log::Error("bad_flags",
                     absl::StrCat("reason=", event_log::Quote(options.status().message())));
    return 2;
  }

  RaiseDescriptorLimit();
  // Every thread started from here on inherits the mask, so only sigwait below sees the signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  verifyd::VerifydServer server(*options);
  if (absl::Status started = server.Start(); !started.ok()) {
    event_log::Error("start_failed", absl::StrCat("reason=", event_log::Quote(started.message())));
    return 1;
  }
  if (absl::Status ready = server.BecomeReady(); !ready.ok()) {
    event_log::Error("start_failed", absl::StrCat("reason=", event_log::Quote(ready.message())));
    server.Shutdown();
    return 1;
  }
  // stdout: the machine-read startup line (tests/lib/daemon.sh); the log: the same, as an event.
  std::cout << server.StartupLine() << std::endl;
  const std::string line = server.StartupLine();
  event_log::Info("start",
                  absl::StrCat("listen=", absl::StripPrefix(line, "verifyd listening on ")));
  verifyd::SystemdNotifier systemd(
      [&server](absl::Duration timeout) { return server.Probe(timeout); });
  systemd.Ready(server.StartupLine());

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  event_log::Info("draining", absl::StrCat("signal=", event_log::Quote(strsignal(signal_number))));
  systemd.Stopping();
  server.Shutdown();
  event_log::Info("stopped", "");
  return 0;
}
