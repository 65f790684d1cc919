#include "tests/service/data_plane_support.h"

#include <cmath>
#include <cstring>

#include "gtest/gtest.h"
#include "verify/mla_dims.h"

namespace verifyd::testing {

uint64_t Align64(uint64_t x) { return (x + 63) / 64 * 64; }

Layout LayoutFor(int64_t total_q, int64_t heads) {
  Layout l;
  l.q = 0;
  l.tree_kv = Align64(l.q + total_q * heads * kKvDim * 2);
  l.out = Align64(l.tree_kv + total_q * kKvDim * 2);
  l.lse = Align64(l.out + total_q * heads * kVDim * 2);
  l.ready = Align64(l.lse + total_q * heads * 4);
  l.done = l.ready + 64;
  l.end = l.done + 64;
  return l;
}

int64_t TotalQ(const v1::VerifyRequest& r) {
  int64_t q = 0;
  for (const auto& s : r.sequences()) q += s.parents_size();
  return q;
}

Channel::VerifyDescriptor DescriptorFor(const v1::VerifyRequest& request, uint64_t region,
                                        const Scratch& scratch, uint32_t value, uint64_t id) {
  const int64_t tq = TotalQ(request);
  const int64_t heads = tq == 0 ? 0 : request.q().shape(1);
  const Layout l = LayoutFor(tq, heads);
  std::memcpy(scratch.data() + l.q, request.q().inline_data().data(),
              request.q().inline_data().size());
  std::memcpy(scratch.data() + l.tree_kv, request.tree_kv().inline_data().data(),
              request.tree_kv().inline_data().size());
  std::memset(scratch.data() + l.out, 0x11, l.ready - l.out);  // stale bytes, not NaN
  Channel::VerifyDescriptor d;
  d.id = id;
  d.layer = request.layer();
  for (const auto& s : request.sequences()) {
    Channel::Sequence seq;
    seq.sequence_id = s.sequence_id();
    seq.parents.assign(s.parents().begin(), s.parents().end());
    if (s.has_commit_previous()) {
      seq.commit_previous.emplace(s.commit_previous().accepted_path().begin(),
                                  s.commit_previous().accepted_path().end());
    }
    d.sequences.push_back(std::move(seq));
  }
  d.q = {region, l.q};
  d.tree_kv = {region, l.tree_kv};
  d.out = {region, l.out};
  d.return_lse = request.return_lse();
  if (d.return_lse) d.lse = {region, l.lse};
  if (request.has_softmax_scale()) d.softmax_scale = request.softmax_scale();
  d.ready = {region, l.ready, value};
  d.done = {region, l.done, value};
  return d;
}

v1::VerifyResponse ResponseFrom(const v1::VerifyRequest& request, const Scratch& scratch,
                                const ShadowModel& model) {
  const int64_t tq = TotalQ(request), heads = model.heads();
  const Layout l = LayoutFor(tq, heads);
  v1::VerifyResponse r;
  r.mutable_out()->set_dtype(v1::DTYPE_BF16);
  for (int64_t d : {tq, heads, int64_t{kVDim}}) r.mutable_out()->add_shape(d);
  r.mutable_out()->set_inline_data(scratch.data() + l.out, tq * heads * kVDim * 2);
  if (request.return_lse()) {
    r.mutable_lse()->set_dtype(v1::DTYPE_FP32);
    r.mutable_lse()->add_shape(tq);
    r.mutable_lse()->add_shape(heads);
    r.mutable_lse()->set_inline_data(scratch.data() + l.lse, tq * heads * 4);
  }
  for (const auto& s : request.sequences()) {
    r.add_committed_length(static_cast<uint64_t>(model.committed_length(s.sequence_id())));
  }
  return r;
}

bool OutputsAreNan(const Scratch& scratch, int64_t total_q, int64_t heads, bool lse) {
  const Layout l = LayoutFor(total_q, heads);
  const auto* out = reinterpret_cast<const uint16_t*>(scratch.data() + l.out);
  for (int64_t i = 0; i < total_q * heads * kVDim; ++i) {
    if ((out[i] & 0x7F80) != 0x7F80 || (out[i] & 0x7F) == 0) return false;
  }
  const auto* lse_values = reinterpret_cast<const float*>(scratch.data() + l.lse);
  for (int64_t i = 0; lse && i < total_q * heads; ++i) {
    if (!std::isnan(lse_values[i])) return false;
  }
  return true;
}

ServiceOptions OnCpu(ServiceOptions options) {
  options.backend = BackendKind::kCpu;
  return options;
}

Harness::Harness(ServiceOptions options)
    : server(OnCpu(std::move(options))), model(3, 4, 0.0625f, Seed()) {
  ClientOptions o;
  o.client_id = "scheduler-a";
  client = *Client::FromChannel(server.channel(), o);
}

uint32_t Harness::Seed() {
  static const uint32_t seed = std::random_device{}();
  return seed;
}

void Harness::AppendSequence(uint64_t id, int tokens) {
  const v1::AppendRequest r = model.MakeAppend(id, tokens);
  ASSERT_TRUE(client->Append(r).ok());
  model.AcceptAppend(r);
}

absl::Status RawStatus(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

Channel::Completion RunOnChannel(Channel& channel, const Channel::VerifyDescriptor& d,
                                 const Scratch& scratch) {
  if (d.ready.offset % 4 == 0) {
    scratch.word(d.ready.offset).store(d.ready.value, std::memory_order_release);
  }  // else: a misaligned flag the daemon refuses without reading it (a test of that refusal)
  EXPECT_TRUE(channel.EnqueueVerify(d).ok());
  absl::StatusOr<Channel::Completion> c = channel.WaitCompletion(absl::Seconds(30));
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id, d.id);
  return *c;
}

}  // namespace verifyd::testing
