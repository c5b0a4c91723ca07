"""The syphon's configuration: read once, validated, frozen (``from backlog_syphon.config import ...``).

- ``types``: the settings as typed, frozen records, one per section, and ``Secret``;
- ``loading``: the whole configuration (``SyphonConfig``) from YAML, ``SYPHON__*`` variables and
  ``--set`` overrides, secrets resolved;
- ``validation``: each value's type, then the sections together.

Names with a leading underscore are the package's own: its modules share them, callers do not.
"""

from backlog_syphon.config.loading import (
    ENV_PREFIX,
    SECRET_SCOPES_NEED_DATABRICKS,
    SyphonConfig,
    load_config,
    parse_overrides,
)
from backlog_syphon.config.types import (
    AVAILABLE_NOW,
    CREDENTIAL_FIELDS,
    BacklogConfig,
    ConfigError,
    CredentialConfig,
    MigrationConfig,
    NamespaceConfig,
    PrimaryConfig,
    RedriveConfig,
    RestoreConfig,
    RunConfig,
    Secret,
    SinkConfig,
    StorageConfig,
    trigger_options,
)

__all__ = [
    "ENV_PREFIX", "AVAILABLE_NOW", "SECRET_SCOPES_NEED_DATABRICKS", "CREDENTIAL_FIELDS", "ConfigError", "Secret",
    "CredentialConfig", "NamespaceConfig", "PrimaryConfig", "BacklogConfig", "StorageConfig", "RunConfig",
    "RedriveConfig", "MigrationConfig", "RestoreConfig", "SinkConfig", "SyphonConfig", "load_config", "parse_overrides",
    "trigger_options",
]
