"""The limits Service Bus enforces on configuration (lock duration 5 s to 5 min, duplicate detection window
20 s to 7 days, max delivery count >= 1), in the YAML and the official Config.json vocabularies, and the
namespace's service settings. Pure configuration: no broker runs."""
import pytest

from servicebus_emulator import ConfigError, Emulator, EmulatorConfig
from servicebus_emulator.service_settings import ServiceSettings, Tier


def _yaml(queue=None, **namespace):
    return {"namespaces": [{"name": "ns", **namespace, "queues": [{"name": "q", **(queue or {})}]}]}


def _json(**properties):
    return {"UserConfig": {"Namespaces": [{"Name": "ns", "Queues": [{"Name": "q", "Properties": properties}]}]}}


def _error(doc) -> str:
    with pytest.raises(ConfigError) as info:
        EmulatorConfig.from_dict(doc)
    return str(info.value)


def _queue(doc):
    return EmulatorConfig.from_dict(doc).namespaces[0].queues[0]


@pytest.mark.parametrize("seconds", [4.9, 300.5, 0])
def test_a_lock_duration_outside_5_seconds_to_5_minutes_names_the_key_the_range_and_the_way_out(seconds):
    assert _error(_yaml({"lock_duration_seconds": seconds})) == (
        f"namespaces[0].queues[0].lock_duration_seconds: must be 5 to 300 seconds (5 seconds to 5 minutes, as "
        f"Service Bus allows), got {seconds!r}; for shorter locks in tests set allow_short_locks: true on the "
        f"namespace")


def test_the_lock_duration_bounds_are_accepted_and_short_locks_only_when_the_namespace_asks():
    assert [_queue(_yaml({"lock_duration_seconds": s})).lock_duration_seconds for s in (5, 300)] == [5, 300]
    assert _queue(_yaml({"lock_duration_seconds": 0.5}, allow_short_locks=True)).lock_duration_seconds == 0.5
    assert _error(_yaml({"lock_duration_seconds": 301}, allow_short_locks=True)) == (
        "namespaces[0].queues[0].lock_duration_seconds: must be above 0 and at most 300 seconds (allow_short_locks "
        "is on), got 301")
    subscription = {"namespaces": [{"name": "ns", "topics": [{"name": "t", "subscriptions": [
        {"name": "s", "lock_duration_seconds": 2}]}]}]}
    assert _error(subscription).startswith("namespaces[0].topics[0].subscriptions[0].lock_duration_seconds: must be 5")


def test_a_queue_added_at_run_time_is_held_to_the_same_limits():
    with Emulator(EmulatorConfig.from_dict(_yaml(port=0))) as emu:
        with pytest.raises(ConfigError, match=r"^add_queue\(short\)\.lock_duration_seconds: must be 5 to 300"):
            emu.add_queue("ns", "short", lock_duration_seconds=1)
        with pytest.raises(ConfigError, match=r"^recreate_queue\(q\)\.duplicate_detection_window_seconds: must be 20"):
            emu.recreate_queue("ns", "q", duplicate_detection_window_seconds=5)


@pytest.mark.parametrize("seconds", [10, 19.9, 7 * 24 * 3600 + 1])
def test_a_duplicate_detection_window_outside_20_seconds_to_7_days_is_refused(seconds):
    assert _error(_yaml({"duplicate_detection_window_seconds": seconds})) == (
        f"namespaces[0].queues[0].duplicate_detection_window_seconds: must be 20 to 604800 seconds (20 seconds to 7 "
        f"days) while duplicate detection is on, or 0 for off, got {seconds!r}")
    topic = {"namespaces": [{"name": "ns", "topics": [{"name": "t", "duplicate_detection_window_seconds": seconds}]}]}
    assert _error(topic).startswith("namespaces[0].topics[0].duplicate_detection_window_seconds: must be 20")


def test_the_window_bounds_and_zero_for_off_are_accepted():
    windows = [_queue(_yaml({"duplicate_detection_window_seconds": s})).duplicate_detection_window_seconds
               for s in (0, 20, 7 * 24 * 3600)]
    assert windows == [0, 20, 604800]


def test_a_max_delivery_count_below_1_is_refused_in_both_vocabularies():
    assert _error(_yaml({"max_delivery_count": 0})) == (
        "namespaces[0].queues[0].max_delivery_count: must be in 1..2147483647")
    assert _error(_json(MaxDeliveryCount=0)) == (
        "UserConfig.Namespaces[0].Queues[0].Properties.MaxDeliveryCount: must be in 1..2147483647, got 0")


@pytest.mark.parametrize("text", ["PT4S", "PT5M1S", "PT1H"])
def test_config_json_lock_durations_are_held_to_the_same_range_under_their_json_path(text):
    assert _error(_json(LockDuration=text)) == (
        f"UserConfig.Namespaces[0].Queues[0].Properties.LockDuration: must be 5 to 300 seconds (5 seconds to 5 "
        f"minutes, as Service Bus allows), got {text!r}")


def test_config_json_windows_are_checked_only_where_duplicate_detection_is_on():
    assert _error(_json(RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="PT10S")) == (
        "UserConfig.Namespaces[0].Queues[0].Properties.DuplicateDetectionHistoryTimeWindow: must be 20 to 604800 "
        "seconds (20 seconds to 7 days) while duplicate detection is on, got 'PT10S'")
    assert _error(_json(RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="P8D")).endswith(
        "got 'P8D'")
    assert _queue(_json(RequiresDuplicateDetection=False, DuplicateDetectionHistoryTimeWindow="PT10S")) \
        .duplicate_detection_window_seconds == 0
    assert _queue(_json(LockDuration="PT5S", RequiresDuplicateDetection=True,
                        DuplicateDetectionHistoryTimeWindow="P7D")).duplicate_detection_window_seconds == 604800


def test_service_settings_default_to_a_standard_namespace_and_premium_raises_the_batch_count():
    (ns,) = EmulatorConfig.from_dict(_yaml()).namespaces
    assert ns.service == ServiceSettings()
    assert (ns.service.tier, ns.service.max_messages_per_batch, ns.service.peek_page_bytes) == (
        Tier.STANDARD, 4500, 256 * 1024)
    assert (ns.service.link_idle_timeout_seconds, ns.service.connection_idle_timeout_seconds,
            ns.service.new_connection_idle_timeout_seconds) == (600, 300, 60)
    assert (ns.service.peek_empty_page_probability, ns.service.allow_short_locks) == (0, False)
    assert ns.service.release_locks_on_link_loss is False  # a lost link's locks outlive it, as on the service
    premium = EmulatorConfig.from_dict(_yaml(tier="premium")).namespaces[0].service
    assert (premium.tier, premium.max_messages_per_batch) == (Tier.PREMIUM, 15000)
    assert EmulatorConfig.from_dict(_yaml(tier="premium", max_messages_per_batch=100)).namespaces[0] \
        .service.max_messages_per_batch == 100


@pytest.mark.parametrize("setting, message", [
    ({"tier": "gold"}, "namespaces[0].tier: must be one of basic, standard, premium, got 'gold'"),
    ({"max_messages_per_batch": 0}, "namespaces[0].max_messages_per_batch: must be at least 1, got 0"),
    ({"peek_page_bytes": "256KB"}, "namespaces[0].peek_page_bytes: expected an integer, got '256KB'"),
    ({"peek_empty_page_probability": 1.5}, "namespaces[0].peek_empty_page_probability: must be from 0 to 1, got 1.5"),
    ({"peek_seed": 1.5}, "namespaces[0].peek_seed: expected an integer, got 1.5"),
    ({"link_idle_timeout_seconds": 0},
     "namespaces[0].link_idle_timeout_seconds: must be a number of seconds above 0, got 0"),
    ({"connection_idle_timeout_seconds": True},
     "namespaces[0].connection_idle_timeout_seconds: expected a number, got True"),
    ({"allow_short_locks": "yes"}, "namespaces[0].allow_short_locks: expected true or false, got 'yes'"),
    ({"release_locks_on_link_loss": 1},
     "namespaces[0].release_locks_on_link_loss: expected true or false, got 1"),
])
def test_a_bad_service_setting_names_its_key_and_what_is_allowed(setting, message):
    assert _error(_yaml(**setting)) == message
