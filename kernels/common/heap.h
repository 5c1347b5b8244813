// Heap policy for processes that move tensors of megabytes (the server and our load tools).
//
// A model's first large request runs on gRPC and scheduler threads that have not held a tensor
// yet. With glibc's allocator each such thread has its own arena, whose pages fault in on first
// touch: on the H200 a 512-token attention request's first call spent ~7 ms in the server against
// ~2.8 ms later (bench/results/server-e2e-h200-2026-11-22-r2.md), and one arena for all threads
// (MALLOC_ARENA_MAX=1) closed that gap but cost 20-35% of throughput at concurrency 64-256.
// These programs therefore link tcmalloc where the build finds it (FLASHQ_TCMALLOC, the default):
// blocks above 256 KB come from one page heap shared by all threads, so pages touched once serve
// every later tensor whatever thread allocates it. Locally (CPU backend) the first 512-token request
// faulted ~8000 pages in the server with glibc and ~50 with tcmalloc; later ones ~0 either way.
// Both allocators keep freed memory (release rate 0; glibc: trim threshold 512 MB, buffers below
// 32 MB from the heap) and get 64 MB touched once at start-up.
#pragma once

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(FLASHQ_TCMALLOC)
#include <gperftools/malloc_extension.h>
#endif

namespace flashq {

// The allocator these programs run on, for their start-up log.
inline const char* HeapAllocatorName() {
#if defined(FLASHQ_TCMALLOC)
  return "tcmalloc";
#else
  return "glibc malloc";
#endif
}

// Call first thing in main, before any other thread exists.
inline void ConfigureHeapForTensors() {
#if defined(FLASHQ_TCMALLOC)
  MallocExtension::instance()->SetMemoryReleaseRate(0.0);
#else
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
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
