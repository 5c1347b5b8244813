#include "server/backends/cuda/staging.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/common/convert.h"

namespace flashq::server {
namespace {

// Whether a piece crosses by a DMA of its own rather than through the pinned mirror. Host
// bytes must go through the mirror. A small page-locked piece (a decode step's few KB of
// system shared memory) goes through it too: a cudaMemcpyAsync call costs a few
// microseconds of host time, more than copying the piece, and the mirror's neighbouring
// pieces share one DMA.
constexpr size_t kOwnDmaMinBytes = size_t(64) << 10;
bool OwnDma(MemoryKind k, size_t n) {
  return k == MemoryKind::kDevice || (k == MemoryKind::kPinned && n >= kOwnDmaMinBytes);
}

absl::Status Full(size_t n) {
  return absl::ResourceExhaustedError(
      absl::StrCat("a batch needs ", n, " more bytes than the GPU staging holds (raise --gpu-staging-mb)"));
}

}  // namespace

void BatchStaging::Need(std::vector<size_t>* sizes, DType request, DType kernel, size_t elems) {
  sizes->push_back(elems * DTypeSize(kernel));
  if (request != kernel) sizes->push_back(elems * DTypeSize(request));
}

absl::Status BatchStaging::Flush(Run& run) {
  if (run.end > run.begin) {
    queued_ = true;
    char *h = slot_.host + run.begin, *d = slot_.device + run.begin;
    FQ_CUDA_OK(cudaMemcpyAsync(run.to_device ? d : h, run.to_device ? h : d, run.end - run.begin,
                               run.to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, slot_.stream));
  }
  run.begin = run.end = 0;
  return absl::OkStatus();
}

absl::Status BatchStaging::Extend(Run& run, size_t offset, size_t n) {
  if (run.end != run.begin && offset != run.end) {
    if (auto s = Flush(run); !s.ok()) return s;
  }
  if (run.end == run.begin) run.begin = offset;
  run.end = offset + n;
  return absl::OkStatus();
}

absl::Status BatchStaging::UploadHost(const void* src, size_t bytes, char* dst) {
  if (bytes == 0) return absl::OkStatus();
  const size_t off = Offset(dst);
  std::memcpy(slot_.host + off, src, bytes);
  return Extend(up_, off, bytes);
}

absl::Status BatchStaging::Upload(const Gather& src, size_t offset, size_t n, char* dst) {
  size_t at = 0;  // of the piece within src
  for (const ConstBytes& p : src.pieces) {
    const size_t lo = std::max(offset, at), hi = std::min(offset + n, at + p.size);
    if (lo < hi) {
      const char* from = p.data + (lo - at);
      char* to = dst + (lo - offset);
      if (OwnDma(p.kind, hi - lo)) {
        queued_ = true;
        FQ_CUDA_OK(cudaMemcpyAsync(to, from, hi - lo, cudaMemcpyDefault, slot_.stream));
      } else if (auto s = UploadHost(from, hi - lo, to); !s.ok()) {
        return s;
      }
    }
    at += p.size;
    if (at >= offset + n) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<char*> BatchStaging::UploadAs(const Gather& src, DType from, size_t first, size_t elems, DType to) {
  char* raw = Take(elems * DTypeSize(from));
  if (!raw) return Full(elems * DTypeSize(from));
  if (auto s = Upload(src, first * DTypeSize(from), elems * DTypeSize(from), raw); !s.ok()) return s;
  return Convert(raw, from, to, elems);
}

absl::StatusOr<char*> BatchStaging::Convert(char* src, DType from, DType to, size_t elems) {
  if (from == to) return src;
  char* out = Take(elems * DTypeSize(to));
  if (!out) return Full(elems * DTypeSize(to));
  auto st = stream();
  if (!st.ok()) return st.status();
  if (auto s = FromKernel(RunConvert(src, from, out, to, int64_t(elems), *st)); !s.ok()) return s;
  return out;
}

absl::Status BatchStaging::DownloadHost(const char* src, void* dst, size_t n) {
  if (n == 0) return absl::OkStatus();
  const size_t off = Offset(src);
  host_copies_.push_back({slot_.host + off, static_cast<char*>(dst), n});
  return Extend(down_, off, n);
}

absl::Status BatchStaging::Download(const char* src, const Scatter& dst, size_t offset, size_t n) {
  if (auto s = Flush(up_); !s.ok()) return s;  // kernels are queued already; keep order plain
  size_t at = 0;
  for (const MutableBytes& p : dst.pieces) {
    const size_t lo = std::max(offset, at), hi = std::min(offset + n, at + p.size);
    if (lo < hi && p.data) {
      const char* from = src + (lo - offset);
      char* to = p.data + (lo - at);
      if (OwnDma(p.kind, hi - lo)) {
        queued_ = true;
        FQ_CUDA_OK(cudaMemcpyAsync(to, from, hi - lo, cudaMemcpyDefault, slot_.stream));
      } else if (auto s = DownloadHost(from, to, hi - lo); !s.ok()) {
        return s;
      }
    }
    at += p.size;
    if (at >= offset + n) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<cudaStream_t> BatchStaging::stream() {
  if (auto s = Flush(up_); !s.ok()) return s;
  if (!input_counted_) {
    StageTimes::AddSince(times_, StageTimes::kInput, start_);
    input_counted_ = true;
  }
  queued_ = true;  // the caller launches on it
  return slot_.stream;
}

absl::Status BatchStaging::Finish() {
  if (auto s = Flush(up_); !s.ok()) return s;
  if (auto s = Flush(down_); !s.ok()) return s;
  queued_ = false;
  FQ_CUDA_OK(cudaStreamSynchronize(slot_.stream));
  {
    StageTimer t(times_, StageTimes::kOutput);
    for (const HostCopy& c : host_copies_) std::memcpy(c.dst, c.src, c.n);
  }
  host_copies_.clear();
  carver_ = Carver(slot_.device, slot_.bytes);
  start_ = std::chrono::steady_clock::now();
  input_counted_ = false;
  return absl::OkStatus();
}

std::vector<prometheus::Histogram*> PerGpuHistograms(ServerMetrics& m,
                                                     const std::vector<std::unique_ptr<DeviceContext>>& ctx,
                                                     const std::string& kernel) {
  std::vector<prometheus::Histogram*> h;
  for (const auto& d : ctx) h.push_back(&m.KernelHistogram(kernel, d->device()));
  return h;
}

}  // namespace flashq::server
