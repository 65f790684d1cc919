// Per-call latency of one Verify through each path a co-located scheduler has, on the cpu backend
// (plans/0017-data-plane.md): gRPC with inline tensors, gRPC with tensors in a daemon shared-memory
// region (VerifySharedInPlace), and a channel with tensors in registered memory. The daemon runs
// in a forked child (its own process, as in production); the same pending tree is verified again
// each call, so the compute is the same on every path and the difference is the path. Prints
// p50 / p90 / p99 per path and shape; nothing is asserted.
//
//   data_plane_bench [--calls=N]
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/host_memory.h"
#include "client/shared_tensor.h"
#include "client/tensor.h"
#include "service/service_options.h"
#include "service/verifyd_server.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kHeads = 8;

struct Shape {
  const char* name;
  int prefix;
  int nodes;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void Print(const char* shape, const char* path, const std::vector<double>& us) {
  std::printf("%-10s %-26s p50 %8.1f us   p90 %8.1f us   p99 %8.1f us\n", shape, path,
              Percentile(us, 0.5), Percentile(us, 0.9), Percentile(us, 0.99));
}

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> exponent(120, 127);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v)
    x = static_cast<uint16_t>((rng() & 0x8000) | (exponent(rng) << 7) | (rng() & 0x7F));
  return v;
}

int RunBench(const std::string& target, int calls) {
  ClientOptions options;
  options.client_id = "data-plane-bench";
  auto client = Client::Connect(target, options);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  for (int i = 0; i < 200 && !(*client)->Stats().ok(); ++i) usleep(20000);
  std::mt19937 rng(7);
  const Shape shapes[] = {{"tiny", 16, 1}, {"S1-short", 1024, 16}};
  uint64_t sequence = 1;
  for (const Shape& shape : shapes) {
    // Prefill and one pending tree on layer 0.
    const std::vector<uint16_t> kv = RandomBf16(size_t(shape.prefix) * kKvDim, rng);
    if (!(*client)->AppendKv(sequence, 0, 1, shape.prefix, kv, AppendPosition::Create()).ok())
      return 1;
    std::vector<int32_t> parents(shape.nodes);
    for (int i = 0; i < shape.nodes; ++i) parents[i] = i - 1;
    const std::vector<uint16_t> q = RandomBf16(size_t(shape.nodes) * kHeads * kKvDim, rng);
    const std::vector<uint16_t> tree_kv = RandomBf16(size_t(shape.nodes) * kKvDim, rng);
    v1::VerifyRequest request;
    request.set_layer(0);
    auto* s = request.add_sequences();
    s->set_sequence_id(sequence);
    for (int32_t p : parents) s->add_parents(p);
    const int64_t q_shape[] = {shape.nodes, kHeads, kKvDim};
    const int64_t kv_shape[] = {shape.nodes, kKvDim};

    // gRPC, inline.
    {
      v1::VerifyRequest inline_request = request;
      *inline_request.mutable_q() = *tensor::MakeBf16(q_shape, q);
      *inline_request.mutable_tree_kv() = *tensor::MakeBf16(kv_shape, tree_kv);
      std::vector<double> us;
      for (int i = 0; i < calls + 20; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!(*client)->Verify(inline_request).ok()) return 1;
        const double d =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count();
        if (i >= 20) us.push_back(d);
      }
      Print(shape.name, "gRPC inline", us);
    }
    // gRPC, tensors in place in a daemon region.
    {
      const SharedVerifyLayout layout = SharedVerifyLayoutAt(0, shape.nodes, kHeads, false);
      auto region = (*client)->CreateSharedMemory(layout.end);
      if (!region.ok()) return 1;
      std::memcpy(region->bytes().data() + layout.q, q.data(), q.size() * 2);
      std::memcpy(region->bytes().data() + layout.tree_kv, tree_kv.data(), tree_kv.size() * 2);
      std::vector<double> us;
      for (int i = 0; i < calls + 20; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!(*client)->VerifySharedInPlace(request, layout, *region).ok()) return 1;
        const double d =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count();
        if (i >= 20) us.push_back(d);
      }
      Print(shape.name, "gRPC shared memory", us);
    }
    // The channel, tensors in registered memory.
    {
      const SharedVerifyLayout layout = SharedVerifyLayoutAt(0, shape.nodes, kHeads, false);
      const uint64_t bytes = layout.end + 128;
      absl::StatusOr<HostMemory> memory = HostMemory::Create(bytes);
      if (!memory.ok()) return 1;
      uint8_t* data = memory->data();
      std::memcpy(data + layout.q, q.data(), q.size() * 2);
      std::memcpy(data + layout.tree_kv, tree_kv.data(), tree_kv.size() * 2);
      auto registered = (*client)->RegisterExternalMemory(memory->handle(), bytes);
      auto channel = (*client)->OpenChannel(8);
      if (!registered.ok() || !channel.ok()) return 1;
      const uint64_t region = registered->region();
      Channel::VerifyDescriptor d;
      d.layer = 0;
      d.sequences.push_back({sequence, parents, std::nullopt});
      d.q = {region, layout.q};
      d.tree_kv = {region, layout.tree_kv};
      d.out = {region, layout.out};
      auto ready = std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(data + layout.end));
      std::vector<double> us;
      for (int i = 0; i < calls + 20; ++i) {
        d.id = static_cast<uint64_t>(i + 1);
        d.ready = {region, layout.end, static_cast<uint32_t>(i + 1)};
        d.done = {region, layout.end + 64, static_cast<uint32_t>(i + 1)};
        const auto t0 = std::chrono::steady_clock::now();
        ready.store(static_cast<uint32_t>(i + 1), std::memory_order_release);
        if (!(*channel)->EnqueueVerify(d).ok()) return 1;
        auto c = (*channel)->WaitCompletion(absl::Seconds(30));
        if (!c.ok() || !c->status.ok()) return 1;
        const double dt =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count();
        if (i >= 20) us.push_back(dt);
      }
      Print(shape.name, "channel (CPU waits)", us);
      (void)(*channel)->Close();
      (void)(*client)->ReleaseExternalMemory(region);
    }
    ++sequence;
  }
  return 0;
}

}  // namespace
}  // namespace verifyd

int main(int argc, char** argv) {
  int calls = 2000;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--calls=", 8) == 0) calls = std::atoi(argv[i] + 8);
  }
  verifyd::ServiceOptions options;
  options.listen = absl::StrCat("unix:///tmp/verifyd-data-plane-bench-", getpid(), ".sock");
  options.metrics = "";
  options.backend = verifyd::BackendKind::kCpu;
  options.layers = 1;
  options.heads = verifyd::kHeads;
  options.kv_capacity_tokens = 4096;
  options.compute_threads = 1;
  // The daemon in a process of its own, forked before this process touches gRPC.
  const pid_t daemon = fork();
  if (daemon == 0) {
    verifyd::VerifydServer server(options);
    if (!server.Start().ok() || !server.BecomeReady().ok()) _exit(1);
    pause();  // until SIGTERM
    _exit(0);
  }
  std::printf("data_plane_bench: cpu backend, H=%d, %d calls per path (daemon pid %d)\n",
              verifyd::kHeads, calls, daemon);
  const int rc = verifyd::RunBench(options.listen, calls);
  kill(daemon, SIGKILL);
  waitpid(daemon, nullptr, 0);
  if (rc != 0) std::fprintf(stderr, "data_plane_bench: a call failed\n");
  return rc;
}
