#include "server/kv_cache/kv_session_table.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace flashq::server {
namespace {

using std::chrono::seconds;
using Clock = KvSessionTable::Clock;

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST(KvSessionTableTest, StartContinueEnd) {
  KvSessionTable t(/*num_blocks=*/16, /*page_size=*/4, /*max_tokens=*/64, seconds(600));
  auto r1 = t.Reserve("42", /*start=*/true, /*end=*/false, 6);  // prefill: 6 tokens -> 2 blocks
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->start_pos, 0);
  EXPECT_EQ(r1->blocks, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(r1->start);
  EXPECT_EQ(t.blocks_in_use(), 2);
  EXPECT_EQ(t.live_sequences(), 1);
  t.Commit(*r1);

  auto r2 = t.Reserve("42", false, false, 2);  // 8 tokens: still 2 blocks
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->start_pos, 6);
  EXPECT_EQ(r2->blocks.size(), 2u);
  EXPECT_EQ(t.blocks_in_use(), 2);
  t.Commit(*r2);

  auto r3 = t.Reserve("42", false, true, 1);  // decode step 9 -> third block, and end
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->start_pos, 8);
  EXPECT_EQ(r3->blocks, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(r3->end);
  EXPECT_EQ(t.blocks_in_use(), 3) << "blocks stay until the end request is committed";
  EXPECT_EQ(t.live_sequences(), 0) << "the id is free at once";
  EXPECT_TRUE(t.Valid(*r3));
  t.Commit(*r3);
  EXPECT_EQ(t.blocks_in_use(), 0);
  EXPECT_FALSE(t.Valid(*r3));
}

TEST(KvSessionTableTest, DuplicateStartIsAlreadyExists) {
  KvSessionTable t(8, 4, 64, seconds(600));
  auto r = t.Reserve("seq-a", true, false, 3);
  ASSERT_TRUE(r.ok());
  t.Commit(*r);
  auto dup = t.Reserve("seq-a", true, false, 3);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(dup.status(), "sequence seq-a is already active")) << dup.status();
  EXPECT_TRUE(Contains(dup.status(), "3 tokens cached")) << dup.status();
  EXPECT_EQ(t.blocks_in_use(), 1) << "the rejected start allocated nothing";
}

TEST(KvSessionTableTest, NeverStartedIsFailedPrecondition) {
  KvSessionTable t(8, 4, 64, seconds(600));
  auto r = t.Reserve("17", false, false, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status(), "sequence 17 is not active: the first request must set sequence_start"))
      << r.status();
  auto e = t.Reserve("17", false, true, 1);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.blocks_in_use(), 0);
}

TEST(KvSessionTableTest, ReuseAfterEnd) {
  KvSessionTable t(8, 4, 64, seconds(600));
  auto a = t.Reserve("7", true, true, 5);  // a one-request sequence
  ASSERT_TRUE(a.ok());
  t.Commit(*a);
  // Continuing an ended sequence is an error...
  auto cont = t.Reserve("7", false, false, 1);
  EXPECT_EQ(cont.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(cont.status(), "sequence 7 is not active")) << cont.status();
  // ...starting it again is fine and begins at position 0.
  auto b = t.Reserve("7", true, false, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->start_pos, 0);
  EXPECT_NE(b->generation, a->generation);
}

TEST(KvSessionTableTest, RestartWhileEndIsInFlight) {
  KvSessionTable t(4, 4, 64, seconds(600));
  auto a = t.Reserve("s", true, true, 8);  // 2 blocks, in flight
  ASSERT_TRUE(a.ok());
  auto b = t.Reserve("s", true, false, 4);  // new incarnation while the old one computes
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->blocks, (std::vector<int32_t>{2}));
  EXPECT_EQ(t.blocks_in_use(), 3);
  t.Commit(*a);  // frees the old incarnation's blocks only
  EXPECT_EQ(t.blocks_in_use(), 1);
  EXPECT_EQ(t.live_sequences(), 1);
  t.Commit(*b);
  auto c = t.Reserve("s", false, false, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->start_pos, 4);
}

TEST(KvSessionTableTest, AbortedSequenceNamesWhy) {
  KvSessionTable t(8, 4, 64, seconds(600));
  auto r1 = t.Reserve("9", true, false, 4);
  ASSERT_TRUE(r1.ok());
  t.Commit(*r1);
  auto r2 = t.Reserve("9", false, false, 4);
  auto r3 = t.Reserve("9", false, false, 4);  // pipelined behind r2
  ASSERT_TRUE(r2.ok() && r3.ok());
  EXPECT_EQ(t.blocks_in_use(), 3);
  t.Abort(*r2, "request cancelled by the client");
  EXPECT_FALSE(t.Valid(*r3)) << "r3 would compute on a gap";
  EXPECT_EQ(t.live_sequences(), 0);
  EXPECT_EQ(t.blocks_in_use(), 3) << "r3 is still in flight";
  t.Abort(*r3, "earlier request of the sequence failed");
  EXPECT_EQ(t.blocks_in_use(), 0);

  auto next = t.Reserve("9", false, false, 1);
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(next.status(), "sequence 9")) << next.status();
  EXPECT_TRUE(Contains(next.status(), "request cancelled by the client")) << next.status();
  // A new start clears the record.
  auto again = t.Reserve("9", true, false, 1);
  ASSERT_TRUE(again.ok()) << again.status();
  t.Commit(*again);
  EXPECT_TRUE(t.Reserve("9", false, true, 1).ok());
}

TEST(KvSessionTableTest, AbortOfStartLeavesNothing) {
  KvSessionTable t(8, 4, 64, seconds(600));
  auto r = t.Reserve("x", true, false, 10);
  ASSERT_TRUE(r.ok());
  t.Abort(*r, "deadline exceeded in the queue");
  EXPECT_EQ(t.blocks_in_use(), 0);
  EXPECT_EQ(t.live_sequences(), 0);
  t.Commit(*r);  // a late commit of an aborted request is harmless
  EXPECT_EQ(t.blocks_in_use(), 0);
}

TEST(KvSessionTableTest, TooLongNamesTheLimit) {
  KvSessionTable t(64, 4, /*max_tokens=*/32, seconds(600));
  auto big = t.Reserve("long", true, false, 33);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(big.status(), "max_tokens_per_sequence=32")) << big.status();
  EXPECT_TRUE(Contains(big.status(), "sequence long")) << big.status();
  EXPECT_EQ(t.live_sequences(), 0);
  auto r = t.Reserve("long", true, false, 30);
  ASSERT_TRUE(r.ok());
  t.Commit(*r);
  auto over = t.Reserve("long", false, false, 3);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(over.status(), "would hold 33 tokens (30 cached + 3 new)")) << over.status();
  auto ok = t.Reserve("long", false, true, 2);  // the sequence survived the rejection
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(KvSessionTableTest, CacheFullIsResourceExhaustedAndLeaksNothing) {
  KvSessionTable t(/*num_blocks=*/4, /*page_size=*/16, 1024, seconds(600));
  auto a = t.Reserve("a", true, false, 40);  // 3 blocks
  ASSERT_TRUE(a.ok());
  t.Commit(*a);
  auto b = t.Reserve("b", true, false, 20);  // needs 2, 1 free
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(b.status(), "KV cache full: need 2 blocks, 1 free of 4")) << b.status();
  EXPECT_TRUE(Contains(b.status(), "sequence b")) << b.status();
  EXPECT_EQ(t.blocks_in_use(), 3);
  EXPECT_EQ(t.live_sequences(), 1);
  auto b_cont = t.Reserve("b", false, false, 1);
  EXPECT_EQ(b_cont.status().code(), absl::StatusCode::kFailedPrecondition) << "the failed start left no session";

  auto grow = t.Reserve("a", false, false, 30);  // 70 tokens -> 5 blocks: 2 more, 1 free
  EXPECT_EQ(grow.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t.blocks_in_use(), 3);
  auto fits = t.Reserve("a", false, false, 8);  // 48 tokens: exactly 3 blocks, nothing new
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->start_pos, 40);
  t.Commit(*fits);
  auto end = t.Reserve("a", false, true, 0);
  ASSERT_TRUE(end.ok());
  t.Commit(*end);
  EXPECT_EQ(t.blocks_in_use(), 0);
  auto b2 = t.Reserve("b", true, false, 64);  // the whole pool again
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(b2->blocks.size(), 4u);
}

TEST(KvSessionTableTest, IdleReaping) {
  KvSessionTable t(8, 4, 64, seconds(10));
  const Clock::time_point t0 = Clock::now();
  auto a = t.Reserve("idle", true, false, 4, t0);
  auto b = t.Reserve("busy", true, false, 4, t0);
  auto c = t.Reserve("fresh", true, false, 4, t0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  t.Commit(*a, t0);
  t.Commit(*c, t0 + seconds(8));  // used recently
  // b stays in flight: never reaped while a request computes.
  EXPECT_EQ(t.ReapIdle(t0 + seconds(5)), 0);
  EXPECT_EQ(t.ReapIdle(t0 + seconds(11)), 1);
  EXPECT_EQ(t.live_sequences(), 2);
  EXPECT_EQ(t.blocks_in_use(), 2);
  auto late = t.Reserve("idle", false, false, 1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(late.status(), "idle for more than 10 s")) << late.status();
  EXPECT_EQ(t.ReapIdle(t0 + seconds(19)), 1);  // fresh
  t.Commit(*b, t0 + seconds(19));
  EXPECT_EQ(t.ReapIdle(t0 + seconds(25)), 0);
  EXPECT_EQ(t.ReapIdle(t0 + seconds(30)), 1);
  EXPECT_EQ(t.blocks_in_use(), 0);
}

// Which sequence incarnation (id#generation) holds each block, as the clients of the
// table see it. Blocks are claimed after each reservation and released just before the
// call that may free them, so a block handed to one sequence while another still holds
// it is always caught.
class BlockOwners {
 public:
  explicit BlockOwners(int num_blocks) : owner_(size_t(num_blocks)) {}

  void Claim(const KvReservation& r) {
    const std::string who = Key(r);
    std::lock_guard<std::mutex> l(mu_);
    for (int32_t b : r.blocks) {
      if (b < 0 || size_t(b) >= owner_.size()) {
        errors_.push_back(who + " got block " + std::to_string(b) + ", outside the pool");
      } else if (owner_[size_t(b)].empty()) {
        owner_[size_t(b)] = who;
      } else if (owner_[size_t(b)] != who) {
        errors_.push_back("block " + std::to_string(b) + " held by " + owner_[size_t(b)] + " and " + who);
      }
    }
  }
  void Release(const KvReservation& r) {
    const std::string who = Key(r);
    std::lock_guard<std::mutex> l(mu_);
    for (int32_t b : r.blocks) {
      if (b >= 0 && size_t(b) < owner_.size() && owner_[size_t(b)] == who) owner_[size_t(b)].clear();
    }
  }
  int held() const {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (const auto& o : owner_) n += !o.empty();
    return n;
  }
  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> l(mu_);
    return errors_;
  }

 private:
  static std::string Key(const KvReservation& r) { return r.sequence_id + "#" + std::to_string(r.generation); }
  mutable std::mutex mu_;
  std::vector<std::string> owner_;
  std::vector<std::string> errors_;
};

// Four threads run sequences against one small pool (so reservations often fail for a
// full cache): prefill, decode steps, pipelined requests, aborts with a request still in
// flight, and restarts of an id while its end request is in flight; each thread also
// holds one long-lived sequence. No block may be held
// by two live sequences at any time; a sequence's block table only grows, and has
// ceil(tokens / page) entries; at the end nothing is held.
TEST(KvSessionTableTest, NoBlockHeldByTwoSequencesUnderConcurrency) {
  constexpr int kThreads = 4, kSeqs = 150, kPage = 8, kBlocks = 12;
  KvSessionTable t(kBlocks, kPage, 4096, seconds(600));
  BlockOwners owners(kBlocks);
  std::atomic<int> full{0}, sequences{0}, restarts{0}, aborts{0};
  std::vector<std::thread> threads;
  std::atomic<int> waiting{kThreads};
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      auto blocks_for = [](int64_t tokens) { return size_t((tokens + kPage - 1) / kPage); };
      // Each thread keeps one sequence of 2 blocks live throughout: its blocks must stay
      // its own while everything else churns, and they leave the others 4 of 12 blocks,
      // so reservations run into a full cache.
      const std::string bg = "bg:" + std::to_string(th);
      auto background = t.Reserve(bg, true, false, 2 * kPage);
      ASSERT_TRUE(background.ok()) << background.status();
      owners.Claim(*background);
      t.Commit(*background);
      for (--waiting; waiting.load() > 0;) std::this_thread::yield();  // start together
      for (int i = 0; i < kSeqs; ++i) {
        const std::string id = std::to_string(th) + ":" + std::to_string(i / 2);  // odd i restart the id
        int64_t tokens = 1 + (i * 7 + th) % 28;
        auto r = t.Reserve(id, true, false, int(tokens));
        if (!r.ok()) {
          if (r.status().code() == absl::StatusCode::kResourceExhausted) ++full;
          else ADD_FAILURE() << id << ": " << r.status();
          continue;
        }
        ++sequences;
        EXPECT_EQ(r->blocks.size(), blocks_for(tokens));
        owners.Claim(*r);
        t.Commit(*r);
        std::vector<int32_t> table = r->blocks;
        for (int step = 0; step < 6; ++step) {
          const bool end = step == 5;
          const int n = 1 + (step + i) % 3;
          auto d = t.Reserve(id, false, end, n);
          if (!d.ok()) {
            EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted) << id << ": " << d.status();
            ++full;
            auto e = t.Reserve(id, false, true, 0);
            ASSERT_TRUE(e.ok()) << id << ": " << e.status();
            owners.Release(*e);
            t.Commit(*e);
            break;
          }
          tokens += n;
          EXPECT_EQ(d->blocks.size(), blocks_for(tokens)) << id;
          EXPECT_TRUE(std::equal(table.begin(), table.end(), d->blocks.begin())) << id << ": block table rewritten";
          table = d->blocks;
          owners.Claim(*d);
          if (step == 2 && i % 5 == 0) {
            // Pipelined: a second request before the first is computed; then the first is
            // dropped, which ends the sequence while the second is still in flight.
            auto d2 = t.Reserve(id, false, false, 1);
            if (d2.ok()) owners.Claim(*d2);
            owners.Release(*d);
            if (d2.ok()) owners.Release(*d2);
            t.Abort(*d, "dropped");
            if (d2.ok()) t.Abort(*d2, "an earlier request of the sequence was dropped");
            ++aborts;
            break;
          }
          if (end && i % 2 == 0 && i + 1 < kSeqs) {
            // The next sequence restarts this id while this end request is still in flight.
            auto again = t.Reserve(std::to_string(th) + ":" + std::to_string((i + 1) / 2), true, false, 1);
            if (again.ok()) {
              owners.Claim(*again);
              ++restarts;
              owners.Release(*again);
              t.Abort(*again, "restart probe");
            }
          }
          if (end) owners.Release(*d);
          t.Commit(*d);
        }
      }
      auto bg_end = t.Reserve(bg, false, true, 0);
      ASSERT_TRUE(bg_end.ok()) << bg_end.status();
      EXPECT_EQ(bg_end->blocks, background->blocks) << bg << "'s block table changed";
      owners.Release(*bg_end);
      t.Commit(*bg_end);
    });
  }
  for (auto& th : threads) th.join();
  const std::vector<std::string> errors = owners.errors();
  EXPECT_TRUE(errors.empty()) << errors.size() << " overlaps, first: " << (errors.empty() ? "" : errors[0]);
  EXPECT_EQ(owners.held(), 0);
  EXPECT_EQ(t.blocks_in_use(), 0);
  EXPECT_EQ(t.live_sequences(), 0);
  // The run exercised what it claims to.
  EXPECT_GT(sequences.load(), kThreads * kSeqs / 4);
  EXPECT_GT(full.load(), 0) << "the pool never filled";
  EXPECT_GT(aborts.load(), 0);
  EXPECT_GT(restarts.load(), 0);
}

}  // namespace
}  // namespace flashq::server
