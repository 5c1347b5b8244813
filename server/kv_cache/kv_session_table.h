// Bookkeeping of the paged KV cache, independent of where the pages live (host
// memory for the CPU backend, device memory for the CUDA backend): a block
// allocator over a fixed pool and the table of live sequences keyed by Triton's
// `sequence_id`. Thread-safe.
//
// Lifecycle: the model calls Reserve() as the scheduler queues a request (so that misuse
// and a full cache are answered at once, and a sequence's requests queue in the order
// of their positions); the executor writes
// the new K/V at positions [start_pos, start_pos + new_tokens) and calls Commit();
// a request dropped before compute calls Abort(), which ends its sequence, since
// the positions after it would be wrong.
//
// A sequence whose last request (sequence_end) is reserved leaves the table at once,
// so the id can be started again right away; its blocks stay allocated until every
// request already reserved on it has been committed or aborted. Reservations carry a
// generation number so that Commit/Abort always reach the sequence they were made on.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flashq::server {

struct KvReservation {
  std::string sequence_id;
  int64_t start_pos = 0;             // tokens cached before this request
  int new_tokens = 0;
  std::vector<int32_t> blocks;       // the sequence's block table after this request
  bool start = false, end = false;
  uint64_t generation = 0;           // which incarnation of sequence_id (set by Reserve)
};

class KvSessionTable {
 public:
  using Clock = std::chrono::steady_clock;
  KvSessionTable(int num_blocks, int page_size, int64_t max_tokens_per_sequence, std::chrono::microseconds idle_timeout);

  // `sequence_id` is the key as messages print it (e.g. 42, or "abc" with its quotes).
  // start && live            -> ALREADY_EXISTS   ("sequence 42 is already active ...")
  // !start && not live       -> FAILED_PRECONDITION ("sequence 42 is not active: the first request must set sequence_start")
  // aborted earlier          -> FAILED_PRECONDITION naming why
  // too long                 -> INVALID_ARGUMENT naming the limit
  // not enough free blocks   -> RESOURCE_EXHAUSTED ("KV cache full: need N blocks, F free of T")
  // A rejected request changes nothing: a live sequence stays live with its tokens.
  absl::StatusOr<KvReservation> Reserve(const std::string& sequence_id, bool start, bool end, int new_tokens,
                                        Clock::time_point now = Clock::now());
  // After compute: the tokens are in the cache; frees the sequence when end was set.
  void Commit(const KvReservation& r, Clock::time_point now = Clock::now());
  // Drops the sequence (request cancelled, timed out or failed). Later requests on the
  // id get FAILED_PRECONDITION quoting `why` until it is started again.
  void Abort(const KvReservation& r, const std::string& why);
  // False once the reservation's sequence was aborted (e.g. an earlier request of it was
  // dropped): the executor should fail the request instead of computing on a gap.
  bool Valid(const KvReservation& r) const;
  // Frees sequences idle (nothing in flight) for longer than the timeout; returns how many.
  int ReapIdle(Clock::time_point now);

  int blocks_in_use() const;
  int blocks_total() const { return num_blocks_; }
  int page_size() const { return page_size_; }
  int64_t max_tokens_per_sequence() const { return max_tokens_; }
  int live_sequences() const;

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t reserved = 0;            // tokens reserved (committed or in flight)
    int in_flight = 0;
    uint64_t generation = 0;
    bool aborted = false;
    Clock::time_point last_used;
  };
  static constexpr size_t kMaxAbortedRecords = 4096;

  Sequence* FindLocked(const KvReservation& r);
  void RetireLocked(Sequence&& s);   // frees now, or keeps it until its in-flight requests finish
  void FreeBlocksLocked(std::vector<int32_t>* blocks);
  void RecordAbortLocked(const std::string& id, const std::string& why);

  const int num_blocks_, page_size_;
  const int64_t max_tokens_;
  const std::chrono::microseconds idle_timeout_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;        // free block ids (LIFO)
  std::map<std::string, Sequence> live_;
  std::map<uint64_t, Sequence> retiring_;        // ended or aborted, requests still in flight
  uint64_t next_generation_ = 1;
  std::map<std::string, std::string> aborted_;   // id -> reason; bounded, oldest dropped
  std::vector<std::string> aborted_order_;
};

}  // namespace flashq::server
