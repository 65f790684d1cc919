#include "client/append_chunking.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/tensor.h"

namespace verifyd {

void SetExpectedPosition(AppendPosition at, v1::AppendRequest* request) {
  if (at.create) {
    request->set_create(true);
  } else {
    request->set_expected_fill(at.fill);
  }
}

absl::StatusOr<std::vector<v1::AppendRequest>> SplitAppend(const v1::AppendRequest& request,
                                                           int64_t max_message_bytes) {
  if (static_cast<int64_t>(request.ByteSizeLong()) <= max_message_bytes) return {{request}};

  const v1::Tensor& kv = request.kv();
  if ((kv.dtype() != v1::DTYPE_BF16 && kv.dtype() != v1::DTYPE_FP8_MLA) || kv.shape_size() != 3 ||
      kv.data_case() != v1::Tensor::kInlineData) {
    return absl::InvalidArgumentError(
        "kv must be an inline DTYPE_BF16 or DTYPE_FP8_MLA tensor of shape [layer_count, T, row] "
        "to be split");
  }
  // The fp8 layout's last dimension counts bytes.
  const int64_t element_bytes = kv.dtype() == v1::DTYPE_FP8_MLA ? 1 : 2;
  const int64_t layers = kv.shape(0), tokens = kv.shape(1), row = kv.shape(2);
  auto elements = tensor::NumElements({layers, tokens, row}, "kv.shape");
  if (!elements.ok()) return elements.status();
  if (layers < 1 || tokens < 1 || row < 1 ||
      static_cast<int64_t>(kv.inline_data().size()) != *elements * element_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv.shape = [", layers, ", ", tokens, ", ", row, "] with ", kv.inline_data().size(),
        " bytes of inline_data cannot be split (need dims >= 1 and shape product x ", element_bytes,
        " bytes)"));
  }
  const int64_t token_bytes = layers * row * element_bytes;  // one token of every layer
  const int64_t per_chunk = (max_message_bytes - kAppendEnvelopeBytes) / token_bytes;
  if (per_chunk < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "one token of ", layers, " layers is ", token_bytes, " bytes; with ", kAppendEnvelopeBytes,
        " bytes of envelope it exceeds max_message_bytes = ", max_message_bytes));
  }

  const char* data = kv.inline_data().data();
  const int64_t layer_stride = tokens * row * element_bytes;
  std::vector<v1::AppendRequest> chunks;
  for (int64_t t0 = 0; t0 < tokens; t0 += per_chunk) {
    const int64_t t1 = std::min(tokens, t0 + per_chunk);
    v1::AppendRequest& chunk = chunks.emplace_back();
    chunk.set_sequence_id(request.sequence_id());
    chunk.set_layer_begin(request.layer_begin());
    const uint64_t before = static_cast<uint64_t>(t0);
    switch (request.expected_position_case()) {
      case v1::AppendRequest::kCreate:
        if (t0 == 0) {
          chunk.set_create(request.create());
        } else {
          chunk.set_expected_fill(before);
        }
        break;
      case v1::AppendRequest::kExpectedFill:
        chunk.set_expected_fill(request.expected_fill() + before);
        break;
      case v1::AppendRequest::EXPECTED_POSITION_NOT_SET:
        break;
    }
    v1::Tensor* out = chunk.mutable_kv();
    out->set_dtype(kv.dtype());
    out->add_shape(layers);
    out->add_shape(t1 - t0);
    out->add_shape(row);
    std::string* bytes = out->mutable_inline_data();
    bytes->reserve(layers * (t1 - t0) * row * element_bytes);
    for (int64_t l = 0; l < layers; ++l) {
      bytes->append(data + l * layer_stride + t0 * row * element_bytes,
                    (t1 - t0) * row * element_bytes);
    }
  }
  return chunks;
}

}  // namespace verifyd
