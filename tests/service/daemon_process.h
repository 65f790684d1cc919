// The real `verifyd` binary as a child process: start with flags, read its startup line,
// signal it, wait for its exit status. Also a tiny HTTP GET for /metrics.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace verifyd::testing {

class DaemonProcess {
 public:
  // Starts `binary` with `args` and waits for its first stdout line; null (with *error) when it
  // exits or prints nothing within the timeout. Its stderr (the event log) goes to
  // `stderr_path` when given, else to the test's.
  static std::unique_ptr<DaemonProcess> Start(const std::string& binary,
                                              const std::vector<std::string>& args,
                                              std::string* error,
                                              const std::string& stderr_path = "");
  ~DaemonProcess();  // SIGKILL if still running.

  const std::string& startup_line() const { return startup_line_; }
  // The value of `key=` in the startup line ("" when absent).
  std::string StartupField(const std::string& key) const;
  // host:port of its /metrics (the startup line's metrics=http://host:port/metrics).
  std::string MetricsAddress() const;
  void Signal(int signal_number);
  pid_t pid() const { return pid_; }
  // The exit code, or -1 on timeout / abnormal end.
  int Wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool exited_ = false;
  std::string startup_line_;
};

// DaemonProcess::Start of `binary args` under /bin/sh with `prelude` run first (ulimit, umask).
std::unique_ptr<DaemonProcess> StartUnderShell(const std::string& binary,
                                               const std::string& prelude,
                                               const std::vector<std::string>& args,
                                               std::string* error);

// The daemon the tests start: $VERIFYD_BINARY when set (the GPU bundle's), else `built` (the
// build's, which each test target passes as its VERIFYD_BINARY definition).
std::string DaemonBinary(const char* built);

// Runs binary+args to completion; returns the exit code, stderr in *output.
int RunToExit(const std::string& binary, const std::vector<std::string>& args, std::string* output);

// GET http://host:port/path; the body, or "" on failure.
std::string HttpGet(const std::string& host_port, const std::string& path);

}  // namespace verifyd::testing
