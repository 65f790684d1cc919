// The seed of a randomized test: fresh per run (std::random_device), or VERIFYD_TEST_SEED from the
// environment to replay a failure; tests print it with SCOPED_TRACE. One definition for every test
// folder (the kvstore tests had their own, reading VERIFYD_TEST_SEED).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>

namespace verifyd::test {

inline uint64_t TestSeed() {
  if (const char* env = std::getenv("VERIFYD_TEST_SEED"); env != nullptr && *env != '\0') {
    return std::strtoull(env, nullptr, 0);
  }
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace verifyd::test
