// verifyctl's command line: `verifyctl [--target=URI] COMMAND [--flag=value ...]`.
//
// Parsed by hand rather than with absl flags so that every usage error exits with code 2 (absl's
// parser exits 1, which verifyctl reserves for RPC errors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace verifyd::ctl {

enum class Command { kHealth, kStats, kSequences, kCompact, kRelease, kFork, kHelp, kVersion };

// text: tables and a progress bar (on a terminal); json: protobuf's JSON of the reply, for scripts.
enum class Output { kText, kJson };

struct Args {
  Command command = Command::kHelp;
  std::string target = "unix:///run/verifyd/verifyd-0.sock";
  double deadline_seconds = 10;
  std::string admin_token;
  Output output = Output::kText;
  uint64_t budget_bytes = 0;  // compact; 0 = until converged
  int poll_ms = 100;          // compact
  uint64_t sequence = 0;      // release; fork: the source
  bool has_sequence = false;
  uint64_t new_sequence = 0;  // fork
  bool has_new_sequence = false;
  uint64_t length = 0;  // fork: the shared prefix
  bool has_length = false;
};

// INVALID_ARGUMENT naming the flag for anything unknown, missing or malformed.
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv);

std::string Usage();

}  // namespace verifyd::ctl
