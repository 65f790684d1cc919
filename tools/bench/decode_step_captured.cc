#include "tools/bench/decode_step_captured.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "tools/bench/decode_step_daemon_process.h"

ABSL_DECLARE_FLAG(int, gemm_n);

namespace verifyd::decode_step {
namespace {

// Runs `args` (args[0]: the program) with its stdout read back whole; its stderr is ours.
absl::StatusOr<std::string> RunChild(std::vector<std::string> args) {
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]), close(out[1]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(args[0].c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(out[0], buffer, sizeof(buffer))) != 0;) {
    if (n > 0) text.append(buffer, static_cast<size_t>(n));
    if (n < 0 && errno != EINTR) break;
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(
        args[0], " failed (",
        WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                          : absl::StrCat("signal ", WIFSIGNALED(status) ? WTERMSIG(status) : 0),
        WIFEXITED(status) && WEXITSTATUS(status) == 127 ? ": could not be started" : "",
        "); its stderr says why"));
  }
  return text;
}

// The engine's result line ("captured ms_per_step=... p50_us=... p99_us=... committed=...").
struct EngineResult {
  Timing timing;
  unsigned long long committed = 0;
};
absl::StatusOr<EngineResult> ParseResult(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "captured ")) continue;
    EngineResult r;
    const std::string l(line);
    if (std::sscanf(l.c_str(), "captured ms_per_step=%lf p50_us=%lf p99_us=%lf committed=%llu",
                    &r.timing.ms_per_step, &r.timing.p50_us, &r.timing.p99_us, &r.committed) == 4) {
      return r;
    }
  }
  return absl::InternalError(absl::StrCat("the engine printed no result line: '", text, "'"));
}

// The riding commits reached the daemon: the sequence holds the prefix plus every accepted path,
// and the last replay's tree is pending.
absl::Status CheckSequence(Client& client, const Dims& d, unsigned long long committed) {
  VERIFYD_ASSIGN_OR_RETURN(v1::ListSequencesResponse list, client.ListAllSequences());
  for (const v1::SequenceInfo& s : list.sequences()) {
    if (s.sequence_id() != kSequence) continue;
    if (s.committed_length() != committed ||
        s.pending_tree_nodes() != static_cast<uint32_t>(d.nodes)) {
      return absl::DataLossError(
          absl::StrCat("after the captured steps the daemon holds ", s.committed_length(),
                       " committed tokens and a pending tree of ", s.pending_tree_nodes(),
                       " nodes; the engine's commits make ", committed, " and ", d.nodes));
    }
    return absl::OkStatus();
  }
  return absl::NotFoundError("the bench's sequence is gone after the captured steps");
}

}  // namespace

const char* CapturedWayName(CapturedIo io) {
  return io == CapturedIo::kBucketCopies ? "daemon: captured graph"
                                         : "daemon: captured graph, in place";
}

absl::StatusOr<Timing> RunCaptured(const Dims& d, CapturedIo io, const std::string& verifyd_path,
                                   const std::string& engine_path,
                                   const std::string& flash_kernel) {
  cudaStream_t stream;
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<Daemon> daemon,
                           Daemon::Start(verifyd_path, d, true, flash_kernel));
  VERIFYD_RETURN_IF_ERROR(Prefill(daemon->client(), d, stream));
  VERIFYD_CUDA_CHECK(cudaStreamDestroy(stream));
  VERIFYD_ASSIGN_OR_RETURN(
      std::string text,
      RunChild(
          {engine_path, absl::StrCat("--target=", daemon->target()),
           absl::StrCat("--layers=", d.layers), absl::StrCat("--prefix=", d.prefix),
           absl::StrCat("--nodes=", d.nodes), absl::StrCat("--heads=", d.heads),
           absl::StrCat("--accept=", d.accept), absl::StrCat("--steps=", d.steps),
           absl::StrCat("--warmup=", d.warmup),
           absl::StrCat("--gemm_n=", absl::GetFlag(FLAGS_gemm_n)),
           absl::StrCat("--sequence=", kSequence),
           absl::StrCat("--bucket_copies=", io == CapturedIo::kBucketCopies ? "true" : "false")}));
  VERIFYD_ASSIGN_OR_RETURN(EngineResult result, ParseResult(text));
  VERIFYD_RETURN_IF_ERROR(CheckSequence(daemon->client(), d, result.committed));
  VERIFYD_RETURN_IF_ERROR(daemon->client().Release(kSequence).status());
  return result.timing;
}

}  // namespace verifyd::decode_step
