"""The purge's decisions, pure: what is recorded and may be settled (``plan``), one round as a state machine
(``progress``), settling many locks in few requests (``bulk_settlement``), and what fits inside a lock
(``settle_timing``). The receives and settlements are ``servicebus.purge``'s; the background rounds
``sink.purge_runner``'s."""
