#include "tests/backend/cuda/ipc_producer.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace verifyd::test {

absl::StatusOr<std::unique_ptr<IpcProducer>> IpcProducer::Start(const std::string& binary,
                                                                size_t bytes) {
  // A missing producer (a bundle built without it) is a clear failure, not a SIGPIPE when the
  // destructor tells a child that never ran to quit.
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("the IPC producer ", binary,
                                            " is not an executable (build cuda_ipc_producer)"));
  }
  signal(SIGPIPE, SIG_IGN);
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return absl::InternalError("pipe failed");
  const std::string size = std::to_string(bytes);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(down[0], STDIN_FILENO);
    dup2(up[1], STDOUT_FILENO);
    close(down[0]), close(down[1]), close(up[0]), close(up[1]);
    execl(binary.c_str(), binary.c_str(), size.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  std::unique_ptr<IpcProducer> producer(new IpcProducer());
  producer->pid_ = pid;
  producer->to_child_ = down[1];
  producer->from_child_ = up[0];
  absl::StatusOr<std::string> line = producer->ReadLine(std::chrono::seconds(60));
  if (!line.ok()) return line.status();
  if (line->rfind("handle ", 0) != 0 || line->size() != 7 + 128) {
    return absl::InternalError(absl::StrCat("producer said: ", *line));
  }
  for (size_t i = 0; i < 64; ++i) {
    producer->handle_.push_back(
        static_cast<char>(std::stoi(line->substr(7 + 2 * i, 2), nullptr, 16)));
  }
  return producer;
}

IpcProducer::~IpcProducer() {
  if (pid_ <= 0) return;
  const char quit[] = "quit\n";
  if (write(to_child_, quit, sizeof(quit) - 1) < 0) kill(pid_, SIGKILL);
  close(to_child_);
  for (int i = 0; i < 100; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      close(from_child_);
      return;
    }
    usleep(50'000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  close(from_child_);
}

absl::StatusOr<std::string> IpcProducer::ReadLine(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (const size_t end = buffered_.find('\n'); end != std::string::npos) {
      std::string line = buffered_.substr(0, end);
      buffered_.erase(0, end + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("the producer did not answer");
    pollfd fd{from_child_, POLLIN, 0};
    const int ready = poll(&fd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) return absl::InternalError("poll failed");
    if (ready <= 0) continue;
    char chunk[512];
    const ssize_t got = read(from_child_, chunk, sizeof(chunk));
    if (got <= 0) return absl::InternalError("the producer exited");
    buffered_.append(chunk, static_cast<size_t>(got));
  }
}

absl::Status IpcProducer::SendStep(const std::string& in_path, const std::string& out_path,
                                   uint64_t delay_us, const std::vector<ProducerLayer>& layers) {
  std::string message =
      absl::StrCat("step ", in_path, " ", out_path, " ", delay_us, " ", layers.size(), "\n");
  for (const ProducerLayer& l : layers) {
    absl::StrAppend(&message, l.q_off, " ", l.q_bytes, " ", l.kv_off, " ", l.kv_bytes, " ",
                    l.out_off, " ", l.out_bytes, " ", l.ready_off, " ", l.done_off, " ", l.value,
                    "\n");
  }
  if (write(to_child_, message.data(), message.size()) != static_cast<ssize_t>(message.size())) {
    return absl::InternalError("writing to the producer failed");
  }
  return absl::OkStatus();
}

absl::Status IpcProducer::AwaitStep(std::chrono::milliseconds timeout) {
  absl::StatusOr<std::string> line = ReadLine(timeout);
  if (!line.ok()) return line.status();
  if (*line != "ok") return absl::InternalError(absl::StrCat("producer said: ", *line));
  return absl::OkStatus();
}

}  // namespace verifyd::test
