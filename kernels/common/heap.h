// Heap policy for processes that move tensors of megabytes (the server and our load
// tools): one malloc arena, buffers below 32 MB from the heap, freed memory kept, and
// that heap touched once at start-up.
//
// Why: glibc gives every thread its own arena, and a buffer's first use in an arena
// faults in fresh pages. A model's first request ran on worker threads whose arenas
// had never held a tensor, so it paid ~5,000 page faults the steady state does not
// (H200, 512-token attention: first request 3.3x the steady p50 with per-thread
// arenas, 2.0x with one arena; bench/results/server-e2e-h200-2026-11-22-r2.md).
#pragma once

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace flashq {

// Call first thing in main, before any thread exists.
inline void ConfigureHeapForTensors(size_t prefault_bytes = size_t(64) << 20) {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  constexpr size_t kBlock = size_t(4) << 20;
  std::vector<void*> blocks;
  for (size_t done = 0; done < prefault_bytes; done += kBlock) {
    void* p = std::malloc(kBlock);
    if (!p) break;
    std::memset(p, 0, kBlock);
    blocks.push_back(p);
  }
  for (void* p : blocks) std::free(p);
}

}  // namespace flashq
