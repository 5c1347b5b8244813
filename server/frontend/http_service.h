// The KServe v2 HTTP/REST protocol (with Triton's extensions) beside the gRPC service, on
// cpp-httplib. Inference goes through the same InferenceServer::Infer as gRPC: a request
// body becomes an inference::ModelInferRequest (http_json.h) and the same decoder checks it.
//
// Threads: cpp-httplib answers each connection on one thread of a pool that this class
// creates (Server::new_task_queue) with pthreads of an explicit 8 MB stack. libcublasLt.so.13's
// 94 KB static TLS block is carved from every thread's stack, so libraries that start threads
// with small stacks (civetweb: about 100 KB) fail with EINVAL in a process that links
// cuBLASLt; these stacks hold it whatever `ulimit -s` says. A handler waits
// for its request's answer, so a connection holds a thread while its request runs and while
// it is kept alive between requests: `threads` bounds the concurrent HTTP clients.
//
// Errors map to HTTP statuses as in Triton: INVALID_ARGUMENT (and other caller errors) 400,
// NOT_FOUND 404, UNAVAILABLE 503, UNAUTHENTICATED 401, PERMISSION_DENIED 403,
// RESOURCE_EXHAUSTED 429 (a full queue, or a tensor or response over a limit), a body over
// `max_body_bytes` 413, anything else 500; the body is {"error": "..."}.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/core/shared_memory.h"
#include "server/frontend/auth.h"
#include "server/inference_server.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace flashq::server {

struct HttpOptions {
  int threads = 16;
  size_t max_body_bytes = size_t(INT32_MAX);
  TlsOptions tls;  // as for gRPC: both files, or neither (plain HTTP); with a CA, client certificates
  const TokenAuth* auth = nullptr;
  bool auth_inference = true;  // with a token, inference needs it too
  // The registry behind /v2/systemsharedmemory and /v2/cudasharedmemory; null: those answer 400.
  SharedMemoryRegistry* shared_memory = nullptr;
};

int HttpStatusOf(absl::StatusCode code);

class HttpInferenceService {
 public:
  // Binds host:port (0: a free port, see port()) and starts serving; until SetServer and
  // SetReady, liveness answers and everything else is 503 or "not ready".
  static absl::StatusOr<std::unique_ptr<HttpInferenceService>> Start(const std::string& host, int port,
                                                                     std::string version, const HttpOptions& options);
  ~HttpInferenceService();  // Stop()
  void SetServer(InferenceServer* server) { server_.store(server); }
  void SetReady(bool ready) { ready_.store(ready); }
  int port() const { return port_; }
  // Closes the listening socket and the connections, and joins every thread.
  void Stop();

 private:
  HttpInferenceService(std::string version, const HttpOptions& options);
  void Route();
  // OK, or an answer already written (401) into `res`.
  bool Authorized(const httplib::Request& req, httplib::Response& res, bool inference) const;
  // The served model, or null with the error answered in `res`.
  std::shared_ptr<const Model> FindModel(const std::string& name, const std::string& version,
                                         httplib::Response& res) const;
  void Infer(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void Statistics(const std::string& model, const std::string& version, httplib::Response& res);

  const std::string version_;
  const HttpOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<InferenceServer*> server_{nullptr};
  std::atomic<bool> ready_{false};
};

}  // namespace flashq::server
