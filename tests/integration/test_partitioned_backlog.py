"""Partitioned backlog queues drained right (design invariant 13), against the emulator's partitioned
entities over real AMQP with the unmodified SDK: sequence numbers ``partition << 48 | n``, a peek that
answers from one partition per call (and, with the setting on, one message per call, as reported for the
real service), receives that interleave partitions.

Each test checks that every message arrived exactly once (MessageIds counted at destinations without
duplicate detection), in order per backlog partition (arrival order at each destination, against the
sequence numbers the audit recorded), that the audit holds one final outcome per message, and that the
backlog queue is empty after the purge.
"""

from __future__ import annotations

import collections

import pytest

from backlog_syphon.partitions import partition_of
from backlog_syphon.restore.queue_names import backlog_queue_name
from tools.backlog_writer import OriginalMessage, legacy_backlog_bytes, send_legacy_backlog

from .conftest import PRIMARY, ROOT, SECONDARY, make_config
from .helpers import drain_destinations

# No duplicate detection, so every arrival counts; one plain and one partitioned (16 partitions, batches of one
# partition key only): partitioned entities at both ends.
DESTINATIONS = ("payments", "partitioned-orders")
# The kill test's: partitioned both, one deduplicating (a re-send is dropped there and counted as such).
KILL_DESTINATIONS = ("partitioned-dedupe-orders", "partitioned-orders")
FINAL_OUTCOMES = {"delivered", "dead_lettered", "skipped_ping"}
QUEUE = backlog_queue_name(PRIMARY, 0)


def _originals(tag: str, count: int, **fields) -> list[OriginalMessage]:
    return [OriginalMessage(DESTINATIONS[index % 2], f"{tag} body {index}".encode(), message_id=f"{tag}-{index:05d}",
                            **fields) for index in range(count)]


def _secondary_emulator(**settings):
    """The usual namespaces, the secondary's service ``settings`` set (``docs/emulator.md``)."""
    import yaml
    from servicebus_emulator import Emulator, EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator.yaml").read_text())
    for namespace in raw["namespaces"]:
        if namespace["name"] == SECONDARY:
            namespace.update(settings)
    return Emulator(EmulatorConfig.from_dict(raw), ports={PRIMARY: 0, SECONDARY: 0})


@pytest.fixture
def one_per_peek_emulator():
    """The usual namespaces, the secondary's peeks of partitioned entities answering one message per call."""
    with _secondary_emulator(peek_one_per_call=True) as emu:
        yield emu


def _partitioned(emulator) -> None:
    """Backlog queue 0, created again partitioned (16 partitions, as on Standard)."""
    emulator.recreate_queue(SECONDARY, QUEUE, enable_partitioning=True)


def _write_singles(config, originals) -> None:
    """The legacy client's backlog copies, one transfer each: a partitioned entity takes a batch into one
    partition whole, and keyless single messages go round the partitions."""
    from backlog_syphon.model.sending import Outgoing
    from backlog_syphon.servicebus.clients import open_client
    from backlog_syphon.servicebus.sdk_internals import prompt
    from backlog_syphon.servicebus.send import send_encoded

    with open_client(config.secondary, role="secondary") as client, prompt(client.get_queue_sender(QUEUE)) as sender:
        for original in originals:
            for _ in send_encoded(sender, [Outgoing(legacy_backlog_bytes(original), original.message_id, None,
                                                    original.partition_key)]):
                pass


def _left(emulator) -> int:
    return emulator.stats(SECONDARY)[QUEUE]["total"]


def _check(spark, config, emulator, originals, earlier=()) -> dict[str, int]:
    """``originals`` arrived exactly once, in order per backlog partition, and the audit holds one final row for
    each of them and of the ``earlier`` ones (delivered by an earlier run); message id -> sequence number."""
    from backlog_syphon.storage import delta

    arrived = drain_destinations(emulator, DESTINATIONS)
    counts = collections.Counter((destination, m.message_id) for destination, ms in arrived.items() for m in ms)
    assert counts == {(m.destination, m.message_id): 1 for m in originals}
    final = [row for row in delta.read_table(spark, config.storage.audit_table).collect()
             if row["outcome"] in FINAL_OUTCOMES]
    assert collections.Counter(row["message_id"] for row in final) == {m.message_id: 1
                                                                       for m in [*earlier, *originals]}
    assert {row["outcome"] for row in final} == {"delivered"}
    wanted = {m.message_id for m in originals}
    sequence = {row["message_id"]: row["sequence_number"] for row in final
                if row["backlog_queue"] == QUEUE and row["message_id"] in wanted}
    for destination, messages in arrived.items():
        if destination == "partitioned-orders":
            continue  # keyless messages: a partitioned entity keeps order per partition key or session only
        lanes: dict[int, list[int]] = collections.defaultdict(list)
        for message in messages:
            seq = sequence[message.message_id]
            lanes[partition_of(seq)].append(seq)
        for partition, seqs in lanes.items():
            assert seqs == sorted(seqs), f"{destination}: partition {partition} out of order"
    return sequence


@pytest.mark.timeout(600)
@pytest.mark.parametrize("one_per_peek", [True, False], ids=["one-message-per-peek", "whole-pages"])
def test_a_partitioned_backlog_is_delivered_once_in_order_per_partition_and_purged(spark, request, tmp_path,
                                                                                  one_per_peek):
    from backlog_syphon.run.runs import summary_end
    from backlog_syphon.run.syphon import run_syphon

    emulator = request.getfixturevalue("one_per_peek_emulator" if one_per_peek else "emulator")
    _partitioned(emulator)
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 1, "run.max_messages_per_trigger": 100})
    originals = _originals("part", 320)
    _write_singles(config, originals)
    summary = run_syphon(spark, config)
    end = summary_end(summary, config.run.trigger)
    assert (end.exit_code, summary.drained) == (0, True), end.line
    sequence = _check(spark, config, emulator, originals)
    assert len({partition_of(seq) for seq in sequence.values()}) == 16  # spread over every partition
    assert _left(emulator) == 0


@pytest.mark.timeout(600)
def test_a_partitioned_queue_holding_partition_0s_messages_only_is_read_and_purged_as_partitioned(spark, tmp_path):
    """Partition 0's sequence numbers carry no partition bits: such a queue looks like a plain one, and only the
    administration API (read at the run's start) says that its receives interleave partitions and come back
    empty while messages wait (here one receive in five). Every message is delivered once and nothing is left
    in the backlog. (That the purge's plans then expect interleaved receives is shown with fakes:
    ``tests/unit/test_micro_batch.py``; a plan that does not expect them ends its round at an empty receive,
    and the next round goes on, so this run drains either way, only in more rounds.)"""
    from backlog_syphon.run.syphon import run_syphon

    with _secondary_emulator(peek_one_per_call=True, receive_empty_probability=0.2, receive_seed=7) as emulator:
        _partitioned(emulator)
        config = make_config(emulator, tmp_path, **{"backlog.queue_count": 1, "run.max_messages_per_trigger": 50})
        originals = _originals("one", 120, partition_key="one-key-15")  # one partition key: partition 0
        send_legacy_backlog(config.secondary, {QUEUE: originals})
        summary = run_syphon(spark, config)
        assert summary.drained, summary.remaining
        sequence = _check(spark, config, emulator, originals)
        assert {partition_of(seq) for seq in sequence.values()} == {0}
        assert _left(emulator) == 0


@pytest.mark.timeout(120)
def test_a_partitioned_purge_verifies_partition_by_partition_and_reaches_a_recorded_message_behind_the_others(
        one_per_peek_emulator, tmp_path):
    """160 messages over the 16 partitions (10 each), peeks answering one message per call; recorded (to be
    verified, as after a failed round): partition 0's first message and partition 15's. The verification peeks
    the two partitions' ranges only (a walk from the first to the last would page through the 140 messages of
    partitions 1-14 one by one); the receives take each partition's next message in turn, and the round reaches
    partition 15's message behind the released heads of partitions 1-14 (a receive that asked for the one
    recorded message left would bring partitions 1, 2, 3 ... one a call, and end on the idle bound first)."""
    from backlog_syphon.model import RecordedSpan
    from backlog_syphon.partitions import absolute
    from backlog_syphon.servicebus.clients import pooled_receiver
    from backlog_syphon.servicebus.peek import peek_identities
    from backlog_syphon.servicebus.purge import purge_backlog
    from backlog_syphon.purge.plan import PurgePlan

    emulator = one_per_peek_emulator
    _partitioned(emulator)
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 1})
    _write_singles(config, _originals("verify", 160))
    heads = {}
    with pooled_receiver(config.secondary, QUEUE) as receiver:
        for partition in (0, 15):
            [(seq, enqueued_ms)] = peek_identities(receiver, absolute(partition, 1), absolute(partition, 1))
            heads[partition] = RecordedSpan(QUEUE, seq, seq, enqueued_ms, enqueued_ms, 1)
    peeks_before = emulator.stats(SECONDARY)[QUEUE]["ops"].get("peek", 0)

    result = purge_backlog(config.secondary, PurgePlan(QUEUE, (heads[0], heads[15]), 2, verify=True, partitioned=True))
    peeks = emulator.stats(SECONDARY)[QUEUE]["ops"].get("peek", 0) - peeks_before
    print(f"\n[partitioned purge] {peeks} peeks, completed {result.completed}, released {result.released}")
    assert (result.completed, result.remaining, set(result.settled)) == (2, (), {heads[0], heads[15]})
    assert peeks <= 12  # each partition's message and the look past it, twice at most, and the closing looks
    assert _left(emulator) == 158


@pytest.mark.timeout(600)
def test_a_queue_recreated_partitioned_is_a_new_incarnation_drained_from_its_start(spark, emulator, tmp_path):
    from backlog_syphon.run.syphon import run_syphon
    from backlog_syphon.storage import checkpoint_table

    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 1, "run.max_messages_per_trigger": 60})
    first = _originals("plain", 40)
    send_legacy_backlog(config.secondary, {QUEUE: first})
    assert run_syphon(spark, config).drained
    _check(spark, config, emulator, first)

    _partitioned(emulator)  # an operator deleted it and created it again, partitioned
    second = _originals("parted", 200)
    _write_singles(config, second)
    summary = run_syphon(spark, config)
    assert summary.drained, summary.remaining
    sequence = _check(spark, config, emulator, second, earlier=first)
    assert len({partition_of(sequence[m.message_id]) for m in second}) > 1
    checkpoint = checkpoint_table.read_checkpoint(spark, config.storage.checkpoint_table)
    assert checkpoint[QUEUE].incarnation == 2
    assert _left(emulator) == 0


@pytest.mark.timeout(900)
def test_a_partitioned_queues_dead_letters_are_redriven_once_in_order_per_partition(spark, one_per_peek_emulator,
                                                                                     tmp_path):
    """Messages for a destination that does not exist yet are dead-lettered into the partitioned queue's
    dead-letter sub-queue (their sequence numbers keep their partitions); once it exists, a re-drive delivers
    each once, partition by partition in order, and the purge empties the sub-queue."""
    from backlog_syphon.run.syphon import run_syphon

    emulator = one_per_peek_emulator
    _partitioned(emulator)
    later = "created-later"
    config = make_config(emulator, tmp_path, **{"backlog.queue_count": 1, "run.max_messages_per_trigger": 40})
    parked = [OriginalMessage(later, f"parked {n}".encode(), message_id=f"parked-{n:04d}") for n in range(64)]
    _write_singles(config, parked)
    assert run_syphon(spark, config).drained
    stats = emulator.stats(SECONDARY)[QUEUE]
    assert (stats["total"], stats.get("dead_letter_count")) == (0, 64)

    emulator.add_queue(PRIMARY, later)
    redrive = make_config(emulator, tmp_path, **{"backlog.queue_count": 1, "run.source": "dead_letters",
                                                 "run.max_messages_per_trigger": 40})
    summary = run_syphon(spark, redrive)
    assert summary.per_destination[later]["delivered"] == 64
    arrived = drain_destinations(emulator, (later,))[later]
    assert collections.Counter(m.message_id for m in arrived) == {m.message_id: 1 for m in parked}
    from backlog_syphon.storage import delta

    dead_letters = f"{QUEUE}/$DeadLetterQueue"
    sequence = {row["message_id"]: row["sequence_number"] for row in
                delta.read_table(spark, config.storage.audit_table).collect()
                if row["backlog_queue"] == dead_letters and row["outcome"] == "delivered"}
    assert len({partition_of(seq) for seq in sequence.values()}) == 16
    lanes: dict[int, list[int]] = collections.defaultdict(list)
    for message in arrived:
        lanes[partition_of(sequence[message.message_id])].append(sequence[message.message_id])
    assert all(seqs == sorted(seqs) for seqs in lanes.values())
    assert emulator.stats(SECONDARY)[QUEUE].get("dead_letter_count") == 0


@pytest.mark.timeout(900)
def test_a_kill_mid_send_on_a_partitioned_backlog_loses_nothing_and_resends_at_most_that_batch(emulator, tmp_path,
                                                                                               spark):
    """SIGKILL the job (its own process tree) while a send task of its first batch is sending, into partitioned
    destinations (one deduplicating, where the single messages go several in flight); the rerun on the
    same streaming checkpoint and tables replays that batch's windows, partition by partition, and drains.
    Re-sends are the documented window only: at most the killed batch, each the same message."""
    from backlog_syphon.config import load_config
    from backlog_syphon.run.syphon import run_syphon

    from .helpers import job_command, job_env, kill_when_parked, tail
    from .test_crash_replay import Destinations, Run, _stream_log

    _partitioned(emulator)
    config = load_config(ROOT / "conf/local.yaml", environ=job_env(emulator), overrides={})
    originals = [OriginalMessage(KILL_DESTINATIONS[n % 2], f"crash body {n}".encode(), message_id=f"pkill-{n:04d}",
                                 application_properties={"index": n}) for n in range(150)]
    _write_singles(config, originals)
    destinations = Destinations(emulator, originals, KILL_DESTINATIONS)
    log, marker = tmp_path / "killed.log", tmp_path / "fault-marker"
    why = kill_when_parked(job_command(tmp_path, run__max_messages_per_trigger=100), job_env(emulator), "mid_send",
                           marker, log, 300, settle_seconds=0.5)
    assert not why, f"{why}:\n{tail(log)}"
    planned, committed = _stream_log(tmp_path / "checkpoint-stream")
    assert planned - committed == {0}
    killed = Run("mid_send", 0.0, killed_batch_id=0)
    destinations.account(killed)

    summary = run_syphon(spark, load_config(ROOT / "conf/local.yaml", environ=job_env(emulator), overrides={
        "storage.audit_table": str(tmp_path / "audit"), "storage.checkpoint_table": str(tmp_path / "checkpoint"),
        "storage.checkpoint_location": str(tmp_path / "checkpoint-stream"), "run.max_messages_per_trigger": "100"}))
    assert summary.drained, summary.remaining
    rerun = Run(None, 0.0)
    destinations.account(rerun)
    assert set(destinations.arrived) == {m.message_id for m in originals}  # nothing lost
    audit = [row.asDict() for row in spark.read.format("delta").load(str(tmp_path / "audit")).collect()]
    assert collections.Counter(row["outcome"] for row in audit) == {"delivered": 150}
    assert len({row["message_id"] for row in audit}) == 150
    killed_batch = sum(1 for row in audit if row["batch_id"] == 0)
    assert killed.sent >= 1 and 1 <= rerun.resent <= killed_batch
    assert len({partition_of(row["sequence_number"]) for row in audit}) == 16
    assert _left(emulator) == 0


@pytest.mark.timeout(600)
def test_a_partitioned_backlog_drains_under_short_receives_answers_from_other_partitions_and_either_disposition(
        spark, tmp_path):
    """A secondary as strict as a real one under load: receives that bring a part of what they ask (the default),
    settlements refused whole when their lock tokens span partitions (the default: the purge sends one request
    per partition), peeks answered from another partition one time in ten, and a few bulk settlements that
    find one of their locks lost, which the namespace answers 410 after settling the live tokens (``partial``)
    or none of them (``atomic``). Either way every message arrives once, in order per partition, and the
    backlog is left empty."""
    from backlog_syphon.run.runs import summary_end
    from backlog_syphon.run.syphon import run_syphon

    for mode in ("partial", "atomic"):
        with _secondary_emulator(multi_token_disposition=mode, peek_other_partition_probability=0.1,
                                 peek_seed=3) as emulator:
            _partitioned(emulator)
            config = make_config(emulator, tmp_path / mode, **{"backlog.queue_count": 1,
                                                               "run.max_messages_per_trigger": 100})
            originals = _originals(mode, 160)
            _write_singles(config, originals)
            emulator.inject_fault(SECONDARY, "lose_lock", entity=QUEUE, count=3)
            summary = run_syphon(spark, config)
            end = summary_end(summary, config.run.trigger)
            assert (end.exit_code, summary.drained) == (0, True), (mode, end.line)
            sequence = _check(spark, config, emulator, originals)
            assert len({partition_of(seq) for seq in sequence.values()}) == 16
            assert emulator.faults_pending(SECONDARY, "lose_lock") == 0, mode  # every lost lock was met
            assert _left(emulator) == 0, mode
