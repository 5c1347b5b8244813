// GPU attention tests (label `gpu`): varlen prefill, paged split-KV decode and KV append against
// the float64 CPU reference on fresh random inputs. The error bound is flash-attention's rule:
// max|gpu - ref64| <= 2 * max|lowp - ref64| + 1e-5, where lowp is a same-precision reference
// (inputs in the dtype, P rounded to the dtype before P*V, output rounded to the dtype).
// Outputs are poisoned (NaN) before each run and every element must be written. Also checked:
// bitwise determinism across runs, and bitwise batch invariance (a sequence alone == the same
// sequence inside a ragged batch launched with a larger grid bound).
// Long contexts (16k and 32k keys, decode with up to 512 splits) are checked against the same
// float64 reference with a relative bound, rtol * (rms(ref row) + |ref rounded to the dtype|),
// on sampled query rows where the reference of every row would be too slow.
// With no GPU visible the binary exits 77 before running a test (ctest: SKIP_RETURN_CODE 77).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_ref.h"
#include "common/dtype.h"

namespace flashq::attention {
namespace {

#define CK(x) ASSERT_EQ(cudaSuccess, (x)) << #x
#define OKS(x)                                       \
  do {                                               \
    Status s_ = (x);                                 \
    ASSERT_TRUE(s_.ok()) << #x << ": " << s_.message(); \
  } while (0)

constexpr uint16_t kPoison16 = 0xFFFF;  // NaN in both FP16 and BF16


struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (cudaMalloc(&p, n ? n : 16) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

template <typename T>
void Upload(DevBuf& d, const std::vector<T>& h) {
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
void Download(std::vector<T>& h, const DevBuf& d) {
  ASSERT_EQ(cudaSuccess, cudaMemcpy(h.data(), d.p, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
}

uint16_t ToBits(DType t, float f) { return t == DType::kBF16 ? FloatToBf16(f) : FloatToF16(f); }
float FromBits(DType t, uint16_t b) { return t == DType::kBF16 ? Bf16ToFloat(b) : F16ToFloat(b); }

// Random normal values rounded to the dtype: `bits` for the GPU, `vals` (exactly representable) for the CPU.
void RandomTensor(DType t, size_t n, std::mt19937& rng, std::vector<uint16_t>& bits, std::vector<float>& vals) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  bits.resize(n);
  vals.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = ToBits(t, dist(rng));
    vals[i] = FromBits(t, bits[i]);
  }
}

std::vector<int32_t> Cu(const std::vector<int>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

// Same-precision reference on contiguous varlen K/V: fp32 scores, P = exp(s - max) rounded to
// the dtype before P*V, fp32 sums, output rounded to the dtype.
void LowPrecisionRef(DType t, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<int32_t>& cuq, const std::vector<int32_t>& cuk, const AttentionShape& s,
                     std::vector<float>& o) {
  const int hq = s.num_heads_q, hkv = s.num_heads_kv, d = s.head_dim, group = hq / hkv;
  o.assign(q.size(), 0.0f);
  std::vector<float> sc;
  std::vector<float> acc(static_cast<size_t>(d));
  for (int b = 0; b < s.batch; ++b) {
    const int lq = cuq[b + 1] - cuq[b], lk = cuk[b + 1] - cuk[b];
    sc.resize(size_t(std::max(lk, 1)));
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < lq; ++i) {
        const float* qi = &q[(size_t(cuq[b] + i) * hq + h) * d];
        float* oi = &o[(size_t(cuq[b] + i) * hq + h) * d];
        int vis = lk;
        if (s.causal) vis = std::max(0, std::min(lk, i + lk - lq + 1));
        if (vis == 0) continue;
        float mx = -INFINITY;
        for (int j = 0; j < vis; ++j) {
          const float* kj = &k[(size_t(cuk[b] + j) * hkv + h / group) * d];
          float dot = 0.0f;
          for (int c = 0; c < d; ++c) dot += qi[c] * kj[c];
          sc[size_t(j)] = dot * s.softmax_scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        float sum = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int j = 0; j < vis; ++j) {
          const float pj = std::exp(sc[size_t(j)] - mx);
          sum += pj;
          const float pr = RoundThrough(t, pj);
          const float* vj = &v[(size_t(cuk[b] + j) * hkv + h / group) * d];
          for (int c = 0; c < d; ++c) acc[size_t(c)] += pr * vj[c];
        }
        for (int c = 0; c < d; ++c) oi[c] = RoundThrough(t, acc[size_t(c)] / sum);
      }
  }
}

// Compares GPU output bits against ref64 and lowp; checks every element was written.
void CheckAgainstRefs(DType t, const std::vector<uint16_t>& gpu, const std::vector<float>& ref,
                      const std::vector<float>& lowp, const char* what) {
  ASSERT_EQ(gpu.size(), ref.size());
  double err = 0, err_lowp = 0, num = 0, den = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const float g = FromBits(t, gpu[i]);
    ASSERT_FALSE(std::isnan(g)) << what << ": element " << i << " not written (or NaN)";
    err = std::max(err, double(std::fabs(g - ref[i])));
    err_lowp = std::max(err_lowp, double(std::fabs(lowp[i] - ref[i])));
    num += double(g - ref[i]) * (g - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  std::printf("  %s: max|gpu-ref64| %.3g  max|lowp-ref64| %.3g  rel-l2 %.3g\n", what, err, err_lowp, rel);
  EXPECT_LE(err, 2 * err_lowp + 1e-5) << what;
  EXPECT_LT(rel, t == DType::kBF16 ? 1e-2 : 2e-3) << what;
}

void CheckLse(const std::vector<float>& gpu, const std::vector<float>& ref, const char* what) {
  for (size_t i = 0; i < gpu.size(); ++i) {
    ASSERT_FALSE(std::isnan(gpu[i])) << what << ": lse " << i << " not written";
    if (std::isinf(ref[i])) {
      ASSERT_EQ(gpu[i], ref[i]) << what << ": lse " << i;
    } else {
      ASSERT_NEAR(gpu[i], ref[i], 2e-3 + 1e-4 * std::fabs(ref[i])) << what << ": lse " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Varlen prefill

struct VarlenCase {
  DType dtype;
  int d;
  bool causal;
  int hq, hkv;
};

std::string Name(const ::testing::TestParamInfo<VarlenCase>& info) {
  const auto& c = info.param;
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + "_hd" + std::to_string(c.d) +
         (c.causal ? "_causal" : "_full") + "_gqa" + std::to_string(c.hq / c.hkv);
}

struct VarlenRun {
  DType dtype;
  AttentionShape shape;
  std::vector<int> lq, lk;
  std::vector<int32_t> cuq, cuk;
  std::vector<uint16_t> qb, kb, vb;
  std::vector<float> qf, kf, vf;
};

void MakeVarlen(VarlenRun& r, const VarlenCase& c, std::vector<int> lq, std::vector<int> lk, uint32_t seed) {
  r.dtype = c.dtype;
  r.lq = std::move(lq);
  r.lk = std::move(lk);
  r.cuq = Cu(r.lq);
  r.cuk = Cu(r.lk);
  r.shape = {int(r.lq.size()), c.hq, c.hkv, c.d, 1.0f / std::sqrt(float(c.d)), c.causal};
  std::mt19937 rng(seed);
  RandomTensor(c.dtype, size_t(r.cuq.back()) * c.hq * c.d, rng, r.qb, r.qf);
  RandomTensor(c.dtype, size_t(r.cuk.back()) * c.hkv * c.d, rng, r.kb, r.kf);
  RandomTensor(c.dtype, size_t(r.cuk.back()) * c.hkv * c.d, rng, r.vb, r.vf);
}

// Runs the kernel on the host arrays of r; returns output bits and lse.
void RunVarlenGpu(const VarlenRun& r, int max_seqlen_q, std::vector<uint16_t>& o, std::vector<float>& lse) {
  const AttentionShape& s = r.shape;
  const int tq = r.cuq.back();
  DevBuf q(r.qb.size() * 2), k(r.kb.size() * 2), v(r.vb.size() * 2), dout(size_t(tq) * s.num_heads_q * s.head_dim * 2),
      dlse(size_t(tq) * s.num_heads_q * 4), cuq(r.cuq.size() * 4), cuk(r.cuk.size() * 4);
  Upload(q, r.qb); Upload(k, r.kb); Upload(v, r.vb); Upload(cuq, r.cuq); Upload(cuk, r.cuk);
  CK(cudaMemset(dout.p, 0xFF, dout.bytes));  // poison: NaN
  CK(cudaMemset(dlse.p, 0xFF, dlse.bytes));
  VarlenAttentionParams p;
  p.q = q.p; p.k = k.p; p.v = v.p; p.o = dout.p; p.lse = dlse.as<float>();
  p.cu_seqlens_q = cuq.as<int32_t>(); p.cu_seqlens_k = cuk.as<int32_t>();
  p.q_row_stride = int64_t(s.num_heads_q) * s.head_dim; p.q_head_stride = s.head_dim;
  p.k_row_stride = p.v_row_stride = int64_t(s.num_heads_kv) * s.head_dim;
  p.k_head_stride = p.v_head_stride = s.head_dim;
  p.o_row_stride = p.q_row_stride; p.o_head_stride = s.head_dim;
  p.batch = s.batch; p.num_heads_q = s.num_heads_q; p.num_heads_kv = s.num_heads_kv; p.head_dim = s.head_dim;
  p.max_seqlen_q = max_seqlen_q; p.softmax_scale = s.softmax_scale; p.causal = s.causal; p.dtype = r.dtype;
  OKS(RunVarlenAttention(p, nullptr));
  CK(cudaDeviceSynchronize());
  o.resize(size_t(tq) * s.num_heads_q * s.head_dim);
  lse.resize(size_t(tq) * s.num_heads_q);
  Download(o, dout);
  Download(lse, dlse);
}

class VarlenGpuTest : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(VarlenGpuTest, MatchesFloat64Reference) {
  const VarlenCase c = GetParam();
  VarlenRun r;
  // Length 1, an empty query sequence, lq > lk (causal rows with no key), non-tile multiples,
  // several tiles, total_q != total_k.
  MakeVarlen(r, c, {1, 0, 77, 5, 130, 300}, {1, 3, 77, 3, 200, 520}, 1234u + c.d + c.hkv * 7 + c.causal);
  std::vector<float> ref(r.qf.size()), lse_ref(size_t(r.cuq.back()) * c.hq), lowp;
  VarlenAttentionRef<double>(r.qf.data(), r.kf.data(), r.vf.data(), r.cuq.data(), r.cuk.data(), r.shape, ref.data(),
                             lse_ref.data());
  LowPrecisionRef(c.dtype, r.qf, r.kf, r.vf, r.cuq, r.cuk, r.shape, lowp);
  std::vector<uint16_t> o;
  std::vector<float> lse;
  RunVarlenGpu(r, 300, o, lse);
  CheckAgainstRefs(c.dtype, o, ref, lowp, "varlen O");
  CheckLse(lse, lse_ref, "varlen LSE");

  // Determinism: a second run gives the same bits.
  std::vector<uint16_t> o2;
  std::vector<float> lse2;
  RunVarlenGpu(r, 300, o2, lse2);
  ASSERT_EQ(o.size(), o2.size());
  ASSERT_EQ(0, std::memcmp(o.data(), o2.data(), o.size() * 2)) << "non-deterministic O";
  ASSERT_EQ(0, std::memcmp(lse.data(), lse2.data(), lse.size() * 4)) << "non-deterministic LSE";

  // Batch invariance: each sequence alone, with a tight grid bound, equals its slice of the batch.
  for (size_t b = 0; b < r.lq.size(); ++b) {
    if (r.lq[b] == 0) continue;
    VarlenRun one;
    one.dtype = r.dtype;
    one.lq = {r.lq[b]};
    one.lk = {r.lk[b]};
    one.cuq = Cu(one.lq);
    one.cuk = Cu(one.lk);
    one.shape = r.shape;
    one.shape.batch = 1;
    const size_t qrow = size_t(c.hq) * c.d, krow = size_t(c.hkv) * c.d;
    one.qb.assign(r.qb.begin() + r.cuq[b] * qrow, r.qb.begin() + r.cuq[b + 1] * qrow);
    one.kb.assign(r.kb.begin() + r.cuk[b] * krow, r.kb.begin() + r.cuk[b + 1] * krow);
    one.vb.assign(r.vb.begin() + r.cuk[b] * krow, r.vb.begin() + r.cuk[b + 1] * krow);
    std::vector<uint16_t> o1;
    std::vector<float> l1;
    RunVarlenGpu(one, r.lq[b], o1, l1);
    ASSERT_EQ(o1.size(), size_t(r.lq[b]) * qrow);
    ASSERT_EQ(0, std::memcmp(o1.data(), o.data() + r.cuq[b] * qrow, o1.size() * 2)) << "batch variance, seq " << b;
    for (int h = 0; h < c.hq; ++h)
      for (int i = 0; i < r.lq[b]; ++i)
        ASSERT_EQ(FloatBits(l1[size_t(h) * r.lq[b] + i]), FloatBits(lse[size_t(h) * r.cuq.back() + r.cuq[b] + i]))
            << "LSE batch variance, seq " << b;
  }
}

std::vector<VarlenCase> VarlenCases() {
  std::vector<VarlenCase> v;
  for (DType t : {DType::kBF16, DType::kF16})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (int hkv : {8, 2, 1}) v.push_back({t, d, causal, 8, hkv});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, VarlenGpuTest, ::testing::ValuesIn(VarlenCases()), Name);

TEST(VarlenGpu, RejectsBadParams) {
  VarlenAttentionParams p;
  p.batch = 1; p.num_heads_q = 6; p.num_heads_kv = 4; p.head_dim = 128; p.max_seqlen_q = 1; p.softmax_scale = 1.0f;
  EXPECT_EQ(RunVarlenAttention(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.num_heads_q = 8; p.head_dim = 96;
  EXPECT_EQ(RunVarlenAttention(p, nullptr).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Paged decode (+ append)

struct PagedCase {
  DType dtype;
  int d;
  int hq, hkv;
  int page;
  int q_len;  // new tokens per sequence (0-length sequences are added separately)
  int split;  // split_tokens (0 = the default)
};

std::string PagedName(const ::testing::TestParamInfo<PagedCase>& info) {
  const auto& c = info.param;
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + "_hd" + std::to_string(c.d) + "_hq" +
         std::to_string(c.hq) + "_gqa" + std::to_string(c.hq / c.hkv) + "_page" + std::to_string(c.page) + "_q" + std::to_string(c.q_len) + "_split" +
         std::to_string(c.split);
}

struct PagedSetup {
  PagedCase c;
  std::vector<int> lq, lk;
  std::vector<int32_t> cuq, cuk, seqlens, table;
  int max_blocks = 0, num_blocks = 0;
  std::vector<uint16_t> qb, kb, vb, kcache, vcache;  // kb/vb: contiguous varlen copies of the cached K/V
  std::vector<float> qf, kf, vf;
};

void MakePaged(PagedSetup& s, const PagedCase& c, std::vector<int> lk, uint32_t seed, int spare = 3) {
  s.c = c;
  s.lk = std::move(lk);
  s.lq.clear();
  for (int l : s.lk) s.lq.push_back(std::min(l, c.q_len));
  s.cuq = Cu(s.lq);
  s.cuk = Cu(s.lk);
  s.seqlens.assign(s.lk.begin(), s.lk.end());
  int max_lk = *std::max_element(s.lk.begin(), s.lk.end());
  s.max_blocks = spare * ((max_lk + c.page - 1) / c.page) + 1;  // spare capacity: larger max_seqlen_k bounds are legal
  const int batch = int(s.lk.size());
  s.num_blocks = batch * s.max_blocks + 3;
  std::mt19937 rng(seed);
  std::vector<int32_t> perm(size_t(s.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  s.table.assign(perm.begin(), perm.begin() + batch * s.max_blocks);
  RandomTensor(c.dtype, size_t(s.cuq.back()) * c.hq * c.d, rng, s.qb, s.qf);
  RandomTensor(c.dtype, size_t(s.cuk.back()) * c.hkv * c.d, rng, s.kb, s.kf);
  RandomTensor(c.dtype, size_t(s.cuk.back()) * c.hkv * c.d, rng, s.vb, s.vf);
  // Unused cache slots hold NaN: a kernel that reads past seqlens_k or through a wrong page fails.
  const size_t cache_elems = size_t(s.num_blocks) * c.page * c.hkv * c.d;
  s.kcache.assign(cache_elems, kPoison16);
  s.vcache.assign(cache_elems, kPoison16);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < s.lk[b]; ++j) {
      const size_t dst = (size_t(s.table[size_t(b) * s.max_blocks + j / c.page]) * c.page + j % c.page) * c.hkv * c.d;
      const size_t src = size_t(s.cuk[b] + j) * c.hkv * c.d;
      std::copy_n(s.kb.begin() + src, c.hkv * c.d, s.kcache.begin() + dst);
      std::copy_n(s.vb.begin() + src, c.hkv * c.d, s.vcache.begin() + dst);
    }
}

// Runs decode; if `append` is set, the cache is uploaded without the new tokens' K/V and
// RunKvAppend writes them first.
void RunPagedGpu(const PagedSetup& s, bool append, int max_q, int max_k, std::vector<uint16_t>& o,
                 std::vector<float>& lse) {
  const PagedCase& c = s.c;
  const int batch = int(s.lk.size()), tq = s.cuq.back();
  DevBuf q(s.qb.size() * 2), kc(s.kcache.size() * 2), vc(s.vcache.size() * 2), table(s.table.size() * 4),
      seq(s.seqlens.size() * 4), cuq(s.cuq.size() * 4), dout(size_t(tq) * c.hq * c.d * 2), dlse(size_t(tq) * c.hq * 4);
  Upload(q, s.qb); Upload(table, s.table); Upload(seq, s.seqlens); Upload(cuq, s.cuq);
  const int64_t kv_row = int64_t(c.hkv) * c.d, kv_block = int64_t(c.page) * kv_row;
  if (!append) {
    Upload(kc, s.kcache);
    Upload(vc, s.vcache);
  } else {
    // Cache without the new tokens (poison there), then append them from [total_new, Hkv, D].
    std::vector<uint16_t> k0 = s.kcache, v0 = s.vcache;
    std::vector<uint16_t> kn, vn;
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < s.lq[b]; ++i) {
        const int j = s.lk[b] - s.lq[b] + i;
        const size_t slot = (size_t(s.table[size_t(b) * s.max_blocks + j / c.page]) * c.page + j % c.page) * kv_row;
        kn.insert(kn.end(), k0.begin() + slot, k0.begin() + slot + kv_row);
        vn.insert(vn.end(), v0.begin() + slot, v0.begin() + slot + kv_row);
        std::fill_n(k0.begin() + slot, kv_row, kPoison16);
        std::fill_n(v0.begin() + slot, kv_row, kPoison16);
      }
    Upload(kc, k0);
    Upload(vc, v0);
    DevBuf dkn(kn.size() * 2 + 16), dvn(vn.size() * 2 + 16);
    Upload(dkn, kn);
    Upload(dvn, vn);
    KvAppendParams a;
    a.k_new = dkn.p; a.v_new = dvn.p; a.k_cache = kc.p; a.v_cache = vc.p;
    a.block_table = table.as<int32_t>(); a.seqlens_k = seq.as<int32_t>(); a.cu_seqlens_new = cuq.as<int32_t>();
    a.new_row_stride = kv_row; a.new_head_stride = c.d;
    a.kv_block_stride = kv_block; a.kv_row_stride = kv_row; a.kv_head_stride = c.d;
    a.batch = batch; a.max_new = max_q; a.max_blocks_per_seq = s.max_blocks; a.page_size = c.page;
    a.num_heads_kv = c.hkv; a.head_dim = c.d; a.dtype = c.dtype;
    OKS(RunKvAppend(a, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> kback(s.kcache.size()), vback(s.vcache.size());
    Download(kback, kc);
    Download(vback, vc);
    ASSERT_EQ(0, std::memcmp(kback.data(), s.kcache.data(), kback.size() * 2)) << "append wrote K wrong";
    ASSERT_EQ(0, std::memcmp(vback.data(), s.vcache.data(), vback.size() * 2)) << "append wrote V wrong";
  }
  const size_t ws_bytes = PagedDecodeWorkspaceBytes(tq, c.hq, c.d, max_k, c.split);
  DevBuf ws(ws_bytes);
  if (ws_bytes) {
    CK(cudaMemset(ws.p, 0xFF, ws_bytes));
  }
  CK(cudaMemset(dout.p, 0xFF, dout.bytes));
  CK(cudaMemset(dlse.p, 0xFF, dlse.bytes));
  PagedDecodeParams p;
  p.q = q.p; p.k_cache = kc.p; p.v_cache = vc.p; p.o = dout.p; p.lse = dlse.as<float>();
  p.block_table = table.as<int32_t>(); p.seqlens_k = seq.as<int32_t>(); p.cu_seqlens_q = cuq.as<int32_t>();
  p.workspace = ws.p; p.workspace_bytes = ws_bytes;
  p.q_row_stride = p.o_row_stride = int64_t(c.hq) * c.d; p.q_head_stride = p.o_head_stride = c.d;
  p.kv_block_stride = kv_block; p.kv_row_stride = kv_row; p.kv_head_stride = c.d;
  p.total_q = tq; p.batch = batch; p.max_blocks_per_seq = s.max_blocks; p.page_size = c.page;
  p.max_seqlen_q = max_q; p.max_seqlen_k = max_k;
  p.num_heads_q = c.hq; p.num_heads_kv = c.hkv; p.head_dim = c.d;
  p.softmax_scale = 1.0f / std::sqrt(float(c.d)); p.causal = true; p.dtype = c.dtype; p.split_tokens = c.split;
  OKS(RunPagedDecode(p, nullptr));
  CK(cudaDeviceSynchronize());
  o.resize(size_t(tq) * c.hq * c.d);
  lse.resize(size_t(tq) * c.hq);
  Download(o, dout);
  Download(lse, dlse);
}

class PagedGpuTest : public ::testing::TestWithParam<PagedCase> {};

TEST_P(PagedGpuTest, MatchesFloat64Reference) {
  const PagedCase c = GetParam();
  PagedSetup s;
  // Length 1, an empty sequence, one split, several splits, non-multiples of the tile and page.
  MakePaged(s, c, {1, 0, 200, 2100, 257, 64}, 99u + c.page + c.d + c.hkv + c.q_len);
  const int batch = int(s.lk.size());
  AttentionShape shape{batch, c.hq, c.hkv, c.d, 1.0f / std::sqrt(float(c.d)), true};
  ASSERT_TRUE(CheckPaged(s.table.data(), s.max_blocks, c.page, s.num_blocks, s.seqlens.data(), s.cuq.data(), batch).ok());
  // The float64 reference reads the cache as floats (with the NaN slots, which it must never touch).
  std::vector<float> kcf(s.kcache.size()), vcf(s.vcache.size());
  for (size_t i = 0; i < kcf.size(); ++i) {
    kcf[i] = FromBits(c.dtype, s.kcache[i]);
    vcf[i] = FromBits(c.dtype, s.vcache[i]);
  }
  std::vector<float> ref(s.qf.size()), lse_ref(size_t(s.cuq.back()) * c.hq), lowp;
  PagedAttentionRef<double>(s.qf.data(), kcf.data(), vcf.data(), s.table.data(), s.max_blocks, c.page,
                            s.seqlens.data(), s.cuq.data(), shape, ref.data(), lse_ref.data());
  LowPrecisionRef(c.dtype, s.qf, s.kf, s.vf, s.cuq, s.cuk, shape, lowp);
  std::vector<uint16_t> o, o2;
  std::vector<float> lse, lse2;
  RunPagedGpu(s, /*append=*/true, c.q_len, 2100, o, lse);
  CheckAgainstRefs(c.dtype, o, ref, lowp, "paged O");
  CheckLse(lse, lse_ref, "paged LSE");
  // Determinism, and invariance to the grid bounds (max_seqlen_k larger than needed).
  RunPagedGpu(s, false, c.q_len, s.max_blocks * c.page, o2, lse2);
  ASSERT_EQ(o.size(), o2.size());
  ASSERT_EQ(0, std::memcmp(o.data(), o2.data(), o.size() * 2)) << "decode not deterministic / bound-dependent";
  ASSERT_EQ(0, std::memcmp(lse.data(), lse2.data(), lse.size() * 4));
  // Batch invariance: sequence 3 (several splits) alone.
  PagedSetup one;
  MakePaged(one, c, {s.lk[3]}, 7);
  one.qb.assign(s.qb.begin() + size_t(s.cuq[3]) * c.hq * c.d, s.qb.begin() + size_t(s.cuq[4]) * c.hq * c.d);
  one.kcache = s.kcache;  // same cache, same pages for this sequence
  one.vcache = s.vcache;
  one.num_blocks = s.num_blocks;
  one.table.assign(s.table.begin() + 3 * s.max_blocks, s.table.begin() + 4 * s.max_blocks);
  one.max_blocks = s.max_blocks;
  std::vector<uint16_t> o1;
  std::vector<float> l1;
  RunPagedGpu(one, false, s.lq[3], s.lk[3], o1, l1);
  ASSERT_EQ(o1.size(), size_t(s.lq[3]) * c.hq * c.d);
  ASSERT_EQ(0, std::memcmp(o1.data(), o.data() + size_t(s.cuq[3]) * c.hq * c.d, o1.size() * 2))
      << "decode batch variance";
}

std::vector<PagedCase> PagedCases() {
  std::vector<PagedCase> v;
  for (DType t : {DType::kBF16, DType::kF16})
    for (int d : {64, 128, 256})
      for (int hkv : {8, 2, 1}) v.push_back({t, d, 8, hkv, d == 128 ? 16 : 64, 1, 256});
  // Page sizes and multi-token decode on the main head dim, default split.
  // 48 does not tile the 64-key tiles: the cp.async path on sm_90 (the others load whole tiles by TMA).
  for (int page : {16, 48, 64, 256})
    for (int ql : {1, 3}) v.push_back({DType::kBF16, 128, 32, 8, page, ql, 0});
  v.push_back({DType::kF16, 128, 16, 2, 32, 5, 128});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, PagedGpuTest, ::testing::ValuesIn(PagedCases()), PagedName);

// Decode launches from several threads at once, with contexts of different lengths (so different split
// counts and combine shared memory) and different page sizes: every launch must succeed and give the bits of
// the same launch alone. A per-launch shared-memory limit raced here (cudaErrorInvalidValue).
TEST(PagedGpu, ConcurrentLaunchesOfDifferentShapesAllSucceed) {
  struct Lane {
    PagedSetup s;
    std::vector<std::unique_ptr<DevBuf>> b;
    DevBuf& buf(int i) { return *b[size_t(i)]; }
    PagedDecodeParams p;
    cudaStream_t stream = nullptr;
    std::vector<uint16_t> want;
  };
  const std::vector<std::pair<PagedCase, std::vector<int>>> shapes = {
      {{DType::kBF16, 128, 32, 8, 16, 1, 0}, {3000, 17, 2500}},
      {{DType::kBF16, 128, 32, 8, 16, 1, 0}, {700}},
      {{DType::kBF16, 128, 32, 8, 64, 2, 0}, {9000, 40}},
      {{DType::kF16, 128, 32, 8, 32, 1, 128}, {1500, 1500}}};
  std::vector<Lane> lanes(shapes.size());
  for (size_t i = 0; i < lanes.size(); ++i) {
    Lane& l = lanes[i];
    MakePaged(l.s, shapes[i].first, shapes[i].second, 90 + uint32_t(i));
    const PagedCase& c = l.s.c;
    const int tq = l.s.cuq.back();
    const int max_k = *std::max_element(l.s.lk.begin(), l.s.lk.end());
    const size_t ws_bytes = PagedDecodeWorkspaceBytes(tq, c.hq, c.d, max_k, c.split);
    for (size_t bytes : {l.s.qb.size() * 2, l.s.kcache.size() * 2, l.s.vcache.size() * 2, l.s.table.size() * 4,
                         l.s.seqlens.size() * 4, l.s.cuq.size() * 4, size_t(tq) * c.hq * c.d * 2, ws_bytes + 16})
      l.b.push_back(std::make_unique<DevBuf>(bytes));
    Upload(l.buf(0), l.s.qb); Upload(l.buf(1), l.s.kcache); Upload(l.buf(2), l.s.vcache);
    Upload(l.buf(3), l.s.table); Upload(l.buf(4), l.s.seqlens); Upload(l.buf(5), l.s.cuq);
    PagedDecodeParams& p = l.p;
    p.q = l.buf(0).p; p.k_cache = l.buf(1).p; p.v_cache = l.buf(2).p; p.o = l.buf(6).p;
    p.block_table = l.buf(3).as<int32_t>(); p.seqlens_k = l.buf(4).as<int32_t>(); p.cu_seqlens_q = l.buf(5).as<int32_t>();
    p.workspace = l.buf(7).p; p.workspace_bytes = ws_bytes;
    p.q_row_stride = p.o_row_stride = int64_t(c.hq) * c.d; p.q_head_stride = p.o_head_stride = c.d;
    p.kv_row_stride = int64_t(c.hkv) * c.d; p.kv_block_stride = int64_t(c.page) * p.kv_row_stride; p.kv_head_stride = c.d;
    p.total_q = tq; p.batch = int(l.s.lk.size()); p.max_blocks_per_seq = l.s.max_blocks; p.page_size = c.page;
    p.max_seqlen_q = *std::max_element(l.s.lq.begin(), l.s.lq.end()); p.max_seqlen_k = max_k;
    p.num_heads_q = c.hq; p.num_heads_kv = c.hkv; p.head_dim = c.d;
    p.softmax_scale = 1.0f / std::sqrt(float(c.d)); p.causal = true; p.dtype = c.dtype; p.split_tokens = c.split;
    CK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    OKS(RunPagedDecode(p, l.stream));
    CK(cudaStreamSynchronize(l.stream));
    l.want.resize(size_t(tq) * c.hq * c.d);
    Download(l.want, l.buf(6));
  }
  std::vector<std::string> failures(lanes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < lanes.size(); ++i) {
    threads.emplace_back([&, i] {
      if (cudaSetDevice(0) != cudaSuccess) failures[i] = "cudaSetDevice";  // a CUDA thread's first call
      Lane& l = lanes[i];
      for (int it = 0; it < 300 && failures[i].empty(); ++it) {
        const Status st = RunPagedDecode(l.p, l.stream);
        if (!st.ok()) failures[i] = "launch " + std::to_string(it) + ": " + st.message();
      }
      if (cudaStreamSynchronize(l.stream) != cudaSuccess && failures[i].empty()) failures[i] = "stream failed";
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < lanes.size(); ++i) {
    EXPECT_EQ(failures[i], "") << "lane " << i;
    std::vector<uint16_t> got(lanes[i].want.size());
    Download(got, lanes[i].buf(6));
    EXPECT_EQ(0, std::memcmp(got.data(), lanes[i].want.data(), got.size() * 2)) << "lane " << i;
    cudaStreamDestroy(lanes[i].stream);
  }
}

TEST(PagedGpu, RejectsMissingWorkspace) {
  PagedDecodeParams p;
  int dummy[4] = {};
  p.q = p.k_cache = p.v_cache = p.o = reinterpret_cast<void*>(uintptr_t(256));
  p.block_table = p.seqlens_k = p.cu_seqlens_q = dummy;
  p.batch = 1; p.total_q = 1; p.max_seqlen_q = 1; p.max_seqlen_k = 2000; p.max_blocks_per_seq = 200; p.page_size = 16;
  p.num_heads_q = 8; p.num_heads_kv = 8; p.head_dim = 128; p.softmax_scale = 0.1f;
  EXPECT_EQ(RunPagedDecode(p, nullptr).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Long contexts: the headline lengths of the benchmarks (16k and 32k keys) and decode with many
// splits. At these lengths the softmax spreads over thousands of keys and |O| is ~0.01-0.05, so
// an absolute bound like 0.02 would pass an output scaled by 0.5. The bound here is relative:
// |gpu - r| <= rtol * (rms(ref row) + |r|), r = ref64 rounded to the dtype; rtol covers one unit
// of the dtype in the last place (the output rounding) plus the rounding of P before P.V.

double LongRtol(DType t) { return t == DType::kBF16 ? 1e-2 : 2e-3; }

// rows: indices into the [total_q, Hq] row space; ref: the reference of those rows, d values each.
// Each row is bounded by its own RMS (a row over 32k keys has |O| ~ 0.01, one over 3 keys ~ 1).
void CheckRowsRelative(DType t, const std::vector<uint16_t>& gpu, const std::vector<size_t>& rows,
                       const std::vector<float>& ref, int d, const char* what) {
  // Every element must have been written (the output was poisoned with NaN).
  size_t unwritten = 0;
  for (uint16_t b : gpu) unwritten += std::isnan(FromBits(t, b)) ? 1 : 0;
  ASSERT_EQ(unwritten, 0u) << what << ": elements left unwritten (or NaN)";
  ASSERT_EQ(ref.size(), rows.size() * size_t(d));
  const double rtol = LongRtol(t);
  double worst = 0, num = 0, den = 0, min_rms = INFINITY;
  int bad = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    double sq = 0;
    for (int c = 0; c < d; ++c) sq += double(ref[i * d + c]) * ref[i * d + c];
    const double rms = std::sqrt(sq / d);
    ASSERT_GT(rms, 0.0) << what << ": row " << rows[i];
    min_rms = std::min(min_rms, rms);
    for (int c = 0; c < d; ++c) {
      const double g = FromBits(t, gpu[rows[i] * d + c]);
      const double r = RoundThrough(t, ref[i * d + c]);
      const double err = std::fabs(g - r);
      num += err * err;
      den += r * r;
      worst = std::max(worst, err / (rms + std::fabs(r)));
      if (!(err <= rtol * (rms + std::fabs(r))) && ++bad <= 5)
        ADD_FAILURE() << what << ": row " << rows[i] << " col " << c << ": " << g << " vs " << r << " (row rms " << rms
                      << ")";
    }
  }
  const double rel_l2 = std::sqrt(num / den);
  std::printf("  %s: %zu rows, smallest row rms %.3g, max err/(rms+|ref|) %.3g, rel-l2 %.3g\n", what, rows.size(),
              min_rms, worst, rel_l2);
  EXPECT_EQ(bad, 0) << what;
  EXPECT_LT(rel_l2, t == DType::kBF16 ? 1e-2 : 2e-3) << what;  // as CheckAgainstRefs
}

struct LongPrefillCase {
  std::string name;
  DType dtype;
  int d, hq, hkv;
  bool causal;
  std::vector<int> lq, lk;
};
void PrintTo(const LongPrefillCase& c, std::ostream* os) { *os << c.name; }

class LongPrefillGpuTest : public ::testing::TestWithParam<LongPrefillCase> {};

TEST_P(LongPrefillGpuTest, SampledRowsMatchFloat64Reference) {
  const LongPrefillCase& c = GetParam();
  VarlenRun r;
  MakeVarlen(r, {c.dtype, c.d, c.causal, c.hq, c.hkv}, c.lq, c.lk, 4242u + c.d + unsigned(c.lk[0]));
  std::vector<uint16_t> o;
  std::vector<float> lse;
  RunVarlenGpu(r, *std::max_element(c.lq.begin(), c.lq.end()), o, lse);
  // Sample query rows of each sequence: the first and last 4 (the fewest and the most keys under
  // the causal mask) and 16 spread at random; every head of each.
  std::mt19937 rng(99);
  std::vector<size_t> rows;  // in [total_q, Hq] row space
  std::vector<float> ref, lse_ref;
  const size_t qrow = size_t(c.hq) * c.d, krow = size_t(c.hkv) * c.d;
  for (size_t b = 0; b < c.lq.size(); ++b) {
    std::vector<int> picks;
    for (int i = 0; i < std::min(4, c.lq[b]); ++i) picks.push_back(i), picks.push_back(c.lq[b] - 1 - i);
    for (int i = 0; i < 16 && c.lq[b] > 8; ++i) picks.push_back(int(rng() % uint32_t(c.lq[b])));
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (int i : picks) {
      // Row i sees keys [0, visible) of its sequence: the reference of one query row over them.
      const int visible = c.causal ? std::max(0, std::min(c.lk[b], i + c.lk[b] - c.lq[b] + 1)) : c.lk[b];
      if (visible == 0) continue;
      const int32_t cq[2] = {0, 1}, ck[2] = {0, visible};
      std::vector<float> o1(qrow), l1(size_t(c.hq));
      VarlenAttentionRef<double>(&r.qf[(size_t(r.cuq[b]) + i) * qrow], &r.kf[size_t(r.cuk[b]) * krow],
                                 &r.vf[size_t(r.cuk[b]) * krow], cq, ck, {1, c.hq, c.hkv, c.d, r.shape.softmax_scale, false},
                                 o1.data(), l1.data());
      for (int h = 0; h < c.hq; ++h) {
        rows.push_back((size_t(r.cuq[b]) + i) * c.hq + h);
        ref.insert(ref.end(), o1.begin() + size_t(h) * c.d, o1.begin() + size_t(h + 1) * c.d);
        const float g = lse[size_t(h) * r.cuq.back() + r.cuq[b] + i];
        EXPECT_NEAR(g, l1[size_t(h)], 2e-3 + 1e-4 * std::fabs(l1[size_t(h)])) << "LSE, seq " << b << " row " << i;
      }
    }
  }
  CheckRowsRelative(c.dtype, o, rows, ref, c.d, c.name.c_str());
}

std::vector<LongPrefillCase> LongPrefillCases() {
  const DType bf = DType::kBF16, f16 = DType::kF16;
  return {
      {"bf16_hd128_causal_16k_ragged", bf, 128, 2, 1, true, {16384, 77}, {16384, 77}},
      {"bf16_hd128_full_16k", bf, 128, 2, 1, false, {16384}, {16384}},
      {"fp16_hd128_causal_16k", f16, 128, 2, 2, true, {16384}, {16384}},
      {"bf16_hd64_full_16k_gqa4", bf, 64, 4, 1, false, {16384}, {16384}},
      {"bf16_hd256_causal_16k", bf, 256, 2, 1, true, {16384}, {16384}},
      {"bf16_hd128_causal_32k", bf, 128, 2, 1, true, {32768}, {32768}},
      {"fp16_hd128_causal_32k_chunk", f16, 128, 2, 1, true, {1000}, {32768}},  // 1000 new queries over 32k keys
      {"bf16_hd128_full_32k_tail", bf, 128, 2, 1, false, {32768 - 37}, {32768 - 37}},
  };
}

INSTANTIATE_TEST_SUITE_P(Long, LongPrefillGpuTest, ::testing::ValuesIn(LongPrefillCases()),
                         [](const ::testing::TestParamInfo<LongPrefillCase>& i) { return i.param.name; });

// Paged decode over 16k-32k keys: the default split (16-32 splits per sequence), and small splits
// (up to 512 per sequence) whose log-sum-exp merge then carries the whole result. The reference is
// computed for every row (decode has few), from the contiguous K/V.
struct LongDecodeCase {
  std::string name;
  PagedCase c;
  std::vector<int> lk;
  bool append;
};
void PrintTo(const LongDecodeCase& c, std::ostream* os) { *os << c.name; }

class LongDecodeGpuTest : public ::testing::TestWithParam<LongDecodeCase> {};

TEST_P(LongDecodeGpuTest, MatchesFloat64Reference) {
  const LongDecodeCase& lc = GetParam();
  const PagedCase& c = lc.c;
  PagedSetup s;
  MakePaged(s, c, lc.lk, 777u + unsigned(c.split), /*spare=*/1);
  const int batch = int(lc.lk.size()), max_k = *std::max_element(lc.lk.begin(), lc.lk.end());
  AttentionShape shape{batch, c.hq, c.hkv, c.d, 1.0f / std::sqrt(float(c.d)), true};
  std::vector<float> ref(s.qf.size()), lse_ref(size_t(s.cuq.back()) * c.hq);
  VarlenAttentionRef<double>(s.qf.data(), s.kf.data(), s.vf.data(), s.cuq.data(), s.cuk.data(), shape, ref.data(),
                             lse_ref.data());
  std::vector<uint16_t> o;
  std::vector<float> lse;
  RunPagedGpu(s, lc.append, c.q_len, max_k, o, lse);
  std::vector<size_t> rows(size_t(s.cuq.back()) * c.hq);
  std::iota(rows.begin(), rows.end(), size_t(0));
  CheckRowsRelative(c.dtype, o, rows, ref, c.d, lc.name.c_str());
  CheckLse(lse, lse_ref, lc.name.c_str());
}

std::vector<LongDecodeCase> LongDecodeCases() {
  const DType bf = DType::kBF16, f16 = DType::kF16;
  return {
      // {dtype, d, hq, hkv, page, q_len, split}
      {"bf16_hd128_32k_default_split", {bf, 128, 8, 2, 16, 1, 0}, {32768, 16384 + 5, 1}, true},
      {"bf16_hd128_32k_split64_512_splits", {bf, 128, 8, 2, 64, 1, 64}, {32768, 1000}, false},
      {"fp16_hd128_32k_split256_q4", {f16, 128, 8, 1, 16, 4, 256}, {32768 - 3, 20000}, true},
      {"bf16_hd64_16k_split128_gqa8", {bf, 64, 8, 1, 32, 2, 128}, {16384, 16384 - 100}, false},
      {"bf16_hd256_16k_default_split", {bf, 256, 4, 2, 16, 1, 0}, {16384 + 1}, false},
  };
}

INSTANTIATE_TEST_SUITE_P(Long, LongDecodeGpuTest, ::testing::ValuesIn(LongDecodeCases()),
                         [](const ::testing::TestParamInfo<LongDecodeCase>& i) { return i.param.name; });

}  // namespace
}  // namespace flashq::attention
