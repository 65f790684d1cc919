#include "service/process_metrics.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "base/descriptor_budget.h"

namespace verifyd {
namespace {

prometheus::MetricFamily Gauge(const char* name, const char* help, double value,
                               prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

// utime + stime of /proc/self/stat in seconds (fields 14 and 15, after the parenthesised name).
double CpuSeconds() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string skip;
  for (int i = 3; i <= 13; ++i) fields >> skip;  // state .. cmajflt
  double utime = 0, stime = 0;
  fields >> utime >> stime;
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Resident and virtual bytes from /proc/self/statm (pages).
void Memory(double* resident, double* virtual_bytes) {
  std::ifstream in("/proc/self/statm");
  double size = 0, rss = 0;
  in >> size >> rss;
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  *resident = rss * page;
  *virtual_bytes = size * page;
}

}  // namespace

ProcessMetrics::ProcessMetrics(std::function<int()> queue_depth)
    : queue_depth_(std::move(queue_depth)),
      start_time_seconds_(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())) {}

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  double resident = 0, virtual_bytes = 0;
  Memory(&resident, &virtual_bytes);
  return {
      Gauge("process_cpu_seconds_total", "User and system CPU time of the process.", CpuSeconds(),
            prometheus::MetricType::Counter),
      Gauge("process_resident_memory_bytes", "Resident memory of the process.", resident),
      Gauge("process_virtual_memory_bytes", "Virtual memory of the process.", virtual_bytes),
      Gauge("process_open_fds", "Open file descriptors.", static_cast<double>(OpenDescriptors())),
      Gauge("process_max_fds", "The descriptor limit (soft).",
            static_cast<double>(DescriptorLimit())),
      Gauge("process_start_time_seconds", "Start time of the process, Unix seconds.",
            start_time_seconds_),
      Gauge("verifyd_queue_depth", "Requests waiting for the device thread.",
            static_cast<double>(queue_depth_ ? queue_depth_() : 0)),
  };
}

}  // namespace verifyd
