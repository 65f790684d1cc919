// Random names and ids: 128 bits from the kernel's CSPRNG for a shared-memory name that another
// local user cannot guess and a stale client cannot hit by accident, and the nonzero 64-bit ids of
// regions and channels (0 means "none" in a descriptor). Header-only.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace verifyd {

// `n` bytes from getrandom (EINTR and short reads retried). Where the kernel has no getrandom
// (ENOSYS: before 3.17) the standard library's device (/dev/urandom) fills the rest: never fails.
inline void FillRandom(void* data, size_t n) {
  auto* bytes = static_cast<unsigned char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(bytes + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      std::random_device device;
      for (; got < n; ++got) bytes[got] = static_cast<unsigned char>(device());
    }
  }
}

// Lower-case hex, two digits per byte.
inline std::string HexOf(const void* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 15]);
  }
  return out;
}

// `bytes` random bytes as 2 * bytes hex digits (16: the 128 bits of a name or a client id).
inline std::string RandomHex(size_t bytes = 16) {
  std::string raw(bytes, '\0');
  FillRandom(raw.data(), raw.size());
  return HexOf(raw.data(), raw.size());
}

// A random id, never 0.
inline uint64_t RandomNonzeroId() {
  uint64_t id = 0;
  while (id == 0) FillRandom(&id, sizeof(id));
  return id;
}

}  // namespace verifyd
