"""Fixtures: one in-process emulator per test module (ephemeral ports), fresh entities per test."""
import uuid

import pytest
from azure.servicebus import ServiceBusClient

from servicebus_emulator import Emulator, EmulatorConfig

KEY_NAME, KEY = "RootManageSharedAccessKey", "local-emulator-key"

CONFIG = {
    "namespaces": [
        {
            "name": "contoso",
            "port": 0,
            "sas_keys": {KEY_NAME: KEY},
            "allow_short_locks": True,      # lock expiry and renewal tests use 1-2 second locks
            "expiry_sweep_seconds": 3600,   # expired messages stay until a receive meets them (no sweep mid-test)
            "queues": [
                {"name": "orders", "lock_duration_seconds": 30},
                {"name": "small", "max_message_size_kb": 64},
                {"name": "sessions-orders", "requires_session": True, "lock_duration_seconds": 30},
            ],
            "topics": [
                {
                    "name": "events",
                    "subscriptions": [
                        {"name": "all"},
                        {"name": "eu", "correlation_filter": {"properties": {"region": "eu"}}},
                        {"name": "alerts", "correlation_filter": {"subject": "alert"}},
                    ],
                }
            ],
        },
        {
            "name": "contoso-secondary",
            "port": 0,
            "sas_keys": {KEY_NAME: KEY},
            "queues": [{"name": "contoso/x-servicebus-transfer/0", "max_delivery_count": 2147483647,
                        "dead_lettering_on_message_expiration": True}],
        },
    ]
}


@pytest.fixture(scope="module")
def emulator():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emu:
        yield emu


@pytest.fixture(scope="module")
def conn_str(emulator):
    return emulator.connection_string("contoso")


@pytest.fixture(scope="module")
def client(conn_str):
    # retry_total=0: errors surface at once instead of after the SDK's backoff
    with ServiceBusClient.from_connection_string(conn_str, retry_total=0) as c:
        yield c


@pytest.fixture
def new_queue(emulator):
    """Factory: a fresh queue in `contoso` with the given settings; returns its name."""
    def make(**settings):
        name = f"q-{uuid.uuid4().hex[:8]}"
        emulator.add_queue("contoso", name, **settings)
        return name
    return make


@pytest.fixture
def queue(new_queue):
    return new_queue(lock_duration_seconds=30)
