// The executor's plain results become the protobuf responses (service/response_encoding.h): every
// field from its source (random values, so a swapped pair shows), out and lse bytes unchanged, and
// outputs written to shared memory named by the request's range instead.
#include "service/response_encoding.h"

#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "service/request_validation.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

std::string RandomBytes(std::mt19937& rng, size_t n) {
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

TEST(ResponseEncoding, VerifyInlineOrSharedMemory) {
  std::mt19937 rng(11);
  for (int round = 0; round < 16; ++round) {
    VerifyCall call;
    call.total_q = 1 + static_cast<int>(rng() % 40);
    call.num_heads = 1 + static_cast<int>(rng() % 8);
    call.return_lse = rng() % 2 == 0;
    const bool out_shared = rng() % 2 == 0;
    const bool lse_shared = call.return_lse && rng() % 2 == 0;
    v1::VerifyRequest request;
    bf16_bits out_place = 0;
    float lse_place = 0;
    if (out_shared) {
      call.out_destination = &out_place;  // only its being set matters here
      request.mutable_out_shared_memory()->set_region("r" + std::to_string(rng() % 100));
      request.mutable_out_shared_memory()->set_offset(64 * (rng() % 100));
    }
    if (lse_shared) {
      call.lse_destination = &lse_place;
      request.mutable_lse_shared_memory()->set_region("l" + std::to_string(rng() % 100));
      request.mutable_lse_shared_memory()->set_length(rng() % 10000);
    }
    const size_t rows = static_cast<size_t>(call.total_q) * call.num_heads;
    VerifyResult result;
    for (int b = 0; b < 1 + static_cast<int>(rng() % 5); ++b) {
      result.committed_length.push_back(rng() % 5000);
    }
    if (!out_shared) result.out_bytes = RandomBytes(rng, rows * kVDim * 2);
    if (call.return_lse && !lse_shared) result.lse_bytes = RandomBytes(rng, rows * 4);
    const VerifyResult expected = result;

    v1::VerifyResponse response;
    EncodeVerify(request, call, std::move(result), &response);
    ASSERT_EQ(response.committed_length_size(), static_cast<int>(expected.committed_length.size()));
    for (size_t b = 0; b < expected.committed_length.size(); ++b) {
      EXPECT_EQ(response.committed_length(static_cast<int>(b)),
                static_cast<uint64_t>(expected.committed_length[b]));
    }
    EXPECT_EQ(response.out().dtype(), v1::DTYPE_BF16);
    ASSERT_EQ(response.out().shape_size(), 3);
    EXPECT_EQ(response.out().shape(0), call.total_q);
    EXPECT_EQ(response.out().shape(1), call.num_heads);
    EXPECT_EQ(response.out().shape(2), kVDim);
    if (out_shared) {
      EXPECT_FALSE(response.out().has_inline_data());
      EXPECT_EQ(response.out().shared_memory().SerializeAsString(),
                request.out_shared_memory().SerializeAsString());
    } else {
      EXPECT_EQ(response.out().inline_data(), expected.out_bytes);
    }
    EXPECT_EQ(response.has_lse(), call.return_lse);
    if (!call.return_lse) continue;
    EXPECT_EQ(response.lse().dtype(), v1::DTYPE_FP32);
    ASSERT_EQ(response.lse().shape_size(), 2);
    EXPECT_EQ(response.lse().shape(0), call.total_q);
    EXPECT_EQ(response.lse().shape(1), call.num_heads);
    if (lse_shared) {
      EXPECT_FALSE(response.lse().has_inline_data());
      EXPECT_EQ(response.lse().shared_memory().SerializeAsString(),
                request.lse_shared_memory().SerializeAsString());
    } else {
      EXPECT_EQ(response.lse().inline_data(), expected.lse_bytes);
    }
  }
}

FragmentationStats RandomFragmentation(std::mt19937& rng) {
  FragmentationStats f;
  f.sequences = 1 + rng() % 100;
  f.tokens = 1000 + rng() % 100000;
  f.runs = f.sequences + rng() % 1000;
  f.tokens_outside_first_run = rng() % f.tokens;
  return f;
}

void ExpectFragmentation(const v1::Fragmentation& got, const FragmentationStats& want) {
  EXPECT_EQ(got.sequences(), static_cast<uint64_t>(want.sequences));
  EXPECT_EQ(got.tokens(), static_cast<uint64_t>(want.tokens));
  EXPECT_EQ(got.runs(), static_cast<uint64_t>(want.runs));
  EXPECT_EQ(got.tokens_outside_first_run(), static_cast<uint64_t>(want.tokens_outside_first_run));
  EXPECT_DOUBLE_EQ(got.fragmented_ratio(), want.fragmented_ratio());
}

TEST(ResponseEncoding, StatsAndTheOtherResults) {
  std::mt19937 rng(13);
  DeviceStats stats;
  stats.backend = rng() % 2 ? "cpu" : "cuda";
  stats.mps_active = rng() % 2 == 0;
  stats.layers = 1 + rng() % 100;
  stats.max_tree_nodes = 1 + rng() % 1024;
  stats.store.capacity_slots = 100000 + rng() % 100000;
  stats.store.used_slots = rng() % 50000;
  stats.store.free_slots = stats.store.capacity_slots - stats.store.used_slots;
  stats.store.pending_slots = rng() % 500;
  stats.store.largest_free_run = rng() % 40000;
  stats.store.fragmentation = RandomFragmentation(rng);
  stats.store.shared_slots = rng() % 30000;
  stats.store.shared_references = 2 * stats.store.shared_slots + rng() % 1000;
  const int heads = 1 + static_cast<int>(rng() % 128);
  const float scale = 0.01f * static_cast<float>(1 + rng() % 100);
  v1::StatsResponse response;
  EncodeStats(stats, heads, scale, &response);
  EXPECT_EQ(response.backend(), stats.backend);
  EXPECT_EQ(response.mps_active(), stats.mps_active);
  EXPECT_EQ(response.layers(), static_cast<uint32_t>(stats.layers));
  EXPECT_EQ(response.heads(), static_cast<uint32_t>(heads));
  EXPECT_EQ(response.max_tree_nodes(), static_cast<uint32_t>(stats.max_tree_nodes));
  EXPECT_EQ(response.capacity_tokens(), static_cast<uint64_t>(stats.store.capacity_slots));
  EXPECT_EQ(response.used_tokens(), static_cast<uint64_t>(stats.store.used_slots));
  EXPECT_EQ(response.free_tokens(), static_cast<uint64_t>(stats.store.free_slots));
  EXPECT_EQ(response.pending_tokens(), static_cast<uint64_t>(stats.store.pending_slots));
  EXPECT_EQ(response.largest_free_run(), static_cast<uint64_t>(stats.store.largest_free_run));
  ExpectFragmentation(response.fragmentation(), stats.store.fragmentation);
  EXPECT_EQ(response.softmax_scale(), scale);
  EXPECT_EQ(response.shared_tokens(), static_cast<uint64_t>(stats.store.shared_slots));
  EXPECT_EQ(response.shared_references(), static_cast<uint64_t>(stats.store.shared_references));

  AppendResult appended{static_cast<int64_t>(rng() % 1000), {}};
  for (int l = 0; l < 5; ++l) appended.layer_fill.push_back(appended.committed_length + rng() % 9);
  v1::AppendResponse append;
  EncodeAppend(appended, &append);
  EXPECT_EQ(append.committed_length(), static_cast<uint64_t>(appended.committed_length));
  ASSERT_EQ(append.layer_fill_size(), 5);
  for (int l = 0; l < 5; ++l) {
    EXPECT_EQ(append.layer_fill(l), static_cast<uint64_t>(appended.layer_fill[l]));
  }
  v1::CommitResponse commit;
  const CommitResult committed{static_cast<int64_t>(rng() % 100000)};
  EncodeCommit(committed, &commit);
  EXPECT_EQ(commit.committed_length(), static_cast<uint64_t>(committed.committed_length));
  v1::ReleaseResponse release;
  const ReleaseResult released{static_cast<int64_t>(rng() % 100000)};
  EncodeRelease(released, &release);
  EXPECT_EQ(release.freed_slots(), static_cast<uint64_t>(released.freed_slots));
  v1::ForkResponse fork;
  const ForkResult forked{static_cast<int64_t>(rng() % 100000), static_cast<int64_t>(rng() % 1000)};
  EncodeFork(forked, &fork);
  EXPECT_EQ(fork.committed_length(), static_cast<uint64_t>(forked.committed_length));
  EXPECT_EQ(fork.shared_tokens(), static_cast<uint64_t>(forked.shared_slots));
}

// Fragmentation before is reported once an operation started, after once it ended.
TEST(ResponseEncoding, CompactionStatusByState) {
  std::mt19937 rng(17);
  using State = CompactionOperation::State;
  for (State state : {State::kPending, State::kRunning, State::kDone, State::kFailed}) {
    CompactionOperation op;
    op.id = "compact-" + std::to_string(rng() % 100);
    op.state = state;
    op.bytes_planned = rng() % 100000;
    op.bytes_moved = rng() % 100000;
    op.tokens_moved = rng() % 1000;
    op.before = RandomFragmentation(rng);
    op.after = RandomFragmentation(rng);
    op.copy_time = absl::Microseconds(1 + rng() % 100000);
    op.error = state == State::kFailed ? "stale plan" : "";
    v1::CompactionStatus status;
    EncodeCompactionStatus(op, &status);
    EXPECT_EQ(status.operation_id(), op.id);
    EXPECT_EQ(status.state(), state == State::kPending   ? v1::CompactionStatus::PENDING
                              : state == State::kRunning ? v1::CompactionStatus::RUNNING
                              : state == State::kDone    ? v1::CompactionStatus::DONE
                                                         : v1::CompactionStatus::FAILED);
    EXPECT_EQ(status.bytes_planned(), static_cast<uint64_t>(op.bytes_planned));
    EXPECT_EQ(status.bytes_moved(), static_cast<uint64_t>(op.bytes_moved));
    EXPECT_EQ(status.tokens_moved(), static_cast<uint64_t>(op.tokens_moved));
    EXPECT_EQ(status.has_before(), state != State::kPending);
    if (status.has_before()) ExpectFragmentation(status.before(), op.before);
    const bool ended = state == State::kDone || state == State::kFailed;
    EXPECT_EQ(status.has_after(), ended);
    if (ended) ExpectFragmentation(status.after(), op.after);
    EXPECT_DOUBLE_EQ(status.seconds(), absl::ToDoubleSeconds(op.copy_time));
    EXPECT_DOUBLE_EQ(status.bytes_per_second(), op.bytes_per_second());
    EXPECT_EQ(status.error(), op.error);
  }
}

// ListSequences: every field from its source, ids in page order; and the page bound holds for the
// largest entries the store can give (every number at its widest varint, non-zero doubles): a
// full page of MaxListedSequences of them fits --max-message-bytes.
TEST(ResponseEncoding, SequencesAndTheirPageBound) {
  std::mt19937 rng(21);
  SequencePage page;
  for (int i = 0; i < 5; ++i) {
    SequenceSummary s;
    s.id = (uint64_t{rng()} << 32) | rng();
    s.committed_length = rng() % 100000;
    s.pending_nodes = rng() % 1024;
    s.idle = absl::Milliseconds(rng() % 100000);
    s.lease_left = absl::Milliseconds(static_cast<int>(rng() % 100000) - 50000);
    s.shared_slots = rng() % 1000;
    page.sequences.push_back(s);
  }
  page.truncated = true;
  page.total = 77;
  v1::ListSequencesResponse response;
  EncodeSequences(page, &response);
  ASSERT_EQ(response.sequences_size(), 5);
  EXPECT_TRUE(response.truncated());
  EXPECT_EQ(response.total_sequences(), 77u);
  for (int i = 0; i < 5; ++i) {
    const SequenceSummary& s = page.sequences[i];
    const v1::SequenceInfo& info = response.sequences(i);
    EXPECT_EQ(info.sequence_id(), s.id);
    EXPECT_EQ(info.committed_length(), static_cast<uint64_t>(s.committed_length));
    EXPECT_EQ(info.pending_tree_nodes(), static_cast<uint32_t>(s.pending_nodes));
    EXPECT_DOUBLE_EQ(info.idle_seconds(), absl::ToDoubleSeconds(s.idle));
    EXPECT_DOUBLE_EQ(info.lease_remaining_seconds(), absl::ToDoubleSeconds(s.lease_left));
    EXPECT_EQ(info.shared_tokens(), static_cast<uint64_t>(s.shared_slots));
  }

  for (int64_t max_message_bytes : {int64_t{64} << 10, int64_t{1} << 20, int64_t{64} << 20}) {
    SCOPED_TRACE(max_message_bytes);
    const ValidationLimits limits{.max_message_bytes = max_message_bytes};
    SequencePage widest;
    widest.truncated = true;
    widest.total = INT64_MAX;
    SequenceSummary s;
    s.id = UINT64_MAX;
    s.committed_length = INT64_MAX;
    s.pending_nodes = UINT32_MAX;
    s.idle = absl::Seconds(1e9);
    s.lease_left = -absl::Seconds(1e9);
    s.shared_slots = INT64_MAX;
    widest.sequences.assign(static_cast<size_t>(MaxListedSequences(limits)), s);
    v1::ListSequencesResponse full;
    EncodeSequences(widest, &full);
    EXPECT_LE(static_cast<int64_t>(full.ByteSizeLong()), max_message_bytes);
    // Each entry alone, with its field tag and length, within the per-entry bound.
    v1::ListSequencesResponse one;
    *one.add_sequences() = full.sequences(0);
    EXPECT_LE(static_cast<int64_t>(one.ByteSizeLong()), kMaxSequenceInfoBytes);
  }
}

}  // namespace
}  // namespace verifyd
