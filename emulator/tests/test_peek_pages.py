"""Peek answers as a real namespace gives them, through the real SDK: at most 250 messages, a byte budget
per answer (``peek_page_bytes``, 256 KB by default), and, when a namespace asks for them, empty answers
drawn from a seed while messages exist. Every answer is the first messages from the sequence number asked,
in order. Each test has a namespace of its own: a worker of the suite may run any one of them alone."""
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from servicebus_emulator import Emulator, EmulatorConfig


def _namespace(name, **settings):
    return {"name": name, "port": 0, "queues": [{"name": "q"}], **settings}


FLAKY = _namespace("flaky", peek_empty_page_probability=0.5, peek_seed=7)
CONFIG = {"namespaces": [
    *(_namespace(name) for name in ("count-cap", "default-budget", "never-empty")),
    *(_namespace(name, peek_page_bytes=10_000) for name in ("budget", "over-budget")),
    FLAKY,
]}
MAX_ANSWERS = 100  # a walk that never gets past a position fails instead of asking forever


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig.from_dict(CONFIG)) as emulator:
        yield emulator


def _fill(emu, namespace, count, size):
    with ServiceBusClient.from_connection_string(emu.connection_string(namespace)) as client:
        with client.get_queue_sender("q") as sender:
            for start in range(0, count, 100):
                sender.send_messages([ServiceBusMessage(b"%06d" % n + b"x" * (size - 6))
                                      for n in range(start, min(count, start + 100))])


def _pages(emu, namespace, *, asked, until, start=1):
    """Every answer of a walk from ``start`` that reads on from the last message each answer held."""
    pages, position = [], start
    with ServiceBusClient.from_connection_string(emu.connection_string(namespace), retry_total=0) as client:
        with client.get_queue_receiver("q") as receiver:
            while position <= until:
                assert len(pages) < MAX_ANSWERS, f"no messages from {position} on: {pages[-5:]}"
                page = receiver.peek_messages(max_message_count=asked, sequence_number=position)
                pages.append([m.sequence_number for m in page])
                if page:
                    position = page[-1].sequence_number + 1
    return pages


def test_an_answer_holds_at_most_250_messages_whatever_is_asked(emu):
    _fill(emu, "count-cap", 300, 100)
    pages = _pages(emu, "count-cap", asked=1000, until=300)
    assert pages == [list(range(1, 251)), list(range(251, 301))]
    assert emu.stats("count-cap")["q"]["peeked"] == 300


def test_the_byte_budget_cuts_an_answer_after_its_first_messages(emu):
    _fill(emu, "budget", 60, 1000)             # about 1.2 KB each as peeked: 8 in a 10,000-byte answer
    pages = _pages(emu, "budget", asked=250, until=60)
    assert [len(p) for p in pages] == [8] * 7 + [4]
    assert [seq for page in pages for seq in page] == list(range(1, 61))


def test_a_message_above_the_budget_comes_alone(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string("over-budget")) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage(b"y" * 50_000), ServiceBusMessage(b"z")])
        with client.get_queue_receiver("q") as receiver:
            first = receiver.peek_messages(max_message_count=10, sequence_number=1)
            assert [(m.sequence_number, len(b"".join(m.body))) for m in first] == [(1, 50_000)]
            assert [m.sequence_number for m in receiver.peek_messages(max_message_count=10, sequence_number=2)] == [2]


def test_the_default_budget_of_256_kb_returns_fewer_than_250_messages_of_2_kb(emu):
    _fill(emu, "default-budget", 250, 2048)
    pages = _pages(emu, "default-budget", asked=250, until=250)
    assert [len(p) for p in pages] == [115, 115, 20]         # about 2.2 KB each as peeked
    assert [seq for page in pages for seq in page] == list(range(1, 251))


def test_empty_answers_while_messages_exist_are_drawn_from_the_seed(emu):
    _fill(emu, "flaky", 40, 100)
    first = _pages(emu, "flaky", asked=10, until=40)
    again = Emulator(EmulatorConfig.from_dict({"namespaces": [FLAKY]}))
    with again:
        _fill(again, "flaky", 40, 100)
        second = _pages(again, "flaky", asked=10, until=40)
    assert first == second                                       # the same seed: the same answers
    full = iter([list(range(n, n + 10)) for n in (1, 11, 21, 31)])
    # seed 7 at one half: nine of the fourteen answers come back empty, the others whole and in order
    assert first == [[], [], next(full), [], next(full), [], [], next(full), [], [], [], [], [], next(full)]
    assert emu.stats("flaky")["q"]["total"] == 40               # an empty answer changes nothing


def test_a_namespace_without_the_setting_never_answers_empty_while_messages_exist(emu):
    _fill(emu, "never-empty", 20, 100)
    pages = _pages(emu, "never-empty", asked=5, until=20)
    assert pages == [list(range(n, n + 5)) for n in (1, 6, 11, 16)]
