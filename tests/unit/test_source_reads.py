"""The source's reads around the peeks (``source.data_source``): a message nothing can place stops the read
(``placed``), and a window's next page is produced ahead of its consumer, in order, errors where their item
would have been, the producer stopped when the consumer stops (``read_ahead``)."""

from __future__ import annotations

import threading
import time

import pytest

from backlog_syphon.restore.amqp.decoding import AmqpDecodeError
from backlog_syphon.restore.amqp.values import Symbol
from backlog_syphon.restore.backlog_rows import peeked_message
from backlog_syphon.source.window_reader import placed, read_ahead
from tests.unit.test_backlog_rows import QUEUE, message


def test_a_message_without_its_place_or_with_a_broken_one_cannot_be_placed():
    assert peeked_message(QUEUE, message(annotations={})).sequence_number is None
    with pytest.raises(RuntimeError, match="after sequence number 6 cannot be placed .*no x-opt-sequence-number"):
        placed(QUEUE, message(annotations={}), 7)
    with pytest.raises(AmqpDecodeError, match="x-opt-sequence-number is not an integer"):
        peeked_message(QUEUE, message(annotations={Symbol("x-opt-sequence-number"): "41"}))
    with pytest.raises(RuntimeError, match="cannot be placed .*x-opt-sequence-number is not an integer"):
        placed(QUEUE, message(annotations={Symbol("x-opt-sequence-number"): "41"}), 7)
    assert placed(QUEUE, message(), 7).sequence_number == 41



def test_pages_come_in_order_each_produced_before_it_is_asked_for():
    produced = []

    def pages():
        for page in range(4):
            produced.append(page)
            yield page

    ahead = read_ahead(pages())
    assert next(ahead) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 2 and time.monotonic() < deadline:  # the next page is read meanwhile
        time.sleep(0.01)
    assert produced[:2] == [0, 1]
    assert list(ahead) == [1, 2, 3]


def test_an_error_comes_out_where_its_page_would_have():
    def pages():
        yield "first"
        raise AmqpDecodeError("broken", 0)

    ahead = read_ahead(pages())
    assert next(ahead) == "first"
    with pytest.raises(AmqpDecodeError, match="broken"):
        next(ahead)


def test_a_consumer_that_stops_early_stops_the_reading_and_closes_it_where_it_read():
    closed_in = []

    def pages():  # a window's pages, holding a pooled link until it is closed
        page = 0
        try:
            while True:
                yield page
                page += 1
        finally:
            closed_in.append(threading.current_thread().name)

    ahead = read_ahead(pages())
    assert next(ahead) == 0
    ahead.close()
    deadline = time.monotonic() + 5
    while not closed_in and time.monotonic() < deadline:
        time.sleep(0.02)
    assert closed_in == ["read-ahead"]
