// The client slots of --shared-memory. A slot holds one Region, made once and then
// reused by one request at a time, so that request bytes are written into memory the
// server has already mapped.
//
// Acquire() never blocks: it runs its job at once with a free slot, or later, from the
// Release() of another request or from the pool's own thread. That thread makes new
// slots and grows a slot whose region is too small for a request; both register
// regions through RPCs, which must not run on a gRPC completion thread. Slots are made
// up to `max_slots`; past that, or once making one fails (the server's region limit, a
// full /dev/shm) while others exist, requests wait for a free slot.
//
// A slot whose call ended without an answer from the server (the client's deadline, a
// cancel, a broken connection) may still be read and written by the server: Retire()
// takes it out of use. Its region is unregistered at once, but its memory is kept until
// the pool is destroyed, and a new slot replaces it when one is needed.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "client/bench/runner.h"
#include "client/bench/shm_region.h"

namespace flashq::bench {

// The slots a scenario's load points need. Closed loop: one per request kept
// outstanding, all made up front. Open loop: made as the load needs them, up to
// --max-outstanding. A slot holds the largest request that the workload's
// distributions allow, but starts at most at kMaxInitialSlotBytes (an unbounded
// distribution allows any size); a larger request grows its slot.
struct SlotPlan {
  static constexpr size_t kMaxInitialSlotBytes = size_t(64) << 20;
  int initial = 1, max = 1;
  size_t slot_bytes = 0;
};
SlotPlan PlanSlots(int64_t max_request_bytes, const std::vector<LoadPoint>& points, int max_outstanding);

class SlotPool {
 public:
  struct Slot {
    std::unique_ptr<Region> region;
  };
  // Runs with a slot of at least the bytes asked for, which the job must Release();
  // or with nullptr and the reason when no slot can hold the request.
  using Job = std::function<void(Slot*, const absl::Status&)>;

  // Makes `initial_slots` slots of `slot_bytes` now; fails if it cannot make one. Every
  // region made (or grown) is filled with `fill` repeated, once: the resident inputs.
  static absl::StatusOr<std::unique_ptr<SlotPool>> Create(RegionFactory& factory, int initial_slots, int max_slots,
                                                          size_t slot_bytes, std::string_view fill = {});
  // Every slot must have been released. Destroys the regions (unregistering them).
  ~SlotPool();

  void Acquire(size_t bytes, Job job);
  void Release(Slot* slot);
  void Retire(Slot* slot);

  int slots() const;
  // Why the pool stopped making slots below max_slots, or empty.
  std::string note() const;

 private:
  struct Waiter {
    size_t bytes;
    Job job;
  };
  struct Task {
    enum class Kind { kMake, kGrow, kRetire };
    Kind kind;
    Slot* slot;     // kGrow, kRetire
    Waiter waiter;  // kMake, kGrow
  };
  SlotPool(RegionFactory& factory, int max_slots, size_t slot_bytes, std::string_view fill);
  // A region of `bytes` from the factory, filled.
  absl::StatusOr<std::unique_ptr<Region>> Make(size_t bytes);
  // Under mu_: hands `w` a free slot (returned, to run outside the lock), or queues it.
  Slot* Dispatch(Waiter& w, bool* run_now);
  void Loop();
  void RunTask(Task t);
  void RetireNow(Slot* slot);

  RegionFactory& factory_;
  const size_t slot_bytes_;
  const std::string fill_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int max_slots_;
  int made_ = 0;  // slots made or being made
  std::string note_;
  std::vector<std::unique_ptr<Slot>> all_;
  std::vector<std::unique_ptr<Region>> retired_;  // unregistered; freed with the pool
  std::vector<Slot*> free_;
  std::deque<Waiter> waiting_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace flashq::bench
