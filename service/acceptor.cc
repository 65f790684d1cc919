#include "service/acceptor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/server_posix.h"

namespace verifyd {
namespace {

// "ipv4:127.0.0.1:5000" / "ipv6:[::1]:5000", as gRPC names TCP peers.
std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return "tcp:unknown";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    return absl::StrCat("ipv6:[", text, "]:", ntohs(v6->sin6_port));
  }
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(&addr);
  inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
  return absl::StrCat("ipv4:", text, ":", ntohs(v4->sin_port));
}

}  // namespace

Acceptor::Acceptor(DescriptorBudget* budget) : budget_(budget) {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
}

Acceptor::~Acceptor() {
  Stop();
  if (wake_[0] >= 0) close(wake_[0]);
  if (wake_[1] >= 0) close(wake_[1]);
}

void Acceptor::Add(int listening_fd, Transport transport, Target target) {
  listening_.push_back({listening_fd, transport, target});
}

void Acceptor::Start(grpc::Server* main, grpc::Server* health) {
  servers_[static_cast<int>(Target::kMain)] = main;
  servers_[static_cast<int>(Target::kHealth)] = health;
  thread_ = std::thread([this] { Loop(); });
}

void Acceptor::Stop() {
  if (thread_.joinable()) {
    const char byte = 0;
    if (write(wake_[1], &byte, 1) < 0) {
      // The pipe is non-blocking and read by nobody else: it cannot be full; nothing to do.
    }
    thread_.join();
  }
  for (const Listening& l : listening_) close(l.fd);
  listening_.clear();
}

const Acceptor::Connection* Acceptor::Find(const std::string& peer) const {
  int fd = -1;
  if (!peer.starts_with("fd:") || !absl::SimpleAtoi(peer.substr(3), &fd) || fd < 0 ||
      static_cast<size_t>(fd) >= connections_.size() || !connections_[fd].live) {
    return nullptr;
  }
  return &connections_[fd];
}

std::string Acceptor::ClientOf(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Connection* c = Find(peer);
  return c != nullptr && !c->client.empty() ? c->client : peer;
}

bool Acceptor::IsOwner(const std::string& peer) const {
  if (peer.starts_with("unix:")) return true;
  std::lock_guard<std::mutex> lock(mu_);
  const Connection* c = Find(peer);
  return c != nullptr && c->transport == Transport::kUnix;
}

void Acceptor::Loop() {
  std::vector<pollfd> fds;
  for (const Listening& l : listening_) fds.push_back({l.fd, POLLIN, 0});
  fds.push_back({wake_[0], POLLIN, 0});
  for (;;) {
    for (pollfd& p : fds) p.revents = 0;
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds.back().revents != 0) return;
    for (size_t i = 0; i < listening_.size(); ++i) {
      if (fds[i].revents != 0) AcceptOne(listening_[i]);
    }
  }
}

void Acceptor::AcceptOne(const Listening& listening) {
  const int conn = accept4(listening.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (conn < 0) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;
    // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog; try again soon
    // instead of giving up the listener (what gRPC's own does).
    ++accept_errors_;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return;
  }
  if (!budget_->HasRoom(1, conn)) {
    ++refused_;
    close(conn);
    return;
  }
  budget_->Opened(1);
  Connection record;
  record.live = true;
  record.transport = listening.transport;
  if (listening.transport == Transport::kUnix) {
    ucred cred{};
    socklen_t length = sizeof(cred);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0 && cred.pid > 0) {
      record.client = absl::StrCat("pid:", cred.pid);
    }
  } else {
    record.client = PeerAddress(conn);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<size_t>(conn) >= connections_.size()) connections_.resize(conn + 1);
    connections_[conn] = std::move(record);
  }
  grpc::AddInsecureChannelFromFd(servers_[static_cast<int>(listening.target)], conn);
}

}  // namespace verifyd
