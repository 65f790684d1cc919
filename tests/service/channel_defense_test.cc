// A channel's client as an attacker would drive it (issue 33): a ready flag that never comes must
// hold that channel only (N7: it held the cpu executor 10 s, every other client's Stats and Verify
// behind it), and a descriptor whose body does not decode still poisons its outputs (N9: done and
// INVALID_ARGUMENT, but `out` left as it was).
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "channel/descriptor.h"
#include "channel/ring_ends.h"
#include "channel/ring_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/rpc_helpers.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using testing::DescriptorFor;
using testing::Harness;
using ::testing::HasSubstr;
using testing::LayoutFor;
using testing::OutputsAreNan;
using testing::PollUntil;
using testing::ResponseFrom;
using testing::Scratch;

// A channel opened through the stub and mapped here, so that the test writes descriptors (and
// reads the daemon's indices) itself.
struct RawChannel {
  v1::OpenChannelResponse opened;
  std::optional<channel::RingMapping> ring;
};
RawChannel OpenRaw(Harness& h, uint32_t entries) {
  RawChannel raw;
  grpc::ClientContext context;
  context.AddMetadata("x-verifyd-client", "scheduler-a");
  v1::OpenChannelRequest request;
  request.set_entries(entries);
  EXPECT_TRUE(h.server.stub().OpenChannel(&context, request, &raw.opened).ok());
  absl::StatusOr<channel::RingMapping> ring =
      channel::OpenRingFile(raw.opened.path(), raw.opened.entries());
  EXPECT_TRUE(ring.ok()) << ring.status();
  if (ring.ok()) raw.ring.emplace(*std::move(ring));
  return raw;
}

channel::Descriptor FromClient(const Channel::VerifyDescriptor& c) {
  channel::Descriptor d;
  d.id = c.id;
  d.layer = c.layer;
  for (const Channel::Sequence& s : c.sequences) {
    channel::SequenceEntry& e = d.sequences.emplace_back();
    e.sequence_id = s.sequence_id;
    e.parents = s.parents;
    if (s.commit_previous) {
      e.has_commit = true;
      e.commit_length = static_cast<uint32_t>(s.commit_previous->size());
      e.accepted_path = *s.commit_previous;
    }
  }
  d.return_lse = c.return_lse;
  d.q = {c.q.region, c.q.offset};
  d.tree_kv = {c.tree_kv.region, c.tree_kv.offset};
  d.out = {c.out.region, c.out.offset};
  d.lse = {c.lse.region, c.lse.offset};
  d.ready = {c.ready.region, c.ready.offset, c.ready.value, 0};
  d.done = {c.done.region, c.done.offset, c.done.value, 0};
  return d;
}

TEST(ChannelDefenseTest, AReadyFlagThatNeverComesHoldsOnlyItsOwnChannel) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("chan-ready"));
  ASSERT_TRUE(h.server.status().ok());
  Scratch scratch(4 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  h.AppendSequence(1, 24);
  h.AppendSequence(2, 17);
  RawChannel raw = OpenRaw(h, 4);
  ASSERT_TRUE(raw.ring.has_value());
  const v1::VerifyRequest waiting = h.model.MakeVerify(0, {{1, {-1, 0, 1}, std::nullopt}}, true);
  const Channel::VerifyDescriptor d = DescriptorFor(waiting, region, scratch, 9, 1);
  channel::RingProducer producer(raw.ring->view());
  ASSERT_TRUE(producer.Push(FromClient(d)).ok());  // its ready flag stays 0
  PollUntil([&] { return raw.ring->view().header().submit_head.load() == 1; },
            std::chrono::seconds(10));
  ASSERT_EQ(raw.ring->view().header().submit_head.load(), 1u) << "the daemon took nothing";
  // Let the taken call reach whatever waits for its flag (the executor, before the fix).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  // Another client is served meanwhile: Stats, and a Verify checked against the reference.
  ClientOptions o;
  o.client_id = "scheduler-b";
  std::unique_ptr<Client> other = *Client::FromChannel(h.server.channel(), o);
  ASSERT_TRUE(other->Stats().ok());
  const v1::VerifyRequest served = h.model.MakeVerify(0, {{2, {-1, 0, 0, 2}, std::nullopt}}, true);
  absl::StatusOr<v1::VerifyResponse> answer = other->Verify(served);
  ASSERT_TRUE(answer.ok()) << answer.status();
  h.model.AcceptVerify(served);
  EXPECT_EQ(h.model.CheckVerify(served, *answer), "");
  // ... while the first call is still waiting: its done flag unwritten, no completion.
  EXPECT_EQ(scratch.word(d.done.offset).load(), 0u)
      << "the other client was served only after the waiting call gave up";
  channel::Completion c;
  EXPECT_FALSE(producer.PopCompletion(&c));

  // The flag comes: the call runs and is right.
  scratch.word(d.ready.offset).store(9, std::memory_order_release);
  PollUntil([&] { return producer.PopCompletion(&c); }, std::chrono::seconds(20));
  EXPECT_EQ(c.descriptor_id, 1u);
  ASSERT_EQ(c.code, absl::StatusCode::kOk) << c.message;
  EXPECT_EQ(scratch.word(d.done.offset).load(), 9u);
  h.model.AcceptVerify(waiting);
  EXPECT_EQ(h.model.CheckVerify(waiting, ResponseFrom(waiting, scratch, h.model)), "");
}

// The malformations, each applied to an otherwise good Verify descriptor whose out and lse
// hold stale bytes: the completion is INVALID_ARGUMENT "malformed descriptor: ...", the done flag
// is written, every output row the body claims is NaN, the bytes after them are untouched, and the
// store is unchanged.
TEST(ChannelDefenseTest, UndecodableDescriptorsPoisonTheirOutputs) {
  Harness h(testing::SmallOptions("chan-poison"));
  ASSERT_TRUE(h.server.status().ok());
  Scratch scratch(4 << 20);
  const uint64_t region =
      h.client->RegisterExternalMemory(scratch.path(), scratch.bytes())->region();
  h.AppendSequence(1, 20);
  h.AppendSequence(2, 11);
  RawChannel raw = OpenRaw(h, 4);
  ASSERT_TRUE(raw.ring.has_value());
  const channel::RingView& view = raw.ring->view();
  const v1::VerifyRequest good =
      h.model.MakeVerify(0, {{1, {-1, 0, 1}, std::nullopt}, {2, {-1, 0}, std::nullopt}}, true);
  const int64_t heads = h.model.heads(), total_q = 5;
  struct Case {
    const char* name;
    std::function<void(channel::DescriptorHeader&)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"kind 0", [](auto& x) { x.kind = 0; }, "kind = 0 must be 1 (Verify) or 2 (Commit)"},
      {"kind 3", [](auto& x) { x.kind = 3; }, "kind = 3 must be 1"},
      {"bytes 10", [](auto& x) { x.bytes = 10; }, "bytes = 10 must be in [144, 8192]"},
      {"bytes 9000", [](auto& x) { x.bytes = 9000; }, "bytes = 9000 must be in [144, 8192]"},
      {"num_sequences 0", [](auto& x) { x.num_sequences = 0; }, "but the sequences end at 144"},
      {"num_sequences 2^32-1", [](auto& x) { x.num_sequences = 0xffffffffu; },
       "num_sequences = 4294967295 cannot fit"},
      {"short by 4", [](auto& x) { x.bytes -= 4; }, "past bytes = "},
  };
  uint64_t number = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint32_t value = static_cast<uint32_t>(number + 1);
    const Channel::VerifyDescriptor made =
        DescriptorFor(good, region, scratch, value, 100 + number);
    const testing::Layout l = LayoutFor(total_q, heads);
    scratch.word(made.ready.offset).store(value);
    scratch.word(made.done.offset).store(0);
    // The padding between lse's last row and the ready flag: past every row the body claims.
    const uint64_t lse_end = l.lse + static_cast<uint64_t>(total_q * heads * 4);
    auto padding = [&] {
      return std::string(reinterpret_cast<const char*>(scratch.data() + lse_end),
                         l.ready - lse_end);
    };
    const std::string padding_before = padding();
    ASSERT_FALSE(padding_before.empty());
    const v1::StatsResponse before = h.Stats();
    uint8_t* slot = view.descriptor_slot(number);
    ASSERT_TRUE(channel::Encode(FromClient(made), slot).ok());
    channel::DescriptorHeader header = channel::PeekHeader(slot);
    c.mutate(header);
    std::memcpy(slot, &header, sizeof(header));
    view.header().submit_tail.store(number + 1, std::memory_order_release);
    view.WakeConsumer();
    PollUntil([&] { return view.completion_slot(number).sequence.load() == number + 1; },
              std::chrono::seconds(10));
    const channel::CompletionRecord& r = view.completion_slot(number);
    ASSERT_EQ(r.sequence.load(), number + 1) << "no completion";
    EXPECT_EQ(r.descriptor_id, 100 + number);
    EXPECT_EQ(r.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(r.message, r.message_bytes), HasSubstr("malformed descriptor: "));
    EXPECT_THAT(std::string(r.message, r.message_bytes), HasSubstr(c.expect));
    EXPECT_EQ(scratch.word(made.done.offset).load(), value);
    EXPECT_TRUE(OutputsAreNan(scratch, total_q, heads, /*lse=*/true));
    EXPECT_EQ(padding(), padding_before) << "bytes past the claimed rows were written";
    const v1::StatsResponse after = h.Stats();
    EXPECT_EQ(after.used_tokens(), before.used_tokens());
    EXPECT_EQ(after.pending_tokens(), before.pending_tokens());
    view.header().complete_head.store(++number, std::memory_order_release);
  }
  // The channel still serves a good descriptor.
  const Channel::VerifyDescriptor d = DescriptorFor(good, region, scratch, 77, 999);
  scratch.word(d.ready.offset).store(77);
  // Written by hand as above: the channel's numbering goes on.
  ASSERT_TRUE(channel::Encode(FromClient(d), view.descriptor_slot(number)).ok());
  view.header().submit_tail.store(number + 1, std::memory_order_release);
  view.WakeConsumer();
  PollUntil([&] { return view.completion_slot(number).sequence.load() == number + 1; },
            std::chrono::seconds(10));
  const channel::CompletionRecord& r = view.completion_slot(number);
  ASSERT_EQ(r.code, static_cast<uint32_t>(absl::StatusCode::kOk))
      << std::string(r.message, r.message_bytes);
  h.model.AcceptVerify(good);
  EXPECT_EQ(h.model.CheckVerify(good, ResponseFrom(good, scratch, h.model)), "");
}

}  // namespace
}  // namespace verifyd
