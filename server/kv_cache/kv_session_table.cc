#include "server/kv_cache/kv_session_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flashq::server {

KvSessionTable::KvSessionTable(int num_blocks, int page_size, int64_t max_tokens_per_sequence,
                               std::chrono::microseconds idle_timeout)
    : num_blocks_(std::max(num_blocks, 0)),
      page_size_(std::max(page_size, 1)),
      max_tokens_(max_tokens_per_sequence),
      idle_timeout_(idle_timeout) {
  free_.reserve(num_blocks_);
  for (int b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);  // block 0 is handed out first
}

absl::StatusOr<KvReservation> KvSessionTable::Reserve(const std::string& sequence_id, bool start, bool end,
                                                      int new_tokens, Clock::time_point now) {
  if (new_tokens < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", sequence_id, ": negative number of new tokens (", new_tokens, ")"));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(sequence_id);
  const Sequence* seq = nullptr;
  if (start) {
    if (it != live_.end())
      return absl::AlreadyExistsError(absl::StrCat(
          "sequence ", sequence_id, " is already active (", it->second.reserved,
          " tokens cached); send sequence_end to finish it before starting it again"));
  } else {
    if (it == live_.end()) {
      auto ab = aborted_.find(sequence_id);
      if (ab != aborted_.end())
        return absl::FailedPreconditionError(absl::StrCat("sequence ", sequence_id,
                                                          " is not active: it was dropped (", ab->second,
                                                          "); start it again with sequence_start"));
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", sequence_id, " is not active: the first request must set sequence_start"));
    }
    seq = &it->second;
  }

  const int64_t cached = seq ? seq->reserved : 0;
  const int64_t total = cached + new_tokens;
  if (total > max_tokens_)
    return absl::InvalidArgumentError(absl::StrCat("sequence ", sequence_id, " would hold ", total, " tokens (",
                                                   cached, " cached + ", new_tokens,
                                                   " new), over max_tokens_per_sequence=", max_tokens_));
  const int64_t have = seq ? int64_t(seq->blocks.size()) : 0;
  const int64_t need = std::max<int64_t>(0, (total + page_size_ - 1) / page_size_ - have);
  if (need > int64_t(free_.size()))
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: need ", need, " blocks, ", free_.size(),
                                                     " free of ", num_blocks_, " (sequence ", sequence_id, ", ",
                                                     total, " tokens at ", page_size_, " tokens per block)"));

  // Admitted: nothing below can fail.
  if (start) {
    aborted_.erase(sequence_id);  // its order entry is dropped lazily
    Sequence fresh;
    fresh.generation = next_generation_++;
    it = live_.emplace(sequence_id, std::move(fresh)).first;
  }
  Sequence& s = it->second;
  for (int64_t i = 0; i < need; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  s.reserved = total;
  s.in_flight++;
  s.last_used = now;

  KvReservation r;
  r.sequence_id = sequence_id;
  r.start_pos = cached;
  r.new_tokens = new_tokens;
  r.blocks = s.blocks;
  r.start = start;
  r.end = end;
  r.generation = s.generation;
  if (end) {  // the id is free for a new sequence; the blocks wait for the requests in flight
    Sequence ended = std::move(s);
    live_.erase(it);
    RetireLocked(std::move(ended));
  }
  return r;
}

KvSessionTable::Sequence* KvSessionTable::FindLocked(const KvReservation& r) {
  auto it = live_.find(r.sequence_id);
  if (it != live_.end() && it->second.generation == r.generation) return &it->second;
  auto rt = retiring_.find(r.generation);
  return rt == retiring_.end() ? nullptr : &rt->second;
}

void KvSessionTable::FreeBlocksLocked(std::vector<int32_t>* blocks) {
  // Reverse order keeps the LIFO free list handing out low block ids first.
  for (auto b = blocks->rbegin(); b != blocks->rend(); ++b) free_.push_back(*b);
  blocks->clear();
}

void KvSessionTable::RetireLocked(Sequence&& s) {
  if (s.in_flight == 0) {
    FreeBlocksLocked(&s.blocks);
    return;
  }
  const uint64_t gen = s.generation;
  retiring_.emplace(gen, std::move(s));
}

void KvSessionTable::RecordAbortLocked(const std::string& id, const std::string& why) {
  aborted_[id] = why;
  aborted_order_.push_back(id);
  // Drop the oldest records; an order entry whose id was restarted or re-recorded
  // later is stale and only removed if it is not the newest record for that id.
  while (aborted_.size() > kMaxAbortedRecords || aborted_order_.size() > 2 * kMaxAbortedRecords) {
    std::string oldest = aborted_order_.front();
    aborted_order_.erase(aborted_order_.begin());
    if (std::find(aborted_order_.begin(), aborted_order_.end(), oldest) == aborted_order_.end())
      aborted_.erase(oldest);
  }
}

void KvSessionTable::Commit(const KvReservation& r, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Sequence* s = FindLocked(r);
  if (s == nullptr) return;  // reaped or already released: nothing to account
  s->in_flight = std::max(0, s->in_flight - 1);
  s->last_used = now;
  auto rt = retiring_.find(r.generation);
  if (rt != retiring_.end() && &rt->second == s && s->in_flight == 0) {
    FreeBlocksLocked(&s->blocks);
    retiring_.erase(rt);
  }
}

void KvSessionTable::Abort(const KvReservation& r, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(r.sequence_id);
  if (it != live_.end() && it->second.generation == r.generation) {
    Sequence s = std::move(it->second);
    live_.erase(it);
    s.in_flight = std::max(0, s.in_flight - 1);
    s.aborted = true;
    RecordAbortLocked(r.sequence_id, why);
    RetireLocked(std::move(s));
    return;
  }
  auto rt = retiring_.find(r.generation);
  if (rt == retiring_.end()) return;
  rt->second.aborted = true;  // already ended: the id may have been started again, so no record
  rt->second.in_flight = std::max(0, rt->second.in_flight - 1);
  if (rt->second.in_flight == 0) {
    FreeBlocksLocked(&rt->second.blocks);
    retiring_.erase(rt);
  }
}

bool KvSessionTable::Valid(const KvReservation& r) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(r.sequence_id);
  if (it != live_.end() && it->second.generation == r.generation) return !it->second.aborted;
  auto rt = retiring_.find(r.generation);
  return rt != retiring_.end() && !rt->second.aborted;
}

int KvSessionTable::ReapIdle(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  int reaped = 0;
  for (auto it = live_.begin(); it != live_.end();) {
    Sequence& s = it->second;
    if (s.in_flight == 0 && now - s.last_used > idle_timeout_) {
      FreeBlocksLocked(&s.blocks);
      RecordAbortLocked(it->first, absl::StrCat("idle for more than ", double(idle_timeout_.count()) * 1e-6,
                                                " s, the model's max_sequence_idle_microseconds"));
      it = live_.erase(it);
      ++reaped;
    } else {
      ++it;
    }
  }
  return reaped;
}

int KvSessionTable::blocks_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_blocks_ - int(free_.size());
}

int KvSessionTable::live_sequences() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int(live_.size());
}

}  // namespace flashq::server
