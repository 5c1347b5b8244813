// A unit of work: one decoded, validated inference request on its way through
// the batcher to a backend. Model kinds derive from it to carry their inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/shared_memory.h"
#include "server/core/tensor.h"

namespace flashq::server {

// An output that the client asked to receive in a shared-memory region.
struct SharedMemoryOutput {
  std::string name;
  SharedMemoryBuffer buffer;  // at least the output's bytes, checked at admission
};

struct Work {
  virtual ~Work() = default;

  // Prepare declares each output it will produce, with its size, before compute.
  void ExpectOutput(std::string name, int64_t bytes) { output_sizes.push_back({std::move(name), bytes}); }
  // The shared-memory region the client bound output `name` to, or null (it travels in the message).
  const SharedMemoryOutput* BoundRegion(const std::string& name) const {
    for (const SharedMemoryOutput& o : shm_outputs) {
      if (o.name == name) return &o;
    }
    return nullptr;
  }
  // Bytes of the declared outputs that travel in the response message (not in shared memory).
  int64_t MessageBytes() const {
    int64_t bytes = 0;
    for (const auto& [name, n] : output_sizes) bytes += BoundRegion(name) ? 0 : n;
    return bytes;
  }

  // Where output `name` of `bytes` bytes is written: its shared-memory region when the
  // client bound one (admission checked the size), else `data`, sized here, which the
  // response then carries.
  MutableBytes OutputDestination(const std::string& name, std::string* data, size_t bytes) const {
    if (const SharedMemoryOutput* o = BoundRegion(name)) return {o->buffer.data, bytes, o->buffer.kind, o->buffer.device};
    data->resize(bytes);
    return {data->data(), bytes};
  }

  // Puts output `t`, computed in t.data on the host, into its shared-memory region when
  // the client bound one (t.data is then emptied).
  absl::Status Deliver(OutputTensor& t) const {
    const SharedMemoryOutput* o = BoundRegion(t.name);
    if (!o) return absl::OkStatus();
    absl::Status s = o->buffer.Write(0, t.data.data(), t.data.size());
    std::string().swap(t.data);
    return s;
  }

  int64_t tokens = 1;          // what the batch's token budget counts
  std::vector<std::pair<std::string, int64_t>> output_sizes;  // each output asked for, known before compute
  std::vector<SharedMemoryOutput> shm_outputs;  // set at admission; written before the answer
  int64_t model_version = 0;   // the version that ran it (a request may name none: the latest)
  std::string batch_key;       // only works with equal keys share a batch
  std::string exclusive_key;   // non-empty: works with equal keys never share a batch nor run at once
  // Long-running work (a long prefill): batches of it never take every worker of the model,
  // so that short work (decode steps) always finds one. Give bulk work its own batch_key.
  bool bulk = false;

  // Filled by the model's Execute.
  absl::Status status;
  std::vector<OutputTensor> outputs;
  // Host time its batch spent moving inputs in and outputs out (Triton's compute_input and
  // compute_output); the rest of the batch's compute time is compute_infer.
  uint64_t input_ns = 0, output_ns = 0;
};

}  // namespace flashq::server
