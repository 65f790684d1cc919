// The daemon's quantization as a filter, for python/tests/test_fp8.py's byte-for-byte check of the
// Python helper: bf16 rows [n][576] (little-endian) on stdin, written through an fp8
// HostKvStorage exactly as Append and Verify write them, read back as [n][656] bytes on stdout.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <numeric>
#include <vector>

#include "kvstore/kv_storage.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

int main() {
  using namespace verifyd;
  const std::vector<char> in((std::istreambuf_iterator<char>(std::cin)),
                             std::istreambuf_iterator<char>());
  if (in.size() % kKvRowBytes != 0) {
    std::fprintf(stderr, "fp8_quantize_tool: %zu bytes is not a whole number of bf16 rows\n",
                 in.size());
    return 2;
  }
  const int64_t rows = static_cast<int64_t>(in.size() / kKvRowBytes);
  std::vector<bf16_bits> bf16(static_cast<size_t>(rows) * kKvDim);
  std::copy(in.begin(), in.end(), reinterpret_cast<char*>(bf16.data()));
  HostKvStorage storage(1, rows, KvDtype::kFp8);
  std::vector<int32_t> slots(rows);
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<uint8_t> out(static_cast<size_t>(rows) * kFp8RowBytes);
  if (!storage.WriteRows(0, slots, bf16.data()).ok() ||
      !storage.ReadEncodedRows(0, slots, out.data()).ok()) {
    std::fprintf(stderr, "fp8_quantize_tool: the storage refused the rows\n");
    return 1;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
