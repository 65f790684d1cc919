#include "client/verifyctl/render.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace verifyd::ctl {
namespace {

std::string Table(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& [key, value] : rows) width = std::max(width, key.size());
  std::string out;
  for (const auto& [key, value] : rows) {
    absl::StrAppend(&out, key, std::string(width - key.size() + 2, ' '), value, "\n");
  }
  return out;
}

std::string Percent(double part, double whole) {
  return whole > 0 ? absl::StrFormat("%.1f%%", 100.0 * part / whole) : "-";
}

std::string FragmentationLine(const v1::Fragmentation& f) {
  return absl::StrFormat(
      "%d runs over %d sequences, %d of %d tokens outside the first run (%.2f%%)", f.runs(),
      f.sequences(), f.tokens_outside_first_run(), f.tokens(), 100.0 * f.fragmented_ratio());
}

}  // namespace

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.2f %s", bytes, kUnits[unit]);
}

std::string FormatStatsTable(const v1::StatsResponse& s) {
  const double cap = static_cast<double>(s.capacity_tokens());
  return Table({
      {"backend", s.backend()},
      {"mps", s.mps_active() ? "on" : "off"},
      {"layers", absl::StrCat(s.layers())},
      {"heads", absl::StrCat(s.heads())},
      {"max tree nodes", absl::StrCat(s.max_tree_nodes())},
      {"softmax scale", absl::StrFormat("%.6g", s.softmax_scale())},
      {"kv dtype", s.kv_dtype().empty() ? "bf16" : s.kv_dtype()},
      {"kv token bytes", absl::StrCat(s.kv_bytes_per_token(), "  (per layer)")},
      {"kv pool", FormatBytes(static_cast<double>(s.kv_pool_bytes()))},
      {"capacity tokens", absl::StrCat(s.capacity_tokens())},
      {"used tokens", absl::StrCat(s.used_tokens(), "  (", Percent(s.used_tokens(), cap), ")")},
      {"pending tokens",
       absl::StrCat(s.pending_tokens(), "  (", Percent(s.pending_tokens(), cap), ")")},
      {"free tokens", absl::StrCat(s.free_tokens(), "  (", Percent(s.free_tokens(), cap), ")")},
      {"largest free run", absl::StrCat(s.largest_free_run())},
      {"sequences", absl::StrCat(s.fragmentation().sequences())},
      {"committed tokens", absl::StrCat(s.fragmentation().tokens())},
      {"fragment runs", absl::StrCat(s.fragmentation().runs())},
      {"outside first run", absl::StrCat(s.fragmentation().tokens_outside_first_run())},
      {"fragmented ratio", absl::StrFormat("%.4f", s.fragmentation().fragmented_ratio())},
      {"shared tokens", absl::StrCat(s.shared_tokens())},
      {"shared references", absl::StrCat(s.shared_references())},
  });
}

std::string FormatSequencesTable(const v1::ListSequencesResponse& list) {
  std::vector<std::vector<std::string>> rows = {
      {"SEQUENCE", "COMMITTED", "PENDING", "SHARED", "IDLE", "LEASE LEFT"}};
  for (const v1::SequenceInfo& s : list.sequences()) {
    rows.push_back({absl::StrCat(s.sequence_id()), absl::StrCat(s.committed_length()),
                    absl::StrCat(s.pending_tree_nodes()), absl::StrCat(s.shared_tokens()),
                    absl::StrFormat("%.1fs", s.idle_seconds()),
                    // Past the lease: the daemon's next sweep releases it.
                    s.lease_remaining_seconds() > 0
                        ? absl::StrFormat("%.1fs", s.lease_remaining_seconds())
                        : std::string("expiring")});
  }
  // The id left-aligned, the numbers right-aligned, two spaces between columns.
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      absl::StrAppend(&line, c == 0 ? "" : "  ", c == 0 ? row[c] + pad : pad + row[c]);
    }
    absl::StrAppend(&out, line, "\n");
  }
  absl::StrAppend(&out, list.sequences_size(), " of ", list.total_sequences(), " sequences",
                  list.truncated() ? " (more follow)" : "", "\n");
  return out;
}

std::string FormatProgressLine(const v1::CompactionStatus& status, int width) {
  const double planned = static_cast<double>(status.bytes_planned());
  const double moved = static_cast<double>(status.bytes_moved());
  const bool done = status.state() == v1::CompactionStatus::DONE;
  const double fraction = planned > 0 ? std::clamp(moved / planned, 0.0, 1.0) : done ? 1.0 : 0.0;
  const int filled = static_cast<int>(fraction * width + 0.5);
  return absl::StrFormat("[%s%s] %5.1f%%  %s / %s  %s", std::string(filled, '#'),
                         std::string(width - filled, '.'), 100.0 * fraction, FormatBytes(moved),
                         FormatBytes(planned), v1::CompactionStatus::State_Name(status.state()));
}

std::string FormatCompactionSummary(const v1::CompactionStatus& s) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"operation", s.operation_id()},
      {"state", v1::CompactionStatus::State_Name(s.state())},
      {"bytes moved", absl::StrCat(FormatBytes(s.bytes_moved()), " (", s.bytes_moved(), " of ",
                                   s.bytes_planned(), " planned)")},
      {"tokens moved", absl::StrCat(s.tokens_moved())},
      {"time", absl::StrFormat("%.3f s", s.seconds())},
      {"throughput", absl::StrCat(FormatBytes(s.bytes_per_second()), "/s")},
      {"before", FragmentationLine(s.before())},
      {"after", FragmentationLine(s.after())},
  };
  if (!s.error().empty()) rows.push_back({"error", s.error()});
  if (!s.note().empty()) rows.push_back({"note", s.note()});
  return Table(rows);
}

std::string FormatJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return absl::StrCat("{\"error\": \"", status.ToString(), "\"}\n");
  return json + "\n";
}

}  // namespace verifyd::ctl
