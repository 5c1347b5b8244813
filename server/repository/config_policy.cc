#include "server/repository/config_policy.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flashq::server {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using ParseInfoTree = google::protobuf::TextFormat::ParseInfoTree;

constexpr FieldPolicy H = FieldPolicy::kHonour, R = FieldPolicy::kRefuse, I = FieldPolicy::kIgnore;

// Longest prefix wins: "dynamic_batching" is honoured, "dynamic_batching.preferred_batch_size"
// is ignored. A field no rule covers is ignored with a generic reason.
const std::vector<FieldRule> kRules = {
    {"name", H, "the model's name; it must equal the folder's"},
    {"platform", I, "the `kind` parameter chooses the model, not a framework"},
    {"backend", I, "the `kind` parameter chooses the model and --backend the device, not a framework backend",
     "flashq"},
    {"runtime", I, "no framework runtime is loaded"},
    {"version_policy", H, "picks the served version folders (latest N, all or specific)"},
    {"max_batch_size", H, "must be 0: requests are batched inside ragged tensors, not along a batch dimension"},
    {"input", H, "checked against the tensors of the model's kind"},
    {"input.format", I, "tensors are read as the kind defines them"},
    {"input.reshape", R, "the model reads tensors in the shape the request gives; a reshape would be skipped"},
    {"input.is_shape_tensor", R, "no model here takes shape tensors"},
    {"input.is_non_linear_format_io", I, "tensors are always linear (row-major)"},
    {"output", H, "checked against the tensors of the model's kind"},
    {"output.reshape", R, "outputs are sent in the shape the model computes; a reshape would be skipped"},
    {"output.label_filename", I, "the classification extension is not served"},
    {"output.is_shape_tensor", R, "no model here produces shape tensors"},
    {"output.is_non_linear_format_io", I, "tensors are always linear (row-major)"},
    {"batch_input", R, "batches are ragged tensors; no batch inputs are synthesised for the model"},
    {"batch_output", R, "batches are ragged tensors; outputs are split per request, never scattered by a batch output"},
    {"optimization", I, "kernels are chosen by the model's kind and the backend's flags"},
    {"dynamic_batching", H, "requests queue and merge per model"},
    {"dynamic_batching.preferred_batch_size", I, "batches are sized by the token budget (max_batch_tokens)"},
    {"dynamic_batching.max_queue_delay_microseconds", H, "the most a request is held to grow its batch"},
    {"dynamic_batching.preserve_ordering", H, "requests are answered in the order they were admitted"},
    {"dynamic_batching.priority_levels", H,
     "requests queue by their `priority` parameter, level 1 first; a sequence's requests keep their order"},
    {"dynamic_batching.default_priority_level", H, "the level of requests without a valid `priority`"},
    {"dynamic_batching.priority_queue_policy", H,
     "a level's own queue length, timeout and timeout_action"},
    {"dynamic_batching.default_queue_policy", H, "the model's queue"},
    {"dynamic_batching.default_queue_policy.max_queue_size", H, "bounded queue length"},
    {"dynamic_batching.default_queue_policy.default_timeout_microseconds", H,
     "a request still queued after this long is answered DEADLINE_EXCEEDED (timeout_action REJECT)"},
    {"dynamic_batching.default_queue_policy.allow_timeout_override", H,
     "a request's `timeout` parameter (microseconds) replaces default_timeout_microseconds"},
    {"dynamic_batching.default_queue_policy.timeout_action", H,
     "REJECT answers a timed-out request DEADLINE_EXCEEDED; DELAY keeps it queued behind every other request"},
    {"sequence_batching", H, "kv_attention keeps each sequence's KV cache on the server"},
    {"sequence_batching.max_sequence_idle_microseconds", H,
     "kv_attention frees a sequence idle this long (replaces the session_idle_timeout_s parameter)"},
    {"sequence_batching.control_input", I,
     "sequences are controlled by the request parameters sequence_id, sequence_start and sequence_end"},
    {"sequence_batching.state", I, "kv_attention keeps its own state, the paged KV cache"},
    {"sequence_batching.direct", I, "sequences batch with each other by the token budget"},
    {"sequence_batching.oldest", I, "sequences batch with each other by the token budget"},
    {"sequence_batching.iterative_sequence", I, "each request is one step of its sequence"},
    {"ensemble_scheduling", R, "ensembles are not served; clients chain models themselves"},
    {"instance_group", H, "workers of the model: the sum over groups of count per GPU (or per CPU group)"},
    {"instance_group.name", I, "groups are not named in any output"},
    {"instance_group.kind", I,
     "--backend decides the device; a KIND_CPU group's count is taken as is, any other's per GPU"},
    {"instance_group.count", H, "workers (batches in flight) of the model, per listed GPU"},
    {"instance_group.gpus", I,
     "every model runs on all the server's GPUs; the list only multiplies count into the number of workers"},
    {"instance_group.rate_limiter", I, "there is no rate limiter; workers take batches as they free up"},
    {"instance_group.secondary_devices", I, "no secondary devices are used"},
    {"instance_group.profile", I, "no TensorRT profiles"},
    {"instance_group.passive", R, "a passive instance takes no requests; every worker here takes requests"},
    {"instance_group.host_policy", I, "no host policies"},
    {"default_model_filename", I, "weights come from the `checkpoint` parameter or model.safetensors"},
    {"cc_model_filenames", I, "weights come from the `checkpoint` parameter or model.safetensors"},
    {"metric_tags", I, "metrics carry the model's name only"},
    {"parameters", H, "the model's kind and settings (docs/configuration.md)"},
    {"model_warmup", H,
     "each sample runs `count` times at load through the model's request path; one the model refuses stops the load"},
    {"model_warmup.batch_size", I, "requests have no batch dimension; the dims are the request's shape"},
    {"model_operations", I, "no framework custom operations are loaded"},
    {"model_transaction_policy", H, "one response per request"},
    {"model_transaction_policy.decoupled", R,
     "every request gets exactly one response here; a decoupled model's clients expect zero or many"},
    {"model_repository_agents", R,
     "repository agents (checksum, decryption) are not run; serving files they were meant to process would be wrong"},
    {"response_cache", I, "responses are not cached; every request is computed"},
};

const FieldRule* RuleFor(const std::string& path) {
  const FieldRule* best = nullptr;
  size_t best_len = 0;
  for (const FieldRule& r : kRules) {
    const size_t n = std::string(r.path).size();
    if (n >= best_len && (path == r.path || absl::StartsWith(path, absl::StrCat(r.path, ".")))) {
      best = &r;
      best_len = n;
    }
  }
  return best;
}

struct Walker {
  const std::string& file;
  std::vector<std::string>* warnings;
  std::set<std::string> warned;
  absl::Status status;

  // "<file>:<line>" of field f (its index-th element), else `outer`: the enclosing
  // message's position, for elements after the first of a list, which the parser may
  // record no position for.
  std::string At(const ParseInfoTree* tree, const FieldDescriptor* f, int index, const std::string& outer) const {
    if (tree) {
      auto loc = tree->GetLocation(f, f->is_repeated() ? index : -1);
      if (loc.line < 0 && f->is_repeated()) loc = tree->GetLocation(f, 0);
      if (loc.line >= 0) return absl::StrCat(file, ":", loc.line + 1);
    }
    return outer;
  }

  // Judges one set field. Message fields whose rule is the same as their children's are
  // descended into, so that the most specific rule decides; maps are judged as a whole.
  void Visit(const Message& m, const ParseInfoTree* tree, const std::string& prefix, const std::string& outer) {
    const auto* refl = m.GetReflection();
    std::vector<const FieldDescriptor*> fields;
    refl->ListFields(m, &fields);
    for (const FieldDescriptor* f : fields) {
      if (!status.ok()) return;
      const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
      const int n = f->is_repeated() ? refl->FieldSize(m, f) : 1;
      const bool descend = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map();
      const FieldRule* rule = RuleFor(path);
      FieldPolicy policy = rule ? rule->policy : FieldPolicy::kIgnore;
      if (rule && rule->honoured_value && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !f->is_repeated() &&
          refl->GetString(m, f) == rule->honoured_value) {
        policy = FieldPolicy::kHonour;
      }
      if (policy == FieldPolicy::kRefuse) {
        status = absl::InvalidArgumentError(
            absl::StrCat(At(tree, f, 0, outer), ": ", path, " is refused: ", rule->reason));
        return;
      }
      if (policy == FieldPolicy::kIgnore) {
        if (warned.insert(path).second) {
          warnings->push_back(absl::StrCat(At(tree, f, 0, outer), ": ", path, " is ignored: ",
                                           rule ? rule->reason : "flashq gives this field no meaning"));
        }
        continue;  // an ignored field's children are ignored with it
      }
      if (!descend) continue;
      for (int i = 0; i < n; ++i) {
        const Message& child = f->is_repeated() ? refl->GetRepeatedMessage(m, f, i) : refl->GetMessage(m, f);
        Visit(child, tree ? tree->GetTreeForNested(f, f->is_repeated() ? i : -1) : nullptr, path,
              At(tree, f, i, outer));
      }
    }
  }
};

}  // namespace

const std::vector<FieldRule>& ModelConfigFieldRules() { return kRules; }

absl::Status ApplyFieldPolicy(const inference::ModelConfig& config, const std::string& file,
                              const ParseInfoTree* where, std::vector<std::string>* warnings) {
  std::vector<std::string> own;
  Walker w{file, warnings ? warnings : &own, {}, absl::OkStatus()};
  w.Visit(config, where, "", file);
  return w.status;
}

}  // namespace flashq::server
