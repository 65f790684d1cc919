// The benchmark's variants of the portable flash kernel, other instantiations of the product's
// template (kernels/mla_verify_flash_portable.cuh) in a bench-only translation unit: the tile width
// (32 columns in 2 stages, or 16 in 4) and whether the two row groups take S in turns. The product
// library holds only the shipped one; plans/0026 records which won and by how much.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/mla_verify_params.h"

namespace verifyd::bench {

int PortableVariantCount();
const char* PortableVariantName(int variant);
// A planned launch (MakeMlaVerifyParams) of the variant's flash kernel alone; the combine is the
// product's (launch it after, as LaunchMlaVerify does).
cudaError_t LaunchPortableVariant(int variant, const MlaVerifyParams& params, cudaStream_t stream);

}  // namespace verifyd::bench
