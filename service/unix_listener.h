// UnixListener: the daemon's Unix socket, bound and accepted by us instead of gRPC, for two
// reasons (issue 17, plans/0015):
// - Binding: the socket is created inside a fresh 0700 directory next to its path, given mode
//   0660 there, and renamed into place, so no other user can ever connect through a window with a
//   looser mode (gRPC binds under the process umask and we chmod afterwards: 0777 under umask 000).
// - Accepting: gRPC 1.51's listener gives up for good after one failed accept (EMFILE), so a
//   burst of connections beyond the descriptor limit left a daemon that never accepted again and
//   still reported ready. Here a failed accept is retried, and a connection that would leave fewer
//   than `reserve` free descriptors is closed at once (the client sees UNAVAILABLE and retries),
//   so the daemon keeps the descriptors its own work needs (shared-memory maps, metrics).
// Each accepted connection is handed to gRPC (AddInsecureChannelFromFd); its calls carry the peer
// "fd:<n>", which call_gate.h counts as the owner's transport.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"

namespace verifyd {

class UnixListener {
 public:
  // Binds `path` (mode 0660). A stale socket file (nothing accepts on it) is replaced; a live
  // daemon's socket or any other kind of file is refused.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path);
  ~UnixListener();  // Stop()
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Accepts on a thread of its own and hands every connection to `server` (started).
  void Start(grpc::Server* server);
  // Stops accepting and closes the listening socket; connections already handed over stay.
  void Stop();
  // Removes the socket file.
  void Unlink();

  // Who is behind a call's peer: "pid:<n>" (SO_PEERCRED at accept) for a connection this listener
  // accepted ("fd:<n>"), else the peer itself. Connections are recorded before gRPC gets them,
  // so a reused descriptor number always names its current connection.
  std::string ClientOf(const std::string& peer) const;

  // Connections closed at once because descriptors ran short, and failed accepts (retried).
  int64_t refused() const { return refused_.load(); }
  int64_t accept_errors() const { return accept_errors_.load(); }

 private:
  UnixListener(std::string path, int fd);
  void Loop(grpc::Server* server);

  const std::string path_;
  int fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: Stop writes to it to end the accept loop
  std::thread thread_;
  mutable std::mutex pids_mu_;
  std::vector<int> pids_;  // by descriptor number
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> accept_errors_{0};
};

// Descriptors the process holds now (/proc/self/fd), and its soft limit.
int64_t OpenDescriptors();
int64_t DescriptorLimit();

}  // namespace verifyd
