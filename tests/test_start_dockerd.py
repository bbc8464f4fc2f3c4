"""containers/start-dockerd.sh writes its log and pid file only where no other user can plant
a link (a root-owned folder, /run/repro-kit by default), never at fixed names in /tmp.

`docker`, `dockerd`, `mount` and `umount` are stand-ins here (a second daemon cannot start
beside CI's): the script's own logic, folder checks and files are what is tested. The real
overlay probe runs wherever CI starts its daemon with this script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "containers" / "start-dockerd.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the script starts dockerd as root")


def _fakes(tmp_path: Path, overlay: bool = False) -> dict[str, str]:
    """`docker info` fails until the stand-in dockerd has started; dockerd just waits; an
    overlay mount succeeds only where `overlay` says."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = tmp_path / "dockerd-started"
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ -e "{started}" ]\n')
    (bin_dir / "dockerd").write_text(f'#!/bin/sh\necho "dockerd $*"\ntouch "{started}"\nsleep 30\n')
    (bin_dir / "mount").write_text(f"#!/bin/sh\nexit {0 if overlay else 32}\n")
    (bin_dir / "umount").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _run(tmp_path: Path, overlay: bool = False, **env: str) -> subprocess.CompletedProcess:
    env.setdefault("DOCKERD_DATA_ROOT", str(tmp_path / "data-root"))
    done = subprocess.run(
        ["sh", str(SCRIPT)],
        env={**os.environ, **_fakes(tmp_path, overlay), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    pid = Path(env.get("DOCKERD_RUN_DIR", "/nonexistent")) / "dockerd.pid"
    if pid.is_file():
        os.kill(int(pid.read_text()), 15)  # the stand-in dockerd this test started
    return done


def test_log_and_pid_file_go_to_a_root_owned_folder(tmp_path):
    run_dir = tmp_path / "run"
    done = _run(tmp_path, DOCKERD_RUN_DIR=str(run_dir))
    assert done.returncode == 0, done.stderr
    assert (run_dir / "dockerd.pid").is_file()
    assert "dockerd --storage-driver=vfs" in (run_dir / "dockerd.log").read_text()
    assert "/tmp/" not in SCRIPT.read_text(), "no fixed names in /tmp"


@pytest.mark.parametrize(("overlay", "driver"), [(True, "overlay2"), (False, "vfs")])
def test_overlay2_where_an_overlay_mounts_else_vfs(tmp_path, overlay, driver):
    run_dir = tmp_path / "run"
    done = _run(tmp_path, overlay=overlay, DOCKERD_RUN_DIR=str(run_dir))
    assert done.returncode == 0, done.stderr
    assert f"with the {driver} storage driver" in done.stdout
    log = (run_dir / "dockerd.log").read_text()
    assert f"--storage-driver={driver} --data-root {tmp_path / 'data-root'}" in log
    assert list((tmp_path / "data-root").iterdir()) == [], "the probe cleans up after itself"


def test_a_chosen_driver_skips_the_probe_and_a_wrong_one_is_refused(tmp_path):
    done = _run(
        tmp_path, overlay=True, DOCKERD_RUN_DIR=str(tmp_path / "run"), DOCKERD_STORAGE_DRIVER="vfs"
    )
    assert done.returncode == 0 and "with the vfs storage driver" in done.stdout
    (tmp_path / "x").mkdir()
    wrong = _run(
        tmp_path / "x", DOCKERD_RUN_DIR=str(tmp_path / "run2"), DOCKERD_STORAGE_DRIVER="zfs"
    )
    assert wrong.returncode == 1
    assert "must be overlay2 or vfs, got 'zfs'" in wrong.stderr


def test_a_folder_others_can_write_is_refused(tmp_path):
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    run_dir.chmod(0o777)
    done = _run(tmp_path, DOCKERD_RUN_DIR=str(run_dir))
    assert done.returncode == 1 and "writable by root only" in done.stderr
    assert list(run_dir.iterdir()) == []


def test_a_planted_link_is_not_written_through(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run_dir / "dockerd.log").symlink_to(victim)
    done = _run(tmp_path, DOCKERD_RUN_DIR=str(run_dir))
    assert done.returncode == 1 and "is a link; refusing" in done.stderr
    assert victim.read_text() == "precious\n"
