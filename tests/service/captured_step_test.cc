// A decode step captured in a CUDA graph (SPEC §3.1 "Inside the engine's CUDA graph",
// plans/0033), on the cpu backend: the engine's three kernels run as their host versions
// (CapturedStep::PublishHost / SignalReadyHost / WaitDoneHost) over a sealed memfd standing in for
// device memory, and the daemon's channel thread polls the step area, applies each step's riding
// commits and runs every captured layer behind its ready flag, exactly as it does on the GPU. The
// GPU twin is data_plane_captured_gpu_test (a real cudaGraph replayed).
//
// What is checked: every output element of >= 50 steps with trees that change every step (chains,
// stars, forests, random bushes), a growing prefix and riding commits against the float64
// reference; PrepareCapture's refusals (each names the field and its bound, and nothing is held
// after it); a step whose record leaves the bucket (NaN outputs, done flags, the step's status
// names the field); a replay after the capture ended (channel closed, daemon restarted) never
// reads stale outputs; a scheduler that dies mid-step leaves no wait behind and others are served.
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "channel/step_area.h"
#include "client/captured_step.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using testing::Harness;
using ::testing::HasSubstr;
using testing::Layout;
using testing::LayoutFor;
using testing::PollUntil;
using testing::Scratch;
using testing::ShadowModel;
using testing::VerifyPart;

constexpr uint32_t kMaxBatch = 3;
constexpr uint32_t kMaxQ = 8;
constexpr int kHeads = 4;  // Harness's model and SmallOptions

v1::ExternalMemoryRef Ref(uint64_t region, uint64_t offset) {
  v1::ExternalMemoryRef r;
  r.set_region(region);
  r.set_offset(offset);
  return r;
}

// The bucket's tensors and flags at LayoutFor(max rows) in the scratch region.
v1::PrepareCaptureRequest BucketRequest(uint64_t region, bool lse) {
  const Layout l = LayoutFor(kMaxBatch * kMaxQ, kHeads);
  v1::PrepareCaptureRequest r;
  r.set_max_batch(kMaxBatch);
  r.set_max_q(kMaxQ);
  *r.mutable_q() = Ref(region, l.q);
  *r.mutable_tree_kv() = Ref(region, l.tree_kv);
  *r.mutable_out() = Ref(region, l.out);
  if (lse) *r.mutable_lse() = Ref(region, l.lse);
  r.set_return_lse(lse);
  *r.mutable_ready() = Ref(region, l.ready);
  *r.mutable_done() = Ref(region, l.done);
  return r;
}

CapturedStep::Targets TargetsIn(const Scratch& scratch, bool lse) {
  const Layout l = LayoutFor(kMaxBatch * kMaxQ, kHeads);
  CapturedStep::Targets t;
  t.ready = reinterpret_cast<uint32_t*>(scratch.data() + l.ready);
  t.done = reinterpret_cast<const uint32_t*>(scratch.data() + l.done);
  t.out = reinterpret_cast<uint16_t*>(scratch.data() + l.out);
  t.out_elements = uint64_t{kMaxBatch} * kMaxQ * kHeads * kVDim;
  if (lse) {
    t.lse = reinterpret_cast<float*>(scratch.data() + l.lse);
    t.lse_elements = uint64_t{kMaxBatch} * kMaxQ * kHeads;
  }
  return t;
}

// The first `rows` rows of out (x heads) are NaN.
bool RowsNan(const CapturedStep::Targets& t, uint64_t rows) {
  for (uint64_t k = 0; k < rows * kHeads * kVDim; ++k) {
    if ((t.out[k] & 0x7F80) != 0x7F80 || (t.out[k] & 0x7F) == 0) return false;
  }
  return true;
}

bool AllNan(const CapturedStep::Targets& t) {
  for (uint64_t k = 0; k < t.out_elements; ++k) {
    if ((t.out[k] & 0x7F80) != 0x7F80 || (t.out[k] & 0x7F) == 0) return false;
  }
  for (uint64_t k = 0; t.lse != nullptr && k < t.lse_elements; ++k) {
    if (!std::isnan(t.lse[k])) return false;
  }
  return true;
}

// Trees of every shape the bucket allows: a chain, a star, a forest of chains, a random bush.
std::vector<int32_t> TreeOfShape(int shape, int nodes, std::mt19937& rng, ShadowModel& model) {
  std::vector<int32_t> parents(nodes);
  for (int i = 0; i < nodes; ++i) {
    switch (shape % 4) {
      case 0:
        parents[i] = i - 1;
        break;
      case 1:
        parents[i] = i == 0 ? -1 : 0;
        break;
      case 2:
        parents[i] = (i % 3 == 0) ? -1 : i - 1;
        break;
      default:
        return model.RandomParents(nodes);
    }
  }
  (void)rng;
  return parents;
}

// One engine: a channel, the bucket's memory, the prepared capture.
struct Engine {
  Engine(Harness& h, bool lse, absl::Duration lease_heartbeat = absl::ZeroDuration())
      : scratch(4 << 20), lse(lse) {
    (void)lease_heartbeat;
    region = h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
    channel = *h.client->OpenChannel(8);
  }
  absl::Status Prepare(Harness& h) {
    absl::StatusOr<std::unique_ptr<CapturedStep>> c = CapturedStep::Prepare(
        *h.client, *channel, BucketRequest(region, lse), TargetsIn(scratch, lse));
    if (!c.ok()) return c.status();
    capture = *std::move(c);
    return absl::OkStatus();
  }
  // Copies one layer's q and tree_kv (the request's) where the bucket has them.
  void WriteInputs(const v1::VerifyRequest& r) const {
    const Layout l = LayoutFor(kMaxBatch * kMaxQ, kHeads);
    std::memcpy(scratch.data() + l.q, r.q().inline_data().data(), r.q().inline_data().size());
    std::memcpy(scratch.data() + l.tree_kv, r.tree_kv().inline_data().data(),
                r.tree_kv().inline_data().size());
  }
  v1::VerifyResponse Outputs(const v1::VerifyRequest& r, const ShadowModel& model) const {
    const Layout l = LayoutFor(kMaxBatch * kMaxQ, kHeads);
    int64_t tq = 0;
    for (const auto& s : r.sequences()) tq += s.parents_size();
    v1::VerifyResponse out;
    out.mutable_out()->set_dtype(v1::DTYPE_BF16);
    for (int64_t d : {tq, int64_t{kHeads}, int64_t{kVDim}}) out.mutable_out()->add_shape(d);
    out.mutable_out()->set_inline_data(scratch.data() + l.out, tq * kHeads * kVDim * 2);
    if (r.return_lse()) {
      out.mutable_lse()->set_dtype(v1::DTYPE_FP32);
      out.mutable_lse()->add_shape(tq);
      out.mutable_lse()->add_shape(kHeads);
      out.mutable_lse()->set_inline_data(scratch.data() + l.lse, tq * kHeads * 4);
    }
    for (const auto& s : r.sequences()) {
      out.add_committed_length(static_cast<uint64_t>(model.committed_length(s.sequence_id())));
    }
    return out;
  }

  Scratch scratch;
  bool lse;
  uint64_t region = 0;
  std::unique_ptr<Channel> channel;
  std::unique_ptr<CapturedStep> capture;
};

std::vector<Channel::Sequence> RecordOf(const std::vector<VerifyPart>& parts) {
  std::vector<Channel::Sequence> record;
  for (const VerifyPart& p : parts) record.push_back({p.sequence, p.parents, p.commit_previous});
  return record;
}

TEST(CapturedStepTest, ReplaysMatchTheReferenceWithChangingTreesAndRidingCommits) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("cap-match"));
  ASSERT_TRUE(h.server.status().ok());
  Engine e(h, /*lse=*/true);
  ASSERT_TRUE(e.Prepare(h).ok());
  EXPECT_EQ(e.capture->num_layers(), 3u);
  EXPECT_NE(e.capture->epoch(), 0u);
  const std::vector<uint64_t> sequences = {1, 2, 3};
  h.AppendSequence(1, 23);
  h.AppendSequence(2, 4);
  h.AppendSequence(3, 61);
  std::mt19937 rng(Harness::Seed());
  std::map<uint64_t, std::vector<int32_t>> pending;
  const int64_t start_length = h.model.committed_length(1);
  for (int step = 1; step <= 54; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    std::vector<VerifyPart> parts;
    for (uint64_t seq : sequences) {
      VerifyPart p;
      p.sequence = seq;
      if (pending.contains(seq)) p.commit_previous = h.model.RandomPath(pending[seq]);
      p.parents = TreeOfShape(step + static_cast<int>(seq), 1 + rng() % kMaxQ, rng, h.model);
      parts.push_back(p);
    }
    // The graph's first node: the record (trees and riding commits) into the step area.
    const uint64_t published = e.capture->PublishHost(RecordOf(parts));
    ASSERT_EQ(published, static_cast<uint64_t>(step));
    for (int layer = 0; layer < 3; ++layer) {
      if (layer == 1) {
        for (VerifyPart& p : parts) p.commit_previous.reset();  // rode on the first layer
      }
      const v1::VerifyRequest request = h.model.MakeVerify(layer, parts, true);
      e.WriteInputs(request);
      std::memset(e.capture->targets().out, 0x11, e.capture->targets().out_elements * 2);
      e.capture->SignalReadyHost(layer);
      e.capture->WaitDoneHost(layer, absl::Seconds(30));
      ASSERT_EQ(e.capture->error(), channel::kCaptureOk);
      h.model.AcceptVerify(request);
      EXPECT_EQ(h.model.CheckVerify(request, e.Outputs(request, h.model)), "") << "layer " << layer;
    }
    ASSERT_TRUE(e.capture->WaitStep(published, absl::Seconds(30)).ok());
    for (const VerifyPart& p : parts) pending[p.sequence] = p.parents;
  }
  // The prefix grew with the riding commits (the shadow applied the same paths the daemon did,
  // and the outputs above attended to it).
  EXPECT_GT(h.model.committed_length(1), start_length);
  EXPECT_EQ(e.capture->error(), channel::kCaptureOk);
  EXPECT_EQ(channel::StepAreaMapping::Load(e.capture->area().header().completed_step), 54u);
}

TEST(CapturedStepTest, PrepareCaptureRefusesWhatItCannotServeNamingTheFieldAndBound) {
  ServiceOptions options = testing::SmallOptions("cap-refuse");
  Harness h(options);
  Engine e(h, /*lse=*/true);
  Scratch tiny(4096);
  const uint64_t small = h.client->RegisterExternalMemory(tiny.path(), tiny.bytes())->region();
  const Layout l = LayoutFor(kMaxBatch * kMaxQ, kHeads);
  struct Case {
    const char* name;
    std::function<void(v1::PrepareCaptureRequest&)> mutate;
    absl::StatusCode code;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"max_q",
       [](auto& r) { r.set_max_q(65); },
       absl::StatusCode::kInvalidArgument,
       {"max_q = 65", "--max-tree-nodes = 64"}},
      {"max_batch 0",
       [](auto& r) { r.set_max_batch(0); },
       absl::StatusCode::kInvalidArgument,
       {"max_batch = 0", "[1, 1024]"}},
      {"max_batch",
       [](auto& r) { r.set_max_batch(5000); },
       absl::StatusCode::kInvalidArgument,
       {"max_batch = 5000"}},
      {"layer_begin",
       [](auto& r) { r.set_layer_begin(3); },
       absl::StatusCode::kInvalidArgument,
       {"layer_begin = 3", "--layers = 3"}},
      {"num_layers",
       [](auto& r) {
         r.set_layer_begin(1);
         r.set_num_layers(3);
       },
       absl::StatusCode::kInvalidArgument,
       {"num_layers = 3", "--layers = 3"}},
      {"unregistered q",
       [&](auto& r) { r.mutable_q()->set_region(e.region + 1); },
       absl::StatusCode::kNotFound,
       {"q.region"}},
      {"out too small",
       [&](auto& r) { *r.mutable_out() = Ref(small, 0); },
       absl::StatusCode::kInvalidArgument,
       {"out.offset = 0", "4096 bytes"}},
      {"q past the region",
       [&](auto& r) { r.mutable_q()->set_offset(e.scratch.bytes() - 64); },
       absl::StatusCode::kInvalidArgument,
       {"q.offset"}},
      {"lse without return_lse",
       [](auto& r) { r.set_return_lse(false); },
       absl::StatusCode::kInvalidArgument,
       {"lse.region is set but return_lse is false"}},
      {"out over q",
       [&](auto& r) { r.mutable_out()->set_offset(l.q); },
       absl::StatusCode::kInvalidArgument,
       {"overlaps"}},
      {"ready is done",
       [&](auto& r) { r.mutable_done()->set_offset(l.ready); },
       absl::StatusCode::kInvalidArgument,
       {"done names the ready word"}},
      {"flag misaligned",
       [&](auto& r) { r.mutable_ready()->set_offset(l.ready + 2); },
       absl::StatusCode::kInvalidArgument,
       {"ready.offset"}},
      {"scale",
       [](auto& r) { r.set_softmax_scale(-1.f); },
       absl::StatusCode::kInvalidArgument,
       {"softmax_scale"}},
      {"channel",
       [](auto& r) { r.set_channel(12345); },
       absl::StatusCode::kNotFound,
       {"channel = 12345"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::PrepareCaptureRequest r = BucketRequest(e.region, true);
    r.set_channel(e.channel->id());
    c.mutate(r);
    absl::StatusOr<v1::PrepareCaptureResponse> got = h.client->PrepareCapture(r);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), c.code) << got.status();
    for (const std::string& s : c.says) EXPECT_THAT(got.status().message(), HasSubstr(s));
  }
  // Another client's channel.
  ClientOptions o;
  o.client_id = "another";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), o);
  v1::PrepareCaptureRequest theirs = BucketRequest(e.region, true);
  theirs.set_channel(e.channel->id());
  EXPECT_EQ(other->PrepareCapture(theirs).status().code(), absl::StatusCode::kPermissionDenied);
  // Nothing was held: the bucket still prepares, once per channel.
  ASSERT_TRUE(e.Prepare(h).ok());
  v1::PrepareCaptureRequest again = BucketRequest(e.region, true);
  again.set_channel(e.channel->id());
  absl::StatusOr<v1::PrepareCaptureResponse> second = h.client->PrepareCapture(again);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("open a channel per captured bucket"));
}

TEST(CapturedStepTest, StepAreasCountAgainstTheChannelBytes) {
  ServiceOptions options = testing::SmallOptions("cap-bytes");
  // Room for the ring of 8 entries and little else.
  options.max_channel_bytes = static_cast<int64_t>(channel::RingFileBytes(8) + 4096);
  Harness h(options);
  Engine e(h, /*lse=*/false);
  absl::Status prepared = e.Prepare(h);
  EXPECT_EQ(prepared.code(), absl::StatusCode::kResourceExhausted) << prepared;
  EXPECT_THAT(prepared.message(), HasSubstr("--max-channel-bytes"));
  // Closing the channel gives its bytes back; the next channel opens.
  ASSERT_TRUE(e.channel->Close().ok());
  EXPECT_TRUE(h.client->OpenChannel(8).ok());
}

TEST(CapturedStepTest, ARecordOutsideTheBucketPoisonsTheStepAndSaysWhy) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("cap-record"));
  Engine e(h, /*lse=*/true);
  ASSERT_TRUE(e.Prepare(h).ok());
  h.AppendSequence(1, 12);
  struct Case {
    const char* name;
    std::vector<Channel::Sequence> record;
    std::string says;
  };
  std::vector<int32_t> too_many(kMaxQ + 1);
  for (size_t i = 0; i < too_many.size(); ++i) too_many[i] = static_cast<int32_t>(i) - 1;
  const std::vector<Case> cases = {
      {"q_len", {{1, too_many, std::nullopt}}, "sequences[0].q_len = 9"},
      {"num_seqs", std::vector<Channel::Sequence>(kMaxBatch + 1, {1, {-1}, std::nullopt}),
       "num_seqs = 4"},
      {"empty", {}, "num_seqs = 0"},
      {"parents", {{1, {-1, 5}, std::nullopt}}, "sequences[0].parents"},
      {"unknown sequence", {{99, {-1}, std::nullopt}}, "99"},
      {"commit without a tree", {{1, {-1}, std::vector<int32_t>{0}}}, "commit"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint64_t step = e.capture->PublishHost(c.record);
    for (uint32_t i = 0; i < 3; ++i) {
      std::memset(e.capture->targets().out, 0x11, e.capture->targets().out_elements * 2);
      e.capture->SignalReadyHost(i);
      e.capture->WaitDoneHost(i, absl::Seconds(30));
      ASSERT_EQ(e.capture->error(), channel::kCaptureOk);  // done came: the daemon answered
      EXPECT_EQ(*e.capture->targets().done, channel::ReadyValue(step, 3, i));
      if (std::string(c.name) == "q_len" || std::string(c.name) == "num_seqs" ||
          std::string(c.name) == "empty") {
        EXPECT_TRUE(AllNan(e.capture->targets())) << "layer " << i;  // the whole bucket
      } else {
        // A refused call NaN-fills its own rows.
        EXPECT_TRUE(RowsNan(e.capture->targets(), c.record[0].parents.size())) << "layer " << i;
      }
    }
    const absl::Status status = e.capture->WaitStep(step, absl::Seconds(30));
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr(c.says)) << status;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("step ", step, " layer 0")));
  }
  // Nothing stuck: a good step now verifies against the reference.
  std::vector<VerifyPart> parts = {{1, {-1, 0, 0}, std::nullopt}};
  const uint64_t step = e.capture->PublishHost(RecordOf(parts));
  for (int layer = 0; layer < 3; ++layer) {
    const v1::VerifyRequest request = h.model.MakeVerify(layer, parts, true);
    e.WriteInputs(request);
    e.capture->SignalReadyHost(layer);
    e.capture->WaitDoneHost(layer, absl::Seconds(30));
    h.model.AcceptVerify(request);
    EXPECT_EQ(h.model.CheckVerify(request, e.Outputs(request, h.model)), "");
  }
  EXPECT_TRUE(e.capture->WaitStep(step, absl::Seconds(30)).ok());
}

// The channel closes (or the daemon stops) under a captured graph: the area's epoch goes to 0, so
// the next replay's SignalReady NaN-fills and sets the error word, and no wait is left hanging.
TEST(CapturedStepTest, AReplayAfterTheCaptureEndedFailsLoudly) {
  Harness h(testing::SmallOptions("cap-closed"));
  Engine e(h, /*lse=*/true);
  ASSERT_TRUE(e.Prepare(h).ok());
  h.AppendSequence(1, 12);
  ASSERT_TRUE(e.channel->Close().ok());
  const uint64_t step = e.capture->PublishHost({{1, {-1, 0}, std::nullopt}});
  e.capture->SignalReadyHost(0);
  EXPECT_EQ(e.capture->error(), channel::kCaptureEpochChanged);
  EXPECT_TRUE(AllNan(e.capture->targets()));
  e.capture->WaitDoneHost(0, absl::Seconds(30));  // returns at once: the error is sticky
  EXPECT_EQ(e.capture->WaitStep(step, absl::Seconds(1)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CapturedStepTest, AReplayAfterTheDaemonRestartedNeverReadsStaleOutputs) {
  ServiceOptions options = testing::OnCpu(testing::SmallOptions("cap-restart"));
  Scratch scratch(4 << 20);
  std::unique_ptr<CapturedStep> capture;
  {
    auto first = std::make_unique<testing::TestServer>(options);
    ASSERT_TRUE(first->status().ok());
    ClientOptions o;
    o.client_id = "engine";
    std::unique_ptr<Client> client = *Client::FromChannel(first->channel(), o);
    const uint64_t region =
        client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
    std::unique_ptr<Channel> channel = *client->OpenChannel(8);
    capture = *CapturedStep::Prepare(*client, *channel, BucketRequest(region, false),
                                     TargetsIn(scratch, false));
    // The daemon stops with the capture live: its shutdown closes the channel, which ends it.
    first.reset();
  }
  testing::TestServer second(options);
  ASSERT_TRUE(second.status().ok());
  std::memset(scratch.data(), 0x11, scratch.bytes());  // "outputs" of an earlier replay
  capture->PublishHost({{1, {-1}, std::nullopt}});
  for (uint32_t i = 0; i < 3; ++i) {
    capture->SignalReadyHost(i);
    capture->WaitDoneHost(i, absl::Seconds(5));
    EXPECT_TRUE(AllNan(capture->targets())) << "layer " << i;
  }
  EXPECT_EQ(capture->error(), channel::kCaptureEpochChanged);
}

// The scheduler dies mid-step (it raised no ready flag after publishing the step, and stopped
// everything else): the channel's lease ends it, every layer's wait is released (done written,
// outputs NaN), the step's status says ABORTED, the capture's epoch is gone, and another client is
// served throughout.
TEST(CapturedStepTest, ASchedulerThatDiesMidStepLeavesNoWaitBehind) {
  ServiceOptions options = testing::SmallOptions("cap-dies");
  options.lease_seconds = 0.5;
  Harness h(options);
  Engine e(h, /*lse=*/false);
  ASSERT_TRUE(e.Prepare(h).ok());
  h.AppendSequence(1, 10);
  const uint64_t step = e.capture->PublishHost({{1, {-1, 0, 1}, std::nullopt}});
  ClientOptions o;
  o.client_id = "alive";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), o);
  const uint32_t last = channel::ReadyValue(step, 3, 2);
  const auto waited = PollUntil([&] { return channel::Reached(*e.capture->targets().done, last); },
                                std::chrono::seconds(20));
  EXPECT_LT(waited, std::chrono::seconds(9));
  EXPECT_TRUE(RowsNan(e.capture->targets(), 3));
  EXPECT_TRUE(other->Stats().ok());
  const absl::Status status = e.capture->WaitStep(step, absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  // The channel leaves the table before its close ends the capture (epoch 0): wait for both.
  PollUntil(
      [&] {
        return h.Stats().channels() == 0 &&
               channel::StepAreaMapping::Load(e.capture->area().header().epoch) == 0;
      },
      std::chrono::seconds(10), std::chrono::milliseconds(50));
  EXPECT_EQ(channel::StepAreaMapping::Load(e.capture->area().header().epoch), 0u);
  EXPECT_EQ(h.Stats().channels(), 0u);
}

}  // namespace
}  // namespace verifyd
