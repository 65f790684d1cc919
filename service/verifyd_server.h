// VerifydServer: the daemon's life cycle. Start() binds gRPC (health NOT_SERVING) and the metrics
// exporter; BecomeReady() builds the backend and the device, then reports SERVING; Shutdown()
// drains (NOT_SERVING, optional delay, server shutdown with a deadline, executor drain).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "base/descriptor_budget.h"
#include "executor/device.h"
#include "grpcpp/server.h"
#include "prometheus/exposer.h"
#include "service/acceptor.h"
#include "service/process_metrics.h"
#include "service/service_metrics.h"
#include "service/service_options.h"
#include "service/shared_memory_registry.h"
#include "service/shm_instance.h"
#include "service/verify_poller.h"
#include "service/verifyd_service.h"

namespace verifyd {

// The health service names that report readiness: overall and the Verifyd service.
inline constexpr char kHealthServiceName[] = "verifyd.v1.Verifyd";

class VerifydServer {
 public:
  explicit VerifydServer(ServiceOptions options);
  ~VerifydServer();

  absl::Status Start();
  absl::Status BecomeReady();
  void Shutdown();
  // OK when the device thread runs a task within `timeout` (queued ahead of waiting requests, as
  // Stats): the liveness check behind systemd's watchdog.
  absl::Status Probe(absl::Duration timeout);

  // After Start: the bound addresses (ports resolved when 0 was asked).
  const std::string& listen_address() const { return options_.listen; }
  std::string tcp_address() const;
  std::string health_address() const;
  std::string metrics_address() const;
  // After BecomeReady: "verifyd listening on ... backend=cpu ...".
  std::string StartupLine() const;
  ServiceMetrics& metrics() { return *metrics_; }
  // After Start: the shared-memory regions (tests look at their count and bytes).
  SharedMemoryRegistry& shared_memory() { return *regions_; }
  // After Start: what the names of this run's /dev/shm files start with (ShmInstance::prefix;
  // the soak bounds their count and bytes).
  const std::string& shm_prefix() const { return shm_instance_->prefix(); }
  // After BecomeReady: the device (tests hold its executor to order calls around it).
  Device* device() const { return device_.get(); }

 private:
  void SetServing(bool serving);

  ServiceOptions options_;
  std::string backend_name_ = "none";
  bool mps_active_ = false;
  std::string attention_kernel_ = "none";
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<ProcessMetrics> process_metrics_;
  std::atomic<Device*> device_for_metrics_{nullptr};  // read by scrapes on the exposer's thread
  // This run's share of /dev/shm: the names, the lock, the sweep of dead daemons' files.
  std::unique_ptr<ShmInstance> shm_instance_;
  std::unique_ptr<SharedMemoryRegistry> regions_;
  std::unique_ptr<VerifydService> service_;
  std::unique_ptr<grpc::Server> server_;
  // The process's descriptors, for the acceptor's and the data plane's bound (issue 33 N6).
  std::unique_ptr<DescriptorBudget> descriptors_;
  // Every listening socket of ours (--listen's unix:, --tcp, --health-listen).
  std::unique_ptr<Acceptor> acceptor_;
  std::string socket_path_;  // --listen's Unix socket, removed at shutdown
  std::unique_ptr<VerifyPoller> verify_poller_;
  std::unique_ptr<grpc::Server> health_server_;  // --health-listen
  std::unique_ptr<Device> device_;
  int tcp_port_ = 0;
  int health_port_ = 0;
  bool shut_down_ = false;
};

// The filesystem path of a "unix:" gRPC address ("" for any other scheme).
std::string UnixSocketPath(const std::string& address);

}  // namespace verifyd
