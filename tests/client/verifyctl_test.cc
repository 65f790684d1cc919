#include <random>

#include "client/verifyctl/args.h"
#include "client/verifyctl/render.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace verifyd::ctl {
namespace {

TEST(VerifyctlArgsTest, ParsesCommandsAndFlagsInAnyOrder) {
  auto a = ParseArgs({"--target=unix:///tmp/x.sock", "compact", "--budget-bytes", "1048576"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->command, Command::kCompact);
  EXPECT_EQ(a->target, "unix:///tmp/x.sock");
  EXPECT_EQ(a->budget_bytes, 1048576u);

  auto r = ParseArgs({"release", "--sequence=18446744073709551615"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sequence, 18446744073709551615ull);
  EXPECT_EQ(r->target, "unix:///run/verifyd/verifyd-0.sock");

  std::mt19937_64 rng(std::random_device{}());
  const uint64_t source = rng(), fork = rng(), length = 1 + rng() % 100000;
  auto f =
      ParseArgs({"fork", "--length", std::to_string(length),
                 "--new-sequence=" + std::to_string(fork), "--sequence=" + std::to_string(source)});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->command, Command::kFork);
  EXPECT_EQ(f->sequence, source);
  EXPECT_EQ(f->new_sequence, fork);
  EXPECT_EQ(f->length, length);
}

TEST(VerifyctlArgsTest, OutputAndVersion) {
  for (const std::vector<std::string>& argv :
       std::vector<std::vector<std::string>>{{"-o", "json", "stats"},
                                             {"stats", "-o=json"},
                                             {"--output=json", "stats"},
                                             {"--output", "json", "compact"}}) {
    auto a = ParseArgs(argv);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->output, Output::kJson);
  }
  auto t = ParseArgs({"stats"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->output, Output::kText);
  auto bad = ParseArgs({"-o", "yaml", "stats"});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("-o = 'yaml' must be text or json"),
            std::string::npos);
  auto v = ParseArgs({"--version"});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->command, Command::kVersion);
}

// The JSON is protobuf's: it parses back into an equal message, field names as in the proto.
TEST(VerifyctlRenderTest, JsonRoundTripsStatsAndCompaction) {
  std::mt19937_64 rng(5);
  v1::StatsResponse stats;
  stats.set_used_tokens(rng() % 100000);
  stats.set_free_tokens(rng() % 100000);
  stats.mutable_fragmentation()->set_sequences(rng() % 1000);
  const std::string json = FormatJson(stats);
  EXPECT_NE(json.find("\"used_tokens\""), std::string::npos) << json;
  v1::StatsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_EQ(parsed.SerializeAsString(), stats.SerializeAsString());
  v1::CompactionStatus status;
  status.set_operation_id("compact-0badcafe-3");
  status.set_state(v1::CompactionStatus::DONE);
  status.set_bytes_moved(rng() % (1ull << 40));
  v1::CompactionStatus parsed_status;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(FormatJson(status), &parsed_status).ok());
  EXPECT_EQ(parsed_status.SerializeAsString(), status.SerializeAsString());
  EXPECT_NE(FormatJson(status).find("\"state\":\"DONE\""), std::string::npos);
}

TEST(VerifyctlArgsTest, UsageErrorsNameTheProblem) {
  struct Case {
    std::vector<std::string> argv;
    const char* message;
  } cases[] = {
      {{}, "a command is required"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"release"}, "release needs --sequence=ID"},
      {{"fork", "--sequence=1", "--length=4"}, "fork needs --sequence=ID --new-sequence=ID"},
      {{"fork", "--sequence=1", "--new-sequence=2", "--length=0"},
       "--length = '0' must be an integer >= 1"},
      {{"release", "--sequence=1", "--length=3"}, "--length applies to fork only"},
      {{"stats", "--sequence=1"}, "--sequence applies to release and fork only"},
      {{"stats", "--budget-bytes=5"}, "--budget-bytes applies to compact only"},
      {{"sequences", "--sequence=1"}, "--sequence applies to release and fork only"},
      {{"compact", "--budget-bytes=-5"}, "--budget-bytes = '-5' must be an integer >= 0"},
      {{"health", "--deadline-seconds=0"}, "--deadline-seconds = '0' must be a number > 0"},
      {{"health", "--colour=red"}, "unknown flag --colour"},
      {{"health", "stats"}, "unexpected argument 'stats'"},
      {{"health", "--target"}, "--target needs a value"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseArgs(c.argv);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos) << parsed.status();
  }
}

TEST(VerifyctlRenderTest, ProgressLineTracksBytes) {
  std::mt19937 rng(std::random_device{}());
  v1::CompactionStatus s;
  s.set_state(v1::CompactionStatus::RUNNING);
  const uint64_t planned = 1000 + rng() % 100000;
  s.set_bytes_planned(planned);
  s.set_bytes_moved(planned / 2);
  const std::string line = FormatProgressLine(s, 20);
  EXPECT_EQ(line.substr(0, 22), "[##########..........]") << line;
  EXPECT_NE(line.find("RUNNING"), std::string::npos);
  s.set_bytes_planned(0);  // not planned yet
  EXPECT_NE(FormatProgressLine(s, 10).find("[..........]   0.0%"), std::string::npos);
  s.set_state(v1::CompactionStatus::DONE);
  EXPECT_NE(FormatProgressLine(s, 10).find("[##########] 100.0%"), std::string::npos);
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(1000), "1000 B");
  EXPECT_EQ(FormatBytes(3.5 * 1024 * 1024 * 1024), "3.50 GiB");
}

TEST(VerifyctlRenderTest, StatsTableAndSummaryShowEveryNumber) {
  v1::StatsResponse s;
  s.set_backend("cpu");
  s.set_capacity_tokens(4000);
  s.set_used_tokens(1000);
  s.set_pending_tokens(37);
  s.mutable_fragmentation()->set_runs(41);
  s.mutable_fragmentation()->set_fragmented_ratio(0.125);
  const std::string table = FormatStatsTable(s);
  EXPECT_NE(table.find("backend            cpu\n"), std::string::npos) << table;
  EXPECT_NE(table.find("used tokens        1000  (25.0%)"), std::string::npos) << table;
  EXPECT_NE(table.find("fragment runs      41"), std::string::npos) << table;
  EXPECT_NE(table.find("fragmented ratio   0.1250"), std::string::npos) << table;
  // The pool's dtype (plans/0030); a daemon that predates it sends none: bf16.
  EXPECT_NE(table.find("kv dtype           bf16\n"), std::string::npos) << table;
  s.set_kv_dtype("fp8");
  s.set_kv_bytes_per_token(656);
  s.set_kv_pool_bytes(4000 * 656);
  const std::string fp8 = FormatStatsTable(s);
  EXPECT_NE(fp8.find("kv dtype           fp8\n"), std::string::npos) << fp8;
  EXPECT_NE(fp8.find("kv token bytes     656  (per layer)"), std::string::npos) << fp8;
  EXPECT_NE(fp8.find("kv pool            2.50 MiB"), std::string::npos) << fp8;

  v1::CompactionStatus c;
  c.set_state(v1::CompactionStatus::DONE);
  c.set_bytes_moved(3 << 20);
  c.set_bytes_per_second(1.5 * (1 << 30));
  c.mutable_before()->set_runs(90);
  c.mutable_after()->set_runs(12);
  const std::string summary = FormatCompactionSummary(c);
  EXPECT_NE(summary.find("3.00 MiB"), std::string::npos) << summary;
  EXPECT_NE(summary.find("1.50 GiB/s"), std::string::npos) << summary;
  EXPECT_NE(summary.find("before        90 runs"), std::string::npos) << summary;
  EXPECT_NE(summary.find("after         12 runs"), std::string::npos) << summary;
}

// `verifyctl sequences`: one row per sequence with every number, aligned; "expiring" once the
// lease has passed; a count line; the JSON is protobuf's and parses back equal.
TEST(VerifyctlRenderTest, SequencesTableAndJson) {
  auto parsed = ParseArgs({"-o", "json", "sequences"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->command, Command::kSequences);
  EXPECT_EQ(parsed->output, Output::kJson);

  v1::ListSequencesResponse list;
  list.set_total_sequences(2);
  v1::SequenceInfo* a = list.add_sequences();
  a->set_sequence_id(7);
  a->set_committed_length(1234);
  a->set_pending_tree_nodes(17);
  a->set_shared_tokens(1000);
  a->set_idle_seconds(2.25);
  a->set_lease_remaining_seconds(297.75);
  v1::SequenceInfo* b = list.add_sequences();
  b->set_sequence_id(18446744073709551615ull);
  b->set_committed_length(5);
  b->set_idle_seconds(900);
  b->set_lease_remaining_seconds(-600);
  const std::string table = FormatSequencesTable(list);
  EXPECT_EQ(table,
            "SEQUENCE              COMMITTED  PENDING  SHARED    IDLE  LEASE LEFT\n"
            "7                          1234       17    1000    2.2s      297.8s\n"
            "18446744073709551615          5        0       0  900.0s    expiring\n"
            "2 of 2 sequences\n")
      << table;
  list.set_truncated(true);
  EXPECT_NE(FormatSequencesTable(list).find("2 of 2 sequences (more follow)"), std::string::npos);
  EXPECT_EQ(FormatSequencesTable(v1::ListSequencesResponse()),
            "SEQUENCE  COMMITTED  PENDING  SHARED  IDLE  LEASE LEFT\n0 of 0 sequences\n");

  const std::string json = FormatJson(list);
  EXPECT_NE(json.find("\"idle_seconds\":900"), std::string::npos) << json;
  v1::ListSequencesResponse back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok()) << json;
  EXPECT_EQ(back.SerializeAsString(), list.SerializeAsString());
}

}  // namespace
}  // namespace verifyd::ctl
