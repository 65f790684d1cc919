// The daemon's listening sockets, bound by us (and accepted by service/acceptor.h) rather than by
// gRPC:
// - The Unix socket is created inside a fresh 0700 directory next to its path, given mode 0660
//   there, and renamed into place, so no other user can ever connect through a window with a
//   looser mode (gRPC binds under the process umask and we chmod afterwards: 0777 under umask
//   000; issue 17).
// - A TCP address (--tcp, --health-listen) binds every address its host resolves to (localhost:
//   127.0.0.1 and ::1) on one port, the one asked or, for port 0, the one the first bind got:
//   gRPC's own listener bound "localhost:0" on two ports and reported one (issue 33 N12).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace verifyd {

// Binds and listens on `path` (mode 0660); the socket is non-blocking and close-on-exec. A stale
// socket file (nothing accepts on it) is replaced; a live daemon's socket or any other kind of
// file is refused, naming `flag`.
absl::StatusOr<int> BindUnixSocket(const std::string& path, const char* flag);

struct TcpSockets {
  std::vector<int> fds;  // listening, non-blocking, close-on-exec
  int port = 0;          // the port every one of them is bound to
};
// Binds and listens on `host:port` / `[v6]:port` (a numeric address or a name the resolver
// knows), every address of the host on the same port; UNAVAILABLE naming `flag` when none binds.
absl::StatusOr<TcpSockets> BindTcp(const std::string& address, const char* flag);

}  // namespace verifyd
