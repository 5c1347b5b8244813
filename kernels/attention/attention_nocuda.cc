// Launchers for builds without CUDA: they exist so the server links, and say why they cannot run.
#include "kernels/attention/attention.h"

namespace flashq::attention {

Status run_varlen_attention(const VarlenAttentionParams&, cudaStream_t) {
  return Unimplemented("run_varlen_attention: built without CUDA");
}
size_t paged_decode_workspace_size(int, int, int, int, int) { return 0; }
Status run_paged_decode(const PagedDecodeParams&, cudaStream_t) {
  return Unimplemented("run_paged_decode: built without CUDA");
}
Status run_kv_append(const KvAppendParams&, cudaStream_t) {
  return Unimplemented("run_kv_append: built without CUDA");
}

}  // namespace flashq::attention
