#include "server/frontend/grpc_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "server/core/client_text.h"

namespace flashq::server {
namespace {

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  auto* r = ctx->DefaultReactor();
  r->Finish(status);
  return r;
}

std::optional<Clock::time_point> SteadyDeadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  const auto now = std::chrono::system_clock::now();
  if (d >= now + std::chrono::hours(24 * 365)) return std::nullopt;  // no deadline set
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(d - now);
}

constexpr char kNoSharedMemory[] = "system shared memory is turned off here (--max-shared-memory-regions=0)";
constexpr char kNoCudaSharedMemory[] = "this server cannot map CUDA IPC handles yet";

const char* ConfigDType(inference::DataType t) {
  switch (t) {
    case inference::TYPE_FP16: return "FP16";
    case inference::TYPE_BF16: return "BF16";
    case inference::TYPE_FP32: return "FP32";
    case inference::TYPE_INT32: return "INT32";
    case inference::TYPE_INT64: return "INT64";
    case inference::TYPE_UINT8: return "UINT8";
    default: return "BYTES";
  }
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

void FillInferResponse(const inference::ModelInferRequest& request, Work& work,
                       inference::ModelInferResponse* response) {
  response->set_model_name(request.model_name());
  response->set_model_version(request.model_version().empty() ? "1" : request.model_version());
  response->set_id(request.id());
  for (OutputTensor& t : work.outputs) {
    auto* o = response->add_outputs();
    o->set_name(t.name);
    o->set_datatype(std::string(DTypeName(t.dtype)));
    for (int64_t d : t.shape) o->add_shape(d);
    std::string* raw = response->add_raw_output_contents();
    const bool in_shm = std::any_of(work.shm_outputs.begin(), work.shm_outputs.end(),
                                    [&](const SharedMemoryOutput& s) { return s.name == t.name; });
    if (!in_shm) *raw = std::move(t.data);
  }
}

const inference::ModelConfig* GrpcInferenceService::FindConfig(const std::string& name, const std::string& version,
                                                                grpc::Status* error) const {
  InferenceServer* s = server_.load();
  const Model* m = s ? s->FindModel(name) : nullptr;
  if (!m) {
    *error = grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown model ", Quoted(name)));
    return nullptr;
  }
  if (absl::Status v = CheckModelVersion(name, version); !v.ok()) {
    *error = ToGrpc(v);
    return nullptr;
  }
  return &m->config();
}

grpc::Status GrpcInferenceService::Authenticate(const grpc::CallbackServerContext& ctx, bool inference) const {
  if (!auth_ || (inference && !auth_inference_)) return grpc::Status::OK;
  return auth_->Check(ctx);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ServerLive(grpc::CallbackServerContext* ctx,
                                                           const inference::ServerLiveRequest*,
                                                           inference::ServerLiveResponse* resp) {
  resp->set_live(true);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ServerReady(grpc::CallbackServerContext* ctx,
                                                            const inference::ServerReadyRequest*,
                                                            inference::ServerReadyResponse* resp) {
  resp->set_ready(ready_.load());
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelReady(grpc::CallbackServerContext* ctx,
                                                           const inference::ModelReadyRequest* req,
                                                           inference::ModelReadyResponse* resp) {
  grpc::Status err;
  resp->set_ready(ready_.load() && FindConfig(req->name(), req->version(), &err) != nullptr);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ServerMetadata(grpc::CallbackServerContext* ctx,
                                                               const inference::ServerMetadataRequest*,
                                                               inference::ServerMetadataResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  resp->set_name("flashq");
  resp->set_version(version_);
  for (const char* e : {"model_configuration", "statistics", "sequence", "ragged_batching"}) resp->add_extensions(e);
  if (shared_memory_) resp->add_extensions("system_shared_memory");
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelMetadata(grpc::CallbackServerContext* ctx,
                                                              const inference::ModelMetadataRequest* req,
                                                              inference::ModelMetadataResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  grpc::Status err;
  const inference::ModelConfig* c = FindConfig(req->name(), req->version(), &err);
  if (!c) return Reply(ctx, err);
  resp->set_name(c->name());
  resp->add_versions("1");
  resp->set_platform(c->platform().empty() ? "flashq" : c->platform());
  for (const auto& in : c->input()) {
    auto* t = resp->add_inputs();
    t->set_name(in.name());
    t->set_datatype(ConfigDType(in.data_type()));
    for (int64_t d : in.dims()) t->add_shape(d);
  }
  for (const auto& out : c->output()) {
    auto* t = resp->add_outputs();
    t->set_name(out.name());
    t->set_datatype(ConfigDType(out.data_type()));
    for (int64_t d : out.dims()) t->add_shape(d);
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelConfig(grpc::CallbackServerContext* ctx,
                                                            const inference::ModelConfigRequest* req,
                                                            inference::ModelConfigResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  grpc::Status err;
  const inference::ModelConfig* c = FindConfig(req->name(), req->version(), &err);
  if (!c) return Reply(ctx, err);
  *resp->mutable_config() = *c;
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelStatistics(grpc::CallbackServerContext* ctx,
                                                                const inference::ModelStatisticsRequest* req,
                                                                inference::ModelStatisticsResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  InferenceServer* s = server_.load();
  if (!s) return Reply(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is loading models"));
  if (!req->name().empty()) {
    grpc::Status err;
    if (!FindConfig(req->name(), req->version(), &err)) return Reply(ctx, err);
  }
  s->FillStatistics(req->name(), resp);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::ModelInfer(grpc::CallbackServerContext* ctx,
                                                           const inference::ModelInferRequest* req,
                                                           inference::ModelInferResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, true); !a.ok()) {
    if (InferenceServer* s = server_.load()) s->CountRejected(req->model_name(), absl::StatusCode::kUnauthenticated);
    return Reply(ctx, a);
  }
  auto* reactor = ctx->DefaultReactor();
  InferenceServer* s = server_.load();
  if (!s || !ready_.load()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is not ready"));
    return reactor;
  }
  s->Infer(*req, SteadyDeadline(ctx), [ctx] { return ctx->IsCancelled(); },
           [reactor, req, resp](const absl::Status& st, Work* work) {
             if (st.ok()) FillInferResponse(*req, *work, resp);
             reactor->Finish(ToGrpc(st));
           });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcInferenceService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* req,
    inference::SystemSharedMemoryStatusResponse* resp) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  auto regions = shared_memory_->Status(req->name());
  if (!regions.ok()) return Reply(ctx, ToGrpc(regions.status()));
  for (const SharedMemoryRegionStatus& r : *regions) {
    auto& out = (*resp->mutable_regions())[r.name];
    out.set_name(r.name);
    out.set_key(r.key);
    out.set_offset(r.offset);
    out.set_byte_size(r.byte_size);
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* req,
    inference::SystemSharedMemoryRegisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  return Reply(ctx, ToGrpc(shared_memory_->Register(req->name(), req->key(), req->offset(), req->byte_size())));
}

grpc::ServerUnaryReactor* GrpcInferenceService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryUnregisterRequest* req,
    inference::SystemSharedMemoryUnregisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (!shared_memory_) return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, kNoSharedMemory));
  // A region in use stays mapped until its last request finishes (SharedMemoryRegistry).
  if (req->name().empty()) {
    shared_memory_->UnregisterAll();
  } else {
    shared_memory_->Unregister(req->name());
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcInferenceService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryStatusRequest* req,
    inference::CudaSharedMemoryStatusResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  if (req->name().empty()) return Reply(ctx, grpc::Status::OK);
  return Reply(ctx, grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 absl::StrCat("CUDA shared-memory region ", Quoted(req->name()),
                                              " is not registered (", kNoCudaSharedMemory, ")")));
}

grpc::ServerUnaryReactor* GrpcInferenceService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryRegisterRequest* req,
    inference::CudaSharedMemoryRegisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  return Reply(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 absl::StrCat("cannot register CUDA shared-memory region ", Quoted(req->name()), ": ",
                                              kNoCudaSharedMemory, "; use system shared memory or send the "
                                              "tensors in the message")));
}

grpc::ServerUnaryReactor* GrpcInferenceService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryUnregisterRequest*,
    inference::CudaSharedMemoryUnregisterResponse*) {
  if (grpc::Status a = Authenticate(*ctx, false); !a.ok()) return Reply(ctx, a);
  return Reply(ctx, grpc::Status::OK);  // none can be registered, so none is left to remove
}

namespace {

// ModelStreamInfer: each request read is submitted at once; responses are written
// in completion order (one write in flight at a time). The stream finishes when the
// client has half-closed and every submitted request has been answered.
class StreamReactor : public grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse> {
 public:
  StreamReactor(grpc::CallbackServerContext* ctx, InferenceServer* server) : ctx_(ctx), server_(server) {
    NextRead();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::lock_guard<std::mutex> l(mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    auto req = std::move(reading_);
    {
      std::lock_guard<std::mutex> l(mu_);
      ++pending_;
    }
    const inference::ModelInferRequest& r = *req;
    server_->Infer(r, SteadyDeadline(ctx_), [this] { return ctx_->IsCancelled(); },
                   [this, req = std::shared_ptr<inference::ModelInferRequest>(std::move(req))](const absl::Status& st,
                                                                                               Work* work) {
                     auto out = std::make_unique<inference::ModelStreamInferResponse>();
                     if (st.ok()) {
                       FillInferResponse(*req, *work, out->mutable_infer_response());
                     } else {
                       out->set_error_message(absl::StrCat(absl::StatusCodeToString(st.code()), ": ", st.message()));
                       out->mutable_infer_response()->set_id(req->id());
                       out->mutable_infer_response()->set_model_name(req->model_name());
                     }
                     Enqueue(std::move(out));
                   });
    NextRead();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    writes_.pop_front();
    if (!ok) write_failed_ = true;
    --pending_;
    if (!writes_.empty() && !write_failed_) {
      StartWrite(writes_.front().get());
    } else if (write_failed_) {
      pending_ -= int(writes_.size());
      writes_.clear();
    }
    MaybeFinishLocked();
  }

  void OnCancel() override {}
  void OnDone() override { delete this; }

 private:
  void NextRead() {
    reading_ = std::make_unique<inference::ModelInferRequest>();
    StartRead(reading_.get());
  }

  void Enqueue(std::unique_ptr<inference::ModelStreamInferResponse> r) {
    std::lock_guard<std::mutex> l(mu_);
    if (write_failed_) {
      --pending_;
      MaybeFinishLocked();
      return;
    }
    writes_.push_back(std::move(r));
    if (writes_.size() == 1) StartWrite(writes_.front().get());
  }

  void MaybeFinishLocked() {
    if (finished_ || pending_ > 0 || !reads_done_) return;
    finished_ = true;
    Finish(ctx_->IsCancelled() ? grpc::Status::CANCELLED : grpc::Status::OK);
  }

  grpc::CallbackServerContext* ctx_;
  InferenceServer* server_;
  std::unique_ptr<inference::ModelInferRequest> reading_;
  std::mutex mu_;
  std::deque<std::unique_ptr<inference::ModelStreamInferResponse>> writes_;
  int pending_ = 0;
  bool reads_done_ = false, write_failed_ = false, finished_ = false;
};

class RejectStream : public grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse> {
 public:
  explicit RejectStream(const grpc::Status& why) { Finish(why); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
GrpcInferenceService::ModelStreamInfer(grpc::CallbackServerContext* ctx) {
  if (grpc::Status a = Authenticate(*ctx, true); !a.ok()) {
    // The stream is refused before any request is read, so no model name is known.
    if (InferenceServer* s = server_.load()) s->CountRejected("", absl::StatusCode::kUnauthenticated);
    return new RejectStream(a);
  }
  InferenceServer* s = server_.load();
  if (!s || !ready_.load()) return new RejectStream(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is not ready"));
  return new StreamReactor(ctx, s);
}

}  // namespace flashq::server
