// verifyctl: the operator CLI (health, stats, sequences, compact with progress, release, fork).
// Exit codes: 0 ok, 1 rpc error (or not SERVING, or a FAILED compaction), 2 usage.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/verifyctl/args.h"
#include "client/verifyctl/render.h"

#ifndef VERIFYD_VERSION
#define VERIFYD_VERSION "0.0.0"
#endif

namespace verifyd::ctl {
namespace {

constexpr int kOk = 0, kRpcError = 1, kUsage = 2;

int Fail(const absl::Status& status) {
  std::cerr << "verifyctl: " << status << "\n";
  return kRpcError;
}

int RunCompact(Client& client, const Args& args) {
  auto started = client.Compact(args.budget_bytes);
  if (!started.ok()) return Fail(started.status());
  const bool json = args.output == Output::kJson;
  // The redrawn bar is for a person at a terminal; a journal or a pipe gets one plain line per
  // state change instead of hundreds of carriage returns.
  const bool terminal = !json && isatty(STDOUT_FILENO) == 1;
  if (!json) {
    std::cout << "compaction " << started->operation_id() << " (budget "
              << (args.budget_bytes == 0 ? std::string("until converged")
                                         : FormatBytes(static_cast<double>(args.budget_bytes)))
              << ")\n";
  }
  // The operation may outlive one RPC deadline; each poll gets its own.
  int last_state = -1;
  auto done = client.WaitCompaction(started->operation_id(), absl::Milliseconds(args.poll_ms),
                                    [&](const v1::CompactionStatus& s) {
                                      if (terminal) {
                                        std::cout << "\r" << FormatProgressLine(s) << std::flush;
                                      } else if (!json && s.state() != last_state) {
                                        std::cout << FormatProgressLine(s) << "\n" << std::flush;
                                      }
                                      last_state = s.state();
                                    });
  if (terminal) std::cout << "\n";
  if (!done.ok()) return Fail(done.status());
  std::cout << (json ? FormatJson(*done) : FormatCompactionSummary(*done));
  return done->state() == v1::CompactionStatus::DONE ? kOk : kRpcError;
}

int Run(const Args& args) {
  if (args.command == Command::kVersion) {
    std::cout << "verifyctl " << VERIFYD_VERSION << "\n";
    return kOk;
  }
  ClientOptions options;
  options.default_deadline = absl::Seconds(args.deadline_seconds);
  options.admin_token = args.admin_token;
  auto client = Client::Connect(args.target, options);
  if (!client.ok()) return Fail(client.status());
  switch (args.command) {
    case Command::kHealth: {
      auto health = (*client)->Health();
      if (!health.ok()) return Fail(health.status());
      std::cout << HealthStatusName(*health) << "\n";
      return *health == HealthStatus::kServing ? kOk : kRpcError;
    }
    case Command::kStats: {
      auto stats = (*client)->Stats();
      if (!stats.ok()) return Fail(stats.status());
      std::cout << (args.output == Output::kJson ? FormatJson(*stats) : FormatStatsTable(*stats));
      return kOk;
    }
    case Command::kSequences: {
      // Every page: an operator looking for leaks wants them all (ids ascending).
      auto list = (*client)->ListAllSequences();
      if (!list.ok()) return Fail(list.status());
      std::cout << (args.output == Output::kJson ? FormatJson(*list) : FormatSequencesTable(*list));
      return kOk;
    }
    case Command::kCompact:
      return RunCompact(**client, args);
    case Command::kRelease: {
      auto released = (*client)->Release(args.sequence);
      if (!released.ok()) return Fail(released.status());
      std::cout << "released sequence " << args.sequence << ": " << released->freed_slots()
                << " slots freed\n";
      return kOk;
    }
    case Command::kFork: {
      auto forked = (*client)->Fork(args.sequence, args.new_sequence, args.length);
      if (!forked.ok()) return Fail(forked.status());
      std::cout << "forked sequence " << args.new_sequence << " from " << args.sequence << ": "
                << forked->committed_length() << " tokens shared; " << forked->shared_tokens()
                << " shared slots in the daemon\n";
      return kOk;
    }
    case Command::kHelp:
      break;
    case Command::kVersion:
      std::cout << "verifyctl " << VERIFYD_VERSION << "\n";
      return kOk;
  }
  std::cout << Usage();
  return kOk;
}

}  // namespace
}  // namespace verifyd::ctl

int main(int argc, char** argv) {
  using namespace verifyd::ctl;
  auto args = ParseArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) {
    std::cerr << "verifyctl: " << args.status().message() << "\n" << Usage();
    return kUsage;
  }
  return Run(*args);
}
