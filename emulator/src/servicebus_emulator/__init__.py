"""A local Azure Service Bus emulator (AMQP 1.0 on python-qpid-proton) for the azure-servicebus SDK.

    from servicebus_emulator import Emulator, load_config
    with Emulator(load_config("emulator.yaml"), ports={"contoso": 0}, latency_ms=5) as emu:
        conn_str = emu.connection_string("contoso")

``load_config`` also reads the official emulator's ``Config.json``. The distribution's README.md
(``emulator/README.md`` in the backlog syphon's repository) and the pages it links (``emulator/docs/``)
describe configuration, behaviour and limits.
"""
from .config import EmulatorConfig
from .config_error import ConfigError
from .loader import load_config
from .emulator import Emulator
from .entity_status import EntityStatus

__all__ = ["ConfigError", "Emulator", "EmulatorConfig", "EntityStatus", "load_config"]
