#include "service/verifyd_server.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "service/backend_factory.h"
#include "service/event_log.h"
#include "service/listen_sockets.h"
#include "service/malformed_request_interceptor.h"
#include "service/message_size.h"

#ifndef VERIFYD_VERSION
#define VERIFYD_VERSION "0.0.0"
#endif

namespace verifyd {
namespace {

// False once the process named "pid:<n>" (Acceptor::ClientOf) has ended; true for it while it
// lives (EPERM: it exists, as another user), and for any other client (a TCP address: its end is
// not known here, the lease decides).
bool ClientProcessAlive(const std::string& client) {
  int pid = 0;
  if (!absl::StartsWith(client, "pid:") || !absl::SimpleAtoi(client.substr(4), &pid) || pid <= 0) {
    return true;
  }
  return kill(pid, 0) == 0 || errno != ESRCH;
}

}  // namespace

std::string UnixSocketPath(const std::string& address) {
  if (absl::StartsWith(address, "unix://")) return address.substr(7);
  if (absl::StartsWith(address, "unix:")) return address.substr(5);
  return "";
}

VerifydServer::VerifydServer(ServiceOptions options) : options_(std::move(options)) {}

VerifydServer::~VerifydServer() {
  Shutdown();
  // Scrapes read the device's queue: the exporter goes before the device does.
  exposer_.reset();
}

absl::Status VerifydServer::Start() {
  metrics_ = std::make_unique<ServiceMetrics>();
  metrics_->SetReady(false);
  if (!options_.metrics.empty()) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(options_.metrics);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("--metrics = '", options_.metrics, "' could not be bound: ", e.what()));
    }
    exposer_->RegisterCollectable(metrics_->registry());
    process_metrics_ = std::make_shared<ProcessMetrics>([this] {
      Device* device = device_for_metrics_.load();
      return device != nullptr ? device->queued() : 0;
    });
    exposer_->RegisterCollectable(process_metrics_);
  }

  std::string admin_token;
  if (!options_.admin_token_file.empty()) {
    VERIFYD_ASSIGN_OR_RETURN(admin_token, ReadAdminTokenFile(options_.admin_token_file));
  }
  descriptors_ = std::make_unique<DescriptorBudget>();
  acceptor_ = std::make_unique<Acceptor>(descriptors_.get());
  // Bound before anything else starts, so that a refusal (another daemon on the socket, a port
  // taken) leaves nothing running. The acceptor owns each socket from here on.
  const std::string path = UnixSocketPath(options_.listen);
  if (!path.empty()) {
    VERIFYD_ASSIGN_OR_RETURN(const int fd, BindUnixSocket(path, "--listen"));
    acceptor_->Add(fd, Acceptor::Transport::kUnix, Acceptor::Target::kMain);
    socket_path_ = path;
  }
  if (!options_.tcp.empty()) {
    VERIFYD_ASSIGN_OR_RETURN(const TcpSockets tcp, BindTcp(options_.tcp, "--tcp"));
    for (int fd : tcp.fds) acceptor_->Add(fd, Acceptor::Transport::kTcp, Acceptor::Target::kMain);
    tcp_port_ = tcp.port;
  }
  if (!options_.health_listen.empty()) {
    VERIFYD_ASSIGN_OR_RETURN(const TcpSockets health,
                             BindTcp(options_.health_listen, "--health-listen"));
    for (int fd : health.fds) {
      acceptor_->Add(fd, Acceptor::Transport::kTcp, Acceptor::Target::kHealth);
    }
    health_port_ = health.port;
  }
  VERIFYD_ASSIGN_OR_RETURN(shm_instance_, ShmInstance::Create(options_.device));
  if (shm_instance_->swept_files() > 0) {
    std::cerr << "verifyd: removed " << shm_instance_->swept_files() << " files ("
              << shm_instance_->swept_bytes() << " bytes) that dead daemons of device "
              << options_.device << " left in /dev/shm\n";
  }
  SharedMemoryLimits shm_limits;
  shm_limits.max_total_bytes = options_.shm_max_bytes;
  shm_limits.max_region_bytes = options_.shm_max_region_bytes;
  // A lone client (process) may hold half the budget, and at least one region of the largest
  // size; with others holding some, half of what they leave: one scheduler, or two dead
  // incarnations of one, cannot lock the others out (plans/0015, issue 33 N11).
  shm_limits.max_client_bytes = std::max(
      options_.shm_max_bytes / 2, std::min(options_.shm_max_region_bytes, options_.shm_max_bytes));
  // A client's regions go at the next sweep once its process has ended, not at the lease.
  shm_limits.client_alive = [](const std::string& client) { return ClientProcessAlive(client); };
  shm_limits.descriptors = descriptors_.get();
  shm_limits.lease = absl::Seconds(options_.lease_seconds);
  shm_limits.name_prefix = shm_instance_->prefix();
  regions_ = std::make_unique<SharedMemoryRegistry>(shm_limits);
  // Expiry lags a lease by at most a quarter of it, as for sequences.
  regions_->StartLeaseSweeper(std::clamp(absl::Seconds(options_.lease_seconds) / 4,
                                         absl::Milliseconds(20), absl::Milliseconds(250)));
  Acceptor* acceptor = acceptor_.get();
  service_ = std::make_unique<VerifydService>(
      options_, std::move(admin_token), metrics_.get(), regions_.get(),
      [acceptor](const std::string& peer) { return acceptor->ClientOf(peer); },
      [acceptor](const std::string& peer) { return acceptor->IsOwner(peer); });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Above --max-message-bytes: the handlers refuse and count what lies between (message_size.h).
  builder.SetMaxReceiveMessageSize(ReceiveCeiling(options_.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
  // The Unix socket and TCP are ours to accept on (Acceptor); any other --listen URI is gRPC's.
  if (path.empty()) builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MalformedRequestInterceptorFactory>(metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // The poller owns its queue from here on, so that every return below leaves it to Shutdown.
  verify_poller_ = std::make_unique<VerifyPoller>(
      service_.get(), builder.AddCompletionQueue(),
      absl::Microseconds(ExecutorSpinMicros(options_.executor_spin_us)));
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    verify_poller_->Stop();
    return absl::UnavailableError(
        absl::StrCat("could not listen on --listen = '", options_.listen, "'"));
  }
  verify_poller_->Start();
  if (!options_.health_listen.empty()) {
    // Health only, for probes from outside the host (the kubelet): nothing else is registered.
    grpc::ServerBuilder health_builder;
    health_server_ = health_builder.BuildAndStart();
    if (health_server_ == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("could not serve --health-listen = '", options_.health_listen, "'"));
    }
  }
  acceptor_->Start(server_.get(), health_server_.get());
  SetServing(false);
  return absl::OkStatus();
}

absl::Status VerifydServer::BecomeReady() {
  if (server_ == nullptr) return absl::FailedPreconditionError("BecomeReady before Start");
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<ComputeBackend> backend, CreateBackend(options_));
  backend_name_ = backend->name();
  mps_active_ = backend->mps_active();
  attention_kernel_ = backend->attention_kernel();
  metrics_->SetBuildInfo(VERIFYD_VERSION, backend_name_);
  metrics_->SetMpsActive(mps_active_);
  metrics_->SetDeviceInfo(options_.device, backend->gpu_uuid());
  // The device owns the backend from here on; the hooks below stop using it (Shutdown clears
  // them) before the device is destroyed.
  ComputeBackend* compute = backend.get();
  VERIFYD_ASSIGN_OR_RETURN(DeviceOptions device_options, BuildDeviceOptions(options_, *backend));
  device_options.descriptors = descriptors_.get();
  device_options.shm_name_prefix = shm_instance_->prefix();
  VERIFYD_ASSIGN_OR_RETURN(device_,
                           Device::Create(device_options, std::move(backend), metrics_.get()));
  if (compute->can_register_host_memory()) {
    // Regions created since Start are registered now, later ones as they are mapped. A refusal
    // (no support, a pinned-memory limit) leaves the region on the staging path: slower, not
    // wrong, so it is only reported, once.
    regions_->SetMappingHooks(SharedMemoryMappingHooks{
        [compute, reported = std::make_shared<std::once_flag>()](void* data, uint64_t bytes) {
          absl::Status registered = compute->RegisterHostMemory(data, bytes);
          if (!registered.ok()) {
            std::call_once(*reported, [&] {
              event_log::Warning(
                  "host_registration_refused",
                  absl::StrCat("effect=\"a shared-memory region's tensors go through host "
                               "staging\" reason=",
                               event_log::Quote(registered.message())));
            });
          }
          return registered;
        },
        [compute](void* data) { compute->UnregisterHostMemory(data); }});
  }
  service_->AttachDevice(device_.get());
  device_for_metrics_.store(device_.get());
  SetServing(true);
  return absl::OkStatus();
}

absl::Status VerifydServer::Probe(absl::Duration timeout) {
  if (device_ == nullptr) return absl::UnavailableError("verifyd is starting");
  auto ran = std::make_shared<std::promise<void>>();
  std::future<void> done = ran->get_future();
  VERIFYD_RETURN_IF_ERROR(device_->SubmitFirst([ran](DeviceOperations&) { ran->set_value(); }));
  if (done.wait_for(absl::ToChronoNanoseconds(timeout)) != std::future_status::ready) {
    return absl::DeadlineExceededError(
        absl::StrCat("the device thread ran no task within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

void VerifydServer::SetServing(bool serving) {
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    grpc::HealthCheckServiceInterface* health =
        server != nullptr ? server->GetHealthCheckService() : nullptr;
    if (health != nullptr) {
      health->SetServingStatus("", serving);
      health->SetServingStatus(kHealthServiceName, serving);
    }
  }
  metrics_->SetReady(serving);
}

void VerifydServer::Shutdown() {
  if (shut_down_) return;
  if (server_ == nullptr) {  // Start failed before gRPC ran: only the sockets may be left
    if (acceptor_ != nullptr) acceptor_->Stop();
    if (!socket_path_.empty()) unlink(socket_path_.c_str());
    shut_down_ = true;
    return;
  }
  shut_down_ = true;
  SetServing(false);
  // Freezes health at NOT_SERVING and ends Watch streams, which would otherwise hold the server
  // shutdown until its deadline.
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    if (server != nullptr && server->GetHealthCheckService() != nullptr) {
      server->GetHealthCheckService()->Shutdown();
    }
  }
  if (options_.shutdown_delay_seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.shutdown_delay_seconds));
  }
  // No new connections from here on (gRPC's Shutdown below closes its own listeners).
  acceptor_->Stop();
  // Stops accepting, lets in-flight calls finish (the executor keeps running them), and cancels
  // what is left at the deadline; it returns once every reactor has finished.
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                        std::chrono::duration<double>(options_.drain_seconds)));
  if (device_ != nullptr) device_->Drain();
  server_->Wait();
  // Every polled Verify has been finished (the drain ran its task): the queue can go.
  verify_poller_->Stop();
  if (health_server_ != nullptr) health_server_->Shutdown(std::chrono::system_clock::now());
  // Every call has finished: nothing maps a region for the daemon any more, and no copy from or
  // into a region is in flight, so the backend may let go of every registration (before the
  // device, which owns it, is destroyed with this server).
  regions_->UnlinkAll();
  regions_->ClearMappingHooks();
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
}

std::string VerifydServer::tcp_address() const {
  if (options_.tcp.empty()) return "";
  std::string host;
  int port = 0;
  if (!SplitHostPort(options_.tcp, "--tcp", &host, &port).ok()) return options_.tcp;
  return absl::StrCat(absl::StrContains(host, ":") ? "[" + host + "]" : host, ":", tcp_port_);
}

std::string VerifydServer::health_address() const {
  if (options_.health_listen.empty()) return "";
  std::string host;
  int port = 0;
  if (!SplitHostPort(options_.health_listen, "--health-listen", &host, &port).ok()) {
    return options_.health_listen;
  }
  return absl::StrCat(absl::StrContains(host, ":") ? "[" + host + "]" : host, ":", health_port_);
}

std::string VerifydServer::metrics_address() const {
  if (exposer_ == nullptr) return "";
  std::string host;
  int port = 0;
  if (!SplitHostPort(options_.metrics, "--metrics", &host, &port).ok()) return options_.metrics;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  return absl::StrCat(host, ":", ports.empty() ? port : ports.front());
}

std::string VerifydServer::StartupLine() const {
  std::string line = absl::StrCat("verifyd listening on ", options_.listen);
  if (!options_.tcp.empty()) absl::StrAppend(&line, " tcp=", tcp_address());
  if (!options_.health_listen.empty()) absl::StrAppend(&line, " health=", health_address());
  absl::StrAppend(&line, " metrics=",
                  exposer_ ? absl::StrCat("http://", metrics_address(), "/metrics") : "off");
  absl::StrAppendFormat(
      &line,
      " backend=%s attention_kernel=%s mps=%s device=%d layers=%d heads=%d max_tree_nodes=%d "
      "kv_capacity_tokens=%d kv_dtype=%s kv_bytes_per_token=%d softmax_scale=%g "
      "lease_seconds=%g shm_max_bytes=%d version=%s",
      backend_name_, attention_kernel_, mps_active_ ? "on" : "off", options_.device,
      options_.layers, options_.heads, options_.max_tree_nodes,
      device_ != nullptr ? device_->capacity_slots() : options_.kv_capacity_tokens,
      KvDtypeName(options_.kv_dtype), KvRowBytes(options_.kv_dtype), options_.softmax_scale,
      options_.lease_seconds, options_.shm_max_bytes, VERIFYD_VERSION);
  return line;
}

}  // namespace verifyd
