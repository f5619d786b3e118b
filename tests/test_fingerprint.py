"""The training fingerprint: pinned per experiment family, blind to protocol and speed settings,
recorded by the train stage with every run."""

import dataclasses
import json

import pytest
import torch

from pipeline.core.params import load_params
from pipeline.stages import train as train_stage
from pipeline.training import fingerprint as fp
from pipeline.training.train import run_config

from conftest import REPO, tiny_pipeline
from mlflow.tracking import MlflowClient

# The fingerprint of each family's training code in the environment it was pinned in. A change
# here is a deliberate statement that training now computes something else: runs trained before
# it no longer pool with runs trained after it (the report groups rows by fingerprint).
PINNED_ENVIRONMENT = "CPU AVX512"
PINNED = {
    "capsnet_r3_recon": "eec650c5a9657c9f",  # Table 1: shifts, routing 3, the decoder's loss
    "capsnet_r1_official": "a58435f64bad6042",  # the official recipe: its scales, biases and init
    "baseline_cnn": "8fbae82338718eb1",  # dropout's masks, drawn from each seed's generator
    "capsnet_affnist": "396f443cdd36dfba",  # §5.2: random placement on the 40×40 canvas
    "multimnist_r3_recon": "fe790124bfeb962e",  # MultiMNIST: fresh pairs, two-digit targets
}


@pytest.fixture(scope="module")
def params():
    return load_params(REPO / "params.yaml")


@pytest.mark.parametrize("variant", sorted(PINNED))
def test_every_family_computes_what_it_was_pinned_to(params, variant):
    if not fp.fingerprint_environment().endswith(PINNED_ENVIRONMENT):
        pytest.skip(f"pinned under {PINNED_ENVIRONMENT}; this machine is {fp.fingerprint_environment()}")
    assert fp.training_fingerprint(run_config(params, variant, 0)) == PINNED[variant]


def test_protocol_and_speed_settings_do_not_change_it_but_the_model_does(params):
    cfg = run_config(params, "capsnet_r3_recon", 0)
    same = dataclasses.replace(cfg, seed=2, epochs=50, lr_schedule_epochs=640, batch_size=128, amp=True,
                               compile=True, channels_last=True, deterministic=False, log_every=7,
                               eval_batch_size=3, device="cuda", profile="gpu", checkpoint_every=5)
    assert fp.training_fingerprint(same) == fp.training_fingerprint(cfg)
    assert fp.training_fingerprint(run_config(params, "capsnet_r1_recon", 0)) != fp.training_fingerprint(cfg)


def test_it_leaves_the_callers_random_streams_and_threads_alone(params):
    torch.manual_seed(5)
    expected = torch.rand(3)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # not 1, and whatever an earlier call left
    try:
        torch.manual_seed(5)
        fp.training_fingerprint(run_config(params, "capsnet_r1", 0))
        assert torch.equal(torch.rand(3), expected) and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)


def test_weights_digest_reads_every_byte_of_every_seed():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    digest = fp.weights_digest([a, b])
    with torch.no_grad():
        b.bias[1] = torch.nextafter(b.bias[1], torch.tensor(1.0))  # one ulp in the second seed
    assert fp.weights_digest([a, b]) != digest
    assert fp.weights_digest([b, a]) != fp.weights_digest([a, b])


def test_the_train_stage_records_it_in_config_and_mlflow(tmp_path, monkeypatch):
    tiny_pipeline(tmp_path, transforms_per_digit=1)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    params = load_params(tmp_path / "params.yaml")
    outcome = train_stage.run(params, "capsnet_r1", 0, tmp_path / "prepared", tmp_path / "out", tmp_path / "ck.pt")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    expected = fp.training_fingerprint(run_config(params, "capsnet_r1", 0))
    assert config["training_fingerprint"] == expected
    assert config["environment"]["fingerprint_environment"] == fp.fingerprint_environment()
    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(outcome.run_id)
    assert run.data.tags["training_fingerprint"] == expected
