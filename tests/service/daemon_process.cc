#include "tests/service/daemon_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace verifyd::testing {
namespace {

std::vector<char*> Argv(const std::string& binary, const std::vector<std::string>& args,
                        std::vector<std::string>& storage) {
  storage.clear();
  storage.push_back(binary);
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  return argv;
}

}  // namespace

std::unique_ptr<DaemonProcess> DaemonProcess::Start(const std::string& binary,
                                                    const std::vector<std::string>& args,
                                                    std::string* error,
                                                    const std::string& stderr_path) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) {
    *error = "pipe failed";
    return nullptr;
  }
  std::vector<std::string> storage;
  std::vector<char*> argv = Argv(binary, args, storage);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    if (!stderr_path.empty()) {
      const int log = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (log >= 0) dup2(log, STDERR_FILENO);
    }
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  std::unique_ptr<DaemonProcess> process(new DaemonProcess());
  process->pid_ = pid;
  process->stdout_fd_ = pipe_fds[0];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string line;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{process->stdout_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char c;
    const ssize_t n = read(process->stdout_fd_, &c, 1);
    if (n <= 0) break;
    if (c == '\n') {
      process->startup_line_ = line;
      return process;
    }
    line.push_back(c);
  }
  *error = "verifyd printed no startup line (got '" + line + "')";
  return nullptr;
}

DaemonProcess::~DaemonProcess() {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string DaemonProcess::StartupField(const std::string& key) const {
  for (absl::string_view word : absl::StrSplit(startup_line_, ' ')) {
    if (word.substr(0, key.size() + 1) == key + "=")
      return std::string(word.substr(key.size() + 1));
  }
  return "";
}

std::string DaemonProcess::MetricsAddress() const {
  const std::string field = StartupField("metrics");
  absl::string_view url = field;
  absl::ConsumePrefix(&url, "http://");
  absl::ConsumeSuffix(&url, "/metrics");
  return std::string(url);
}

void DaemonProcess::Signal(int signal_number) {
  if (!exited_) kill(pid_, signal_number);
}

int DaemonProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

int RunToExit(const std::string& binary, const std::vector<std::string>& args,
              std::string* output) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return -1;
  std::vector<std::string> storage;
  std::vector<char*> argv = Argv(binary, args, storage);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  char buffer[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) output->append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string HttpGet(const std::string& host_port, const std::string& path) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port))
    return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + host_port + "\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[8192];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

std::string DaemonBinary(const char* built) {
  const char* env = std::getenv("VERIFYD_BINARY");
  return std::string(env != nullptr && *env != '\0' ? env : built);
}

std::unique_ptr<DaemonProcess> StartUnderShell(const std::string& binary,
                                               const std::string& prelude,
                                               const std::vector<std::string>& args,
                                               std::string* error) {
  std::vector<std::string> sh_args = {"-c", prelude + " && exec \"$0\" \"$@\"", binary};
  sh_args.insert(sh_args.end(), args.begin(), args.end());
  return DaemonProcess::Start("/bin/sh", sh_args, error);
}

}  // namespace verifyd::testing
