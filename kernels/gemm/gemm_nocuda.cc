// Built only without CUDA: the GPU entry points exist so the server links, and say so.
#include "kernels/gemm/gemm.h"

namespace flashq::gemm {
namespace {
Status NoCuda() { return Unimplemented("flashq was built without CUDA: GPU linear layers are unavailable"); }
}  // namespace

struct BlasLt::Impl {};
BlasLt::BlasLt() = default;
BlasLt::~BlasLt() = default;
Status BlasLt::Create(size_t, std::unique_ptr<BlasLt>*) { return NoCuda(); }
Status BlasLt::ReserveStream(cudaStream_t) { return NoCuda(); }

struct W4A16Weights::View {};
W4A16Weights::~W4A16Weights() = default;
Status W4A16Weights::Create(const Int4Weights&, std::unique_ptr<W4A16Weights>*, const GemmTuning&) { return NoCuda(); }
Status W4A16Weights::Clone(std::unique_ptr<W4A16Weights>*) const { return NoCuda(); }
size_t W4A16WorkspaceBytes(const W4A16Weights&, int, bool) { return 0; }
Status RunW4A16(const W4A16Weights&, const LinearArgs&, BlasLt*, cudaStream_t) { return NoCuda(); }

struct Fp8DeviceWeights::View {};
Fp8DeviceWeights::~Fp8DeviceWeights() = default;
Status Fp8DeviceWeights::Create(const Fp8Weights&, std::unique_ptr<Fp8DeviceWeights>*, Fp8Paths, const GemmTuning&) {
  return NoCuda();
}
Status Fp8DeviceWeights::Clone(std::unique_ptr<Fp8DeviceWeights>*) const { return NoCuda(); }
Fp8Paths Fp8DeviceWeights::paths() const { return Fp8Paths::kBoth; }  // never called: Create fails without CUDA
size_t W8A16WorkspaceBytes(const Fp8DeviceWeights&, int) { return 0; }
Status RunW8A16(const Fp8DeviceWeights&, const LinearArgs&, cudaStream_t) { return NoCuda(); }
Status RunW16Invariant(const void*, int, int, const LinearArgs&, cudaStream_t) { return NoCuda(); }
Status RunW8A8(BlasLt*, const Fp8DeviceWeights&, const W8A8Args&, cudaStream_t) { return NoCuda(); }
Status RunW8A8Invariant(const Fp8DeviceWeights&, const W8A8Args&, cudaStream_t) { return NoCuda(); }
Status RunQuantizeActFp8(const void*, ActType, int, int, bool, uint8_t*, float*, cudaStream_t) { return NoCuda(); }
Status RunQuantizeActFp8Static(const void*, ActType, int, int, const float*, uint8_t*, cudaStream_t) { return NoCuda(); }
Status RunBf16(BlasLt*, const void*, int, int, const LinearArgs&, cudaStream_t) { return NoCuda(); }
Status WarmBf16(BlasLt*, int, int, int, ActType, bool) { return NoCuda(); }
std::vector<int> BlasLtWarmupRows(int) { return {}; }

}  // namespace flashq::gemm
