"""Pure restore rules: read a backlog copy (AMQP codec), decode its legacy properties, classify it, rebuild it.

Nothing here does I/O: no Spark session, no Service Bus client, no files.
"""
