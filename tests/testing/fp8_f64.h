// An independent float64 statement of the fp8 row's rule (verify/kv_fp8_layout.h): what the
// product's quantizer, the float64 oracle's dequantizing load and the clients' helpers are checked
// against. It shares no code with the product: e4m3 values come from the format's definition, and
// rounding is a nearest search over every finite code (ties to the even code).
#pragma once

#include <cstdint>
#include <vector>

#include "verify/bf16.h"

namespace verifyd::test {

// The value of an e4m3 (e4m3fn) code; NaN for 0x7F and 0xFF.
double E4m3ValueF64(uint8_t code);
// The e4m3 code nearest x (finite), ties to the even code, saturating at +-448; -0 keeps its sign.
uint8_t NearestE4m3F64(double x);
// 576 bf16 values -> one 656-byte row: per group scale = float32(amax / 448) (1 when that is 0),
// each value NearestE4m3F64(float32(v / scale)), then the scales and the rope values' bytes.
std::vector<uint8_t> QuantizeFp8RowF64(const bf16_bits* row);
// One 656-byte row -> its 576 values, exactly (e4m3 value x scale in float64).
std::vector<double> DequantizeFp8RowF64(const uint8_t* row);
void DequantizeFp8RowF64(const uint8_t* row, double* out);  // out: [576]

}  // namespace verifyd::test
