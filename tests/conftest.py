"""Shared fixtures: one Spark session (with Delta) for the whole run."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Spark's Python workers unpickle the syphon's functions and classes by module path: they must
# import this checkout's library (not another copy installed in the environment), like this process.
_LIB = str(Path(__file__).resolve().parents[1] / "lib")
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != _LIB:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_LIB, os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def spark():
    from backlog_syphon.run.spark_session import build_spark_session

    session = build_spark_session("backlog-syphon-tests", extra_conf={"spark.ui.enabled": "false"})
    yield session
    session.stop()


# The suite runs on pytest-xdist workers (``make test``: ``--dist loadgroup``) of two kinds. Each test that
# takes the ``spark`` fixture belongs to one of ``SPARK_LANES`` lanes, an ``xdist_group`` that one worker
# runs from start to end on its one Spark session: three such JVMs keep two cores busy (a fourth only
# slowed each test down). The other tests go one by one to the other workers, and to a lane's worker once
# its lane is nearly done: the end-to-end tests that only start jobs of their own (spark-submit, the
# walkthrough, killed and signalled jobs), first, then the emulator's and the pure unit tests, which mostly
# wait on sockets and timers. Both are dealt longest first, the lanes each test to the lane with the fewest
# seconds so far, by the seconds measured on the 2-core machine with the whole suite running
# (``--durations=0``); an integration test not listed counts as a short in-process one.
MEASURED_SECONDS = {
    "test_a_continuous_run_keeps_the_audits_files_bounded_and_records_every_message_once": 60,
    "test_the_audits_files_stay_bounded_and_a_replayed_append_adds_nothing_across_compactions": 15,
    "test_the_job_over_spark_connect_records_what_a_classic_run_records": 213,
    "test_status_runs_table_and_alerts_through_a_backlogs_life": 130,  # with the next, one test of 244 s
    "test_status_runs_table_alerts_and_dashboard_after_a_failed_run_and_a_poison_message": 120,
    "test_timeout_during_a_send_stops_at_the_batch_boundary_and_a_missing_queue_is_skipped_with_one_warning": 123,
    "test_lease_under_starvation_never_lets_two_runs_deliver_at_once": 119,
    "test_dead_letters_are_redriven_with_every_property_filtered_and_never_twice": 143,
    "test_documented_walkthrough_from_setup_to_dry_run_and_replay": 138,
    "test_documented_spark_submit_line_drains_the_backlog": 135,
    "test_a_continuous_run_renews_short_lived_tokens_and_delivers_every_message_once": 110,
    "test_a_kill_in_the_middle_of_the_sends_loses_nothing_and_resends_at_most_that_batch": 55,  # 51 s alone, load 10
    # Four killed jobs and four reruns (one waiting out a 35-40 s lock), measured alone at a load of 6-17: 306-371 s
    # (with 2,000 messages for mid_settle and a 45 s lock: 326 s at a load of 6-9, 724 s at 25-33).
    "test_a_kill_at_each_step_of_the_last_batch_and_its_purge_leaves_nothing_for_the_run_after_it": 62,  # each of 4
    "test_two_runs_at_once_one_delivers_and_sigterm_ends_it_after_its_batch": 120,
    "test_a_redrive_killed_after_recording_is_finished_by_the_next_without_sending_anything_twice": 100,
    # Measured alone on the 2-core machine (one worker, other helpers' tests beside it): 67-167 s.
    "test_status_says_when_the_backlog_is_safe_to_remove_and_decommission_removes_only_drained_queues": 104,
    "test_recreated_backlog_queues_are_drained_from_their_start": 82,
    "test_websockets_through_a_proxy_with_azure_ad_drain_sessions_partitions_and_poison_then_redrive": 105,
    "test_tls_with_keys_drains_a_backlog_with_sessions_on_the_tls_port_only": 25,
    "test_a_deleted_streaming_checkpoint_restarts_with_a_new_identity": 77,
    "test_a_renamed_destination_gets_its_old_names_messages_and_a_skipped_one_waits_for_a_later_run": 57,
    "test_many_small_batches_never_raise_a_delivery_count": 56,
    "test_a_lost_send_task_is_run_again_and_resends_only_what_its_first_attempt_sent": 55,
    "test_notebook_replays_with_progress_summary_report_and_charts": 51,
    "test_a_lease_held_elsewhere_stops_a_run_or_makes_it_wait_until_it_expires": 48,
    "test_a_five_second_lock_300_ms_away_drains_poison_and_all_in_one_run": 45,
    "test_one_run_drains_every_queue_whatever_its_probes_and_pages_answer": 45,
    "test_server_busy_slows_the_drain_loses_nothing_and_the_rate_recovers": 43,
    "test_primary_outage_waits_then_delivers_exactly_once": 41,
    "test_a_destination_unavailable_past_the_wait_fails_the_batch_and_the_replay_resends_nothing": 38,
    "test_the_rate_cap_holds_over_every_5_second_window": 37,
    "test_an_available_now_run_played_without_read_limits_stays_in_bounded_batches": 35,
    "test_continuous_trigger_delivers_new_messages_promptly": 34,
    "test_failed_purge_receives_and_settlements_are_retried_and_resend_nothing": 34,
    "test_fidelity_of_every_field_and_property": 29,
    "test_a_full_or_disabled_destination_waits_without_holding_others": 27,
    "test_an_empty_or_short_peek_page_mid_window_loses_nothing": 21,
    "test_the_wheel_installs_without_a_compiler_and_the_job_imports": 20,
    "test_json_logs_carry_the_ids_and_the_status_command_exits_with_its_verdict": 15,
    "test_poison_messages_are_dead_lettered_with_reasons_audited_and_no_secret_shows": 19,
    "test_every_body_kind_and_value_arrives_as_the_legacy_sender_wrote_it": 18,
    "test_remaining_ttl_and_schedule": 17,
    "test_order_per_backlog_queue_and_per_session": 16,
    "test_tables_are_created_by_their_first_write_with_stable_schemas": 15,
    "test_notebook_stops_after_the_dry_run_by_default": 9,
    "test_a_continuous_job_whose_links_are_refreshed_before_the_timer_delivers_the_next_and_logs_no_error": 50,
    "test_a_continuous_run_whose_idle_links_the_broker_closed_delivers_the_next_messages": 30,
    "test_session_less_messages_for_a_session_queue_are_dead_lettered_by_the_refusal_not_waited_out": 45,
    "test_where_the_administration_api_describes_the_destination_they_are_dead_lettered_before_sending": 40,
    "test_partitioned_destinations_described_by_the_administration_api_get_their_shape_up_front": 45,
    "test_a_destination_whose_administration_api_does_not_answer_learns_its_shape_from_the_first_refusal": 45,
    # Partitioned backlog queues, measured beside two soaks (load 8-12); the first is two cases.
    "test_a_partitioned_backlog_is_delivered_once_in_order_per_partition_and_purged": 34,
    "test_a_kill_mid_send_on_a_partitioned_backlog_loses_nothing_and_resends_at_most_that_batch": 59,
    "test_a_queue_recreated_partitioned_is_a_new_incarnation_drained_from_its_start": 40,
    "test_a_partitioned_queues_dead_letters_are_redriven_once_in_order_per_partition": 35,
    "test_a_partitioned_queue_holding_partition_0s_messages_only_is_read_and_purged_as_partitioned": 16,
    # The migration mode, measured alone on the 2-core machine (other helpers' tests beside it).
    "test_a_standard_namespace_drains_into_premium_once_exact_in_order_with_its_states": 110,
    "test_a_migration_killed_after_recording_is_finished_by_the_next_run_without_sending_anything_twice": 105,
    # Namespaces under load (credits, server-busy), measured at load 8-10; the second is two runs.
    "test_throttled_namespaces_slow_the_drain_and_lose_or_repeat_nothing": 92,
    "test_a_partitioned_backlog_drains_under_short_receives_answers_from_other_partitions_and_either_disposition": 68,
}
UNLISTED_INTEGRATION_SECONDS = 8
UNLISTED_SPARK_SECONDS = 1  # a unit test that takes the ``spark`` fixture
SPARK_LANES = 3


INTEGRATION = Path(__file__).resolve().parent / "integration"


def unmeasured_entries(items) -> list[str]:
    """The names ``MEASURED_SECONDS`` lists that are no integration test of ``items``, where ``items`` holds
    every file of tests/integration (else []: a selection of the suite cannot tell)."""
    integration = [item for item in items if INTEGRATION in item.path.parents]
    if {item.path for item in integration} != set(INTEGRATION.glob("test_*.py")):
        return []
    return sorted(set(MEASURED_SECONDS) - {getattr(item, "originalname", item.name) for item in integration})


def needs_spark(item) -> bool:
    return "spark" in getattr(item, "fixturenames", ())


def seconds(item) -> float:
    """What a test is expected to take: measured (integration), about a second (a unit test on Spark), or
    nothing worth scheduling by."""
    if INTEGRATION in item.path.parents:
        return MEASURED_SECONDS.get(getattr(item, "originalname", item.name), UNLISTED_INTEGRATION_SECONDS)
    return UNLISTED_SPARK_SECONDS if needs_spark(item) else 0


@pytest.hookimpl(tryfirst=True)  # the whole collection, before ``-k`` or ``-m`` deselect any of it, and before
# xdist names each test's group in its id
def pytest_collection_modifyitems(config, items):
    stale = unmeasured_entries(items)
    if stale:  # a renamed or removed test: its seconds would be scheduled for nothing, and the new name unseen
        raise pytest.UsageError(f"tests/conftest.py MEASURED_SECONDS names tests that do not exist: {stale}")
    if not getattr(config.option, "loadgroup", False):  # set in each worker of ``--dist loadgroup``
        return
    expected = {id(item): seconds(item) for item in items}
    dealt = lanes([expected[id(item)] if needs_spark(item) else 0 for item in items], SPARK_LANES)
    for item, lane in zip(items, dealt):
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(f"spark-lane-{lane}"))
    # Longest first, within a lane (it runs in the collection's order) and among the others.
    items.sort(key=lambda item: -expected[id(item)])


def lanes(seconds: list[float], count: int) -> list[int | None]:
    """The lane of each test with ``seconds`` (longest first, each to the lane with the fewest seconds so far;
    ties to the first lane), None for the tests without. Every worker must compute the same lanes, and does:
    it is pure (sorting is stable)."""
    dealt: list[int | None] = [None] * len(seconds)
    loads = [0.0] * count
    for index in sorted((i for i, value in enumerate(seconds) if value > 0), key=lambda i: -seconds[i]):
        lane = loads.index(min(loads))
        dealt[index] = lane
        loads[lane] += seconds[index]
    return dealt
