// DeviceExecutor: order, background steps between tasks, the tick, the queue bound, the drain.
#include "executor/device_executor.h"

#include <sched.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace verifyd {
namespace {

TEST(DeviceExecutorTest, RunsInOrderWithBackgroundStepsBetween) {
  std::vector<std::string> log;  // only the executor thread writes it
  int background_left = 3;
  ExecutorHooks hooks;
  hooks.background_step = [&] {
    log.push_back("bg");
    return --background_left > 0;
  };
  hooks.tick_period = absl::Hours(1);
  DeviceExecutor executor(hooks);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  // Queue everything while the first task holds the thread, so the interleaving is fixed.
  ASSERT_TRUE(executor
                  .Submit([&] {
                    open.wait();
                    log.push_back("t0");
                  })
                  .ok());
  executor.NotifyBackgroundWork();
  for (int i = 1; i < 3; ++i) {
    ASSERT_TRUE(executor.Submit([&, i] { log.push_back(absl::StrCat("t", i)); }).ok());
  }
  executor.Start();
  gate.set_value();
  std::atomic<bool> done{false};
  ASSERT_TRUE(executor.Submit([&] { done = true; }).ok());
  executor.Drain();
  EXPECT_TRUE(done);
  // One background step after each task while background work remains.
  EXPECT_THAT(log, ::testing::ElementsAre("t0", "bg", "t1", "bg", "t2", "bg"));
}

TEST(DeviceExecutorTest, TickRunsPeriodicallyAndAtDrain) {
  std::atomic<int> ticks{0};
  ExecutorHooks hooks;
  hooks.tick = [&] { ++ticks; };
  hooks.tick_period = absl::Milliseconds(5);
  DeviceExecutor executor(hooks);
  executor.Start();
  for (int i = 0; i < 400 && ticks < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GE(ticks.load(), 3);
  const int before = ticks;
  executor.Drain();
  EXPECT_GT(ticks.load(), before);
}

TEST(DeviceExecutorTest, QueueBoundAndDrain) {
  ExecutorHooks hooks;
  hooks.max_queued = 3;
  DeviceExecutor executor(hooks);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<int> ran{0};
  std::promise<void> started;
  ASSERT_TRUE(executor
                  .Submit([&] {
                    started.set_value();
                    open.wait();
                    ++ran;
                  })
                  .ok());
  executor.Start();
  started.get_future().wait();  // the first task left the queue
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(executor.Submit([&] { ++ran; }).ok());
  const absl::Status full = executor.Submit([&] { ++ran; });
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), ::testing::HasSubstr("--max-queued-requests"));
  gate.set_value();
  executor.Drain();
  EXPECT_EQ(ran.load(), 4) << "queued tasks run before the drain ends";
  EXPECT_EQ(executor.Submit([] {}).code(), absl::StatusCode::kUnavailable);
}

TEST(DeviceExecutorTest, SubmitFirstRunsAheadOfWaitingTasksRightAfterTheRunningOne) {
  ExecutorHooks hooks;
  hooks.tick_period = absl::Hours(1);
  hooks.max_queued = 8;
  DeviceExecutor executor(hooks);
  executor.Start();
  std::promise<void> gate, started;
  std::shared_future<void> open = gate.get_future().share();
  std::vector<int> order;  // written only by the executor thread
  ASSERT_TRUE(executor
                  .Submit([&] {
                    started.set_value();
                    open.wait();
                    order.push_back(0);
                  })
                  .ok());
  started.get_future().wait();
  // Random numbers of ordinary tasks, then one first-in-line task: it overtakes them all.
  std::mt19937 rng(20261201);
  const int waiting = 1 + static_cast<int>(rng() % 6);
  for (int i = 1; i <= waiting; ++i) {
    ASSERT_TRUE(executor.Submit([&order, i] { order.push_back(i); }).ok());
  }
  ASSERT_TRUE(executor.SubmitFirst([&] { order.push_back(-1); }).ok());
  // The queue bound counts it like any task.
  while (executor.Submit([] {}).ok()) {
  }
  EXPECT_EQ(executor.SubmitFirst([] {}).code(), absl::StatusCode::kResourceExhausted);
  gate.set_value();
  executor.Drain();
  ASSERT_GE(order.size(), 3u);
  EXPECT_EQ(order[0], 0);
  EXPECT_EQ(order[1], -1);
  for (int i = 1; i <= waiting; ++i) EXPECT_EQ(order[1 + i], i);
  EXPECT_EQ(executor.SubmitFirst([] {}).code(), absl::StatusCode::kUnavailable);
}

TEST(DeviceExecutorTest, SpinningThreadRunsTasksQueuedDuringTheWindowAndAfterIt) {
  ExecutorHooks hooks;
  hooks.tick_period = absl::Hours(1);
  hooks.spin = absl::Milliseconds(5);
  DeviceExecutor executor(hooks);
  executor.Start();
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) {
    std::promise<void> done;
    ASSERT_TRUE(executor
                    .Submit([&] {
                      ++ran;
                      done.set_value();
                    })
                    .ok());
    done.get_future().wait();
    // Inside the spin window for most tasks, past it (the thread asleep) for every fifth.
    if (i % 5 == 4) std::this_thread::sleep_for(std::chrono::milliseconds(8));
  }
  const absl::Time drain_start = absl::Now();
  executor.Drain();
  EXPECT_EQ(ran.load(), 20);
  EXPECT_LT(absl::Now() - drain_start, absl::Seconds(1)) << "the spin must not hold up the drain";
  EXPECT_EQ(ExecutorSpinMicros(0), 0);
  EXPECT_EQ(ExecutorSpinMicros(750), 750);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  EXPECT_EQ(ExecutorSpinMicros(-1), CPU_COUNT(&cpus) >= 8 ? 2000 : 0);
}

TEST(DeviceExecutorTest, SpinWindowNeverDelaysBackgroundSteps) {
  // A compaction's chunks follow each other at once: a spin window between them would leave the
  // device idle (and the operation's throughput overstated, plans/0012).
  std::atomic<int> steps{0};
  std::promise<void> finished;
  ExecutorHooks hooks;
  hooks.tick_period = absl::Hours(1);
  hooks.spin = absl::Milliseconds(300);
  hooks.background_step = [&] {
    if (++steps == 10) finished.set_value();
    return steps < 10;
  };
  DeviceExecutor executor(hooks);
  executor.Start();
  ASSERT_TRUE(executor.Submit([] {}).ok());  // the thread is now inside a spin window
  const absl::Time start = absl::Now();
  executor.NotifyBackgroundWork();
  finished.get_future().wait();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(600)) << "10 steps waited out spin windows";
  executor.Drain();
}

}  // namespace
}  // namespace verifyd
