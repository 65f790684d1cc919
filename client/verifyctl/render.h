// verifyctl's text output: pure functions from messages to strings, so tests can check them.
#pragma once

#include <cstdint>
#include <string>

#include "verifyd/v1/verifyd.pb.h"

namespace verifyd::ctl {

// 1536 -> "1.50 KiB"; below 1 KiB, "N B".
std::string FormatBytes(double bytes);

// Two aligned columns, one setting or gauge per row, occupancy as a percentage of capacity.
std::string FormatStatsTable(const v1::StatsResponse& stats);

// One row per sequence (id, committed length, pending tree nodes, shared tokens, idle seconds,
// lease left), ids ascending as the daemon lists them, then a count line.
std::string FormatSequencesTable(const v1::ListSequencesResponse& list);

// "[#########.........]  45.0%  12.0 MiB / 26.7 MiB  RUNNING", `width` cells of bar. Progress is
// bytes_moved / bytes_planned; with no plan yet, 0% until DONE.
std::string FormatProgressLine(const v1::CompactionStatus& status, int width = 30);

// protobuf's JSON of `message` (field names as in the proto, every field printed, one object and a
// newline): what `verifyctl -o json` prints.
std::string FormatJson(const google::protobuf::Message& message);

// The final report: state, bytes and tokens moved, time, throughput, fragmentation before/after.
std::string FormatCompactionSummary(const v1::CompactionStatus& status);

}  // namespace verifyd::ctl
