// Heap policy for processes that move tensors of megabytes (the server and our load
// tools): buffers below 32 MB come from the heap rather than fresh mmaps, freed memory
// stays in the heap, and the main arena is touched once at start-up.
//
// glibc still gives threads their own arenas, and a model's first large request runs
// on threads whose arenas have not held a tensor: on the H200 a 512-token attention
// request's first call spent ~7 ms in the server against ~2.8 ms later. With one arena
// (MALLOC_ARENA_MAX=1 in the environment) that gap closes, but lock contention cost
// 20-35% of throughput at concurrency 64-256, so it is an option, not the default.
// Pre-faulting every arena did not close the gap. Figures:
// bench/results/server-e2e-h200-2026-11-22-r2.md.
#pragma once

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace flashq {

// Call first thing in main, before any other thread exists.
inline void ConfigureHeapForTensors() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  constexpr size_t kBlock = size_t(4) << 20, kPrefault = size_t(64) << 20;
  std::vector<void*> blocks;
  for (size_t done = 0; done < kPrefault; done += kBlock) {
    void* p = std::malloc(kBlock);
    if (!p) break;
    std::memset(p, 0, kBlock);
    blocks.push_back(p);
  }
  for (void* p : blocks) std::free(p);
}

}  // namespace flashq
