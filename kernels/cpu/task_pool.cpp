#include "kernels/cpu/task_pool.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qforge::detail {

namespace {

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

std::atomic<int> live_workers{0};  // in every pool of the process

// How long a worker spins for the next job before it sleeps (OMP_WAIT_POLICY, as OpenMP reads
// it): passive 0, active 2 ms, anything else 100 us; 0 whenever the pools' workers and one
// caller outnumber the CPUs (several threads of one process, each running its own executor: a
// spinning worker would take a CPU another thread needs; OpenMP also stops spinning when its
// threads outnumber the CPUs).
std::chrono::microseconds worker_spin() {
  static const std::chrono::microseconds spin = [] {
    const char* env = std::getenv("OMP_WAIT_POLICY");
    const std::string_view policy = env != nullptr ? env : "";
    if (policy == "passive" || policy == "PASSIVE") return std::chrono::microseconds(0);
    if (policy == "active" || policy == "ACTIVE") return std::chrono::microseconds(2000);
    return std::chrono::microseconds(100);
  }();
  static const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (live_workers.load(std::memory_order_relaxed) + 1 > cpus) return {};
  return spin;
}

struct Job {
  void (*call)(void*, int64_t, int) = nullptr;
  void* fn = nullptr;
  // The tasks not claimed yet, [front, back): front in the low 32 bits, back in the high. The
  // caller claims from the front and workers from the back, so with one worker each thread runs
  // a contiguous range of tasks, as a static schedule gives (neighbouring tasks share inputs).
  std::atomic<uint64_t> range{0};
  std::atomic<int64_t> running{0};  // claimed tasks not finished
  std::atomic<int> holders{0};      // workers that may still read this job
  std::mutex error_mutex;
  std::exception_ptr error;
};

thread_local bool in_task = false;  // this thread is running a task: nested calls run here

// Claims one task (the caller from the front, a worker from the back), or -1 when none is left.
int64_t claim(Job& job, bool front) {
  uint64_t r = job.range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t lo = r & 0xffffffffu, hi = r >> 32;
    if (lo >= hi) return -1;
    const uint64_t next = front ? r + 1 : r - (uint64_t{1} << 32);
    if (job.range.compare_exchange_weak(r, next, std::memory_order_relaxed)) {
      return static_cast<int64_t>(front ? lo : hi - 1);
    }
  }
}

// Claims and runs tasks until none is left.
void work(Job& job, int slot) {
  in_task = true;
  for (;;) {
    job.running.fetch_add(1, std::memory_order_relaxed);
    const int64_t t = claim(job, slot == 0);
    if (t < 0) {
      job.running.fetch_sub(1, std::memory_order_release);
      break;
    }
    try {
      job.call(job.fn, t, slot);
    } catch (...) {
      const std::lock_guard lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
    }
    job.running.fetch_sub(1, std::memory_order_release);
  }
  in_task = false;
}

class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void run(int threads, Job& job) {
    const int helpers = threads - 1;
    while (static_cast<int>(workers_.size()) < helpers) {
      // The generation it has seen is the one before this job's (only this thread moves it).
      const int slot = static_cast<int>(workers_.size()) + 1;
      const uint64_t seen = generation_.load(std::memory_order_relaxed);
      workers_.emplace_back([this, slot, seen] {
        live_workers.fetch_add(1, std::memory_order_relaxed);
        loop(slot, seen);
        live_workers.fetch_sub(1, std::memory_order_relaxed);
      });
    }
    bool notify = false;
    {
      const std::lock_guard lock(mutex_);
      job_ = &job;
      helpers_ = helpers;
      generation_.fetch_add(1, std::memory_order_release);
      notify = sleepers_ > 0;
    }
    if (notify) wake_.notify_all();
    work(job, 0);
    {
      const std::lock_guard lock(mutex_);
      job_ = nullptr;  // a worker that wakes from now on finds nothing to do
    }
    // What is left: tasks the workers are running, and workers leaving the job.
    for (int spins = 0; job.running.load(std::memory_order_acquire) > 0 ||
                        job.holders.load(std::memory_order_acquire) > 0;
         ++spins) {
      if (spins < 4096) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  void loop(int slot, uint64_t seen) {
    for (;;) {
      // Spin for the next job a while, then sleep.
      const auto until = std::chrono::steady_clock::now() + worker_spin();
      for (int i = 0; generation_.load(std::memory_order_acquire) == seen; ++i) {
        if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
        cpu_relax();
      }
      Job* job = nullptr;
      {
        std::unique_lock lock(mutex_);
        ++sleepers_;
        wake_.wait(lock, [&] {
          return stop_ || generation_.load(std::memory_order_relaxed) != seen;
        });
        --sleepers_;
        if (stop_) return;
        seen = generation_.load(std::memory_order_relaxed);
        if (job_ == nullptr || slot > helpers_) continue;
        job = job_;
        job->holders.fetch_add(1, std::memory_order_relaxed);
      }
      work(*job, slot);
      job->holders.fetch_sub(1, std::memory_order_release);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;  // slots 1, 2, ...
  std::atomic<uint64_t> generation_{0};
  Job* job_ = nullptr;
  int helpers_ = 0;
  int sleepers_ = 0;
  bool stop_ = false;
};

}  // namespace

void run_tasks(int threads, int64_t n, void (*call)(void*, int64_t, int), void* fn) {
  if (in_task || omp_in_parallel() || n > INT32_MAX) {
    for (int64_t t = 0; t < n; ++t) call(fn, t, 0);
    return;
  }
  thread_local Pool pool;
  Job job;
  job.call = call;
  job.fn = fn;
  job.range.store(static_cast<uint64_t>(n) << 32, std::memory_order_relaxed);
  pool.run(threads, job);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace qforge::detail
