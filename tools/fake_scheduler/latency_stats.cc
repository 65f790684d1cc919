#include "tools/fake_scheduler/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace verifyd::sched {

LatencySummary Summarize(std::vector<double>& micros) {
  LatencySummary s;
  s.count = micros.size();
  if (micros.empty()) return s;
  std::sort(micros.begin(), micros.end());
  auto rank = [&](double p) {
    const size_t k = static_cast<size_t>(std::ceil(p * micros.size()));
    return micros[std::clamp<size_t>(k, 1, micros.size()) - 1];
  };
  s.mean_us = std::accumulate(micros.begin(), micros.end(), 0.0) / micros.size();
  s.p50_us = rank(0.50);
  s.p90_us = rank(0.90);
  s.p99_us = rank(0.99);
  s.p999_us = rank(0.999);
  s.max_us = micros.back();
  return s;
}

}  // namespace verifyd::sched
