#include "kernels/cpu/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace qforge {
namespace {

// Every task runs exactly once, on a slot below the thread count, whatever the counts.
TEST(TaskPool, EveryTaskRunsOnceOnASlotBelowTheThreadCount) {
  for (const int threads : {1, 2, 3, 8}) {
    for (const int64_t n : {1, 2, 7, 1000, 20000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      std::atomic<int> bad_slot{0};
      run_tasks(threads, n, [&](int64_t t, int slot) {
        runs[static_cast<size_t>(t)].fetch_add(1);
        if (slot < 0 || slot >= threads) bad_slot.fetch_add(1);
      });
      for (int64_t t = 0; t < n; ++t) {
        ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1)
            << "task " << t << " of " << n << " at " << threads << " threads";
      }
      EXPECT_EQ(bad_slot.load(), 0);
    }
  }
  run_tasks(4, 0, [](int64_t, int) { FAIL() << "no task to run"; });
}

// The workers take part: with tasks that each take 2 ms, a worker wakes long before the caller
// could finish them all (a 400 ms window), and runs some (from the back: the last task is its).
TEST(TaskPool, WorkersTakeTasksFromTheBack) {
  constexpr int64_t n = 200;
  std::vector<int> slot_of(n, -1);
  run_tasks(2, n, [&](int64_t t, int slot) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    slot_of[static_cast<size_t>(t)] = slot;
  });
  EXPECT_EQ(slot_of.front(), 0) << "the caller claims from the front";
  EXPECT_EQ(slot_of.back(), 1) << "a worker claims from the back";
  // Each slot's tasks are one contiguous range.
  int changes = 0;
  for (size_t t = 1; t < n; ++t) changes += slot_of[t] != slot_of[t - 1] ? 1 : 0;
  EXPECT_EQ(changes, 1);
}

// A task that throws: the other tasks still run, and the caller gets the exception.
TEST(TaskPool, ATaskThatThrowsIsRethrownAfterTheOthersRan) {
  std::atomic<int> ran{0};
  EXPECT_THROW(run_tasks(3, 100,
                         [&](int64_t t, int) {
                           ran.fetch_add(1);
                           if (t == 37) throw std::runtime_error("task 37");
                         }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 100);
  // The pool still works afterwards.
  std::atomic<int> again{0};
  run_tasks(3, 50, [&](int64_t, int) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 50);
}

// A call from inside a task runs its tasks on that task's thread, as slot 0, as a nested
// OpenMP region would (no pool per worker, no thread explosion).
TEST(TaskPool, NestedCallsRunOnTheTasksOwnThread) {
  std::atomic<int> inner{0}, elsewhere{0};
  run_tasks(2, 8, [&](int64_t, int) {
    const std::thread::id self = std::this_thread::get_id();
    run_tasks(4, 16, [&](int64_t, int slot) {
      inner.fetch_add(1);
      if (slot != 0 || std::this_thread::get_id() != self) elsewhere.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 8 * 16);
  EXPECT_EQ(elsewhere.load(), 0);
}

// Several threads each run their own jobs at once (each has its own pool).
TEST(TaskPool, CallersOnSeveralThreadsAtOnce) {
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(4, 0);
  for (size_t c = 0; c < sums.size(); ++c) {
    callers.emplace_back([&sums, c] {
      for (int round = 0; round < 50; ++round) {
        std::vector<int64_t> out(300, 0);
        run_tasks(2, 300, [&](int64_t t, int) { out[static_cast<size_t>(t)] = t; });
        for (int64_t v : out) sums[c] += v;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, 50 * (299 * 300 / 2));
}

}  // namespace
}  // namespace qforge
