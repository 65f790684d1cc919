// fake_scheduler: drives many sequences through real decode loops against a verifyd daemon and
// checks every Verify output against the reference. Exit 0: no mismatch, no error; 1 otherwise.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tools/fake_scheduler/scheduler.h"

ABSL_FLAG(std::string, target, "unix:///run/verifyd/verifyd-0.sock",
          "daemon address; several, comma-separated, drive one daemon per tensor-parallel rank "
          "through GroupClient");
ABSL_FLAG(int, sequences, 8, "sequences driven concurrently");
ABSL_FLAG(int, steps, 50, "decode steps per sequence");
ABSL_FLAG(uint64_t, seed, 1, "every input is a function of the seed and its coordinates");
ABSL_FLAG(std::string, prefill_tokens, "64-256", "prefill length range MIN-MAX (or one value)");
ABSL_FLAG(std::string, tree_sizes, "8-64",
          "draft tree node range MIN-MAX (chains, best-first trees, forests); clipped to the "
          "daemon's max tree nodes");
ABSL_FLAG(int, threads, 4, "scheduler threads (each owns a share of the sequences)");
ABSL_FLAG(int, batch, 1, "sequences per Verify request");
ABSL_FLAG(int, compact_at_step, -1,
          "operator Compact once every sequence finished this many steps (-1: never)");
ABSL_FLAG(uint64_t, compact_budget_bytes, 0, "Compact budget (0: until converged)");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20, "match the daemon's --max-message-bytes");
ABSL_FLAG(double, deadline_seconds, 60, "per-RPC deadline");
ABSL_FLAG(int, corrupt_reference_at_step, -1,
          "checks the checker: corrupt the reference's input at this step (must then exit 1)");
ABSL_FLAG(bool, shared_memory, false,
          "send Append kv and Verify q/tree_kv, and receive out/lse, through shared-memory "
          "regions the daemon creates (one per thread and rank) instead of inline bytes");
ABSL_FLAG(bool, channel, false,
          "Verify through a channel with tensors in registered memory (the co-located data "
          "plane, plans/0017; the daemon must be on this host, as this user)");
ABSL_FLAG(uint32_t, device, 0, "with --channel: the daemon's --device (registrations name it)");
ABSL_FLAG(bool, release, true, "release every sequence at the end (false: leave them live)");

namespace {

bool ParseRange(const std::string& text, int* lo, int* hi) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  if (parts.size() == 1) parts.push_back(parts[0]);
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], lo) && absl::SimpleAtoi(parts[1], hi) &&
         *lo >= 1 && *hi >= *lo;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "fake_scheduler --target=unix:///run/verifyd/verifyd-0.sock [flags]");
  // --help lists this file's flags (absl's default looks for a file named after the binary);
  // --version says the build's version and type.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "fake_scheduler/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] {
    return std::string("fake_scheduler ") + VERIFYD_VERSION + " (" + VERIFYD_BUILD_TYPE +
           " build)\n";
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  verifyd::sched::SchedulerConfig c;
  c.targets = absl::StrSplit(absl::GetFlag(FLAGS_target), ',', absl::SkipEmpty());
  c.sequences = absl::GetFlag(FLAGS_sequences);
  c.steps = absl::GetFlag(FLAGS_steps);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.threads = absl::GetFlag(FLAGS_threads);
  c.batch = absl::GetFlag(FLAGS_batch);
  c.compact_at_step = absl::GetFlag(FLAGS_compact_at_step);
  c.compact_budget_bytes = absl::GetFlag(FLAGS_compact_budget_bytes);
  c.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  c.deadline_seconds = absl::GetFlag(FLAGS_deadline_seconds);
  c.release_at_end = absl::GetFlag(FLAGS_release);
  c.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  c.channel = absl::GetFlag(FLAGS_channel);
  c.device = absl::GetFlag(FLAGS_device);
  c.corrupt_reference_at_step = absl::GetFlag(FLAGS_corrupt_reference_at_step);
  if (!ParseRange(absl::GetFlag(FLAGS_prefill_tokens), &c.prefill_min, &c.prefill_max) ||
      !ParseRange(absl::GetFlag(FLAGS_tree_sizes), &c.tree_min, &c.tree_max)) {
    std::cerr
        << "fake_scheduler: --prefill-tokens and --tree-sizes take MIN-MAX with 1 <= MIN <= MAX\n";
    return 2;
  }

  auto report = verifyd::sched::RunScheduler(c);
  if (!report.ok()) {
    std::cerr << "fake_scheduler: " << report.status() << "\n";
    return 1;
  }
  const auto& r = *report;
  const auto& lat = r.verify_latency;
  std::printf("fake_scheduler: %d sequences x %d steps against %s (tensors %s)\n", c.sequences,
              c.steps, absl::GetFlag(FLAGS_target).c_str(),
              c.channel         ? "through a channel, in registered memory"
              : c.shared_memory ? "in shared memory"
                                : "inline");
  std::printf("  prefill tokens      %lld\n", static_cast<long long>(r.prefill_tokens));
  std::printf("  sequence-steps      %lld in %.2f s: %.1f steps/s\n",
              static_cast<long long>(r.sequence_steps), r.wall_seconds,
              r.wall_seconds > 0 ? r.sequence_steps / r.wall_seconds : 0.0);
  std::printf(
      "  committed tokens    %lld (%.2f per step)\n", static_cast<long long>(r.committed_tokens),
      r.sequence_steps > 0 ? static_cast<double>(r.committed_tokens) / r.sequence_steps : 0.0);
  std::printf(
      "  Verify RPCs         %lld (%lld sequence-layer-rank outputs checked, max rel err %.3g)\n"
      "                      against verify/'s reference arithmetic, which is the cpu backend's\n"
      "                      own: there 0 means bit-identical; the float64 oracle is the tests'\n",
      static_cast<long long>(r.verifies), static_cast<long long>(r.verified_trees),
      r.max_relative_error);
  std::printf("  Verify latency      p50 %.0f us, p99 %.0f us, max %.0f us\n", lat.p50_us,
              lat.p99_us, lat.max_us);
  if (r.compaction) {
    const auto& k = *r.compaction;
    std::printf(
        "  compaction %s     %s: %llu bytes moved (%llu tokens) in %.3f s; runs %llu -> %llu, "
        "fragmented %.3f -> %.3f\n",
        k.operation_id().c_str(), verifyd::v1::CompactionStatus::State_Name(k.state()).c_str(),
        static_cast<unsigned long long>(k.bytes_moved()),
        static_cast<unsigned long long>(k.tokens_moved()), k.seconds(),
        static_cast<unsigned long long>(k.before().runs()),
        static_cast<unsigned long long>(k.after().runs()), k.before().fragmented_ratio(),
        k.after().fragmented_ratio());
  }
  if (!r.kept_sequences.empty()) {
    std::printf("  kept sequences     ");
    for (uint64_t id : r.kept_sequences) std::printf(" %llu", static_cast<unsigned long long>(id));
    std::printf("\n");
  }
  if (!r.failures.empty()) {
    std::printf("FAILED (%zu):\n", r.failures.size());
    for (const std::string& f : r.failures) std::printf("  %s\n", f.c_str());
    return 1;
  }
  std::printf("OK: zero mismatches\n");
  return 0;
}
