#pragma once
// The runtime's parallel loops (runtime/op_utils.h parallel_chunks, the packed and tiled
// products, the calibration observers' ranges and histograms) share their tasks between the
// calling thread and up to threads - 1 workers of a pool that the calling thread owns.
//
// Why not an OpenMP region: a region ends at a barrier that waits for every thread of the team,
// so each one costs the caller the time a sleeping worker takes to wake. With passive waits
// (OMP_WAIT_POLICY=passive, or any wait longer than the spin) that is a futex round trip per op,
// and on a 2-core machine MiniLM ran slower on two threads than on one. Here the caller claims
// tasks from a shared counter as the workers do, and never waits for a worker that has not
// started: one that wakes late finds the tasks taken. The caller waits only for tasks already
// running.
//
// Which thread runs a task follows timing, so callers give every task its own outputs (or, with
// the slot, its own scratch) and combine them in a fixed order: the bits never depend on it.
//
// Workers wait for the next job as OpenMP's do, by OMP_WAIT_POLICY: passive sleeps at once;
// active spins up to 2 ms before sleeping; unset (the default) spins up to 100 us. None spins
// while the workers of all pools and a caller outnumber the CPUs.
// A call from inside a pool task or an OpenMP parallel region runs its tasks on the calling
// thread alone, as a nested OpenMP region would.
#include <cstdint>
#include <memory>
#include <type_traits>

namespace qforge {

// Products (sgemm tiles, the packed and lane products) of fewer multiply-adds than this in all
// run on the calling thread: waking a worker costs more than it saves.
inline constexpr double kSerialBelowMacs = 2.0 * (1 << 20);

namespace detail {
void run_tasks(int threads, int64_t n, void (*call)(void*, int64_t, int), void* fn);
}  // namespace detail

// Calls fn(t, slot) once for each t in [0, n), on the calling thread and up to threads - 1
// workers; `slot` in [0, threads) names the thread that runs the task (the caller is slot 0), for
// per-thread scratch. Returns when every task has finished; rethrows the first exception a task
// threw (the other tasks still run).
template <typename F>
void run_tasks(int threads, int64_t n, F&& fn) {
  if (n <= 0) return;
  if (threads <= 1 || n == 1) {
    for (int64_t t = 0; t < n; ++t) fn(t, 0);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  const auto call = [](void* f, int64_t t, int slot) { (*static_cast<Fn*>(f))(t, slot); };
  detail::run_tasks(threads, n, call,
                    const_cast<void*>(static_cast<const volatile void*>(std::addressof(fn))));
}

}  // namespace qforge
