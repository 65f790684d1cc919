// Latency percentiles (nearest rank) for the fake scheduler and the load tool.
#pragma once

#include <cstddef>
#include <vector>

namespace verifyd::sched {

struct LatencySummary {
  size_t count = 0;
  double mean_us = 0, p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
};

// Sorts `micros` in place.
LatencySummary Summarize(std::vector<double>& micros);

}  // namespace verifyd::sched
