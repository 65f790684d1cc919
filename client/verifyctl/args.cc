#include "client/verifyctl/args.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace verifyd::ctl {
namespace {

absl::Status Usage(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

absl::StatusOr<Command> ParseCommand(const std::string& word) {
  if (word == "health") return Command::kHealth;
  if (word == "stats") return Command::kStats;
  if (word == "sequences") return Command::kSequences;
  if (word == "compact") return Command::kCompact;
  if (word == "release") return Command::kRelease;
  if (word == "fork") return Command::kFork;
  if (word == "help") return Command::kHelp;
  return Usage("unknown command '", word,
               "'; expected health, stats, sequences, compact, release or fork");
}

}  // namespace

std::string Usage() {
  return "usage: verifyctl [--target=unix:///run/verifyd/verifyd-0.sock] [--deadline-seconds=10]\n"
         "                 [--admin-token=TOKEN] [-o text|json] COMMAND\n"
         "       verifyctl --version\n"
         "commands:\n"
         "  health                        grpc.health.v1 status (exit 0 only when SERVING)\n"
         "  stats                         store occupancy, fragmentation and settings\n"
         "  sequences                     every live sequence: committed length, pending tree\n"
         "                                nodes, shared tokens, idle time, lease left\n"
         "  compact [--budget-bytes=N]    defragment (0 = until converged), with progress\n"
         "          [--poll-ms=100]\n"
         "  release --sequence=ID         drop a sequence and free its slots\n"
         "  fork --sequence=ID --new-sequence=ID --length=K\n"
         "                                a new sequence on ID's first K committed tokens,\n"
         "                                sharing their KV (no copy)\n"
         "exit codes: 0 ok, 1 rpc error, 2 usage\n";
}

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv) {
  Args args;
  bool have_command = false;
  // Flags that only some commands take: compact's, release's and fork's (--sequence), fork's.
  std::string compact_flag, sequence_flag, fork_flag;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& word = argv[i];
    if (word == "-h" || word == "--help") {
      args.command = Command::kHelp;
      return args;
    }
    if (word == "--version") {
      args.command = Command::kVersion;
      return args;
    }
    if (word == "-o" || absl::StartsWith(word, "-o=") || absl::StartsWith(word, "--output")) {
      std::string value;
      if (const size_t eq = word.find('='); eq != std::string::npos) {
        value = word.substr(eq + 1);
      } else if (i + 1 < argv.size() && (word == "-o" || word == "--output")) {
        value = argv[++i];
      } else {
        return Usage(word, " needs a value");
      }
      if (value == "json") {
        args.output = Output::kJson;
      } else if (value == "text") {
        args.output = Output::kText;
      } else {
        return Usage("-o = '", value, "' must be text or json");
      }
      continue;
    }
    if (!absl::StartsWith(word, "--")) {
      if (have_command) return Usage("unexpected argument '", word, "' after the command");
      auto command = ParseCommand(word);
      if (!command.ok()) return command.status();
      args.command = *command;
      have_command = true;
      continue;
    }
    std::string name = word.substr(2), value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < argv.size()) {
      value = argv[++i];
    } else {
      return Usage("--", name, " needs a value");
    }
    if (name == "target") {
      if (value.empty()) return Usage("--target must not be empty");
      args.target = value;
    } else if (name == "deadline-seconds") {
      if (!absl::SimpleAtod(value, &args.deadline_seconds) || !(args.deadline_seconds > 0)) {
        return Usage("--deadline-seconds = '", value, "' must be a number > 0");
      }
    } else if (name == "admin-token") {
      args.admin_token = value;
    } else if (name == "budget-bytes") {
      if (!absl::SimpleAtoi(value, &args.budget_bytes)) {
        return Usage("--budget-bytes = '", value, "' must be an integer >= 0");
      }
      compact_flag = "--budget-bytes";
    } else if (name == "poll-ms") {
      if (!absl::SimpleAtoi(value, &args.poll_ms) || args.poll_ms < 1 || args.poll_ms > 60000) {
        return Usage("--poll-ms = '", value, "' must be an integer in [1, 60000]");
      }
      compact_flag = "--poll-ms";
    } else if (name == "sequence") {
      if (!absl::SimpleAtoi(value, &args.sequence)) {
        return Usage("--sequence = '", value, "' must be an unsigned integer");
      }
      args.has_sequence = true;
      sequence_flag = "--sequence";
    } else if (name == "new-sequence") {
      if (!absl::SimpleAtoi(value, &args.new_sequence)) {
        return Usage("--new-sequence = '", value, "' must be an unsigned integer");
      }
      args.has_new_sequence = true;
      fork_flag = "--new-sequence";
    } else if (name == "length") {
      if (!absl::SimpleAtoi(value, &args.length) || args.length < 1) {
        return Usage("--length = '", value, "' must be an integer >= 1");
      }
      args.has_length = true;
      fork_flag = "--length";
    } else {
      return Usage("unknown flag --", name);
    }
  }
  if (!have_command) return Usage("a command is required");
  if (!compact_flag.empty() && args.command != Command::kCompact) {
    return Usage(compact_flag, " applies to compact only");
  }
  if (!sequence_flag.empty() && args.command != Command::kRelease &&
      args.command != Command::kFork) {
    return Usage(sequence_flag, " applies to release and fork only");
  }
  if (!fork_flag.empty() && args.command != Command::kFork) {
    return Usage(fork_flag, " applies to fork only");
  }
  if (args.command == Command::kRelease && !args.has_sequence) {
    return Usage("release needs --sequence=ID");
  }
  if (args.command == Command::kFork &&
      !(args.has_sequence && args.has_new_sequence && args.has_length)) {
    return Usage("fork needs --sequence=ID --new-sequence=ID --length=K");
  }
  return args;
}

}  // namespace verifyd::ctl
