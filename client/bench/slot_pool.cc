#include "client/bench/slot_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flashq::bench {

SlotPlan PlanSlots(int64_t max_request_bytes, const std::vector<LoadPoint>& points, int max_outstanding) {
  SlotPlan p;
  int closed = 0;
  bool open = false;
  for (const auto& lp : points) {
    if (lp.mode == LoadPoint::Mode::kClosed) closed = std::max(closed, lp.concurrency);
    else open = true;
  }
  p.max = std::max({1, closed, open ? max_outstanding : 0});
  p.initial = std::max({1, closed, open ? std::min(max_outstanding, 4) : 0});
  // Room for each tensor's 64-byte alignment in the region.
  const int64_t bytes = std::max<int64_t>(max_request_bytes, 0) + 4096;
  p.slot_bytes = size_t(std::min<int64_t>(bytes, int64_t(SlotPlan::kMaxInitialSlotBytes)));
  return p;
}

SlotPool::SlotPool(RegionFactory& factory, int max_slots, size_t slot_bytes, std::string_view fill)
    : factory_(factory), slot_bytes_(std::max<size_t>(slot_bytes, 1)), fill_(fill), max_slots_(std::max(max_slots, 1)) {}

absl::StatusOr<std::unique_ptr<Region>> SlotPool::Make(size_t bytes) {
  auto region = factory_.Create(bytes);
  if (!region.ok() || fill_.empty()) return region;
  for (size_t at = 0; at < (*region)->size(); at += fill_.size()) {
    const std::string_view piece = std::string_view(fill_).substr(0, (*region)->size() - at);
    if (absl::Status s = (*region)->Write(at, piece); !s.ok()) return s;
  }
  return region;
}

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Create(RegionFactory& factory, int initial_slots, int max_slots,
                                                           size_t slot_bytes, std::string_view fill) {
  std::unique_ptr<SlotPool> pool(new SlotPool(factory, std::max(max_slots, initial_slots), slot_bytes, fill));
  for (int i = 0; i < std::max(initial_slots, 1); ++i) {
    auto region = pool->Make(pool->slot_bytes_);
    if (!region.ok()) {
      if (i == 0) return region.status();
      pool->max_slots_ = i;
      pool->note_ = absl::StrCat("kept ", i, " shared-memory slots: ", region.status().message());
      break;
    }
    pool->all_.push_back(std::make_unique<Slot>(Slot{std::move(*region)}));
    pool->free_.push_back(pool->all_.back().get());
    pool->made_++;
  }
  pool->thread_ = std::thread([p = pool.get()] { p->Loop(); });
  return pool;
}

SlotPool::~SlotPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  all_.clear();  // unregisters the regions and frees their memory
  retired_.clear();
}

int SlotPool::slots() const {
  std::lock_guard<std::mutex> l(mu_);
  return int(all_.size());
}

std::string SlotPool::note() const {
  std::lock_guard<std::mutex> l(mu_);
  return note_;
}

SlotPool::Slot* SlotPool::Dispatch(Waiter& w, bool* run_now) {
  *run_now = false;
  auto fits = std::find_if(free_.begin(), free_.end(), [&](Slot* s) { return s->region->size() >= w.bytes; });
  if (fits != free_.end()) {
    Slot* s = *fits;
    free_.erase(fits);
    *run_now = true;
    return s;
  }
  if (!free_.empty()) {  // every free slot is too small: grow the largest
    auto largest = std::max_element(free_.begin(), free_.end(),
                                    [](Slot* a, Slot* b) { return a->region->size() < b->region->size(); });
    Slot* s = *largest;
    free_.erase(largest);
    tasks_.push_back({Task::Kind::kGrow, s, std::move(w)});
  } else if (made_ < max_slots_) {
    made_++;
    tasks_.push_back({Task::Kind::kMake, nullptr, std::move(w)});
  } else {
    waiting_.push_back(std::move(w));
    return nullptr;
  }
  cv_.notify_all();
  return nullptr;
}

void SlotPool::Acquire(size_t bytes, Job job) {
  Waiter w{bytes, std::move(job)};
  bool run_now = false;
  Slot* s = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    s = Dispatch(w, &run_now);
  }
  if (run_now) w.job(s, absl::OkStatus());
}

void SlotPool::Release(Slot* slot) {
  Waiter w;
  bool run_now = false;
  Slot* s = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(slot);
    if (waiting_.empty()) return;
    w = std::move(waiting_.front());
    waiting_.pop_front();
    s = Dispatch(w, &run_now);
  }
  if (run_now) w.job(s, absl::OkStatus());
}

void SlotPool::Retire(Slot* slot) {
  {
    std::lock_guard<std::mutex> l(mu_);
    tasks_.push_back({Task::Kind::kRetire, slot, {}});
  }
  cv_.notify_all();
}

void SlotPool::RetireNow(Slot* slot) {
  slot->region->Unregister();
  Waiter w;
  bool run_now = false;
  Slot* s = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    retired_.push_back(std::move(slot->region));
    all_.erase(std::find_if(all_.begin(), all_.end(), [&](const auto& p) { return p.get() == slot; }));
    made_--;
    if (waiting_.empty()) return;
    w = std::move(waiting_.front());
    waiting_.pop_front();
    s = Dispatch(w, &run_now);  // makes a slot in the retired one's place
  }
  if (run_now) w.job(s, absl::OkStatus());
}

void SlotPool::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;
    Task t = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    RunTask(std::move(t));
    lk.lock();
  }
}

void SlotPool::RunTask(Task t) {
  if (t.kind == Task::Kind::kRetire) {
    RetireNow(t.slot);
    return;
  }
  Waiter& w = t.waiter;
  size_t bytes = std::max(w.bytes, slot_bytes_);
  if (t.slot) {
    bytes = std::max(w.bytes, 2 * t.slot->region->size());
    t.slot->region.reset();  // its registration goes before the larger one's
  }
  auto region = Make(bytes);
  if (region.ok()) {
    Slot* s = t.slot;
    if (!s) {
      std::lock_guard<std::mutex> l(mu_);
      all_.push_back(std::make_unique<Slot>());
      s = all_.back().get();
    }
    s->region = std::move(*region);
    w.job(s, absl::OkStatus());
    return;
  }
  const absl::Status error = region.status();
  bool run_now = false;
  Slot* s = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    made_--;
    if (t.slot) {  // the slot lost its region: drop it
      all_.erase(std::find_if(all_.begin(), all_.end(), [&](const auto& p) { return p.get() == t.slot; }));
      note_ = absl::StrCat("a shared-memory slot could not grow to ", bytes, " bytes: ", error.message());
    } else if (made_ > 0) {
      // Others exist: stop making slots and let this request wait for one of them.
      max_slots_ = made_;
      note_ = absl::StrCat("kept ", made_, " shared-memory slots: ", error.message());
      s = Dispatch(w, &run_now);
      if (!run_now) return;
    }
  }
  if (run_now) w.job(s, absl::OkStatus());
  else w.job(nullptr, error);
}

}  // namespace flashq::bench
