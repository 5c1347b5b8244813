// The W8A8 caller's workspace layout (gemm.h): host arithmetic, built with and without CUDA.
#include "kernels/gemm/gemm.h"

namespace flashq::gemm {
namespace {
size_t Align256(size_t v) { return (v + 255) & ~size_t(255); }
}  // namespace

size_t W8A8WorkspaceBytes(int K, int max_m) { return size_t(max_m) * (K + 4) + 256; }

W8A8Workspace W8A8WorkspaceLayout(int K, int max_m, int M, bool static_scale) {
  W8A8Workspace l;
  l.scale = Align256(size_t(static_scale ? max_m : M) * K);
  return l;
}

}  // namespace flashq::gemm
