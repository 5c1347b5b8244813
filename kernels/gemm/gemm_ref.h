// CPU references for the quantized linear layers: y[M][N] = x[M][K] · Wᵀ with x float
// row-major and W in one of the stored formats. Acc = float (the server's CPU backend)
// or double (tests). Each weight row is dequantized once per call; the inner loops run
// over K contiguously; work is split over N across threads when the layer is large.
#pragma once

#include <cstdint>

#include "kernels/gemm/quant_formats.h"

namespace flashq::gemm {

template <typename Acc>
void LinearRefBf16(const float* x, int M, int K, const uint16_t* w_bf16 /*[N][K]*/, int N, float* y);
template <typename Acc>
void LinearRefF32(const float* x, int M, int K, const float* w /*[N][K]*/, int N, float* y);
template <typename Acc>
void LinearRefInt4(const float* x, int M, const Int4Weights& w, float* y);
template <typename Acc>
void LinearRefFp8W8A16(const float* x, int M, const Fp8Weights& w, float* y);
// Quantizes x with QuantizeActFp8 (per tensor or per row), then y = (xq·wqᵀ) * sx * sw.
template <typename Acc>
void LinearRefFp8W8A8(const float* x, int M, const Fp8Weights& w, bool per_row_act, float* y);
// W8A8 with a static activation scale (a checkpoint's input_scale): xq = satfinite_rn(x /
// input_scale), then y = (xq·wqᵀ) * input_scale * sw.
template <typename Acc>
void LinearRefFp8W8A8Static(const float* x, int M, const Fp8Weights& w, float input_scale, float* y);

}  // namespace flashq::gemm
