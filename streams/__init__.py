"""Settings, topics, codecs, the Faust app factory and the CLI.

The pure parts (``settings``, ``fetch``, ``kafka_local``) import neither Faust nor Kafka;
``app``, ``producer`` and ``cli`` do.
"""
