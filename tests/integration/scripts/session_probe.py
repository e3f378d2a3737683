"""Start a job's session from a preset (argv: preset, --set overrides) and print what the
driver JVM really got. Run in a fresh process: a JVM's settings are fixed when it starts."""
import json
import logging
import sys

from sparkddl.cli import preset
from sparkddl.cli.job import spark_session

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
spark = spark_session(preset.load(sys.argv[1], [a for a in sys.argv[2:] if a != "--set"]))
runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
print("PROBE " + json.dumps({"master": spark.sparkContext.master,
                             "max_heap_mb": runtime.maxMemory() / (1 << 20),
                             "app_name": spark.sparkContext.appName}))
spark.stop()
