// Heap policy for processes that move tensors of megabytes (the server and our load tools).
//
// A model's first large request runs on gRPC and scheduler threads that have not held a tensor
// yet. With glibc's allocator each such thread has its own arena, whose pages fault in on first
// touch: on the H200 a 512-token attention request's first call spent ~7 ms in the server against
// ~2.8 ms later (docs/perf/experiments.md, "Serving path"), and one arena for all threads
// (MALLOC_ARENA_MAX=1) closed that gap but cost 20-35% of throughput at concurrency 64-256.
// These programs therefore link tcmalloc where the build finds it (FLASHQ_TCMALLOC, the default):
// blocks above 256 KB come from one page heap shared by all threads, so pages touched once serve
// every later tensor whatever thread allocates it. Locally (CPU backend) the first 512-token request
// faulted ~8000 pages in the server with glibc and ~50 with tcmalloc; later ones ~0 either way.
//
// Neither allocator gives memory back on its own (tcmalloc release rate 0; glibc: trim threshold
// 512 MB, buffers below 32 MB from the heap), so no request pays for a trim or for faulting its
// pages in again, and 64 MB are touched once at start-up. The load tools keep it that way. A
// long-running server must still shrink after a burst, or one burst (say, clients that stop
// reading their answers) keeps its peak RSS for good: flashq-server runs an IdleHeapReleaser,
// which gives back free heap that stayed free through its whole window (~2 s), so not memory a
// steady load keeps reusing, above a warm reserve (--heap-reserve-mb, 64 MB) that stays mapped for
// the next tensors. Under glibc, malloc_trim cannot keep a reserve: once idle memory exceeds it,
// every free page goes.
// Measured (CPU backend, docs/reliability.md): RSS 244 MB after a burst, 92 MB 2.5 s later.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
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

inline constexpr size_t kHeapPrefaultBytes = size_t(64) << 20;

// Touches about `bytes` of heap in 4 MB blocks and frees them: the pages stay mapped, free.
inline void TouchFreeHeap(size_t bytes) {
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

// Call first thing in main, before any other thread exists.
inline void ConfigureHeapForTensors() {
#if defined(FLASHQ_TCMALLOC)
  MallocExtension::instance()->SetMemoryReleaseRate(0.0);
#else
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
  TouchFreeHeap(kHeapPrefaultBytes);
}

// Free memory the allocator holds mapped (could give back to the OS).
inline size_t FreeHeapBytes() {
#if defined(FLASHQ_TCMALLOC)
  size_t bytes = 0;
  MallocExtension::instance()->GetNumericProperty("tcmalloc.pageheap_free_bytes", &bytes);
  return bytes;
#else
  return mallinfo2().fordblks;
#endif
}

// Gives about `bytes` of free heap back to the OS, keeping `keep` (see the note above on glibc).
inline void ReleaseFreeHeap(size_t bytes, size_t keep) {
#if defined(FLASHQ_TCMALLOC)
  (void)keep;
  MallocExtension::instance()->ReleaseToSystem(bytes);
#else
  (void)bytes;
  malloc_trim(keep);
#endif
}

// A thread that samples the free heap every `period` and gives back what stayed free in each of
// the last `window` samples, above `reserve_bytes` (by default ~2 s, and the 64 MB touched at
// start-up). Start it after ConfigureHeapForTensors.
class IdleHeapReleaser {
 public:
  explicit IdleHeapReleaser(size_t reserve_bytes, std::chrono::milliseconds period = std::chrono::milliseconds(500),
                            int window = 5)
      : reserve_(reserve_bytes), period_(period), window_(std::max(1, window)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~IdleHeapReleaser() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  IdleHeapReleaser(const IdleHeapReleaser&) = delete;
  IdleHeapReleaser& operator=(const IdleHeapReleaser&) = delete;

 private:
  void Loop() {
    std::deque<size_t> samples;
    std::unique_lock<std::mutex> l(mu_);
    while (!cv_.wait_for(l, period_, [this] { return stop_; })) {
      samples.push_back(FreeHeapBytes());
      if (int(samples.size()) > window_) samples.pop_front();
      if (int(samples.size()) < window_) continue;
      const size_t idle = *std::min_element(samples.begin(), samples.end());
      if (idle <= reserve_ + kSlack) continue;
      ReleaseFreeHeap(idle - reserve_, reserve_);
#if defined(FLASHQ_TCMALLOC)
      // tcmalloc gives back whole free spans, so it may go below the reserve: touch the
      // shortfall again here rather than on a request's path.
      if (const size_t left = FreeHeapBytes(); left < reserve_) TouchFreeHeap(reserve_ - left);
#endif
      samples.clear();  // the next decision sees only what is free after this release
    }
  }

  // Idle memory this close to the reserve stays: releasing it would cost a refill each time.
  static constexpr size_t kSlack = size_t(16) << 20;

  const size_t reserve_;
  const std::chrono::milliseconds period_;
  const int window_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace flashq
