#include "client/shared_tensor.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tensor.h"

namespace verifyd::tensor {
namespace {

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<v1::Tensor> SharedTensor(const SharedMemoryRegion& region, uint64_t offset,
                                        absl::Span<const int64_t> shape, v1::DType dtype,
                                        int64_t element_bytes) {
  auto elements = NumElements(shape, "shape");
  if (!elements.ok()) return elements.status();
  auto ref = region.Ref(offset, static_cast<uint64_t>(*elements * element_bytes));
  if (!ref.ok()) return ref.status();
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  *t.mutable_shared_memory() = *std::move(ref);
  return t;
}

// dtype, shared-memory form, shape and byte length; the bytes in the region.
absl::StatusOr<absl::Span<const uint8_t>> CheckShared(const SharedMemoryRegion& region,
                                                      const v1::Tensor& t, const std::string& field,
                                                      v1::DType dtype, int64_t element_bytes,
                                                      absl::Span<const int64_t> expected) {
  if (t.dtype() != dtype) {
    return Invalid(field, ".dtype = ", v1::DType_Name(t.dtype()), " must be ",
                   v1::DType_Name(dtype));
  }
  if (t.data_case() != v1::Tensor::kSharedMemory) {
    return Invalid(field, " must carry shared_memory");
  }
  absl::Span<const int64_t> shape(t.shape().data(), t.shape_size());
  if (!expected.empty() && shape != expected) {
    return Invalid(field, ".shape = ", ShapeString(shape), " must equal ", ShapeString(expected));
  }
  auto elements = NumElements(shape, field + ".shape");
  if (!elements.ok()) return elements.status();
  const uint64_t want = static_cast<uint64_t>(*elements * element_bytes);
  if (t.shared_memory().length() != want) {
    return Invalid(field, ".shared_memory.length = ", t.shared_memory().length(), " must be ", want,
                   " (shape ", ShapeString(shape), " x ", element_bytes, " bytes)");
  }
  return region.View(t.shared_memory(), field + ".shared_memory");
}

}  // namespace

absl::StatusOr<v1::Tensor> PlaceBf16(SharedMemoryRegion& region, uint64_t offset,
                                     absl::Span<const int64_t> shape,
                                     absl::Span<const uint16_t> data) {
  auto t = SharedBf16(region, offset, shape);
  if (!t.ok()) return t.status();
  if (data.size() * sizeof(uint16_t) != t->shared_memory().length()) {
    return Invalid("data has ", data.size(), " values, must equal the product of shape ",
                   ShapeString(shape), " = ", t->shared_memory().length() / 2);
  }
  std::memcpy(region.bytes().data() + offset, data.data(), data.size() * sizeof(uint16_t));
  return t;
}

absl::StatusOr<v1::Tensor> SharedBf16(const SharedMemoryRegion& region, uint64_t offset,
                                      absl::Span<const int64_t> shape) {
  return SharedTensor(region, offset, shape, v1::DTYPE_BF16, 2);
}

absl::StatusOr<absl::Span<const uint16_t>> ViewSharedBf16(const SharedMemoryRegion& region,
                                                          const v1::Tensor& t,
                                                          const std::string& field,
                                                          absl::Span<const int64_t> expected) {
  auto bytes = CheckShared(region, t, field, v1::DTYPE_BF16, 2, expected);
  if (!bytes.ok()) return bytes.status();
  // Offsets are multiples of 64 in a page-aligned mapping, so the cast is aligned.
  return absl::Span<const uint16_t>(reinterpret_cast<const uint16_t*>(bytes->data()),
                                    bytes->size() / 2);
}

absl::StatusOr<absl::Span<const float>> ViewSharedFp32(const SharedMemoryRegion& region,
                                                       const v1::Tensor& t,
                                                       const std::string& field,
                                                       absl::Span<const int64_t> expected) {
  auto bytes = CheckShared(region, t, field, v1::DTYPE_FP32, 4, expected);
  if (!bytes.ok()) return bytes.status();
  return absl::Span<const float>(reinterpret_cast<const float*>(bytes->data()), bytes->size() / 4);
}

absl::StatusOr<std::vector<uint16_t>> ReadBf16(const v1::Tensor& t,
                                               const SharedMemoryRegion* region,
                                               const std::string& field,
                                               absl::Span<const int64_t> expected) {
  if (t.data_case() != v1::Tensor::kSharedMemory) return ParseBf16(t, field, expected);
  if (region == nullptr) return Invalid(field, " is in shared memory but no region was given");
  auto view = ViewSharedBf16(*region, t, field, expected);
  if (!view.ok()) return view.status();
  return std::vector<uint16_t>(view->begin(), view->end());
}

absl::StatusOr<std::vector<float>> ReadFp32(const v1::Tensor& t, const SharedMemoryRegion* region,
                                            const std::string& field,
                                            absl::Span<const int64_t> expected) {
  if (t.data_case() != v1::Tensor::kSharedMemory) return ParseFp32(t, field, expected);
  if (region == nullptr) return Invalid(field, " is in shared memory but no region was given");
  auto view = ViewSharedFp32(*region, t, field, expected);
  if (!view.ok()) return view.status();
  return std::vector<float>(view->begin(), view->end());
}

}  // namespace verifyd::tensor
