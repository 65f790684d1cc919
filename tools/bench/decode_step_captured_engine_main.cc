// decode_step_captured_engine: the process the decode-step bench's captured ways run
// (decode_step_captured.h starts it once it has started the daemon and prefilled the sequence;
// what it does: decode_step_captured_engine.h). On success it prints one line on stdout, which
// the bench parses:
//   captured ms_per_step=<ms> p50_us=<us> p99_us=<us> committed=<tokens> nodes=<Q>
// committed: what the daemon must hold for the sequence afterwards (the bench checks it).
// Exit 2 without a CUDA device, 1 on any failure (stderr says which replay and why).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tools/bench/decode_step_captured_engine.h"

ABSL_FLAG(std::string, target, "", "the daemon the bench started (unix:///...)");
ABSL_FLAG(int, layers, 61, "model layers");
ABSL_FLAG(int, prefix, 185000, "L: committed tokens at the first step (the bench prefilled them)");
ABSL_FLAG(int, nodes, 16, "Q: tree nodes per step (the bucket's max_q)");
ABSL_FLAG(int, heads, 8, "H");
ABSL_FLAG(int, accept, 4, "at most this many tree nodes accepted per step");
ABSL_FLAG(int, steps, 40, "timed replays");
ABSL_FLAG(int, warmup, 5, "untimed replays first");
ABSL_FLAG(int, gemm_n, 1024, "the model GEMM is 4096 x gemm_n x 4096 bf16");
ABSL_FLAG(uint64_t, sequence, 1, "the sequence the bench prefilled");
ABSL_FLAG(bool, bucket_copies, true,
          "copy each layer's q / tree KV into the bucket and out back (false: the graph verifies "
          "the bucket in place, as an engine whose projections write into it would)");
ABSL_FLAG(double, done_timeout_s, 10,
          "how long a WaitDone spins before it declares the daemon dead");

namespace verifyd::decode_step {
namespace {

absl::Status Run() {
  EngineOptions o;
  o.dims =
      Dims{absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_prefix), absl::GetFlag(FLAGS_nodes),
           absl::GetFlag(FLAGS_heads),  absl::GetFlag(FLAGS_accept), absl::GetFlag(FLAGS_steps),
           absl::GetFlag(FLAGS_warmup)};
  o.target = absl::GetFlag(FLAGS_target);
  o.sequence = absl::GetFlag(FLAGS_sequence);
  o.gemm_n = absl::GetFlag(FLAGS_gemm_n);
  o.bucket_copies = absl::GetFlag(FLAGS_bucket_copies);
  o.done_timeout_s = absl::GetFlag(FLAGS_done_timeout_s);
  CapturedEngine engine(o);
  VERIFYD_RETURN_IF_ERROR(engine.Init());
  VERIFYD_RETURN_IF_ERROR(engine.Capture());
  std::fprintf(stderr, "  captured engine: %s\n", engine.Describe().c_str());
  VERIFYD_ASSIGN_OR_RETURN(const Timing t, engine.Replay());
  if (absl::Status spot = engine.SpotCheck(); !spot.ok()) {
    return absl::Status(spot.code(), absl::StrCat("spot check: ", spot.message()));
  }
  std::fprintf(stderr,
               "  captured engine: %d replays checked (fault word 0, every step OK); spot check "
               "passed: %s written by one more replay\n",
               o.dims.total_steps() + 1,
               o.bucket_copies ? "every layer's out (finite, not zero, none equal to the layer "
                                 "before's)"
                               : "the bucket's out (finite, not zero)");
  VERIFYD_RETURN_IF_ERROR(engine.Close());
  std::printf("captured ms_per_step=%.6f p50_us=%.3f p99_us=%.3f committed=%llu nodes=%d\n",
              t.ms_per_step, t.p50_us, t.p99_us,
              static_cast<unsigned long long>(engine.expected_committed()), o.dims.nodes);
  return absl::OkStatus();
}

}  // namespace
}  // namespace verifyd::decode_step

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "decode_step_captured_engine: needs a CUDA device\n");
    return 2;
  }
  if (absl::Status s = verifyd::decode_step::Run(); !s.ok()) {
    std::fprintf(stderr, "decode_step_captured_engine: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
