// The CPU implementation of verify attention: the CPU backend's arithmetic and every test's oracle.
// bf16 inputs, fp32 accumulation, bf16 output, optional fp32 LSE. Multithreaded over query rows.
#pragma once

#include "absl/status/status.h"
#include "verify/verify_problem.h"

namespace verifyd {

// Largest num_heads a problem may have; it keeps every size computation far from int64 overflow.
inline constexpr int kMaxVerifyHeads = 1024;

// Checks the problem's indices without computing anything: num_heads, scale, indptr starts and
// per-sequence sizes (1 <= Q_b <= kMaxTreeNodes, L_b >= 0, L_b + Q_b slots, Q_b mask rows), every
// slot < num_slots, and every mask row i sets bit i and no bit after it. Reads every index array,
// so it needs host pointers. INVALID_ARGUMENT naming the field and the bound.
absl::Status ValidateVerifyProblem(const VerifyProblem& problem);

// Checks the problem's indices (slots < num_slots, sizes consistent) and computes it.
// num_threads <= 0 picks std::thread::hardware_concurrency().
absl::Status ComputeVerifyReference(const VerifyProblem& problem, int num_threads = 0);

// The same computation, but the output is written to out_f32 ([total_q][num_heads][512]) in fp32,
// before the bf16 rounding; problem.out is neither read nor written (lse is written when set).
// Tests use it to check the fp32 arithmetic itself against float64.
absl::Status ComputeVerifyReferenceF32(const VerifyProblem& problem, float* out_f32,
                                       int num_threads = 0);

}  // namespace verifyd
