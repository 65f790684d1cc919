// Shared-memory tensors through the daemon's socket (plans/0010), with the client library:
// results equal the inline path byte for byte, every rejected call changes nothing, regions go
// away on release, lease expiry and shutdown, limits name their bound, and the fake scheduler
// checks every output against its reference with --shared_memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>

#include "client/client.h"
#include "client/shared_tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "tools/fake_scheduler/scheduler.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::RpcDriver;
using testing::ShadowModel;
using testing::VerifyPart;

bool NameExists(const std::string& path) {
  const int fd = shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

std::vector<uint16_t> InlineBf16(const v1::Tensor& t) {
  std::vector<uint16_t> v(t.inline_data().size() / 2);
  std::memcpy(v.data(), t.inline_data().data(), t.inline_data().size());
  return v;
}

// The same request with q and tree_kv moved into `region` and out/lse asked there (layout of
// Client::VerifyShared, from offset `base`).
v1::VerifyRequest ToShared(const v1::VerifyRequest& inline_request, SharedMemoryRegion& region,
                           uint64_t base = 0) {
  v1::VerifyRequest r = inline_request;
  const int64_t total_q = r.q().shape(0), heads = r.q().shape(1);
  const uint64_t q_bytes = r.q().inline_data().size();
  const uint64_t kv_bytes = r.tree_kv().inline_data().size();
  const uint64_t kv_at = AlignSharedOffset(base + q_bytes);
  const uint64_t out_at = AlignSharedOffset(kv_at + kv_bytes);
  const uint64_t out_bytes = static_cast<uint64_t>(total_q * heads * kVDim * 2);
  const uint64_t lse_at = AlignSharedOffset(out_at + out_bytes);
  const std::vector<int64_t> q_shape(r.q().shape().begin(), r.q().shape().end());
  const std::vector<int64_t> kv_shape(r.tree_kv().shape().begin(), r.tree_kv().shape().end());
  *r.mutable_q() = *tensor::PlaceBf16(region, base, q_shape, InlineBf16(inline_request.q()));
  *r.mutable_tree_kv() =
      *tensor::PlaceBf16(region, kv_at, kv_shape, InlineBf16(inline_request.tree_kv()));
  *r.mutable_out_shared_memory() = *region.Ref(out_at, out_bytes);
  if (r.return_lse()) {
    *r.mutable_lse_shared_memory() =
        *region.Ref(lse_at, static_cast<uint64_t>(total_q * heads * 4));
  }
  return r;
}

// A response whose out/lse are in `region`, with those bytes copied inline (for ShadowModel).
v1::VerifyResponse Inlined(const v1::VerifyResponse& response, const SharedMemoryRegion& region) {
  v1::VerifyResponse r = response;
  auto out = tensor::ReadBf16(response.out(), &region, "out");
  EXPECT_TRUE(out.ok()) << out.status();
  if (out.ok()) {
    r.mutable_out()->set_inline_data(reinterpret_cast<const char*>(out->data()), out->size() * 2);
  }
  if (response.has_lse()) {
    auto lse = tensor::ReadFp32(response.lse(), &region, "lse");
    EXPECT_TRUE(lse.ok()) << lse.status();
    if (lse.ok()) {
      r.mutable_lse()->set_inline_data(reinterpret_cast<const char*>(lse->data()), lse->size() * 4);
    }
  }
  return r;
}

class SharedMemoryServerTest : public ::testing::Test {
 protected:
  explicit SharedMemoryServerTest(ServiceOptions options = testing::SmallOptions("shm"))
      : options_(std::move(options)),
        server_(options_),
        model_(options_.layers, options_.heads, options_.softmax_scale, 4242),
        rpc_(server_.stub(), model_) {}

  void SetUp() override {
    ASSERT_TRUE(server_.status().ok()) << server_.status();
    auto client = Client::FromChannel(server_.channel());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  grpc::Status SendVerify(const v1::VerifyRequest& request, v1::VerifyResponse* response) {
    grpc::ClientContext context;
    return server_.stub().Verify(&context, request, response);
  }
  grpc::Status SendAppend(const v1::AppendRequest& request) {
    grpc::ClientContext context;
    v1::AppendResponse response;
    return server_.stub().Append(&context, request, &response);
  }
  SharedMemoryRegistry& registry() { return server_.server().shared_memory(); }

  ServiceOptions options_;
  testing::TestServer server_;
  ShadowModel model_;
  RpcDriver rpc_;
  std::unique_ptr<Client> client_;
};

TEST_F(SharedMemoryServerTest, RoundTripsEqualTheInlinePathByteForByte) {
  auto region = client_->CreateSharedMemory(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(registry().regions(), 1);

  // Sequence 1 is appended inline, sequence 2 gets the same KV through shared memory (in two
  // Appends: layers [0, 2), then layer 2).
  const v1::AppendRequest append = model_.MakeAppend(1, 50);
  ASSERT_TRUE(rpc_.Append(append).ok());
  const std::vector<uint16_t> kv = InlineBf16(append.kv());
  const size_t per_layer = 50 * kKvDim;
  auto first =
      client_->AppendKvShared(2, 0, 2, 50, absl::MakeConstSpan(kv).subspan(0, 2 * per_layer),
                              AppendPosition::Create(), *region);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->committed_length(), 0u);
  auto second = client_->AppendKvShared(2, 2, 1, 50, absl::MakeConstSpan(kv).subspan(2 * per_layer),
                                        AppendPosition::Fill(0), *region);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->committed_length(), 50u);
  v1::AppendRequest twin = append;
  twin.set_sequence_id(2);
  model_.AcceptAppend(twin);

  for (int step = 0; step < 3; ++step) {
    std::optional<std::vector<int32_t>> commit;
    if (model_.has_tree(1)) commit = model_.RandomPath(model_.sequences().at(1).parents);
    const std::vector<int32_t> parents = model_.RandomParents(5 + 4 * step);
    for (int layer = 0; layer < options_.layers; ++layer) {
      SCOPED_TRACE(::testing::Message() << "step " << step << " layer " << layer);
      const bool lse = (step + layer) % 2 == 0;
      const v1::VerifyRequest one = model_.MakeVerify(
          layer, {VerifyPart{1, parents, layer == 0 ? commit : std::nullopt}}, lse);
      v1::VerifyRequest two = one;
      two.mutable_sequences(0)->set_sequence_id(2);
      v1::VerifyResponse inline_response, shared_response;
      ASSERT_TRUE(SendVerify(one, &inline_response).ok());
      if (layer == 1) {  // the client library's own shared-memory Verify
        v1::VerifyRequest bare = two;
        bare.clear_q();
        bare.clear_tree_kv();
        auto result =
            client_->VerifyShared(bare, InlineBf16(one.q()), InlineBf16(one.tree_kv()), *region);
        ASSERT_TRUE(result.ok()) << result.status();
        shared_response = result->response;
        EXPECT_EQ(result->out.size(), inline_response.out().inline_data().size() / 2);
        EXPECT_EQ(std::memcmp(result->out.data(), inline_response.out().inline_data().data(),
                              inline_response.out().inline_data().size()),
                  0);
        EXPECT_EQ(result->lse.size() * 4, inline_response.lse().inline_data().size());
      } else if (layer == 2) {  // the caller writes q and tree_kv in place itself
        const int64_t total_q = one.q().shape(0), heads = one.q().shape(1);
        const SharedVerifyLayout layout =
            SharedVerifyLayoutAt(4096 + 64 * step, total_q, heads, lse);
        std::memcpy(region->bytes().data() + layout.q, one.q().inline_data().data(),
                    one.q().inline_data().size());
        std::memcpy(region->bytes().data() + layout.tree_kv, one.tree_kv().inline_data().data(),
                    one.tree_kv().inline_data().size());
        v1::VerifyRequest bare = two;
        bare.clear_q();
        bare.clear_tree_kv();
        auto result = client_->VerifySharedInPlace(bare, layout, *region);
        ASSERT_TRUE(result.ok()) << result.status();
        shared_response = result->response;
        EXPECT_EQ(reinterpret_cast<const uint8_t*>(result->out.data()),
                  region->bytes().data() + layout.out);
        // A layout for another shape is refused before anything is sent.
        SharedVerifyLayout wrong = layout;
        wrong.total_q += 1;
        EXPECT_EQ(client_->VerifySharedInPlace(bare, wrong, *region).status().code(),
                  absl::StatusCode::kInvalidArgument);
      } else {
        ASSERT_TRUE(SendVerify(ToShared(two, *region, 128), &shared_response).ok());
      }
      ASSERT_EQ(shared_response.out().data_case(), v1::Tensor::kSharedMemory);
      EXPECT_TRUE(shared_response.out().inline_data().empty());
      EXPECT_THAT(shared_response.out().shape(),
                  ::testing::ElementsAreArray(inline_response.out().shape()));
      EXPECT_EQ(shared_response.out().dtype(), v1::DTYPE_BF16);
      EXPECT_EQ(shared_response.lse().data_case(),
                lse ? v1::Tensor::kSharedMemory : v1::Tensor::DATA_NOT_SET);
      const v1::VerifyResponse as_inline = Inlined(shared_response, *region);
      EXPECT_EQ(as_inline.out().inline_data(), inline_response.out().inline_data());
      EXPECT_EQ(as_inline.lse().inline_data(), inline_response.lse().inline_data());
      EXPECT_THAT(as_inline.committed_length(),
                  ::testing::ElementsAreArray(inline_response.committed_length()));
      model_.AcceptVerify(one);
      model_.AcceptVerify(two);
      EXPECT_EQ(model_.CheckVerify(one, inline_response), "");
      EXPECT_EQ(model_.CheckVerify(two, as_inline), "");
    }
  }
  EXPECT_TRUE(region->Release().ok());
  EXPECT_EQ(registry().regions(), 0);
}

TEST_F(SharedMemoryServerTest, RejectedCallsNameTheFieldAndChangeNothing) {
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 30)).ok());
  ASSERT_EQ(rpc_.Step({VerifyPart{1, model_.RandomParents(6), std::nullopt}}, true), "");
  auto region = client_->CreateSharedMemory(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  // Poison: a rejected call must not write its output range either.
  for (size_t i = 0; i < region->size(); ++i) region->bytes()[i] = static_cast<uint8_t>(i * 31);
  const std::vector<uint8_t> poisoned(region->bytes().begin(), region->bytes().end());

  const v1::StatsResponse before = rpc_.Stats();
  const std::vector<int32_t> parents = model_.RandomParents(7);
  const std::vector<int32_t> commit = model_.RandomPath(model_.sequences().at(1).parents);
  const v1::VerifyRequest valid_inline =
      model_.MakeVerify(0, {VerifyPart{1, parents, commit}}, true);
  const v1::VerifyRequest valid = ToShared(valid_inline, *region);
  // ToShared wrote q and tree_kv: those bytes are the new baseline.
  const std::vector<uint8_t> baseline(region->bytes().begin(), region->bytes().end());
  const uint64_t q_bytes = valid.q().shared_memory().length();
  struct Case {
    std::function<void(v1::VerifyRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::VerifyRequest& r) { r.mutable_q()->mutable_shared_memory()->set_region("nope"); },
       grpc::StatusCode::NOT_FOUND, "q.shared_memory.region = 'nope' is not a live"},
      {[](v1::VerifyRequest& r) { r.mutable_tree_kv()->mutable_shared_memory()->set_offset(8); },
       grpc::StatusCode::INVALID_ARGUMENT, "tree_kv.shared_memory.offset = 8 must be a multiple"},
      {[](v1::VerifyRequest& r) { r.mutable_q()->mutable_shared_memory()->set_length(100); },
       grpc::StatusCode::INVALID_ARGUMENT,
       absl::StrCat("q.shared_memory.length = 100 must equal ", q_bytes,
                    " (shape [7, 4, 576] bf16)")},
      {[&](v1::VerifyRequest& r) {
         r.mutable_out_shared_memory()->set_offset(region->size() - 64);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "out_shared_memory.offset = 1048512 + "},
      {[](v1::VerifyRequest& r) { r.mutable_out_shared_memory()->set_offset(0); },
       grpc::StatusCode::INVALID_ARGUMENT, "out_shared_memory [0, 28672) overlaps q.shared_memory"},
      {[](v1::VerifyRequest& r) {
         *r.mutable_lse_shared_memory() = r.out_shared_memory();
         r.mutable_lse_shared_memory()->set_length(112);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "overlaps lse_shared_memory"},
      {[](v1::VerifyRequest& r) { r.set_return_lse(false); }, grpc::StatusCode::INVALID_ARGUMENT,
       "lse_shared_memory is set but return_lse is false"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    v1::VerifyRequest request = valid;
    c.mutate(request);
    v1::VerifyResponse response;
    const grpc::Status status = SendVerify(request, &response);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  // Append: unknown region and a wrong length create no sequence.
  v1::AppendRequest append = model_.MakeAppend(9, 4);
  *append.mutable_kv()->mutable_shared_memory() = *region->Ref(0, 4 * 3 * kKvDim * 2 - 2);
  grpc::Status appended = SendAppend(append);
  EXPECT_EQ(appended.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      appended.error_message(),
      HasSubstr("kv.shared_memory.length = 13822 must equal 13824 (shape [3, 4, 576] bf16)"));
  append.mutable_kv()->mutable_shared_memory()->set_region("gone");
  EXPECT_EQ(SendAppend(append).error_code(), grpc::StatusCode::NOT_FOUND);

  const v1::StatsResponse after = rpc_.Stats();
  EXPECT_EQ(after.used_tokens(), before.used_tokens());
  EXPECT_EQ(after.pending_tokens(), before.pending_tokens());
  EXPECT_EQ(after.fragmentation().sequences(), 1u);
  EXPECT_TRUE(std::equal(baseline.begin(), baseline.end(), region->bytes().begin()))
      << "a rejected call wrote into the region";
  EXPECT_NE(baseline, poisoned);

  // The valid call (its commit included) still applies exactly once and matches the reference.
  v1::VerifyResponse response;
  ASSERT_TRUE(SendVerify(valid, &response).ok());
  model_.AcceptVerify(valid_inline);
  EXPECT_EQ(model_.CheckVerify(valid_inline, Inlined(response, *region)), "");
  EXPECT_EQ(static_cast<int64_t>(response.committed_length(0)), model_.committed_length(1));
}

TEST_F(SharedMemoryServerTest, ReleasedAndUnknownRegionsAreNotFound) {
  auto region = client_->CreateSharedMemory(4096);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string name = region->region();
  // The client's mapping and the daemon's are the same bytes.
  auto mapped = registry().Find(name, "test");
  ASSERT_TRUE(mapped.ok());
  region->bytes()[4095] = 0xa7;
  EXPECT_EQ((*mapped)->data()[4095], 0xa7);
  mapped->reset();

  SharedMemoryRegion moved = std::move(*region);
  EXPECT_FALSE(region->mapped());
  EXPECT_TRUE(moved.mapped());
  EXPECT_EQ(registry().regions(), 1);
  EXPECT_TRUE(moved.Release().ok());
  EXPECT_EQ(registry().regions(), 0);
  EXPECT_EQ(registry().total_bytes(), 0);
  auto again = client_->ReleaseSharedMemory(name);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.status().message(), HasSubstr(name));

  v1::AppendRequest append = model_.MakeAppend(3, 1);
  auto other = client_->CreateSharedMemory(8192);
  ASSERT_TRUE(other.ok());
  *append.mutable_kv()->mutable_shared_memory() = *other->Ref(0, 3 * kKvDim * 2);
  append.mutable_kv()->mutable_shared_memory()->set_region(name);
  const grpc::Status status = SendAppend(append);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("kv.shared_memory.region = '" + name + "'"));

  // A region object going out of scope releases it.
  { auto scoped = client_->CreateSharedMemory(4096); }
  EXPECT_EQ(registry().regions(), 1);  // `other` only
}

class SharedMemoryLimitsTest : public SharedMemoryServerTest {
 protected:
  static ServiceOptions Options() {
    ServiceOptions o = testing::SmallOptions("shmlimits");
    o.shm_max_bytes = 64 << 10;
    o.shm_max_region_bytes = 32 << 10;
    return o;
  }
  SharedMemoryLimitsTest() : SharedMemoryServerTest(Options()) {}
};

TEST_F(SharedMemoryLimitsTest, LimitsNameTheirBound) {
  auto big = client_->CreateSharedMemory((32 << 10) + 1);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("--shm-max-region-bytes = 32768"));
  auto a = client_->CreateSharedMemory(32 << 10);
  ASSERT_TRUE(a.ok()) << a.status();
  // One process holds at most half of --shm-max-bytes (65536; at least one largest region): the
  // other half stays for other clients (the registry test checks the total bound itself).
  auto b = client_->CreateSharedMemory(64);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("its share of 32768 bytes"));
  auto zero = client_->CreateSharedMemory(0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->Release().ok());
  EXPECT_TRUE(client_->CreateSharedMemory(64).ok());
}

class SharedMemoryDisabledTest : public SharedMemoryServerTest {
 protected:
  static ServiceOptions Options() {
    ServiceOptions o = testing::SmallOptions("shmoff");
    o.shm_max_bytes = 0;
    return o;
  }
  SharedMemoryDisabledTest() : SharedMemoryServerTest(Options()) {}
};

TEST_F(SharedMemoryDisabledTest, CreateIsAFailedPrecondition) {
  auto region = client_->CreateSharedMemory(4096);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(region.status().message(), HasSubstr("--shm-max-bytes = 0"));
  // Inline traffic is unaffected.
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 10)).ok());
  EXPECT_EQ(rpc_.Step({VerifyPart{1, model_.RandomParents(4), std::nullopt}}, true), "");
}

class SharedMemoryLeaseTest : public SharedMemoryServerTest {
 protected:
  static ServiceOptions Options() {
    ServiceOptions o = testing::SmallOptions("shmlease");
    o.lease_seconds = 1;
    return o;
  }
  SharedMemoryLeaseTest() : SharedMemoryServerTest(Options()) {}
};

TEST_F(SharedMemoryLeaseTest, AnUnusedRegionExpiresAndAUsedOneIsRenewed) {
  v1::SharedMemoryRegion used_info, idle_info;
  const absl::Time created = absl::Now();
  for (v1::SharedMemoryRegion* info : {&used_info, &idle_info}) {
    grpc::ClientContext context;
    v1::CreateSharedMemoryRequest request;
    request.set_bytes(8192);
    ASSERT_TRUE(server_.stub().CreateSharedMemory(&context, request, info).ok());
  }
  auto used = SharedMemoryRegion::Map(nullptr, used_info);
  ASSERT_TRUE(used.ok()) << used.status();
  const v1::AppendRequest rows = model_.MakeAppend(5, 1);
  const std::vector<uint16_t> kv = InlineBf16(rows.kv());
  // Every Append names the used region (and renews the sequence); the idle one expires meanwhile.
  // A bounded wait for the sweep, not a timing assertion on its speed.
  int appends = 0;
  for (; appends < 200 && NameExists(idle_info.path()); ++appends) {
    auto appended = client_->AppendKvShared(
        5, 0, options_.layers, 1, kv,
        appends == 0 ? AppendPosition::Create() : AppendPosition::Fill(appends), *used);
    ASSERT_TRUE(appended.ok()) << appended.status();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(NameExists(idle_info.path()));
  EXPECT_GE(absl::Now() - created, absl::Seconds(1)) << "expired before its lease passed";
  EXPECT_TRUE(NameExists(used_info.path()));
  auto renewed =
      client_->AppendKvShared(5, 0, options_.layers, 1, kv, AppendPosition::Fill(appends), *used);
  EXPECT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(client_->ReleaseSharedMemory(idle_info.region()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry().regions(), 1);
}

TEST(SharedMemoryShutdownTest, ShutdownUnlinksEveryRegion) {
  std::vector<std::string> paths;
  {
    testing::TestServer server(testing::SmallOptions("shmdown"));
    ASSERT_TRUE(server.status().ok());
    for (int i = 0; i < 3; ++i) {
      grpc::ClientContext context;
      v1::CreateSharedMemoryRequest request;
      request.set_bytes(4096 << i);
      v1::SharedMemoryRegion info;
      ASSERT_TRUE(server.stub().CreateSharedMemory(&context, request, &info).ok());
      EXPECT_EQ(info.bytes(), 4096u << i);
      paths.push_back(info.path());
      EXPECT_TRUE(NameExists(info.path()));
    }
  }
  for (const std::string& p : paths) EXPECT_FALSE(NameExists(p)) << p;
}

// The fake scheduler's decode loops with every tensor in shared memory, every output checked.
TEST(SharedMemorySchedulerTest, EveryOutputMatchesAndTheCheckerCanFail) {
  ServiceOptions options = testing::SmallOptions("shmsched");
  testing::TestServer server(options);
  ASSERT_TRUE(server.status().ok());
  sched::SchedulerConfig config;
  config.targets = {options.listen};
  config.sequences = 4;
  config.steps = 4;
  config.threads = 2;
  config.batch = 2;
  config.prefill_min = 16;
  config.prefill_max = 64;
  config.tree_min = 4;
  config.tree_max = 24;
  config.shared_memory = true;
  auto report = sched::RunScheduler(config);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->failures, ::testing::IsEmpty());
  EXPECT_EQ(report->verified_trees, 4 * 4 * options.layers);
  EXPECT_EQ(server.server().shared_memory().regions(), 0) << "the workers released their regions";

  config.corrupt_reference_at_step = 1;
  config.seed = 2;
  auto corrupted = sched::RunScheduler(config);
  ASSERT_TRUE(corrupted.ok());
  ASSERT_FALSE(corrupted->failures.empty());
  EXPECT_THAT(corrupted->failures[0], HasSubstr("MISMATCH"));
}

}  // namespace
}  // namespace verifyd
