// Load-time preparation (repack + upload) of int4 and FP8 weights, and the host side of
// RunW4A16 / RunW8A16: workspace carving, act-order gather, row chunking, and the
// non-invariant large-M path (dequantize to 16-bit, then cuBLASLt). Layouts: see
// qlinear_fragment.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "common/dtype.h"
#include "kernels/gemm/gemm_internal.h"

namespace flashq::gemm {
namespace {

size_t Align256(size_t v) { return (v + 255) & ~size_t(255); }

// Host staging of several arrays into one device allocation.
struct Blob {
  std::vector<uint8_t> bytes;
  size_t Add(const void* src, size_t n) {
    size_t off = Align256(bytes.size());
    bytes.resize(off + n);
    if (n) std::memcpy(bytes.data() + off, src, n);
    return off;
  }
  Status Upload(void** dev) {
    FQ_CUDA_RETURN(cudaMalloc(dev, std::max<size_t>(bytes.size(), 256)));
    Status s = CudaStatus(cudaMemcpy(*dev, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy(weights)");
    if (!s.ok()) {
      cudaFree(*dev);
      *dev = nullptr;
    }
    return s;
  }
};

struct WsLayout {
  size_t counters = 0, partial = 0, xperm = 0, wdeq = 0, xready = 0, xpack = 0, total = 0;
};

// xready and xpack: int4, whose launches of kWgmmaMinRows rows or more may take the sm_90 wgmma kernel. xready holds
// the words of the kernel's own packing (departures, a flag per stage), which the kernels leave zeroed; like the
// counters, it sits where no other call's data can be, whatever its M (the regions after it move with M). xpack holds
// X packed per 64-row tile and 4-step stage.
WsLayout KernelWorkspace(int N, int K, const SplitPlan& plan, int max_m, bool act_order, bool dequant_path, bool xpack) {
  WsLayout l;
  size_t off = 0;
  l.counters = off;
  off = Align256(off + sizeof(int) * size_t(plan.n_blocks) * (kMaxRowsPerLaunch / 16));
  const size_t stages = PackedXStages(plan.splits, plan.steps_per_warp);  // of packed X per tile
  l.xready = off;
  if (xpack) off = Align256(off + sizeof(int) * (1 + stages));
  l.partial = off;
  if (plan.splits > 1) off = Align256(off + sizeof(float) * size_t(plan.splits) * std::min(max_m, kMaxRowsPerLaunch) * N);
  l.xperm = off;
  if (act_order) off = Align256(off + 2 * size_t(std::max(max_m, 1)) * K);
  l.wdeq = off;
  if (dequant_path) off = Align256(off + 2 * size_t(N) * K);
  l.xpack = off;
  if (xpack && max_m >= kWgmmaMinRows)
    off = Align256(off + size_t((std::min(max_m, kMaxRowsPerLaunch) + kWgmmaTileRows - 1) / kWgmmaTileRows) * stages * kWgmmaXStageBytes);
  l.total = off;
  return l;
}

Status CheckArgs(const LinearArgs& a, int K, size_t need, const char* who) {
  if (a.M < 0) return InvalidArgument(std::string(who) + ": M must be >= 0");
  if (a.M > 0 && (!a.x || !a.y)) return InvalidArgument(std::string(who) + ": x and y must be device pointers");
  if (a.workspace_bytes < need)
    return InvalidArgument(std::string(who) + ": workspace too small (" + std::to_string(a.workspace_bytes) + " < " + std::to_string(need) +
                           " bytes for M=" + std::to_string(a.M) + ")");
  if (K % 8 != 0) return InvalidArgument(std::string(who) + ": K must be a multiple of 8");
  return Status::Ok();
}

cudaError_t LaunchKernel(bool fp8, ActType act, const detail::QLinearParams& p, const GemmTuning& t, cudaStream_t s) {
  const bool f16 = act == ActType::kF16;
  if (fp8) return f16 ? detail::LaunchFp8F16(p, t, s) : detail::LaunchFp8Bf16(p, t, s);
  if (p.gsteps % kSubSteps != 0) return f16 ? detail::LaunchInt4F16StepFlush(p, t, s) : detail::LaunchInt4Bf16StepFlush(p, t, s);
  return f16 ? detail::LaunchInt4F16StageFlush(p, t, s) : detail::LaunchInt4Bf16StageFlush(p, t, s);
}

// Runs the qlinear kernel over row chunks of at most kMaxRowsPerLaunch rows.
Status RunChunks(bool fp8, detail::QLinearParams p, const LinearArgs& a, const void* x, uint8_t* ws, const WsLayout& l,
                 cudaStream_t stream) {
  p.counters = reinterpret_cast<int*>(ws + l.counters);
  p.partial = reinterpret_cast<float*>(ws + l.partial);
  if (l.xpack != l.total) {
    p.xpack = ws + l.xpack;
    p.xready = reinterpret_cast<int*>(ws + l.xready);
  }
  for (int r0 = 0; r0 < a.M; r0 += kMaxRowsPerLaunch) {
    p.M = std::min(kMaxRowsPerLaunch, a.M - r0);
    p.x = static_cast<const uint16_t*>(x) + size_t(r0) * p.K;
    p.y = static_cast<uint16_t*>(a.y) + size_t(r0) * p.N;
    FQ_CUDA_RETURN(LaunchKernel(fp8, a.act, p, a.tuning, stream));
  }
  return Status::Ok();
}

}  // namespace

// ---------------- int4 ----------------

W4A16Weights::~W4A16Weights() {
  if (view_ && view_->alloc) cudaFree(view_->alloc);
}

Status W4A16Weights::Create(const Int4Weights& w, std::unique_ptr<W4A16Weights>* out, const GemmTuning& tuning) {
  FQ_RETURN_IF_ERROR(w.Validate());
  const int K = w.K, N = w.N;
  if (K % 8 != 0) return InvalidArgument("W4A16: K must be a multiple of 8 (16-byte activation rows), got K=" + std::to_string(K));
  const bool channelwise = w.group_size >= K;
  if (!channelwise && w.group_size % kStepK != 0)
    return InvalidArgument("W4A16: group_size must be a multiple of 32 or >= K (channelwise), got " + std::to_string(w.group_size));
  // Act-order: sort channels by group; each group must then be one aligned run of group_size.
  std::vector<int32_t> perm;
  if (!w.g_idx.empty()) {
    perm.resize(K);
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) { return w.g_idx[a] < w.g_idx[b]; });
    for (int p = 0; p < K; ++p)
      if (w.g_idx[perm[p]] != p / w.group_size)
        return InvalidArgument("W4A16: act-order g_idx must give every group exactly group_size channels (the last may have fewer); "
                               "group " + std::to_string(w.g_idx[perm[p]]) + " breaks this");
    bool identity = true;
    for (int p = 0; p < K && identity; ++p) identity = perm[p] == p;
    if (identity) perm.clear();
  }
  const int Gsrc = w.num_groups();
  for (float z : w.zeros)
    if (!(z >= 0 && z <= 16 && z == std::nearbyint(z)))
      return InvalidArgument("W4A16: zero points must be integers in [0, 16], got " + std::to_string(z));
  for (float s : w.scales)
    if (!std::isfinite(s) || std::fabs(s) > 65504.0f) return InvalidArgument("W4A16: scales must be finite and fit FP16");

  auto v = std::make_unique<View>();
  v->K = K;
  v->N = N;
  v->nk32 = (K + kStepK - 1) / kStepK;
  v->plan = PlanFor(K, N, tuning.target_warps);
  v->strips = v->plan.n_blocks * kWarpsN;
  v->groups = channelwise ? 1 : (K + w.group_size - 1) / w.group_size;
  v->gsteps = channelwise ? std::max(1, v->nk32) : w.group_size / kStepK;
  if (!channelwise && Gsrc != v->groups) return InvalidArgument("W4A16: g_idx names more groups than ceil(K / group_size)");
  const int strips = v->strips, nk32 = v->nk32, G = v->groups;
  auto src_k = [&](int p) { return perm.empty() ? p : perm[p]; };

  std::vector<uint32_t> qw(size_t(strips) * nk32 * 32 * 4, 0);
  for (int strip = 0; strip < strips; ++strip)
    for (int j = 0; j < nk32; ++j)
      for (int lane = 0; lane < 32; ++lane)
        for (int s = 0; s < 4; ++s) {
          const int n = strip * kWarpN + 8 * s + lane / 4, t = lane % 4;
          if (n >= N) continue;
          const uint8_t* qrow = w.q.data() + size_t(n) * K;
          uint32_t word = 0;
          for (int jj = 0; jj < 8; ++jj) {
            const int k = j * kStepK + 8 * t + jj;
            if (k < K) word |= uint32_t(qrow[src_k(k)] & 0xF) << (4 * (jj / 2) + 16 * (jj % 2));
          }
          qw[((size_t(strip) * nk32 + j) * 32 + lane) * 4 + s] = word;
        }
  // kSzBlockBytes blocks per (group, strip): 32 fp16 scales, then 32 uint8 zeros, both in the
  // order i = g*4 + s  ->  column n = 32*strip + 8s + g (the A fragment's rows).
  std::vector<uint8_t> sz(size_t(G) * strips * kSzBlockBytes, 0);
  for (int grp = 0; grp < G; ++grp)
    for (int strip = 0; strip < strips; ++strip)
      for (int i = 0; i < 32; ++i) {
        uint8_t* blk = sz.data() + (size_t(grp) * strips + strip) * kSzBlockBytes;
        const int n = strip * kWarpN + 8 * (i % 4) + i / 4;
        if (n >= N) continue;
        const uint16_t h = FloatToF16(w.scales[size_t(n) * Gsrc + grp]);
        std::memcpy(blk + 2 * i, &h, 2);
        blk[kSzZeros + i] = uint8_t(w.zeros[size_t(n) * Gsrc + grp]);
      }
  Blob blob;
  const size_t oq = blob.Add(qw.data(), qw.size() * 4);
  const size_t os = blob.Add(sz.data(), sz.size());
  const size_t op = perm.empty() ? 0 : blob.Add(perm.data(), perm.size() * 4);
  FQ_RETURN_IF_ERROR(blob.Upload(&v->alloc));
  uint8_t* base = static_cast<uint8_t*>(v->alloc);
  v->qw = base + oq;
  v->sz = base + os;
  v->perm = perm.empty() ? nullptr : reinterpret_cast<const int32_t*>(base + op);
  std::unique_ptr<W4A16Weights> r(new W4A16Weights());
  r->K_ = K;
  r->N_ = N;
  r->bytes_ = blob.bytes.size();
  r->perm_ = const_cast<int32_t*>(v->perm);
  r->view_ = std::move(v);
  *out = std::move(r);
  return Status::Ok();
}

namespace {
// Copies a view's single allocation and rebases every pointer into the copy.
template <typename V>
Status CloneView(const V& src, size_t bytes, std::unique_ptr<V>* out) {
  auto v = std::make_unique<V>(src);
  FQ_CUDA_RETURN(cudaMalloc(&v->alloc, std::max<size_t>(bytes, 256)));
  FQ_CUDA_RETURN(cudaMemcpy(v->alloc, src.alloc, bytes, cudaMemcpyDeviceToDevice));
  auto rebase = [&](auto*& p) {
    using P = std::remove_reference_t<decltype(p)>;
    if (p) p = reinterpret_cast<P>(static_cast<uint8_t*>(v->alloc) + (reinterpret_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(src.alloc)));
  };
  if constexpr (std::is_same_v<V, W4A16Weights::View>) {
    rebase(v->qw); rebase(v->sz); rebase(v->perm);
  } else {
    rebase(v->w); rebase(v->scale_vec); rebase(v->scale1); rebase(v->qw); rebase(v->fscales);
  }
  *out = std::move(v);
  return Status::Ok();
}
}  // namespace

Status W4A16Weights::Clone(std::unique_ptr<W4A16Weights>* out) const {
  std::unique_ptr<W4A16Weights> r(new W4A16Weights());
  FQ_RETURN_IF_ERROR(CloneView(*view_, bytes_, &r->view_));
  r->K_ = K_;
  r->N_ = N_;
  r->bytes_ = bytes_;
  r->perm_ = const_cast<int32_t*>(r->view_->perm);
  *out = std::move(r);
  return Status::Ok();
}

size_t W4A16WorkspaceBytes(const W4A16Weights& w, int max_m, bool batch_invariant) {
  const auto& v = w.view();
  return KernelWorkspace(v.N, v.K, v.plan, max_m, w.act_order(), !batch_invariant && max_m >= kW4A16DequantMinM, true).total;
}

Status RunW4A16(const W4A16Weights& w, const LinearArgs& a, BlasLt* blas, cudaStream_t stream) {
  const auto& v = w.view();
  const bool dequant_path = !a.batch_invariant && a.M >= kW4A16DequantMinM;
  const WsLayout l = KernelWorkspace(v.N, v.K, v.plan, a.M, w.act_order(), dequant_path, true);
  FQ_RETURN_IF_ERROR(CheckArgs(a, v.K, l.total, "RunW4A16"));
  if (a.M == 0) return Status::Ok();
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  const void* x = a.x;
  if (v.perm) {
    FQ_CUDA_RETURN(detail::LaunchGatherColumns(a.x, a.M, v.K, v.perm, ws + l.xperm, stream));
    x = ws + l.xperm;
  }
  if (dequant_path) {
    if (!blas) return InvalidArgument("RunW4A16: the non-invariant large-M path needs a BlasLt");
    FQ_CUDA_RETURN(detail::LaunchDequantInt4(v, a.act, ws + l.wdeq, stream));
    LinearArgs b = a;
    b.x = x;
    b.batch_invariant = false;
    return RunBf16(blas, ws + l.wdeq, v.N, v.K, b, stream);
  }
  detail::QLinearParams p;
  p.qw = v.qw;
  p.sz = v.sz;
  p.N = v.N;
  p.K = v.K;
  p.nk32 = v.nk32;
  p.strips = v.strips;
  p.gsteps = v.gsteps;
  p.splits = v.plan.splits;
  p.steps_per_warp = v.plan.steps_per_warp;
  return RunChunks(false, p, a, x, ws, l, stream);
}

// ---------------- fp8 ----------------
namespace {
// The fp8 word of channels c[0..3] (E4M3 bytes), with the bit places that Fp8Word (qlinear_fragment.cuh) describes and
// decodes.
uint32_t Fp8PackWord(const uint8_t (&c)[4]) {
  auto sign = [&](int i) { return uint32_t(c[i] >> 7); };
  auto em = [&](int i) { return uint32_t(c[i] & 0x7fu); };
  return sign(0) << 15 | em(0) << 4 | sign(1) << 31 | em(1) << 20 |                  // c[0], c[1]
         (em(2) & 0xfu) | sign(2) << 11 | (em(2) >> 4) << 12 |                      // c[2]
         (em(3) & 0xfu) << 16 | sign(3) << 27 | (em(3) >> 4) << 28;                 // c[3]
}
}  // namespace

Fp8DeviceWeights::~Fp8DeviceWeights() {
  if (view_ && view_->alloc) cudaFree(view_->alloc);
}

// The paths' copies: W8A8 the [N][K] bytes, the scales per column and the per-tensor scale; W8A16 the repacked words and
// the scales in strip order.
Status Fp8DeviceWeights::Create(const Fp8Weights& w, std::unique_ptr<Fp8DeviceWeights>* out, Fp8Paths paths,
                                 const GemmTuning& tuning) {
  FQ_RETURN_IF_ERROR(w.Validate());
  const bool w8a8 = paths != Fp8Paths::kW8A16, w8a16 = paths != Fp8Paths::kW8A8;
  const int K = w.K, N = w.N;
  auto v = std::make_unique<View>();
  v->K = K;
  v->N = N;
  v->nk32 = (K + kStepK - 1) / kStepK;
  v->plan = PlanFor(K, N, tuning.target_warps);
  v->strips = v->plan.n_blocks * kWarpsN;
  const int strips = v->strips, nk32 = v->nk32;
  Blob blob;
  size_t ow = 0, ov = 0, o1 = 0, oq = 0, of = 0;
  if (w8a8) {
    std::vector<float> svec(N);
    for (int n = 0; n < N; ++n) svec[n] = w.scale_of(n);
    ow = blob.Add(w.w.data(), w.w.size());
    ov = blob.Add(svec.data(), svec.size() * 4);
    o1 = blob.Add(w.scale.data(), 4);
  }
  if (w8a16) {
    // [strips][nk32][2 chunks][32 lanes][4 words]: word w = 2s + ks in chunk w/4 holds channels 8t + 4ks + 0..3 of
    // column n = 32*strip + 8s + lane/4, their bits placed as Fp8Word reads them (Fp8PackWord).
    std::vector<uint32_t> qw(size_t(strips) * nk32 * 32 * 8, 0u);
    for (int strip = 0; strip < strips; ++strip)
      for (int j = 0; j < nk32; ++j)
        for (int lane = 0; lane < 32; ++lane)
          for (int s = 0; s < 4; ++s)
            for (int ks = 0; ks < 2; ++ks) {
              const int n = strip * kWarpN + 8 * s + lane / 4, t = lane % 4;
              if (n >= N) continue;
              const int wi = 2 * s + ks;
              uint8_t c[4] = {0, 0, 0, 0};
              for (int b = 0; b < 4; ++b) {
                const int k = j * kStepK + 8 * t + 4 * ks + b;
                if (k < K) c[b] = w.w[size_t(n) * K + k];
              }
              qw[(((size_t(strip) * nk32 + j) * 2 + wi / 4) * 32 + lane) * 4 + wi % 4] = Fp8PackWord(c);
            }
    std::vector<float> fs(size_t(strips) * 32, 0.0f);  // [strips][g][s]: n = 8s + g
    for (int strip = 0; strip < strips; ++strip)
      for (int i = 0; i < 32; ++i) {
        const int n = strip * kWarpN + 8 * (i % 4) + i / 4;
        if (n < N) fs[size_t(strip) * 32 + i] = w.scale_of(n);
      }
    oq = blob.Add(qw.data(), qw.size() * 4);
    of = blob.Add(fs.data(), fs.size() * 4);
  }
  FQ_RETURN_IF_ERROR(blob.Upload(&v->alloc));
  uint8_t* base = static_cast<uint8_t*>(v->alloc);
  if (w8a8) {
    v->w = base + ow;
    v->scale_vec = reinterpret_cast<const float*>(base + ov);
    v->scale1 = w.scale.size() == 1 ? reinterpret_cast<const float*>(base + o1) : nullptr;
  }
  if (w8a16) {
    v->qw = base + oq;
    v->fscales = reinterpret_cast<const float*>(base + of);
  }
  std::unique_ptr<Fp8DeviceWeights> r(new Fp8DeviceWeights());
  r->K_ = K;
  r->N_ = N;
  r->per_channel_ = w.scale.size() != 1;
  r->bytes_ = blob.bytes.size();
  r->view_ = std::move(v);
  *out = std::move(r);
  return Status::Ok();
}

Fp8Paths Fp8DeviceWeights::paths() const {
  return !view_->w ? Fp8Paths::kW8A16 : !view_->qw ? Fp8Paths::kW8A8 : Fp8Paths::kBoth;
}

Status Fp8DeviceWeights::Clone(std::unique_ptr<Fp8DeviceWeights>* out) const {
  std::unique_ptr<Fp8DeviceWeights> r(new Fp8DeviceWeights());
  FQ_RETURN_IF_ERROR(CloneView(*view_, bytes_, &r->view_));
  r->K_ = K_;
  r->N_ = N_;
  r->per_channel_ = per_channel_;
  r->bytes_ = bytes_;
  *out = std::move(r);
  return Status::Ok();
}

size_t W8A16WorkspaceBytes(const Fp8DeviceWeights& w, int max_m) {
  const auto& v = w.view();
  return KernelWorkspace(v.N, v.K, v.plan, max_m, false, false, false).total;
}

Status RunW8A16(const Fp8DeviceWeights& w, const LinearArgs& a, cudaStream_t stream) {
  const auto& v = w.view();
  if (!v.qw) return InvalidArgument("RunW8A16: these FP8 weights were created for W8A8 only (Fp8Paths::kW8A8)");
  const WsLayout l = KernelWorkspace(v.N, v.K, v.plan, a.M, false, false, false);
  FQ_RETURN_IF_ERROR(CheckArgs(a, v.K, l.total, "RunW8A16"));
  if (a.M == 0) return Status::Ok();
  detail::QLinearParams p;
  p.qw = v.qw;
  p.fscales = v.fscales;
  p.N = v.N;
  p.K = v.K;
  p.nk32 = v.nk32;
  p.strips = v.strips;
  p.gsteps = std::max(1, v.nk32);
  p.splits = v.plan.splits;
  p.steps_per_warp = v.plan.steps_per_warp;
  return RunChunks(true, p, a, a.x, static_cast<uint8_t*>(a.workspace), l, stream);
}

namespace {

Status InvariantError(cudaError_t e, const char* fn) {
  if (e == cudaErrorNotSupported)
    return Unimplemented(std::string(fn) + ": needs an sm_90 GPU and the driver's TMA encoder");
  FQ_CUDA_RETURN(e);
  return Status::Ok();
}

Status CheckInvariantPointers(std::initializer_list<const void*> ptrs, const char* fn) {
  for (const void* p : ptrs) {
    if (p == nullptr) return InvalidArgument(std::string(fn) + ": null pointer");
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return InvalidArgument(std::string(fn) + ": operands must be 16-byte aligned");
  }
  return Status::Ok();
}

}  // namespace

Status RunW16Invariant(const void* w, int N, int K, const LinearArgs& a, cudaStream_t stream) {
  if (a.M < 0 || N <= 0 || K <= 0) return InvalidArgument("RunW16Invariant: M, N and K must be positive");
  if (K % 8 != 0 || N % 8 != 0)
    return InvalidArgument("RunW16Invariant: K and N must be multiples of 8 (got K = " + std::to_string(K) +
                           ", N = " + std::to_string(N) + ")");
  if (a.M == 0) return Status::Ok();
  FQ_RETURN_IF_ERROR(CheckInvariantPointers({w, a.x, a.y}, "RunW16Invariant"));
  detail::InvariantGemmArgs g{w, a.x, a.y, nullptr, 0, nullptr, a.M, N, K};
  return InvariantError(a.act == ActType::kBF16 ? detail::LaunchInvariantW16Bf16(g, a.tuning, stream)
                                                : detail::LaunchInvariantW16F16(g, a.tuning, stream),
                        "RunW16Invariant");
}

Status RunW8A8Invariant(const Fp8DeviceWeights& w, const W8A8Args& a, cudaStream_t stream) {
  const auto& v = w.view();
  if (!v.w)
    return InvalidArgument("RunW8A8Invariant: these FP8 weights were created for W8A16 only (Fp8Paths::kW8A16)");
  if (v.K % 16 != 0 || v.N % 8 != 0)
    return InvalidArgument("RunW8A8Invariant: K must be a multiple of 16 and N of 8 (got K = " + std::to_string(v.K) +
                           ", N = " + std::to_string(v.N) + ")");
  if (a.M < 0) return InvalidArgument("RunW8A8Invariant: M must be >= 0");
  if (a.M == 0) return Status::Ok();
  FQ_RETURN_IF_ERROR(CheckInvariantPointers({a.x_fp8, a.y}, "RunW8A8Invariant"));
  if (!a.x_scale) return InvalidArgument("RunW8A8Invariant: null x_scale");
  detail::InvariantGemmArgs g{v.w, a.x_fp8, a.y, a.x_scale, a.per_row_act ? 1 : 0, v.scale_vec, a.M, v.N, v.K};
  return InvariantError(a.out == ActType::kBF16 ? detail::LaunchInvariantW8A8Bf16(g, a.tuning, stream)
                                                : detail::LaunchInvariantW8A8F16(g, a.tuning, stream),
                        "RunW8A8Invariant");
}

}  // namespace flashq::gemm
