"""The Spark session of a job, with the preset's ``[spark]`` settings applied where the user
left them unset.

Precedence, highest first: spark-submit's command line (or ``PYSPARK_SUBMIT_ARGS`` when
Python starts Spark itself), the properties file (``spark-defaults.conf``), the ``MASTER``
and ``SPARK_DRIVER_MEMORY`` environment variables, then the preset. What the user set is
read *before* the driver JVM starts, so the preset's JVM-level settings
(``spark.driver.memory``, ``spark.driver.extraJavaOptions``) reach the JVM's command line.
Where a preset value cannot apply (a session already exists, or spark-submit already started
the JVM), one line says so, naming the key.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# spark-submit options and the property each one sets
SUBMIT_OPTIONS = {
    "--master": "spark.master", "--name": "spark.app.name",
    "--deploy-mode": "spark.submit.deployMode", "--driver-memory": "spark.driver.memory",
    "--driver-cores": "spark.driver.cores",
    "--driver-java-options": "spark.driver.extraJavaOptions",
    "--driver-class-path": "spark.driver.extraClassPath",
    "--driver-library-path": "spark.driver.extraLibraryPath",
    "--executor-memory": "spark.executor.memory", "--executor-cores": "spark.executor.cores",
    "--num-executors": "spark.executor.instances", "--total-executor-cores": "spark.cores.max",
    "--jars": "spark.jars", "--packages": "spark.jars.packages", "--files": "spark.files",
    "--py-files": "spark.submit.pyFiles", "--archives": "spark.archives",
    "--queue": "spark.yarn.queue",
}
# settings read when the driver JVM starts: nothing can change them afterwards
JVM_SETTINGS = ("spark.driver.memory", "spark.driver.extraJavaOptions",
                "spark.driver.extraClassPath", "spark.driver.extraLibraryPath")
# the heap chosen for local masters when nobody set one: half the machine, within these
LOCAL_HEAP_MIN_MB, LOCAL_HEAP_MAX_MB = 1024, 16 << 10


# the master spark-submit falls back to when none is set anywhere
DEFAULT_SUBMIT_MASTER = "local[*]"
# spark-submit options that take no value
SUBMIT_FLAGS = ("--verbose", "-v", "--supervise")


def submit_settings(args: list[str]) -> tuple[dict[str, str], str | None]:
    """The properties spark-submit's options set, and its ``--properties-file`` if given.
    Parsing stops at the application (its file, or ``pyspark-shell``): what follows is the
    application's own arguments."""
    settings: dict[str, str] = {}
    properties_file = None
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, eq, inline = args[i].partition("=")
        if name in SUBMIT_FLAGS:
            i += 1
            continue
        if eq and name.startswith("--"):  # --master=local[2]
            value, i = inline, i + 1
        else:
            value, i = (args[i + 1] if i + 1 < len(args) else ""), i + 2
        if name == "--conf" and "=" in value:
            key, _, val = value.partition("=")
            settings[key] = val
        elif name in SUBMIT_OPTIONS:
            settings[SUBMIT_OPTIONS[name]] = value
        elif name == "--properties-file":
            properties_file = value
    return settings, properties_file


def read_properties(path: str | Path) -> dict[str, str]:
    """A Java properties file as spark-defaults.conf uses it (``key value`` or ``key=value``)."""
    out: dict[str, str] = {}
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and line[0] not in "#!":
            match = re.match(r"(\S+?)(?:\s*[=:]\s*|\s+)(.*)$", line)
            key, value = (match.group(1), match.group(2)) if match else (line, "")
            out[key] = value.strip()
    return out


def defaults_file(properties_file: str | None) -> Path | None:
    """The properties file spark-submit reads: the one given, else spark-defaults.conf."""
    if properties_file:
        return Path(properties_file)
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        from pyspark.find_spark_home import _find_spark_home
        conf_dir = os.path.join(_find_spark_home(), "conf")
    path = Path(conf_dir) / "spark-defaults.conf"
    return path if path.is_file() else None


def user_settings(submit_args: list[str], environment: bool = True) -> dict[str, str]:
    """Everything the user set for Spark outside the preset, by property name (with
    ``environment``, the MASTER and SPARK_DRIVER_MEMORY variables count too)."""
    settings, properties_file = submit_settings(submit_args)
    path = defaults_file(properties_file)
    merged = {**(read_properties(path) if path else {}), **settings}
    env = {"spark.master": "MASTER", "spark.driver.memory": "SPARK_DRIVER_MEMORY"}
    for key, var in env.items():
        if environment and key not in merged and os.environ.get(var):
            merged[key] = os.environ[var]
    return merged


def preset_settings(master: str, app_name: str, conf: dict[str, Any]) -> dict[str, str]:
    return {"spark.master": master, "spark.app.name": app_name,
            **{k: str(v) for k, v in conf.items()}}


def local_heap_mb() -> int:
    """Half of this machine's memory, capped: the driver heap for local masters."""
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    return max(LOCAL_HEAP_MIN_MB, min(LOCAL_HEAP_MAX_MB, total_mb // 2))


def launch_settings(preset: dict[str, str], user: dict[str, str]) -> dict[str, str]:
    """What to start the driver JVM with on top of the user's settings: the preset's values
    the user left unset, and a heap for local masters when nobody chose one."""
    wanted = {k: v for k, v in preset.items() if k not in user}
    master = user.get("spark.master", preset["spark.master"])
    if master.startswith("local") and "spark.driver.memory" not in {**user, **wanted}:
        heap = local_heap_mb()
        wanted["spark.driver.memory"] = f"{heap}m"
        log.info("driver heap %dm for %s: half of this machine's memory, at most %dm; set "
                 "spark.driver.memory in the preset's [spark].conf, or --driver-memory, to "
                 "choose", heap, master, LOCAL_HEAP_MAX_MB)
    return wanted


def session(master: str, app_name: str, conf: dict[str, Any]) -> Any:
    """The job's session: an existing one as it is (SQL settings applied), else one started
    with the settings the user left unset taken from the preset."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    preset = preset_settings(master, app_name, conf)
    builder = SparkSession.builder
    existing = SparkContext._active_spark_context
    remote = os.environ.get("SPARK_REMOTE") or (master if master.startswith("sc://") else "")
    if remote:  # Spark Connect: the server's settings are its own; SQL ones still apply
        log.info("Spark Connect session at %s: the preset's master and JVM settings do not "
                 "apply, its spark.sql.* settings do", remote)
        builder = builder.remote(remote).appName(app_name)
        wanted = {k: v for k, v in preset.items() if k.startswith("spark.sql.")}
    elif existing is not None:
        _note_unapplied(preset, existing.getConf(), "a Spark session already exists")
        wanted = {k: v for k, v in preset.items() if k.startswith("spark.sql.")}
    elif "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: its JVM is running
        SparkContext._ensure_initialized()
        jvm: Any = SparkContext._jvm  # set by _ensure_initialized; py4j's names are dynamic
        command = str(jvm.System.getProperty("sun.java.command") or "")
        # SparkSubmit's own arguments (its main class first); values were joined by spaces
        user = user_settings(command.split()[1:], environment=False)
        # spark-submit hands its Python driver the master it resolved as MASTER: anything
        # but its fallback, local[*], was chosen by the user (by any of spark-submit's means)
        if os.environ.get("MASTER", DEFAULT_SUBMIT_MASTER) != DEFAULT_SUBMIT_MASTER:
            user.setdefault("spark.master", os.environ["MASTER"])
        wanted = {k: v for k, v in preset.items() if k not in user}
        late = {k: wanted.pop(k) for k in JVM_SETTINGS if k in wanted}
        _note_unapplied(late, SparkConf(), "spark-submit started the driver JVM before the "
                        "preset was read; pass it to spark-submit")
    else:
        wanted = launch_settings(preset, user_settings(
            shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))))
    for key, value in wanted.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _note_unapplied(preset: dict[str, str], actual: Any, why: str) -> None:
    """One line for each preset value that differs from what the running Spark has."""
    for key, value in preset.items():
        have = actual.get(key, None)
        if have != value and not key.startswith("spark.sql."):  # SQL settings still apply
            log.warning("preset [spark] %s=%s not applied: %s (it is %s)", key, value, why,
                        "Spark's default" if have is None else have)
