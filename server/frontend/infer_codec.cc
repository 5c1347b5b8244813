#include "server/frontend/infer_codec.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flashq::server {
namespace {

// ModelInferRequest.raw_input_contents, ModelInferResponse.raw_output_contents and
// ModelStreamInferResponse.infer_response (grpc_service.proto).
constexpr uint64_t kRawInputField = 7;
constexpr uint32_t kRawOutputField = 6;
constexpr uint32_t kStreamInferResponseField = 2;
enum WireType : uint64_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };
// Groups nest no deeper than protobuf's own parser allows.
constexpr int kMaxGroupDepth = 100;

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(char(v | 0x80));
    v >>= 7;
  }
  out->push_back(char(v));
}

// Reads protobuf wire data laid over a sequence of slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool done() const { return slice_ == slices_.size(); }
  uint64_t offset() const { return consumed_; }

  // A varint of at most `max_bytes` bytes; bits past 64 are dropped, as protobuf drops them.
  bool Varint(uint64_t* v, int max_bytes = 10) {
    *v = 0;
    for (int i = 0; i < max_bytes; ++i) {
      if (done()) return false;
      const uint8_t b = slices_[slice_].begin()[at_];
      Advance(1);
      *v |= uint64_t(b & 0x7f) << (7 * i);
      if (!(b & 0x80)) return true;
    }
    return false;
  }

  // A field tag as protobuf reads one: at most five bytes, kept to 32 bits.
  bool Tag(uint32_t* tag) {
    uint64_t v;
    if (!Varint(&v, 5)) return false;
    *tag = uint32_t(v);
    return true;
  }

  // A length as protobuf reads one: at most five bytes, below 2 GiB less its 16 bytes of slop.
  bool Length(uint64_t* n) { return Varint(n, 5) && *n <= uint64_t(INT32_MAX - 16); }

  // The next n bytes, as views into the slices (nothing copied).
  bool View(uint64_t n, std::vector<std::string_view>* pieces) {
    return Take(n, [&](const char* p, size_t k) { pieces->emplace_back(p, k); });
  }

  // Appends the next n bytes to `out`.
  bool Copy(uint64_t n, std::string* out) {
    return Take(n, [&](const char* p, size_t k) { out->append(p, k); });
  }

 private:
  // Hands the next n bytes to `take`, one piece per slice they lie in.
  template <class F>
  bool Take(uint64_t n, F&& take) {
    while (n > 0) {
      if (done()) return false;
      const size_t k = size_t(std::min<uint64_t>(n, slices_[slice_].size() - at_));
      take(reinterpret_cast<const char*>(slices_[slice_].begin()) + at_, k);
      Advance(k);
      n -= k;
    }
    return true;
  }

  void Advance(size_t n) {
    at_ += n;
    consumed_ += n;
    if (at_ == slices_[slice_].size()) {
      ++slice_;
      at_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0, at_ = 0;
  uint64_t consumed_ = 0;
};

// Copies the field whose tag was just read, tag included, to `out`; a group with the
// fields inside it. Returns what is wrong, or null.
const char* CopyField(uint32_t tag, SliceReader& r, std::string* out, int depth) {
  if ((tag >> 3) == 0) return "an invalid field number";
  AppendVarint(tag, out);
  uint64_t v = 0;
  switch (tag & 7) {
    case kVarint:
      if (!r.Varint(&v)) return "a truncated varint";
      AppendVarint(v, out);
      return nullptr;
    case kFixed64: return r.Copy(8, out) ? nullptr : "a truncated fixed64";
    case kFixed32: return r.Copy(4, out) ? nullptr : "a truncated fixed32";
    case kLengthDelimited:
      if (!r.Length(&v)) return "a bad length";
      AppendVarint(v, out);
      return r.Copy(v, out) ? nullptr : "a field past the end of the message";
    case kStartGroup:
      if (depth >= kMaxGroupDepth) return "groups nested too deep";
      for (;;) {
        uint32_t inner;
        if (!r.Tag(&inner)) return "an unterminated group";
        if ((inner & 7) == kEndGroup) {
          if ((inner >> 3) != (tag >> 3)) return "a mismatched end of group";
          AppendVarint(inner, out);
          return nullptr;
        }
        if (const char* bad = CopyField(inner, r, out, depth + 1)) return bad;
      }
    default: return "an unsupported wire type";
  }
}

// A slice that owns a std::string (the output buffer a worker filled), freed by gRPC
// once the bytes are written.
grpc::Slice OwningSlice(std::string data) {
  auto* owned = new std::string(std::move(data));
  return grpc::Slice(owned->data(), owned->size(), [](void* p) { delete static_cast<std::string*>(p); }, owned);
}

// Every field of the response but raw_output_contents.
void FillHead(const inference::ModelInferRequest& request, const Work& work, inference::ModelInferResponse* response) {
  response->set_model_name(request.model_name());
  response->set_model_version(work.model_version > 0 ? std::to_string(work.model_version)
                              : request.model_version().empty() ? "1" : request.model_version());
  response->set_id(request.id());
  for (const OutputTensor& t : work.outputs) {
    auto* o = response->add_outputs();
    o->set_name(t.name);
    o->set_datatype(std::string(DTypeName(t.dtype)));
    for (int64_t d : t.shape) o->add_shape(d);
  }
}

}  // namespace

absl::Status ParseRawInferRequest(std::vector<grpc::Slice> slices, RawInferRequest* out) {
  out->slices = std::move(slices);
  out->raw.clear();
  SliceReader r(out->slices);
  std::string rest;  // every field but raw_input_contents, for protobuf to parse
  const auto malformed = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ModelInferRequest: ", what, " at byte ", r.offset()));
  };
  while (!r.done()) {
    uint32_t tag;
    if (!r.Tag(&tag)) return malformed("a bad field tag");
    if ((tag >> 3) == kRawInputField && (tag & 7) == kLengthDelimited) {
      uint64_t n;
      if (!r.Length(&n)) return malformed("a bad length");
      std::vector<std::string_view>& pieces = out->raw.emplace_back();
      if (!r.View(n, &pieces)) return malformed("raw_input_contents past the end of the message");
      continue;
    }
    if (const char* bad = CopyField(tag, r, &rest, 0)) return malformed(bad);
  }
  if (!out->message.ParseFromString(rest)) {
    return absl::InvalidArgumentError("the request is not a valid ModelInferRequest: a field does not parse");
  }
  return absl::OkStatus();
}

absl::Status ParseRawInferRequest(const grpc::ByteBuffer& buffer, RawInferRequest* out) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError("the request could not be read");
  return ParseRawInferRequest(std::move(slices), out);
}

void FillInferResponse(const inference::ModelInferRequest& request, Work& work,
                       inference::ModelInferResponse* response) {
  FillHead(request, work, response);
  for (OutputTensor& t : work.outputs) {
    std::string* raw = response->add_raw_output_contents();
    if (!work.BoundRegion(t.name)) *raw = std::move(t.data);
  }
}

grpc::ByteBuffer SerializeInferResponse(const inference::ModelInferRequest& request, Work& work) {
  // raw_output_contents has the highest field number, so protobuf writes it after the
  // head: the head's bytes, then each output's tag, length and bytes.
  inference::ModelInferResponse head;
  FillHead(request, work, &head);
  std::string bytes = head.SerializeAsString();
  std::vector<grpc::Slice> slices;
  slices.reserve(1 + 2 * work.outputs.size());
  for (OutputTensor& t : work.outputs) {
    const bool in_message = !work.BoundRegion(t.name);
    AppendVarint((kRawOutputField << 3) | kLengthDelimited, &bytes);
    AppendVarint(in_message ? t.data.size() : 0, &bytes);
    if (!in_message || t.data.empty()) continue;
    slices.emplace_back(bytes.data(), bytes.size());  // copies the few bytes before the output
    bytes.clear();
    slices.push_back(OwningSlice(std::move(t.data)));
  }
  if (!bytes.empty()) slices.emplace_back(bytes.data(), bytes.size());
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer SerializeStreamResponse(const absl::Status& status, const inference::ModelInferRequest& request,
                                         Work* work) {
  if (!status.ok() || !work) {
    inference::ModelStreamInferResponse out;
    out.set_error_message(absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
    out.mutable_infer_response()->set_id(request.id());
    out.mutable_infer_response()->set_model_name(request.model_name());
    grpc::Slice bytes(out.SerializeAsString());
    return grpc::ByteBuffer(&bytes, 1);
  }
  // error_message is empty, so the message is infer_response alone: its tag, length and bytes.
  const grpc::ByteBuffer response = SerializeInferResponse(request, *work);
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);  // cannot fail: the buffer is ours
  std::string head;
  AppendVarint((kStreamInferResponseField << 3) | kLengthDelimited, &head);
  AppendVarint(response.Length(), &head);
  slices.insert(slices.begin(), grpc::Slice(head));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace flashq::server
