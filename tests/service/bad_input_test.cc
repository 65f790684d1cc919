// Bad input through the daemon's socket: state errors from the store (unknown sequence, pending
// tree mismatch, invalid commit path, unverified layers, capacity), validation errors through
// the wire, oversized messages and the admin rule. Each gets its code and a message naming the
// field; afterwards every other sequence still verifies correctly.
#include <functional>
#include <future>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "service/verifyd_service.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::RpcDriver;
using testing::ShadowModel;
using testing::VerifyPart;

class BadInputTest : public ::testing::Test {
 protected:
  static ServiceOptions Options() {
    ServiceOptions o = testing::SmallOptions("bad");
    o.kv_capacity_tokens = 1024;
    o.max_message_bytes = 2 << 20;
    o.tcp = "127.0.0.1:0";
    o.admin_token_file = testing::WriteTokenFile("s3cret");
    return o;
  }

  BadInputTest()
      : options_(Options()),
        server_(options_),
        model_(options_.layers, options_.heads, options_.softmax_scale, 99),
        rpc_(server_.stub(), model_) {}

  void SetUp() override {
    ASSERT_TRUE(server_.status().ok()) << server_.status();
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 20)).ok());
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(2, 30)).ok());
    ASSERT_EQ(rpc_.Step(Parts(false), true), "");
  }

  // Sequences 1 and 2 with their pending trees, or new trees committing a path of the old.
  std::vector<VerifyPart> Parts(bool commit) { return model_.StepParts({1, 2}, commit, 9, 7); }

  // The sequences the cases must not have touched still verify, commit and verify again.
  void ExpectOthersStillVerify() {
    ASSERT_EQ(rpc_.Step(Parts(false), true), "");
    ASSERT_EQ(rpc_.Step(Parts(true), false), "");
  }

  template <typename Call>
  void ExpectError(Call call, grpc::StatusCode code, const std::string& message) {
    const grpc::Status status = call();
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }

  grpc::Status SendVerify(const v1::VerifyRequest& request) {
    grpc::ClientContext context;
    v1::VerifyResponse response;
    return server_.stub().Verify(&context, request, &response);
  }

  grpc::Status SendAppend(const v1::AppendRequest& request) {
    grpc::ClientContext context;
    v1::AppendResponse response;
    return server_.stub().Append(&context, request, &response);
  }

  ServiceOptions options_;
  testing::TestServer server_;
  ShadowModel model_;
  RpcDriver rpc_;
};

TEST_F(BadInputTest, StoreStateErrorsNameTheFieldAndTouchNothing) {
  const auto parents1 = model_.sequences().at(1).parents;
  const int q1 = static_cast<int>(parents1.size());
  // Unknown sequence next to a valid one: nothing of the call is applied.
  ExpectError(
      [&] {
        return SendVerify(model_.MakeVerify(
            0, {VerifyPart{1, parents1, std::nullopt}, VerifyPart{77, {-1, 0}, std::nullopt}},
            false));
      },
      grpc::StatusCode::NOT_FOUND, "sequences[1].sequence_id = 77 is not a live sequence");
  // A new tree while one is pending.
  ExpectError(
      [&] {
        return SendVerify(model_.MakeVerify(0, {VerifyPart{1, {-1, 0, 0}, std::nullopt}}, false));
      },
      grpc::StatusCode::FAILED_PRECONDITION, "sequences[0].parents differ");
  // A riding commit whose path leaves the tree, or is not a chain from a root.
  ExpectError(
      [&] {
        return SendVerify(
            model_.MakeVerify(0, {VerifyPart{1, {-1}, std::vector<int32_t>{q1}}}, false));
      },
      grpc::StatusCode::INVALID_ARGUMENT,
      "sequences[0].commit_previous.accepted_path[0] = " + std::to_string(q1) + " must be in [0, " +
          std::to_string(q1) + ")");
  ExpectError(
      [&] {
        return SendVerify(
            model_.MakeVerify(0, {VerifyPart{2, {-1}, std::vector<int32_t>{0, 0}}}, false));
      },
      grpc::StatusCode::INVALID_ARGUMENT, "sequences[0].commit_previous.accepted_path[1] = 0");
  // The same through Commit alone, and for unknown sequences.
  ExpectError([&] { return rpc_.Commit(1, {q1 + 5}); }, grpc::StatusCode::INVALID_ARGUMENT,
              "commit.accepted_path[0]");
  ExpectError([&] { return rpc_.Commit(77, {0}); }, grpc::StatusCode::NOT_FOUND,
              "sequence_id = 77 is not a live sequence");
  ExpectError([&] { return rpc_.Release(77); }, grpc::StatusCode::NOT_FOUND,
              "sequence_id = 77 is not a live sequence");
  // Append while a tree is pending.
  ExpectError([&] { return SendAppend(model_.MakeAppend(1, 2)); },
              grpc::StatusCode::FAILED_PRECONDITION, "pending tree");

  // A tree verified on layer 0 only cannot be committed (rejecting it with k = 0 can).
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(3, 5)).ok());
  std::string mismatch;
  ASSERT_TRUE(
      rpc_.Verify(model_.MakeVerify(0, {VerifyPart{3, {-1, 0}, std::nullopt}}, false), &mismatch)
          .ok());
  EXPECT_EQ(mismatch, "");
  ExpectError([&] { return rpc_.Commit(3, {0}); }, grpc::StatusCode::FAILED_PRECONDITION,
              "never verified");
  ASSERT_TRUE(rpc_.Commit(3, {}).ok());
  // Commit with no pending tree.
  ExpectError([&] { return rpc_.Commit(3, {}); }, grpc::StatusCode::FAILED_PRECONDITION,
              "no pending tree");
  // Layers at different fill levels cannot take a tree.
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(3, 2, 0, 1)).ok());
  ExpectError(
      [&] {
        return SendVerify(model_.MakeVerify(1, {VerifyPart{3, {-1}, std::nullopt}}, false));
      },
      grpc::StatusCode::FAILED_PRECONDITION, "sequences[0]: sequence 3 has layers at different");
  ASSERT_TRUE(rpc_.Release(3).ok());

  ExpectOthersStillVerify();
}

TEST_F(BadInputTest, CapacityExhaustedKeepsNothing) {
  const v1::StatsResponse before = rpc_.Stats();
  // More tokens than free slots: RESOURCE_EXHAUSTED, and the sequence was never created.
  ExpectError([&] { return SendAppend(model_.MakeAppend(8, 1000, 0, 1)); },
              grpc::StatusCode::RESOURCE_EXHAUSTED, "kv.shape[1]: need 1000 free KV slots");
  EXPECT_EQ(rpc_.Stats().used_tokens(), before.used_tokens());
  ExpectError([&] { return rpc_.Release(8); }, grpc::StatusCode::NOT_FOUND, "sequence_id = 8");
  // A tree that does not fit.
  // Chunks keep each Append under --max-message-bytes.
  for (int64_t left = static_cast<int64_t>(before.free_tokens()) - 10; left > 0; left -= 300) {
    ASSERT_TRUE(
        rpc_.Append(model_.MakeAppend(9, static_cast<int>(std::min<int64_t>(left, 300)))).ok());
  }
  ExpectError(
      [&] {
        return SendVerify(
            model_.MakeVerify(0, {VerifyPart{9, model_.RandomParents(32), std::nullopt}}, false));
      },
      grpc::StatusCode::RESOURCE_EXHAUSTED, "sequences: the new trees need 32 free KV slots");
  ASSERT_TRUE(rpc_.Release(9).ok());
  EXPECT_EQ(rpc_.Stats().used_tokens(), before.used_tokens());
  ExpectOthersStillVerify();
}

TEST_F(BadInputTest, ValidationErrorsThroughTheWire) {
  const auto parents1 = model_.sequences().at(1).parents;
  v1::VerifyRequest valid = model_.MakeVerify(2, {VerifyPart{1, parents1, std::nullopt}}, false);
  std::vector<std::pair<std::function<void(v1::VerifyRequest&)>, std::string>> cases = {
      {[](v1::VerifyRequest& r) { r.set_layer(3); }, "layer = 3 must be < --layers = 3"},
      {[](v1::VerifyRequest& r) { r.mutable_q()->set_shape(1, 16); },
       "q.shape[1] = 16 must equal --heads = 4"},
      {[](v1::VerifyRequest& r) { r.mutable_tree_kv()->mutable_inline_data()->resize(10); },
       "tree_kv.inline_data has 10 bytes"},
      {[](v1::VerifyRequest& r) { r.mutable_q()->set_dtype(v1::DTYPE_FP32); }, "q.dtype"},
      {[](v1::VerifyRequest& r) { r.mutable_sequences(0)->set_parents(1, 4); },
       "sequences[0].parents[1] = 4 must be < 1"},
      {[](v1::VerifyRequest& r) {
         for (int i = 0; i < 64; ++i) r.mutable_sequences(0)->add_parents(-1);
       },
       "--max-tree-nodes = 64"},
      {[](v1::VerifyRequest& r) { *r.add_sequences() = r.sequences(0); },
       "sequences[1].sequence_id = 1 repeats sequences[0]"},
  };
  for (const auto& [mutate, message] : cases) {
    SCOPED_TRACE(message);
    v1::VerifyRequest request = valid;
    mutate(request);
    ExpectError([&] { return SendVerify(request); }, grpc::StatusCode::INVALID_ARGUMENT, message);
  }
  v1::AppendRequest append = model_.MakeAppend(4, 2);
  append.set_layer_begin(5);
  ExpectError([&] { return SendAppend(append); }, grpc::StatusCode::INVALID_ARGUMENT,
              "layer_begin = 5 must be < --layers = 3");
  append = model_.MakeAppend(4, 2);
  append.mutable_kv()->mutable_shared_memory()->set_region("shm");
  ExpectError([&] { return SendAppend(append); }, grpc::StatusCode::NOT_FOUND,
              "kv.shared_memory.region = 'shm' is not a live shared-memory region");
  // Larger than --max-message-bytes: refused by the handler, naming the bound
  // (OversizedRequestsAreNamedCountedAndChangeNothing has the rest).
  ExpectError([&] { return SendAppend(model_.MakeAppend(4, 700)); },
              grpc::StatusCode::RESOURCE_EXHAUSTED, "more than --max-message-bytes = 2097152");
  ExpectError([&] { return rpc_.Release(4); }, grpc::StatusCode::NOT_FOUND, "sequence_id = 4");
  ExpectOthersStillVerify();
}

// Bytes that do not parse as the method's request: INVALID_ARGUMENT naming the message type (gRPC
// said UNIMPLEMENTED with no message, INTERNAL for Verify), counted in verifyd_rpc_requests_total
// like every other rejection, and nothing changes.
TEST_F(BadInputTest, MalformedRequestsAreNamedAndCounted) {
  grpc::GenericStub generic(server_.channel());
  const v1::StatsResponse before = rpc_.Stats();
  // A field 1 varint whose value never ends: no protobuf parser accepts it.
  const std::string garbage = "\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff";
  for (const char* method : {"Append", "Verify", "Commit", "Release", "Stats"}) {
    SCOPED_TRACE(method);
    grpc::ClientContext context;
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), reply;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, absl::StrCat("/verifyd.v1.Verifyd/", method), grpc::StubOptions(),
                      &request, &reply, [&](grpc::Status s) { done.set_value(s); });
    const grpc::Status status = done.get_future().get();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("is not a valid verifyd.v1.", method, "Request message")));
  }
  const std::string text =
      prometheus::TextSerializer().Serialize(server_.server().metrics().registry()->Collect());
  for (const char* method : {"Append", "Verify", "Commit", "Release", "Stats"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("verifyd_rpc_requests_total{code=\"INVALID_ARGUMENT\","
                                             "method=\"",
                                             method, "\"} 1")))
        << method;
  }
  const v1::StatsResponse after = rpc_.Stats();
  EXPECT_EQ(after.used_tokens(), before.used_tokens());
  ExpectOthersStillVerify();
}

// A request of exactly `bytes` on the wire: `message` with an unknown field (number 9999) that
// fills the rest. Every handler sees it whole (unknown fields are kept and counted).
std::string PaddedTo(google::protobuf::Message& message, size_t bytes) {
  google::protobuf::UnknownFieldSet* unknown =
      message.GetReflection()->MutableUnknownFields(&message);
  unknown->Clear();
  const size_t base = message.ByteSizeLong();
  // The field's tag and length prefix take a few bytes: grow the payload until it fits exactly.
  for (size_t n = bytes > base + 16 ? bytes - base - 16 : 0;; ++n) {
    unknown->Clear();
    unknown->AddLengthDelimited(9999, std::string(n, 'p'));
    if (message.ByteSizeLong() >= bytes) break;
  }
  EXPECT_EQ(message.ByteSizeLong(), bytes);
  return message.SerializeAsString();
}

grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), reply;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&context, absl::StrCat("/verifyd.v1.Verifyd/", method), grpc::StubOptions(),
                    &request, &reply, [&](grpc::Status s) { done.set_value(s); });
  return done.get_future().get();
}

// Issue 17 defect 7b: a request just above --max-message-bytes was refused by gRPC core before
// any code of ours ran, so verifyd_rpc_requests_total never saw it. Now gRPC's own limit is twice
// ours (ReceiveCeiling) and each handler refuses: RESOURCE_EXHAUSTED naming the flag and the
// size, counted under its method, nothing changed. A request of exactly the bound still runs.
TEST_F(BadInputTest, OversizedRequestsAreNamedCountedAndChangeNothing) {
  const v1::StatsResponse before = rpc_.Stats();
  const size_t limit = static_cast<size_t>(options_.max_message_bytes);
  const auto parents1 = model_.sequences().at(1).parents;
  v1::AppendRequest append = model_.MakeAppend(6, 4);
  v1::VerifyRequest verify = model_.MakeVerify(0, {VerifyPart{1, parents1, std::nullopt}}, false);
  v1::CommitRequest commit;
  commit.set_sequence_id(1);
  commit.mutable_commit()->set_commit_length(1);
  commit.mutable_commit()->add_accepted_path(0);
  v1::ReleaseRequest release;
  release.set_sequence_id(2);
  v1::ForkRequest fork;
  fork.set_source_sequence_id(1);
  fork.set_new_sequence_id(7);
  fork.set_length(1);
  v1::CompactRequest compact;
  v1::GetCompactionRequest get_compaction;
  get_compaction.set_operation_id("compact-x-1");
  v1::StatsRequest stats;
  v1::CreateSharedMemoryRequest create;
  create.set_bytes(4096);
  v1::ListSequencesRequest list;
  const std::vector<std::pair<const char*, google::protobuf::Message*>> requests = {
      {"Append", &append},
      {"Verify", &verify},
      {"Commit", &commit},
      {"Release", &release},
      {"Fork", &fork},
      {"Compact", &compact},
      {"GetCompaction", &get_compaction},
      {"Stats", &stats},
      {"CreateSharedMemory", &create},
      {"ListSequences", &list}};
  for (const auto& [method, request] : requests) {
    SCOPED_TRACE(method);
    const grpc::Status status = RawCall(server_.channel(), method, PaddedTo(*request, limit + 1));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat(method, ": the request has ", limit + 1,
                                       " bytes, more than --max-message-bytes = ", limit)));
  }
  const std::string text =
      prometheus::TextSerializer().Serialize(server_.server().metrics().registry()->Collect());
  for (const auto& [method, request] : requests) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat(
                          "verifyd_rpc_requests_total{code=\"RESOURCE_EXHAUSTED\",method=\"",
                          method, "\"} 1")))
        << method;
  }
  // Nothing changed: no sequence 6 or 7, 1's tree still pending, 2 still live, no region, no
  // compaction started.
  const v1::StatsResponse after = rpc_.Stats();
  EXPECT_EQ(after.used_tokens(), before.used_tokens());
  EXPECT_EQ(after.pending_tokens(), before.pending_tokens());
  EXPECT_EQ(after.fragmentation().sequences(), before.fragmentation().sequences());
  EXPECT_EQ(server_.server().shared_memory().regions(), 0);
  // Exactly the bound is served (Stats), and gRPC's ceiling is twice the bound: above it gRPC
  // core answers alone (RESOURCE_EXHAUSTED, its own message, uncounted: the residual).
  EXPECT_TRUE(RawCall(server_.channel(), "Stats", PaddedTo(stats, limit)).ok());
  const grpc::Status beyond = RawCall(server_.channel(), "Stats", PaddedTo(stats, 2 * limit + 1));
  EXPECT_EQ(beyond.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << beyond.error_message();
  ExpectOthersStillVerify();
}

// Over TCP (a non-owner transport) every call that changes state or moves tensors needs the
// admin token, with a message naming the method and the metadata key, and changes nothing
// without it; reads answer without one; the Unix socket needs none.
TEST_F(BadInputTest, TcpGatesEveryStateChangingCall) {
  auto tcp = v1::Verifyd::NewStub(testing::MakeChannel(server_.server().tcp_address()));
  const v1::StatsResponse before = rpc_.Stats();
  const auto parents1 = model_.sequences().at(1).parents;
  // The gate answers before validation: what each request holds does not matter to it.
  struct Gated {
    const char* method;
    std::function<grpc::Status(v1::Verifyd::Stub&, const char*)> call;
  };
  auto with = [](const char* token, grpc::ClientContext* context) {
    if (token != nullptr) context->AddMetadata(kAdminTokenMetadata, token);
  };
  const v1::AppendRequest append = model_.MakeAppend(5, 3);
  const v1::VerifyRequest verify =
      model_.MakeVerify(0, {VerifyPart{1, parents1, std::nullopt}}, false);
  std::vector<Gated> gated = {
      {"Append",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::AppendResponse r;
         return stub.Append(&c, append, &r);
       }},
      {"Verify",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::VerifyResponse r;
         return stub.Verify(&c, verify, &r);
       }},
      {"Commit",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::CommitRequest q;
         q.set_sequence_id(1);
         v1::CommitResponse r;
         return stub.Commit(&c, q, &r);
       }},
      {"Release",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::ReleaseRequest q;
         q.set_sequence_id(2);
         v1::ReleaseResponse r;
         return stub.Release(&c, q, &r);
       }},
      {"Compact",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::CompactRequest q;
         q.set_budget_bytes(1 << 20);
         v1::CompactResponse r;
         return stub.Compact(&c, q, &r);
       }},
      {"CreateSharedMemory",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::CreateSharedMemoryRequest q;
         q.set_bytes(4096);
         v1::SharedMemoryRegion r;
         return stub.CreateSharedMemory(&c, q, &r);
       }},
      {"ReleaseSharedMemory",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::ReleaseSharedMemoryRequest q;
         q.set_region("none");
         v1::ReleaseSharedMemoryResponse r;
         return stub.ReleaseSharedMemory(&c, q, &r);
       }},
      // Read-only, but per-sequence traffic (service/verifyd_service.h says why it is gated).
      {"ListSequences",
       [&](v1::Verifyd::Stub& stub, const char* token) {
         grpc::ClientContext c;
         with(token, &c);
         v1::ListSequencesResponse r;
         return stub.ListSequences(&c, v1::ListSequencesRequest(), &r);
       }},
  };
  for (const Gated& g : gated) {
    SCOPED_TRACE(g.method);
    ExpectError([&] { return g.call(*tcp, nullptr); }, grpc::StatusCode::PERMISSION_DENIED,
                std::string(g.method) + " over TCP needs metadata \"x-verifyd-admin-token\"");
    ExpectError([&] { return g.call(*tcp, "s3cre"); }, grpc::StatusCode::PERMISSION_DENIED,
                "does not match the daemon's --admin-token-file");
  }
  EXPECT_EQ(server_.server().shared_memory().regions(), 0);
  const v1::StatsResponse after = rpc_.Stats();
  EXPECT_EQ(after.used_tokens(), before.used_tokens());
  EXPECT_EQ(after.fragmentation().sequences(), before.fragmentation().sequences());
  // Reads need no token.
  {
    grpc::ClientContext c;
    v1::StatsResponse stats;
    ASSERT_TRUE(tcp->Stats(&c, v1::StatsRequest(), &stats).ok());
    EXPECT_EQ(stats.used_tokens(), before.used_tokens());
  }
  // With the token the same calls run: an Append over TCP lands (a new sequence of 3 tokens).
  ASSERT_TRUE(gated[0].call(*tcp, "s3cret").ok());
  EXPECT_EQ(rpc_.Stats().used_tokens(), before.used_tokens() + 3u);
  EXPECT_TRUE(gated[4].call(*tcp, "s3cret").ok());
  EXPECT_TRUE(gated[4].call(server_.stub(), nullptr).ok()) << "the Unix socket needs no token";
  EXPECT_TRUE(gated.back().call(*tcp, "s3cret").ok()) << "ListSequences with the token";
  ExpectOthersStillVerify();
}

}  // namespace
}  // namespace verifyd
