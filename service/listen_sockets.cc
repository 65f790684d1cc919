#include "service/listen_sockets.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "service/service_options.h"

namespace verifyd {
namespace {

bool FillAddress(const std::string& path, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr->sun_path)) return false;
  std::memcpy(addr->sun_path, path.c_str(), path.size() + 1);
  return true;
}

// True when something accepts connections on the socket file (a live daemon, not a stale file).
bool SocketIsLive(const std::string& path) {
  sockaddr_un addr;
  if (!FillAddress(path, &addr)) return false;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return live;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// One bind of `ai` on `port`: the listening socket, or -1 with errno set.
int BindOne(const addrinfo* ai, int port, bool v6_only) {
  const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage addr{};
  std::memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
  if (ai->ai_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
    const int only = v6_only ? 1 : 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof(only));
  } else {
    reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), ai->ai_addrlen) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return 0;
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

absl::StatusOr<int> BindUnixSocket(const std::string& path, const char* flag) {
  sockaddr_un final_addr;
  if (!FillAddress(path, &final_addr)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is longer than ",
                                                   sizeof(final_addr.sun_path) - 1, " bytes"));
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": '", path, "' exists and is not a socket"));
    }
    if (SocketIsLive(path)) {
      return absl::AlreadyExistsError(
          absl::StrCat(flag, ": another process is serving on '", path, "'"));
    }
  }
  // A directory only we can enter: the socket exists there before its mode is final.
  std::string dir = absl::StrCat(Dirname(path), "/.verifyd-bind-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(flag, ": cannot create a directory in '",
                                                    Dirname(path), "': ", strerror(errno)));
  }
  const std::string staged = dir + "/s";
  sockaddr_un staged_addr;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  absl::Status status;
  if (fd < 0 || !FillAddress(staged, &staged_addr) ||
      bind(fd, reinterpret_cast<sockaddr*>(&staged_addr), sizeof(staged_addr)) != 0) {
    status =
        absl::UnavailableError(absl::StrCat(flag, ": cannot bind '", path, "': ", strerror(errno)));
  } else if (chmod(staged.c_str(), 0660) != 0) {
    status = absl::InternalError(absl::StrCat(flag, ": chmod 0660 failed: ", strerror(errno)));
  } else if (listen(fd, SOMAXCONN) != 0) {
    status = absl::UnavailableError(absl::StrCat(flag, ": listen failed: ", strerror(errno)));
  } else if (rename(staged.c_str(), path.c_str()) != 0) {
    // Replaces a stale socket file atomically; fails on a directory we may not write.
    status = absl::PermissionDeniedError(
        absl::StrCat(flag, ": cannot move the socket to '", path, "': ", strerror(errno)));
  }
  unlink(staged.c_str());  // left only when something failed before the rename
  rmdir(dir.c_str());
  if (!status.ok()) {
    if (fd >= 0) close(fd);
    return status;
  }
  return fd;
}

absl::StatusOr<TcpSockets> BindTcp(const std::string& address, const char* flag) {
  std::string host;
  int port = 0;
  absl::Status split = SplitHostPort(address, flag, &host, &port);
  if (!split.ok()) return split;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int err = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found);
      err != 0) {
    return absl::UnavailableError(
        absl::StrCat(flag, " = '", address, "': cannot resolve '", host, "': ", gai_strerror(err)));
  }
  bool has_v4 = false;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next)
    has_v4 |= ai->ai_family == AF_INET;
  // Port 0: the kernel's pick for the first address may be taken on another; a few tries.
  auto refused = [&](int err) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", flag, " = '", address, "': ", strerror(err)));
  };
  absl::Status status;
  for (int attempt = 0; attempt < 8; ++attempt) {
    TcpSockets sockets;
    sockets.port = port;
    status = absl::OkStatus();
    int skipped = 0;  // errno of an address skipped
    for (const addrinfo* ai = found; ai != nullptr && status.ok(); ai = ai->ai_next) {
      if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
      // With an IPv4 address of its own, an IPv6 socket serves IPv6 only (no double bind).
      const int fd = BindOne(ai, sockets.port, /*v6_only=*/has_v4);
      if (fd < 0) {
        // An address family the host lacks (no IPv6) is skipped while another address binds.
        if (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL) {
          skipped = errno;
          continue;
        }
        status = refused(errno);
        break;
      }
      if (sockets.port == 0) sockets.port = BoundPort(fd);
      sockets.fds.push_back(fd);
    }
    if (status.ok() && !sockets.fds.empty()) {
      freeaddrinfo(found);
      return sockets;
    }
    CloseAll(sockets.fds);
    if (status.ok()) status = refused(skipped != 0 ? skipped : EADDRNOTAVAIL);
    if (port != 0) break;  // a fixed port taken is no race to retry
  }
  freeaddrinfo(found);
  return status;
}

}  // namespace verifyd
