#include "service/event_log.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "executor/compaction_manager.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace verifyd::event_log {
namespace {

spdlog::logger& Logger() {
  // Never destroyed: threads may still log while the process exits.
  static spdlog::logger* logger = [] {
    auto* made = new spdlog::logger("verifyd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    made->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %l %v", spdlog::pattern_time_type::utc);
    made->set_level(spdlog::level::info);
    // Every line reaches the log at once: a daemon killed next does not lose its last events.
    made->flush_on(spdlog::level::trace);
    return made;
  }();
  return *logger;
}

spdlog::level::level_enum ToSpd(Level level) {
  switch (level) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarning:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

std::atomic<int64_t> refused_every{100};

}  // namespace

absl::Status SetLevel(absl::string_view name) {
  static const std::pair<absl::string_view, Level> kLevels[] = {{"debug", Level::kDebug},
                                                                {"info", Level::kInfo},
                                                                {"warning", Level::kWarning},
                                                                {"error", Level::kError}};
  for (const auto& [known, level] : kLevels) {
    if (name == known) {
      Logger().set_level(ToSpd(level));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--log-level = '", name, "' must be debug, info, warning or error"));
}

void SetRefusedEvery(int64_t every) { refused_every = every < 1 ? 1 : every; }

void Write(Level level, absl::string_view event, absl::string_view fields) {
  spdlog::logger& logger = Logger();
  const spdlog::level::level_enum spd = ToSpd(level);
  if (!logger.should_log(spd)) return;
  if (fields.empty()) {
    logger.log(spd, "{}", std::string_view(event.data(), event.size()));
  } else {
    logger.log(spd, "{} {}", std::string_view(event.data(), event.size()),
               std::string_view(fields.data(), fields.size()));
  }
}

std::string Quote(absl::string_view value) {
  if (!value.empty() && value.find_first_of(" \"=\\\n\t") == absl::string_view::npos) {
    return std::string(value);
  }
  std::string out = "\"";
  for (const char c : value) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

void LeaseExpired(uint64_t sequence) { Info("lease_expired", absl::StrCat("sequence=", sequence)); }

void ChannelOpened(uint64_t channel, const std::string& owner, int entries) {
  Info("channel_open",
       absl::StrCat("channel=", channel, " owner=", Quote(owner), " entries=", entries));
}

void ChannelClosed(uint64_t channel, const std::string& owner, const std::string& why) {
  Info("channel_close",
       absl::StrCat("channel=", channel, " owner=", Quote(owner), " why=", Quote(why)));
}

void CompactionFinished(const CompactionOperation& op) {
  const bool done = op.state == CompactionOperation::State::kDone;
  Write(done ? Level::kInfo : Level::kWarning, "compaction",
        absl::StrCat("id=", op.id, " state=", done ? "done" : "failed",
                     " budget_bytes=", op.budget_requested, " moved_bytes=", op.bytes_moved,
                     " tokens_moved=", op.tokens_moved,
                     " seconds=", absl::ToDoubleSeconds(op.copy_time),
                     " fragmented_before=", op.before.tokens_outside_first_run,
                     " fragmented_after=", op.after.tokens_outside_first_run,
                     done ? absl::StrCat(" note=", Quote(op.note))
                          : absl::StrCat(" error=", Quote(op.error))));
}

void Refused(const char* method, const absl::Status& status) {
  static std::mutex mu;
  static auto* counts = new absl::flat_hash_map<std::pair<std::string, int>, int64_t>();
  int64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    count = ++(*counts)[{method, static_cast<int>(status.code())}];
  }
  if (count != 1 && count % refused_every.load() != 0) return;
  // The daemon's own faults are errors; the caller's mistakes and the daemon's limits are not.
  const bool fault = status.code() == absl::StatusCode::kInternal ||
                     status.code() == absl::StatusCode::kUnknown ||
                     status.code() == absl::StatusCode::kDataLoss;
  Write(fault ? Level::kError : Level::kInfo, "refused",
        absl::StrCat("method=", method, " code=", absl::StatusCodeToString(status.code()),
                     " count=", count, " message=", Quote(status.message())));
}

}  // namespace verifyd::event_log
