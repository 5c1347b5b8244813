// Quantized weight formats: the canonical host form of group-wise int4 weights and
// FP8 E4M3 weights, RTN quantizers (demo weights, test data), and loaders/packers
// for the two int4 checkpoint layouts users bring (GPTQ v1/v2 with act-order, AWQ).
// Plain C++: no CUDA. The GPU layouts are made from these by kernels/gemm/gemm.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace flashq::gemm {

// Canonical host form of group-wise int4 weights, independent of the checkpoint format.
// Dequantized weight: w[n][k] = (q[n][k] - zeros[n][g]) * scales[n][g], g = group of k.
struct Int4Weights {
  int K = 0, N = 0, group_size = 0;  // group_size == K means channelwise; K % group_size may be != 0
  std::vector<uint8_t> q;            // [N][K] values 0..15
  std::vector<float> scales;         // [N][num_groups]
  std::vector<float> zeros;          // [N][num_groups] zero points (integers 0..16 in checkpoints)
  std::vector<int32_t> g_idx;        // optional [K]: group of input channel k (GPTQ act-order)
  int num_groups() const;            // ceil(K / group_size), or max(g_idx) + 1 when g_idx is set
  int group_of(int k) const { return g_idx.empty() ? k / group_size : g_idx[k]; }
  Status Validate() const;           // sizes and value ranges
};

// FP8 E4M3 ("fn") weights: w[n][k] = fp8(w8[n][k]) * scale[0 or n].
struct Fp8Weights {
  int K = 0, N = 0;
  std::vector<uint8_t> w;      // [N][K] E4M3 bits
  std::vector<float> scale;    // size 1 (per-tensor) or N (per-output-channel)
  bool per_channel() const { return scale.size() > 1 || (N == 1 && !scale.empty()); }
  float scale_of(int n) const { return scale.size() == 1 ? scale[0] : scale[n]; }
  Status Validate() const;
};

// RTN group-wise int4 from float W [N][K]. Symmetric: zero = 8, scale = amax / 7.
// Asymmetric: scale = (max - min) / 15, zero = round(-min / scale). Scales are rounded
// through FP16 (what checkpoints store), so packing to GPTQ/AWQ round-trips exactly.
// g_idx (optional, [K]) assigns input channels to groups (act-order); then every group
// must hold at most group_size channels.
Int4Weights QuantizeInt4(const float* w, int N, int K, int group_size, bool symmetric,
                         const int32_t* g_idx = nullptr);
// E4M3 with scale = amax / 448 per tensor or per output channel.
Fp8Weights QuantizeFp8(const float* w, int N, int K, bool per_channel);
// Dynamic activation quantization to E4M3 (the W8A8 path): scale = amax / 448 per
// tensor (scales[0..M-1] all equal) or per row; xq = satfinite_rn(x / scale).
// `scales` has M entries. The GPU kernel RunQuantizeActFp8 computes the same bits.
void QuantizeActFp8(const float* x, int M, int K, bool per_row, uint8_t* xq, float* scales);

// Dequantize into float [N][K] (tests, the CPU backend's preparation).
std::vector<float> DequantizeInt4(const Int4Weights& w);
std::vector<float> DequantizeFp8(const Fp8Weights& w);

// ---- GPTQ checkpoints ----
// qweight int32 [ceil(K/8), N]: input channel k is nibble k%8 of row k/8 (low nibble first).
// qzeros int32 [G, N/8]: zero of column n is nibble n%8 of word n/8; v1 stores zero-1
// (so a v1 zero of 0 cannot be stored; loading gives 1..16), v2 stores zero.
// scales fp16 bits [G, N]; g_idx int32 [K] (empty: group of k = k / group_size).
struct GptqTensors {
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<uint16_t> scales_f16;
  int K = 0, N = 0, group_size = 0;
  bool v1 = false;
};
GptqTensors PackGptq(const Int4Weights& w, bool v1);     // reference packer from the format definition
Status UnpackGptq(const GptqTensors& t, Int4Weights* out);  // loader; errors name the violated constraint

// ---- AWQ checkpoints ----
// qweight int32 [K, N/8]: columns 8c..8c+7 of row k packed into word c in AWQ's
// interleaved order: nibble i holds column 8c + kAwqOrder[i], kAwqOrder = {0,2,4,6,1,3,5,7}.
// qzeros int32 [G, N/8] in the same interleaved order (zero stored as is); scales fp16 [G, N].
struct AwqTensors {
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales_f16;
  int K = 0, N = 0, group_size = 0;
};
AwqTensors PackAwq(const Int4Weights& w);
Status UnpackAwq(const AwqTensors& t, Int4Weights* out);

// ---- views of checkpoint tensors ----
// Loaders read packed tensors where they lie (in a mapped file): raw little-endian bytes,
// no alignment assumed, copied once, into the canonical form. The caller has checked each
// tensor's dtype and shape; the view functions check values (g_idx range, padding).
enum class ScaleType { kF16, kBF16, kF32 };
struct ScalesView {
  const void* data = nullptr;
  ScaleType type = ScaleType::kF16;
  float at(size_t i) const;
};
// GPTQ: the layout of GptqTensors. g_idx may be null.
struct GptqView {
  const void *qweight = nullptr, *qzeros = nullptr, *g_idx = nullptr;
  ScalesView scales;
  int K = 0, N = 0, group_size = 0;
  bool v1 = false;
};
Status UnpackGptq(const GptqView& v, Int4Weights* out);
// AWQ: the layout of AwqTensors.
struct AwqView {
  const void *qweight = nullptr, *qzeros = nullptr;
  ScalesView scales;
  int K = 0, N = 0, group_size = 0;
};
Status UnpackAwq(const AwqView& v, Int4Weights* out);
// compressed-tensors pack-quantized (its pack_to_int32, num_bits = 4): signed int4 values
// are stored as value + 8, eight to an int32, element i of a run in nibble i % 8 (low
// first). weight_packed int32 [N, ceil(K/8)] runs along K; weight_zero_point int32
// [ceil(N/8), G] runs along N (asymmetric only; null: symmetric, zero point 0, stored 8);
// weight_scale [N, G]; weight_g_idx int32 [K] (null: group of k = k / group_size).
// Dequantized: (q_signed - zp_signed) * scale, i.e. (stored q - stored zero) * scale.
struct PackQuantizedView {
  const void *weight_packed = nullptr, *zero_point = nullptr, *g_idx = nullptr;
  ScalesView scales;
  int K = 0, N = 0, group_size = 0;
};
Status UnpackPackQuantized(const PackQuantizedView& v, Int4Weights* out);

}  // namespace flashq::gemm
