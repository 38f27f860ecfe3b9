"""Avro schemas, codecs and the project's error types. Imports neither Faust nor Kafka."""
