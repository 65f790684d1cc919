// verifyd_load: a perf_analyzer-style load generator for Verify. For each concurrency level it
// runs that many closed-loop workers (each its own sequences, prefilled once), warms up, then
// measures a fixed window, and prints one CSV row: concurrency, throughput, p50/p90/p99 latency.
//
// With --shared_memory every Append and Verify goes through a region the daemon created (one per
// worker) and out comes back in it. q and tree_kv are written into the region once per layer at
// setup (as a scheduler would have its GPU write them there: Client::VerifySharedInPlace); with
// --shared_memory_copy they are copied in per call instead (Client::VerifyShared), inside the
// measured time. --ping first measures grpc.health.v1 Check on the same channel: the transport's
// own round trip, the floor under any Verify.
//
// Each worker repeats real decode steps of a fixed shape: Verify on every layer in turn, the
// first one rejecting the previous tree (commit length 0) so the prefix length stays constant.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/shared_tensor.h"
#include "client/tensor.h"
#include "tools/fake_scheduler/draft_tree.h"
#include "tools/fake_scheduler/input_generator.h"
#include "tools/fake_scheduler/latency_stats.h"
#include "verify/mla_dims.h"

ABSL_FLAG(std::string, target, "unix:///run/verifyd/verifyd-0.sock", "daemon address");
ABSL_FLAG(std::string, concurrency, "1,2,4,8", "comma-separated concurrency levels");
ABSL_FLAG(double, warmup_seconds, 2, "per level, not measured");
ABSL_FLAG(double, measure_seconds, 5, "per level, measured window");
ABSL_FLAG(int, tree_nodes, 16, "Q per sequence");
ABSL_FLAG(std::string, tree, "best-first", "chain | best-first");
ABSL_FLAG(int, prefix_tokens, 1024, "committed prefix per sequence");
ABSL_FLAG(int, batch, 1, "sequences per Verify");
ABSL_FLAG(uint64_t, seed, 1, "input seed");
ABSL_FLAG(int, fragment_sequences, 0,
          "instead of measuring: (re)create this many sequences by round-robin Appends, so each "
          "holds --fragment_rounds runs of --fragment_tokens slots (work for Compact), and exit");
ABSL_FLAG(int, fragment_rounds, 16, "Appends per fragmented sequence");
ABSL_FLAG(int, fragment_tokens, 64, "tokens per Append of a fragmented sequence");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20, "match the daemon's --max-message-bytes");
ABSL_FLAG(bool, shared_memory, false,
          "tensors through shared memory the daemon creates (Append kv, Verify q/tree_kv/out) "
          "instead of inline bytes");
ABSL_FLAG(bool, shared_memory_copy, false,
          "with --shared_memory: copy q and tree_kv into the region per call (measured) instead "
          "of writing them there once per layer at setup");
ABSL_FLAG(bool, spin_wait, false,
          "Verify polls for its reply without sleeping (ClientOptions::spin_wait)");
ABSL_FLAG(double, ping_seconds, 0,
          "> 0: first time grpc.health.v1 Check round trips for this long and print their "
          "percentiles (the transport's floor) as a '# ping' line on stderr");
ABSL_FLAG(std::string, ping_rpc, "health",
          "what --ping_seconds times: health (grpc.health.v1 Check, gRPC's synchronous server) "
          "or callback (ReleaseSharedMemory of an unknown region: verifyd's callback service "
          "answering at once, without the device)");

namespace {

using verifyd::AppendPosition;
using verifyd::Client;
namespace v1 = verifyd::v1;
using verifyd::bf16_bits;
using verifyd::kKvDim;

struct Shape {
  int layers, heads, nodes, prefix, batch;
  std::vector<int32_t> parents;
};

// One worker's sequences and its pre-built requests (one per layer; layer 0's copy carries the
// rejection of the previous tree after the first step).
struct Worker {
  std::vector<uint64_t> ids;
  std::vector<v1::VerifyRequest> requests;  // [layer]
  v1::VerifyRequest first_step_layer0;      // without commit_previous
  // --shared_memory: the requests carry no tensors; these rows are copied into the region per call
  // (--shared_memory_copy), or were placed there once at `layouts[layer]`.
  std::vector<std::vector<bf16_bits>> q, tree_kv;    // [layer]
  std::vector<verifyd::SharedVerifyLayout> layouts;  // [layer]
  verifyd::SharedMemoryRegion region;
  std::vector<double> latencies_us;
  std::vector<double> started_ms;  // each measured call's start, ms into the window
  absl::Status error;
};

// Append through a region made for the purpose, in chunks of at most 16 MiB (a container's
// /dev/shm may be small); the region is dropped at once, as Verify needs less.
// `at` is where the first chunk writes; each later chunk expects the fill the ones before left.
absl::StatusOr<v1::AppendResponse> AppendShared(Client& client, uint64_t id, int layers, int tokens,
                                                absl::Span<const bf16_bits> kv, AppendPosition at) {
  const int64_t token_bytes = int64_t{layers} * kKvDim * 2;
  const int chunk = static_cast<int>(std::clamp<int64_t>((16 << 20) / token_bytes, 1, tokens));
  auto region = client.CreateSharedMemory(static_cast<uint64_t>(chunk * token_bytes));
  if (!region.ok()) return region.status();
  absl::StatusOr<v1::AppendResponse> appended;
  std::vector<bf16_bits> rows;
  for (int t0 = 0; t0 < tokens; t0 += chunk) {
    const int n = std::min(chunk, tokens - t0);
    rows.clear();
    for (int l = 0; l < layers; ++l) {
      const auto layer = kv.subspan(static_cast<size_t>(l) * tokens * kKvDim);
      rows.insert(rows.end(), layer.begin() + static_cast<size_t>(t0) * kKvDim,
                  layer.begin() + static_cast<size_t>(t0 + n) * kKvDim);
    }
    const AppendPosition chunk_at =
        t0 == 0 ? at : AppendPosition::Fill((at.create ? 0 : at.fill) + static_cast<uint64_t>(t0));
    appended = client.AppendKvShared(id, 0, layers, n, rows, chunk_at, *region);
    if (!appended.ok()) return appended.status();
  }
  return appended;
}

// The tail on stderr: p99.9 and max, and when the slow calls (> 2 x p50) happened. Gaps that
// cluster at one period point at a periodic cause (a tick, a timer); scattered gaps at the host.
void PrintTail(int level, const verifyd::sched::LatencySummary& summary,
               const std::vector<Worker>& workers) {
  std::vector<double> slow_at;
  for (const Worker& w : workers) {
    for (size_t i = 0; i < w.latencies_us.size(); ++i) {
      if (w.latencies_us[i] > 2 * summary.p50_us) slow_at.push_back(w.started_ms[i]);
    }
  }
  std::sort(slow_at.begin(), slow_at.end());
  std::vector<double> gaps;
  for (size_t i = 1; i < slow_at.size(); ++i) gaps.push_back(slow_at[i] - slow_at[i - 1]);
  std::sort(gaps.begin(), gaps.end());
  const double median_gap = gaps.empty() ? 0 : gaps[gaps.size() / 2];
  std::fprintf(stderr,
               "# concurrency %d tail: mean %.0f us, p99.9 %.0f, max %.0f; %zu calls over 2 x p50 "
               "(%.2f%%), median gap between them %.1f ms\n",
               level, summary.mean_us, summary.p999_us, summary.max_us, slow_at.size(),
               summary.count > 0 ? 100.0 * static_cast<double>(slow_at.size()) /
                                       static_cast<double>(summary.count)
                                 : 0.0,
               median_gap);
}

absl::Status Prepare(Client& client, const Shape& s, uint64_t seed, uint64_t first_id,
                     bool shared_memory, Worker& w) {
  using verifyd::sched::FillRow;
  using verifyd::sched::RowKey;
  std::vector<bf16_bits> kv(static_cast<size_t>(s.layers) * s.prefix * kKvDim);
  for (int b = 0; b < s.batch; ++b) {
    const uint64_t id = first_id + b;
    w.ids.push_back(id);
    for (int l = 0; l < s.layers; ++l)
      for (int t = 0; t < s.prefix; ++t)
        FillRow(
            {RowKey::kPrefixKv, seed, id, static_cast<uint64_t>(l), static_cast<uint64_t>(t)}, 1.f,
            absl::MakeSpan(kv).subspan((static_cast<size_t>(l) * s.prefix + t) * kKvDim, kKvDim));
    const AppendPosition at = AppendPosition::Create();
    auto appended = shared_memory ? AppendShared(client, id, s.layers, s.prefix, kv, at)
                                  : client.AppendKv(id, 0, s.layers, s.prefix, kv, at);
    if (!appended.ok()) return appended.status();
  }
  const int total_q = s.nodes * s.batch;
  for (int l = 0; l < s.layers; ++l) {
    v1::VerifyRequest r;
    r.set_layer(l);
    for (uint64_t id : w.ids) {
      v1::VerifySequence* seq = r.add_sequences();
      seq->set_sequence_id(id);
      seq->mutable_parents()->Add(s.parents.begin(), s.parents.end());
      if (l == 0) seq->mutable_commit_previous()->set_commit_length(0);
    }
    std::vector<bf16_bits> q(static_cast<size_t>(total_q) * s.heads * kKvDim),
        tree(static_cast<size_t>(total_q) * kKvDim);
    for (int i = 0; i < total_q * s.heads; ++i)
      FillRow(
          {RowKey::kQuery, seed, first_id, static_cast<uint64_t>(l), 0, static_cast<uint64_t>(i)},
          2.f, absl::MakeSpan(q).subspan(static_cast<size_t>(i) * kKvDim, kKvDim));
    for (int i = 0; i < total_q; ++i)
      FillRow(
          {RowKey::kTreeKv, seed, first_id, static_cast<uint64_t>(l), 0, static_cast<uint64_t>(i)},
          1.f, absl::MakeSpan(tree).subspan(static_cast<size_t>(i) * kKvDim, kKvDim));
    const int64_t q_shape[] = {total_q, s.heads, kKvDim}, kv_shape[] = {total_q, kKvDim};
    if (shared_memory) {
      w.q.push_back(std::move(q));
      w.tree_kv.push_back(std::move(tree));
    } else {
      *r.mutable_q() = *verifyd::tensor::MakeBf16(q_shape, q);
      *r.mutable_tree_kv() = *verifyd::tensor::MakeBf16(kv_shape, tree);
    }
    w.requests.push_back(std::move(r));
  }
  if (shared_memory) {
    // One layout per layer, so each layer's q and tree_kv are written once, here.
    uint64_t bytes = 0;
    for (int l = 0; l < s.layers; ++l) {
      w.layouts.push_back(verifyd::SharedVerifyLayoutAt(bytes, total_q, s.heads, false));
      bytes = verifyd::AlignSharedOffset(w.layouts.back().end);
    }
    auto region = client.CreateSharedMemory(bytes);
    if (!region.ok()) return region.status();
    w.region = *std::move(region);
    for (int l = 0; l < s.layers; ++l) {
      std::memcpy(w.region.bytes().data() + w.layouts[l].q, w.q[l].data(), w.q[l].size() * 2);
      std::memcpy(w.region.bytes().data() + w.layouts[l].tree_kv, w.tree_kv[l].data(),
                  w.tree_kv[l].size() * 2);
    }
  }
  w.first_step_layer0 = w.requests[0];
  for (auto& seq : *w.first_step_layer0.mutable_sequences()) seq.clear_commit_previous();
  return absl::OkStatus();
}

// Interleaved Appends: sequence b's chunk r lands after every other sequence's chunk r - 1, so no
// sequence can extend its run in place and each ends with `rounds` runs.
int Fragment(Client& client, int layers, int sequences, int rounds, int tokens,
             bool shared_memory) {
  constexpr uint64_t kFirstId = uint64_t{1} << 40;  // apart from the measured workers' ids
  std::vector<bf16_bits> kv(static_cast<size_t>(layers) * tokens * kKvDim);
  for (int b = 0; b < sequences; ++b) (void)client.Release(kFirstId + b);  // NOT_FOUND is fine
  for (int r = 0; r < rounds; ++r) {
    for (int b = 0; b < sequences; ++b) {
      for (size_t i = 0; i < kv.size(); i += kKvDim) {
        verifyd::sched::FillRow({verifyd::sched::RowKey::kPrefixKv, 7, kFirstId + b,
                                 static_cast<uint64_t>(r), static_cast<uint64_t>(i)},
                                1.f, absl::MakeSpan(kv).subspan(i, kKvDim));
      }
      // Round r appends to a sequence the rounds before filled with r * tokens.
      const AppendPosition at = r == 0 ? AppendPosition::Create()
                                       : AppendPosition::Fill(static_cast<uint64_t>(r) * tokens);
      auto appended = shared_memory ? AppendShared(client, kFirstId + b, layers, tokens, kv, at)
                                    : client.AppendKv(kFirstId + b, 0, layers, tokens, kv, at);
      if (!appended.ok()) return std::cerr << "verifyd_load: " << appended.status() << "\n", 1;
    }
  }
  std::printf("fragmented %d sequences: %d runs of %d tokens each\n", sequences, rounds, tokens);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("verifyd_load --target=unix:///run/verifyd/verifyd-0.sock [flags]");
  absl::ParseCommandLine(argc, argv);
  std::vector<int> levels;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int c;
    if (!absl::SimpleAtoi(part, &c) || c < 1) {
      std::cerr << "verifyd_load: --concurrency takes positive integers, got '" << part << "'\n";
      return 2;
    }
    levels.push_back(c);
  }
  verifyd::ClientOptions options;
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.spin_wait = absl::GetFlag(FLAGS_spin_wait);
  auto client = Client::Connect(absl::GetFlag(FLAGS_target), options);
  if (!client.ok()) return std::cerr << client.status() << "\n", 1;
  auto stats = (*client)->Stats();
  if (!stats.ok()) return std::cerr << "verifyd_load: " << stats.status() << "\n", 1;

  if (absl::GetFlag(FLAGS_fragment_sequences) > 0) {
    return Fragment(**client, static_cast<int>(stats->layers()),
                    absl::GetFlag(FLAGS_fragment_sequences), absl::GetFlag(FLAGS_fragment_rounds),
                    absl::GetFlag(FLAGS_fragment_tokens), absl::GetFlag(FLAGS_shared_memory));
  }
  Shape shape{static_cast<int>(stats->layers()), static_cast<int>(stats->heads()),
              absl::GetFlag(FLAGS_tree_nodes),   absl::GetFlag(FLAGS_prefix_tokens),
              absl::GetFlag(FLAGS_batch),        {}};
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  shape.parents = verifyd::sched::MakeDraftTree(absl::GetFlag(FLAGS_tree) == "chain"
                                                    ? verifyd::sched::TreeKind::kChain
                                                    : verifyd::sched::TreeKind::kBestFirst,
                                                shape.nodes, rng);
  const absl::Duration warmup = absl::Seconds(absl::GetFlag(FLAGS_warmup_seconds));
  const absl::Duration window = absl::Seconds(absl::GetFlag(FLAGS_measure_seconds));
  const bool shared_memory = absl::GetFlag(FLAGS_shared_memory);
  const bool copy_per_call = absl::GetFlag(FLAGS_shared_memory_copy);
  if (const double ping = absl::GetFlag(FLAGS_ping_seconds); ping > 0) {
    const bool health = absl::GetFlag(FLAGS_ping_rpc) == "health";
    std::vector<double> pings;
    const absl::Time until = absl::Now() + absl::Seconds(ping);
    for (absl::Time t = absl::Now(); t < until; t = absl::Now()) {
      const absl::Status status =
          health ? (*client)->Health().status()
                 : (*client)->ReleaseSharedMemory("verifyd-load-ping-no-such-region").status();
      if (health ? !status.ok() : status.code() != absl::StatusCode::kNotFound) {
        return std::cerr << "verifyd_load: ping: " << status << "\n", 1;
      }
      pings.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
    }
    const auto p = verifyd::sched::Summarize(pings);
    std::fprintf(stderr, "# ping (%s, %lld calls): p50 %.0f us, p90 %.0f, p99 %.0f\n",
                 health ? "grpc.health.v1 Check" : "ReleaseSharedMemory NOT_FOUND",
                 static_cast<long long>(p.count), p.p50_us, p.p90_us, p.p99_us);
  }
  std::fprintf(stderr,
               "# %s backend, layers %d, heads %d, Q %d (%s), prefix %d, batch %d, tensors %s\n",
               stats->backend().c_str(), shape.layers, shape.heads, shape.nodes,
               absl::GetFlag(FLAGS_tree).c_str(), shape.prefix, shape.batch,
               shared_memory ? (copy_per_call ? "in shared memory, copied per call"
                                              : "in shared memory, written once per layer")
                             : "inline");
  std::printf("concurrency,throughput_rps,p50_us,p90_us,p99_us\n");

  uint64_t next_id = (absl::GetFlag(FLAGS_seed) << 32) + 1;
  for (int level : levels) {
    std::vector<Worker> workers(level);
    for (Worker& w : workers) {
      absl::Status s =
          Prepare(**client, shape, absl::GetFlag(FLAGS_seed), next_id, shared_memory, w);
      next_id += shape.batch;
      if (!s.ok()) return std::cerr << "verifyd_load: prefill: " << s << "\n", 1;
    }
    const absl::Time measure_from = absl::Now() + warmup, measure_to = measure_from + window;
    std::vector<std::thread> threads;
    for (Worker& w : workers) {
      threads.emplace_back([&, &w = w] {
        for (int64_t i = 0;; ++i) {
          const int layer = static_cast<int>(i % shape.layers);
          const v1::VerifyRequest& r = i == 0 ? w.first_step_layer0 : w.requests[layer];
          const absl::Time start = absl::Now();
          if (start >= measure_to) break;
          absl::Status status;
          if (shared_memory && copy_per_call) {
            status = (*client)->VerifyShared(r, w.q[layer], w.tree_kv[layer], w.region).status();
          } else if (shared_memory) {
            status = (*client)->VerifySharedInPlace(r, w.layouts[layer], w.region).status();
          } else {
            status = (*client)->Verify(r).status();
          }
          const absl::Time end = absl::Now();
          if (!status.ok()) {
            w.error = status;
            break;
          }
          if (start >= measure_from && end <= measure_to) {
            w.latencies_us.push_back(absl::ToDoubleMicroseconds(end - start));
            w.started_ms.push_back(absl::ToDoubleMilliseconds(start - measure_from));
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    std::vector<double> all;
    for (Worker& w : workers) {
      if (!w.error.ok()) return std::cerr << "verifyd_load: Verify: " << w.error << "\n", 1;
      all.insert(all.end(), w.latencies_us.begin(), w.latencies_us.end());
      for (uint64_t id : w.ids) (void)(*client)->Release(id);
    }
    const auto summary = verifyd::sched::Summarize(all);
    PrintTail(level, summary, workers);
    std::printf("%d,%.1f,%.0f,%.0f,%.0f\n", level, summary.count / absl::ToDoubleSeconds(window),
                summary.p50_us, summary.p90_us, summary.p99_us);
    std::fflush(stdout);
  }
  return 0;
}
