// The soak (issue 17): an in-process daemon on a Unix socket and client threads that each cycle
// through a sequence's life (a chunked prefill that states its position, decode steps on every
// layer with riding commits, every output checked against the float64 reference, a Release), with
// a Compact racing them, for --seconds. The process RSS is sampled once a second; after the
// warm-up (a fifth of the run, at least 2 s) it may grow by at most --rss_growth_mib. Exit 0 when
// every check held; the last line says steps, RSS at warm-up and at the end, and the growth.
// ctest runs it for 15 s; tools/soak/run_long.sh for as long as asked.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/append_chunking.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"

namespace verifyd {
namespace {

using testing::ShadowModel;
using testing::VerifyPart;

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

struct Flags {
  double seconds = 15;
  double rss_growth_mib = 64;
  int clients = 4;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name, double* out) {
      const std::string prefix = absl::StrCat("--", name, "=");
      return absl::StartsWith(arg, prefix) && absl::SimpleAtod(arg.substr(prefix.size()), out);
    };
    double clients = 0;
    if (value("seconds", &flags->seconds) || value("rss_growth_mib", &flags->rss_growth_mib)) {
      continue;
    }
    if (value("clients", &clients)) {
      flags->clients = static_cast<int>(clients);
      continue;
    }
    std::fprintf(stderr, "usage: soak [--seconds=15] [--rss_growth_mib=64] [--clients=4]\n");
    return false;
  }
  return true;
}

// One client's loop until `stop`: returns "" or the first failure.
std::string ClientLoop(int index, const ServiceOptions& options, v1::Verifyd::Stub& stub,
                       const std::atomic<bool>& stop, std::atomic<int64_t>& steps) {
  ShadowModel model(options.layers, options.heads, options.softmax_scale, std::random_device{}());
  testing::RpcDriver rpc(stub, model);
  std::mt19937_64 rng(std::random_device{}());
  for (uint64_t round = 0; !stop.load(); ++round) {
    const uint64_t id = (static_cast<uint64_t>(index) << 32) + round;
    v1::AppendRequest whole = model.MakeAppend(id, 50 + static_cast<int>(rng() % 400));
    SetExpectedPosition(AppendPosition::Create(), &whole);
    auto chunks = SplitAppend(whole, 128 << 10);
    if (!chunks.ok()) return chunks.status().ToString();
    for (const v1::AppendRequest& chunk : *chunks) {
      auto context = testing::ContextWithDeadline(std::chrono::milliseconds(30000));
      v1::AppendResponse response;
      const grpc::Status status = stub.Append(context.get(), chunk, &response);
      if (!status.ok()) return absl::StrCat("prefill of ", id, ": ", status.error_message());
    }
    model.AcceptAppend(whole);
    VerifyPart part{id, model.RandomParents(1 + static_cast<int>(rng() % 16)), std::nullopt};
    for (int step = 0; step < 8 && !stop.load(); ++step) {
      const std::string mismatch = rpc.Step({part}, step % 2 == 0);
      if (!mismatch.empty()) return absl::StrCat("sequence ", id, " step ", step, ": ", mismatch);
      ++steps;
      part.commit_previous = model.RandomPath(part.parents);
      part.parents = model.RandomParents(1 + static_cast<int>(rng() % 16));
    }
    if (!rpc.Release(id).ok()) return absl::StrCat("release of ", id, " failed");
  }
  return "";
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  ServiceOptions options = testing::SmallOptions("soak");
  options.kv_capacity_tokens = 8192;
  testing::TestServer server(options);
  if (!server.status().ok()) {
    std::fprintf(stderr, "soak: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> steps{0};
  std::vector<std::string> failures(flags.clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < flags.clients; ++c) {
    threads.emplace_back([&, c] {
      failures[c] = ClientLoop(c, options, server.stub(), stop, steps);
      if (!failures[c].empty()) stop = true;
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) {
      grpc::ClientContext context;
      v1::CompactRequest request;
      v1::CompactResponse response;
      (void)server.stub().Compact(&context, request, &response);
      absl::SleepFor(absl::Milliseconds(200));
    }
  });

  const absl::Time start = absl::Now();
  const absl::Duration warmup = std::max(absl::Seconds(flags.seconds / 5), absl::Seconds(2));
  int64_t rss_warm = -1, rss_max = 0;
  while (!stop.load() && absl::Now() - start < absl::Seconds(flags.seconds)) {
    absl::SleepFor(absl::Seconds(1));
    const int64_t rss = RssBytes();
    if (rss_warm < 0 && absl::Now() - start >= warmup) rss_warm = rss;
    if (rss_warm >= 0) rss_max = std::max(rss_max, rss);
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  int failed = 0;
  for (const std::string& f : failures) {
    if (f.empty()) continue;
    std::fprintf(stderr, "soak: %s\n", f.c_str());
    failed = 1;
  }
  const double mib = 1024.0 * 1024.0;
  const double growth = rss_warm < 0 ? 0 : (rss_max - rss_warm) / mib;
  std::printf(
      "soak: %.0f s, %d clients, %lld decode steps, RSS %.1f MiB after warm-up, max %.1f "
      "MiB, growth %.1f MiB (bound %.0f)\n",
      absl::ToDoubleSeconds(absl::Now() - start), flags.clients,
      static_cast<long long>(steps.load()), rss_warm / mib, rss_max / mib, growth,
      flags.rss_growth_mib);
  if (steps.load() == 0) {
    std::fprintf(stderr, "soak: no decode step completed\n");
    failed = 1;
  }
  if (growth > flags.rss_growth_mib) {
    std::fprintf(stderr, "soak: RSS grew by %.1f MiB, more than %.0f\n", growth,
                 flags.rss_growth_mib);
    failed = 1;
  }
  return failed;
}

}  // namespace
}  // namespace verifyd

int main(int argc, char** argv) { return verifyd::Main(argc, argv); }
