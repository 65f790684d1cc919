// VERIFYD_SIMD_CLONES: a hot loop compiled twice, for AVX2 and for baseline x86-64, the loader
// picking one (GCC/Clang target_clones). Not under TSan: GCC instruments the ifunc resolver, which
// the loader runs before TSan's runtime is up, and the binary crashes at startup
// (plans/0016-integrity-and-test-infra.md).
#pragma once

#if defined(__x86_64__) && defined(__has_attribute) && !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define VERIFYD_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef VERIFYD_SIMD_CLONES
#define VERIFYD_SIMD_CLONES
#endif
