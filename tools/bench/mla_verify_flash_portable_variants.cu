#include "tools/bench/mla_verify_flash_portable_variants.h"

#include "kernels/mla_verify_flash_portable.cuh"

namespace verifyd::bench {
namespace {

using flash_portable::PortableKernel;

struct Variant {
  const char* name;
  cudaError_t (*launch)(const MlaVerifyParams&, cudaStream_t);
};

constexpr Variant kVariants[] = {
    {"cols32-turns", &PortableKernel<32, true>::Launch},
    {"cols32-free", &PortableKernel<32, false>::Launch},
    {"cols32-free-noref",
     &PortableKernel<32, false, flash_portable::PortableProbe::kNoRefill>::Launch},
    {"cols32-free-pf",
     &PortableKernel<32, false, flash_portable::PortableProbe::kPrefetchL2>::Launch},
    {"cols32-turns-pf",
     &PortableKernel<32, true, flash_portable::PortableProbe::kPrefetchL2>::Launch},
};

}  // namespace

int PortableVariantCount() { return static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0])); }

const char* PortableVariantName(int variant) { return kVariants[variant].name; }

cudaError_t LaunchPortableVariant(int variant, const MlaVerifyParams& params, cudaStream_t stream) {
  return kVariants[variant].launch(params, stream);
}

}  // namespace verifyd::bench
