"""The kit's plugin entry point reaches processes vLLM starts, where the kit is not
pip-installed (repro.engine.plugin_path)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

from repro.engine import plugin_path

REPO = Path(__file__).resolve().parents[1]

# A child Python without site-packages (-S): the kit is not installed there, only on
# PYTHONPATH, as on a bare GPU host.
_CHILD = """
import json, os, subprocess, sys
from repro.engine import plugin_path
before = plugin_path.kit_entry_point_visible()
folder = plugin_path.expose_entry_point()
grandchild = subprocess.run(
    [sys.executable, "-S", "-c",
     "import json; from importlib.metadata import entry_points; "
     "print(json.dumps([[e.name, e.value] for e in entry_points(group='vllm.general_plugins')]))"],
    capture_output=True, text=True, check=True,
)
here = plugin_path.kit_entry_point_visible()
print(json.dumps({"before": before, "folder": str(folder), "here": here,
                  "grandchild": json.loads(grandchild.stdout)}))
"""


def test_written_distribution_holds_only_the_entry_point(tmp_path):
    plugin_path.write_distribution(tmp_path)
    (dist,) = list(distributions(path=[str(tmp_path)]))
    assert dist.metadata["Name"] == plugin_path.DIST
    assert [(e.group, e.name, e.value) for e in dist.entry_points] == [
        ("vllm.general_plugins", "repro_kit", "repro.vllm_plugin:register")
    ]


def test_a_process_started_from_the_engine_finds_the_plugin(tmp_path):
    # The package alone, as on a bare host: a checkout where `pip install -e .` ran holds
    # the kit's metadata (repro_kit.egg-info) beside it, which would show the entry point.
    shutil.copytree(
        REPO / "repro", tmp_path / "repro", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", _CHILD],
        cwd=tmp_path,  # `-c` puts the working directory on sys.path
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["before"] is False  # not installed: vLLM's own loading would skip the kit
    assert got["here"] is True
    assert ["repro_kit", "repro.vllm_plugin:register"] in got["grandchild"]
    assert Path(got["folder"]).name.startswith("repro-kit-entry-point-")


def test_nothing_is_written_where_the_kit_is_installed(monkeypatch):
    monkeypatch.setattr(plugin_path, "kit_entry_point_visible", lambda: True)
    monkeypatch.setattr(plugin_path, "_exposed", None)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert plugin_path.expose_entry_point() is None
    # The kit's own source still goes first, for children that are not spawned by
    # multiprocessing (which passes sys.path on).
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(REPO), "/elsewhere"])
