// SPEC §2's expected offset and §1's value bound through the daemon's socket: a chunked prefill
// across a Release or a lease expiry is refused (FAILED_PRECONDITION naming both numbers), never
// silently re-created; NaN, Inf and values beyond 2^16 in kv, tree_kv or q are INVALID_ARGUMENT
// naming the tensor and the first bad index; every refused call leaves Stats as they were, and
// the other sequences keep verifying against the float64 reference.
#include <functional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/append_chunking.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::RpcDriver;
using testing::ShadowModel;
using testing::VerifyPart;

// What Stats says about the store (not the geometry), as one comparable string.
std::string StoreState(const v1::StatsResponse& s) {
  return absl::StrCat("used ", s.used_tokens(), " free ", s.free_tokens(), " pending ",
                      s.pending_tokens(), " largest free run ", s.largest_free_run(), " sequences ",
                      s.fragmentation().sequences(), " tokens ", s.fragmentation().tokens(),
                      " runs ", s.fragmentation().runs());
}

class IntegrityTest : public ::testing::Test {
 protected:
  static ServiceOptions Options(double lease_seconds) {
    ServiceOptions o = testing::SmallOptions("integrity");
    o.kv_capacity_tokens = 2048;
    o.max_message_bytes = 4 << 20;
    o.lease_seconds = lease_seconds;
    return o;
  }

  explicit IntegrityTest(double lease_seconds = 300)
      : options_(Options(lease_seconds)),
        server_(options_),
        model_(options_.layers, options_.heads, options_.softmax_scale, std::random_device{}()),
        rpc_(server_.stub(), model_) {}

  void SetUp() override { ASSERT_TRUE(server_.status().ok()) << server_.status(); }

  // Sequences 1 and 2 with pending trees verified on every layer.
  void StartOthers() {
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 20)).ok());
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(2, 33)).ok());
    ASSERT_EQ(rpc_.Step(Parts(false), true), "");
  }

  // Sequences 1 and 2 with their pending trees, or new trees committing a path of the old.
  std::vector<VerifyPart> Parts(bool commit) { return model_.StepParts({1, 2}, commit, 5, 7); }

  void ExpectOthersStillVerify() {
    ASSERT_EQ(rpc_.Step(Parts(false), true), "");
    ASSERT_EQ(rpc_.Step(Parts(true), false), "");
  }

  grpc::Status SendAppend(const v1::AppendRequest& request) {
    grpc::ClientContext context;
    v1::AppendResponse response;
    return server_.stub().Append(&context, request, &response);
  }
  grpc::Status SendVerify(const v1::VerifyRequest& request) {
    grpc::ClientContext context;
    v1::VerifyResponse response;
    return server_.stub().Verify(&context, request, &response);
  }

  void ExpectError(const grpc::Status& status, grpc::StatusCode code,
                   const std::vector<std::string>& parts) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    for (const std::string& part : parts) EXPECT_THAT(status.error_message(), HasSubstr(part));
  }

  // A prefill of `tokens` for `sequence` split into chunks of at most ~`chunk_bytes`, each
  // stating where it writes (the first creates).
  std::vector<v1::AppendRequest> Chunks(uint64_t sequence, int tokens, int64_t chunk_bytes) {
    v1::AppendRequest whole = model_.MakeAppend(sequence, tokens);
    SetExpectedPosition(AppendPosition::Create(), &whole);
    auto chunks = SplitAppend(whole, chunk_bytes);
    EXPECT_TRUE(chunks.ok()) << chunks.status();
    return chunks.ok() ? *chunks : std::vector<v1::AppendRequest>{};
  }

  ServiceOptions options_;
  testing::TestServer server_;
  ShadowModel model_;
  RpcDriver rpc_;
};

TEST_F(IntegrityTest, ChunkedPrefillAcrossAReleaseIsRefusedNotRecreated) {
  StartOthers();
  const std::vector<v1::AppendRequest> chunks = Chunks(5, 300, 256 << 10);
  ASSERT_GE(chunks.size(), 3u);
  ASSERT_TRUE(SendAppend(chunks[0]).ok());
  ASSERT_TRUE(SendAppend(chunks[1]).ok());
  const int64_t written = chunks[0].kv().shape(1) + chunks[1].kv().shape(1);
  ASSERT_EQ(chunks[2].expected_fill(), static_cast<uint64_t>(written));
  ASSERT_TRUE(rpc_.Release(5).ok());
  const std::string after_release = StoreState(rpc_.Stats());

  ExpectError(SendAppend(chunks[2]), grpc::StatusCode::FAILED_PRECONDITION,
              {absl::StrCat("expected_fill = ", written), "sequence 5 does not exist (0 tokens)"});
  EXPECT_EQ(StoreState(rpc_.Stats()), after_release);
  ExpectError(rpc_.Release(5), grpc::StatusCode::NOT_FOUND, {"sequence_id = 5"});
  // create on a live sequence, and a fill that is not the sequence's, name both numbers too.
  ASSERT_TRUE(SendAppend(chunks[0]).ok());
  const std::string live = StoreState(rpc_.Stats());
  ExpectError(SendAppend(chunks[0]), grpc::StatusCode::FAILED_PRECONDITION,
              {"create expects sequence 5 not to exist",
               absl::StrCat(chunks[0].kv().shape(1), " committed tokens")});
  ExpectError(SendAppend(chunks[2]), grpc::StatusCode::FAILED_PRECONDITION,
              {absl::StrCat("expected_fill = ", written),
               absl::StrCat("holds ", chunks[0].kv().shape(1), " tokens")});
  EXPECT_EQ(StoreState(rpc_.Stats()), live);
  ExpectOthersStillVerify();
}

TEST_F(IntegrityTest, TheClientLibraryStatesThePositionOfEveryChunk) {
  StartOthers();
  ClientOptions client_options;
  client_options.max_message_bytes = 256 << 10;  // a 300-token prefill takes several chunks
  auto client = Client::FromChannel(server_.channel(), client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  const v1::AppendRequest whole = model_.MakeAppend(6, 300);
  const std::string& bytes = whole.kv().inline_data();
  const absl::Span<const uint16_t> kv(reinterpret_cast<const uint16_t*>(bytes.data()),
                                      bytes.size() / 2);
  auto created = (*client)->AppendKv(6, 0, options_.layers, 300, kv, AppendPosition::Create());
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->committed_length(), 300u);
  model_.AcceptAppend(whole);
  // Again with create, or at the wrong fill: refused at the first chunk, nothing written.
  const std::string before = StoreState(rpc_.Stats());
  auto again = (*client)->AppendKv(6, 0, options_.layers, 300, kv, AppendPosition::Create());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  auto wrong = (*client)->AppendKv(6, 0, options_.layers, 300, kv, AppendPosition::Fill(299));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_THAT(wrong.status().message(), HasSubstr("expected_fill = 299"));
  EXPECT_EQ(StoreState(rpc_.Stats()), before);
  // The sequence holds exactly the one prefill: a tree over it verifies against the reference.
  ASSERT_EQ(rpc_.Step({VerifyPart{6, model_.RandomParents(4), std::nullopt}}, true), "");
}

TEST_F(IntegrityTest, MalformedExpectedPositionsAreInvalidArgument) {
  v1::AppendRequest append = model_.MakeAppend(4, 3);
  append.set_create(false);
  ExpectError(SendAppend(append), grpc::StatusCode::INVALID_ARGUMENT,
              {"create = false", "expected_fill"});
  append.set_expected_fill(uint64_t{1} << 40);
  ExpectError(SendAppend(append), grpc::StatusCode::INVALID_ARGUMENT,
              {"expected_fill = 1099511627776 must be <= int32 max"});
  EXPECT_EQ(rpc_.Stats().fragmentation().sequences(), 0u);
}

class ShortLeaseIntegrityTest : public IntegrityTest {
 protected:
  ShortLeaseIntegrityTest() : IntegrityTest(/*lease_seconds=*/0.3) {}
};

TEST_F(ShortLeaseIntegrityTest, ChunkedPrefillAcrossALeaseExpiryIsRefusedNotRecreated) {
  const std::vector<v1::AppendRequest> chunks = Chunks(8, 200, 256 << 10);
  ASSERT_GE(chunks.size(), 2u);
  ASSERT_TRUE(SendAppend(chunks[0]).ok());
  // The scheduler stalls past the lease: the daemon releases the sequence (bounded wait).
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (rpc_.Stats().fragmentation().sequences() != 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const v1::StatsResponse expired = rpc_.Stats();
  ASSERT_EQ(expired.fragmentation().sequences(), 0u) << "the lease never expired";
  ExpectError(
      SendAppend(chunks[1]), grpc::StatusCode::FAILED_PRECONDITION,
      {absl::StrCat("expected_fill = ", chunks[0].kv().shape(1)), "sequence 8 does not exist"});
  EXPECT_EQ(StoreState(rpc_.Stats()), StoreState(expired));
}

// Flat index -> "[i0, i1, ...]" for `shape`.
std::string IndexText(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string text = "[";
  for (size_t d = 0; d < index.size(); ++d) absl::StrAppend(&text, d ? ", " : "", index[d]);
  return text + "]";
}

void Poke(v1::Tensor* t, int64_t flat, bf16_bits value) {
  std::string* bytes = t->mutable_inline_data();
  std::memcpy(bytes->data() + flat * 2, &value, 2);
}

std::vector<int64_t> ShapeOf(const v1::Tensor& t) { return {t.shape().begin(), t.shape().end()}; }

TEST_F(IntegrityTest, OutOfBoundValuesAreRejectedNamingTheTensorAndIndexAndKeepNothing) {
  StartOthers();
  std::mt19937_64 rng(std::random_device{}());
  const struct {
    bf16_bits bits;
    const char* says;
  } bad_values[] = {{0x7fc1, "is not finite"},
                    {0xffc0, "is not finite"},
                    {0x7f80, "is not finite"},
                    {0xff80, "is not finite"},
                    {0x4781, "is outside"},
                    {FloatToBf16(3.3e38f), "is outside"},
                    {FloatToBf16(-1e5f), "is outside"}};
  for (const auto& bad : bad_values) {
    SCOPED_TRACE(absl::StrCat("bits 0x", absl::Hex(bad.bits)));
    const std::string before = StoreState(rpc_.Stats());
    // kv of a new sequence: refused, and the sequence was never created.
    v1::AppendRequest append = model_.MakeAppend(7, 1 + static_cast<int>(rng() % 40));
    SetExpectedPosition(AppendPosition::Create(), &append);
    const int64_t kv_at = static_cast<int64_t>(rng() % (append.kv().inline_data().size() / 2));
    Poke(append.mutable_kv(), kv_at, bad.bits);
    ExpectError(SendAppend(append), grpc::StatusCode::INVALID_ARGUMENT,
                {absl::StrCat("kv", IndexText(kv_at, ShapeOf(append.kv())), " = "), bad.says});
    ExpectError(rpc_.Release(7), grpc::StatusCode::NOT_FOUND, {"sequence_id = 7"});

    // tree_kv or q of a Verify whose commit rides on it: the commit is not applied either.
    for (bool in_q : {false, true}) {
      v1::VerifyRequest verify = model_.MakeVerify(0, Parts(true), false);
      v1::Tensor* t = in_q ? verify.mutable_q() : verify.mutable_tree_kv();
      const int64_t at = static_cast<int64_t>(rng() % (t->inline_data().size() / 2));
      Poke(t, at, bad.bits);
      ExpectError(
          SendVerify(verify), grpc::StatusCode::INVALID_ARGUMENT,
          {absl::StrCat(in_q ? "q" : "tree_kv", IndexText(at, ShapeOf(*t)), " = "), bad.says});
    }
    EXPECT_EQ(StoreState(rpc_.Stats()), before);
    // The pending trees are still the old ones: a Verify of them (no commit) matches float64.
    ASSERT_EQ(rpc_.Step(Parts(false), true), "");
  }
  ExpectOthersStillVerify();
}

TEST_F(IntegrityTest, ValuesAtTheBoundAreAcceptedAndAnswerFinite) {
  // Every kv, tree_kv and q value is +-2^16: the largest scores the contract allows.
  v1::AppendRequest append = model_.MakeAppend(3, 50);
  std::mt19937_64 rng(std::random_device{}());
  for (int64_t i = 0; i < append.kv().shape(0) * 50 * kKvDim; ++i) {
    Poke(append.mutable_kv(), i, (rng() & 1) ? 0x4780 : 0xc780);
  }
  ASSERT_TRUE(SendAppend(append).ok());
  v1::VerifyRequest verify =
      model_.MakeVerify(0, {VerifyPart{3, {-1, 0, 0, 1}, std::nullopt}}, true);
  // A request's scale above the largest allowed, and the largest allowed (with the largest values:
  // scores up to 2^58) which must still answer finite.
  verify.set_softmax_scale(1e30f);
  ExpectError(SendVerify(verify), grpc::StatusCode::INVALID_ARGUMENT,
              {"softmax_scale = 1e+30 must be finite and > 0, and <= 65536"});
  verify.set_softmax_scale(65536.f);
  for (int64_t i = 0; i < verify.q().inline_data().size() / 2; ++i)
    Poke(verify.mutable_q(), i, 0x4780);
  for (int64_t i = 0; i < verify.tree_kv().inline_data().size() / 2; ++i) {
    Poke(verify.mutable_tree_kv(), i, (rng() & 1) ? 0x4780 : 0xc780);
  }
  grpc::ClientContext context;
  v1::VerifyResponse response;
  ASSERT_TRUE(server_.stub().Verify(&context, verify, &response).ok());
  const std::string& out = response.out().inline_data();
  ASSERT_EQ(out.size(), 4u * options_.heads * kVDim * 2);
  for (size_t i = 0; i < out.size() / 2; ++i) {
    bf16_bits v;
    std::memcpy(&v, out.data() + 2 * i, 2);
    ASSERT_TRUE(std::isfinite(Bf16ToFloat(v))) << "out element " << i;
  }
  const std::string& lse = response.lse().inline_data();
  ASSERT_EQ(lse.size(), 4u * options_.heads * 4);
  for (size_t i = 0; i < lse.size() / 4; ++i) {
    float v;
    std::memcpy(&v, lse.data() + 4 * i, 4);
    ASSERT_TRUE(std::isfinite(v)) << "lse element " << i;
  }
}

}  // namespace
}  // namespace verifyd
