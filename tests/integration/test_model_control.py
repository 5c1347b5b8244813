"""Model control (Triton's model repository extension) and model versions, through
tritonclient.grpc against a real server on the CPU backend: the repository index, load and
unload in explicit mode, a bad model's load error, load/unload/reload under load with no
request lost, version folders with version_policy, and poll mode."""
import shutil
import tempfile
import threading
import time
import pathlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_TMP, ServerProcess
from helpers import metric, scrape, wait_for

ATTENTION = """name: "{name}"
max_batch_size: 0
{extra}
input [ {{ name: "Q" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] }},
        {{ name: "K" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] }},
        {{ name: "V" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] }} ]
output [ {{ name: "{output}" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] }} ]
parameters {{ key: "kind" value: {{ string_value: "attention" }} }}
"""


def add_model(root, name, extra="", versions=(), output="O"):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    for v in versions:
        (d / str(v)).mkdir(exist_ok=True)
    (d / "config.pbtxt").write_text(ATTENTION.format(name=name, extra=extra, output=output))
    return d


@pytest.fixture
def repo():
    pathlib.Path(TEST_TMP).mkdir(parents=True, exist_ok=True)
    d = pathlib.Path(tempfile.mkdtemp(prefix="repo-", dir=TEST_TMP))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def serve():
    started = []

    def _serve(repo, *flags, name="model-control"):
        s = ServerProcess([f"--model-repository={repo}", "--workers-per-model=1", *flags], name=name)
        started.append(s)
        s.start(timeout=120)
        return s, grpcclient.InferenceServerClient(s.url)

    yield _serve
    for s in started:
        s.assert_clean_stop()


def attention_inputs(tokens=4, heads=2):
    q = np.random.default_rng(0).standard_normal((tokens, heads, 64)).astype(np.float16)
    inputs = []
    for n in "QKV":
        t = grpcclient.InferInput(n, list(q.shape), "FP16")
        t.set_data_from_numpy(q)
        inputs.append(t)
    return inputs


def infer(client, model, version=""):
    return client.infer(model, attention_inputs(), model_version=version)


def index(client, ready=False):
    return {(m.name, m.version): (m.state, m.reason) for m in client.get_model_repository_index().models
            if not ready or m.state == "READY"}


def error_of(fn):
    with pytest.raises(InferenceServerException) as e:
        fn()
    return e.value


def test_index_lists_models_with_state(repo, serve):
    add_model(repo, "a")
    add_model(repo, "b")
    (repo / "broken").mkdir()
    (repo / "broken" / "config.pbtxt").write_text("garbage {")
    _, c = serve(repo, "--model-control-mode=explicit", "--load-model=a")
    idx = index(c)
    assert idx[("a", "1")] == ("READY", ""), idx
    assert idx[("b", "")] == ("", ""), idx
    assert ("broken", "") in idx, idx
    assert [m.name for m in c.get_model_repository_index().models if m.state == "READY"] == ["a"]
    assert c.is_model_ready("a") and not c.is_model_ready("b")
    assert "model_repository" in c.get_server_metadata().extensions


def test_load_and_unload_in_explicit_mode(repo, serve):
    add_model(repo, "a")
    add_model(repo, "b")
    _, c = serve(repo, "--model-control-mode=explicit", "--load-model=a")
    assert error_of(lambda: infer(c, "b")).status() == "StatusCode.NOT_FOUND"
    c.load_model("b")
    assert c.is_model_ready("b")
    assert infer(c, "b").get_response().model_version == "1"
    c.unload_model("b")
    assert not c.is_model_ready("b")
    e = error_of(lambda: infer(c, "b"))
    assert e.status() == "StatusCode.UNAVAILABLE" and "not loaded" in e.message(), e
    assert index(c)[("b", "")] == ("UNAVAILABLE", "unloaded")
    c.unload_model("b")  # unloading twice is fine
    c.load_model("b")  # and it loads again
    assert infer(c, "b").as_numpy("O").shape == (4, 2, 64)
    e = error_of(lambda: c.unload_model("nope"))
    assert e.status() == "StatusCode.NOT_FOUND", e
    e = error_of(lambda: c.load_model("nope"))
    assert e.status() == "StatusCode.NOT_FOUND" and "nope" in e.message(), e
    e = error_of(lambda: c.load_model("a", config='{"max_batch_size": 0}'))
    assert e.status() == "StatusCode.UNIMPLEMENTED" and "config" in e.message(), e


def test_loading_a_bad_model_errors_and_the_others_keep_serving(repo, serve):
    add_model(repo, "a")
    add_model(repo, "wrong_output", output="OUT")
    (repo / "broken").mkdir()
    (repo / "broken" / "config.pbtxt").write_text("garbage {")
    _, c = serve(repo, "--model-control-mode=explicit", "--load-model=a")
    e = error_of(lambda: c.load_model("wrong_output"))
    assert "wrong_output" in e.message() and "no output 'OUT'" in e.message(), e
    e = error_of(lambda: c.load_model("broken"))
    assert "config.pbtxt:1" in e.message(), e
    state, reason = index(c)[("wrong_output", "")]
    assert state == "UNAVAILABLE" and "'OUT'" in reason
    assert infer(c, "a").as_numpy("O").shape == (4, 2, 64)
    # A failed reload of a served model leaves the served one in place.
    (repo / "a" / "config.pbtxt").write_text("garbage {")
    error_of(lambda: c.load_model("a"))
    assert c.is_model_ready("a") and infer(c, "a").get_response().model_name == "a"


def test_load_unload_and_reload_under_load_lose_no_request(repo, serve):
    add_model(repo, "a")
    add_model(repo, "b")
    s, c = serve(repo, "--model-control-mode=explicit", "--load-model=a")
    stop = threading.Event()
    errors, done = [], [0]
    lock = threading.Lock()

    def client_loop():
        cl = grpcclient.InferenceServerClient(s.url)
        while not stop.is_set():
            try:
                infer(cl, "a")
                with lock:
                    done[0] += 1
            except Exception as ex:  # noqa: BLE001 (every failure is a lost request)
                with lock:
                    errors.append(repr(ex))
        cl.close()

    threads = [threading.Thread(target=client_loop) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(5):
            c.load_model("b")
            assert infer(c, "b").get_response().model_name == "b"
            c.unload_model("b")
            c.load_model("a")  # a reload of the model under load swaps it atomically
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    assert done[0] > 20, done


def test_unload_answers_the_requests_in_flight(repo, serve):
    """Requests admitted before an unload are computed and answered OK; the unload returns
    once they are; requests after it get UNAVAILABLE."""
    add_model(repo, "slow")
    s, c = serve(repo, "--model-control-mode=explicit", "--load-model=slow")
    inputs, n, answers = attention_inputs(tokens=1024, heads=8), 4, []
    for _ in range(n):
        c.async_infer("slow", inputs, lambda result, error: answers.append((result, error)))

    def in_flight():
        return metric(scrape(s.metrics_url)[0], "flashq_inflight_requests", model="slow")
    wait_for(lambda: in_flight() + len(answers) >= n, timeout=60, what="every request admitted")
    unanswered = n - len(answers)
    c.unload_model("slow")
    wait_for(lambda: len(answers) == n, timeout=60, what="every request answered")
    assert [e for _, e in answers if e is not None] == []
    assert all(r.as_numpy("O").shape == (1024, 8, 64) for r, _ in answers)
    assert unanswered >= 1, "every request finished before the unload: nothing was drained"
    assert error_of(lambda: infer(c, "slow")).status() == "StatusCode.UNAVAILABLE"


def test_versions_route_and_missing_versions_are_not_found(repo, serve):
    add_model(repo, "latest", versions=(1, 2, 3))
    add_model(repo, "two", extra="version_policy: { latest: { num_versions: 2 } }", versions=(1, 2, 3))
    add_model(repo, "some", extra="version_policy: { specific: { versions: [1, 3] } }", versions=(1, 2, 3))
    add_model(repo, "every", extra="version_policy: { all: {} }", versions=(1, 2))
    add_model(repo, "flat")  # no version folders: version 1
    _, c = serve(repo)
    assert infer(c, "latest").get_response().model_version == "3"
    e = error_of(lambda: infer(c, "latest", "1"))
    assert e.status() == "StatusCode.NOT_FOUND" and "serves version 3" in e.message(), e
    assert c.get_model_metadata("two").versions == ["2", "3"]
    assert infer(c, "two", "2").get_response().model_version == "2"
    assert c.is_model_ready("some", "1") and c.is_model_ready("some", "3") and not c.is_model_ready("some", "2")
    e = error_of(lambda: infer(c, "some", "2"))
    assert e.status() == "StatusCode.NOT_FOUND" and "versions 1, 3" in e.message(), e
    assert infer(c, "every", "1").get_response().model_version == "1"
    assert infer(c, "flat").get_response().model_version == "1"
    e = error_of(lambda: c.get_model_metadata("flat", "2"))
    assert e.status() == "StatusCode.NOT_FOUND", e
    stats = {(m.name, m.version) for m in c.get_inference_statistics().model_stats}
    assert ("some", "1") in stats and ("some", "3") in stats and ("some", "2") not in stats
    assert index(c)[("some", "3")] == ("READY", "")


def test_specific_version_without_folder_refuses_the_model(repo, serve):
    add_model(repo, "a")
    add_model(repo, "v", extra="version_policy: { specific: { versions: [4] } }", versions=(1,))
    _, c = serve(repo, "--model-control-mode=explicit", "--load-model=a")
    e = error_of(lambda: c.load_model("v"))
    assert "version 4" in e.message() and "versions present: 1" in e.message(), e


def test_poll_mode_follows_the_repository(repo, serve):
    add_model(repo, "a")
    _, c = serve(repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    assert c.is_model_ready("a")
    add_model(repo, "c")
    wait_for(lambda: c.is_model_ready("c"), timeout=30, what="poll loads the new folder c")
    assert infer(c, "c").get_response().model_name == "c"
    e = error_of(lambda: c.load_model("c"))
    assert "explicit" in e.message(), e
    (repo / "c" / "2").mkdir()  # a version folder: the model reloads, serving version 2
    wait_for(lambda: c.is_model_ready("c", "2"), timeout=30, what="poll reloads c with version 2")
    assert infer(c, "c").get_response().model_version == "2"
    shutil.rmtree(repo / "a")
    wait_for(lambda: not c.is_model_ready("a"), timeout=30, what="poll unloads the removed folder a")
    assert infer(c, "c").get_response().model_name == "c"


def test_control_is_refused_without_a_control_mode(repo, serve):
    add_model(repo, "a")
    _, c = serve(repo)
    e = error_of(lambda: c.unload_model("a"))
    assert "--model-control-mode=explicit" in e.message(), e
    assert c.is_model_ready("a")


def test_load_model_flag_needs_explicit_mode(repo):
    add_model(repo, "a")
    s = ServerProcess([f"--model-repository={repo}", "--load-model=a"], name="load-model-flag")
    with pytest.raises(AssertionError) as e:
        s.start(timeout=60)
    s.stop()
    assert "--load-model needs --model-control-mode=explicit" in str(e.value), str(e.value)
