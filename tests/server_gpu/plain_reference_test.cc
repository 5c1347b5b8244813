// The attention and kv_attention executors against plain_reference.h, a float64 reference that
// shares no code with them (the other tests of this folder compare the CUDA backend with the CPU
// backend, whose arithmetic is the kernels' own reference template). Built twice: for the CPU
// backend (runs in CI) and, with FLASHQ_PLAIN_REF_CUDA, into the CUDA backend's GPU tests.
// Inputs are fresh random values in the dtype; bounds are atol + rtol * |ref rounded to the dtype|.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"
#include "server/metrics/metrics.h"
#include "tests/server_gpu/plain_reference.h"
#if defined(FLASHQ_PLAIN_REF_CUDA)
#include "server/backends/cuda/cuda_backend.h"
#endif

namespace flashq::server {
namespace {

using plainref::Half;

// 16-bit storage: bf16 keeps 8 significant bits, fp16 11. The kernels round P to the dtype
// before P.V, which adds about one more unit of the dtype to the output's error.
double Tol(Half t) { return t == Half::kBF16 ? 1.6e-2 : 3e-3; }
DType ToDType(Half t) { return t == Half::kBF16 ? DType::kBF16 : DType::kF16; }
const char* Name(Half t) { return t == Half::kBF16 ? "bf16" : "fp16"; }

class PlainReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.staging_bytes = 64 << 20;
    o.arena_bytes = int64_t(1) << 30;
    if (GetParam() == "cpu") {
      backend_ = std::make_unique<CpuBackend>(o);
      return;
    }
#if defined(FLASHQ_PLAIN_REF_CUDA)
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
    auto b = CreateCudaBackend(o, metrics_);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
#else
    GTEST_SKIP() << "built without the CUDA backend";
#endif
  }

  // n random normal values rounded to t: the bytes for the server and their exact values.
  std::string Random(Half t, size_t n, std::vector<double>* values) {
    std::normal_distribution<double> nd(0.0, 1.0);
    std::string bytes(2 * n, '\0');
    values->resize(n);
    for (size_t i = 0; i < n; ++i) {
      const double x = plainref::RoundTo(t, nd(rng_));
      (*values)[i] = x;
      const uint16_t b = plainref::EncodeBits(t, x);
      std::memcpy(&bytes[2 * i], &b, 2);
    }
    return bytes;
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{std::shared_ptr<prometheus::Registry>(&registry_, [](auto*) {})};
  std::unique_ptr<Backend> backend_;
  std::mt19937_64 rng_{20261128};
};

std::vector<int32_t> Cu(const std::vector<int>& lens) {
  std::vector<int32_t> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

struct Geometry {
  int hq, hkv, d;
};

TEST_P(PlainReferenceTest, AttentionRaggedCausalGqa) {
  auto exec = backend_->CreateAttention();
  ASSERT_TRUE(exec.ok()) << exec.status();
  for (Half t : {Half::kF16, Half::kBF16}) {
    for (Geometry g : {Geometry{8, 2, 128}, Geometry{4, 1, 64}}) {
      for (bool causal : {false, true}) {
        SCOPED_TRACE(::testing::Message() << Name(t) << " hq " << g.hq << " hkv " << g.hkv << " d " << g.d
                                          << (causal ? " causal" : " full"));
        // One query, an empty query sequence, lq > lk (causal rows that see no key), lengths that
        // are no tile multiple, total_q != total_k.
        const std::vector<int> lq = {1, 0, 69, 40, 263}, lk = {5, 6, 69, 20, 300};
        AttentionBatch b;
        b.dtype = ToDType(t);
        b.num_heads_q = g.hq;
        b.num_heads_kv = g.hkv;
        b.head_dim = g.d;
        b.causal = causal;
        b.softmax_scale = float(1.0 / std::sqrt(double(g.d)) * (causal ? 1.0 : 1.5));
        b.want_lse = true;
        b.cu_seqlens_q = Cu(lq);
        b.cu_seqlens_k = Cu(lk);
        for (size_t i = 0; i < lq.size(); ++i) {
          b.max_seqlen_q = std::max(b.max_seqlen_q, lq[i]);
          b.max_seqlen_k = std::max(b.max_seqlen_k, lk[i]);
        }
        std::vector<double> q, k, v;
        const std::string qb = Random(t, size_t(b.cu_seqlens_q.back()) * g.hq * g.d, &q);
        const std::string kb = Random(t, size_t(b.cu_seqlens_k.back()) * g.hkv * g.d, &k);
        const std::string vb = Random(t, size_t(b.cu_seqlens_k.back()) * g.hkv * g.d, &v);
        b.q = qb;
        b.k = kb;
        b.v = vb;
        std::string o;
        std::vector<float> lse;
        ASSERT_TRUE((*exec)->Run(b, &o, &lse).ok());
        std::vector<double> o_ref, lse_ref;
        plainref::Attention(q, k, v, b.cu_seqlens_q, b.cu_seqlens_k, g.hq, g.hkv, g.d, b.softmax_scale, causal,
                            &o_ref, &lse_ref);
        std::string why;
        EXPECT_EQ(plainref::CountOutside(t, o, o_ref, Tol(t), Tol(t), &why), 0) << why;
        ASSERT_EQ(lse.size(), lse_ref.size());
        int bad = 0;
        for (size_t i = 0; i < lse.size(); ++i) {
          const bool ok = std::isinf(lse_ref[i]) ? lse[i] == lse_ref[i]
                                                  : std::fabs(lse[i] - lse_ref[i]) <= 2e-3 + 1e-4 * std::fabs(lse_ref[i]);
          if (!ok && ++bad <= 5) ADD_FAILURE() << "lse " << i << ": " << lse[i] << " vs " << lse_ref[i];
        }
      }
    }
  }
}

// Sessions through the paged cache: a prefill, then decode steps of one and two tokens; each
// step's output is attention of its new queries over every token cached so far (causal). One
// session grows past 1,024 keys, so the CUDA backend's decode runs several splits and merges them.
TEST_P(PlainReferenceTest, KvAttentionPrefillAndDecode) {
  const KvGeometry geo{8, 2, 128, 16, 256, 128};
  auto exec = backend_->CreateKvAttention(geo);
  ASSERT_TRUE(exec.ok()) << exec.status();
  for (Half t : {Half::kBF16, Half::kF16}) {
    SCOPED_TRACE(Name(t));
    struct Session {
      std::string id;
      std::vector<int32_t> blocks;
      std::vector<double> k, v;  // every cached token: [pos][hkv][d]
      int64_t pos = 0;
    };
    // Scattered, disjoint pages; "long" takes 80 pages (1,280 tokens).
    std::vector<Session> s(3);
    s[0].id = "short-a";
    s[1].id = "short-b";
    s[2].id = "long";
    for (int i = 0; i < 4; ++i) s[0].blocks.push_back(200 + 7 * i);
    for (int i = 0; i < 2; ++i) s[1].blocks.push_back(3 + 11 * i);
    for (int i = 0; i < 80; ++i) s[2].blocks.push_back(i % 2 ? 100 + i / 2 : 40 + i / 2);
    const std::vector<std::vector<int>> steps = {{37, 5, 1100}, {1, 2, 1}, {1, 1, 2}, {2, 1, 1}};
    for (size_t step = 0; step < steps.size(); ++step) {
      KvBatch batch;
      batch.dtype = ToDType(t);
      batch.softmax_scale = float(1.0 / std::sqrt(128.0));
      std::vector<std::string> bytes;
      std::vector<std::vector<double>> qs(s.size());
      bytes.reserve(3 * s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        const int n = steps[step][i];
        std::vector<double> k, v;
        bytes.push_back(Random(t, size_t(n) * geo.num_heads_q * geo.head_dim, &qs[i]));
        bytes.push_back(Random(t, size_t(n) * geo.num_heads_kv * geo.head_dim, &k));
        bytes.push_back(Random(t, size_t(n) * geo.num_heads_kv * geo.head_dim, &v));
        s[i].k.insert(s[i].k.end(), k.begin(), k.end());
        s[i].v.insert(s[i].v.end(), v.begin(), v.end());
      }
      for (size_t i = 0; i < s.size(); ++i) {
        batch.items.push_back({s[i].id, HostBytes(bytes[3 * i]), HostBytes(bytes[3 * i + 1]),
                               HostBytes(bytes[3 * i + 2]), steps[step][i], s[i].pos, &s[i].blocks, {}});
      }
      std::vector<std::string> out;
      ASSERT_TRUE((*exec)->Run(batch, geo.num_heads_q, geo.head_dim, &out).ok());
      ASSERT_EQ(out.size(), s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        const int n = steps[step][i];
        s[i].pos += n;
        SCOPED_TRACE(::testing::Message() << s[i].id << ", step " << step << ", " << s[i].pos << " keys");
        std::vector<double> o_ref, lse_ref;
        plainref::Attention(qs[i], s[i].k, s[i].v, {0, n}, {0, int32_t(s[i].pos)}, geo.num_heads_q, geo.num_heads_kv,
                            geo.head_dim, batch.softmax_scale, /*causal=*/true, &o_ref, &lse_ref);
        std::string why;
        EXPECT_EQ(plainref::CountOutside(t, out[i], o_ref, Tol(t), Tol(t), &why), 0) << why;
      }
    }
  }
}

#if defined(FLASHQ_PLAIN_REF_CUDA)
INSTANTIATE_TEST_SUITE_P(Cuda, PlainReferenceTest, ::testing::Values("cuda"));
#else
INSTANTIATE_TEST_SUITE_P(Cpu, PlainReferenceTest, ::testing::Values("cpu"));
#endif

}  // namespace
}  // namespace flashq::server
