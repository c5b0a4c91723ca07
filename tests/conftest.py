"""Shared fixtures: one Spark session (with Delta) for the whole run."""

import itertools
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


# The suite runs on pytest-xdist workers (``make test``: ``--dist worksteal``). Worksteal hands each
# worker one contiguous share of the collection at the start, in order, and a worker that runs out
# steals the second half of the longest queue: the tail, so a share's front is run by its owner. The
# integration tests (most start Spark runs, some a job process) are therefore dealt to the shares'
# fronts so that each share holds about the same seconds of them (longest first, each to the share
# with the fewest so far), and the short tests fill the shares' tails, where idle workers steal them.
# Seconds as measured on the 2-core machine with three workers (``--durations=0``); a test not
# listed counts as a short in-process one. Only the order depends on them.
MEASURED_SECONDS = {
    # 120 batches, as CI's 2-core run of the whole suite measured it.
    "test_a_long_continuous_run_keeps_the_audits_files_bounded_and_records_every_message_once": 1019,
    "test_the_job_over_spark_connect_records_what_a_classic_run_records": 192,
    "test_status_runs_table_and_alerts_through_a_backlogs_life": 180,
    "test_timeout_during_a_send_stops_at_the_batch_boundary_and_a_missing_queue_is_skipped_with_one_warning": 164,
    "test_lease_under_starvation_never_lets_two_runs_deliver_at_once": 150,
    "test_dead_letters_are_redriven_with_every_property_filtered_and_never_twice": 143,
    "test_documented_walkthrough_from_setup_to_dry_run_and_replay": 138,
    "test_documented_spark_submit_line_drains_the_backlog": 135,
    "test_a_continuous_run_renews_minute_tokens_and_delivers_every_message_once": 137,
    "test_a_kill_in_the_middle_of_the_sends_loses_nothing_and_resends_at_most_that_batch": 133,
    # Four killed jobs and four reruns (one waiting out a 45 s lock), measured alone at a load of 25-33.
    "test_a_kill_at_each_step_of_the_last_batch_and_its_purge_leaves_nothing_for_the_run_after_it": 724,
    "test_two_runs_at_once_one_delivers_and_sigterm_ends_it_after_its_batch": 120,
    "test_a_redrive_killed_after_recording_is_finished_by_the_next_without_sending_anything_twice": 100,
    # Measured alone on the 2-core machine (one worker, other helpers' tests beside it): 67-167 s.
    "test_status_says_when_the_backlog_is_safe_to_remove_and_decommission_removes_only_drained_queues": 150,
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
    "test_a_continuous_job_idle_past_the_idle_timers_delivers_the_next_messages": 50,
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
}
UNLISTED_INTEGRATION_SECONDS = 8


INTEGRATION = Path(__file__).resolve().parent / "integration"


def unmeasured_entries(items) -> list[str]:
    """The names ``MEASURED_SECONDS`` lists that are no integration test of ``items``, where ``items`` holds
    every file of tests/integration (else []: a selection of the suite cannot tell)."""
    integration = [item for item in items if INTEGRATION in item.path.parents]
    if {item.path for item in integration} != set(INTEGRATION.glob("test_*.py")):
        return []
    return sorted(set(MEASURED_SECONDS) - {getattr(item, "originalname", item.name) for item in integration})


@pytest.hookimpl(tryfirst=True)  # the whole collection, before ``-k`` or ``-m`` deselect any of it
def pytest_collection_modifyitems(config, items):
    stale = unmeasured_entries(items)
    if stale:  # a renamed or removed test: its seconds would be scheduled for nothing, and the new name unseen
        raise pytest.UsageError(f"tests/conftest.py MEASURED_SECONDS names tests that do not exist: {stale}")

    def seconds(item) -> float:
        if "integration" not in item.path.parts:
            return 0
        return MEASURED_SECONDS.get(getattr(item, "originalname", item.name), UNLISTED_INTEGRATION_SECONDS)

    estimates = [seconds(item) for item in items]
    workers = getattr(config, "workerinput", {}).get("workercount", 1)  # set in each xdist worker
    items[:] = dealt_out(items, estimates, workers)


def dealt_out(items: list, seconds: list[float], workers: int) -> list:
    """``items`` reordered into the ``workers`` contiguous shares worksteal hands out (as it sizes them).
    The items with ``seconds`` go to the shares' fronts, longest first, each to the share with the
    fewest seconds so far; the others fill the shares in their order. Every worker must compute the
    same order, and does: it is pure (ties go to the first share, and sorting is stable)."""
    timed = sorted((index for index, value in enumerate(seconds) if value > 0), key=lambda index: -seconds[index])
    fronts: list[list] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for index in timed:
        share = loads.index(min(loads))
        fronts[share].append(items[index])
        loads[share] += seconds[index]
    rest = iter([item for item, value in zip(items, seconds) if value <= 0])
    ordered, remaining = [], len(items)
    for share in range(workers):
        size = remaining // (workers - share)
        ordered += fronts[share] + list(itertools.islice(rest, max(0, size - len(fronts[share]))))
        remaining -= size
    return ordered + list(rest)
