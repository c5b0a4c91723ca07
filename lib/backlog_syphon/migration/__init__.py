"""The migration mode's decisions (``run.source: migration``): which entities of a source namespace a run reads
(``selection``), where each one's messages go and which configurations are refused (``routes``; for a topic
drained through one of its subscriptions, whether they hold the same messages: ``fan_out``), and what each
message becomes (``copy_rules``; the copy's bytes are ``restore.copied_message``). Pure: the listings and the
time come in as values; the I/O is ``servicebus`` and ``run``'s."""
