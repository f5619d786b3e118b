"""The training fingerprint: pinned per experiment family, blind to protocol and speed settings,
recorded by the train stage with every run. Where it is computed (the capped process, its environment,
a commit's table, the probe): tests/test_fingerprint_process.py."""

import dataclasses
import json

import pytest
import torch

from pipeline.core.params import load_params
from pipeline.stages import train as train_stage
from pipeline.training import fingerprint as fp
from pipeline.training.config import run_config

from conftest import tiny_pipeline

# The fingerprint of each family's training code, per environment it was pinned in (fp32 on a CPU
# depends on torch's release, and the host's processor and C library: the processor's kernels are
# capped, ATen's at AVX2 and MKL's at its COMPATIBLE branch, and still the H200 host's Intel Xeon with
# glibc 2.39 computed other fingerprints than this AMD EPYC with glibc 2.36, the same torch build:
# pipeline.training.fingerprint). A change here is a deliberate statement that training now computes
# something else: runs trained before it no longer pool with runs trained after it (the report groups
# rows by fingerprint). torch 2.15.0's is the lock's; torch 2.11.0's on this AMD host (pyproject's
# floor, the GPU box's torch) computed here by scripts/torch_floor.sh; on the Intel host, what that
# host's pins computed at bd0184f (2026-11-27 07:22 H200 window, fingerprint_pins.txt), the same as its
# fingerprint table for that commit. The GPU window runs these pins on its host (scripts/gpu_session.sh).
AMD = "AuthenticAMD, glibc 2.36"
PINNED = {
    f"torch 2.15.0, CPU AVX2 capped, MKL COMPATIBLE, {AMD}": {
        "capsnet_r3_recon": "6a2175f0758216e6",  # Table 1: shifts, routing 3, the decoder's loss
        "capsnet_r1_official": "92b5d2f18759b2b2",  # the official recipe: its scales, biases and init
        "baseline_cnn": "a1cd1001084825e2",  # dropout's masks, drawn from each seed's generator
        "capsnet_affnist": "046f7631e62b6f35",  # §5.2: random placement on the 40×40 canvas
        "multimnist_r3_recon": "e312026e50482894",  # MultiMNIST: fresh pairs shifted ≤ 4 px, two-digit targets
    },
    f"torch 2.11.0, CPU AVX2 capped, MKL COMPATIBLE, {AMD}": {
        "capsnet_r3_recon": "6a2175f0758216e6",
        "capsnet_r1_official": "13e248cfad707fdc",
        "baseline_cnn": "a1cd1001084825e2",
        "capsnet_affnist": "4386a99658686bdc",
        "multimnist_r3_recon": "fbda738150a4b081",  # what the 2026-11-27 rehearsal's MultiMNIST jobs recorded
    },
    "torch 2.11.0, CPU AVX2 capped, MKL COMPATIBLE, GenuineIntel, glibc 2.39": {
        "capsnet_r3_recon": "5efb8c6b93ed5b33",
        "capsnet_r1_official": "10a360b820f381d0",
        "baseline_cnn": "3ec84beafdad08a5",
        "capsnet_affnist": "f6a1545074dfce5a",
        "multimnist_r3_recon": "b77d8ce6db2ab6ec",
    },
}
# what would reach an uncapped process from the host (this AMD EPYC: ATen's AVX512 kernels, and MKL's
# AUTO branch, gave other fingerprints to capsnet_r3_recon on 2026-11-27). On a host without AVX512
# ATen's setting cannot reach it.
HOST = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO"}
CAPPED_HERE = "CPU AVX2 capped, MKL COMPATIBLE"  # what an x86-64 host with AVX2 and torch's MKL must report


def pinned_environment() -> str:
    """`fingerprint_environment` without the build's local tag: 'torch 2.15.0, CPU AVX2 capped, MKL
    COMPATIBLE, AuthenticAMD, glibc 2.36' (on any host with AVX2 and MKL: a pin a broken cap would skip
    is a failure instead)."""
    version, _, rest = fp.fingerprint_environment().partition(", ")
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and torch.backends.mkl.is_available():
        assert rest == f"{CAPPED_HERE}, {fp.host_numerics()}", \
            f"this host's {torch.backends.cpu.get_cpu_capability()} or MKL reached the fingerprint: {rest}"
    return f"{version.split('+')[0]}, {rest}"


def test_the_environment_names_the_hosts_processor_vendor_and_c_library(tmp_path, monkeypatch):
    """Two hosts whose capped processes computed other fingerprints with one torch build (this AMD EPYC with
    glibc 2.36, the H200 host's Intel Xeon with glibc 2.39) record two environments, so their fingerprints
    never compare."""
    assert fp.fingerprint_environment().endswith(f", {fp.host_numerics()}")  # the capped process names its host
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n")
    monkeypatch.setattr(fp.fingerprint_cache, "CPUINFO", cpuinfo)
    monkeypatch.setattr(fp.platform, "libc_ver", lambda: ("glibc", "2.39"))
    assert fp.host_numerics() == "GenuineIntel, glibc 2.39"
    monkeypatch.setattr(fp.fingerprint_cache, "CPUINFO", tmp_path / "absent")  # not Linux: the architecture, at least
    monkeypatch.setattr(fp.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(fp.platform, "libc_ver", lambda: ("", ""))
    assert fp.host_numerics() == "arm64, libc unknown"


@pytest.mark.parametrize("variant", sorted(PINNED[f"torch 2.15.0, CPU AVX2 capped, MKL COMPATIBLE, {AMD}"]))
def test_every_family_computes_what_it_was_pinned_to(params, variant):
    here = pinned_environment()
    assert fp.fingerprint_environment().replace(torch.__version__, torch.__version__.split("+")[0]) == here  # runs' key
    if here not in PINNED:
        pytest.skip(f"pinned under {'; '.join(PINNED)}; this machine is {here}")
    assert all(sorted(values) == sorted(PINNED[here]) for values in PINNED.values())  # every environment pins every family
    assert fp.training_fingerprint(run_config(params, variant, 0)) == PINNED[here][variant]


def test_protocol_and_speed_settings_do_not_change_it_but_the_model_does(params):
    cfg = run_config(params, "capsnet_r3_recon", 0)
    same = dataclasses.replace(cfg, seed=2, epochs=50, lr_schedule_epochs=640, batch_size=128, amp=True,
                               compile=True, channels_last=True, deterministic=False, log_every=7,
                               eval_batch_size=3, device="cuda", profile="gpu", checkpoint_every=5, cuda_graph=True,
                               stack_layout="bmm", compile_mode="max-autotune-no-cudagraphs")
    assert fp.training_fingerprint(same) == fp.training_fingerprint(cfg)
    assert fp.training_fingerprint(run_config(params, "capsnet_r1_recon", 0)) != fp.training_fingerprint(cfg)


def test_the_small_configuration_fixes_every_protocol_speed_and_bookkeeping_setting(params):
    """What differs between two runs of one variant, its protocol (epochs, batch, rate, schedule, early
    stop, MultiMNIST's epoch), its speed levers and its bookkeeping (profile, logging, checkpoints, evaluation
    batch), is fixed in the configuration the fingerprint trains, so no setting of it reaches the fingerprint."""
    cfg = run_config(params, "multimnist_r3_recon", 0)
    other = dataclasses.replace(cfg, seed=2, profile="gpu", epochs=50, batch_size=128, lr=5e-4, lr_decay_rate=0.9,
                                lr_decay_steps=500, lr_min=0.0, lr_schedule_epochs=640, target_accuracy_pct=99.5,
                                multimnist_epoch_size=10, amp=True, compile=True, deterministic=False, log_every=7,
                                eval_batch_size=3, device="cuda", checkpoint_every=5, channels_last=True,
                                compile_mode="max-autotune-no-cudagraphs", stack_layout="bmm", cuda_graph=True)
    assert fp.fingerprint_config(other) == fp.fingerprint_config(cfg)
    assert fp.fingerprint_config(cfg).variant == "fingerprint" and fp.fingerprint_config(cfg).device == "cpu"


def test_the_hosts_kernels_do_not_reach_it(params, monkeypatch):
    here = pinned_environment()
    if here not in PINNED:
        pytest.skip(f"pinned under {'; '.join(PINNED)}; this machine is {here}")
    for name, value in HOST.items():
        monkeypatch.setenv(name, value)
    fp._fingerprint.cache_clear()
    try:
        # routing and the decoder: the family both of HOST's settings reach
        assert fp.training_fingerprint(run_config(params, "capsnet_r3_recon", 0)) == PINNED[here]["capsnet_r3_recon"]
    finally:
        fp._fingerprint.cache_clear()


def test_computing_it_leaves_the_callers_random_streams_and_threads_alone(params):
    torch.manual_seed(5)
    expected = torch.rand(3)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # not 1, and whatever an earlier call left
    try:
        torch.manual_seed(5)
        fp._compute(fp.fingerprint_config(run_config(params, "capsnet_r1", 0)))
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
    from mlflow.tracking import MlflowClient  # here: the GPU machine runs this file's pins without MLflow

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
    # `capsnet fingerprint`'s table (what the GPU session writes once per commit, bridging its rows
    # in the report) holds what the stage records, with its commit and environment
    from click.testing import CliRunner

    from pipeline.cli import main

    monkeypatch.setenv("CAPSNET_GIT_COMMIT", "abcdef0123456789")
    done = CliRunner().invoke(main, ["fingerprint", str(tmp_path / "table.json"), "--variant", "capsnet_r1",
                                     "--variant", "capsnet_r3_recon", "--params", str(tmp_path / "params.yaml")])
    assert done.exit_code == 0, done.output
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["commit"] == "abcdef0123456789" and table["environment"] == fp.fingerprint_environment()
    assert table["fingerprints"]["capsnet_r1"] == expected and len(table["fingerprints"]) == 2
    assert table["fingerprints"]["capsnet_r3_recon"] == fp.training_fingerprint(run_config(params, "capsnet_r3_recon", 0))


def test_computing_it_prints_nothing_of_its_training(params, capsys):
    fp._compute(fp.fingerprint_config(run_config(params, "capsnet_r1", 0)))
    assert capsys.readouterr().out == ""
