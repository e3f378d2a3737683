"""Presets: the embedded default, conf/digits.toml as the full list of keys, and typos in a
preset file (no Spark)."""
from __future__ import annotations

import configparser
import dataclasses
import fnmatch
import re
from pathlib import Path

import pytest
import tomllib

from sparkddl import cli
from sparkddl.cli import preset
from sparkddl.errors import ConfigError
from sparkddl.models import build_model

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf" / "digits.toml"
EMBEDDED = ROOT / "sparkddl" / "presets" / "digits.toml"


def test_no_preset_loads_the_same_config_as_conf_digits():
    default = preset.load(None)
    assert default == preset.load(CONF)
    assert default.train.epochs == 20 and default.model.kwargs["in_features"] == 64
    build_model(default.model.name, **default.model.kwargs)  # not MLP() without in_features
    assert preset.load(None, ["train.epochs=3"]).train.epochs == 3


def test_the_cli_without_a_preset_runs_the_embedded_default(monkeypatch):
    from sparkddl.cli import job
    seen = []
    monkeypatch.setattr(job, "run_prepare", seen.append)
    assert cli.main(["prepare"]) == 0
    assert seen == [preset.load(CONF)]


def test_conf_digits_is_a_byte_identical_copy_of_the_embedded_default():
    assert CONF.read_bytes() == EMBEDDED.read_bytes()
    assert preset.default_preset_text().encode() == EMBEDDED.read_bytes()


def test_the_embedded_default_is_package_data():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    patterns = setup["options.package_data"]["sparkddl"].split()
    relative = EMBEDDED.relative_to(ROOT / "sparkddl").as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns)


def _keys_by_section(text: str) -> dict[str, dict[str, tuple[str, bool]]]:
    """Each section's keys, set or commented out (``# key = value  # why``): the key's TOML
    line and whether it is commented out."""
    keys: dict[str, dict[str, tuple[str, bool]]] = {}
    section = None
    for line in text.splitlines():
        if m := re.fullmatch(r"\[(\w+)\]", line.strip()):
            section = m.group(1)
            keys[section] = {}
        elif section and (m := re.match(r"(#?)\s*(\w+)\s*=.*", line)):
            keys[section][m.group(2)] = (m.group(0).lstrip("#").strip(), bool(m.group(1)))
    return keys


def test_conf_digits_shows_every_key_and_commented_keys_show_their_defaults():
    keys = _keys_by_section(CONF.read_text())
    defaults = preset.JobConfig()
    assert sorted(keys) == sorted(f.name for f in dataclasses.fields(defaults))
    for section, found in keys.items():
        fields = [f.name for f in dataclasses.fields(getattr(defaults, section))]
        assert sorted(found) == sorted(fields), section
    commented = [(s, k, line) for s, found in keys.items()
                 for k, (line, is_comment) in found.items() if is_comment]
    assert len(commented) >= 15
    for section, key, line in commented:
        value = tomllib.loads(line)[key]
        preset.from_dict({section: {key: value}})  # a valid value of the right type
        default = getattr(getattr(defaults, section), key)
        if default is not None:  # unset-by-default keys show an example instead
            assert value == default, f"{section}.{key}"


def test_a_typo_in_a_preset_file_names_the_file_the_key_and_the_valid_keys(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text('[model]\nname = "mlp"\n\n[train]\nepohcs = 3\nbatch_size = 16\n')
    with pytest.raises(ConfigError) as err:
        preset.load(path)
    message = str(err.value)
    assert message.startswith(f"preset '{path}': unknown key 'train.epohcs'; keys of [train]: "
                              "epochs, batch_size, num_workers")
    assert message.endswith("(did you mean 'epochs'?)")


def test_a_typo_in_a_preset_file_section_lists_the_sections(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text("[trian]\nepochs = 3\n")
    with pytest.raises(ConfigError, match=r"preset '.*typo.toml': unknown section \[trian\]; "
                                          r"sections: spark, data, .* \(did you mean 'train'\?\)"):
        preset.load(path)


def test_a_typo_in_a_preset_file_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "typo.toml"
    path.write_text("[optimizer]\nlearning_rate = 0.1\n")
    assert cli.main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'optimizer.learning_rate'; keys of [optimizer]: name, lr, kwargs" in err
    assert len(err.strip().splitlines()) == 1


def test_training_loop_knobs_are_preset_keys():
    cfg = preset.load(None, [
        'train.lr_scheduler="cosine"', "train.lr_scheduler_options.eta_min=0.001",
        'train.lr_scheduler_interval="step"', 'train.precision="bf16-mixed"',
        "train.backward_passes_per_step=2", "train.gradient_clip_norm=1.0",
        'train.on_non_finite_loss="skip_batch"', 'data.label=["label", "y2"]',
        'data.sample_weight="w"'])
    t = cfg.train_config()
    assert (t.lr_scheduler, t.lr_scheduler_options, t.lr_scheduler_interval) == (
        "cosine", {"eta_min": 0.001}, "step")
    assert (t.precision, t.backward_passes_per_step, t.gradient_clip_norm) == (
        "bf16-mixed", 2, 1.0)
    assert t.labels == ("label", "y2") and t.sample_weight == "w"
    assert t.on_non_finite_loss == "skip_batch"
    with pytest.raises(ConfigError, match="'train.precision' must be a string"):
        preset.load(None, ["train.precision=16"])
