// Host: the TMA tensor map over a [rows, heads, D] 16-bit tensor that the sm_90 attention kernels load K, V (and Q)
// through. The device side of TMA and mbarriers is in kernels/common/ptx/.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/common/tensor_map.h"

namespace flashq::attention::detail {

// Host: a 3D tensor map (D, heads, rows) over a [rows, heads, D] 16-bit tensor with the given
// element strides; boxes of 64 columns x 1 head x box_rows rows, 128-byte swizzle (the PanelOff
// layout). The row extent is set to 2^31 - 1: the kernels only issue boxes that lie inside their
// data (tails use cp.async). Unimplemented when the driver rejects the layout: the caller falls back.
inline Status EncodeRowsMap(CUtensorMap* map, const void* base, bool bf16, int d, int heads, int64_t row_stride,
                            int64_t head_stride, int box_rows) {
  const TensorMapEncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return Unimplemented("cuTensorMapEncodeTiled not available");
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(heads), cuuint64_t(0x7fffffff)};
  const cuuint64_t strides[2] = {cuuint64_t(head_stride) * 2, cuuint64_t(row_stride) * 2};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return Unimplemented("cuTensorMapEncodeTiled rejected the layout: " + std::to_string(int(r)));
  return Status::Ok();
}

}  // namespace flashq::attention::detail
