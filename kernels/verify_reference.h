// The CPU implementation of verify attention: the CPU backend's arithmetic and every test's oracle.
// bf16 inputs, fp32 accumulation, bf16 output, optional fp32 LSE. Multithreaded over query rows.
#pragma once

#include "absl/status/status.h"
#include "kernels/verify_problem.h"

namespace verifyd {

// Checks the problem's indices (slots < num_slots, sizes consistent) and computes it.
// num_threads <= 0 picks std::thread::hardware_concurrency().
absl::Status ComputeVerifyReference(const VerifyProblem& problem, int num_threads = 0);

}  // namespace verifyd
