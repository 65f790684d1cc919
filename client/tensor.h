// Tensor helpers: build and parse verifyd.v1.Tensor messages, and convert between float and bf16.
//
// The client keeps its own bf16 conversion (kernels/ is not part of the installed library); it uses
// the same rounding as the daemon and the GPU (round to nearest even, NaN stays NaN).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd::tensor {

static_assert(std::endian::native == std::endian::little,
              "verifyd tensors are little-endian on the wire; a big-endian host needs byte swaps");

float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);
std::vector<uint16_t> ToBf16(absl::Span<const float> values);
std::vector<float> ToFloat(absl::Span<const uint16_t> bits);

// Product of the dimensions; INVALID_ARGUMENT naming `field` for a negative dimension or overflow.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape, const std::string& field);

// A bf16 tensor with inline data; data.size() must equal the shape's product.
absl::StatusOr<v1::Tensor> MakeBf16(absl::Span<const int64_t> shape,
                                    absl::Span<const uint16_t> data);
absl::StatusOr<v1::Tensor> MakeBf16FromFloat(absl::Span<const int64_t> shape,
                                             absl::Span<const float> data);

// Checks dtype, shape (when expected_shape is not empty) and byte length, naming `field`, and
// copies the payload out (protobuf gives no alignment guarantee for the bytes).
absl::StatusOr<std::vector<uint16_t>> ParseBf16(const v1::Tensor& t, const std::string& field,
                                                absl::Span<const int64_t> expected_shape = {});
absl::StatusOr<std::vector<float>> ParseBf16AsFloat(const v1::Tensor& t, const std::string& field,
                                                    absl::Span<const int64_t> expected_shape = {});
absl::StatusOr<std::vector<float>> ParseFp32(const v1::Tensor& t, const std::string& field,
                                             absl::Span<const int64_t> expected_shape = {});

}  // namespace verifyd::tensor
