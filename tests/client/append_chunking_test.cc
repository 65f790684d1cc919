#include "client/append_chunking.h"

#include <random>

#include "client/tensor.h"
#include "gtest/gtest.h"

namespace verifyd {
namespace {

v1::AppendRequest RandomAppend(int64_t layers, int64_t tokens, std::mt19937& rng,
                               std::vector<uint16_t>* data) {
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  data->resize(layers * tokens * 576);
  for (uint16_t& v : *data) v = static_cast<uint16_t>(bits(rng));
  v1::AppendRequest request;
  request.set_sequence_id(0xabcdef12345ull);
  request.set_layer_begin(2);
  const int64_t shape[] = {layers, tokens, 576};
  *request.mutable_kv() = *tensor::MakeBf16(shape, *data);
  return request;
}

TEST(AppendChunkingTest, SmallRequestIsSentAsIs) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint16_t> data;
  v1::AppendRequest request = RandomAppend(2, 10, rng, &data);
  auto chunks = SplitAppend(request, 1 << 20);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  ASSERT_EQ(chunks->size(), 1u);
  EXPECT_EQ((*chunks)[0].SerializeAsString(), request.SerializeAsString());
}

TEST(AppendChunkingTest, ChunksFitAndConcatenateToTheOriginalPerLayer) {
  std::mt19937 rng(std::random_device{}());
  for (int64_t limit : {int64_t{8} << 10, int64_t{100} << 10, int64_t{1} << 20}) {
    const int64_t layers = 1 + rng() % 4, tokens = 200 + rng() % 500;
    std::vector<uint16_t> data;
    v1::AppendRequest request = RandomAppend(layers, tokens, rng, &data);
    auto chunks = SplitAppend(request, limit);
    ASSERT_TRUE(chunks.ok()) << chunks.status();
    const int64_t per_chunk = (limit - kAppendEnvelopeBytes) / (layers * 576 * 2);
    EXPECT_EQ(static_cast<int64_t>(chunks->size()), (tokens + per_chunk - 1) / per_chunk);
    std::vector<std::vector<uint16_t>> rebuilt(layers);
    int64_t seen_tokens = 0;
    for (const v1::AppendRequest& c : *chunks) {
      EXPECT_LE(static_cast<int64_t>(c.ByteSizeLong()), limit);
      EXPECT_EQ(c.sequence_id(), request.sequence_id());
      EXPECT_EQ(c.layer_begin(), request.layer_begin());
      ASSERT_EQ(c.kv().shape_size(), 3);
      EXPECT_EQ(c.kv().shape(0), layers);
      EXPECT_EQ(c.kv().shape(2), 576);
      seen_tokens += c.kv().shape(1);
      auto values = tensor::ParseBf16(c.kv(), "kv");
      ASSERT_TRUE(values.ok()) << values.status();
      const int64_t rows = c.kv().shape(1) * 576;
      for (int64_t l = 0; l < layers; ++l) {
        rebuilt[l].insert(rebuilt[l].end(), values->begin() + l * rows,
                          values->begin() + (l + 1) * rows);
      }
    }
    EXPECT_EQ(seen_tokens, tokens);
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<uint16_t> want(data.begin() + l * tokens * 576,
                                       data.begin() + (l + 1) * tokens * 576);
      ASSERT_EQ(rebuilt[l], want) << "layer " << l << " limit " << limit;
    }
  }
}

// Rows in the fp8 layout (DTYPE_FP8_MLA, 656 bytes each) split along T the same way, whole rows
// per chunk, the dtype kept.
TEST(AppendChunkingTest, Fp8RowsSplitIntoWholeRows) {
  std::mt19937 rng(std::random_device{}());
  const int64_t layers = 3, tokens = 301, limit = int64_t{64} << 10;
  std::string data(static_cast<size_t>(layers * tokens * 656), '\0');
  for (char& c : data) c = static_cast<char>(rng());
  v1::AppendRequest request;
  request.set_create(true);
  request.mutable_kv()->set_dtype(v1::DTYPE_FP8_MLA);
  for (int64_t d : {layers, tokens, int64_t{656}}) request.mutable_kv()->add_shape(d);
  request.mutable_kv()->set_inline_data(data);
  auto chunks = SplitAppend(request, limit);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  const int64_t per_chunk = (limit - kAppendEnvelopeBytes) / (layers * 656);
  ASSERT_EQ(static_cast<int64_t>(chunks->size()), (tokens + per_chunk - 1) / per_chunk);
  std::vector<std::string> rebuilt(layers);
  int64_t t0 = 0;
  for (const v1::AppendRequest& c : *chunks) {
    EXPECT_LE(static_cast<int64_t>(c.ByteSizeLong()), limit);
    EXPECT_EQ(c.kv().dtype(), v1::DTYPE_FP8_MLA);
    EXPECT_EQ(c.kv().shape(2), 656);
    if (t0 > 0) EXPECT_EQ(c.expected_fill(), static_cast<uint64_t>(t0));
    const int64_t n = c.kv().shape(1);
    ASSERT_EQ(static_cast<int64_t>(c.kv().inline_data().size()), layers * n * 656);
    for (int64_t l = 0; l < layers; ++l)
      rebuilt[l] += c.kv().inline_data().substr(l * n * 656, n * 656);
    t0 += n;
  }
  EXPECT_EQ(t0, tokens);
  for (int64_t l = 0; l < layers; ++l) {
    EXPECT_EQ(rebuilt[l], data.substr(l * tokens * 656, tokens * 656)) << l;
  }
}

TEST(AppendChunkingTest, RejectsWhatCannotBeSplit) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint16_t> data;
  v1::AppendRequest request = RandomAppend(4, 50, rng, &data);
  // One token of 4 layers is 4608 bytes: no chunk fits in 5000 bytes with the envelope.
  auto too_small = SplitAppend(request, 5000);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_small.status().message().find("max_message_bytes = 5000"), std::string::npos);

  request.mutable_kv()->mutable_inline_data()->resize(100);
  auto malformed = SplitAppend(request, 50);
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(malformed.status().message().find("kv.shape"), std::string::npos) << malformed.status();
}

// SPEC §2: every chunk states where it writes. Create (or expected_fill = e) on the request gives
// chunk k expected_fill = (0 or e) + the tokens of the chunks before it; no position, none.
TEST(AppendChunkingTest, EveryChunkExpectsTheFillTheChunksBeforeItLeave) {
  std::mt19937 rng(std::random_device{}());
  for (int mode = 0; mode < 3; ++mode) {
    const int64_t layers = 1 + rng() % 3, tokens = 150 + rng() % 300;
    std::vector<uint16_t> data;
    v1::AppendRequest request = RandomAppend(layers, tokens, rng, &data);
    const uint64_t base = mode == 1 ? 1 + rng() % 1000 : 0;
    if (mode == 0) SetExpectedPosition(AppendPosition::Create(), &request);
    if (mode == 1) SetExpectedPosition(AppendPosition::Fill(base), &request);
    auto chunks = SplitAppend(request, 32 << 10);
    ASSERT_TRUE(chunks.ok()) << chunks.status();
    ASSERT_GT(chunks->size(), 2u);
    uint64_t before = 0;
    for (size_t k = 0; k < chunks->size(); ++k) {
      const v1::AppendRequest& chunk = (*chunks)[k];
      if (mode == 2) {
        EXPECT_EQ(chunk.expected_position_case(), v1::AppendRequest::EXPECTED_POSITION_NOT_SET);
      } else if (mode == 0 && k == 0) {
        EXPECT_TRUE(chunk.has_create() && chunk.create());
      } else {
        ASSERT_TRUE(chunk.has_expected_fill()) << "chunk " << k;
        EXPECT_EQ(chunk.expected_fill(), base + before) << "chunk " << k;
      }
      before += static_cast<uint64_t>(chunk.kv().shape(1));
    }
    EXPECT_EQ(before, static_cast<uint64_t>(tokens));
  }
}

}  // namespace
}  // namespace verifyd
