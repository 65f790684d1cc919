#include "client/tensor.h"

#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace verifyd::tensor {
namespace {

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// dtype, inline payload, shape and byte length; returns the number of elements.
absl::StatusOr<int64_t> CheckTensor(const v1::Tensor& t, const std::string& field, v1::DType dtype,
                                    int64_t element_bytes, absl::Span<const int64_t> expected) {
  if (t.dtype() != dtype) {
    return Invalid(field, ".dtype = ", v1::DType_Name(t.dtype()), " must be ",
                   v1::DType_Name(dtype));
  }
  if (t.data_case() != v1::Tensor::kInlineData) {
    return Invalid(field,
                   " must carry inline_data (shared memory is not supported by this client)");
  }
  absl::Span<const int64_t> shape(t.shape().data(), t.shape_size());
  if (!expected.empty() && shape != expected) {
    return Invalid(field, ".shape = ", ShapeString(shape), " must equal ", ShapeString(expected));
  }
  auto elements = NumElements(shape, field + ".shape");
  if (!elements.ok()) return elements.status();
  const int64_t want = *elements * element_bytes;
  if (static_cast<int64_t>(t.inline_data().size()) != want) {
    return Invalid(field, ".inline_data has ", t.inline_data().size(), " bytes, must be ", want,
                   " (shape ", ShapeString(shape), " x ", element_bytes, " bytes)");
  }
  return *elements;
}

}  // namespace

float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  return std::bit_cast<float>(u);
}

uint16_t FloatToBf16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

std::vector<uint16_t> ToBf16(absl::Span<const float> values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = FloatToBf16(values[i]);
  return out;
}

std::vector<float> ToFloat(absl::Span<const uint16_t> bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = Bf16ToFloat(bits[i]);
  return out;
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape, const std::string& field) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) return Invalid(field, "[", d, "] = ", shape[d], " must be >= 0");
    if (shape[d] != 0 && n > std::numeric_limits<int64_t>::max() / 8 / shape[d]) {
      return Invalid(field, " = ", ShapeString(shape), " has more than int64 max / 8 elements");
    }
    n *= shape[d];
  }
  return n;
}

absl::StatusOr<v1::Tensor> MakeBf16(absl::Span<const int64_t> shape,
                                    absl::Span<const uint16_t> data) {
  auto elements = NumElements(shape, "shape");
  if (!elements.ok()) return elements.status();
  if (static_cast<int64_t>(data.size()) != *elements) {
    return Invalid("data has ", data.size(), " values, must equal the product of shape ",
                   ShapeString(shape), " = ", *elements);
  }
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_BF16);
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(uint16_t));
  return t;
}

absl::StatusOr<v1::Tensor> MakeBf16FromFloat(absl::Span<const int64_t> shape,
                                             absl::Span<const float> data) {
  return MakeBf16(shape, ToBf16(data));
}

absl::StatusOr<std::vector<uint16_t>> ParseBf16(const v1::Tensor& t, const std::string& field,
                                                absl::Span<const int64_t> expected_shape) {
  auto elements = CheckTensor(t, field, v1::DTYPE_BF16, 2, expected_shape);
  if (!elements.ok()) return elements.status();
  std::vector<uint16_t> out(*elements);
  std::memcpy(out.data(), t.inline_data().data(), out.size() * sizeof(uint16_t));
  return out;
}

absl::StatusOr<std::vector<float>> ParseBf16AsFloat(const v1::Tensor& t, const std::string& field,
                                                    absl::Span<const int64_t> expected_shape) {
  auto bits = ParseBf16(t, field, expected_shape);
  if (!bits.ok()) return bits.status();
  return ToFloat(*bits);
}

absl::StatusOr<std::vector<float>> ParseFp32(const v1::Tensor& t, const std::string& field,
                                             absl::Span<const int64_t> expected_shape) {
  auto elements = CheckTensor(t, field, v1::DTYPE_FP32, 4, expected_shape);
  if (!elements.ok()) return elements.status();
  std::vector<float> out(*elements);
  std::memcpy(out.data(), t.inline_data().data(), out.size() * sizeof(float));
  return out;
}

}  // namespace verifyd::tensor
