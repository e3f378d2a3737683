"""Which Spark settings the user made outside the preset, read without starting a JVM."""
from __future__ import annotations

import pytest

from sparkddl.cli import spark_settings as ss

PRESET = ss.preset_settings("local[2]", "app", {"spark.driver.memory": "3g",
                                                 "spark.sql.shuffle.partitions": 4})


def test_submit_options_and_conf_become_properties_until_the_application():
    settings, props = ss.submit_settings(
        ["--master", "local[4]", "--driver-memory=2g", "--verbose", "--conf", "a.b=c=d",
         "--properties-file", "/x.conf", "--name", "n", "app.py", "--master", "ignored"])
    assert settings == {"spark.master": "local[4]", "spark.driver.memory": "2g",
                        "a.b": "c=d", "spark.app.name": "n"}
    assert props == "/x.conf"
    assert ss.submit_settings(["pyspark-shell"]) == ({}, None)


def test_properties_files_in_every_separator_style(tmp_path):
    path = tmp_path / "spark-defaults.conf"
    path.write_text("# comment\n! also\nspark.master   local[3]\nspark.a=1\nspark.b : two "
                    "words\n\nspark.flag\n")
    assert ss.read_properties(path) == {"spark.master": "local[3]", "spark.a": "1",
                                        "spark.b": "two words", "spark.flag": ""}


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in ("MASTER", "SPARK_DRIVER_MEMORY", "PYSPARK_SUBMIT_ARGS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    return tmp_path


def test_precedence_command_line_then_defaults_file_then_environment(clean_env, monkeypatch):
    (clean_env / "spark-defaults.conf").write_text("spark.master local[3]\nspark.x 1\n")
    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "5g")
    monkeypatch.setenv("MASTER", "local[9]")
    user = ss.user_settings(["--conf", "spark.x=2"])
    assert user == {"spark.master": "local[3]", "spark.x": "2", "spark.driver.memory": "5g"}
    # an explicit properties file replaces spark-defaults.conf, as spark-submit does
    other = clean_env / "other.conf"
    other.write_text("spark.y 7\n")
    assert ss.user_settings(["--properties-file", str(other)]) == {
        "spark.y": "7", "spark.master": "local[9]", "spark.driver.memory": "5g"}


def test_the_preset_fills_only_what_the_user_left_unset(clean_env):
    wanted = ss.launch_settings(PRESET, {"spark.master": "yarn", "spark.app.name": "mine"})
    assert wanted == {"spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "4"}


def test_a_local_master_without_memory_anywhere_gets_a_heap_from_the_machine(clean_env):
    bare = ss.preset_settings("local[2]", "app", {})
    assert ss.launch_settings(bare, {})["spark.driver.memory"] == f"{ss.local_heap_mb()}m"
    assert ss.LOCAL_HEAP_MIN_MB <= ss.local_heap_mb() <= ss.LOCAL_HEAP_MAX_MB
    # set by the user, or not a local master: left alone
    assert "spark.driver.memory" not in ss.launch_settings(bare, {"spark.driver.memory": "1g"})
    assert "spark.driver.memory" not in ss.launch_settings(bare, {"spark.master": "yarn"})
    assert ss.launch_settings(PRESET, {})["spark.driver.memory"] == "3g"
