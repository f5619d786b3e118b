"""Profiles are params.yaml plus overrides defined once; every profile is a valid params file."""

import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from pipeline import profiles
from pipeline.params import parse_params


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_every_profile_validates_and_names_itself(name):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    params = parse_params(profiles.apply(raw, name))
    assert params.base.profile == name
    assert raw["base"]["profile"] == "paper"  # the base mapping is not changed


def test_gpu_profile_settings():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    train = parse_params(profiles.apply(raw, "gpu")).train
    assert (train.epochs, train.amp, train.compile, train.deterministic, train.device) == (50, True, True, False, "cuda")


def test_unknown_key_or_profile_is_named():
    with pytest.raises(KeyError, match="train.nonsense is not a key"):
        profiles.PROFILES["bad"] = {"train.nonsense": 1}
        try:
            profiles.apply({"train": {}}, "bad")
        finally:
            del profiles.PROFILES["bad"]
    with pytest.raises(KeyError, match="unknown profile 'fast'"):
        profiles.apply({}, "fast")


def test_dvc_arguments_and_written_file(tmp_path):
    args = profiles.dvc_set_args("smoke")
    assert args[:2] == ["-S", "base.profile=smoke"] and "ablation.seeds=[0]" in args and "train.device=cpu" in args
    out = tmp_path / "p.yaml"
    subprocess.run([sys.executable, "-m", "pipeline.profiles", "gpu", "--params", str(REPO / "params.yaml"),
                    "--write", str(out)], check=True, cwd=REPO)
    assert parse_params(yaml.safe_load(out.read_text())).base.profile == "gpu"
