// Tensor helpers for shared memory: place a tensor in a region and make the Tensor that names it;
// read a response tensor whether it came inline or as a range of a region.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/shared_memory_region.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd::tensor {

// Copies `data` to `offset` of the region and returns the bf16 Tensor naming that range.
// INVALID_ARGUMENT when data.size() is not the shape's product, or the range is misaligned or
// outside the region.
absl::StatusOr<v1::Tensor> PlaceBf16(SharedMemoryRegion& region, uint64_t offset,
                                     absl::Span<const int64_t> shape,
                                     absl::Span<const uint16_t> data);

// A bf16 / fp32 Tensor in shared memory (dtype, shape, ref) without touching its bytes: the
// daemon fills an output range, or the caller wrote the input there already.
absl::StatusOr<v1::Tensor> SharedBf16(const SharedMemoryRegion& region, uint64_t offset,
                                      absl::Span<const int64_t> shape);

// Views of a tensor in `region`, checked like ParseBf16 (dtype, shape when given, byte length).
// The span points into the region: valid until the region is reused or released.
absl::StatusOr<absl::Span<const uint16_t>> ViewSharedBf16(
    const SharedMemoryRegion& region, const v1::Tensor& t, const std::string& field,
    absl::Span<const int64_t> expected_shape = {});
absl::StatusOr<absl::Span<const float>> ViewSharedFp32(
    const SharedMemoryRegion& region, const v1::Tensor& t, const std::string& field,
    absl::Span<const int64_t> expected_shape = {});

// Inline or shared (then `region` must be the one it names; null refuses shared tensors): a copy.
absl::StatusOr<std::vector<uint16_t>> ReadBf16(const v1::Tensor& t,
                                               const SharedMemoryRegion* region,
                                               const std::string& field,
                                               absl::Span<const int64_t> expected_shape = {});
absl::StatusOr<std::vector<float>> ReadFp32(const v1::Tensor& t, const SharedMemoryRegion* region,
                                            const std::string& field,
                                            absl::Span<const int64_t> expected_shape = {});

}  // namespace verifyd::tensor
