// An in-process verifyd on a temporary Unix socket, and a raw generated stub to it.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "service/service_options.h"
#include "service/verifyd_server.h"
#include "verifyd/v1/verifyd.grpc.pb.h"

namespace verifyd::testing {

// unix:///tmp/verifyd-test-<pid>-<tag>-<n>.sock, unique per call.
std::string TempSocketAddress(const std::string& tag);

// Writes `token` and a newline to a new 0600 file under /tmp; returns its path.
std::string WriteTokenFile(const std::string& token);

// Small geometry that keeps the CPU backend fast: 3 layers, 4 heads, 2 threads.
ServiceOptions SmallOptions(const std::string& tag);

class TestServer {
 public:
  explicit TestServer(const ServiceOptions& options);
  ~TestServer();
  absl::Status status() const { return status_; }
  v1::Verifyd::Stub& stub() { return *stub_; }
  VerifydServer& server() { return *server_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

 private:
  absl::Status status_;
  std::unique_ptr<VerifydServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Verifyd::Stub> stub_;
};

// A channel without the default 4 MiB receive limit.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

}  // namespace verifyd::testing
