"""Settings, topics, codecs, the Faust app factory and the Kafka clients.

The pure parts (``settings``, ``codecs``) import neither Faust nor Kafka; ``app``, ``producer``
and ``consume`` do.
"""
