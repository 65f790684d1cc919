// The co-located data plane through the daemon's socket (plans/0017), on the cpu backend: memory
// registered by the client, channels carrying Verify and Commit descriptors. Channel outputs match
// the float64 reference and the gRPC Verify's bytes on the same inputs; every mistake completes
// with the gRPC path's code and message, NaN outputs and the done flag, and changes nothing; a
// region or channel belongs to its client; leases end what a dead scheduler left.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "channel/ring_ends.h"
#include "channel/ring_file.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using testing::DescriptorFor;
using testing::Harness;
using ::testing::HasSubstr;
using testing::OutputsAreNan;
using testing::PollUntil;
using testing::RawStatus;
using testing::ResponseFrom;
using testing::RunOnChannel;
using testing::Scratch;
using testing::ShadowModel;
using testing::TotalQ;
using testing::VerifyPart;

TEST(DataPlaneTest, ChannelVerifyMatchesTheReferenceAndTheGrpcBytes) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("dp-match"));
  ASSERT_TRUE(h.server.status().ok());
  Scratch scratch(4 << 20);
  absl::StatusOr<v1::RegisterExternalMemoryResponse> reg =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes());
  ASSERT_TRUE(reg.ok()) << reg.status();
  absl::StatusOr<std::unique_ptr<Channel>> channel = h.client->OpenChannel(8);
  ASSERT_TRUE(channel.ok()) << channel.status();
  const v1::StatsResponse stats = h.Stats();
  EXPECT_EQ(stats.external_regions(), 1u);
  EXPECT_EQ(stats.external_region_bytes(), scratch.bytes());
  EXPECT_EQ(stats.channels(), 1u);

  h.AppendSequence(1, 37);
  h.AppendSequence(2, 5);
  uint32_t step = 0;
  uint64_t id = 1000;
  std::map<uint64_t, std::vector<int32_t>> pending;
  for (int round = 0; round < 4; ++round) {
    std::vector<VerifyPart> parts;
    for (uint64_t seq : {1, 2}) {
      VerifyPart p;
      p.sequence = seq;
      if (pending.contains(seq)) {
        p.commit_previous = h.model.RandomPath(pending[seq]);
      }
      p.parents = h.model.RandomParents(1 + h.model.rng()() % 9);
      parts.push_back(p);
    }
    for (int layer = 0; layer < 3; ++layer) {
      if (layer == 1) {
        for (VerifyPart& p : parts) p.commit_previous.reset();  // commits ride on layer 0
      }
      const bool lse = (round + layer) % 2 == 0;
      const v1::VerifyRequest request = h.model.MakeVerify(layer, parts, lse);
      const Channel::VerifyDescriptor d =
          DescriptorFor(request, reg->region(), scratch, ++step, ++id);
      const Channel::Completion c = RunOnChannel(**channel, d, scratch);
      ASSERT_TRUE(c.status.ok()) << c.status;
      EXPECT_EQ(scratch.word(d.done.offset).load(), step);
      h.model.AcceptVerify(request);
      const v1::VerifyResponse from_channel = ResponseFrom(request, scratch, h.model);
      EXPECT_EQ(h.model.CheckVerify(request, from_channel), "") << "round " << round;

      // The same inputs through gRPC (the pending tree is verified again): the same bytes.
      v1::VerifyRequest again = request;
      for (auto& s : *again.mutable_sequences()) s.clear_commit_previous();
      grpc::ClientContext context;
      v1::VerifyResponse from_grpc;
      ASSERT_TRUE(h.server.stub().Verify(&context, again, &from_grpc).ok());
      EXPECT_EQ(from_grpc.out().inline_data(), from_channel.out().inline_data());
      if (lse) EXPECT_EQ(from_grpc.lse().inline_data(), from_channel.lse().inline_data());
    }
    for (const VerifyPart& p : parts) pending[p.sequence] = p.parents;
    // Every other round commits through the channel instead of riding on the next Verify.
    if (round % 2 == 1) {
      for (uint64_t seq : {1, 2}) {
        const std::vector<int32_t> path = h.model.RandomPath(pending[seq]);
        ASSERT_TRUE((*channel)->EnqueueCommit({++id, seq, path}).ok());
        absl::StatusOr<Channel::Completion> c = (*channel)->WaitCompletion(absl::Seconds(30));
        ASSERT_TRUE(c.ok() && c->status.ok()) << c.status() << " " << c->status;
        h.model.AcceptCommit(seq, path);
        EXPECT_EQ(c->committed_length, static_cast<uint64_t>(h.model.committed_length(seq)));
        pending.erase(seq);
      }
    }
  }
  EXPECT_TRUE((*channel)->Close().ok());
  EXPECT_EQ(h.Stats().channels(), 0u);
  EXPECT_TRUE(h.client->ReleaseExternalMemory(reg->region()).ok());
  EXPECT_EQ(h.Stats().external_regions(), 0u);
}

// Every mistake a Verify can carry: the channel's completion has the gRPC Verify's code and
// message, the outputs are NaN, the done flag is written, and the store is unchanged.
TEST(DataPlaneTest, ErrorsMatchTheGrpcPathAndChangeNothing) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("dp-errors"));
  Scratch scratch(4 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  std::unique_ptr<Channel> channel = *h.client->OpenChannel(4);
  h.AppendSequence(1, 20);
  h.AppendSequence(2, 9);
  const v1::VerifyRequest good =
      h.model.MakeVerify(0, {{1, {-1, 0, 1}, std::nullopt}, {2, {-1, 0}, std::nullopt}}, true);
  struct Case {
    const char* name;
    std::function<void(v1::VerifyRequest&)> mutate;
  };
  const std::vector<Case> cases = {
      {"layer", [](auto& r) { r.set_layer(3); }},
      {"scale", [](auto& r) { r.set_softmax_scale(-1.f); }},
      {"duplicate", [](auto& r) { r.mutable_sequences(1)->set_sequence_id(1); }},
      {"parents", [](auto& r) { r.mutable_sequences(0)->set_parents(2, 5); }},
      {"root", [](auto& r) { r.mutable_sequences(0)->set_parents(1, -7); }},
      {"commit node",
       [](auto& r) {
         auto* c = r.mutable_sequences(0)->mutable_commit_previous();
         c->set_commit_length(1);
         c->add_accepted_path(999);
       }},
      {"commit without tree",
       [](auto& r) {
         auto* c = r.mutable_sequences(0)->mutable_commit_previous();
         c->set_commit_length(1);
         c->add_accepted_path(0);
       }},
      {"unknown sequence", [](auto& r) { r.mutable_sequences(1)->set_sequence_id(77); }},
  };
  uint32_t step = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::VerifyRequest bad = good;
    c.mutate(bad);
    const v1::StatsResponse before = h.Stats();
    grpc::ClientContext context;
    v1::VerifyResponse ignored;
    const absl::Status grpc_status = RawStatus(h.server.stub().Verify(&context, bad, &ignored));
    ASSERT_FALSE(grpc_status.ok());
    ++step;
    const Channel::VerifyDescriptor d = DescriptorFor(bad, region, scratch, step, step);
    const Channel::Completion done = RunOnChannel(*channel, d, scratch);
    EXPECT_EQ(done.status.code(), grpc_status.code());
    EXPECT_EQ(done.status.message(), grpc_status.message());
    EXPECT_EQ(scratch.word(d.done.offset).load(), step);
    // The outputs the descriptor names are NaN, whatever the mistake.
    EXPECT_TRUE(OutputsAreNan(scratch, TotalQ(bad), 4, true));
    const v1::StatsResponse after = h.Stats();
    EXPECT_EQ(after.used_tokens(), before.used_tokens());
    EXPECT_EQ(after.pending_tokens(), before.pending_tokens());
  }
  // Nothing changed: the good request still verifies and matches the reference.
  ++step;
  const Channel::VerifyDescriptor d = DescriptorFor(good, region, scratch, step, step);
  ASSERT_TRUE(RunOnChannel(*channel, d, scratch).status.ok());
  h.model.AcceptVerify(good);
  EXPECT_EQ(h.model.CheckVerify(good, ResponseFrom(good, scratch, h.model)), "");
}

// SPEC §1 on the channel: q and tree_kv are the scheduler's until its ready flag, so they are
// checked once it is up, before anything of them is kept. The completion has the gRPC path's code
// and message for the same tensors, the outputs are NaN, the done flag is written, and the same
// layer verified again with good tensors matches the reference (nothing bad stuck in the pool).
TEST(DataPlaneTest, ValuesOutOfBoundAreRefusedLikeGrpcAndNeverKept) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("dp-values"));
  Scratch scratch(4 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  std::unique_ptr<Channel> channel = *h.client->OpenChannel(4);
  const uint16_t bad_bits[] = {0x7fc0 /*NaN*/, 0xff80 /*-Inf*/, 0x4789 /*70144*/, 0xf149 /*-1e30*/};
  uint32_t step = 0;
  for (int k = 0; k < 4; ++k) {
    const bool in_q = k % 2 == 0;
    SCOPED_TRACE(absl::StrCat(in_q ? "q" : "tree_kv", " bits ", bad_bits[k]));
    const uint64_t seq = 10 + k;
    h.AppendSequence(seq, 17);
    const v1::VerifyRequest good = h.model.MakeVerify(
        0, {{seq, h.model.RandomParents(1 + static_cast<int>(h.model.rng()() % 6)), std::nullopt}},
        true);
    v1::VerifyRequest bad = good;
    std::string* bytes = in_q ? bad.mutable_q()->mutable_inline_data()
                              : bad.mutable_tree_kv()->mutable_inline_data();
    const size_t element = h.model.rng()() % (bytes->size() / 2);
    std::memcpy(bytes->data() + 2 * element, &bad_bits[k], 2);
    grpc::ClientContext context;
    v1::VerifyResponse ignored;
    const absl::Status grpc_status = RawStatus(h.server.stub().Verify(&context, bad, &ignored));
    ASSERT_EQ(grpc_status.code(), absl::StatusCode::kInvalidArgument) << grpc_status;
    ++step;
    const Channel::VerifyDescriptor d = DescriptorFor(bad, region, scratch, step, step);
    const Channel::Completion done = RunOnChannel(*channel, d, scratch);
    EXPECT_EQ(done.status.code(), absl::StatusCode::kInvalidArgument) << done.status;
    EXPECT_EQ(done.status.message(), grpc_status.message());
    EXPECT_EQ(scratch.word(d.done.offset).load(), step);
    EXPECT_TRUE(OutputsAreNan(scratch, TotalQ(bad), 4, true));
    ++step;
    const Channel::VerifyDescriptor again = DescriptorFor(good, region, scratch, step, step);
    const Channel::Completion fine = RunOnChannel(*channel, again, scratch);
    ASSERT_TRUE(fine.status.ok()) << fine.status;
    h.model.AcceptVerify(good);
    EXPECT_EQ(h.model.CheckVerify(good, ResponseFrom(good, scratch, h.model)), "");
  }
}

// What only the channel can get wrong: references to memory. A clear code naming the field, NaN
// outputs where they resolve, the done flag, nothing changed.
TEST(DataPlaneTest, BadReferencesAreRefusedByName) {
  Harness h(testing::SmallOptions("dp-refs"));
  Scratch scratch(4 << 20);
  Scratch theirs(1 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  ClientOptions other_options;
  other_options.client_id = "scheduler-b";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), other_options);
  const uint64_t foreign = other->RegisterExternalMemory(theirs.path(), theirs.bytes())->region();
  std::unique_ptr<Channel> channel = *h.client->OpenChannel(4);
  h.AppendSequence(1, 12);
  const v1::VerifyRequest good = h.model.MakeVerify(0, {{1, {-1, 0, 0}, std::nullopt}}, true);
  struct Case {
    std::string expect;
    absl::StatusCode code;
    bool nan;  // the outputs resolve, so they are NaN
    std::function<void(Channel::VerifyDescriptor&)> mutate;
  };
  const std::vector<Case> cases = {
      {"q.region = 12345 is not a registered external region", absl::StatusCode::kNotFound, true,
       [](auto& d) { d.q.region = 12345; }},
      {absl::StrCat("tree_kv.region = ", foreign, " belongs to another client"),
       absl::StatusCode::kPermissionDenied, true, [&](auto& d) { d.tree_kv.region = foreign; }},
      {"q.region must be set", absl::StatusCode::kInvalidArgument, true,
       [](auto& d) { d.q.region = 0; }},
      {"q.offset = 32 must be a multiple of 64", absl::StatusCode::kInvalidArgument, true,
       [](auto& d) { d.q.offset = 32; }},
      {"out.offset = 4194240 + 12288 bytes must be <= the 4194304 bytes of region",
       absl::StatusCode::kInvalidArgument, false, [](auto& d) { d.out.offset = (4 << 20) - 64; }},
      {"ready.offset = 2 must be a multiple of 4", absl::StatusCode::kInvalidArgument, true,
       [](auto& d) { d.ready.offset = 2; }},
      {"overlaps q", absl::StatusCode::kInvalidArgument, false,
       [](auto& d) { d.lse.offset = d.q.offset; }},
      {"lse.region is set but return_lse is false", absl::StatusCode::kInvalidArgument, true,
       [](auto& d) { d.return_lse = false; }},
  };
  uint32_t step = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    ++step;
    Channel::VerifyDescriptor d = DescriptorFor(good, region, scratch, step, step);
    c.mutate(d);
    const v1::StatsResponse before = h.Stats();
    const Channel::Completion done = RunOnChannel(*channel, d, scratch);
    EXPECT_EQ(done.status.code(), c.code) << done.status;
    EXPECT_THAT(done.status.message(), HasSubstr(c.expect));
    EXPECT_EQ(scratch.word(d.done.offset).load(), step);
    if (c.nan) EXPECT_TRUE(OutputsAreNan(scratch, 3, 4, d.return_lse));
    EXPECT_EQ(h.Stats().pending_tokens(), before.pending_tokens());
    EXPECT_FALSE(h.model.has_tree(1));
  }
  // The other client's region is untouched and still theirs.
  EXPECT_EQ(h.client->ReleaseExternalMemory(foreign).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(other->ReleaseExternalMemory(foreign).ok());
}

TEST(DataPlaneTest, RegistrationIsValidatedAndOwned) {
  Harness h(testing::SmallOptions("dp-register"));
  Scratch scratch(1 << 16);
  struct Case {
    std::string handle;
    uint64_t bytes;
    uint32_t device;
    absl::StatusCode code;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {scratch.path(), scratch.bytes(), 1, absl::StatusCode::kInvalidArgument,
       "device = 1 must be this daemon's device (--device = 0)"},
      {scratch.path(), 0, 0, absl::StatusCode::kInvalidArgument, "bytes = 0 must be in [1, "},
      {"", 64, 0, absl::StatusCode::kInvalidArgument, "handle is empty"},
      {absl::StrCat("/proc/", getpid(), "/fd/99999"), 64, 0, absl::StatusCode::kNotFound,
       "cannot open"},
      {scratch.path(), scratch.bytes() + 1, 0, absl::StatusCode::kInvalidArgument,
       "bytes = 65537 must be <= the 65536 bytes of"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<v1::RegisterExternalMemoryResponse> r =
        h.client->RegisterExternalMemory(c.handle, c.bytes, c.device);
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.expect));
  }
  EXPECT_EQ(h.Stats().external_regions(), 0u);
  // Without a client name nothing can be owned.
  grpc::ClientContext context;
  v1::RegisterExternalMemoryRequest request;
  request.set_handle(scratch.path());
  request.set_bytes(64);
  v1::RegisterExternalMemoryResponse response;
  const absl::Status anonymous =
      RawStatus(h.server.stub().RegisterExternalMemory(&context, request, &response));
  EXPECT_EQ(anonymous.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(anonymous.message(), HasSubstr("metadata \"x-verifyd-client\" is missing"));

  const uint64_t region = h.client->RegisterExternalMemory(scratch.path(), 4096)->region();
  EXPECT_NE(region, 0u);
  EXPECT_EQ(h.Stats().external_region_bytes(), 4096u);
  absl::StatusOr<v1::ReleaseExternalMemoryResponse> unknown =
      h.client->ReleaseExternalMemory(region + 1);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr(absl::StrCat("region = ", region + 1)));
  ClientOptions o;
  o.client_id = "someone-else";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), o);
  EXPECT_EQ(other->ReleaseExternalMemory(region).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(h.client->ReleaseExternalMemory(region)->bytes(), 4096u);
  EXPECT_EQ(h.Stats().external_regions(), 0u);
}

// Channels: entries validated, used after close, closed by someone else, closed twice.
TEST(DataPlaneTest, ChannelLifecycleErrors) {
  Harness h(testing::SmallOptions("dp-channel"));
  EXPECT_EQ(h.client->OpenChannel(3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.client->OpenChannel(8192).status().message(),
              HasSubstr("entries = 8192 must be a power of two in [2, 4096]"));
  std::unique_ptr<Channel> channel = *h.client->OpenChannel(2);
  ClientOptions o;
  o.client_id = "someone-else";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), o);
  const absl::Status theirs = other->CloseChannel(channel->id());
  EXPECT_EQ(theirs.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(theirs.message(), HasSubstr("belongs to another client"));
  ASSERT_TRUE(channel->Close().ok());
  const absl::Status after = channel->EnqueueCommit({1, 1, {}});
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after.message(), HasSubstr("the channel is closed"));
  const absl::Status twice = h.client->CloseChannel(channel->id());
  EXPECT_EQ(twice.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h.Stats().channels(), 0u);
}

// A scheduler that dies mid-step: a descriptor waits for a ready flag that never comes and the
// channel goes quiet. The channel's lease closes it, the waiting call ends ABORTED with NaN and
// its done flag, the regions expire, and another client is served throughout.
TEST(DataPlaneTest, LeaseEndsWhatADeadSchedulerLeft) {
  ServiceOptions options = testing::SmallOptions("dp-lease");
  options.lease_seconds = 0.5;
  Harness h(options);
  Scratch scratch(4 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  std::unique_ptr<Channel> channel = *h.client->OpenChannel(4);
  h.AppendSequence(1, 10);
  h.AppendSequence(2, 10);
  const v1::VerifyRequest request = h.model.MakeVerify(0, {{1, {-1, 0}, std::nullopt}}, false);
  const Channel::VerifyDescriptor d = DescriptorFor(request, region, scratch, 5, 1);
  ASSERT_TRUE(channel->EnqueueVerify(d).ok());  // ready never raised
  // Another client keeps being served while the dead one's call waits.
  ClientOptions o;
  o.client_id = "alive";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), o);
  const auto waited =
      PollUntil([&] { return scratch.word(d.done.offset).load() == 5; }, std::chrono::seconds(20));
  EXPECT_EQ(scratch.word(d.done.offset).load(), 5u);
  EXPECT_LT(waited, std::chrono::seconds(9))
      << "the call waited out the backend's ready timeout instead of the channel's lease";
  EXPECT_TRUE(OutputsAreNan(scratch, 2, 4, false));
  EXPECT_TRUE(other->Stats().ok());
  absl::StatusOr<Channel::Completion> c = channel->WaitCompletion(absl::Seconds(5));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->status.code(), absl::StatusCode::kAborted) << c->status;
  // Closed for the client, and gone from the daemon along with the region.
  EXPECT_EQ(channel->EnqueueCommit({2, 1, {}}).code(), absl::StatusCode::kFailedPrecondition);
  PollUntil([&] { return h.Stats().channels() == 0 && h.Stats().external_regions() == 0; },
            std::chrono::seconds(10), std::chrono::milliseconds(50));
  EXPECT_EQ(h.Stats().channels(), 0u);
  EXPECT_EQ(h.Stats().external_regions(), 0u);
}

// A scheduler whose process ends (here: its ring descriptor closed, which drops the lock the
// client library holds on the ring for its process's life) is noticed within a sweep of the
// tables, long before its lease: its waiting call completes ABORTED with NaN outputs and its done
// flag, and the channel is gone. A device wait it left would otherwise hold every other client's
// synchronous work on that GPU for the whole lease (plans/0018).
TEST(DataPlaneTest, ADeadSchedulersChannelEndsWithoutWaitingForItsLease) {
  ServiceOptions options = testing::SmallOptions("dp-dead");
  options.lease_seconds = 120;
  Harness h(options);
  Scratch scratch(4 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  h.AppendSequence(1, 10);
  grpc::ClientContext context;
  context.AddMetadata("x-verifyd-client", "scheduler-a");
  v1::OpenChannelRequest open;
  open.set_entries(4);
  v1::OpenChannelResponse opened;
  ASSERT_TRUE(h.server.stub().OpenChannel(&context, open, &opened).ok());
  std::optional<channel::RingMapping> ring;
  {
    absl::StatusOr<channel::RingMapping> mapped =
        channel::OpenRingFile(opened.path(), opened.entries());
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    ring.emplace(*std::move(mapped));
  }
  EXPECT_EQ(ring->view().header().client_attached.load(), 1u);
  const v1::VerifyRequest request = h.model.MakeVerify(0, {{1, {-1, 0}, std::nullopt}}, false);
  const Channel::VerifyDescriptor made = DescriptorFor(request, region, scratch, 5, 1);
  channel::Descriptor d;
  d.id = made.id;
  d.sequences.push_back({1, {-1, 0}, false, 0, {}});
  d.q = {region, made.q.offset};
  d.tree_kv = {region, made.tree_kv.offset};
  d.out = {region, made.out.offset};
  d.ready = {region, made.ready.offset, 5, 0};  // never raised
  d.done = {region, made.done.offset, 5, 0};
  EXPECT_EQ(h.Stats().channels(), 1u);
  ASSERT_TRUE(channel::RingProducer(ring->view()).Push(d).ok());
  // Longer than a sweep (the lease / 4, at most 250 ms): a live client's channel stays open.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(scratch.word(d.done.offset).load(), 0u) << "the call did not wait for its ready flag";
  EXPECT_EQ(ring->view().header().closed.load(), 0u) << "a live client's channel was closed";

  ring.reset();  // the scheduler's end, as its process's exit would do it
  const auto waited = PollUntil(
      [&] { return scratch.word(d.done.offset).load() == 5 && h.Stats().channels() == 0; },
      std::chrono::seconds(20));
  EXPECT_LT(waited, std::chrono::seconds(3)) << "the dead scheduler's channel waited for its lease";
  EXPECT_EQ(scratch.word(d.done.offset).load(), 5u);
  EXPECT_TRUE(OutputsAreNan(scratch, 2, h.model.heads(), false));
  EXPECT_EQ(h.Stats().channels(), 0u);
  // Nothing of the call was kept: the tree is pending but unwritten; verified again through
  // gRPC, it is right.
  const v1::VerifyRequest again = h.model.MakeVerify(0, {{1, {-1, 0}, std::nullopt}}, true);
  absl::StatusOr<v1::VerifyResponse> verified = h.client->Verify(again);
  ASSERT_TRUE(verified.ok()) << verified.status();
  h.model.AcceptVerify(again);
  EXPECT_EQ(h.model.CheckVerify(again, *verified), "");
}

// Back-pressure through the daemon: a ring of 2 holds 2 descriptors in flight; the third is
// RESOURCE_EXHAUSTED until a completion is read.
TEST(DataPlaneTest, FullChannelPushesBack) {
  Harness h(testing::SmallOptions("dp-full"));
  Scratch scratch(4 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  std::unique_ptr<Channel> channel = *h.client->OpenChannel(2);
  h.AppendSequence(1, 10);
  const v1::VerifyRequest request = h.model.MakeVerify(0, {{1, {-1}, std::nullopt}}, false);
  Channel::VerifyDescriptor d = DescriptorFor(request, region, scratch, 1, 1);
  ASSERT_TRUE(channel->EnqueueVerify(d).ok());  // waits for ready = 1
  d.id = 2;
  ASSERT_TRUE(channel->EnqueueVerify(d).ok());
  d.id = 3;
  const absl::Status full = channel->EnqueueVerify(d);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("holds 2 descriptors"));
  scratch.word(d.ready.offset).store(1, std::memory_order_release);
  for (uint64_t id : {1, 2}) {
    absl::StatusOr<Channel::Completion> c = channel->WaitCompletion(absl::Seconds(30));
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->id, id);
    EXPECT_TRUE(c->status.ok()) << c->status;
  }
  EXPECT_TRUE(channel->EnqueueVerify(d).ok());
  EXPECT_TRUE(channel->WaitCompletion(absl::Seconds(30)).ok());
}

// Descriptors written by hand: a malformed one completes INVALID_ARGUMENT (its done flag still
// written); impossible ring indices close that channel (DATA_LOSS) and nobody else's.
TEST(DataPlaneTest, MalformedDescriptorsAndACorruptRing) {
  Harness h(testing::SmallOptions("dp-raw"));
  Scratch scratch(1 << 16);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  auto open_raw = [&] {
    grpc::ClientContext context;
    context.AddMetadata("x-verifyd-client", "scheduler-a");
    v1::OpenChannelRequest request;
    request.set_entries(4);
    v1::OpenChannelResponse response;
    EXPECT_TRUE(h.server.stub().OpenChannel(&context, request, &response).ok());
    return response;
  };
  const v1::OpenChannelResponse raw = open_raw();
  absl::StatusOr<channel::RingMapping> ring = channel::OpenRingFile(raw.path(), raw.entries());
  ASSERT_TRUE(ring.ok()) << ring.status();
  channel::RingProducer producer(ring->view());
  channel::Descriptor d;
  d.id = 42;
  d.sequences.resize(1);
  d.done = {region, 128, 3};
  ASSERT_TRUE(producer.Push(d).ok());
  // Corrupt the published descriptor's sequence header before the daemon could... too late to
  // race reliably, so publish a second one whose bytes field lies instead.
  channel::DescriptorHeader header = channel::PeekHeader(ring->view().descriptor_slot(0));
  EXPECT_EQ(header.id, 42u);
  channel::Completion c;
  PollUntil([&] { return producer.PopCompletion(&c); }, std::chrono::seconds(10));
  EXPECT_EQ(c.descriptor_id, 42u);
  EXPECT_EQ(c.code, absl::StatusCode::kInvalidArgument);  // parents empty
  EXPECT_THAT(c.message, HasSubstr("sequences[0].parents has 0 nodes"));
  EXPECT_EQ(scratch.word(128).load(), 3u);

  // A commit_length the client library cannot send (it derives it from the path): the same
  // message as the gRPC Verify's.
  {
    channel::Descriptor mismatched;
    mismatched.id = 44;
    mismatched.sequences.resize(1);
    mismatched.sequences[0].sequence_id = 1;
    mismatched.sequences[0].parents = {-1};
    mismatched.sequences[0].has_commit = true;
    mismatched.sequences[0].commit_length = 2;
    mismatched.sequences[0].accepted_path = {0};
    ASSERT_TRUE(producer.Push(mismatched).ok());
    channel::Completion m;
    PollUntil([&] { return producer.PopCompletion(&m); }, std::chrono::seconds(10));
    EXPECT_EQ(m.descriptor_id, 44u);
    EXPECT_EQ(m.code, absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(m.message,
              "sequences[0].commit_previous.commit_length = 2 must equal the size of "
              "sequences[0].commit_previous.accepted_path = 1");
  }
  // Bytes the encoder would never write: a kind of 9.
  channel::DescriptorHeader bad{};
  bad.kind = 9;
  bad.bytes = sizeof(bad);
  bad.id = 43;
  bad.done = {region, 256, 4, 0};
  std::memcpy(ring->view().descriptor_slot(2), &bad, sizeof(bad));
  ring->view().header().submit_tail.store(3, std::memory_order_release);
  ring->view().WakeConsumer();
  // The producer's own index is behind what was published by hand; read the record directly.
  PollUntil([&] { return ring->view().completion_slot(2).sequence.load() == 3; },
            std::chrono::seconds(10));
  const channel::CompletionRecord& r = ring->view().completion_slot(2);
  EXPECT_EQ(r.descriptor_id, 43u);
  EXPECT_EQ(r.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.message, r.message_bytes),
              HasSubstr("malformed descriptor: kind = 9 must be 1 (Verify) or 2 (Commit)"));
  EXPECT_EQ(scratch.word(256).load(), 4u);

  // A second channel of the same client, healthy.
  std::unique_ptr<Channel> healthy = *h.client->OpenChannel(2);
  ASSERT_TRUE(healthy->EnqueueCommit({7, 99, {}}).ok());
  // An impossible tail closes the raw channel.
  ring->view().header().submit_tail.store(1000, std::memory_order_release);
  ring->view().WakeConsumer();
  PollUntil([&] { return ring->view().header().closed.load() != 0; }, std::chrono::seconds(10));
  EXPECT_EQ(ring->view().header().close_code.load(),
            static_cast<uint32_t>(absl::StatusCode::kDataLoss));
  absl::StatusOr<Channel::Completion> ok = healthy->WaitCompletion(absl::Seconds(10));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->status.code(), absl::StatusCode::kNotFound);  // sequence 99 is unknown
  EXPECT_THAT(ok->status.message(), HasSubstr("99"));
}

// Append takes its KV from a registered region; the result is what an inline Append gives.
TEST(DataPlaneTest, AppendFromExternalMemory) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("dp-append"));
  Scratch scratch(1 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  v1::AppendRequest append = h.model.MakeAppend(5, 21);
  std::memcpy(scratch.data() + 128, append.kv().inline_data().data(),
              append.kv().inline_data().size());
  v1::AppendRequest external = append;
  external.mutable_kv()->mutable_external_memory()->set_region(region);
  external.mutable_kv()->mutable_external_memory()->set_offset(128);
  ASSERT_TRUE(h.client->Append(external).ok());
  h.model.AcceptAppend(append);
  testing::RpcDriver driver(h.server.stub(), h.model);
  std::string mismatch;
  ASSERT_TRUE(
      driver.Verify(h.model.MakeVerify(2, {{5, {-1, 0, 1}, std::nullopt}}, true), &mismatch).ok());
  EXPECT_EQ(mismatch, "");
  // Another client's region, an offset past the end: refused by name, nothing appended.
  ClientOptions o;
  o.client_id = "someone-else";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), o);
  const absl::StatusOr<v1::AppendResponse> foreign = other->Append(external);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(foreign.status().message(),
              HasSubstr("kv.external_memory.region = " + std::to_string(region)));
  external.mutable_kv()->mutable_external_memory()->set_offset(1 << 20);
  const absl::StatusOr<v1::AppendResponse> past = h.client->Append(external);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(), HasSubstr("kv.external_memory.offset = 1048576"));
  EXPECT_EQ(h.model.committed_length(5), 21);
  // Verify does not take external tensors over gRPC.
  v1::VerifyRequest verify = h.model.MakeVerify(0, {{5, {-1}, std::nullopt}}, false);
  verify.mutable_q()->mutable_external_memory()->set_region(region);
  grpc::ClientContext context;
  v1::VerifyResponse ignored;
  const absl::Status refused = RawStatus(h.server.stub().Verify(&context, verify, &ignored));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("q.external_memory: external memory reaches Verify "
                                           "through a channel"));
}

}  // namespace
}  // namespace verifyd
