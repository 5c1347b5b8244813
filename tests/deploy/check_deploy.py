#!/usr/bin/env python3
"""Offline checks of deploy/: what no engine here runs (a cluster, Grafana, Envoy), and the
static side of what the container tests run (Dockerfiles, compose, Prometheus config).

    check_deploy.py {k8s|prometheus|grafana|compose|dockerfile} [--src REPO]

k8s         kubernetes-validate --strict on every manifest, against the oldest (1.27) and the
            newest schemas it ships; kustomization lists every manifest; cross-references
            (probes on the grpc port, Services select the Deployment's pods, HPA targets it,
            the adapter exposes the metric the HPA reads, PVC claimed exists).
prometheus  promtool check config / check rules / test rules; the adapter's metricsQuery,
            with its template filled in, parses as PromQL (promtool).
grafana     dashboard JSON: unique ids, every query parses as PromQL (promtool, with the
            Grafana variables filled in) and names only flashq families the server exports;
            the views the dashboard promises are present; provisioning points at it.
compose     `docker compose config` or `docker-compose config` (schema check without an
            engine), plus the files the stack mounts exist.
dockerfile  a small linter (hadolint is not packaged for Debian): both Dockerfiles run
            scripts/setup.sh, scripts/build.sh and deploy/bundle.sh (the steps CI proves),
            pass build.sh only variables it reads, build `prebuilt` and `runtime` on one
            runtime stage, take pip's CA as a build secret, have a non-root USER, a
            HEALTHCHECK with flashq-health, EXPOSE 8001 8002, COPY only paths that exist,
            and the usual apt hygiene; the GPU image's CUDA comes from pinned wheels; the
            Prometheus image is Debian's package on the same base.
Exit 0 when every check passes; prints one line per check.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

FAILS = []
PASSES = [0]


def ok(cond, what):
    if cond:
        PASSES[0] += 1
        print(f"  ok   {what}")
    else:
        FAILS.append(what)
        print(f"  FAIL {what}")
    return cond


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return p.returncode, (p.stdout + p.stderr).strip()


# Families the server exports (server/metrics/metrics.cc, README "Metrics"), plus the
# suffixes Prometheus derives for histograms and counters.
FAMILIES = {"flashq_request_duration_seconds", "flashq_batch_requests", "flashq_batch_tokens",
            "flashq_requests_total", "flashq_inflight_requests", "flashq_queue_depth",
            "flashq_kv_cache_blocks_in_use", "flashq_kv_cache_blocks_total", "flashq_kv_cache_usage_ratio",
            "flashq_gpu_memory_used_bytes", "flashq_kernel_seconds"}


def family_of(name):
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf) and name[: -len(suf)] in FAMILIES:
            return name[: -len(suf)]
    return name


def promql_check(exprs, what):
    """Parses PromQL by running promtool check rules on a file of recording rules."""
    promtool = shutil.which("promtool")
    if not ok(promtool is not None, "promtool installed (Debian package prometheus)"):
        return
    rules = {"groups": [{"name": "check", "rules": [
        {"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
    rc, out = run([promtool, "check", "rules", f.name])
    os.unlink(f.name)
    ok(rc == 0, f"{what}: {len(exprs)} PromQL expressions parse" + ("" if rc == 0 else f"\n{out}"))


def server_flags(src):
    """Every flag name flashq-server defines (FlagSet Add and Alias calls under server/)."""
    names = set()
    for root, _, files in os.walk(os.path.join(src, "server")):
        for f in files:
            if f.endswith(".cc"):
                names |= set(re.findall(r'\.(?:Add|Alias)\("([a-z0-9-]+)"', open(os.path.join(root, f)).read()))
    return names


# ---------------------------------------------------------------------------------
def check_k8s(src):
    k8s = os.path.join(src, "deploy", "k8s")
    files = sorted(f for f in os.listdir(k8s) if f.endswith((".yaml", ".yml")))
    manifests = [f for f in files if f != "kustomization.yaml"]
    py_bin = os.path.dirname(sys.executable)
    kv = os.path.join(py_bin, "kubernetes-validate")
    if not os.path.exists(kv):
        print("  installing kubernetes-validate into the venv (scripts/setup.sh lists it)")
        run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "kubernetes-validate"])
    if not ok(os.path.exists(kv), "kubernetes-validate available"):
        return
    paths = [os.path.join(k8s, f) for f in manifests]
    for ver in ("1.27", None):
        cmd = [kv, "--strict", "--quiet"] + (["-k", ver] if ver else []) + paths
        rc, out = run(cmd)
        ok(rc == 0 and "ERROR" not in out and "WARN" not in out,
           f"kubernetes-validate --strict, Kubernetes {ver or 'latest shipped'}: {len(paths)} files"
           + ("" if rc == 0 else f"\n{out}"))

    docs = {}
    for f in manifests:
        for d in yaml.safe_load_all(open(os.path.join(k8s, f))):
            if d:
                docs[(d["kind"], d["metadata"]["name"])] = d
    kust = yaml.safe_load(open(os.path.join(k8s, "kustomization.yaml")))
    ok(sorted(kust["resources"]) == manifests, "kustomization.yaml lists every manifest and only those")

    dep = docs.get(("Deployment", "flashq"))
    if not ok(dep is not None, "Deployment flashq exists"):
        return
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    ok(str(c["resources"]["limits"].get("nvidia.com/gpu")) == "1", "Deployment requests nvidia.com/gpu")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    ok(ports.get("grpc") == 8001 and ports.get("metrics") == 8002, "container ports grpc 8001, metrics 8002")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        ok(c.get(probe, {}).get("grpc", {}).get("port") == 8001, f"{probe} is a gRPC health probe on 8001")
    ok(pod["spec"]["securityContext"].get("runAsNonRoot") is True, "pod runs as non-root")
    # Without a maximum connection age, clients stay on the replicas they first reached and
    # replicas added by the HPA get no traffic.
    args = dict(a[2:].split("=", 1) for a in c.get("args", []))
    unknown = sorted(set(args) - server_flags(src))
    ok(not unknown, f"Deployment passes only flags the server defines (unknown: {unknown})")
    age = args.get("grpc-max-connection-age", "")
    ok(age.isdigit() and int(age) > 0, f"Deployment sets a positive --grpc-max-connection-age: {age}")
    # Clients balancing over the headless Service ping to notice lost replicas; with no call
    # in flight gRPC allows a client ping only when permit-without-calls is set.
    ping = args.get("grpc-http2-min-recv-ping-interval-without-data", "")
    ok(args.get("grpc-keepalive-permit-without-calls") in ("1", "true") and ping.isdigit() and int(ping) <= 10000,
       "Deployment accepts client keepalive pings every 10 s, also between calls")
    labels = pod["metadata"]["labels"]
    for name in ("flashq", "flashq-headless"):
        svc = docs.get(("Service", name))
        ok(svc is not None and all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
           f"Service {name} selects the Deployment's pods")
    headless = docs.get(("Service", "flashq-headless"), {}).get("spec", {})
    ok(headless.get("clusterIP") == "None" and not headless.get("publishNotReadyAddresses"),
       "flashq-headless is headless and lists only ready pods")
    ok(any(p.get("port") == 8001 and p.get("appProtocol") == "kubernetes.io/h2c" for p in headless.get("ports", [])),
       "flashq-headless serves 8001 as h2c (gRPC)")
    pdb = docs.get(("PodDisruptionBudget", "flashq"))
    ok(pdb is not None and all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items()),
       "PodDisruptionBudget selects the Deployment's pods")
    hpa = docs.get(("HorizontalPodAutoscaler", "flashq"))
    ok(hpa is not None and hpa["spec"]["scaleTargetRef"]["name"] == "flashq", "HPA targets Deployment flashq")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] if hpa else None
    cm = docs.get(("ConfigMap", "flashq-adapter-rules"))
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"] if cm else []
    ok(any(r.get("name", {}).get("as") == metric for r in rules),
       f"prometheus-adapter rule exposes the HPA's metric {metric}")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    ok(all(("PersistentVolumeClaim", n) in docs for n in claims) and claims, "model repository volume's PVC exists")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    repo = env.get("FLASHQ_MODEL_REPOSITORY")
    ok(repo in mounts and mounts[repo].get("readOnly"), "FLASHQ_MODEL_REPOSITORY is a read-only volume mount")


# ---------------------------------------------------------------------------------
def adapter_exprs(src):
    cm = yaml.safe_load(open(os.path.join(src, "deploy", "k8s", "prometheus-adapter-rules.yaml")))
    out = []
    for r in yaml.safe_load(cm["data"]["config.yaml"])["rules"]:
        q = r["metricsQuery"].replace("<<.GroupBy>>", "namespace, pod")
        q = q.replace("<<.LabelMatchers>>", 'namespace="flashq",pod=~"flashq-.*"')
        q = q.replace("<<.Series>>", "flashq_request_duration_seconds_count")
        out += [q, r["seriesQuery"]]
    return out


def check_prometheus(src):
    promtool = shutil.which("promtool")
    if not ok(promtool is not None, "promtool installed (Debian package prometheus)"):
        return
    cfg = os.path.join(src, "deploy", "prometheus", "prometheus.yml")
    rc, out = run([promtool, "check", "config", cfg])
    ok(rc == 0, "promtool check config deploy/prometheus/prometheus.yml (and its rule files)" + ("" if rc == 0 else f"\n{out}"))
    rc, out = run([promtool, "check", "rules", os.path.join(src, "deploy", "prometheus", "rules.yml")])
    ok(rc == 0, "promtool check rules deploy/prometheus/rules.yml" + ("" if rc == 0 else f"\n{out}"))
    rc, out = run([promtool, "test", "rules", "prometheus_rules_test.yml"], cwd=os.path.join(src, "tests", "deploy"))
    ok(rc == 0, "promtool test rules tests/deploy/prometheus_rules_test.yml" + ("" if rc == 0 else f"\n{out}"))
    promql_check(adapter_exprs(src), "prometheus-adapter metricsQuery/seriesQuery (template filled in)")
    conf = yaml.safe_load(open(cfg))
    targets = [t for j in conf["scrape_configs"] if j["job_name"] == "flashq" for s in j["static_configs"] for t in s["targets"]]
    ok(targets == ["flashq:8002"], "Prometheus scrapes the compose service flashq:8002")


# ---------------------------------------------------------------------------------
def dashboard_queries(src):
    """(panel title, PromQL) for every query of the Grafana dashboard, with Grafana's
    variables filled in as "all" and a 1m rate interval. stack_check.py runs them too."""
    dash = json.load(open(os.path.join(src, "deploy", "grafana", "dashboards", "flashq.json")))
    subst = {"$__rate_interval": "1m", "$instance": ".*", "$model": ".*"}
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            e = t["expr"]
            for k, v in subst.items():
                e = e.replace(k, v)
            out.append((p["title"], e))
    return out


def check_grafana(src):
    g = os.path.join(src, "deploy", "grafana")
    dash = json.load(open(os.path.join(g, "dashboards", "flashq.json")))
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    ok(len(ids) == len(set(ids)), "dashboard panel ids are unique")
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    filled = [e for _, e in dashboard_queries(src)]
    ok(not any("$" in e for e in filled), "dashboard queries use only the variables $instance, $model, $__rate_interval")
    promql_check(filled, "Grafana dashboard queries")
    names = {family_of(n) for e in filled for n in re.findall(r"\b(flashq_[a-z_]+)\b", e)}
    ok(names <= FAMILIES, f"dashboard names only exported families (unknown: {sorted(names - FAMILIES)})")
    titles = " | ".join(p["title"].lower() for p in panels)
    for want in ("throughput", "p50", "p99", "per batch", "kv cache", "gpu memory"):
        ok(want in titles, f"dashboard shows {want}")
    ok(any('stage' in e for e in exprs), "latency is broken down by stage")
    prov = yaml.safe_load(open(os.path.join(g, "provisioning", "dashboards", "flashq.yml")))
    ok(prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards", "dashboard provider path")
    ds = yaml.safe_load(open(os.path.join(g, "provisioning", "datasources", "prometheus.yml")))
    ok(ds["datasources"][0]["url"] == "http://prometheus:9090", "datasource points at the compose Prometheus")
    compose = yaml.safe_load(open(os.path.join(src, "deploy", "compose.yaml")))
    vols = compose["services"]["grafana"]["volumes"]
    ok(any(v.startswith("./grafana/dashboards:/var/lib/grafana/dashboards") for v in vols), "compose mounts the dashboards")


# ---------------------------------------------------------------------------------
def check_compose(src):
    d = os.path.join(src, "deploy")
    variants = [["compose.yaml"], ["compose.yaml", "compose.gpu.yaml"]]
    tool = None
    if shutil.which("docker") and run(["docker", "compose", "version"])[0] == 0:
        tool = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        tool = ["docker-compose"]
    if tool is None:
        print("  SKIPPED: no compose implementation to lint with: install Debian's docker-compose "
              "(scripts/setup.sh) or the docker compose plugin")
        sys.exit(77)
    if True:
        for files in variants:
            cmd = tool + sum((["-f", f] for f in files), []) + ["config", "-q"]
            rc, out = run(cmd, cwd=d)
            ok(rc == 0, f"{' '.join(tool)} config: {' + '.join(files)}" + ("" if rc == 0 else f"\n{out}"))
    c = yaml.safe_load(open(os.path.join(d, "compose.yaml")))
    ok(set(c["services"]) == {"flashq", "prometheus", "grafana"}, "services: flashq, prometheus, grafana")
    for name, svc in c["services"].items():
        for v in svc.get("volumes", []):
            host = v.split(":")[0]
            if host.startswith("./"):
                ok(os.path.exists(os.path.join(d, host)), f"{name} mounts {host}, which exists")
    b = c["services"]["flashq"]["build"]
    ok(os.path.exists(os.path.join(d, b["context"], b["dockerfile"])), f"flashq builds {b['dockerfile']}, which exists")
    pb = c["services"]["prometheus"]["build"]
    ok(os.path.exists(os.path.join(d, pb["context"], "Dockerfile")), f"prometheus builds {pb['context']}/Dockerfile, which exists")
    published = {p.rsplit(":", 1)[1] for p in c["services"]["flashq"]["ports"]}
    ok({"8001", "8002"} <= published, "compose publishes the container ports 8001 and 8002")
    ok("flashq-health" in " ".join(c["services"]["flashq"]["healthcheck"]["test"]), "compose healthcheck uses flashq-health")


# ---------------------------------------------------------------------------------
def dockerfile_instructions(path):
    """(instruction, args) pairs with continuation lines joined and comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if not cur and (s.strip().startswith("#") or not s.strip()):
            continue
        if s.strip().startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def dockerfile_stages(ins):
    """[(name, base, instructions)] per FROM; a stage without AS is named by its index."""
    stages = []
    for i, a in ins:
        if i == "FROM":
            words = a.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append((name, words[0], []))
        elif stages:
            stages[-1][2].append((i, a))
    return stages


def stage_chain(stages, name):
    """The instructions an image built to stage `name` carries: its own and those of the
    stages it is built FROM, base first."""
    by_name = {n: (b, i) for n, b, i in stages}
    out = []
    while name in by_name:
        base, ins = by_name[name]
        out = ins + out
        name = base
    return out


def check_apt_hygiene(name, ins):
    for i, a in ins:
        if i == "RUN" and "apt-get install" in a:
            ok("--no-install-recommends" in a and "-y" in a, f"{name}: apt-get install -y --no-install-recommends")
            ok("rm -rf /var/lib/apt/lists" in a, f"{name}: apt lists removed in the same layer")
        if i == "ADD":
            ok(False, f"{name}: uses COPY, not ADD ({a})")
    ok(any(i == "SHELL" and "pipefail" in a for i, a in ins), f"{name}: SHELL with pipefail for piped RUNs")


def check_dockerfile(src):
    build_sh = open(os.path.join(src, "scripts", "build.sh")).read()
    read_vars = set(re.findall(r"\$\{(\w+)", build_sh)) | set(re.findall(r"\$(\w+)", build_sh))
    for name in ("Dockerfile", "Dockerfile.cpu"):
        path = os.path.join(src, "deploy", name)
        ins = dockerfile_instructions(path)
        stages = dockerfile_stages(ins)
        print(f" {name}:")
        bases = {n: b for n, b, _ in stages}
        ok(len(stages) >= 3, f"{name}: multi-stage ({len(stages)} stages)")
        ok(bases.get("build") == "debian:12", f"{name}: builder `build` on Debian 12 ({bases.get('build')})")
        ok(bases.get("runtime-base") == "debian:12-slim", f"{name}: runtime on Debian 12 slim ({bases.get('runtime-base')})")
        # The fast test builds `prebuilt`; it must be the shipped image but for the bundle's origin.
        ok(stages[-1][0] == "runtime" and bases.get("prebuilt") == bases.get("runtime") == "runtime-base",
           f"{name}: the default target `runtime` and `prebuilt` both build on `runtime-base`")
        own = {n: i for n, _, i in stages}  # each stage's own instructions
        ok(any(i == "COPY" and a.startswith("--from=bundle ") for i, a in own.get("prebuilt", [])),
           f"{name}: `prebuilt` copies the bundle from the build context `bundle`")
        ok(any(i == "COPY" and a.startswith("--from=build ") for i, a in own.get("runtime", [])),
           f"{name}: `runtime` copies the bundle from the builder")
        if name == "Dockerfile":
            cv = [a for i, a in ins if i == "ARG" and a.startswith("CUDA_VERSION=")]
            ok(cv and cv[0].split("=")[1].startswith("13."), f"{name}: CUDA 13")
            cuda = " ".join(a for i, a in own.get("cuda", []) if i == "RUN")
            wheels = re.findall(r'"(nvidia-[a-z-]+)==\$\{CUDA_VERSION\}\.\*"', cuda)
            ok({"nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cublas"} <= set(wheels),
               f"{name}: stage `cuda` installs the CUDA wheels pinned to CUDA_VERSION ({wheels})")
            ok(any(i == "COPY" and a.startswith("--from=cuda ") and a.endswith("/usr/local/cuda/lib64/libcublasLt.so.13")
                   for i, a in own.get("runtime-base", [])),
               f"{name}: the runtime carries cuBLASLt at /usr/local/cuda/lib64, where the launcher looks")
            ok(any(i == "COPY" and a.startswith("--from=cuda ") for i, a in own.get("build", [])),
               f"{name}: the builder compiles with the CUDA toolkit from stage `cuda`")
        runs = " ; ".join(a for i, a in ins if i == "RUN")
        for script in ("scripts/setup.sh", "scripts/build.sh", "deploy/bundle.sh"):
            ok(script in runs, f"{name}: runs {script} (the same step CI runs)")
            ok(os.access(os.path.join(src, script), os.X_OK), f"{script} exists and is executable")
        baked = [a for i, a in ins if (i == "COPY" and re.search(r"\.(crt|pem)\b", a)) or (i == "ENV" and "CERT" in a)]
        ok("/run/secrets/ca" in runs and not baked,
           f"{name}: pip's CA bundle comes in as the build secret `ca`, not in a layer")
        build_run = next((a for i, a in ins if i == "RUN" and "scripts/build.sh" in a), "")
        prefix = re.split(r"&&|;", build_run.split("scripts/build.sh")[0])[-1]
        used = set(re.findall(r"\b([A-Z][A-Z0-9_]*)=", prefix))
        ok(used and used <= read_vars, f"{name}: build.sh is given only variables it reads ({sorted(used)})"
           + ("" if used <= read_vars else f", unknown {sorted(used - read_vars)}"))
        final = stage_chain(stages, stages[-1][0])
        users = [a for i, a in final if i == "USER"]
        ok(users and users[-1].split(":")[0] not in ("0", "root"), f"{name}: runtime runs as a non-root USER ({users[-1] if users else None})")
        hc = [a for i, a in final if i == "HEALTHCHECK"]
        ok(hc and "flashq-health" in hc[0], f"{name}: HEALTHCHECK uses flashq-health (gRPC health)")
        exposed = set(" ".join(a for i, a in final if i == "EXPOSE").split())
        ok({"8001", "8002"} <= exposed, f"{name}: EXPOSE 8001 8002")
        ok(any(i == "ENTRYPOINT" for i, _ in final), f"{name}: has an ENTRYPOINT")
        for i, a in ins:
            if i == "COPY" and "--from=" not in a:
                for s in a.split()[:-1]:
                    ok(s == "." or os.path.exists(os.path.join(src, s)), f"{name}: COPY {s} exists in the context")
        check_apt_hygiene(name, ins)
    ignore = os.path.join(src, ".dockerignore")
    ok(os.path.exists(ignore) and {"build", "build-*", ".venv*"} <= set(open(ignore).read().split()),
       ".dockerignore keeps build folders and the venv out of the context")

    print(" prometheus/Dockerfile:")
    ins = dockerfile_instructions(os.path.join(src, "deploy", "prometheus", "Dockerfile"))
    froms = [a for i, a in ins if i == "FROM"]
    ok(froms == ["debian:12-slim"], "prometheus/Dockerfile: on the same Debian 12 slim base")
    ok(any(i == "RUN" and re.search(r"apt-get install .*\bprometheus\b", a) for i, a in ins),
       "prometheus/Dockerfile: Debian's prometheus package")
    users = [a for i, a in ins if i == "USER"]
    ok(users and users[-1] not in ("0", "root"), f"prometheus/Dockerfile: runs as a non-root USER ({users})")
    check_apt_hygiene("prometheus/Dockerfile", ins)


# ---------------------------------------------------------------------------------
def check_envoy(src):
    """The documented L7 affinity config: YAML only (no Envoy binary here)."""
    e = yaml.safe_load(open(os.path.join(src, "deploy", "envoy", "envoy.yaml")))["static_resources"]
    hcm = e["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    ok(route["hash_policy"][0]["header"]["header_name"] == "x-flashq-sequence-id", "routes hash on x-flashq-sequence-id")
    c = {c["name"]: c for c in e["clusters"]}[route["cluster"]]
    ok(c["lb_policy"] == "RING_HASH", "cluster balances with RING_HASH")
    addr = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    ok(c["type"] == "STRICT_DNS" and addr["address"].startswith("flashq-headless.") and addr["port_value"] == 8001,
       "endpoints from the headless Service, port 8001")
    ok("http2_protocol_options" in json.dumps(c), "upstream speaks HTTP/2 (gRPC)")
    ok("grpc_health_check" in c["health_checks"][0], "active gRPC health checks")
    doc = open(os.path.join(src, "docs", "deploy.md")).read()
    ok("x-flashq-sequence-id" in doc and "ring_hash" in doc.lower(), "docs/deploy.md documents the header and ring hash")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["k8s", "prometheus", "grafana", "compose", "dockerfile", "envoy"])
    ap.add_argument("--src", default=os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    a = ap.parse_args()
    print(f"check_deploy {a.what}:")
    globals()[f"check_{a.what}"](a.src)
    print(f"check_deploy {a.what}: {PASSES[0]} passed, {len(FAILS)} failed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
