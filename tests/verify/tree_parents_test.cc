// The parents rule's messages name the field and the bound, the way the caller's user sets it.
#include "verify/tree_parents.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

std::string Message(const std::vector<int32_t>& parents, int max_nodes,
                    absl::string_view bound_name = "") {
  const absl::Status s = CheckParents(parents, max_nodes, "sequences[1].parents", bound_name);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(TreeParentsTest, NamesTheBoundAsTheUserSetsIt) {
  EXPECT_THAT(Message({}, 16, "--max-tree-nodes"),
              HasSubstr("sequences[1].parents has 0 nodes, must be in [1, --max-tree-nodes = 16]"));
  EXPECT_THAT(Message(std::vector<int32_t>(17, -1), 16),
              HasSubstr("sequences[1].parents has 17 nodes, must be in [1, 16]"));
}

TEST(TreeParentsTest, EachParentPrecedesItsNode) {
  EXPECT_THAT(Message({-1, 0, 2}, 16), HasSubstr("sequences[1].parents[2] = 2 must be < 2"));
  EXPECT_THAT(Message({-1, -3}, 16),
              HasSubstr("sequences[1].parents[1] = -3 must be -1 (a root) or an index >= 0"));
  EXPECT_TRUE(CheckParents({-1, 0, 0, 1, -1}, 5, "parents").ok());
  EXPECT_TRUE(CheckParents(std::vector<int32_t>(16, -1), 16, "parents").ok());
}

}  // namespace
}  // namespace verifyd
