// Fuzz target: TreeMask::FromParents. Mode byte 0: raw int16 parents (mostly invalid: the
// validation must refuse them with a message and never crash). Otherwise a valid tree drawn from
// the bytes (each parent -1 or an earlier node), which must be accepted. Every accepted mask is
// compared bit for bit with the tests' naive ancestor walk, and every depth with its chain length.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"
#include "verify/tree_mask.h"

namespace {

void Require(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "tree_mask_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace verifyd;
  fuzz::FuzzInput in(data, size);
  const bool raw = in.Take<uint8_t>() == 0;
  const int max_nodes = 1 + static_cast<int>(in.Below(kMaxTreeNodes));
  std::vector<int32_t> parents;
  while (!in.empty() && parents.size() < kMaxTreeNodes + 2) {
    const int32_t i = static_cast<int32_t>(parents.size());
    if (raw) {
      parents.push_back(in.Take<int16_t>());
    } else {
      const uint8_t b = in.Take<uint8_t>();
      parents.push_back(i == 0 || b % 4 == 0 ? -1 : static_cast<int32_t>(b % i));
    }
  }
  bool valid = !parents.empty() && parents.size() <= static_cast<size_t>(max_nodes);
  for (size_t i = 0; i < parents.size(); ++i) {
    valid = valid && parents[i] >= -1 && parents[i] < static_cast<int32_t>(i);
  }
  absl::StatusOr<TreeMask> mask = TreeMask::FromParents(parents, max_nodes);
  Require(mask.ok() == valid, "FromParents accepted an invalid tree or refused a valid one");
  if (!mask.ok()) {
    Require(mask.status().code() == absl::StatusCode::kInvalidArgument &&
                !mask.status().message().empty(),
            "a refusal must be INVALID_ARGUMENT with a message");
    return 0;
  }
  const std::vector<uint64_t> naive = test::NaiveAncestorMask(parents);
  Require(mask->bits() == naive, "mask differs from the naive ancestor walk");
  for (size_t i = 0; i < parents.size(); ++i) {
    int32_t depth = 0;
    for (int32_t p = parents[i]; p != -1; p = parents[p]) ++depth;
    Require(mask->depth()[i] == depth, "depth differs from the chain length");
  }
  return 0;
}
