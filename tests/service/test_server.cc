#include "tests/service/test_server.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"

namespace verifyd::testing {

std::string TempSocketAddress(const std::string& tag) {
  static std::atomic<int> counter{0};
  return absl::StrCat("unix:///tmp/verifyd-test-", getpid(), "-", tag, "-", counter++, ".sock");
}

std::string WriteTokenFile(const std::string& token) {
  static std::atomic<int> counter{0};
  std::string path = absl::StrCat("/tmp/verifyd-test-token-", getpid(), "-", counter++);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    const std::string text = token + "\n";
    if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) path.clear();
    close(fd);
  }
  return path;
}

ServiceOptions SmallOptions(const std::string& tag) {
  ServiceOptions o;
  o.listen = TempSocketAddress(tag);
  o.metrics = "";
  o.layers = 3;
  o.heads = 4;
  o.max_tree_nodes = 64;
  o.kv_capacity_tokens = 4096;
  o.softmax_scale = 0.0625f;
  o.compute_threads = 2;
  o.compaction_chunk_bytes = 16 * 3 * 1152;  // a few chunks per operation in the tests
  return o;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

TestServer::TestServer(const ServiceOptions& options)
    : server_(std::make_unique<VerifydServer>(options)) {
  status_ = server_->Start();
  if (status_.ok()) status_ = server_->BecomeReady();
  channel_ = MakeChannel(options.listen);
  stub_ = v1::Verifyd::NewStub(channel_);
}

TestServer::~TestServer() { server_->Shutdown(); }

}  // namespace verifyd::testing
