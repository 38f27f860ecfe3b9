"""Local servers for development, demos, tests and benchmarks, each started on 127.0.0.1 without
Docker: Apache Kafka (``kafka_local``, secured by ``kafka_secure``), s3proxy (``s3_local``), Azurite
(``azurite_local``), fake-gcs-server (``gcs_local``), Prometheus (``prometheus_local``), a Triton
Inference Server (``triton_local``, serving ``triton_serve.py``), Toxiproxy, the TCP fault proxy
that goes between a worker and those servers (``toxiproxy_local``), and Apicurio Registry, a schema
registry (``registry_local``). ``launch`` holds what they share:
instance names, state files, ports, and stopping exactly the process that was started. The
``lightbox kafka|s3|azure|gcs|toxiproxy|registry`` commands, the tests and the benchmarks use them; a worker does not.
"""
