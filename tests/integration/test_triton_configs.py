"""Triton configs served end to end: a repository of the real configs in
tests/server/triton_configs loads, the server logs each ignored field with its file and
line, the ModelConfig RPC returns Triton's full schema as tritonclient decodes it, and a
request's priority and timeout parameters are accepted. A refused config stops the start-up
with the file, the line and the reason."""
import pathlib
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, ServerProcess

CONFIGS = ROOT / "tests/server/triton_configs"
SERVED = ["attention_full", "kv_sequences", "plain_attention", "queue_delay_action"]


def _repo(root, names):
    for n in names:
        (root / n).mkdir(parents=True)
        shutil.copy(CONFIGS / f"{n}.pbtxt", root / n / "config.pbtxt")
    return root


def _expected_warnings(name):
    lines = (CONFIGS / f"{name}.pbtxt").read_text().splitlines()
    return [l.split(": ", 1)[1] for l in lines if l.startswith("# warns: ")]


@pytest.fixture(scope="module")
def served(start_server, tmp_path_factory):
    root = _repo(tmp_path_factory.mktemp("triton-repo"), SERVED)
    return start_server(f"--model-repository={root}", name="triton-configs"), root


def test_ignored_fields_are_logged_with_file_and_line(served):
    s, root = served
    log = open(s.log_path, errors="replace").read()
    for name in SERVED:
        for field in _expected_warnings(name):
            prefix = f"{root / name / 'config.pbtxt'}:"
            hits = [l for l in log.splitlines() if prefix in l and f": {field} is ignored: " in l]
            assert hits, f"no warning for {name}: {field}\n{log}"


def test_model_config_round_trips_through_tritonclient(served):
    s, _ = served
    c = grpcclient.InferenceServerClient(s.url)
    cfg = c.get_model_config("attention_full").config
    assert cfg.backend == "flashq"
    assert cfg.version_policy.latest.num_versions == 1
    assert [(g.count, list(g.gpus)) for g in cfg.instance_group] == [(2, [0, 1])]
    db = cfg.dynamic_batching
    assert (db.priority_levels, db.default_priority_level, db.preserve_ordering) == (2, 2, True)
    q = db.default_queue_policy
    assert (q.default_timeout_microseconds, q.allow_timeout_override, q.max_queue_size) == (50000, True, 64)
    assert cfg.model_warmup[0].inputs["Q"].dims == [16, 8, 64]
    assert cfg.response_cache.enable
    kv = c.get_model_config("kv_sequences").config
    assert kv.sequence_batching.max_sequence_idle_microseconds == 5000000
    assert kv.sequence_batching.oldest.max_candidate_sequences == 4


def test_priority_and_timeout_parameters(served):
    s, _ = served
    c = grpcclient.InferenceServerClient(s.url)
    q = np.random.default_rng(1).standard_normal((8, 4, 64)).astype(np.float16)
    ins = [grpcclient.InferInput(n, list(q.shape), "FP16") for n in ("Q", "K", "V")]
    for i in ins:
        i.set_data_from_numpy(q)
    ref = c.infer("attention_full", ins).as_numpy("O")
    for priority, timeout in ((1, None), (2, 10_000_000), (7, None)):
        out = c.infer("attention_full", ins, priority=priority, timeout=timeout).as_numpy("O")
        assert np.array_equal(out, ref)


@pytest.mark.parametrize("name, reason", [
    ("vllm_decoupled", "model_transaction_policy.decoupled is refused"),
    ("ensemble_pipeline", "ensemble_scheduling is refused"),
])
def test_refused_config_stops_the_start_up(tmp_dir, name, reason):
    root = _repo(tmp_dir / "repo", [name])
    s = ServerProcess([f"--model-repository={root}"], name=f"refused-{name}")
    with pytest.raises(AssertionError) as e:
        s.start(timeout=60)
    s.stop()
    assert f"{root / name / 'config.pbtxt'}:" in str(e.value) and reason in str(e.value), str(e.value)


def _fields(descriptor, path, out, seen):
    """{path: (number, type, label)} of every field reachable from `descriptor`, and enum values."""
    if descriptor.full_name.split(".", 1)[1] in seen:
        return
    seen.add(descriptor.full_name.split(".", 1)[1])
    for f in descriptor.fields:
        out[f"{path}.{f.name}"] = (f.number, f.type, f.label)
        if f.enum_type is not None:
            out[f"{path}.{f.name}:enum"] = tuple(sorted((v.name, v.number) for v in f.enum_type.values))
        if f.message_type is not None:
            _fields(f.message_type, f"{path}.{f.name}", out, seen)


def test_schema_matches_tritonclients(tmp_dir):
    """proto/model_config.proto has the names, numbers, types and enum values of the
    ModelConfig that tritonclient ships, field for field."""
    import importlib
    import subprocess
    import sys
    protoc = shutil.which("protoc")
    if not protoc:
        pytest.skip("protoc not found")
    # A package of its own, so that both schemas load into one process.
    src = (ROOT / "proto/model_config.proto").read_text().replace("package inference;", "package flashq_schema;")
    (tmp_dir / "flashq_schema.proto").write_text(src)
    subprocess.run([protoc, f"-I{tmp_dir}", f"--python_out={tmp_dir}", "flashq_schema.proto"], check=True)
    sys.path.insert(0, str(tmp_dir))
    try:
        ours = importlib.import_module("flashq_schema_pb2")
    finally:
        sys.path.pop(0)
    from tritonclient.grpc import model_config_pb2 as theirs
    mine, triton = {}, {}
    _fields(ours.ModelConfig.DESCRIPTOR, "ModelConfig", mine, set())
    _fields(theirs.ModelConfig.DESCRIPTOR, "ModelConfig", triton, set())
    assert {k: v for k, v in mine.items() if triton.get(k) != v} == {}
    assert sorted(set(triton) - set(mine)) == []
