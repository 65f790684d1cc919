// Acceptor: one thread of ours accepts on every listening socket of the daemon (the Unix socket,
// --tcp, --health-listen) and hands each connection to its gRPC server
// (AddInsecureChannelFromFd). gRPC 1.51's own listener gives up for good after one failed accept
// (EMFILE): a burst of connections beyond the descriptor limit left a daemon that never accepted
// again and still reported ready (issue 17 D1 for the Unix socket, issue 33 N4 for TCP and the
// health port the liveness probe aims at). Here a failed accept is retried, and a connection that
// would leave fewer than the budget's reserve of descriptors free is closed at once (the client
// sees UNAVAILABLE and retries), so the daemon keeps what its own work needs.
//
// Each connection is recorded before gRPC sees it: its calls carry the peer "fd:<n>", and the
// record says which transport it came on (the gate's owner check, call_gate.h) and who is behind
// it (SO_PEERCRED's pid on the Unix socket, the address on TCP). A reused descriptor number
// always names its current connection. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/descriptor_budget.h"
#include "grpcpp/server.h"

namespace verifyd {

class Acceptor {
 public:
  enum class Transport { kUnix, kTcp };
  // Which server a socket's connections go to: the daemon's, or the health-only one.
  enum class Target { kMain, kHealth };
  explicit Acceptor(DescriptorBudget* budget);
  ~Acceptor();  // Stop()
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Before Start: a bound, listening socket (owned from here on, closed by Stop or destruction)
  // whose connections go to `target`'s server.
  void Add(int listening_fd, Transport transport, Target target);
  // Accepts on a thread of its own; the servers are started (health may be null when no socket
  // targets it).
  void Start(grpc::Server* main, grpc::Server* health);
  // Stops accepting and closes the listening sockets; connections already handed over stay.
  void Stop();

  // The client behind a call's peer: "pid:<n>" for a Unix connection, the address ("ipv4:..."/
  // "ipv6:...") for a TCP one, else the peer itself.
  std::string ClientOf(const std::string& peer) const;
  // A call on the owner's transport: a Unix connection of ours, or gRPC's own "unix:" peer.
  bool IsOwner(const std::string& peer) const;

  // Connections closed at once because descriptors ran short, and failed accepts (retried).
  int64_t refused() const { return refused_.load(); }
  int64_t accept_errors() const { return accept_errors_.load(); }

 private:
  struct Listening {
    int fd;
    Transport transport;
    Target target;
  };
  struct Connection {
    bool live = false;
    Transport transport = Transport::kUnix;
    std::string client;  // "pid:<n>" or the TCP address
  };
  void Loop();
  void AcceptOne(const Listening& listening);
  // The record of "fd:<n>", if it is one of ours (caller holds mu_).
  const Connection* Find(const std::string& peer) const;

  DescriptorBudget* budget_;
  std::vector<Listening> listening_;
  grpc::Server* servers_[2] = {nullptr, nullptr};  // by Target
  int wake_[2] = {-1, -1};  // a pipe: Stop writes to it to end the accept loop
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<Connection> connections_;  // by descriptor number
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> accept_errors_{0};
};

}  // namespace verifyd
