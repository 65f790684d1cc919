// Uses the installed headers and library: tensor helpers, a request, and a call that must fail
// with UNAVAILABLE (no daemon listens on the socket). Exit 0 when all of it behaves.
#include <cstdio>

#include "client/client.h"
#include "client/tensor.h"

int main() {
  const int64_t shape[] = {1, 2, 576};
  std::vector<float> values(2 * 576);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(i) - 3.0f;
  auto kv = verifyd::tensor::MakeBf16FromFloat(shape, values);
  if (!kv.ok()) return std::fprintf(stderr, "%s\n", kv.status().ToString().c_str()), 1;
  auto back = verifyd::tensor::ParseBf16AsFloat(*kv, "kv", shape);
  if (!back.ok() ||
      (*back)[1] != verifyd::tensor::Bf16ToFloat(verifyd::tensor::FloatToBf16(values[1]))) {
    return std::fprintf(stderr, "tensor round trip failed\n"), 1;
  }
  verifyd::ClientOptions options;
  options.default_deadline = absl::Seconds(2);
  options.retries = 0;
  auto client = verifyd::Client::Connect("unix:///tmp/verifyd-consumer-no-daemon.sock", options);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  auto stats = (*client)->Stats();
  if (stats.status().code() != absl::StatusCode::kUnavailable) {
    return std::fprintf(stderr, "want UNAVAILABLE, got %s\n", stats.status().ToString().c_str()), 1;
  }
  std::printf("consumer ok: %s\n", stats.status().ToString().c_str());
  return 0;
}
