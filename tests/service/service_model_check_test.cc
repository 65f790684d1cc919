// The service-level model check (issue 17): concurrent clients against one in-process daemon over
// its Unix socket, each with its own ShadowModel of its own sequences. Each client runs random
// operations: chunked prefills that state their position, decode steps (Verify on every layer,
// riding commits, several sequences per call) checked element by element against the float64
// reference, Commit alone (a path or a rejection), Release, and injected bad requests (NaN and
// out-of-bound values, wrong expected positions, unknown sequences, bad trees, a chunk after a
// Release) whose codes the model predicts. A compaction thread and a Stats thread race them all.
// At the end the daemon's Stats equal the sum of the models, and releasing everything frees every
// slot. VERIFYD_TEST_SEED reproduces a run's choices (the interleaving is the scheduler's).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/append_chunking.h"
#include "gtest/gtest.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "tests/testing/test_seed.h"

namespace verifyd {
namespace {

using testing::RpcDriver;
using testing::ShadowModel;
using testing::VerifyPart;

constexpr int kClients = 6;
constexpr int kOperationsPerClient = 150;
constexpr int kMaxLiveSequences = 4;

uint64_t Seed() { return test::TestSeed(); }  // VERIFYD_TEST_SEED reproduces a run

// One client: its own model, its own ids (client c owns c * 1000 + k), its own random choices.
class ModelClient {
 public:
  ModelClient(int index, uint64_t seed, v1::Verifyd::Stub& stub, const ServiceOptions& options)
      : index_(index),
        stub_(stub),
        model_(options.layers, options.heads, options.softmax_scale,
               static_cast<uint32_t>(seed + index)),
        rpc_(stub, model_),
        rng_(seed * 31 + index) {}

  // Runs the operations; returns "" or the first failure.
  std::string Run() {
    for (int op = 0; op < kOperationsPerClient; ++op) {
      std::string failure;
      const int pick = Uniform(100);
      if (pick < 22 || live_.empty()) {
        failure = Prefill();
      } else if (pick < 60) {
        failure = DecodeStep();
      } else if (pick < 68) {
        failure = CommitAlone();
      } else if (pick < 76) {
        failure = ReleaseOne();
      } else if (pick < 82) {
        failure = AppendMore();
      } else {
        failure = BadRequest();
      }
      if (!failure.empty()) return absl::StrCat("client ", index_, " op ", op, ": ", failure);
    }
    return "";
  }

  // What this client holds: committed tokens, pending tree nodes, sequences.
  int64_t committed() const {
    int64_t n = 0;
    for (uint64_t id : live_) n += model_.committed_length(id);
    return n;
  }
  int64_t pending() const {
    int64_t n = 0;
    for (uint64_t id : live_) n += static_cast<int64_t>(model_.sequences().at(id).parents.size());
    return n;
  }
  int64_t sequences() const { return static_cast<int64_t>(live_.size()); }
  std::string ReleaseAll() {
    for (uint64_t id : std::vector<uint64_t>(live_)) {
      if (!rpc_.Release(id).ok()) return absl::StrCat("release of ", id, " failed");
    }
    live_.clear();
    return "";
  }
  const std::map<std::string, int>& codes() const { return codes_; }

 private:
  int Uniform(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  std::string Expect(const grpc::Status& status, grpc::StatusCode code, const char* what) {
    ++codes_[absl::StrCat(what, " ", static_cast<int>(status.error_code()))];
    if (status.error_code() == code) return "";
    return absl::StrCat(what, ": code ", status.error_code(), " (", status.error_message(),
                        "), want ", code);
  }

  grpc::Status Send(const v1::AppendRequest& request) {
    auto context = testing::ContextWithDeadline(std::chrono::milliseconds(30000));
    v1::AppendResponse response;
    return stub_.Append(context.get(), request, &response);
  }
  grpc::Status Send(const v1::VerifyRequest& request) {
    auto context = testing::ContextWithDeadline(std::chrono::milliseconds(30000));
    v1::VerifyResponse response;
    return stub_.Verify(context.get(), request, &response);
  }

  // A new sequence, prefilled in chunks that each state their position (SPEC §2).
  std::string Prefill() {
    if (static_cast<int>(live_.size()) >= kMaxLiveSequences) return ReleaseOne();
    const uint64_t id = static_cast<uint64_t>(index_) * 1000 + next_id_++;
    v1::AppendRequest whole = model_.MakeAppend(id, 1 + Uniform(120));
    SetExpectedPosition(AppendPosition::Create(), &whole);
    auto chunks = SplitAppend(whole, 64 << 10);
    if (!chunks.ok()) return chunks.status().ToString();
    for (const v1::AppendRequest& chunk : *chunks) {
      if (auto f = Expect(Send(chunk), grpc::StatusCode::OK, "prefill chunk"); !f.empty()) return f;
    }
    model_.AcceptAppend(whole);
    live_.push_back(id);
    return "";
  }

  // Tokens decided outside a tree, on a sequence without a pending tree.
  std::string AppendMore() {
    for (uint64_t id : live_) {
      if (model_.has_tree(id)) continue;
      v1::AppendRequest more = model_.MakeAppend(id, 1 + Uniform(5));
      SetExpectedPosition(AppendPosition::Fill(model_.committed_length(id)), &more);
      if (auto f = Expect(rpc_.Append(more), grpc::StatusCode::OK, "append"); !f.empty()) return f;
      return "";
    }
    return "";
  }

  // Verify on every layer for up to 3 sequences: a pending tree's next step commits a random path
  // (or 0 nodes) riding on layer 0 and sends a new tree.
  std::string DecodeStep() {
    std::vector<uint64_t> ids = live_;
    std::shuffle(ids.begin(), ids.end(), rng_);
    ids.resize(std::min<size_t>(ids.size(), 1 + Uniform(3)));
    std::vector<VerifyPart> parts;
    for (uint64_t id : ids) {
      VerifyPart part{id, model_.RandomParents(1 + Uniform(12)), std::nullopt};
      if (model_.has_tree(id)) {
        const auto& parents = model_.sequences().at(id).parents;
        part.commit_previous =
            Uniform(5) == 0 ? std::vector<int32_t>{} : model_.RandomPath(parents);
      }
      parts.push_back(part);
    }
    const std::string mismatch = rpc_.Step(parts, Uniform(2) == 0);
    ++codes_["step"];
    return mismatch;
  }

  std::string CommitAlone() {
    for (uint64_t id : live_) {
      if (!model_.has_tree(id)) continue;
      const auto& parents = model_.sequences().at(id).parents;
      const std::vector<int32_t> path =
          Uniform(4) == 0 ? std::vector<int32_t>{} : model_.RandomPath(parents);
      return Expect(rpc_.Commit(id, path), grpc::StatusCode::OK, "commit");
    }
    return "";
  }

  std::string ReleaseOne() {
    if (live_.empty()) return "";
    const size_t k = static_cast<size_t>(Uniform(static_cast<int>(live_.size())));
    const uint64_t id = live_[k];
    live_.erase(live_.begin() + static_cast<int64_t>(k));
    return Expect(rpc_.Release(id), grpc::StatusCode::OK, "release");
  }

  static void Poke(v1::Tensor* t, uint64_t random, bf16_bits value) {
    std::string* bytes = t->mutable_inline_data();
    const size_t at = random % (bytes->size() / 2);
    std::memcpy(bytes->data() + at * 2, &value, 2);
  }

  bf16_bits BadValue() {
    const bf16_bits values[] = {0x7fc0, 0xff80, 0x7f80, 0x4781, 0xc800, 0x7f7f};
    return values[Uniform(6)];
  }

  // Requests the daemon must refuse, with the code the model predicts; none changes a thing
  // (the next steps and the final Stats check it).
  std::string BadRequest() {
    const uint64_t id = live_[static_cast<size_t>(Uniform(static_cast<int>(live_.size())))];
    switch (Uniform(6)) {
      case 0: {  // a value beyond 2^16 (or NaN/Inf) in a new sequence's kv
        v1::AppendRequest a = model_.MakeAppend(static_cast<uint64_t>(index_) * 1000 + 999, 3);
        Poke(a.mutable_kv(), rng_(), BadValue());
        return Expect(Send(a), grpc::StatusCode::INVALID_ARGUMENT, "bad kv");
      }
      case 1: {  // the wrong fill (a chunk that believes in another length)
        if (model_.has_tree(id)) return "";
        v1::AppendRequest a = model_.MakeAppend(id, 2);
        SetExpectedPosition(AppendPosition::Fill(model_.committed_length(id) + 1 + Uniform(5)), &a);
        return Expect(Send(a), grpc::StatusCode::FAILED_PRECONDITION, "wrong fill");
      }
      case 2: {  // a chunk after the sequence's Release: never re-created
        const uint64_t gone = static_cast<uint64_t>(index_) * 1000 + next_id_++;
        v1::AppendRequest first = model_.MakeAppend(gone, 4);
        SetExpectedPosition(AppendPosition::Create(), &first);
        if (auto f = Expect(Send(first), grpc::StatusCode::OK, "first chunk"); !f.empty()) return f;
        v1::ReleaseRequest release;
        release.set_sequence_id(gone);
        v1::ReleaseResponse released;
        grpc::ClientContext context;
        if (auto f = Expect(stub_.Release(&context, release, &released), grpc::StatusCode::OK,
                            "release between chunks");
            !f.empty()) {
          return f;
        }
        v1::AppendRequest second = model_.MakeAppend(gone, 4);
        SetExpectedPosition(AppendPosition::Fill(4), &second);
        return Expect(Send(second), grpc::StatusCode::FAILED_PRECONDITION, "chunk after release");
      }
      case 3: {  // NaN/Inf/too large in tree_kv or q of a Verify, with a riding commit
        const bool pending = model_.has_tree(id);
        VerifyPart part{id, model_.RandomParents(3), std::nullopt};
        if (pending) part.commit_previous = model_.RandomPath(model_.sequences().at(id).parents);
        v1::VerifyRequest v = model_.MakeVerify(0, {part}, false);
        Poke(Uniform(2) ? v.mutable_q() : v.mutable_tree_kv(), rng_(), BadValue());
        return Expect(Send(v), grpc::StatusCode::INVALID_ARGUMENT, "bad verify values");
      }
      case 4: {  // an unknown sequence
        v1::VerifyRequest v = model_.MakeVerify(
            0, {VerifyPart{static_cast<uint64_t>(index_) * 1000 + 998, {-1}, std::nullopt}}, false);
        return Expect(Send(v), grpc::StatusCode::NOT_FOUND, "unknown sequence");
      }
      default: {  // a tree whose parent is not earlier
        VerifyPart part{id, {-1, 1}, std::nullopt};
        v1::VerifyRequest v = model_.MakeVerify(0, {part}, false);
        return Expect(Send(v), grpc::StatusCode::INVALID_ARGUMENT, "bad parents");
      }
    }
  }

  int index_;
  v1::Verifyd::Stub& stub_;
  ShadowModel model_;
  RpcDriver rpc_;
  std::mt19937_64 rng_;
  std::vector<uint64_t> live_;
  uint64_t next_id_ = 1;
  std::map<std::string, int> codes_;
};

TEST(ServiceModelCheckTest, ConcurrentClientsMatchTheirModelsAndStatsAddUp) {
  const uint64_t seed = Seed();
  SCOPED_TRACE(::testing::Message() << "VERIFYD_TEST_SEED=" << seed);
  ServiceOptions options = testing::SmallOptions("model");
  options.kv_capacity_tokens = 16384;
  testing::TestServer server(options);
  ASSERT_TRUE(server.status().ok()) << server.status();

  std::vector<std::unique_ptr<ModelClient>> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(std::make_unique<ModelClient>(c, seed, server.stub(), options));
  }
  std::atomic<bool> done{false};
  std::atomic<int> compactions{0}, stats_calls{0};
  std::string background_failure;
  absl::Mutex mu;
  // Compaction races every client's steps and releases; Stats races everything.
  std::thread compactor([&] {
    while (!done.load()) {
      grpc::ClientContext context;
      v1::CompactRequest request;
      request.set_budget_bytes(compactions.load() % 2 == 0 ? 0 : 64 * 3 * 1152);
      v1::CompactResponse response;
      const grpc::Status status = server.stub().Compact(&context, request, &response);
      if (!status.ok()) {
        absl::MutexLock lock(&mu);
        background_failure = "Compact: " + status.error_message();
        return;
      }
      ++compactions;
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  std::thread stats([&] {
    while (!done.load()) {
      grpc::ClientContext context;
      v1::StatsResponse response;
      if (server.stub().Stats(&context, v1::StatsRequest(), &response).ok()) ++stats_calls;
      absl::SleepFor(absl::Milliseconds(3));
    }
  });
  std::vector<std::string> failures(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] { failures[c] = clients[c]->Run(); });
  }
  for (std::thread& t : threads) t.join();
  done = true;
  compactor.join();
  stats.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
  EXPECT_EQ(background_failure, "");
  EXPECT_GT(compactions.load(), 0);
  EXPECT_GT(stats_calls.load(), 0);

  // The daemon's Stats equal the sum of the models (after the last compaction: wait it out).
  int64_t committed = 0, pending = 0, sequences = 0;
  std::map<std::string, int> codes;
  for (const auto& c : clients) {
    committed += c->committed();
    pending += c->pending();
    sequences += c->sequences();
    for (const auto& [k, v] : c->codes()) codes[k] += v;
  }
  for (const auto& [k, v] : codes) std::printf("  %-40s %d\n", k.c_str(), v);
  grpc::ClientContext context;
  v1::StatsResponse s;
  ASSERT_TRUE(server.stub().Stats(&context, v1::StatsRequest(), &s).ok());
  EXPECT_EQ(static_cast<int64_t>(s.fragmentation().sequences()), sequences);
  EXPECT_EQ(static_cast<int64_t>(s.fragmentation().tokens()), committed);
  EXPECT_EQ(static_cast<int64_t>(s.pending_tokens()), pending);
  EXPECT_EQ(static_cast<int64_t>(s.used_tokens()), committed + pending);
  EXPECT_EQ(s.used_tokens() + s.free_tokens(), s.capacity_tokens());
  // Each client saw its decode steps, and the model's bad requests, succeed or fail as predicted.
  EXPECT_GT(codes["step"], kClients * 10);
  EXPECT_GT(codes["chunk after release 9"], 0);  // FAILED_PRECONDITION = 9

  for (const auto& c : clients) EXPECT_EQ(c->ReleaseAll(), "");
  grpc::ClientContext after_context;
  v1::StatsResponse after;
  ASSERT_TRUE(server.stub().Stats(&after_context, v1::StatsRequest(), &after).ok());
  EXPECT_EQ(after.used_tokens(), 0u);
  EXPECT_EQ(after.fragmentation().sequences(), 0u);
}

}  // namespace
}  // namespace verifyd
