"""Faust agents (thin glue) and the micro-batching state machine."""
