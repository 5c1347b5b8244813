// Launchers for builds without CUDA: they exist so the server links, and say why they cannot run.
#include "kernels/attention/attention.h"

namespace flashq::attention {

Status RunVarlenAttention(const VarlenAttentionParams&, cudaStream_t) {
  return Unimplemented("RunVarlenAttention: built without CUDA");
}
size_t PagedDecodeWorkspaceBytes(int, int, int, int, int) { return 0; }
Status RunPagedDecode(const PagedDecodeParams&, cudaStream_t) {
  return Unimplemented("RunPagedDecode: built without CUDA");
}
Status RunKvAppend(const KvAppendParams&, cudaStream_t) {
  return Unimplemented("RunKvAppend: built without CUDA");
}

}  // namespace flashq::attention
