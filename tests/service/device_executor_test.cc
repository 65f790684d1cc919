// DeviceExecutor: order, background steps between tasks, the tick, the queue bound, the drain.
#include "service/device_executor.h"

#include <atomic>
#include <future>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace verifyd
