// The soak (issue 17, issue 33): an in-process daemon (cpu backend) on a Unix socket and client
// threads that each cycle through sequences' lives for --seconds: a chunked prefill that states its
// position; decode steps on every layer with riding commits, each step through gRPC, a
// shared-memory region or a channel over registered memory (tests/service/soak_lanes.h), every
// output checked against the float64 reference; a Commit alone, then a Fork at a random length
// (and now and then a fork of the fork) whose steps run batched with their source's; the source or
// a fork released while the others go on; the rest released. A Compact races them (converge and a
// small budget, alternately), so shared runs move under their holders. Each client remakes its
// channel every round and its region and registered memory every few, so rings, regions, channel
// threads and descriptors churn.
//
// Once a second it samples the process RSS and the daemon's files in /dev/shm (its run's prefix):
// after the warm-up (a fifth of the run, at least 2 s) RSS may grow by at most --rss_growth_mib,
// and at every sample the files may be at most what the clients hold (one region and one ring
// each, and one more each for a remake in progress) and their bytes at most that many of the
// largest. At the end everything is released: no sequence, channel, region or file is left.
// Exit 0 when every check held; the last line gives the figures. ctest runs it for 15 s;
// tools/soak/run_long.sh for as long as asked.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
#include "client/client.h"
#include "service/event_log.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/soak_lanes.h"
#include "tests/service/test_server.h"

namespace verifyd {
namespace {

using testing::Lane;
using testing::ShadowModel;
using testing::SoakLanes;
using testing::VerifyPart;

constexpr int kMaxNodes = 16;  // per sequence and step
constexpr int kMaxLive = 3;    // a source, a fork and a fork of the fork
constexpr int kStepsPerRound = 8;

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

struct ShmUse {
  int64_t files = 0;
  int64_t bytes = 0;
  int64_t largest = 0;
};

// The daemon's files in /dev/shm: every name its run gives starts with `prefix` (ShmInstance).
ShmUse ShmFiles(const std::string& prefix) {
  ShmUse use;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return use;
  while (dirent* entry = readdir(dir)) {
    if (!absl::StartsWith(entry->d_name, prefix)) continue;
    struct stat st {};
    if (stat(absl::StrCat("/dev/shm/", entry->d_name).c_str(), &st) != 0) continue;  // just gone
    ++use.files;
    use.bytes += st.st_size;
    use.largest = std::max<int64_t>(use.largest, st.st_size);
  }
  closedir(dir);
  return use;
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
    if (value("clients", &clients) && clients >= 1) {
      flags->clients = static_cast<int>(clients);
      continue;
    }
    std::fprintf(stderr, "usage: soak [--seconds=15] [--rss_growth_mib=64] [--clients=4]\n");
    return false;
  }
  return true;
}

// What the clients did, for the last line (a soak that never forked or used a lane proves little).
struct Counts {
  std::atomic<int64_t> steps{0}, forks{0}, renewals{0};
  std::atomic<int64_t> lane_steps[testing::kLanes] = {};
};

class SoakClient {
 public:
  SoakClient(int index, const ServiceOptions& options, testing::TestServer& server, Counts& counts)
      : index_(index),
        stub_(server.stub()),
        model_(options.layers, options.heads, options.softmax_scale, std::random_device{}()),
        rng_(std::random_device{}()),
        counts_(counts) {
    ClientOptions o;
    o.client_id = absl::StrCat("soak-", index);
    client_ = *Client::FromChannel(server.channel(), o);
    lanes_ = std::make_unique<SoakLanes>(*client_, stub_, model_, kMaxLive * kMaxNodes);
  }

  // Runs until `stop`: "" or the first failure.
  std::string Run(const std::atomic<bool>& stop) {
    for (uint64_t round = 0; !stop.load(); ++round) {
      if (absl::Status renewed = lanes_->Renew(round); !renewed.ok()) {
        return absl::StrCat("round ", round, ": remaking the lanes: ", renewed.ToString());
      }
      ++counts_.renewals;
      if (std::string failure = Round(round, stop); !failure.empty()) {
        return absl::StrCat("round ", round, ": ", failure);
      }
    }
    if (absl::Status closed = lanes_->Close(); !closed.ok()) {
      return absl::StrCat("closing the lanes: ", closed.ToString());
    }
    return "";
  }

 private:
  uint64_t NewId() { return (static_cast<uint64_t>(index_ + 1) << 40) + next_id_++; }
  Lane RandomLane() { return static_cast<Lane>(rng_() % testing::kLanes); }

  std::string Prefill(uint64_t id) {
    v1::AppendRequest whole = model_.MakeAppend(id, 50 + static_cast<int>(rng_() % 400));
    SetExpectedPosition(AppendPosition::Create(), &whole);
    auto chunks = SplitAppend(whole, 128 << 10);
    if (!chunks.ok()) return chunks.status().ToString();
    for (const v1::AppendRequest& chunk : *chunks) {
      auto context = testing::ContextWithDeadline(std::chrono::milliseconds(30000));
      v1::AppendResponse response;
      const grpc::Status status = stub_.Append(context.get(), chunk, &response);
      if (!status.ok()) return absl::StrCat("prefill of ", id, ": ", status.error_message());
    }
    model_.AcceptAppend(whole);
    return "";
  }

  // Commits `source`'s pending tree alone (a Fork needs none), then forks it at a random length.
  std::string ForkOf(uint64_t source, uint64_t fork) {
    if (model_.has_tree(source)) {
      const std::vector<int32_t> path = model_.RandomPath(model_.sequences().at(source).parents);
      const Lane lane = RandomLane();
      if (std::string f = lanes_->Commit(lane, source, path); !f.empty()) {
        return absl::StrCat("commit of ", source, " (", LaneName(lane), "): ", f);
      }
    }
    const int64_t n = model_.committed_length(source);
    const uint64_t k = 1 + rng_() % static_cast<uint64_t>(n);
    testing::RpcDriver rpc(stub_, model_);
    const grpc::Status status = rpc.Fork(source, fork, k);
    if (!status.ok()) {
      return absl::StrCat("Fork(", source, " -> ", fork, ", ", k, "): ", status.error_message());
    }
    ++counts_.forks;
    return "";
  }

  std::string Round(uint64_t round, const std::atomic<bool>& stop) {
    std::vector<uint64_t> live = {NewId()};
    if (std::string f = Prefill(live[0]); !f.empty()) return f;
    for (int step = 0; step < kStepsPerRound && !stop.load(); ++step) {
      if (step == 2 || (step == 4 && rng_() % 2 == 0 && live.size() < kMaxLive)) {
        const uint64_t fork = NewId();
        if (std::string f = ForkOf(live.back(), fork); !f.empty()) return f;
        live.push_back(fork);
      }
      if (step == 6 && live.size() > 1) {
        // The source or a fork goes; the others keep their shared prefix.
        const size_t gone = rng_() % live.size();
        testing::RpcDriver rpc(stub_, model_);
        if (!rpc.Release(live[gone]).ok()) return absl::StrCat("release of ", live[gone]);
        model_.AcceptRelease(live[gone]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(gone));
      }
      std::vector<VerifyPart> parts;
      for (uint64_t id : live) {
        VerifyPart part{id, model_.RandomParents(1 + static_cast<int>(rng_() % kMaxNodes)),
                        std::nullopt};
        if (model_.has_tree(id)) {
          part.commit_previous = model_.RandomPath(model_.sequences().at(id).parents);
        }
        parts.push_back(std::move(part));
      }
      const Lane lane = RandomLane();
      const std::string mismatch = lanes_->Step(lane, parts, (step + round) % 2 == 0);
      if (!mismatch.empty()) {
        return absl::StrCat("step ", step, " (", LaneName(lane), ", ", live.size(),
                            " sequences): ", mismatch);
      }
      ++counts_.steps;
      ++counts_.lane_steps[static_cast<int>(lane)];
    }
    testing::RpcDriver rpc(stub_, model_);
    for (uint64_t id : live) {
      if (!rpc.Release(id).ok()) return absl::StrCat("release of ", id, " failed");
      model_.AcceptRelease(id);
    }
    return "";
  }

  const int index_;
  v1::Verifyd::Stub& stub_;
  ShadowModel model_;
  std::mt19937_64 rng_;
  Counts& counts_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<SoakLanes> lanes_;
  uint64_t next_id_ = 0;
};

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  // Each round opens and closes a channel: info would log two lines a round a client.
  (void)event_log::SetLevel("warning");
  ServiceOptions options = testing::OnCpu(testing::SmallOptions("soak"));
  options.kv_capacity_tokens = 8192;
  testing::TestServer server(options);
  if (!server.status().ok()) {
    std::fprintf(stderr, "soak: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string shm_prefix = server.server().shm_prefix();
  std::atomic<bool> stop{false};
  Counts counts;
  std::vector<std::string> failures(flags.clients);
  std::vector<std::unique_ptr<SoakClient>> clients;
  for (int c = 0; c < flags.clients; ++c) {
    clients.push_back(std::make_unique<SoakClient>(c, options, server, counts));
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < flags.clients; ++c) {
    threads.emplace_back([&, c] {
      failures[c] = clients[c]->Run(stop);
      if (!failures[c].empty()) stop = true;
    });
  }
  std::atomic<int64_t> compactions{0};
  threads.emplace_back([&] {
    for (int i = 0; !stop.load(); ++i) {
      grpc::ClientContext context;
      v1::CompactRequest request;
      if (i % 2 == 1) request.set_budget_bytes(4 * 3 * 1152);  // a few rows: stops part-way
      v1::CompactResponse response;
      if (server.stub().Compact(&context, request, &response).ok()) ++compactions;
      absl::SleepFor(absl::Milliseconds(200));
    }
  });

  std::string sample_failure;
  const absl::Time start = absl::Now();
  const absl::Duration warmup = std::max(absl::Seconds(flags.seconds / 5), absl::Seconds(2));
  int64_t rss_warm = -1, rss_max = 0;
  ShmUse shm_max;
  int64_t samples = 0;
  const int64_t max_files = int64_t{4} * flags.clients;
  const int64_t max_shm_bytes =
      int64_t{2} * flags.clients *
      (static_cast<int64_t>(SoakLanes::RegionFileBytes(kMaxLive * kMaxNodes, options.heads)) +
       static_cast<int64_t>(SoakLanes::RingFileBytes()));
  while (!stop.load() && absl::Now() - start < absl::Seconds(flags.seconds)) {
    absl::SleepFor(absl::Seconds(1));
    const int64_t rss = RssBytes();
    if (rss_warm < 0 && absl::Now() - start >= warmup) rss_warm = rss;
    if (rss_warm >= 0) rss_max = std::max(rss_max, rss);
    // Each client holds one region and one ring, and may be remaking one of each.
    const ShmUse shm = ShmFiles(shm_prefix);
    if (shm.files > max_files || shm.bytes > max_shm_bytes) {
      sample_failure =
          absl::StrCat("/dev/shm holds ", shm.files, " files of ", shm_prefix, " (", shm.bytes,
                       " bytes), more than ", max_files, " files or ", max_shm_bytes,
                       " bytes (two regions and two rings a client): ", "a region or ring leaked");
      stop = true;
    }
    // A long run's trajectory, once a minute: growth that a plateau would hide in the maximum.
    if (++samples % 60 == 0) {
      std::printf("soak: %4lld s: RSS %.1f MiB, /dev/shm %lld files %.2f MiB, %lld steps\n",
                  static_cast<long long>(samples), rss / (1024.0 * 1024.0),
                  static_cast<long long>(shm.files), shm.bytes / (1024.0 * 1024.0),
                  static_cast<long long>(counts.steps.load()));
      std::fflush(stdout);
    }
    shm_max.files = std::max(shm_max.files, shm.files);
    shm_max.bytes = std::max(shm_max.bytes, shm.bytes);
    shm_max.largest = std::max(shm_max.largest, shm.largest);
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  int failed = 0;
  for (const std::string& f : failures) {
    if (f.empty()) continue;
    std::fprintf(stderr, "soak: %s\n", f.c_str());
    failed = 1;
  }
  if (!sample_failure.empty()) {
    std::fprintf(stderr, "soak: %s\n", sample_failure.c_str());
    failed = 1;
  }
  // Everything was released: nothing of it may be left in the store or in /dev/shm.
  clients.clear();
  grpc::ClientContext context;
  v1::StatsResponse stats;
  if (!server.stub().Stats(&context, v1::StatsRequest(), &stats).ok()) {
    std::fprintf(stderr, "soak: Stats failed at the end\n");
    failed = 1;
  } else if (stats.used_tokens() != 0 || stats.fragmentation().sequences() != 0 ||
             stats.channels() != 0 || stats.external_regions() != 0) {
    std::fprintf(stderr,
                 "soak: left at the end: %llu used tokens, %llu sequences, %llu channels, %llu "
                 "registered regions\n",
                 static_cast<unsigned long long>(stats.used_tokens()),
                 static_cast<unsigned long long>(stats.fragmentation().sequences()),
                 static_cast<unsigned long long>(stats.channels()),
                 static_cast<unsigned long long>(stats.external_regions()));
    failed = 1;
  }
  const ShmUse left = ShmFiles(shm_prefix);
  if (left.files != 0) {
    std::fprintf(stderr, "soak: %lld files of %s left in /dev/shm (%lld bytes)\n",
                 static_cast<long long>(left.files), shm_prefix.c_str(),
                 static_cast<long long>(left.bytes));
    failed = 1;
  }
  const double mib = 1024.0 * 1024.0;
  const double growth = rss_warm < 0 ? 0 : (rss_max - rss_warm) / mib;
  std::printf(
      "soak: %.0f s, %d clients, %lld decode steps (grpc %lld, shared memory %lld, channel %lld), "
      "%lld forks, %lld lane renewals, %lld compactions; RSS %.1f MiB after warm-up, max %.1f "
      "MiB, growth %.1f MiB (bound %.0f); /dev/shm max %lld files, %.2f MiB, at the end %lld\n",
      absl::ToDoubleSeconds(absl::Now() - start), flags.clients,
      static_cast<long long>(counts.steps.load()),
      static_cast<long long>(counts.lane_steps[0].load()),
      static_cast<long long>(counts.lane_steps[1].load()),
      static_cast<long long>(counts.lane_steps[2].load()),
      static_cast<long long>(counts.forks.load()), static_cast<long long>(counts.renewals.load()),
      static_cast<long long>(compactions.load()), rss_warm / mib, rss_max / mib, growth,
      flags.rss_growth_mib, static_cast<long long>(shm_max.files), shm_max.bytes / mib,
      static_cast<long long>(left.files));
  if (counts.steps.load() == 0 || counts.forks.load() == 0) {
    std::fprintf(stderr, "soak: no decode step or no fork completed\n");
    failed = 1;
  }
  for (int lane = 0; lane < testing::kLanes; ++lane) {
    if (counts.lane_steps[lane].load() == 0) {
      std::fprintf(stderr, "soak: no step went through the %s lane\n",
                   testing::LaneName(static_cast<Lane>(lane)));
      failed = 1;
    }
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
