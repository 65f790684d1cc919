// Writes request_fuzz's seed corpus: for every RPC a valid request and a few near-valid ones
// (a NaN, a wrong shape, an expected position), each as <rpc byte><serialized message>. Values are
// random (a fixed seed, so the committed corpus is reproducible), never all zeros.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "verifyd/v1/verifyd.pb.h"

namespace {

namespace v1 = verifyd::v1;
std::mt19937 rng(20261201);

void Bf16(v1::Tensor* t, std::initializer_list<int64_t> shape, uint16_t poison = 0,
          int64_t poison_at = -1) {
  t->set_dtype(v1::DTYPE_BF16);
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  std::string bytes(static_cast<size_t>(n) * 2, '\0');
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  for (int64_t i = 0; i < n; ++i) {
    float f = dist(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t b = static_cast<uint16_t>(u >> 16);
    if (i == poison_at) b = poison;
    std::memcpy(&bytes[i * 2], &b, 2);
  }
  t->set_inline_data(bytes);
}

void Write(const std::string& dir, const std::string& name, uint8_t rpc,
           const google::protobuf::Message& m) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(rpc));
  out << m.SerializeAsString();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  // Limits of request_fuzz: 3 layers, 2 heads, 16 tree nodes.
  v1::AppendRequest append;
  append.set_sequence_id(7);
  append.set_layer_begin(1);
  Bf16(append.mutable_kv(), {2, 3, 576});
  Write(dir, "append_valid", 0, append);
  append.set_create(true);
  Write(dir, "append_create", 0, append);
  append.set_expected_fill(12);
  Write(dir, "append_fill", 0, append);
  Bf16(append.mutable_kv(), {1, 2, 576}, 0x7fc0, 700);
  Write(dir, "append_nan", 0, append);
  append.mutable_kv()->set_shape(2, 512);
  Write(dir, "append_bad_shape", 0, append);

  v1::VerifyRequest verify;
  verify.set_layer(2);
  verify.set_return_lse(true);
  auto* s0 = verify.add_sequences();
  s0->set_sequence_id(1);
  for (int p : {-1, 0, 0, 1}) s0->add_parents(p);
  auto* s1 = verify.add_sequences();
  s1->set_sequence_id(2);
  for (int p : {-1, 0}) s1->add_parents(p);
  s1->mutable_commit_previous()->set_commit_length(2);
  s1->mutable_commit_previous()->add_accepted_path(0);
  s1->mutable_commit_previous()->add_accepted_path(1);
  Bf16(verify.mutable_q(), {6, 2, 576});
  Bf16(verify.mutable_tree_kv(), {6, 576});
  Write(dir, "verify_valid", 1, verify);
  verify.set_softmax_scale(0.1f);
  Write(dir, "verify_scale", 1, verify);
  Bf16(verify.mutable_tree_kv(), {6, 576}, 0x7f80, 3000);
  Write(dir, "verify_inf_tree_kv", 1, verify);
  Bf16(verify.mutable_tree_kv(), {6, 576});
  Bf16(verify.mutable_q(), {6, 2, 576}, 0x4781, 5000);
  Write(dir, "verify_big_q", 1, verify);
  s0->set_parents(2, 3);
  Write(dir, "verify_bad_parents", 1, verify);

  v1::CommitRequest commit;
  commit.set_sequence_id(3);
  commit.mutable_commit()->set_commit_length(3);
  for (int n : {0, 1, 3}) commit.mutable_commit()->add_accepted_path(n);
  Write(dir, "commit_valid", 2, commit);
  commit.mutable_commit()->set_commit_length(2);
  Write(dir, "commit_length_mismatch", 2, commit);
  v1::ReleaseRequest release;
  release.set_sequence_id(99);
  Write(dir, "release", 3, release);
  v1::CompactRequest compact;
  compact.set_budget_bytes(1 << 20);
  Write(dir, "compact", 4, compact);
  v1::GetCompactionRequest get;
  get.set_operation_id("compact-1");
  Write(dir, "get_compaction", 5, get);
  v1::ListSequencesRequest list;
  list.set_after_sequence_id(5);
  list.set_limit(3);
  Write(dir, "list_sequences", 6, list);
  return 0;
}
