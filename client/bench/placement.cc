#include "client/bench/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/lib/tensor.h"

namespace flashq::bench {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kMarkBytes = 8;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool AllMarked(std::string_view bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](char c) { return static_cast<unsigned char>(c) == 0xFF; });
}

int64_t InputBytes(const inference::ModelInferRequest& req, const Placement& what, int i) {
  const int64_t resident = size_t(i) < what.resident_bytes.size() ? what.resident_bytes[size_t(i)] : 0;
  return resident > 0 ? resident : int64_t(req.raw_input_contents(i).size());
}

size_t OutputsBytes(const Placement& what) {
  size_t n = 0;
  for (int64_t b : what.output_bytes) n += AlignUp(size_t(std::max<int64_t>(b, 0)));
  return n;
}

}  // namespace

size_t PlacedBytes(const inference::ModelInferRequest& req, const Placement& what) {
  size_t n = OutputsBytes(what);
  for (int i = 0; i < req.raw_input_contents_size(); ++i) n += AlignUp(size_t(InputBytes(req, what, i)));
  return n;
}

absl::StatusOr<inference::ModelInferRequest> PlaceInRegion(const inference::ModelInferRequest& req,
                                                           const Placement& what, Region& region) {
  if (req.raw_input_contents_size() != req.inputs_size())
    return absl::InvalidArgumentError("shared memory needs every input in raw_input_contents");
  if (int(what.output_bytes.size()) != req.outputs_size())
    return absl::InvalidArgumentError("shared memory needs the size of every requested output");
  if (PlacedBytes(req, what) > region.size() / kAlign * kAlign)
    return absl::OutOfRangeError(absl::StrCat("request needs ", PlacedBytes(req, what), " bytes of region ",
                                              region.name(), ", which has ", region.size()));
  inference::ModelInferRequest out;
  out.set_model_name(req.model_name());
  out.set_model_version(req.model_version());
  out.set_id(req.id());
  *out.mutable_parameters() = req.parameters();
  size_t offset = 0;
  for (int i = 0; i < req.inputs_size(); ++i) {
    const std::string& raw = req.raw_input_contents(i);
    const int64_t bytes = InputBytes(req, what, i);
    if (int64_t(raw.size()) == bytes) {
      if (absl::Status s = region.Write(offset, raw); !s.ok()) return s;
    }
    auto* in = out.add_inputs();
    *in = req.inputs(i);
    client::SetSharedMemory(*in, {region.name(), bytes, int64_t(offset)});
    offset += AlignUp(size_t(bytes));
  }
  offset = region.size() / kAlign * kAlign - OutputsBytes(what);
  const std::string marks(kMarkBytes, '\xFF');
  for (int i = 0; i < req.outputs_size(); ++i) {
    const size_t bytes = size_t(what.output_bytes[i]);
    if (what.output_bytes[i] <= 0)
      return absl::InvalidArgumentError(absl::StrCat("output ", req.outputs(i).name(), ": no size to place it"));
    const size_t k = std::min(kMarkBytes, bytes);
    if (absl::Status s = region.Write(offset, std::string_view(marks).substr(0, k)); !s.ok()) return s;
    if (absl::Status s = region.Write(offset + bytes - k, std::string_view(marks).substr(0, k)); !s.ok()) return s;
    auto* o = out.add_outputs();
    *o = req.outputs(i);
    client::SetSharedMemory(*o, {region.name(), int64_t(bytes), int64_t(offset)});
    offset += AlignUp(bytes);
  }
  return out;
}

absl::Status CheckOutputs(const inference::ModelInferRequest& sent, const inference::ModelInferResponse& resp,
                          Region* region) {
  std::string scratch;
  for (const auto& want : sent.outputs()) {
    int index = -1;
    for (int i = 0; i < resp.outputs_size() && index < 0; ++i)
      if (resp.outputs(i).name() == want.name()) index = i;
    if (index < 0) return absl::NotFoundError(absl::StrCat("response has no output ", want.name()));
    const auto& o = resp.outputs(index);
    auto dtype = client::ParseDType(o.datatype());
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("output ", o.name(), ": ", dtype.status().message()));
    int64_t bytes = DTypeSize(*dtype);
    for (int64_t d : o.shape()) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("output ", o.name(), ": negative dimension"));
      bytes *= d;
    }
    const std::string_view raw =
        index < resp.raw_output_contents_size() ? std::string_view(resp.raw_output_contents(index)) : std::string_view();
    const auto ref = client::SharedMemoryOf(want.parameters());
    if (!ref) {
      if (int64_t(raw.size()) != bytes)
        return absl::DataLossError(absl::StrCat("output ", o.name(), ": ", raw.size(), " bytes in the message, ", bytes,
                                                " for its shape"));
      continue;
    }
    if (!region || ref->region != region->name())
      return absl::InternalError(absl::StrCat("output ", o.name(), ": region ", ref->region, " is not this slot's"));
    if (!raw.empty())
      return absl::DataLossError(absl::StrCat("output ", o.name(), ": in region ", ref->region, " and in the message"));
    if (bytes != ref->byte_size)
      return absl::DataLossError(absl::StrCat("output ", o.name(), ": ", bytes, " bytes for its shape, ", ref->byte_size,
                                              " expected in region ", ref->region));
    const size_t k = std::min<size_t>(kMarkBytes, size_t(bytes));
    for (size_t at : {size_t(ref->offset), size_t(ref->offset) + size_t(bytes) - k}) {
      if (k == 0) break;
      auto got = region->Read(at, k, &scratch);
      if (!got.ok()) return got.status();
      if (AllMarked(*got))
        return absl::DataLossError(absl::StrCat("output ", o.name(), ": the server did not write its bytes in region ",
                                                ref->region));
    }
  }
  return absl::OkStatus();
}

}  // namespace flashq::bench
