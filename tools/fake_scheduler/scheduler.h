// The fake scheduler's decode loops: many sequences driven concurrently against one daemon, every
// Verify output checked against SequenceModel's reference.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/fake_scheduler/latency_stats.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd::sched {

struct SchedulerConfig {
  // One daemon, or one per tensor-parallel rank: every rank holds the same sequences (the latent KV
  // is shared by all heads) and computes its own H heads; rank r's queries are heads [rH, (r+1)H).
  std::vector<std::string> targets;
  int sequences = 8;
  int steps = 50;
  uint64_t seed = 1;
  int prefill_min = 64, prefill_max = 256;
  int tree_min = 8, tree_max = 64;  // clipped to the daemon's max tree nodes
  int threads = 4;
  int batch = 1;  // sequences per Verify request
  // Operator Compact once every sequence has finished this many steps (-1: never).
  int compact_at_step = -1;
  uint64_t compact_budget_bytes = 0;
  int64_t max_message_bytes = int64_t{64} << 20;
  double deadline_seconds = 60;
  double max_relative_error = 1e-2;
  // false: sequences stay live at the end (after their final Commit), for an operator to inspect.
  bool release_at_end = true;
  // Tensors through shared memory (plans/0010): every worker thread creates one region per rank
  // and sends Append kv, Verify q/tree_kv and receives out/lse through it; false: inline bytes.
  bool shared_memory = false;
  // Verify through the co-located data plane (plans/0017): every worker thread registers a file
  // in /dev/shm per rank as external memory and opens a channel; q / tree_kv / out / lse live
  // there and the descriptors carry the riding commits (the cpu backend; Append stays as set by
  // shared_memory).
  bool channel = false;
  uint32_t device = 0;  // the daemon's --device, which a registration names
  // Test of the checker itself: at this step (layer 0), the reference sees one query element
  // changed, so a correct daemon must be reported as a mismatch (-1: never).
  int corrupt_reference_at_step = -1;
};

struct SchedulerReport {
  int64_t sequence_steps = 0;
  int64_t verifies = 0;        // Verify RPCs
  int64_t verified_trees = 0;  // sequence-layer-rank outputs checked
  int64_t committed_tokens = 0;
  int64_t prefill_tokens = 0;
  double max_relative_error = 0;
  double wall_seconds = 0;  // prefill, decode and release of every sequence
  LatencySummary verify_latency;
  std::optional<v1::CompactionStatus> compaction;  // rank 0's
  std::vector<uint64_t> kept_sequences;            // live at the end when !release_at_end
  std::vector<std::string> failures;               // empty on success
};

// Runs the whole scenario. A non-OK status is a setup failure (cannot reach the daemon); protocol
// errors and mismatches land in report.failures.
absl::StatusOr<SchedulerReport> RunScheduler(const SchedulerConfig& config);

}  // namespace verifyd::sched
