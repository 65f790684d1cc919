// Metrics of the process and the edge that ServiceMetrics does not own, collected at scrape time:
// the standard process_* family (prometheus-cpp 1.0 has no process collector; names as the Go and
// Python clients export them, so dashboards built for those work), and verifyd_queue_depth (the
// requests waiting for the device thread right now: a queue that only grows is a daemon that
// cannot keep up, long before latency alerts fire).
#pragma once

#include <functional>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace verifyd {

class ProcessMetrics : public prometheus::Collectable {
 public:
  // `queue_depth`: the device's waiting requests (0 before the device exists).
  explicit ProcessMetrics(std::function<int()> queue_depth);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::function<int()> queue_depth_;
  double start_time_seconds_;
};

}  // namespace verifyd
