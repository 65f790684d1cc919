// A sample's value in Prometheus text exposition (what the daemon serves on /metrics): the tests
// that scrape a running daemon read their counters and gauges through it. Header-only.
#pragma once

#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace verifyd::testing {

// The value on the line that starts with `series` (the name, and the labels as the daemon prints
// them: `name{a="x",b="y"}`), or nullopt when no such line is there.
inline std::optional<double> PrometheusSample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, series + " ")) {
      double v = 0;
      if (absl::SimpleAtod(line, &v)) return v;
    }
  }
  return std::nullopt;
}

}  // namespace verifyd::testing
