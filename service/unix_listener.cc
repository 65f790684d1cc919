#include "service/unix_listener.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/server_posix.h"

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

// Free descriptors a connection must leave: the daemon's own work (a shared-memory region maps
// one at a time, the metrics exporter serves scrapes, gRPC makes wake-up fds per thread).
int64_t ReserveFor(int64_t limit) { return std::clamp<int64_t>(limit / 8, 16, 256); }

}  // namespace

int64_t OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int64_t count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own descriptor
}

int64_t DescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<int64_t>(limit.rlim_cur);
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(const std::string& path) {
  sockaddr_un final_addr;
  if (!FillAddress(path, &final_addr)) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: '", path, "' is longer than ",
                                                   sizeof(final_addr.sun_path) - 1, " bytes"));
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--listen: '", path, "' exists and is not a socket"));
    }
    if (SocketIsLive(path)) {
      return absl::AlreadyExistsError(
          absl::StrCat("--listen: another process is serving on '", path, "'"));
    }
  }
  // A directory only we can enter: the socket exists there before its mode is final.
  std::string dir = absl::StrCat(Dirname(path), "/.verifyd-bind-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("--listen: cannot create a directory in '",
                                                    Dirname(path), "': ", strerror(errno)));
  }
  const std::string staged = dir + "/s";
  sockaddr_un staged_addr;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  absl::Status status;
  if (fd < 0 || !FillAddress(staged, &staged_addr) ||
      bind(fd, reinterpret_cast<sockaddr*>(&staged_addr), sizeof(staged_addr)) != 0) {
    status = absl::UnavailableError(
        absl::StrCat("--listen: cannot bind '", path, "': ", strerror(errno)));
  } else if (chmod(staged.c_str(), 0660) != 0) {
    status = absl::InternalError(absl::StrCat("--listen: chmod 0660 failed: ", strerror(errno)));
  } else if (listen(fd, SOMAXCONN) != 0) {
    status = absl::UnavailableError(absl::StrCat("--listen: listen failed: ", strerror(errno)));
  } else if (rename(staged.c_str(), path.c_str()) != 0) {
    // Replaces a stale socket file atomically; fails on a directory we may not write.
    status = absl::PermissionDeniedError(
        absl::StrCat("--listen: cannot move the socket to '", path, "': ", strerror(errno)));
  }
  unlink(staged.c_str());  // left only when something failed before the rename
  rmdir(dir.c_str());
  if (!status.ok()) {
    if (fd >= 0) close(fd);
    return status;
  }
  return std::unique_ptr<UnixListener>(new UnixListener(path, fd));
}

UnixListener::UnixListener(std::string path, int fd) : path_(std::move(path)), fd_(fd) {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
}

UnixListener::~UnixListener() {
  Stop();
  if (wake_[0] >= 0) close(wake_[0]);
  if (wake_[1] >= 0) close(wake_[1]);
}

void UnixListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { Loop(server); });
}

void UnixListener::Stop() {
  if (thread_.joinable()) {
    const char byte = 0;
    if (write(wake_[1], &byte, 1) < 0) {
      // The pipe is non-blocking and read by nobody else: it cannot be full; nothing to do.
    }
    thread_.join();
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

void UnixListener::Unlink() { unlink(path_.c_str()); }

std::string UnixListener::ClientOf(const std::string& peer) const {
  int fd = -1;
  if (peer.starts_with("fd:") && absl::SimpleAtoi(peer.substr(3), &fd) && fd >= 0) {
    std::lock_guard<std::mutex> lock(pids_mu_);
    if (static_cast<size_t>(fd) < pids_.size() && pids_[fd] > 0) {
      return absl::StrCat("pid:", pids_[fd]);
    }
  }
  return peer;
}

void UnixListener::Loop(grpc::Server* server) {
  const int64_t limit = DescriptorLimit();
  const int64_t reserve = ReserveFor(limit);
  for (;;) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog; try again soon
      // instead of giving up the listener (what gRPC's own does).
      ++accept_errors_;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (limit - OpenDescriptors() < reserve) {
      ++refused_;
      close(conn);
      continue;
    }
    ucred cred{};
    socklen_t length = sizeof(cred);
    const int pid = getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0 ? cred.pid : 0;
    {
      std::lock_guard<std::mutex> lock(pids_mu_);
      if (static_cast<size_t>(conn) >= pids_.size()) pids_.resize(conn + 1, 0);
      pids_[conn] = pid;
    }
    grpc::AddInsecureChannelFromFd(server, conn);
  }
}

}  // namespace verifyd
