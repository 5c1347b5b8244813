// Requests the workload generators build: shapes consistent with cu_seqlens and
// with the length distributions, kv_attention session lifecycles, linear M.
#include "client/bench/workload.h"

#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "client/lib/tensor.h"

namespace flashq::bench {
namespace {

std::vector<int32_t> Int32s(const std::string& raw) {
  std::vector<int32_t> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

TEST(Workload, AttentionRaggedRequestsAreConsistent) {
  AttentionWorkloadOptions o;
  o.heads_q = 8, o.heads_kv = 2, o.head_dim = 64;
  o.seq_len = *IntDistribution::Parse("uniform:16:200");
  o.seqs_per_request = *IntDistribution::Parse("uniform:1:4");
  auto w = MakeAttentionWorkload(o);
  std::map<int64_t, int> nseq;
  for (int i = 0; i < 300; ++i) {
    Work work = w->Next();
    const auto& r = *work.request;
    ASSERT_EQ(r.model_name(), "attention");
    ASSERT_EQ(r.inputs_size(), 5);
    ASSERT_EQ(r.inputs(0).name(), "Q");
    ASSERT_EQ(r.inputs(3).name(), "CU_SEQLENS_Q");
    const auto cu = Int32s(r.raw_input_contents(3));
    const int64_t n = int64_t(cu.size()) - 1;
    nseq[n]++;
    ASSERT_GE(n, 1);
    ASSERT_LE(n, 4);
    ASSERT_EQ(cu[0], 0);
    for (int64_t s = 0; s < n; ++s) {
      ASSERT_GE(cu[s + 1] - cu[s], 16);
      ASSERT_LE(cu[s + 1] - cu[s], 200);
    }
    EXPECT_EQ(r.inputs(0).shape(0), cu.back());
    EXPECT_EQ(r.inputs(0).shape(1), 8);
    EXPECT_EQ(r.inputs(1).shape(1), 2);
    EXPECT_EQ(int64_t(r.raw_input_contents(0).size()), cu.back() * 8 * 64 * 2);
    EXPECT_EQ(int64_t(r.raw_input_contents(1).size()), Int32s(r.raw_input_contents(4)).back() * 2 * 64 * 2);
    EXPECT_EQ(work.units, cu.back());
    EXPECT_TRUE(r.parameters().at("causal").bool_param());
  }
  EXPECT_EQ(nseq.size(), 4u);
}

TEST(Workload, AttentionValuesAreFiniteFp16) {
  AttentionWorkloadOptions o;
  auto w = MakeAttentionWorkload(o);
  Work work = w->Next();
  auto v = client::DecodeFloats(work.request->raw_input_contents(0), DType::kF16);
  ASSERT_TRUE(v.ok());
  for (float x : *v) ASSERT_TRUE(std::isfinite(x) && x >= -1.0f && x <= 1.0f);
}

TEST(Workload, KvSessionLifecycle) {
  KvWorkloadOptions o;
  o.prefill_len = IntDistribution::Fixed(40);
  o.decode_steps = IntDistribution::Fixed(3);
  auto w = MakeKvWorkload(o);
  EXPECT_EQ(w->tags(), (std::vector<std::string>{"prefill", "decode"}));
  // One slot: start, 3 decodes (the last ends), then a new session.
  std::vector<uint64_t> ids;
  std::optional<Work> next;
  for (int step = 0; step < 8; ++step) {
    Work work = next ? *next : w->Next();
    const auto& p = work.request->parameters();
    const uint64_t id = client::SequenceId(*work.request);
    ASSERT_NE(id, 0u);
    const int k = step % 4;
    EXPECT_EQ(p.at("sequence_start").bool_param(), k == 0) << step;
    EXPECT_EQ(p.at("sequence_end").bool_param(), k == 3) << step;
    EXPECT_EQ(work.request->inputs(0).shape(0), k == 0 ? 40 : 1);
    EXPECT_EQ(work.request->inputs(0).shape(1), 32);
    EXPECT_EQ(work.request->inputs(1).shape(1), 8);
    EXPECT_EQ(work.tag, k == 0 ? 0 : 1);
    if (k == 0) ids.push_back(id);
    else EXPECT_EQ(id, ids.back());
    next = w->Complete(work, true, true);
    EXPECT_EQ(next.has_value(), k != 3) << step;
  }
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_EQ(w->sessions_completed(), 2);
  EXPECT_TRUE(w->Drain().empty());  // nothing left open
}

TEST(Workload, KvSessionsLeftOpenAreEndedByDrain) {
  KvWorkloadOptions o;
  o.prefill_len = IntDistribution::Fixed(4);
  o.decode_steps = IntDistribution::Fixed(10);
  auto w = MakeKvWorkload(o);
  Work a = w->Next(), b = w->Next(), c = w->Next();  // three slots: three sessions
  EXPECT_NE(client::SequenceId(*a.request), client::SequenceId(*b.request));
  auto a2 = w->Complete(a, true, true);
  ASSERT_TRUE(a2.has_value());
  EXPECT_FALSE(w->Complete(*a2, false, true).has_value());  // a decode failed: abandon, but end it
  EXPECT_FALSE(w->Complete(b, false, true).has_value());    // the prefill failed: nothing to end
  EXPECT_FALSE(w->Complete(c, true, false).has_value());    // stopping: left open
  auto drain = w->Drain();
  ASSERT_EQ(drain.size(), 2u);
  for (const Work& d : drain) {
    const uint64_t id = client::SequenceId(*d.request);
    EXPECT_TRUE(id == client::SequenceId(*a.request) || id == client::SequenceId(*c.request));
    EXPECT_TRUE(d.request->parameters().at("sequence_end").bool_param());
    EXPECT_FALSE(d.request->parameters().at("sequence_start").bool_param());
    EXPECT_EQ(d.request->inputs(0).shape(0), 1);
  }
  EXPECT_TRUE(w->Drain().empty());
}

TEST(Workload, LinearRowsFollowTheDistribution) {
  LinearWorkloadOptions o;
  o.model = "down_proj_int4";
  o.k = 14336;
  o.dtype = DType::kBF16;
  o.m = *IntDistribution::Parse("uniform:1:16");
  auto w = MakeLinearWorkload(o);
  double sum = 0;
  for (int i = 0; i < 400; ++i) {
    Work work = w->Next();
    const auto& in = work.request->inputs(0);
    ASSERT_EQ(in.name(), "X");
    ASSERT_EQ(in.datatype(), "BF16");
    ASSERT_EQ(in.shape(1), 14336);
    ASSERT_GE(in.shape(0), 1);
    ASSERT_LE(in.shape(0), 16);
    ASSERT_EQ(int64_t(work.request->raw_input_contents(0).size()), in.shape(0) * 14336 * 2);
    EXPECT_EQ(work.units, in.shape(0));
    sum += double(in.shape(0));
  }
  EXPECT_NEAR(sum / 400, 8.5, 0.8);
}

}  // namespace
}  // namespace flashq::bench
