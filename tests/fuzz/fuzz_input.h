// Reads typed values from a fuzzer's bytes (a small stand-in for clang's FuzzedDataProvider, so
// the targets also build with GCC as corpus replayers). Past the end every read returns 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace verifyd::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return size_ - pos_; }
  const uint8_t* rest() const { return data_ + pos_; }

  template <typename T>
  T Take() {
    T value{};
    const size_t n = sizeof(T) < remaining() ? sizeof(T) : remaining();
    std::memcpy(&value, data_ + pos_, n);
    pos_ += n;
    return value;
  }
  // A value in [0, bound) (bound >= 1).
  uint32_t Below(uint32_t bound) { return Take<uint32_t>() % bound; }
  bool Bool() { return Take<uint8_t>() & 1; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace verifyd::fuzz
