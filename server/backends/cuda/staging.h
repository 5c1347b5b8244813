// One batch's bytes through a stream slot (device_context.h). Inputs are gathered from the
// requests' own memory and outputs scattered back to their destinations with at most one
// host copy each way:
// - ordinary host bytes are copied into the slot's pinned staging (the host mirror of the
//   device staging, at the same offset) and cross by DMA from there; neighbouring pieces
//   share one DMA;
// - page-locked host bytes (system shared memory registered with the GPU) and device bytes
//   (CUDA shared memory) cross by DMA straight to or from the device staging, with no host
//   copy at all; but for small page-locked pieces, which go as host bytes do;
// - dtype conversions (FP32 requests, BF16 GEMMs for FP16 requests) run on the GPU.
// Executors launch kernels on stream(), which first issues the pending uploads, and end
// each batch (or chunk of one) with Finish().
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backends/backend.h"
#include "server/backends/cuda/device_context.h"
#include "server/metrics/metrics.h"

namespace flashq::server {

// Kernels take FP16/BF16; FP32 requests travel as FP16 and come back as FP32.
inline DType KernelDType(DType t) { return t == DType::kF32 ? DType::kF16 : t; }

class BatchStaging {
 public:
  // Input time (construction until kernels can launch) and output time (the host copies
  // after the stream synchronizes) go to `times` unless it is null.
  BatchStaging(StreamSlot& slot, StageTimes* times)
      : slot_(slot), carver_(slot.device, slot.bytes), times_(times), start_(std::chrono::steady_clock::now()) {}
  // A batch that stops on an error after queueing work waits for that work here, so that
  // nothing of it still runs when the slot's next batch reuses the staging (or the KV pages
  // of a sequence that the error ends are handed to another).
  ~BatchStaging() {
    if (queued_) cudaStreamSynchronize(slot_.stream);
  }
  BatchStaging(const BatchStaging&) = delete;
  BatchStaging& operator=(const BatchStaging&) = delete;

  // Device staging bytes (256-byte aligned); null when the slot is full.
  char* Take(size_t bytes) { return carver_.Take(bytes); }
  // Host bytes (tables the executor built) to device staging `dst`.
  absl::Status UploadHost(const void* src, size_t bytes, char* dst);
  // Bytes [offset, offset + n) of `src` to device staging `dst`.
  absl::Status Upload(const Gather& src, size_t offset, size_t n, char* dst);
  // Elements [first, first + elems) of `src`, of type `from`, in type `to` in fresh device
  // staging (converted on the GPU when the types differ).
  absl::StatusOr<char*> UploadAs(const Gather& src, DType from, size_t first, size_t elems, DType to);
  // `elems` device elements of type `from` in type `to`: `src` itself when they agree,
  // else fresh staging.
  absl::StatusOr<char*> Convert(char* src, DType from, DType to, size_t elems);
  // Device staging bytes `src` to bytes [offset, offset + n) of `dst`.
  absl::Status Download(const char* src, const Scatter& dst, size_t offset, size_t n);
  // Device staging bytes to host memory `dst`, complete after Finish().
  absl::Status DownloadHost(const char* src, void* dst, size_t n);
  // The slot's stream, once the pending uploads are issued on it. Everything the caller
  // launches on it must go through this.
  absl::StatusOr<cudaStream_t> stream();
  // Waits for the stream, then copies downloaded bytes to their host destinations. The
  // staging is empty again afterwards.
  absl::Status Finish();

  // Appends the staging a tensor of `elems` elements needs to arrive as (or leave from)
  // `kernel` type when the request has type `request`.
  // (Carver::Need adds them up.)
  static void Need(std::vector<size_t>* sizes, DType request, DType kernel, size_t elems);

 private:
  size_t Offset(const char* device) const { return size_t(device - slot_.device); }
  // A pending copy of staging bytes [begin, end) between the pinned mirror and the device;
  // neighbouring pieces extend it, so that they share one DMA.
  struct Run {
    bool to_device;
    size_t begin = 0, end = 0;
  };
  absl::Status Flush(Run& run);
  absl::Status Extend(Run& run, size_t offset, size_t n);  // flushes first when not adjacent

  StreamSlot& slot_;
  Carver carver_;
  Run up_{true}, down_{false};
  struct HostCopy {
    const char* src;  // pinned mirror
    char* dst;
    size_t n;
  };
  std::vector<HostCopy> host_copies_;  // done by Finish
  bool queued_ = false;                 // work queued on the stream since the last Finish
  StageTimes* times_;
  std::chrono::steady_clock::time_point start_;  // of the current input stage; reset by Finish
  bool input_counted_ = false;
};

// flashq_kernel_seconds{kernel, gpu}, one series per GPU of the process.
std::vector<prometheus::Histogram*> PerGpuHistograms(ServerMetrics& m,
                                                     const std::vector<std::unique_ptr<DeviceContext>>& ctx,
                                                     const std::string& kernel);

// Times the kernels of one batch on its stream and feeds flashq_kernel_seconds.
class KernelTimer {
 public:
  KernelTimer(StreamSlot& s, prometheus::Histogram& h) : s_(s), h_(h) { cudaEventRecord(s.start, s.stream); }
  void Stop() { cudaEventRecord(s_.stop, s_.stream); }
  void Observe() {  // after the stream has synchronized
    float ms = 0;
    if (cudaEventElapsedTime(&ms, s_.start, s_.stop) == cudaSuccess) h_.Observe(double(ms) * 1e-3);
  }

 private:
  StreamSlot& s_;
  prometheus::Histogram& h_;
};

}  // namespace flashq::server
