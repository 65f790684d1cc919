// The KV pool's storage dtype (SPEC §1 "KV storage dtype"): a daemon setting, one per pool.
#pragma once

#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {

enum class KvDtype {
  kBf16,  // the 576 values as bf16: 1152 bytes per token and layer
  kFp8,   // DeepSeek's FP8 MLA layout (verify/kv_fp8_layout.h): 656 bytes per token and layer
};

// Bytes of one row (one token of one layer) in the pool.
inline constexpr int KvRowBytes(KvDtype dtype) {
  return dtype == KvDtype::kFp8 ? kFp8RowBytes : kKvRowBytes;
}

// The flag's spelling: "bf16" or "fp8".
inline constexpr const char* KvDtypeName(KvDtype dtype) {
  return dtype == KvDtype::kFp8 ? "fp8" : "bf16";
}

}  // namespace verifyd
