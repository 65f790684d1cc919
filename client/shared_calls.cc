// Client calls whose tensors travel through a shared-memory region (plans/0010).
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/append_chunking.h"
#include "client/client.h"
#include "client/shared_tensor.h"

namespace verifyd {
namespace {

constexpr int64_t kRow = 576;  // the KV row / query width
constexpr int64_t kVDimension = 512;

absl::Status Prefixed(const char* method, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(method, ": ", status.message()));
}

}  // namespace

SharedVerifyLayout SharedVerifyLayoutAt(uint64_t base, int64_t total_q, int64_t heads,
                                        bool return_lse) {
  const uint64_t rows = static_cast<uint64_t>(total_q) * static_cast<uint64_t>(heads);
  SharedVerifyLayout l;
  l.total_q = total_q;
  l.heads = heads;
  l.return_lse = return_lse;
  l.q = AlignSharedOffset(base);
  l.tree_kv = AlignSharedOffset(l.q + rows * kRow * 2);
  l.out = AlignSharedOffset(l.tree_kv + static_cast<uint64_t>(total_q) * kRow * 2);
  l.lse = AlignSharedOffset(l.out + rows * kVDimension * 2);
  l.end = return_lse ? l.lse + rows * 4 : l.lse;
  return l;
}

uint64_t SharedVerifyBytes(int64_t total_q, int64_t heads, bool return_lse) {
  return SharedVerifyLayoutAt(0, total_q, heads, return_lse).end;
}

absl::StatusOr<v1::AppendResponse> Client::AppendKvShared(
    uint64_t sequence_id, uint32_t layer_begin, int64_t layer_count, int64_t tokens,
    absl::Span<const uint16_t> kv, AppendPosition at, SharedMemoryRegion& region,
    const CallOptions& call) {
  v1::AppendRequest request;
  request.set_sequence_id(sequence_id);
  request.set_layer_begin(layer_begin);
  SetExpectedPosition(at, &request);
  const int64_t shape[] = {layer_count, tokens, kRow};
  auto placed = tensor::PlaceBf16(region, 0, shape, kv);
  if (!placed.ok()) return Prefixed("Append: kv", placed.status());
  *request.mutable_kv() = *std::move(placed);
  return Append(request, call);
}

absl::StatusOr<SharedVerifyResult> Client::VerifyShared(v1::VerifyRequest request,
                                                        absl::Span<const uint16_t> q,
                                                        absl::Span<const uint16_t> tree_kv,
                                                        SharedMemoryRegion& region,
                                                        const CallOptions& call) {
  int64_t total_q = 0;
  for (const v1::VerifySequence& s : request.sequences()) total_q += s.parents_size();
  if (total_q < 1 || q.size() % static_cast<size_t>(total_q * kRow) != 0 || q.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Verify: q has ", q.size(), " values, must be a positive multiple of sum Q (",
                     total_q, ") x ", kRow));
  }
  const int64_t heads = static_cast<int64_t>(q.size()) / (total_q * kRow);
  const SharedVerifyLayout layout = SharedVerifyLayoutAt(0, total_q, heads, request.return_lse());
  if (layout.end > region.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Verify: sum Q = ", total_q, ", H = ", heads, " needs ", layout.end,
        " bytes of shared memory (SharedVerifyBytes), the region has ", region.size()));
  }
  const int64_t q_shape[] = {total_q, heads, kRow};
  const int64_t kv_shape[] = {total_q, kRow};
  auto q_tensor = tensor::PlaceBf16(region, layout.q, q_shape, q);
  if (!q_tensor.ok()) return Prefixed("Verify: q", q_tensor.status());
  auto kv_tensor = tensor::PlaceBf16(region, layout.tree_kv, kv_shape, tree_kv);
  if (!kv_tensor.ok()) return Prefixed("Verify: tree_kv", kv_tensor.status());
  return VerifySharedInPlace(std::move(request), layout, region, call);
}

absl::StatusOr<SharedVerifyResult> Client::VerifySharedInPlace(v1::VerifyRequest request,
                                                               const SharedVerifyLayout& layout,
                                                               SharedMemoryRegion& region,
                                                               const CallOptions& call) {
  int64_t total_q = 0;
  for (const v1::VerifySequence& s : request.sequences()) total_q += s.parents_size();
  if (total_q != layout.total_q || request.return_lse() != layout.return_lse || layout.heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Verify: the layout is for sum Q = ", layout.total_q, ", H = ", layout.heads,
                     ", return_lse = ", layout.return_lse, "; the request has sum Q = ", total_q,
                     ", return_lse = ", request.return_lse()));
  }
  if (layout.end > region.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Verify: the layout ends at byte ", layout.end,
                                                   ", past the region's ", region.size()));
  }
  const int64_t heads = layout.heads;
  const int64_t q_shape[] = {total_q, heads, kRow};
  const int64_t kv_shape[] = {total_q, kRow};
  auto q_tensor = tensor::SharedBf16(region, layout.q, q_shape);
  if (!q_tensor.ok()) return Prefixed("Verify: q", q_tensor.status());
  auto kv_tensor = tensor::SharedBf16(region, layout.tree_kv, kv_shape);
  if (!kv_tensor.ok()) return Prefixed("Verify: tree_kv", kv_tensor.status());
  *request.mutable_q() = *std::move(q_tensor);
  *request.mutable_tree_kv() = *std::move(kv_tensor);
  const uint64_t rows = static_cast<uint64_t>(total_q * heads);
  *request.mutable_out_shared_memory() = *region.Ref(layout.out, rows * kVDimension * 2);
  if (request.return_lse()) {
    *request.mutable_lse_shared_memory() = *region.Ref(layout.lse, rows * 4);
  } else {
    request.clear_lse_shared_memory();
  }

  SharedVerifyResult result;
  auto response = Verify(request, call);
  if (!response.ok()) return response.status();
  result.response = *std::move(response);
  const int64_t out_shape[] = {total_q, heads, kVDimension};
  auto out = tensor::ViewSharedBf16(region, result.response.out(), "out", out_shape);
  if (!out.ok()) return Prefixed("Verify", out.status());
  result.out = *out;
  if (request.return_lse()) {
    const int64_t lse_shape[] = {total_q, heads};
    auto lse = tensor::ViewSharedFp32(region, result.response.lse(), "lse", lse_shape);
    if (!lse.ok()) return Prefixed("Verify", lse.status());
    result.lse = *lse;
  }
  return result;
}

}  // namespace verifyd
