// `kv_attention`: stateful attention over a server-resident paged KV cache. Each
// request brings the new tokens of one sequence (prefill: many; decode: one),
// keyed by Triton's sequence parameters sequence_id / sequence_start /
// sequence_end. Their K/V are appended to the sequence's pages and the queries
// attend causally over everything cached. Requests of different sequences share
// a batch; two requests of one sequence never do, and run in the order of the
// positions they reserved as they were queued. A request with sequence_end and zero
// new tokens ends its sequence without appending.
#pragma once

#include <memory>

#include "server/backends/backend.h"
#include "server/core/model.h"
#include "server/kv_cache/kv_session_table.h"

namespace flashq::server {

class KvAttentionModel : public Model {
 public:
  // kv_cache_blocks > 0 overrides the config's num_blocks (--kv-cache-blocks).
  static absl::StatusOr<std::unique_ptr<Model>> Create(inference::ModelConfig config, Backend& backend,
                                                       int64_t kv_cache_blocks);

  using Model::Prepare;
  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& request,
                                                const RequestBytes& bytes) override;
  // Reserves the request's cache positions (KvSessionTable::Reserve) in queue order.
  absl::Status Admit(Work& work) override;
  void Execute(const std::vector<Work*>& batch) override;
  void Drop(Work& work, const absl::Status& why) override;
  void Tick(std::chrono::steady_clock::time_point now) override;
  std::optional<BlockUsage> KvBlocks() const override {
    return BlockUsage{sessions_->blocks_in_use(), sessions_->blocks_total()};
  }

  const KvSessionTable& sessions() const { return *sessions_; }

 private:
  KvAttentionModel(inference::ModelConfig config, KvGeometry geometry, std::unique_ptr<KvSessionTable> sessions,
                   std::unique_ptr<KvAttentionExecutor> executor);
  const KvGeometry geometry_;
  std::unique_ptr<KvSessionTable> sessions_;
  std::unique_ptr<KvAttentionExecutor> executor_;
};

}  // namespace flashq::server
