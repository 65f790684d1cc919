// The daemon's log: one line per event an operator needs, with a level, on stderr (spdlog, from
// Debian's libspdlog-dev). A line is the UTC time, the level, the event's name and its fields as
// key=value words, e.g.
//   2026-12-03T13:00:00.123Z info lease_expired sequence=7 lease=1m
// Events: start (the configuration), stop, lease_expired, channel_open, channel_close, compaction,
// refused (a call answered with an error, sampled: Refused), and the warnings the daemon gives.
// The startup line on stdout stays the machine-read contract (tests/lib/daemon.sh); this is for
// people and log collectors.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace verifyd {
struct CompactionOperation;
}  // namespace verifyd

namespace verifyd::event_log {

enum class Level { kDebug, kInfo, kWarning, kError };

// --log-level: the least level written ("debug", "info", "warning", "error"); INVALID_ARGUMENT
// naming the flag for another name.
absl::Status SetLevel(absl::string_view name);
// --log-refused-every: after the first of each method and code, one refused call in `every` is
// written (>= 1).
void SetRefusedEvery(int64_t every);

void Write(Level level, absl::string_view event, absl::string_view fields);
inline void Info(absl::string_view event, absl::string_view fields) {
  Write(Level::kInfo, event, fields);
}
inline void Warning(absl::string_view event, absl::string_view fields) {
  Write(Level::kWarning, event, fields);
}
inline void Error(absl::string_view event, absl::string_view fields) {
  Write(Level::kError, event, fields);
}

// A value as one key=value word: quoted (with \" and \\ escaped, newlines as \n) when it holds a
// space, a quote or an equals sign, so that one event stays one line and parses back.
std::string Quote(absl::string_view value);

// The executor's events (ExecutorEvents, executor/executor_events.h), as the log writes them.
void LeaseExpired(uint64_t sequence);
void ChannelOpened(uint64_t channel, const std::string& owner, int entries);
void ChannelClosed(uint64_t channel, const std::string& owner, const std::string& why);
void CompactionFinished(const CompactionOperation& op);

// A call the edge answered with `status` (not OK): the first of its method and code, then one in
// every --log-refused-every, as "refused method=... code=... count=N message=...", where count
// is how many of that method and code there were so far.
void Refused(const char* method, const absl::Status& status);

}  // namespace verifyd::event_log
