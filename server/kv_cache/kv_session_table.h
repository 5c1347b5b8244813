// Bookkeeping of the paged KV cache, independent of where the pages live (host
// memory for the CPU backend, device memory for the CUDA backend): a block
// allocator over a fixed pool and the table of live sequences keyed by Triton's
// `sequence_id`. Thread-safe.
//
// Lifecycle: the frontend calls Reserve() when it admits a request (so that misuse
// and a full cache are answered at once, in arrival order); the executor writes
// the new K/V at positions [start_pos, start_pos + new_tokens) and calls Commit();
// a request dropped before compute calls Abort(), which ends its sequence, since
// the positions after it would be wrong.
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
  std::vector<int32_t> blocks;       // the sequence's block table after this request
  bool start = false, end = false;
};

class KvSessionTable {
 public:
  using Clock = std::chrono::steady_clock;
  KvSessionTable(int num_blocks, int page_size, int64_t max_tokens_per_sequence, std::chrono::seconds idle_timeout);

  // start && live            -> ALREADY_EXISTS   ("sequence 'x' is already active ...")
  // !start && not live       -> FAILED_PRECONDITION ("sequence 'x' is not active: the first request must set sequence_start")
  // aborted earlier          -> FAILED_PRECONDITION naming why
  // too long                 -> INVALID_ARGUMENT naming the limit
  // not enough free blocks   -> RESOURCE_EXHAUSTED ("KV cache full: need N blocks, F free of T")
  absl::StatusOr<KvReservation> Reserve(const std::string& sequence_id, bool start, bool end, int new_tokens);
  // After compute: the tokens are in the cache; frees the sequence when end was set.
  void Commit(const KvReservation& r);
  // Drops the sequence (request cancelled, timed out or failed).
  void Abort(const KvReservation& r, const std::string& why);
  // Frees sequences idle for longer than the timeout; returns how many.
  int ReapIdle(Clock::time_point now);

  int blocks_in_use() const;
  int blocks_total() const { return num_blocks_; }
  int page_size() const { return page_size_; }
  int live_sequences() const;

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t reserved = 0;            // tokens reserved (committed or in flight)
    int in_flight = 0;
    Clock::time_point last_used;
  };
  const int num_blocks_, page_size_;
  const int64_t max_tokens_;
  const std::chrono::seconds idle_timeout_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;        // free block ids (LIFO)
  std::map<std::string, Sequence> live_;
  std::map<std::string, std::string> aborted_;   // id -> reason; bounded, oldest dropped
  std::vector<std::string> aborted_order_;
};

}  // namespace flashq::server
