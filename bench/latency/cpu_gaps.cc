// The machine's own noise floor for microsecond calls: one thread pinned to each CPU reads the
// clock in a loop for a few seconds and counts the gaps between two reads (time the thread did
// not run: interrupts, the scheduler tick, other tasks, the host taking the vCPU).
//
//   g++ -O2 -o /tmp/cpu_gaps bench/latency/cpu_gaps.cc -lpthread && /tmp/cpu_gaps 5
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

struct Gaps {
  // over 2 us: [2, 5), [5, 10), [10, 20), [20, 50), [50, 100) us, [0.1, 1) ms, over 1 ms
  long count[7] = {};
  double lostMs = 0;
  long preempted = 0;  // involuntary context switches of the thread
};

Gaps spin(int cpu, double seconds) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  using Clock = std::chrono::steady_clock;
  Gaps g;
  auto prev = Clock::now();
  const auto end = prev + std::chrono::duration<double>(seconds);
  while (prev < end) {
    const auto now = Clock::now();
    const double us = std::chrono::duration<double, std::micro>(now - prev).count();
    prev = now;
    if (us < 2) continue;
    const int bucket = us < 5 ? 0 : us < 10 ? 1 : us < 20 ? 2 : us < 50 ? 3 : us < 100 ? 4
                     : us < 1000 ? 5 : 6;
    ++g.count[bucket];
    g.lostMs += us / 1000;
  }
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  g.preempted = ru.ru_nivcsw;
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 5;
  cpu_set_t mine;
  sched_getaffinity(0, sizeof(mine), &mine);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) cpus.push_back(c);
  }
  std::vector<Gaps> gaps(cpus.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cpus.size(); ++i) {
    threads.emplace_back([&, i] { gaps[i] = spin(cpus[i], seconds); });
  }
  for (auto& t : threads) t.join();
  std::printf("gaps between two clock reads of a thread spinning alone on each CPU, %.1f s:\n",
              seconds);
  std::printf("cpu   2-5us  5-10us  10-20us  20-50us  50-100us  0.1-1ms  >1ms   lost(ms)  "
              "preempted\n");
  for (size_t i = 0; i < cpus.size(); ++i) {
    const Gaps& g = gaps[i];
    std::printf("%3d %7ld %7ld %8ld %8ld %9ld %8ld %5ld %10.1f %10ld\n", cpus[i], g.count[0],
                g.count[1], g.count[2], g.count[3], g.count[4], g.count[5], g.count[6], g.lostMs,
                g.preempted);
  }
  return 0;
}
