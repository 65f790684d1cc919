// verifyd: flags -> ServiceOptions -> VerifydServer; SIGTERM/SIGINT drain and exit 0.
// Exit codes: 0 clean shutdown, 1 startup failure, 2 invalid flags.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "service/backend_factory.h"
#include "service/service_options.h"
#include "service/verifyd_server.h"

ABSL_FLAG(std::string, listen, "",
          "gRPC address of the Unix socket (default unix:///tmp/verifyd-<device>.sock)");
ABSL_FLAG(std::string, tcp, "", "optional host:port for TCP (loopback unless --allow-remote)");
ABSL_FLAG(bool, allow_remote, false, "allow --tcp on a non-loopback address");
ABSL_FLAG(std::string, admin_token, "",
          "token required in metadata x-verifyd-admin-token for Compact over TCP");
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
ABSL_FLAG(double, softmax_scale, 1.0 / std::sqrt(192.0), "default attention scale");
ABSL_FLAG(double, lease_seconds, 300, "a sequence untouched this long is released");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20, "gRPC receive and send limit");
ABSL_FLAG(int, compute_threads, 0, "cpu backend threads (0: every core)");
ABSL_FLAG(int, max_queued_requests, 1024,
          "requests waiting for the device beyond this get RESOURCE_EXHAUSTED");
ABSL_FLAG(double, shutdown_delay_seconds, 0,
          "after SIGTERM, seconds health reports NOT_SERVING before the socket closes");
ABSL_FLAG(double, drain_seconds, 30, "after that, seconds in-flight calls get to finish");
ABSL_FLAG(int64_t, compaction_chunk_bytes, 0,
          "most bytes one compaction step copies between requests (0: 4 MiB cpu, 256 MiB cuda)");
ABSL_FLAG(int64_t, shm_max_bytes, int64_t{1} << 30,
          "shared memory for tensors: most bytes over all regions (0 disables it)");
ABSL_FLAG(int64_t, shm_max_region_bytes, int64_t{256} << 20,
          "shared memory for tensors: most bytes of one region");
ABSL_FLAG(bool, run_idle_inline, false,
          "a request that finds the device idle runs on the receiving gRPC thread (no queue hop)");
ABSL_FLAG(int64_t, executor_spin_us, -1,
          "after each request the device thread polls this long for the next before sleeping "
          "(0: sleep at once; -1: 2000 on hosts with >= 8 cores, else 0)");
ABSL_FLAG(std::string, verify_handler, "polled",
          "polled|callback: Verify's gRPC handler (polled: a thread of ours polls a "
          "completion queue; plans/0012)");
ABSL_FLAG(std::string, cuda_graphs, "on",
          "on|off: replay the per-step work as CUDA graphs per shape bucket (cuda backend)");

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
  o.admin_token = absl::GetFlag(FLAGS_admin_token);
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
  o.softmax_scale = static_cast<float>(absl::GetFlag(FLAGS_softmax_scale));
  o.lease_seconds = absl::GetFlag(FLAGS_lease_seconds);
  const std::string graphs = absl::GetFlag(FLAGS_cuda_graphs);
  if (graphs != "on" && graphs != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-graphs = '", graphs, "' must be on or off"));
  }
  o.cuda_graphs = graphs == "on";
  o.compaction_chunk_bytes = absl::GetFlag(FLAGS_compaction_chunk_bytes);
  o.run_idle_inline = absl::GetFlag(FLAGS_run_idle_inline);
  o.executor_spin_us = absl::GetFlag(FLAGS_executor_spin_us);
  if (o.executor_spin_us < -1 || o.executor_spin_us > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat("--executor-spin-us = ", o.executor_spin_us,
                                                   " must be -1 (auto) or in [0, 1000000]"));
  }
  const std::string verify_handler = absl::GetFlag(FLAGS_verify_handler);
  if (verify_handler == "polled") {
    o.verify_handler = verifyd::VerifyHandler::kPolled;
  } else if (verify_handler == "callback") {
    o.verify_handler = verifyd::VerifyHandler::kCallback;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--verify-handler = '", verify_handler, "' must be polled or callback"));
  }
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.compute_threads = absl::GetFlag(FLAGS_compute_threads);
  o.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  o.shutdown_delay_seconds = absl::GetFlag(FLAGS_shutdown_delay_seconds);
  o.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  o.shm_max_bytes = absl::GetFlag(FLAGS_shm_max_bytes);
  o.shm_max_region_bytes = absl::GetFlag(FLAGS_shm_max_region_bytes);
  absl::Status valid = verifyd::ValidateServiceOptions(o);
  if (!valid.ok()) return valid;
  valid = verifyd::CheckBackendCompiled(o.backend);
  if (!valid.ok()) return valid;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "verifyd: per-GPU verify attention for tree speculative decoding (MLA)");
  std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());

  absl::StatusOr<verifyd::ServiceOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "verifyd: " << options.status().message() << "\n";
    return 2;
  }

  // Every thread started from here on inherits the mask, so only sigwait below sees the signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  verifyd::VerifydServer server(*options);
  if (absl::Status started = server.Start(); !started.ok()) {
    std::cerr << "verifyd: " << started.message() << "\n";
    return 1;
  }
  if (absl::Status ready = server.BecomeReady(); !ready.ok()) {
    std::cerr << "verifyd: " << ready.message() << "\n";
    server.Shutdown();
    return 1;
  }
  std::cout << server.StartupLine() << std::endl;

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::cout << "verifyd: " << strsignal(signal_number) << ", draining" << std::endl;
  server.Shutdown();
  std::cout << "verifyd: stopped" << std::endl;
  return 0;
}
