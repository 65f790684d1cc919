// base/random.h and base/align.h: the shapes their callers rely on (names of 32 hex digits, ids
// never 0, offsets on 256-byte boundaries).
#include <set>
#include <string>

#include "base/align.h"
#include "base/random.h"
#include "gtest/gtest.h"

namespace verifyd {
namespace {

TEST(RandomTest, HexIsTwoLowerCaseDigitsPerByte) {
  const unsigned char bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(HexOf(bytes, sizeof(bytes)), "000fa5ff");
  const std::string name = RandomHex();
  ASSERT_EQ(name.size(), 32u);
  EXPECT_EQ(name.find_first_not_of("0123456789abcdef"), std::string::npos) << name;
  EXPECT_EQ(RandomHex(4).size(), 8u);
}

TEST(RandomTest, NamesAndIdsDoNotRepeat) {
  std::set<std::string> names;
  std::set<uint64_t> ids;
  for (int i = 0; i < 1000; ++i) {
    names.insert(RandomHex());
    const uint64_t id = RandomNonzeroId();
    EXPECT_NE(id, 0u);
    ids.insert(id);
  }
  EXPECT_EQ(names.size(), 1000u);
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(AlignTest, RoundsUpToTheDeviceAlignment) {
  EXPECT_EQ(AlignTo256(0), 0u);
  EXPECT_EQ(AlignTo256(1), 256u);
  EXPECT_EQ(AlignTo256(256), 256u);
  EXPECT_EQ(AlignTo256(257), 512u);
  static_assert(AlignTo256(1000) % kDeviceAlignment == 0);
}

}  // namespace
}  // namespace verifyd
