"""A local Spark Connect server with Delta, for the tests: ``python connect_server.py PORT``.

It is the project's own session (Delta JARs, UTC) with Spark's Connect plugin listening on
127.0.0.1:PORT. It prints ``ready`` once clients can connect and serves until it is terminated.
The syphon's library must be importable by its Python workers (PYTHONPATH), as it must be on
any Connect server (a Databricks environment installs the wheel).
"""

import sys
import time

from backlog_syphon.run.spark_session import build_spark_session


def main(port: str) -> None:
    build_spark_session(app_name="connect-server", extra_conf={
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": port,
        "spark.ui.enabled": "false",
    })
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
