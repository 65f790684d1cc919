// The parents rule of a draft tree (SPEC §1), stated once for every layer that checks it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace verifyd {

// 1 .. max_nodes nodes, each -1 (a root) or the index of an earlier node, so that parents come
// before their children. INVALID_ARGUMENT naming `field` (e.g. "sequences[1].parents") and the
// bound; `bound_name` is how the caller's user sets the bound (e.g. "--max-tree-nodes"), empty
// where it is not a setting.
absl::Status CheckParents(absl::Span<const int32_t> parents, int max_nodes, absl::string_view field,
                          absl::string_view bound_name = "");

}  // namespace verifyd
