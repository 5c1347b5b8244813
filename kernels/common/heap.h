// Heap policy for processes that move tensors of megabytes (the server and our load
// tools): buffers below 32 MB come from the heap, freed memory stays there, and the
// heap of every thread that handles tensors is touched once before the first request.
//
// Why: glibc gives threads their own arenas, and a buffer's first use in an arena
// faults in fresh pages. A model's first request ran on worker threads whose arenas
// had never held a tensor and paid ~5,000 page faults that the steady state does not
// (H200, 512-token attention: first request 3.3x the steady p50).
//
// MALLOC_ARENA_MAX=N in the environment sets the number of arenas (glibc's default is
// 8 per core); FLASHQ_PREFAULT_MB the bytes touched per thread (default 64).
#pragma once

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace flashq {

inline size_t PrefaultBytes() {
  const char* e = std::getenv("FLASHQ_PREFAULT_MB");
  return (e ? size_t(std::atoll(e)) : 64) << 20;
}

// Touches `bytes` of the calling thread's arena and gives them back to it.
inline void PrefaultThreadHeap(size_t bytes = PrefaultBytes()) {
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

// Call first thing in main, before any thread exists.
inline void ConfigureHeapForTensors() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  PrefaultThreadHeap();
}

}  // namespace flashq
