#include "verify/tree_parents.h"

#include <cstddef>

#include "absl/strings/str_cat.h"

namespace verifyd {

absl::Status CheckParents(absl::Span<const int32_t> parents, int max_nodes, absl::string_view field,
                          absl::string_view bound_name) {
  if (parents.empty() || parents.size() > static_cast<size_t>(max_nodes)) {
    const std::string bound =
        bound_name.empty() ? absl::StrCat(max_nodes) : absl::StrCat(bound_name, " = ", max_nodes);
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", parents.size(), " nodes, must be in [1, ", bound, "]"));
  }
  for (size_t i = 0; i < parents.size(); ++i) {
    const int32_t p = parents[i];
    if (p == -1) continue;
    if (p < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", p, " must be -1 (a root) or an index >= 0"));
    }
    if (static_cast<size_t>(p) >= i) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", p, " must be < ", i, " (or -1 for a root)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace verifyd
