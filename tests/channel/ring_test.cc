// The channel's ring on its own (channel/): descriptors round-trip, indices wrap, a full ring
// pushes back, malformed descriptors and impossible indices are refused, a dead reader never
// blocks the writer, a writer that dies mid-descriptor publishes nothing, and the futex sleep
// wakes on a push from another process.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "channel/descriptor.h"
#include "channel/ring.h"
#include "channel/ring_ends.h"
#include "channel/ring_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace verifyd::channel {
namespace {

using ::testing::HasSubstr;

uint64_t Seed() {
  static const uint64_t seed = std::random_device{}();
  return seed;
}

// A ring in anonymous shared memory (fork shares it), zero-filled like a fresh file.
class AnonRing {
 public:
  explicit AnonRing(uint32_t entries) : bytes_(RingFileBytes(entries)) {
    data_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    view_ = RingView(data_, entries);
    view_.Initialize();
  }
  ~AnonRing() { munmap(data_, bytes_); }
  const RingView& view() const { return view_; }

 private:
  uint64_t bytes_;
  void* data_;
  RingView view_;
};

Descriptor RandomDescriptor(std::mt19937_64& rng) {
  Descriptor d;
  d.kind = rng() % 2 ? DescriptorKind::kVerify : DescriptorKind::kCommit;
  d.id = rng();
  d.layer = static_cast<uint32_t>(rng() % 100);
  d.return_lse = rng() % 2;
  if (rng() % 2) d.scale = static_cast<float>(rng() % 1000) / 7.f;
  auto ref = [&] { return TensorRef{rng(), rng()}; };
  d.q = ref();
  d.tree_kv = ref();
  d.out = ref();
  d.lse = ref();
  d.ready = FlagRef{rng(), rng(), static_cast<uint32_t>(rng()), 0};
  d.done = FlagRef{rng(), rng(), static_cast<uint32_t>(rng()), 0};
  const int sequences = d.kind == DescriptorKind::kCommit ? 1 : 1 + static_cast<int>(rng() % 8);
  for (int b = 0; b < sequences; ++b) {
    SequenceEntry s;
    s.sequence_id = rng();
    s.parents.resize(rng() % 40);
    for (int32_t& p : s.parents) p = static_cast<int32_t>(rng());
    s.has_commit = rng() % 2;
    if (s.has_commit) {
      s.accepted_path.resize(rng() % 10);
      for (int32_t& p : s.accepted_path) p = static_cast<int32_t>(rng());
      s.commit_length = static_cast<uint32_t>(rng() % 12);
    }
    d.sequences.push_back(std::move(s));
  }
  return d;
}

void ExpectSame(const Descriptor& a, const Descriptor& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.layer, b.layer);
  EXPECT_EQ(a.return_lse, b.return_lse);
  EXPECT_EQ(a.scale, b.scale);
  for (auto [x, y] :
       {std::pair{a.q, b.q}, {a.tree_kv, b.tree_kv}, {a.out, b.out}, {a.lse, b.lse}}) {
    EXPECT_EQ(x.region, y.region);
    EXPECT_EQ(x.offset, y.offset);
  }
  for (auto [x, y] : {std::pair{a.ready, b.ready}, {a.done, b.done}}) {
    EXPECT_EQ(x.region, y.region);
    EXPECT_EQ(x.offset, y.offset);
    EXPECT_EQ(x.value, y.value);
  }
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  for (size_t i = 0; i < a.sequences.size(); ++i) {
    EXPECT_EQ(a.sequences[i].sequence_id, b.sequences[i].sequence_id);
    EXPECT_EQ(a.sequences[i].parents, b.sequences[i].parents);
    EXPECT_EQ(a.sequences[i].has_commit, b.sequences[i].has_commit);
    EXPECT_EQ(a.sequences[i].commit_length, b.sequences[i].commit_length);
    EXPECT_EQ(a.sequences[i].accepted_path, b.sequences[i].accepted_path);
  }
}

TEST(DescriptorTest, RandomDescriptorsRoundTrip) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  std::mt19937_64 rng(Seed());
  std::vector<uint8_t> slot(kDescriptorBytes);
  for (int i = 0; i < 500; ++i) {
    const Descriptor d = RandomDescriptor(rng);
    std::fill(slot.begin(), slot.end(), static_cast<uint8_t>(rng()));
    ASSERT_TRUE(Encode(d, slot.data()).ok());
    absl::StatusOr<Descriptor> back = Decode(slot.data());
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(d, *back);
  }
}

TEST(DescriptorTest, TooLargeForASlotIsRefusedByTheEncoder) {
  Descriptor d;
  d.sequences.resize(1);
  d.sequences[0].parents.resize((kDescriptorBytes - sizeof(DescriptorHeader)) / 4);
  std::vector<uint8_t> slot(kDescriptorBytes);
  const absl::Status s = Encode(d, slot.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than a channel slot's 8192"));
}

// Each way a descriptor's form can be wrong, with the field it names.
TEST(DescriptorTest, MalformedDescriptorsNameTheField) {
  std::mt19937_64 rng(Seed());
  Descriptor d = RandomDescriptor(rng);
  d.kind = DescriptorKind::kVerify;
  std::vector<uint8_t> good(kDescriptorBytes);
  ASSERT_TRUE(Encode(d, good.data()).ok());
  DescriptorHeader h = PeekHeader(good.data());
  auto with = [&](auto mutate) {
    std::vector<uint8_t> bad = good;
    DescriptorHeader x = h;
    mutate(x, bad);
    std::memcpy(bad.data(), &x, sizeof(x));
    return Decode(bad.data()).status();
  };
  struct Case {
    const char* expect;
    std::function<void(DescriptorHeader&, std::vector<uint8_t>&)> mutate;
  };
  const std::vector<Case> cases = {
      {"kind = 7 must be 1 (Verify) or 2 (Commit)", [](auto& x, auto&) { x.kind = 7; }},
      {"bytes = 8 must be in [144, 8192]", [](auto& x, auto&) { x.bytes = 8; }},
      {"bytes = 9000 must be in", [](auto& x, auto&) { x.bytes = 9000; }},
      {"flags = 5 has bits outside 3", [](auto& x, auto&) { x.flags = 5; }},
      {"num_sequences = 4000000000 cannot fit",
       [](auto& x, auto&) { x.num_sequences = 4000000000u; }},
      {"but the sequences end at", [](auto& x, auto&) { x.bytes += 4; }},
      {"sequences[0].has_commit = 9 must be 0 or 1",
       [](auto&, auto& b) { b[sizeof(DescriptorHeader) + 12] = 9; }},
      {"sequences[0] has 4294967295 parents",
       [](auto&, auto& b) { std::memset(&b[sizeof(DescriptorHeader) + 8], 0xFF, 4); }},
  };
  for (const Case& c : cases) {
    const absl::Status s = with(c.mutate);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expect;
    EXPECT_THAT(s.message(), HasSubstr("malformed descriptor: "));
    EXPECT_THAT(s.message(), HasSubstr(c.expect));
  }
  // A Commit descriptor has exactly one sequence.
  Descriptor commit;
  commit.kind = DescriptorKind::kCommit;
  commit.sequences.resize(2);
  ASSERT_TRUE(Encode(commit, good.data()).ok());
  EXPECT_THAT(Decode(good.data()).status().message(), HasSubstr("num_sequences = 2, must be 1"));
}

// Random bytes never crash the decoder: it answers OK or INVALID_ARGUMENT.
TEST(DescriptorTest, RandomBytesDecodeOrAreRefused) {
  std::mt19937_64 rng(Seed());
  std::vector<uint8_t> slot(kDescriptorBytes);
  for (int i = 0; i < 2000; ++i) {
    for (uint8_t& b : slot) b = static_cast<uint8_t>(rng());
    DescriptorHeader h = PeekHeader(slot.data());
    // Half the time a plausible header, so the body checks run too.
    if (i % 2) {
      h.kind = 1 + rng() % 2;
      h.bytes = static_cast<uint32_t>(sizeof(DescriptorHeader) + rng() % 2000);
      h.flags &= kKnownFlags;
      h.num_sequences = static_cast<uint32_t>(rng() % 5);
      std::memcpy(slot.data(), &h, sizeof(h));
    }
    const absl::StatusOr<Descriptor> d = Decode(slot.data());
    if (!d.ok()) EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// Writes the completion of descriptor `n` as the daemon would: id echoed, code by parity.
void Complete(const RingView& view, uint64_t n, uint64_t id) {
  const std::string message = absl::StrCat("done ", n);
  view.WriteCompletion(n, id, n % 3 == 0 ? 3 : 0, message.data(), message.size(), n * 7);
}

// Indices wrap many times around a small ring with the consumer on another thread; every
// descriptor arrives once, in order, and its completion comes back to the right id.
TEST(RingTest, WrapsAroundInOrderAcrossThreads) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  for (uint32_t entries : {2u, 4u, 16u}) {
    AnonRing ring(entries);
    constexpr int kCount = 3000;
    std::vector<uint64_t> ids(kCount);
    std::mt19937_64 rng(Seed() + entries);
    for (uint64_t& id : ids) id = rng();
    std::atomic<bool> consumer_ok{true};
    std::thread consumer([&] {
      RingConsumer c(ring.view());
      std::vector<uint8_t> copy(kDescriptorBytes);
      for (int taken = 0; taken < kCount;) {
        uint64_t n = 0;
        std::string why;
        const auto t = c.TryTake(copy.data(), &n, &why);
        if (t == RingConsumer::Take::kCorrupt) consumer_ok = false;
        if (t != RingConsumer::Take::kTaken) {
          c.Sleep(std::chrono::milliseconds(5));
          continue;
        }
        const absl::StatusOr<Descriptor> d = Decode(copy.data());
        if (!d.ok() || n != static_cast<uint64_t>(taken) || d->id != ids[n]) consumer_ok = false;
        Complete(ring.view(), n, d.ok() ? d->id : 0);
        ++taken;
      }
    });
    RingProducer p(ring.view());
    int pushed = 0, popped = 0, refused = 0;
    Descriptor d;
    d.sequences.resize(1);
    d.sequences[0].parents = {-1, 0};
    while (popped < kCount) {
      if (pushed < kCount) {
        d.id = ids[pushed];
        const absl::StatusOr<uint64_t> n = p.Push(d);
        if (n.ok()) {
          EXPECT_EQ(*n, static_cast<uint64_t>(pushed));
          ++pushed;
        } else {
          ASSERT_EQ(n.status().code(), absl::StatusCode::kResourceExhausted) << n.status();
          ++refused;
        }
      }
      Completion c;
      while (p.PopCompletion(&c)) {
        ASSERT_EQ(c.number, static_cast<uint64_t>(popped));
        EXPECT_EQ(c.descriptor_id, ids[popped]);
        EXPECT_EQ(c.committed_length, c.number * 7);
        EXPECT_EQ(c.code,
                  popped % 3 == 0 ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kOk);
        EXPECT_EQ(c.message, absl::StrCat("done ", popped));
        ++popped;
      }
      EXPECT_LE(p.in_flight(), entries);
    }
    consumer.join();
    EXPECT_TRUE(consumer_ok);
    EXPECT_EQ(ring.view().header().submit_tail.load(), static_cast<uint64_t>(kCount));
    EXPECT_GT(refused, 0) << "a ring of " << entries << " never filled";
  }
}

// Back-pressure: `entries` descriptors in flight fill the ring; reading one completion frees one
// place. The daemon does not take a descriptor whose completion slot is still unread.
TEST(RingTest, FullRingPushesBackUntilCompletionsAreRead) {
  AnonRing ring(4);
  RingProducer p(ring.view());
  RingConsumer c(ring.view());
  Descriptor d;
  d.sequences.resize(1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.Push(d).ok());
  const absl::StatusOr<uint64_t> full = p.Push(d);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("holds 4 descriptors"));
  EXPECT_EQ(ring.view().header().submit_tail.load(), 4u);  // nothing published by the refusal

  std::vector<uint8_t> copy(kDescriptorBytes);
  uint64_t n = 0;
  std::string why;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(c.TryTake(copy.data(), &n, &why), RingConsumer::Take::kTaken);
    Complete(ring.view(), n, 0);
  }
  EXPECT_EQ(c.TryTake(copy.data(), &n, &why), RingConsumer::Take::kEmpty);
  Completion done;
  ASSERT_TRUE(p.PopCompletion(&done));
  ASSERT_TRUE(p.Push(d).ok());
  EXPECT_EQ(p.Push(d).status().code(), absl::StatusCode::kResourceExhausted);

  // A client that publishes past its unread completions (ignoring the producer's check): the
  // daemon waits for the completion slot instead of overwriting an unread record.
  AnonRing raw(2);
  RingConsumer rc(raw.view());
  raw.view().header().submit_tail.store(2);
  ASSERT_EQ(rc.TryTake(copy.data(), &n, &why), RingConsumer::Take::kTaken);
  ASSERT_EQ(rc.TryTake(copy.data(), &n, &why), RingConsumer::Take::kTaken);
  Complete(raw.view(), 0, 0);
  Complete(raw.view(), 1, 0);
  raw.view().header().submit_tail.store(3);
  EXPECT_EQ(rc.TryTake(copy.data(), &n, &why), RingConsumer::Take::kCompletionsFull);
  raw.view().header().complete_head.store(1);
  EXPECT_EQ(rc.TryTake(copy.data(), &n, &why), RingConsumer::Take::kTaken);
  EXPECT_EQ(n, 2u);
}

// Indices the daemon never wrote or that jump past the ring are a corrupt ring (the channel is
// closed), never an out-of-bounds read.
TEST(RingTest, ImpossibleIndicesAreCorrupt) {
  std::vector<uint8_t> copy(kDescriptorBytes);
  uint64_t n = 0;
  std::string why;
  {
    AnonRing ring(4);
    RingConsumer c(ring.view());
    ring.view().header().submit_tail.store(5);
    EXPECT_EQ(c.TryTake(copy.data(), &n, &why), RingConsumer::Take::kCorrupt);
    EXPECT_THAT(why, HasSubstr("submit_tail = 5 is outside [0, 4]"));
  }
  {
    AnonRing ring(4);
    RingConsumer c(ring.view());
    ring.view().header().submit_tail.store(1);
    ASSERT_EQ(c.TryTake(copy.data(), &n, &why), RingConsumer::Take::kTaken);
    ring.view().header().submit_tail.store(0);  // went backwards
    EXPECT_EQ(c.TryTake(copy.data(), &n, &why), RingConsumer::Take::kCorrupt);
  }
  {
    AnonRing ring(4);
    RingConsumer c(ring.view());
    ring.view().header().complete_head.store(3);
    ring.view().header().submit_tail.store(1);
    EXPECT_EQ(c.TryTake(copy.data(), &n, &why), RingConsumer::Take::kCorrupt);
    EXPECT_THAT(why, HasSubstr("complete_head = 3 is past the 0 descriptors taken"));
  }
}

// A reader that died (or stopped): the writer fills the ring and gets RESOURCE_EXHAUSTED at once,
// never blocks; once the daemon closed the ring, FAILED_PRECONDITION with the reason.
TEST(RingTest, DeadReaderNeverBlocksTheWriter) {
  AnonRing ring(8);
  RingProducer p(ring.view());
  Descriptor d;
  d.sequences.resize(1);
  const auto start = std::chrono::steady_clock::now();
  int ok = 0;
  for (int i = 0; i < 100; ++i) ok += p.Push(d).ok();
  EXPECT_EQ(ok, 8);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  RingConsumer(ring.view()).Close(absl::StatusCode::kDeadlineExceeded);
  const absl::StatusOr<uint64_t> closed = p.Push(d);
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(closed.status().message(), HasSubstr("the channel is closed (DEADLINE_EXCEEDED)"));
}

// A writer process that dies half-way through a descriptor (bytes in the slot, tail not
// published) and is killed: the reader sees exactly the descriptors published before.
TEST(RingTest, WriterKilledMidDescriptorPublishesNothingHalfWritten) {
  const std::string name = absl::StrCat("/verifyd-ring-test-", getpid(), "-", Seed() % 100000);
  absl::StatusOr<RingMapping> created = CreateRingFile(name, 8);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(created->ClientGone()) << "no client attached yet: the lease decides";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<RingMapping> mine = OpenRingFile(name, 8);
    if (!mine.ok()) _exit(2);
    RingProducer p(mine->view());
    Descriptor d;
    d.sequences.resize(1);
    for (int i = 0; i < 3; ++i) {
      d.id = 100 + i;
      if (!p.Push(d).ok()) _exit(3);
    }
    // The fourth: its bytes, but never its tail.
    d.id = 103;
    (void)Encode(d, mine->view().descriptor_slot(3));
    for (;;) pause();  // killed here
  }
  // Wait for the three, then kill the writer.
  RingConsumer c(created->view());
  std::vector<uint8_t> copy(kDescriptorBytes);
  std::vector<uint64_t> ids;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ids.size() < 3 && std::chrono::steady_clock::now() < until) {
    uint64_t n = 0;
    std::string why;
    if (c.TryTake(copy.data(), &n, &why) == RingConsumer::Take::kTaken) {
      ids.push_back(PeekHeader(copy.data()).id);
    } else {
      c.Sleep(std::chrono::milliseconds(10));
    }
  }
  EXPECT_FALSE(created->ClientGone()) << "the writer lives and holds its lock";
  EXPECT_FALSE(created->ClientGone()) << "a test of the lock does not take it";
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(created->ClientGone()) << "the writer's lock ended with its process";
  EXPECT_EQ(ids, (std::vector<uint64_t>{100, 101, 102}));
  uint64_t n = 0;
  std::string why;
  EXPECT_EQ(c.TryTake(copy.data(), &n, &why), RingConsumer::Take::kEmpty);
  shm_unlink(name.c_str());
}

// The futex protocol across processes: a consumer asleep with a long timeout wakes within
// milliseconds of a push from another process; idle, it sleeps the whole timeout (no busy loop
// returns early).
TEST(RingTest, SleepingConsumerWakesOnAPushFromAnotherProcess) {
  AnonRing ring(4);
  RingConsumer c(ring.view());
  auto t0 = std::chrono::steady_clock::now();
  c.Sleep(std::chrono::milliseconds(50));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    RingProducer p(ring.view());
    Descriptor d;
    d.sequences.resize(1);
    _exit(p.Push(d).ok() ? 0 : 1);
  }
  t0 = std::chrono::steady_clock::now();
  while (!c.HasWork() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    c.Sleep(std::chrono::seconds(20));
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(c.HasWork());
  EXPECT_LT(waited, std::chrono::seconds(5)) << "the push did not wake the sleeper";
}

// The reverse direction: a client asleep waiting for a completion wakes within milliseconds of the
// record written by another process, and gives up after its timeout when none comes.
TEST(RingTest, WaitingProducerWakesOnACompletionFromAnotherProcess) {
  AnonRing ring(4);
  RingProducer p(ring.view());
  Descriptor d;
  d.sequences.resize(1);
  ASSERT_TRUE(p.Push(d).ok());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(p.WaitForCompletion(std::chrono::milliseconds(60)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(55));

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    RingConsumer c(ring.view());
    std::vector<uint8_t> copy(kDescriptorBytes);
    uint64_t n = 0;
    std::string why;
    if (c.TryTake(copy.data(), &n, &why) != RingConsumer::Take::kTaken) _exit(1);
    Complete(ring.view(), n, 77);
    _exit(0);
  }
  t0 = std::chrono::steady_clock::now();
  const bool woke = p.WaitForCompletion(std::chrono::seconds(20));
  const auto waited = std::chrono::steady_clock::now() - t0;
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(woke);
  EXPECT_GE(waited, std::chrono::milliseconds(150));
  EXPECT_LT(waited, std::chrono::seconds(5)) << "the record did not wake the waiting client";
  Completion c;
  ASSERT_TRUE(p.PopCompletion(&c));
  EXPECT_EQ(c.descriptor_id, 77u);
}

}  // namespace
}  // namespace verifyd::channel
