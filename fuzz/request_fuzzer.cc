// libFuzzer target over the server's request path (ASan + UBSan, clang):
//
//   bytes -> inference::ModelInferRequest::ParseFromArray, and the gRPC frontend's own codec
//            (ParseRawInferRequest over the bytes cut into slices), which must agree with it
//         -> Model::Prepare (decode + validation) of the real models on a CPU backend
//         -> Model::Execute alone and merged with copies of itself (batch assembly,
//            ragged concatenation, output split), checked bitwise: batch invariance
//         -> InferenceServer::Infer with the codec's views (bounded queue, scheduler,
//            Execute, the one answer, whose raw serialization must be protobuf's bytes)
//   and, for each parsed request, kVariants copies whose input dims are replaced by
//   extreme values (0, 1, 2, 2^31-1, 2^31, 2^32-1, 2^63-1; chosen by a hash of the input
//   bytes), with raw contents resized to match when that is small (empty tensors): the
//   shape arithmetic of DecodeInputs and every Model::Prepare at its int32/int64 edges.
//
// The repository is small and in a temp folder: `attention` (head dims 8, 16 and 64),
// `kv_attention` (4/2 heads, head dim 8, 16 blocks of 4 tokens) and `lin` (BF16
// weights, K=16, N=8), with tight token, tensor-byte and sequence limits so that
// every input runs in microseconds. Invariants (abort on violation): `done` is
// called exactly once per Infer; an OK work has one output per requested tensor,
// whose bytes match shape x datatype; merged and alone outputs are identical.
//
// FLASHQ_FUZZ_PLANTED_CRASH=1 makes a request with id "flashq-fuzz-planted-crash" abort:
// the self-test of the fuzz gate (a known crash input must fail the run). Unset, that
// id is an ordinary string.
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "server/backends/cpu/cpu_backend.h"
#include "server/inference_server.h"
#include "server/frontend/grpc_service.h"
#include "server/frontend/infer_codec.h"
#include "server/models/model_factory.h"
#include "server/repository/model_repository.h"
#include "server/repository/safetensors.h"

namespace fs = std::filesystem;
using namespace flashq::server;

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "request_fuzzer: invariant violated: %s %s\n", what, detail.c_str());
  std::abort();
}

std::string Param(const char* key, const std::string& value) {
  return std::string("parameters { key: \"") + key + "\" value: { string_value: \"" + value + "\" } }\n";
}

const char* kQueue = "dynamic_batching { max_queue_delay_microseconds: 0 default_queue_policy { max_queue_size: 8 } }\n";

void WriteText(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string MakeRepository() {
  char tmpl[] = "/tmp/flashq-fuzz-repo-XXXXXX";
  if (!mkdtemp(tmpl)) Fail("mkdtemp");
  const fs::path root(tmpl);
  WriteText(root / "attention/config.pbtxt",
            std::string("name: \"attention\"\nmax_batch_size: 0\ninput [\n"
                        " { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                        " { name: \"K\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                        " { name: \"V\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                        " { name: \"CU_SEQLENS_Q\" data_type: TYPE_INT32 dims: [ -1 ] optional: true },\n"
                        " { name: \"CU_SEQLENS_K\" data_type: TYPE_INT32 dims: [ -1 ] optional: true }\n]\n"
                        "output [\n { name: \"O\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                        " { name: \"LSE\" data_type: TYPE_FP32 dims: [ -1, -1 ] }\n]\n") +
                kQueue + Param("kind", "attention") + Param("max_batch_tokens", "64") + Param("head_dims", "8,16,64") +
                Param("max_sequences_per_request", "8") + Param("max_tensor_bytes", "16384"));
  WriteText(root / "kv_attention/config.pbtxt",
            std::string("name: \"kv_attention\"\nmax_batch_size: 0\ninput [\n"
                        " { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, 4, 8 ] },\n"
                        " { name: \"K\" data_type: TYPE_FP16 dims: [ -1, 2, 8 ] },\n"
                        " { name: \"V\" data_type: TYPE_FP16 dims: [ -1, 2, 8 ] }\n]\n"
                        "output [ { name: \"O\" data_type: TYPE_FP16 dims: [ -1, 4, 8 ] } ]\n") +
                Param("kind", "kv_attention") + Param("num_heads_q", "4") + Param("num_heads_kv", "2") +
                Param("head_dim", "8") + Param("page_size", "4") + Param("num_blocks", "16") +
                Param("max_tokens_per_sequence", "32") + Param("session_idle_timeout_s", "1") +
                Param("max_queue_delay_us", "0") + Param("max_queue_size", "8") + Param("max_tensor_bytes", "16384"));
  WriteText(root / "lin/config.pbtxt",
            std::string("name: \"lin\"\nmax_batch_size: 0\n"
                        "input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, 16 ] } ]\n"
                        "output [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, 8 ] } ]\n") +
                kQueue + Param("kind", "linear") + Param("in_features", "16") + Param("out_features", "8") +
                Param("max_batch_tokens", "32") + Param("weight_format", "bf16") + Param("max_tensor_bytes", "16384"));
  std::vector<uint16_t> w(8 * 16);
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint16_t(0x3c00 + (i * 37) % 512);  // BF16 values near 1
  absl::Status s = WriteSafetensors((root / "lin/model.safetensors").string(),
                                    {{"weight", "BF16", {8, 16}, std::string_view(reinterpret_cast<char*>(w.data()), w.size() * 2)}});
  if (!s.ok()) Fail("writing lin weights", s.ToString());
  return root.string();
}

struct Harness {
  std::string repo;
  std::unique_ptr<CpuBackend> backend;
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<ServerMetrics> metrics;
  std::map<std::string, std::unique_ptr<Model>> direct;  // used without a scheduler
  std::unique_ptr<InferenceServer> server;

  Harness() {
    repo = MakeRepository();
    auto entries = ScanModelRepository(repo);
    if (!entries.ok()) Fail("scan", entries.status().ToString());
    BackendOptions bo;
    bo.cpu_threads = 1;
    backend = std::make_unique<CpuBackend>(bo);
    registry = std::make_shared<prometheus::Registry>();
    metrics = std::make_unique<ServerMetrics>(registry);
    for (const ModelEntry& e : *entries) {
      auto m = CreateModel(e, *backend, {});
      if (!m.ok()) Fail("load", m.status().ToString());
      direct[e.config.name()] = std::move(*m);
    }
    InferenceServerOptions so;
    so.workers_per_model = 2;
    auto srv = InferenceServer::Create(*entries, *backend, *metrics, so);
    if (!srv.ok()) Fail("server", srv.status().ToString());
    server = std::move(*srv);
    std::error_code ec;
    fs::remove_all(repo, ec);  // the weights were copied into the backend
  }
};

Harness& H() {
  static Harness* h = new Harness();  // never destroyed: the scheduler threads keep running
  return *h;
}

void CheckOutputs(const Work& w) {
  for (const OutputTensor& t : w.outputs) {
    int64_t n = DTypeSize(t.dtype);
    for (int64_t d : t.shape) n *= d;
    if (n != int64_t(t.data.size())) Fail("output size", t.name + " " + ShapeString(t.shape));
  }
}

// FLASHQ_FUZZ_TRACE=1: one line per input and path (to check that seeds reach Execute).
const bool kTrace = std::getenv("FLASHQ_FUZZ_TRACE") != nullptr;

// Returns whether Prepare accepted the request.
bool Direct(const inference::ModelInferRequest& req) {
  auto it = H().direct.find(req.model_name());
  if (it == H().direct.end()) return false;
  Model& m = *it->second;
  auto a = m.Prepare(req);
  if (kTrace) std::fprintf(stderr, "trace: direct %s prepare %s\n", req.model_name().c_str(), a.status().ToString().c_str());
  if (!a.ok()) return false;
  const bool stateful = !(*a)->exclusive_key.empty();
  // What the scheduler does as the work joins its queue (a kv request reserves its positions).
  if (absl::Status admitted = m.Admit(**a); !admitted.ok()) {
    m.Drop(**a, admitted);
    return true;
  }
  m.Execute({a->get()});
  if (kTrace) std::fprintf(stderr, "trace: direct %s execute %s\n", req.model_name().c_str(), (*a)->status.ToString().c_str());
  if ((*a)->status.ok()) CheckOutputs(**a);
  if (stateful) {
    m.Tick(std::chrono::steady_clock::now() + std::chrono::hours(1));  // reap: keeps the cache from filling
    return true;
  }
  // The same request merged with itself: each copy's outputs must equal the alone run's.
  auto b = m.Prepare(req), c = m.Prepare(req);
  if (!b.ok() || !c.ok()) Fail("Prepare is not deterministic");
  if ((*b)->batch_key != (*a)->batch_key) Fail("batch key is not deterministic");
  m.Execute({b->get(), c->get()});
  for (const Work* w : {b->get(), c->get()}) {
    if (w->status.code() != (*a)->status.code()) Fail("merged status differs", w->status.ToString());
    if (!w->status.ok()) continue;
    CheckOutputs(*w);
    if (w->outputs.size() != (*a)->outputs.size()) Fail("merged output count differs");
    for (size_t i = 0; i < w->outputs.size(); ++i) {
      if (w->outputs[i].data != (*a)->outputs[i].data) Fail("batch invariance: merged output differs", w->outputs[i].name);
    }
  }
  return true;
}

std::string Joined(const std::vector<grpc::Slice>& slices) {
  std::string s;
  for (const grpc::Slice& p : slices) s.append(reinterpret_cast<const char*>(p.begin()), p.size());
  return s;
}

// Serves `req`, whose raw_input_contents are in `raw` when they stayed in receive slices,
// and checks its one answer. The gRPC frontend's response bytes must be protobuf's.
void Served(const inference::ModelInferRequest& req, const RawContents& raw = {}) {
  std::mutex mu;
  std::condition_variable cv;
  int answers = 0;
  H().server->Infer(req, raw, std::nullopt, [] { return false; }, [&](const absl::Status& st, Work* work) {
    if (kTrace) std::fprintf(stderr, "trace: served %s %s\n", req.model_name().c_str(), st.ToString().c_str());
    if (st.ok()) {
      if (!work) Fail("OK without a work");
      CheckOutputs(*work);
      const std::vector<OutputTensor> outputs = work->outputs;
      inference::ModelInferResponse resp;
      FillInferResponse(req, *work, &resp);
      work->outputs = outputs;
      std::vector<grpc::Slice> sent;
      if (!SerializeInferResponse(req, *work).Dump(&sent).ok() || Joined(sent) != resp.SerializeAsString())
        Fail("the raw response's bytes differ from protobuf's");
    }
    std::lock_guard<std::mutex> l(mu);
    ++answers;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> l(mu);
  if (!cv.wait_for(l, std::chrono::seconds(20), [&] { return answers > 0; })) Fail("no answer within 20 s");
  l.unlock();
  std::this_thread::sleep_for(std::chrono::microseconds(50));  // a second answer would show here
  l.lock();
  if (answers != 1) Fail("answered more than once");
}

// ---- extreme shapes -------------------------------------------------------------------

// Where shape arithmetic breaks: empty, tiny, and the int32 / uint32 / int64 limits
// (2^31 is INT_MIN and 2^32-1 is -1 once narrowed to int).
constexpr int64_t kExtremeDims[] = {0, 1, 2, INT32_MAX, int64_t(1) << 31, (int64_t(1) << 32) - 1, INT64_MAX};
constexpr int kVariants = 8;
constexpr int64_t kMaxResizedBytes = 1 << 16;

uint64_t Mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashBytes(const uint8_t* data, size_t size) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

int64_t DatatypeBytes(const std::string& dt) {
  if (dt == "FP16" || dt == "BF16" || dt == "INT16" || dt == "UINT16") return 2;
  if (dt == "FP32" || dt == "INT32" || dt == "UINT32") return 4;
  if (dt == "FP64" || dt == "INT64" || dt == "UINT64") return 8;
  return 1;
}

// The request with its input dims replaced, each by one of kExtremeDims or kept (half
// the time). Inputs that had the same shape get the same replacement, so that
// "V has K's shape" style checks pass and the variant reaches the model's own checks.
// Raw contents follow the new shape when it is at most kMaxResizedBytes (the original
// bytes repeated; empty for an empty tensor); otherwise they stay, and the decoder
// must notice the mismatch without overflowing.
inference::ModelInferRequest ExtremeVariant(const inference::ModelInferRequest& req, uint64_t seed) {
  inference::ModelInferRequest v = req;
  for (int i = 0; i < v.inputs_size(); ++i) {
    auto* t = v.mutable_inputs(i);
    uint64_t h = seed;
    for (int64_t d : t->shape()) h = Mix(h ^ uint64_t(d));
    for (int j = 0; j < t->shape_size(); ++j) {
      const uint64_t c = Mix(h + uint64_t(j)) % 14;
      if (c < 7) t->set_shape(j, kExtremeDims[c]);
    }
    if (i >= v.raw_input_contents_size()) continue;
    int64_t bytes = DatatypeBytes(t->datatype());
    bool fits = true;
    for (int64_t d : t->shape()) fits = fits && d >= 0 && !__builtin_mul_overflow(bytes, d, &bytes);
    if (!fits || bytes > kMaxResizedBytes) continue;
    std::string* raw = v.mutable_raw_input_contents(i);
    const std::string old = raw->empty() ? std::string(1, char(h)) : *raw;
    raw->resize(size_t(bytes));
    for (size_t k = 0; k < raw->size(); ++k) (*raw)[k] = old[k % old.size()];
  }
  return v;
}

const bool kPlantedCrash = std::getenv("FLASHQ_FUZZ_PLANTED_CRASH") != nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // parse errors of mutated bytes are expected, not news
  H();
  return 0;
}

// Serialized with map entries in key order, so that equal messages give equal bytes (NaNs included,
// which a field-by-field comparison would call unequal).
std::string Canonical(const google::protobuf::Message& m) {
  std::string s;
  {
    google::protobuf::io::StringOutputStream out(&s);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return s;
}

// The bytes cut into slices as a transport may deliver them: lengths picked by `h`.
std::vector<grpc::Slice> CutIntoSlices(const uint8_t* data, size_t size, uint64_t h) {
  constexpr size_t kLengths[] = {1, 2, 3, 7, 16, 61, 4096};
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < size; h = Mix(h)) {
    const size_t n = std::min(size - at, kLengths[h % std::size(kLengths)]);
    slices.emplace_back(data + at, n);
    at += n;
  }
  return slices;
}

// The gRPC frontend's request codec must agree with protobuf: accept what it accepts, and
// give the same message, with the same raw_input_contents in pieces.
void CheckCodec(const inference::ModelInferRequest* parsed, const uint8_t* data, size_t size, uint64_t h,
                RawInferRequest* raw) {
  const absl::Status s = ParseRawInferRequest(CutIntoSlices(data, size, h), raw);
  if (!parsed) {
    if (s.ok()) Fail("the raw codec accepts bytes that protobuf refuses");
    return;
  }
  if (!s.ok()) Fail("the raw codec refuses a request that protobuf parses:", s.ToString());
  if (int(raw->raw.size()) != parsed->raw_input_contents_size()) Fail("raw codec: raw_input_contents count");
  for (size_t i = 0; i < raw->raw.size(); ++i) {
    std::string joined;
    for (std::string_view p : raw->raw[i]) joined.append(p);
    if (joined != parsed->raw_input_contents(int(i))) Fail("raw codec: raw_input_contents bytes");
  }
  inference::ModelInferRequest rest = *parsed;
  rest.clear_raw_input_contents();
  if (Canonical(rest) != Canonical(raw->message)) Fail("raw codec: the rest of the message");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint64_t h = HashBytes(data, size);
  inference::ModelInferRequest req;
  RawInferRequest raw;
  if (!req.ParseFromArray(data, int(size))) {
    CheckCodec(nullptr, data, size, h, &raw);
    return -1;  // not a request: keep it out of the corpus
  }
  CheckCodec(&req, data, size, h, &raw);
  if (kPlantedCrash && req.id() == "flashq-fuzz-planted-crash") Fail("planted crash (FLASHQ_FUZZ_PLANTED_CRASH)");
  Direct(req);
  Served(raw.message, raw.raw);
  for (int i = 0; i < kVariants; ++i) {
    const inference::ModelInferRequest v = ExtremeVariant(req, Mix(h + uint64_t(i)));
    if (kTrace) std::fprintf(stderr, "trace: variant %d %s\n", i, v.ShortDebugString().substr(0, 300).c_str());
    if (Direct(v)) Served(v);  // accepted with extreme dims: the scheduler path too
  }
  return 0;
}
