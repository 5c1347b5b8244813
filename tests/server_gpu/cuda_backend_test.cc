// The CUDA backend against the CPU backend, executor by executor, on random data:
// same shapes, tolerances set by the 16-bit storage, and batch invariance
// (a request's bits do not depend on what shares its batch).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "kernels/gemm/quant_formats.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cuda/cuda_backend.h"
#include "server/core/tensor.h"

namespace flashq::server {
namespace {

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
    BackendOptions o;
    o.staging_bytes = 64 << 20;
    o.arena_bytes = int64_t(1) << 30;
    auto b = CreateCudaBackend(o, metrics_);
    ASSERT_TRUE(b.ok()) << b.status();
    cuda_ = std::move(*b);
    cpu_ = std::make_unique<CpuBackend>(o);
  }

  std::string Random(DType t, int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> f(n);
    for (float& x : f) x = nd(rng_);
    std::string out;
    AppendFromFloat(t, f.data(), n, &out);
    return out;
  }

  static std::vector<float> AsFloat(DType t, const std::string& b) {
    std::vector<float> f;
    AppendAsFloat(t, b, &f);
    return f;
  }

  static void ExpectClose(DType t, const std::string& got, const std::string& want, double atol, double rtol) {
    auto g = AsFloat(t, got), w = AsFloat(t, want);
    ASSERT_EQ(g.size(), w.size());
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (!(std::fabs(g[i] - w[i]) <= atol + rtol * std::fabs(w[i]))) {
        if (++bad <= 5) ADD_FAILURE() << "element " << i << ": " << g[i] << " vs " << w[i];
      }
    }
    EXPECT_EQ(bad, 0);
  }

  // An attention batch of 8 query / 2 KV heads, hd 128, over random q, k, v that `data`
  // holds (the batch keeps views of it).
  struct AttentionData {
    std::string q, k, v;
  };
  AttentionBatch RandomAttention(DType t, bool causal, std::vector<int32_t> cu_q, std::vector<int32_t> cu_k,
                                 AttentionData* data) {
    AttentionBatch b;
    b.dtype = t;
    b.num_heads_q = 8;
    b.num_heads_kv = 2;
    b.head_dim = 128;
    b.causal = causal;
    b.softmax_scale = 1.0f / std::sqrt(128.0f);
    for (size_t i = 1; i < cu_q.size(); ++i) {
      b.max_seqlen_q = std::max(b.max_seqlen_q, cu_q[i] - cu_q[i - 1]);
      b.max_seqlen_k = std::max(b.max_seqlen_k, cu_k[i] - cu_k[i - 1]);
    }
    data->q = Random(t, int64_t(cu_q.back()) * 8 * 128);
    data->k = Random(t, int64_t(cu_k.back()) * 2 * 128);
    data->v = Random(t, int64_t(cu_k.back()) * 2 * 128);
    b.cu_seqlens_q = std::move(cu_q);
    b.cu_seqlens_k = std::move(cu_k);
    b.q = data->q;
    b.k = data->k;
    b.v = data->v;
    return b;
  }

  // Samples in flashq_kernel_seconds{kernel, gpu}.
  uint64_t KernelCount(const std::string& kernel, int gpu) {
    for (const auto& family : registry_.Collect()) {
      if (family.name != "flashq_kernel_seconds") continue;
      for (const auto& m : family.metric) {
        std::map<std::string, std::string> l;
        for (const auto& p : m.label) l[p.name] = p.value;
        if (l["kernel"] == kernel && l["gpu"] == std::to_string(gpu)) return m.histogram.sample_count;
      }
    }
    return 0;
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{std::shared_ptr<prometheus::Registry>(&registry_, [](auto*) {})};
  std::unique_ptr<Backend> cuda_, cpu_;
  std::mt19937 rng_{1234};
};

TEST_F(CudaBackendTest, VarlenAttentionMatchesCpuAndIsBatchInvariant) {
  auto gpu = cuda_->CreateAttention();
  auto cpu = cpu_->CreateAttention();
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (bool causal : {false, true}) {
      AttentionData data;
      AttentionBatch b = RandomAttention(t, causal, {0, 1, 70, 70, 333}, {0, 5, 74, 80, 343}, &data);
      b.want_lse = true;
      const std::string &q = data.q, &k = data.k, &v = data.v;
      std::string og, oc;
      std::vector<float> lg, lc;
      ASSERT_TRUE((*gpu)->Run(b, &og, &lg).ok());
      ASSERT_TRUE((*cpu)->Run(b, &oc, &lc).ok());
      const double tol = t == DType::kBF16 ? 2e-2 : 4e-3;
      ExpectClose(t, og, oc, tol, tol);
      ASSERT_EQ(lg.size(), lc.size());
      for (size_t i = 0; i < lg.size(); ++i) {
        if (std::isinf(lc[i])) continue;
        ASSERT_NEAR(lg[i], lc[i], 1e-2) << i;
      }
      // Sequence 3 alone gives the same bits as inside the batch.
      AttentionBatch one = b;
      one.cu_seqlens_q = {0, 263};
      one.cu_seqlens_k = {0, 263};
      const int64_t qr = 8 * 128 * 2, kr = 2 * 128 * 2;
      one.q = std::string_view(q).substr(70 * qr);
      one.k = std::string_view(k).substr(80 * kr);
      one.v = std::string_view(v).substr(80 * kr);
      std::string o1;
      std::vector<float> l1;
      ASSERT_TRUE((*gpu)->Run(one, &o1, &l1).ok());
      EXPECT_EQ(o1, og.substr(70 * qr)) << "batch invariance, causal=" << causal;
    }
  }
}

TEST_F(CudaBackendTest, KvAttentionPrefillAndDecodeMatchCpu) {
  KvGeometry g{8, 2, 128, 16, 64, 16};
  auto gpu = cuda_->CreateKvAttention(g);
  auto cpu = cpu_->CreateKvAttention(g);
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  const DType t = DType::kBF16;
  std::vector<int32_t> blocks_a = {3, 9, 1}, blocks_b = {7};
  int64_t pos_a = 0, pos_b = 0;
  for (int step = 0; step < 4; ++step) {
    const int na = step == 0 ? 37 : 1, nb = step == 0 ? 5 : 2;
    std::string qa = Random(t, na * 8 * 128), ka = Random(t, na * 2 * 128), va = Random(t, na * 2 * 128);
    std::string qb = Random(t, nb * 8 * 128), kb = Random(t, nb * 2 * 128), vb = Random(t, nb * 2 * 128);
    KvBatch b;
    b.dtype = t;
    b.softmax_scale = 1.0f / std::sqrt(128.0f);
    b.items.push_back({"seq-a", HostBytes(qa), HostBytes(ka), HostBytes(va), na, pos_a, &blocks_a, {}});
    b.items.push_back({"seq-b", HostBytes(qb), HostBytes(kb), HostBytes(vb), nb, pos_b, &blocks_b, {}});
    std::vector<std::string> og, oc;
    ASSERT_TRUE((*gpu)->Run(b, 8, 128, &og).ok());
    ASSERT_TRUE((*cpu)->Run(b, 8, 128, &oc).ok());
    for (int i = 0; i < 2; ++i) ExpectClose(t, og[i], oc[i], 2e-2, 2e-2);
    pos_a += na;
    pos_b += nb;
  }
}

TEST_F(CudaBackendTest, LinearLayersMatchCpuAndAreBatchInvariant) {
  const int K = 512, N = 384;
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(K)));
  std::vector<float> w(size_t(N) * K);
  for (float& x : w) x = nd(rng_);
  std::vector<LinearWeights> formats(4);
  formats[0].format = WeightFormat::kBf16;
  for (float x : w) formats[0].bf16.push_back(FloatToBf16(x));
  formats[1].format = WeightFormat::kInt4;
  formats[1].int4 = gemm::QuantizeInt4(w.data(), N, K, 128, false);
  formats[2].format = WeightFormat::kFp8;
  formats[2].fp8 = gemm::QuantizeFp8(w.data(), N, K, true);
  formats[3] = formats[2];
  formats[3].fp8_activations = true;
  for (auto& f : formats) {
    f.K = K;
    f.N = N;
    auto gpu = cuda_->CreateLinear(f);
    auto cpu = cpu_->CreateLinear(f);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ASSERT_TRUE(cpu.ok());
    for (DType t : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << "format " << int(f.format) << (f.fp8_activations ? " (W8A8)" : "")
                                        << ", activations " << DTypeName(t));
      const int M = 37;
      std::string x = Random(t, int64_t(M) * K), yg, yc, y1;
      ASSERT_TRUE((*gpu)->Run(t, M, x, &yg).ok());
      ASSERT_TRUE((*cpu)->Run(t, M, x, &yc).ok());
      ExpectClose(t, yg, yc, 3e-2, 3e-2);
      // Row 5 alone == row 5 of the batch of 37.
      const size_t xr = size_t(K) * 2, yr = size_t(N) * 2;
      ASSERT_TRUE((*gpu)->Run(t, 1, std::string_view(x).substr(5 * xr, xr), &y1).ok());
      EXPECT_EQ(y1, yg.substr(5 * yr, yr)) << "batch invariance, format " << int(f.format);
    }
  }
}

// Requests whose tensors sit in page-locked host memory (system shared memory) or device memory
// (CUDA shared memory) go by DMA with no staging copy; they must give the bits of the same
// requests in ordinary host memory. FP32 activations exercise the GPU's dtype conversion, a bias
// the GPU's epilogue, and a null destination a dropped output.
class MemoryKinds {
 public:
  ~MemoryKinds() {
    for (void* p : pinned_) cudaFreeHost(p);
    for (void* p : device_) cudaFree(p);
  }
  // A copy of `bytes` in memory of kind i % 3 (host, pinned, device); host copies live in `keep`.
  ConstBytes In(int i, const std::string& bytes) {
    MutableBytes m = Out(i, bytes.size());
    cudaMemcpy(m.data, bytes.data(), bytes.size(), cudaMemcpyDefault);
    return {m.data, m.size, m.kind, m.device};
  }
  MutableBytes Out(int i, size_t n) {
    void* p = nullptr;
    switch (i % 3) {
      case 0: keep_.push_back(std::make_unique<std::string>(n, '\0')); return {keep_.back()->data(), n};
      case 1: cudaMallocHost(&p, n); pinned_.push_back(p); return {static_cast<char*>(p), n, MemoryKind::kPinned};
      default: cudaMalloc(&p, n); device_.push_back(p); return {static_cast<char*>(p), n, MemoryKind::kDevice, 0};
    }
  }
  static std::string Read(const MutableBytes& m) {
    std::string s(m.size, '\0');
    cudaMemcpy(s.data(), m.data, m.size, cudaMemcpyDefault);
    return s;
  }

 private:
  std::vector<std::unique_ptr<std::string>> keep_;
  std::vector<void*> pinned_, device_;
};

TEST_F(CudaBackendTest, TensorsInPinnedOrDeviceMemoryGiveTheSameBits) {
  const int K = 256, N = 160;
  LinearWeights w;
  w.format = WeightFormat::kBf16;
  w.K = K;
  w.N = N;
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(K)));
  for (int i = 0; i < N * K; ++i) w.bf16.push_back(FloatToBf16(nd(rng_)));
  for (int i = 0; i < N; ++i) w.bias.push_back(nd(rng_));
  auto gpu = cuda_->CreateLinear(w);
  auto cpu = cpu_->CreateLinear(w);
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  for (DType t : {DType::kF32, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    const std::vector<int> rows = {2, 5, 1, 3};
    const int M = 11;
    const std::string x = Random(t, int64_t(M) * K);
    std::string want, ref;
    ASSERT_TRUE((*gpu)->Run(t, M, x, &want).ok());
    ASSERT_TRUE((*cpu)->Run(t, M, x, &ref).ok());
    ExpectClose(t, want, ref, 3e-2, 3e-2);
    MemoryKinds mem;
    Gather g;
    Scatter y;
    size_t off = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t xb = size_t(rows[i]) * K * DTypeSize(t), yb = size_t(rows[i]) * N * DTypeSize(t);
      g.pieces.push_back(mem.In(int(i), x.substr(off * K * DTypeSize(t), xb)));
      y.pieces.push_back(mem.Out(int(i) + 1, yb));
      off += rows[i];
    }
    StageTimes times;  // the staging's host time counts as the batch's input time
    ASSERT_TRUE((*gpu)->Run(t, M, g, y, &times).ok());
    EXPECT_GT(times.input_ns.load(), 0u);
    std::string got;
    for (const MutableBytes& p : y.pieces) got += MemoryKinds::Read(p);
    EXPECT_EQ(got, want);
  }
  // Attention: each sequence's Q, K, V in another kind of memory; sequence 1 drops its O.
  auto attn = cuda_->CreateAttention();
  ASSERT_TRUE(attn.ok());
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(t));
    AttentionData data;
    AttentionBatch b = RandomAttention(t, true, {0, 17, 90, 211}, {0, 30, 103, 224}, &data);
    b.want_lse = true;
    std::string want;
    std::vector<float> lse;
    ASSERT_TRUE((*attn)->Run(b, &want, &lse).ok());
    MemoryKinds mem;
    const size_t q_row = size_t(b.num_heads_q) * b.head_dim * DTypeSize(t), kv_row = size_t(b.num_heads_kv) * b.head_dim * DTypeSize(t);
    AttentionBatch c = b;
    c.q = Gather();
    c.k = Gather();
    c.v = Gather();
    for (int s = 0; s < 3; ++s) {
      const size_t q0 = b.cu_seqlens_q[s], q1 = b.cu_seqlens_q[s + 1], k0 = b.cu_seqlens_k[s], k1 = b.cu_seqlens_k[s + 1];
      auto piece = [&](const Gather& from, size_t a, size_t n) {
        std::string bytes;
        for (const ConstBytes& p : from.pieces) bytes.append(p.data, p.size);
        return mem.In(s, bytes.substr(a, n));
      };
      c.q.pieces.push_back(piece(b.q, q0 * q_row, (q1 - q0) * q_row));
      c.k.pieces.push_back(piece(b.k, k0 * kv_row, (k1 - k0) * kv_row));
      c.v.pieces.push_back(piece(b.v, k0 * kv_row, (k1 - k0) * kv_row));
      c.o.pieces.push_back(s == 1 ? MutableBytes{nullptr, (q1 - q0) * q_row} : mem.Out(s + 2, (q1 - q0) * q_row));
    }
    std::vector<float> lse2;
    ASSERT_TRUE((*attn)->Run(static_cast<const AttentionBatch&>(c), &lse2).ok());
    size_t off = 0;
    for (int s = 0; s < 3; ++s) {
      const MutableBytes& p = c.o.pieces[s];
      if (p.data) EXPECT_EQ(MemoryKinds::Read(p), want.substr(off, p.size)) << "sequence " << s;
      off += p.size;
    }
    EXPECT_EQ(lse2, lse);
  }
}

// Every visible GPU gets a worker: stateless batches alternate between GPUs (same bits on
// each), and a kv_attention session stays on the GPU its sequence id hashes to, where
// its pages live (a decode step on another GPU would read someone else's cache).
TEST_F(CudaBackendTest, SeveralGpusShareStatelessWorkAndPinSessions) {
  const int gpus = CudaDeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " visible";
  const DType t = DType::kBF16;
  auto gpu = cuda_->CreateAttention();
  ASSERT_TRUE(gpu.ok());
  AttentionData data;
  const AttentionBatch b = RandomAttention(t, true, {0, 77, 200}, {0, 77, 200}, &data);
  std::vector<uint64_t> before(gpus);
  for (int d = 0; d < gpus; ++d) before[d] = KernelCount("varlen_attention", d);
  std::string first;
  for (int i = 0; i < 2 * gpus; ++i) {
    std::string o;
    std::vector<float> lse;
    ASSERT_TRUE((*gpu)->Run(b, &o, &lse).ok());
    if (i == 0) first = o;
    EXPECT_EQ(o, first) << "run " << i << " differs from run 0";
  }
  for (int d = 0; d < gpus; ++d) EXPECT_EQ(KernelCount("varlen_attention", d) - before[d], 2u) << "GPU " << d;

  const int K = 512, N = 256;
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(K)));
  std::vector<float> w(size_t(N) * K);
  for (float& x : w) x = nd(rng_);
  LinearWeights lw;
  lw.format = WeightFormat::kInt4;
  lw.int4 = gemm::QuantizeInt4(w.data(), N, K, 128, false);
  lw.K = K;
  lw.N = N;
  auto lin = cuda_->CreateLinear(lw);
  ASSERT_TRUE(lin.ok()) << lin.status();
  for (int d = 0; d < gpus; ++d) before[d] = KernelCount("linear_w4a16", d);
  const std::string x = Random(t, 3 * K);
  std::string y0;
  for (int i = 0; i < 2 * gpus; ++i) {
    std::string y;
    ASSERT_TRUE((*lin)->Run(t, 3, x, &y).ok());
    if (i == 0) y0 = y;
    EXPECT_EQ(y, y0) << "run " << i << " differs from run 0";
  }
  for (int d = 0; d < gpus; ++d) EXPECT_EQ(KernelCount("linear_w4a16", d) - before[d], 2u) << "GPU " << d;

  // 16 sessions in every batch: a 9-token prefill, then 3 decode steps, against the CPU.
  KvGeometry g{8, 2, 128, 16, 64, 16};
  auto kv = cuda_->CreateKvAttention(g);
  auto cpu = cpu_->CreateKvAttention(g);
  ASSERT_TRUE(kv.ok() && cpu.ok());
  for (int d = 0; d < gpus; ++d) before[d] = KernelCount("paged_decode", d);
  constexpr int kSessions = 16;
  std::vector<std::vector<int32_t>> blocks(kSessions);
  std::vector<std::string> ids(kSessions);
  for (int s = 0; s < kSessions; ++s) {
    blocks[s] = {s};  // each session's one page; 9 + 3 tokens fit
    ids[s] = "session-" + std::to_string(s);
  }
  for (int step = 0; step < 4; ++step) {
    const int n = step == 0 ? 9 : 1;
    KvBatch batch;
    batch.dtype = t;
    batch.softmax_scale = 1.0f / std::sqrt(128.0f);
    std::vector<std::string> data;
    data.reserve(3 * kSessions);
    for (int s = 0; s < kSessions; ++s) {
      data.push_back(Random(t, n * 8 * 128));
      data.push_back(Random(t, n * 2 * 128));
      data.push_back(Random(t, n * 2 * 128));
    }
    for (int s = 0; s < kSessions; ++s) {
      batch.items.push_back({ids[s], HostBytes(data[3 * s]), HostBytes(data[3 * s + 1]), HostBytes(data[3 * s + 2]),
                             n, step == 0 ? 0 : 8 + step, &blocks[s], {}});
    }
    std::vector<std::string> og, oc;
    ASSERT_TRUE((*kv)->Run(batch, 8, 128, &og).ok());
    ASSERT_TRUE((*cpu)->Run(batch, 8, 128, &oc).ok());
    for (int s = 0; s < kSessions; ++s) {
      SCOPED_TRACE(::testing::Message() << "session " << s << ", step " << step);
      ExpectClose(t, og[s], oc[s], 2e-2, 2e-2);
    }
  }
  for (int d = 0; d < gpus; ++d) EXPECT_GE(KernelCount("paged_decode", d) - before[d], 4u) << "GPU " << d << " got no sessions";
}

}  // namespace
}  // namespace flashq::server
