// Every field of every request, at least one invalid value each: the code and a message naming
// the field and its bound. Pure validation: no server, no store.
#include "service/request_validation.h"

#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/message_size.h"
#include "service/service_options.h"
#include "tests/service/shadow_model.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::ShadowModel;
using testing::VerifyPart;

constexpr int kLayers = 3;
constexpr int kHeads = 4;
constexpr int kMaxNodes = 16;

ValidationLimits Limits() {
  return ValidationLimits{kLayers, kHeads, kMaxNodes, 0.125f, int64_t{1} << 20};
}

template <typename Request>
struct Case {
  std::string name;
  std::function<void(Request&)> mutate;
  absl::StatusCode code;
  std::string message;  // a substring naming the field and the bound
};

class ValidationTest : public ::testing::Test {
 protected:
  ShadowModel model_{kLayers, kHeads, 0.125f, 7};

  v1::VerifyRequest ValidVerify() {
    return model_.MakeVerify(1,
                             {VerifyPart{11, {-1, 0, 0, 1}, std::vector<int32_t>{0, 2}},
                              VerifyPart{12, {-1, 0, 1}, std::nullopt}},
                             true);
  }
  v1::AppendRequest ValidAppend() { return model_.MakeAppend(5, 3, 1, 2); }
};

template <typename Request, typename Validate>
void RunCases(const Request& valid, const std::vector<Case<Request>>& cases, Validate validate) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Request request = valid;
    c.mutate(request);
    auto result = validate(request);
    ASSERT_FALSE(result.ok()) << "accepted";
    EXPECT_EQ(result.status().code(), c.code) << result.status();
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(c.message));
  }
}

TEST_F(ValidationTest, ValidVerifyDecodes) {
  const v1::VerifyRequest request = ValidVerify();
  absl::StatusOr<VerifyCall> call = ValidateVerify(request, Limits());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->layer, 1);
  EXPECT_EQ(call->total_q, 7);
  EXPECT_EQ(call->num_heads, kHeads);
  EXPECT_EQ(call->qo_indptr, (std::vector<int32_t>{0, 4, 7}));
  ASSERT_EQ(call->items.size(), 2u);
  EXPECT_EQ(call->items[0].sequence, 11u);
  EXPECT_EQ(call->items[0].parents, (std::vector<int32_t>{-1, 0, 0, 1}));
  ASSERT_TRUE(call->items[0].commit.has_value());
  EXPECT_EQ(call->items[0].commit->accepted_path, (std::vector<int32_t>{0, 2}));
  EXPECT_FALSE(call->items[1].commit.has_value());
  EXPECT_TRUE(call->return_lse);
  EXPECT_FLOAT_EQ(call->scale, 0.125f);
  EXPECT_EQ(reinterpret_cast<const char*>(call->q), request.q().inline_data().data());
  EXPECT_EQ(reinterpret_cast<const char*>(call->tree_kv), request.tree_kv().inline_data().data());

  v1::VerifyRequest scaled = request;
  scaled.set_softmax_scale(0.5f);
  call = ValidateVerify(scaled, Limits());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_FLOAT_EQ(call->scale, 0.5f);
}

TEST_F(ValidationTest, EveryVerifyFieldRejected) {
  using R = v1::VerifyRequest;
  const auto inv = absl::StatusCode::kInvalidArgument;
  std::vector<Case<R>> cases = {
      {"layer", [](R& r) { r.set_layer(kLayers); }, inv, "layer = 3 must be < --layers = 3"},
      {"no sequences", [](R& r) { r.clear_sequences(); }, inv, "sequences must not be empty"},
      {"empty parents", [](R& r) { r.mutable_sequences(1)->clear_parents(); }, inv,
       "sequences[1].parents has 0 nodes, must be in [1, --max-tree-nodes = 16]"},
      {"too many nodes",
       [](R& r) {
         for (int i = 0; i < kMaxNodes; ++i) r.mutable_sequences(1)->add_parents(-1);
       },
       inv, "sequences[1].parents has 19 nodes, must be in [1, --max-tree-nodes = 16]"},
      {"parent not before", [](R& r) { r.mutable_sequences(1)->set_parents(2, 5); }, inv,
       "sequences[1].parents[2] = 5 must be < 2"},
      {"parent self", [](R& r) { r.mutable_sequences(0)->set_parents(0, 0); }, inv,
       "sequences[0].parents[0] = 0 must be < 0"},
      {"parent below -1", [](R& r) { r.mutable_sequences(0)->set_parents(3, -2); }, inv,
       "sequences[0].parents[3] = -2 must be -1"},
      {"duplicate id", [](R& r) { r.mutable_sequences(1)->set_sequence_id(11); }, inv,
       "sequences[1].sequence_id = 11 repeats sequences[0]"},
      {"commit length",
       [](R& r) { r.mutable_sequences(0)->mutable_commit_previous()->set_commit_length(3); }, inv,
       "sequences[0].commit_previous.commit_length = 3 must equal the size of "
       "sequences[0].commit_previous.accepted_path = 2"},
      {"commit node negative",
       [](R& r) { r.mutable_sequences(0)->mutable_commit_previous()->set_accepted_path(1, -1); },
       inv, "sequences[0].commit_previous.accepted_path[1] = -1 must be in [0, --max-tree-nodes"},
      {"commit node too big",
       [](R& r) {
         r.mutable_sequences(0)->mutable_commit_previous()->set_accepted_path(0, kMaxNodes);
       },
       inv,
       "sequences[0].commit_previous.accepted_path[0] = 16 must be in [0, --max-tree-nodes = 16)"},
      {"q missing", [](R& r) { r.clear_q(); }, inv, "q is missing"},
      {"q dtype", [](R& r) { r.mutable_q()->set_dtype(v1::DTYPE_FP32); }, inv,
       "q.dtype = DTYPE_FP32 must be DTYPE_BF16"},
      {"q unspecified dtype", [](R& r) { r.mutable_q()->set_dtype(v1::DTYPE_UNSPECIFIED); }, inv,
       "q.dtype = DTYPE_UNSPECIFIED"},
      // A value this build does not know (proto3 keeps it): named by its number, not "".
      {"q unknown dtype", [](R& r) { r.mutable_q()->set_dtype(static_cast<v1::DType>(77)); }, inv,
       "q.dtype = 77 (unknown) must be DTYPE_BF16"},
      {"q rank", [](R& r) { r.mutable_q()->add_shape(1); }, inv, "q.shape has 4 dims, must have 3"},
      {"q rows", [](R& r) { r.mutable_q()->set_shape(0, 6); }, inv,
       "q.shape[0] = 6 must equal the total number of parents over sequences = 7"},
      {"q heads", [](R& r) { r.mutable_q()->set_shape(1, 8); }, inv,
       "q.shape[1] = 8 must equal --heads = 4"},
      {"q width", [](R& r) { r.mutable_q()->set_shape(2, 512); }, inv,
       "q.shape[2] = 512 must equal the KV row width = 576"},
      {"q bytes", [](R& r) { r.mutable_q()->mutable_inline_data()->pop_back(); }, inv,
       "q.inline_data has 32255 bytes, must be 32256"},
      {"q shared memory", [](R& r) { r.mutable_q()->mutable_shared_memory()->set_region("x"); },
       absl::StatusCode::kFailedPrecondition,
       "q.shared_memory: shared memory is not available here"},
      {"tree_kv missing", [](R& r) { r.clear_tree_kv(); }, inv, "tree_kv is missing"},
      {"tree_kv dtype", [](R& r) { r.mutable_tree_kv()->set_dtype(v1::DTYPE_FP32); }, inv,
       "tree_kv.dtype = DTYPE_FP32 must be DTYPE_BF16"},
      {"tree_kv rank", [](R& r) { r.mutable_tree_kv()->add_shape(1); }, inv,
       "tree_kv.shape has 3 dims, must have 2"},
      {"tree_kv rows", [](R& r) { r.mutable_tree_kv()->set_shape(0, 8); }, inv,
       "tree_kv.shape[0] = 8 must equal the total number of parents over sequences = 7"},
      {"tree_kv width", [](R& r) { r.mutable_tree_kv()->set_shape(1, 575); }, inv,
       "tree_kv.shape[1] = 575 must equal the KV row width = 576"},
      {"tree_kv bytes", [](R& r) { r.mutable_tree_kv()->mutable_inline_data()->append("ab"); }, inv,
       "tree_kv.inline_data has 8066 bytes, must be 8064"},
      {"tree_kv shared memory",
       [](R& r) { r.mutable_tree_kv()->mutable_shared_memory()->set_length(4); },
       absl::StatusCode::kFailedPrecondition, "tree_kv.shared_memory: shared memory"},
      {"scale zero", [](R& r) { r.set_softmax_scale(0.f); }, inv,
       "softmax_scale = 0 must be finite and > 0"},
      {"scale negative", [](R& r) { r.set_softmax_scale(-1.f); }, inv, "softmax_scale = -1"},
      {"scale nan", [](R& r) { r.set_softmax_scale(std::nanf("")); }, inv, "softmax_scale = nan"},
      {"scale inf", [](R& r) { r.set_softmax_scale(INFINITY); }, inv, "softmax_scale = inf"},
  };
  RunCases(ValidVerify(), cases, [](const R& r) { return ValidateVerify(r, Limits()); });
}

TEST_F(ValidationTest, VerifyResponseMustFitTheMessageLimit) {
  ValidationLimits limits = Limits();
  // out: 7 rows x 4 heads x 512 x 2 bytes = 28672, lse 112 more, plus framing.
  limits.max_message_bytes = 28672 + 1000;
  absl::StatusOr<VerifyCall> call = ValidateVerify(ValidVerify(), limits);
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(call.status().message()), HasSubstr("--max-message-bytes = 29672"));
  limits.max_message_bytes = 28672 + 112 + 4096 + 20;
  EXPECT_TRUE(ValidateVerify(ValidVerify(), limits).ok());
}

TEST_F(ValidationTest, ValidAppendDecodes) {
  const v1::AppendRequest request = ValidAppend();
  absl::StatusOr<AppendCall> call = ValidateAppend(request, Limits());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->sequence, 5u);
  EXPECT_EQ(call->layer_begin, 1);
  EXPECT_EQ(call->layer_count, 2);
  EXPECT_EQ(call->num_tokens, 3);
  EXPECT_EQ(reinterpret_cast<const char*>(call->kv), request.kv().inline_data().data());
}

TEST_F(ValidationTest, EveryAppendFieldRejected) {
  using R = v1::AppendRequest;
  const auto inv = absl::StatusCode::kInvalidArgument;
  std::vector<Case<R>> cases = {
      {"layer_begin", [](R& r) { r.set_layer_begin(3); }, inv,
       "layer_begin = 3 must be < --layers = 3"},
      {"kv missing", [](R& r) { r.clear_kv(); }, inv, "kv is missing"},
      {"kv dtype", [](R& r) { r.mutable_kv()->set_dtype(v1::DTYPE_FP32); }, inv,
       "kv.dtype = DTYPE_FP32 must be DTYPE_BF16"},
      {"kv rank", [](R& r) { r.mutable_kv()->mutable_shape()->RemoveLast(); }, inv,
       "kv.shape has 2 dims, must have 3 [layer_count, T, 576]"},
      {"layer_count past layers", [](R& r) { r.mutable_kv()->set_shape(0, 3); }, inv,
       "kv.shape[0] = 3 must be in [1, --layers - layer_begin = 2]"},
      {"layer_count zero", [](R& r) { r.mutable_kv()->set_shape(0, 0); }, inv,
       "kv.shape[0] = 0 must be in [1,"},
      {"no tokens", [](R& r) { r.mutable_kv()->set_shape(1, 0); }, inv,
       "kv.shape[1] = 0 must be in [1,"},
      {"width", [](R& r) { r.mutable_kv()->set_shape(2, 575); }, inv,
       "kv.shape[2] = 575 must equal the KV row width = 576"},
      {"bytes", [](R& r) { r.mutable_kv()->mutable_inline_data()->resize(6912 - 2); }, inv,
       "kv.inline_data has 6910 bytes, must be 6912"},
      {"shared memory", [](R& r) { r.mutable_kv()->mutable_shared_memory()->set_offset(8); },
       absl::StatusCode::kFailedPrecondition, "kv.shared_memory: shared memory"},
  };
  RunCases(ValidAppend(), cases, [](const R& r) { return ValidateAppend(r, Limits()); });
}

TEST_F(ValidationTest, CommitReleaseCompactFieldsRejected) {
  v1::CommitRequest commit;
  commit.set_sequence_id(3);
  commit.mutable_commit()->set_commit_length(2);
  commit.mutable_commit()->add_accepted_path(0);
  commit.mutable_commit()->add_accepted_path(4);
  absl::StatusOr<CommitCall> call = ValidateCommit(commit, Limits());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->sequence, 3u);
  EXPECT_EQ(call->path.accepted_path, (std::vector<int32_t>{0, 4}));

  using C = v1::CommitRequest;
  const auto inv = absl::StatusCode::kInvalidArgument;
  std::vector<Case<C>> cases = {
      {"missing", [](C& r) { r.clear_commit(); }, inv, "commit is missing"},
      {"length", [](C& r) { r.mutable_commit()->set_commit_length(1); }, inv,
       "commit.commit_length = 1 must equal the size of commit.accepted_path = 2"},
      {"node", [](C& r) { r.mutable_commit()->set_accepted_path(1, 99); }, inv,
       "commit.accepted_path[1] = 99 must be in [0, --max-tree-nodes = 16)"},
  };
  RunCases(commit, cases, [](const C& r) { return ValidateCommit(r, Limits()); });

  v1::ReleaseRequest release;
  release.set_sequence_id(9);
  ASSERT_TRUE(ValidateRelease(release).ok());
  EXPECT_EQ(ValidateRelease(release)->sequence, 9u);

  v1::CompactRequest compact;
  compact.set_budget_bytes(uint64_t{1} << 63);
  EXPECT_EQ(ValidateCompact(compact).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ValidateCompact(compact).status().message()),
              HasSubstr("budget_bytes = 9223372036854775808 must be <= int64 max"));
  compact.set_budget_bytes(4096);
  EXPECT_EQ(ValidateCompact(compact)->budget_bytes, 4096);

  v1::GetCompactionRequest get;
  EXPECT_THAT(std::string(ValidateGetCompaction(get).status().message()),
              HasSubstr("operation_id must not be empty"));
  get.set_operation_id(std::string(65, 'x'));
  EXPECT_THAT(std::string(ValidateGetCompaction(get).status().message()),
              HasSubstr("operation_id has 65 characters, must be <= 64"));
  get.set_operation_id("compact-1");
  EXPECT_EQ(ValidateGetCompaction(get)->operation_id, "compact-1");

  v1::ForkRequest fork;
  fork.set_source_sequence_id(4);
  fork.set_new_sequence_id(4);
  fork.set_length(10);
  EXPECT_THAT(std::string(ValidateFork(fork).status().message()),
              HasSubstr("new_sequence_id = 4 must differ from source_sequence_id"));
  fork.set_new_sequence_id(5);
  for (uint64_t length : {uint64_t{0}, uint64_t{1} << 31}) {
    fork.set_length(length);
    EXPECT_EQ(ValidateFork(fork).status().code(), absl::StatusCode::kInvalidArgument) << length;
    EXPECT_THAT(std::string(ValidateFork(fork).status().message()),
                HasSubstr(absl::StrCat("length = ", length, " must be in [1, 2147483647]")));
  }
  fork.set_length((uint64_t{1} << 31) - 1);
  ASSERT_TRUE(ValidateFork(fork).ok());
  EXPECT_EQ(ValidateFork(fork)->source, 4u);
  EXPECT_EQ(ValidateFork(fork)->fork, 5u);
  EXPECT_EQ(ValidateFork(fork)->length, (int64_t{1} << 31) - 1);
}

// ListSequences: 0 means 1000, every limit is lowered to what fits the message bound, and the
// cursor is passed on only when set (id 0 is a valid cursor).
TEST(ListSequencesValidationTest, LimitIsDefaultedAndCapped) {
  const ValidationLimits limits{.max_message_bytes = 64 << 10};
  EXPECT_EQ(MaxListedSequences(limits), 1023);
  v1::ListSequencesRequest request;
  auto call = ValidateListSequences(request, limits);
  ASSERT_TRUE(call.ok());
  EXPECT_EQ(call->limit, 1000);
  EXPECT_FALSE(call->after.has_value());
  request.set_limit(7);
  request.set_after_sequence_id(0);
  call = ValidateListSequences(request, limits);
  ASSERT_TRUE(call.ok());
  EXPECT_EQ(call->limit, 7);
  ASSERT_TRUE(call->after.has_value());
  EXPECT_EQ(*call->after, 0u);
  request.set_limit(UINT32_MAX);
  EXPECT_EQ(ValidateListSequences(request, limits)->limit, 1023);
}

// Issue 17 defect 7b: gRPC's limit sits above ours, so that the handlers see (and count) what
// lies between; the refusal names the method, the size and the flag.
TEST(MessageSizeTest, CeilingAndRefusal) {
  EXPECT_EQ(ReceiveCeiling(64 << 20), 128 << 20);
  EXPECT_EQ(ReceiveCeiling((int64_t{1} << 31) - 1), std::numeric_limits<int>::max());
  EXPECT_EQ(ReceiveCeiling(int64_t{3} << 29), std::numeric_limits<int>::max());
  EXPECT_TRUE(CheckRequestSize("Append", 1000, 1000).ok());
  const absl::Status over = CheckRequestSize("Append", 1001, 1000);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message().substr(0, 72),
            "Append: the request has 1001 bytes, more than --max-message-bytes = 1000");
}

TEST(ServiceOptionsTest, EveryFlagBounded) {
  EXPECT_TRUE(ValidateServiceOptions([] {
                ServiceOptions o;
                o.listen = DefaultListenAddress(0);
                return o;
              }())
                  .ok());
  struct FlagCase {
    std::function<void(ServiceOptions&)> mutate;
    std::string message;
  };
  const std::vector<FlagCase> cases = {
      {[](ServiceOptions& o) { o.listen = ""; }, "--listen must not be empty"},
      {[](ServiceOptions& o) { o.device = -1; }, "--device = -1 must be in [0, 1023]"},
      {[](ServiceOptions& o) { o.layers = 0; }, "--layers = 0 must be in [1, 4096]"},
      {[](ServiceOptions& o) { o.heads = 0; }, "--heads = 0 must be in [1, 1024]"},
      {[](ServiceOptions& o) { o.max_tree_nodes = 1025; },
       "--max-tree-nodes = 1025 must be in [1, 1024]"},
      {[](ServiceOptions& o) { o.kv_capacity_tokens = 0; }, "--kv-capacity-tokens = 0"},
      {[](ServiceOptions& o) { o.kv_memory_fraction = 0.96; },
       "--kv-memory-fraction = 0.96 must be in [0, 0.95]"},
      {[](ServiceOptions& o) { o.kv_memory_fraction = -0.5; },
       "--kv-memory-fraction = -0.5 must be in [0, 0.95]"},
      {[](ServiceOptions& o) { o.kv_memory_fraction = std::nan(""); },
       "--kv-memory-fraction = nan"},
      {[](ServiceOptions& o) { o.softmax_scale = -1; }, "--softmax-scale = -1 must be finite"},
      {[](ServiceOptions& o) { o.lease_seconds = 0; }, "--lease-seconds = 0 must be finite"},
      {[](ServiceOptions& o) { o.max_message_bytes = 1000; }, "--max-message-bytes = 1000"},
      {[](ServiceOptions& o) { o.compute_threads = -1; }, "--compute-threads = -1"},
      {[](ServiceOptions& o) { o.max_queued_requests = 0; }, "--max-queued-requests = 0"},
      {[](ServiceOptions& o) { o.max_sequences = 0; }, "--max-sequences = 0 must be in [1, "},
      {[](ServiceOptions& o) { o.max_slot_table_entries = -1; },
       "--max-slot-table-entries = -1 must be in [0, "},
      {[](ServiceOptions& o) { o.drain_seconds = 0; }, "--drain-seconds = 0"},
      {[](ServiceOptions& o) { o.shutdown_delay_seconds = -1; }, "--shutdown-delay-seconds = -1"},
      {[](ServiceOptions& o) { o.tcp = "10.1.2.3:5000"; },
       "--tcp = '10.1.2.3:5000' is not a loopback address"},
      {[](ServiceOptions& o) { o.tcp = "localhost"; }, "--tcp = 'localhost' must be host:port"},
      {[](ServiceOptions& o) { o.tcp = "127.0.0.1:70000"; }, "port must be in [0, 65535]"},
      {[](ServiceOptions& o) { o.metrics = "nope"; }, "--metrics = 'nope' must be host:port"},
      // Names that merely start like a loopback address resolve wherever their owner wants.
      {[](ServiceOptions& o) { o.tcp = "127.evil.example:5000"; }, "is not a loopback address"},
      {[](ServiceOptions& o) { o.tcp = "127.0.0.1.nip.io:5000"; }, "is not a loopback address"},
      {[](ServiceOptions& o) { o.health_listen = "nope"; },
       "--health-listen = 'nope' must be host:port"},
  };
  for (const auto& c : cases) {
    ServiceOptions o;
    o.listen = DefaultListenAddress(0);
    c.mutate(o);
    const absl::Status s = ValidateServiceOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
  ServiceOptions remote;
  remote.listen = DefaultListenAddress(1);
  remote.tcp = "10.1.2.3:5000";
  remote.allow_remote = true;
  EXPECT_TRUE(ValidateServiceOptions(remote).ok());
  remote.allow_remote = false;
  for (const char* loopback :
       {"[::1]:5000", "127.0.0.1:5000", "127.9.8.7:5000", "localhost:5000", "LOCALHOST:5000"}) {
    remote.tcp = loopback;
    EXPECT_TRUE(ValidateServiceOptions(remote).ok()) << loopback;
  }
  // The health listener may take any address: it serves health only.
  remote.tcp = "";
  remote.health_listen = "0.0.0.0:8081";
  EXPECT_TRUE(ValidateServiceOptions(remote).ok());
  EXPECT_EQ(DefaultListenAddress(3), "unix:///run/verifyd/verifyd-3.sock");
  EXPECT_FALSE(ParseBackendKind("tpu").ok());
  EXPECT_EQ(*ParseBackendKind("cpu"), BackendKind::kCpu);
}

}  // namespace
}  // namespace verifyd
