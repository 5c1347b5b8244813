#!/usr/bin/env python3
"""scripts/demo.sh --dry-run under forced hardware: what it would build (the cmake arguments
that scripts/build.sh would pass) and which backend it would ask the server for.

    demo_dispatch_test.py SOURCE_DIR

The GPU is forced with FLASHQ_DEMO_GPU_ARCH or a fake nvidia-smi on PATH; nvcc with CUDACXX.
No build, setup or server runs.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ALL = "80-real;89-real;90a-real"


def main():
    src = pathlib.Path(sys.argv[1]).resolve()
    demo = src / "scripts" / "demo.sh"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="flashq-demo-dispatch-"))
    fake_nvcc = tmp / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\nexit 0\n")
    fake_nvcc.chmod(0o755)

    def fake_smi(name, script):
        d = tmp / name
        d.mkdir()
        (d / "nvidia-smi").write_text("#!/bin/sh\n" + script)
        (d / "nvidia-smi").chmod(0o755)
        return str(d)

    smi_h200 = fake_smi("h200", 'echo "NVIDIA H200, 9.0"\n')
    smi_two = fake_smi("two", 'printf "NVIDIA A100-SXM4-80GB, 8.0\\nNVIDIA L40S, 8.9\\n"\n')
    smi_no_gpu = fake_smi("nogpu", 'echo "No devices were found"; exit 6\n')
    smi_old = fake_smi("old", 'case "$1" in -L) echo "GPU 0: Tesla X (UUID: GPU-0)";; *) exit 2;; esac\n')

    base = {k: v for k, v in os.environ.items()
            if k not in ("FLASHQ_DEMO_GPU_ARCH", "FLASHQ_CUDA", "FLASHQ_CUDA_ARCHS", "BUILD_DIR", "CUDACXX",
                         "FLASHQ_NO_BUILD", "FLASHQ_BIN_DIR", "FLASHQ_DEMO_LOADER", "FLASHQ_CMAKE_ARGS")}
    base["CUDACXX"] = str(fake_nvcc)

    # (name, environment, arguments, CMAKE_CUDA_ARCHITECTURES or None for FLASHQ_CUDA=OFF, backend)
    cases = [
        ("no GPU", {"FLASHQ_DEMO_GPU_ARCH": "none"}, [], None, "cpu"),
        ("H100/H200 9.0", {"FLASHQ_DEMO_GPU_ARCH": "9.0"}, [], "90a-real", "cuda"),
        ("9.0 as 90", {"FLASHQ_DEMO_GPU_ARCH": "90"}, [], "90a-real", "cuda"),
        ("9.0 as sm_90a", {"FLASHQ_DEMO_GPU_ARCH": "sm_90a"}, [], "90a-real", "cuda"),
        ("A100 8.0", {"FLASHQ_DEMO_GPU_ARCH": "8.0"}, [], "80-real", "cuda"),
        ("L40S 8.9", {"FLASHQ_DEMO_GPU_ARCH": "89"}, [], "89-real", "cuda"),
        ("A10 8.6 runs sm_80", {"FLASHQ_DEMO_GPU_ARCH": "8.6"}, [], "80-real", "cuda"),
        ("T4 7.5: no kernels", {"FLASHQ_DEMO_GPU_ARCH": "7.5"}, [], None, "cpu"),
        ("two GPUs", {"FLASHQ_DEMO_GPU_ARCH": "8.0,9.0"}, [], "80-real;90a-real", "cuda"),
        ("no nvcc", {"FLASHQ_DEMO_GPU_ARCH": "9.0", "CUDACXX": str(tmp / "missing")}, [], None, "cpu"),
        ("FLASHQ_CUDA=OFF", {"FLASHQ_DEMO_GPU_ARCH": "9.0", "FLASHQ_CUDA": "OFF"}, [], None, "cpu"),
        ("FLASHQ_CUDA_ARCHS", {"FLASHQ_DEMO_GPU_ARCH": "9.0", "FLASHQ_CUDA_ARCHS": "80-real 89-real 90a-real"}, [],
         ALL, "cuda"),
        ("FLASHQ_CUDA_ARCHS without GPU", {"FLASHQ_DEMO_GPU_ARCH": "none", "FLASHQ_CUDA_ARCHS": "90a-real"}, [],
         "90a-real", "cpu"),
        ("nvidia-smi: H200", {"PATH": smi_h200 + os.pathsep + base["PATH"]}, [], "90a-real", "cuda"),
        ("nvidia-smi: A100 + L40S", {"PATH": smi_two + os.pathsep + base["PATH"]}, [], "80-real;89-real", "cuda"),
        ("nvidia-smi: no device", {"PATH": smi_no_gpu + os.pathsep + base["PATH"]}, [], None, "cpu"),
        ("nvidia-smi: no compute_cap field", {"PATH": smi_old + os.pathsep + base["PATH"]}, [], ALL, "cuda"),
        ("perf_analyzer loader", {"FLASHQ_DEMO_GPU_ARCH": "9.0", "FLASHQ_DEMO_LOADER": "perf_analyzer"}, [],
         "90a-real", "cuda"),
    ]
    if shutil.which("nvidia-smi") is None:
        cases.append(("no nvidia-smi", {}, [], None, "cpu"))

    failures = 0
    for name, env, args, archs, backend in cases:
        e = dict(base, **env)
        p = subprocess.run(["bash", str(demo), "--dry-run", *args], env=e, cwd=tmp, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        out = p.stdout
        cmake = next((l for l in out.splitlines() if l.startswith("build: cmake -S")), "")
        build = next((l for l in out.splitlines() if l.startswith("build: cmake --build")), "")
        run = next((l for l in out.splitlines() if l.startswith("demo: would run") and "flashq-server" in l
                    and "build.sh" not in l), "")
        problems = []
        if p.returncode != 0:
            problems.append(f"exit {p.returncode}")
        if " -B build-demo " not in cmake:
            problems.append("not configured into build-demo")
        if archs is None:
            if "-DFLASHQ_CUDA=OFF" not in cmake or "CMAKE_CUDA_ARCHITECTURES" in cmake:
                problems.append("expected -DFLASHQ_CUDA=OFF and no CMAKE_CUDA_ARCHITECTURES")
        elif "-DFLASHQ_CUDA=ON" not in cmake or f"-DCMAKE_CUDA_ARCHITECTURES={archs} " not in cmake + " ":
            problems.append(f"expected -DFLASHQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES={archs}")
        if not build.endswith("--target flashq-server flashq-bench"):
            problems.append("expected only the targets flashq-server and flashq-bench")
        flag = "--backend=" if env.get("FLASHQ_DEMO_LOADER") else "--server-backend="
        if f"{flag}{backend} " not in run + " ":
            problems.append(f"expected {flag}{backend} in the server's command")
        print(f"FAIL {name}: {'; '.join(problems)}" if problems else f"ok   {name}")
        if problems:
            print("  " + out.replace("\n", "\n  "))
            failures += 1

    # The user's own flashq-bench flags come after the demo's, so they win (last flag wins).
    p = subprocess.run(["bash", str(demo), "--dry-run", "--", "--server-backend=auto"], cwd=tmp, text=True,
                       env=dict(base, FLASHQ_DEMO_GPU_ARCH="none"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run = p.stdout.strip().splitlines()[-1]
    ok = run.index("--server-backend=cpu") < run.index("--server-backend=auto")
    print(f"{'ok  ' if ok else 'FAIL'} user arguments after the demo's")
    failures += not ok

    # Prebuilt binaries (FLASHQ_NO_BUILD) on a GPU host without nvcc: nothing built, the cuda backend.
    p = subprocess.run(["bash", str(demo), "--dry-run"], cwd=tmp, text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=dict(base, FLASHQ_DEMO_GPU_ARCH="9.0", FLASHQ_NO_BUILD="1",
                                                          CUDACXX=str(tmp / "missing")))
    ok = p.returncode == 0 and "build: cmake" not in p.stdout and "--server-backend=cuda " in p.stdout
    print(f"{'ok  ' if ok else 'FAIL'} prebuilt binaries on a GPU host without nvcc")
    failures += not ok

    # A forced architecture that is not one is refused.
    p = subprocess.run(["bash", str(demo), "--dry-run"], cwd=tmp, text=True, env=dict(base, FLASHQ_DEMO_GPU_ARCH="x"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ok = p.returncode == 2 and "not a compute capability" in p.stdout
    print(f"{'ok  ' if ok else 'FAIL'} FLASHQ_DEMO_GPU_ARCH=x refused")
    failures += not ok

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(cases) + 3 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
