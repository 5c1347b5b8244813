// Heap policy for processes that move tensors of megabytes (the server and our load
// tools): buffers below 32 MB come from the heap, freed memory stays there, and every
// malloc arena the process will use is touched once before the first request.
//
// Why: glibc gives threads their own arenas, and a buffer's first use in an arena
// faults in fresh pages. A model's first request ran on threads (gRPC's and the
// scheduler's) whose arenas had never held a tensor, and paid thousands of page faults
// that the steady state does not: on the H200, a 512-token attention request's first
// call took 2.4-3.3x the steady p50. One shared arena fixed that but cost up to 30% of
// throughput at concurrency 256 (lock contention); a fixed set of arenas, all warmed
// here, keeps both (bench/results/server-e2e-h200-2026-11-22-r2.md).
//
// FLASHQ_MALLOC_ARENAS and FLASHQ_PREFAULT_MB (per arena) override the defaults.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace flashq {

// Touches `bytes` of the calling thread's arena and gives them back to it.
inline void PrefaultThreadHeap(size_t bytes) {
  constexpr size_t kBlock = size_t(4) << 20;
  std::vector<void*> blocks;
  for (size_t done = 0; done < bytes; done += kBlock) {
    void* p = std::malloc(kBlock);
    if (!p) break;
    std::memset(p, 0, kBlock);
    blocks.push_back(p);
  }
  for (void* p : blocks) std::free(p);
}

// Call first thing in main, before any other thread exists: each helper thread below
// creates one arena, warms it and exits, leaving it on glibc's free list, from which
// later threads take warm arenas before sharing them round-robin.
inline void ConfigureHeapForTensors() {
  auto env = [](const char* name, long fallback) {
    const char* e = std::getenv(name);
    return e ? std::atol(e) : fallback;
  };
  const int arenas = int(std::max(1L, env("FLASHQ_MALLOC_ARENAS", std::max(8L, long(std::thread::hardware_concurrency())))));
  const size_t bytes = size_t(std::max(0L, env("FLASHQ_PREFAULT_MB", 32))) << 20;
  mallopt(M_ARENA_MAX, arenas);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  PrefaultThreadHeap(bytes);  // the main arena
  std::vector<std::thread> warmers;
  for (int i = 1; i < arenas; ++i) warmers.emplace_back([bytes] { PrefaultThreadHeap(bytes); });
  for (auto& t : warmers) t.join();
}

}  // namespace flashq
