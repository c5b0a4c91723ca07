"""Load the syphon's configuration, once, into frozen objects (:mod:`backlog_syphon.config.types`).

Sources, later ones winning: a YAML file (``conf/*.yaml``), environment variables
``SYPHON__<SECTION>__<KEY>``, then ``--set section.key=value`` flags. Unknown keys and wrong types
are errors that name the key and where it came from.

Secrets: connection strings (and an Azure AD credential's client secret) are given as ``{env: VAR}``,
``{secret: scope/key}`` (Databricks secret scope) or, for a one-off run, literally; a proxy's password
only from the environment (a reference, or its own ``SYPHON__`` variable) or a secret scope, never
written in a file or on a command line. Either way they end up in a ``Secret``, and no error message
ever includes a value that could be one. Secret scopes are
read by the ``secret_reader`` the caller passes (``run.databricks_host.load_config`` passes Databricks' own), so
this module stays pure: it reads the file and the variables it is given, nothing else.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from backlog_syphon.config.types import (
    BacklogConfig,
    ConfigError,
    MigrationConfig,
    NamespaceConfig,
    PrimaryConfig,
    RedriveConfig,
    RestoreConfig,
    RunConfig,
    Secret,
    SinkConfig,
    StorageConfig,
)
from backlog_syphon.config.validation import check_type, credential_config, validate_sections
from backlog_syphon.model import CredentialKind, RunSource

ENV_PREFIX = "SYPHON__"
SECRET_KEYS = ("connection_string", "proxy_password")  # a value is a secret reference, kept verbatim
SECRET_SCOPES_NEED_DATABRICKS = "{secret: scope/key} references need Databricks (dbutils.secrets); use {env: VAR} elsewhere"


@dataclass(frozen=True)
class SyphonConfig:
    primary: PrimaryConfig
    secondary: NamespaceConfig
    backlog: BacklogConfig = field(default_factory=BacklogConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    run: RunConfig = field(default_factory=RunConfig)
    restore: RestoreConfig = field(default_factory=RestoreConfig)
    sink: SinkConfig = field(default_factory=SinkConfig)
    redrive: RedriveConfig = field(default_factory=RedriveConfig)
    migration: MigrationConfig = field(default_factory=MigrationConfig)

    @property
    def redriving(self) -> bool:
        """Whether this run re-drives dead-letter sub-queues (``run.source: dead_letters``): the backlog queues',
        or, with a ``migration`` section, the migration's sources'."""
        return self.run.source == RunSource.DEAD_LETTERS

    @property
    def migrating(self) -> bool:
        """Whether this run is the migration mode's (``run.source: migration``, or a re-drive of what it
        dead-lettered: ``run.source: dead_letters`` with a ``migration`` section)."""
        return self.run.source == RunSource.MIGRATION or (self.redriving and self.migration.configured)

    def with_overrides(self, overrides: Mapping[str, str], origin: str = "--set") -> "SyphonConfig":
        """A copy with dotted ``section.key`` overrides applied and validated."""
        raw = _to_raw(self)
        for dotted, text in overrides.items():
            _apply_override(raw, dotted, text, origin)
        return _build(raw, origin, resolve_secret=_SecretResolver(os.environ, None))


_SECTIONS: dict[str, type] = {
    "primary": PrimaryConfig,
    "secondary": NamespaceConfig,
    "backlog": BacklogConfig,
    "storage": StorageConfig,
    "run": RunConfig,
    "restore": RestoreConfig,
    "sink": SinkConfig,
    "redrive": RedriveConfig,
    "migration": MigrationConfig,
}


def load_config(path: str | os.PathLike | None = None, *, overrides: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None,
                secret_reader: Callable[[str, str], str] | None = None) -> SyphonConfig:
    """Load YAML (optional), then ``SYPHON__*`` variables, then ``overrides``; validate; resolve secrets.

    ``secret_reader(scope, key)`` reads ``{secret: scope/key}`` references; without one they are an
    error (``run.databricks_host.load_config`` passes Databricks' secret scopes where they exist).
    """
    environ = os.environ if environ is None else environ
    origin = str(path) if path else "configuration"
    raw: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections {sorted(_SECTIONS)}")
        for section, values in loaded.items():
            if section not in _SECTIONS:
                raise ConfigError(f"{path}: unknown section '{section}'; known sections: {', '.join(_SECTIONS)}")
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: section '{section}' must be a mapping of keys")
            raw[section].update(values)
    for name, text in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            parts = name[len(ENV_PREFIX):].lower().split("__")
            if len(parts) != 2:
                raise ConfigError(f"environment variable {name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
            _apply_override(raw, ".".join(parts), text, f"environment variable {name}", from_environment=True)
    for dotted, text in (overrides or {}).items():
        _apply_override(raw, dotted, text, "--set")
    resolver = _SecretResolver(environ, secret_reader)
    return _build(raw, origin, resolver)


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["run.trigger=10 seconds", ...]`` -> ``{"run.trigger": "10 seconds"}``."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects section.key=value, got '{pair.split('=')[0]}...'")
        result[key.strip()] = value
    return result


# --- internals ---------------------------------------------------------------------------------

def _apply_override(raw: dict, dotted: str, text: str, origin: str, *, from_environment: bool = False) -> None:
    section, _, key = dotted.partition(".")
    if section not in _SECTIONS or not key:
        raise ConfigError(f"{origin}: unknown key '{dotted}'; keys look like section.key with section one of "
                          f"{', '.join(_SECTIONS)}")
    known = [f.name for f in dataclasses.fields(_SECTIONS[section])]
    if key not in known:
        raise ConfigError(f"{origin}: unknown key '{dotted}'; known keys in '{section}': {', '.join(known)}")
    # Values arrive as text: read them as YAML scalars so "20" is an int and "true" a bool, but
    # keep secrets verbatim (a connection string is not YAML). "env:VAR" and "secret:scope/key"
    # are references (a connection string starts with "Endpoint=", so they cannot be one).
    value: Any = text
    if key == "credential" and text.strip() in set(CredentialKind):
        value = {"kind": text.strip()}  # --set primary.credential=managed_identity
    elif key in SECRET_KEYS:
        kind, sep, name = text.strip().partition(":")
        if sep and kind in ("env", "secret") and name and "=" not in name:
            value = {kind: name}
        elif from_environment:
            value = Secret(text, origin)  # the secret itself, from the environment
    else:
        try:
            value = yaml.safe_load(text) if text.strip() else text
        except yaml.YAMLError:
            value = text
    raw[section][key] = value


def _to_raw(config: SyphonConfig) -> dict:
    return {name: {f.name: getattr(getattr(config, name), f.name)
                   for f in dataclasses.fields(getattr(config, name))} for name in _SECTIONS}


class _SecretResolver:
    def __init__(self, environ: Mapping[str, str], secret_reader: Callable[[str, str], str] | None):
        self.environ = environ
        self.secret_reader = secret_reader

    def __call__(self, ref: Any, where: str) -> Secret:
        if isinstance(ref, Secret):
            return ref
        if isinstance(ref, str):
            return Secret(ref, f"literal value of {where}")
        if isinstance(ref, dict) and set(ref) == {"env"} and isinstance(ref["env"], str):
            name = ref["env"]
            if not self.environ.get(name):
                raise ConfigError(f"{where}: environment variable {name} is not set (or empty); export it, or "
                                  f"point {where} at another source")
            return Secret(self.environ[name], f"env {name}")
        if isinstance(ref, dict) and set(ref) == {"secret"} and isinstance(ref["secret"], str):
            scope, sep, key = ref["secret"].partition("/")
            if not sep or not scope or not key:
                raise ConfigError(f"{where}: secret references look like {{secret: <scope>/<key>}}")
            reader = self.secret_reader
            if reader is None:
                raise ConfigError(SECRET_SCOPES_NEED_DATABRICKS)
            try:
                return Secret(reader(scope, key), f"secret {scope}/{key}")
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - the reader's own errors may carry anything
                raise ConfigError(f"{where}: cannot read secret {scope}/{key} ({type(exc).__name__})") from None
        raise ConfigError(f"{where}: expected a secret reference {{env: VAR}} or {{secret: scope/key}}, got a "
                          f"{type(ref).__name__}")


def _build(raw: dict, origin: str, resolve_secret: Callable[[Any, str], Any]) -> SyphonConfig:
    sections = {}
    for name, cls in _SECTIONS.items():
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, value in raw[name].items():
            where = f"{name}.{key} in {origin}"
            if key not in known:
                raise ConfigError(f"{origin}: unknown key '{name}.{key}'; known keys in '{name}': "
                                  f"{', '.join(known)}")
            if key == "connection_string":
                values[key] = None if value is None else resolve_secret(value, where)
            elif key == "proxy_password":
                if isinstance(value, str):
                    raise ConfigError(f"{where}: a password is never written in the configuration or on the command "
                                      f"line: give {{env: VAR}} or {{secret: scope/key}}, or set {ENV_PREFIX}"
                                      f"{name.upper()}__PROXY_PASSWORD")
                values[key] = None if value is None else resolve_secret(value, where)
            elif key == "credential":
                values[key] = None if value is None else credential_config(value, f"{name}.credential", origin,
                                                                     resolve_secret)
            else:
                values[key] = check_type(value, known[key].type, where)
        sections[name] = cls(**values)
    validate_sections(origin, **sections)
    return SyphonConfig(**sections)
