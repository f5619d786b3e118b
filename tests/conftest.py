"""Shared helpers: tiny synthetic MNIST IDX files written by the tests themselves, and the scripts as
modules."""

import dataclasses
import gzip
import importlib
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_MNIST = REPO.parent / "shared" / "data" / "mnist"
BIN = Path(sys.executable).parent  # this environment's capsnet, dvc, mlflow


def write_profile(path: Path, profile: str = "gpu", *sets: str) -> Path:
    """``profile``'s params from the committed params.yaml, with ``sets`` (`--set KEY=VALUE` ...), written to
    ``path`` as `python -m pipeline.profiles PROFILE --write` writes them (what gpu_plan.sh runs)."""
    subprocess.run([sys.executable, "-m", "pipeline.profiles", profile, "--params", str(REPO / "params.yaml"), *sets,
                    "--write", str(path)], check=True, cwd=REPO)
    return path


@pytest.fixture(scope="module")
def gpu_params(tmp_path_factory) -> dict:
    """The gpu profile's params as a GPU window writes them (`write_profile`), read back."""
    import yaml

    return yaml.safe_load(write_profile(tmp_path_factory.mktemp("params") / "params.gpu.yaml").read_text())


def bench_table(folder: Path) -> str:
    """What `python3 scripts/bench_table.py FOLDER` prints for a folder of bench rows."""
    return subprocess.run([sys.executable, "scripts/bench_table.py", str(folder)], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def script(name: str) -> ModuleType:
    """scripts/<name>.py as a module. scripts/ is no package: it is on sys.path only while importing
    (a script's imports of its siblings resolve then), and a script is imported once per session."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "scripts"))


def tool_env(**extra: str) -> dict:
    """The environment subprocesses run in: this environment's tools first on PATH, DVC's analytics
    off, a git identity for commits; then ``extra``."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
            **extra}


def sh(cwd: Path, *command: str, **extra: str) -> str:
    """Run ``command`` in ``cwd`` under `tool_env` (plus ``extra``); its output, or fail showing it."""
    done = subprocess.run(command, cwd=cwd, env=tool_env(**extra), capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def idx_bytes(tensor: torch.Tensor) -> bytes:
    header = struct.pack(">HBB", 0, 0x08, tensor.dim()) + struct.pack(f">{tensor.dim()}I", *tensor.shape)
    return header + tensor.to(torch.uint8).numpy().tobytes()


def committed_params(**prepare):
    """params.yaml as committed, with these ``prepare`` keys replaced (a profile's data settings)."""
    from pipeline.core.params import load_params

    committed = load_params(REPO / "params.yaml")
    return dataclasses.replace(committed, prepare=dataclasses.replace(committed.prepare, **prepare))


def with_ablation(params, **ablation):
    """``params`` with these ``ablation`` keys replaced (the variants and seeds a test trains or reports)."""
    return dataclasses.replace(params, ablation=dataclasses.replace(params.ablation, **ablation))


def synthetic_digits(n: int, size: int = 28, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n images with a bright rectangle each (a stand-in digit) and labels cycling 0-9."""
    g = torch.Generator().manual_seed(seed)
    images = torch.zeros(n, size, size, dtype=torch.uint8)
    for k in range(n):
        y, x = torch.randint(4, size - 12, (2,), generator=g).tolist()
        h, w = torch.randint(4, 9, (2,), generator=g).tolist()
        images[k, y:y + h, x:x + w] = 255
    return images, torch.arange(n, dtype=torch.uint8) % 10


def tiny_data(n_train=48, n_test=16):
    train_images, train_labels = synthetic_digits(n_train, seed=1)
    test_images, test_labels = synthetic_digits(n_test, seed=2)
    return {"train_images": train_images, "train_labels": train_labels,
            "test_images": test_images, "test_labels": test_labels}


@pytest.fixture
def tf32_off():
    """CUDA's matmul and cuDNN in full fp32 (no TF32) for the test, restored after it (the CUDA tests'
    eager fp32 reference)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def params():
    """params.yaml as committed, loaded once per module."""
    return committed_params()


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """A sqlite MLflow store in tmp_path, which is also the repository root that runs name paths by."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    return f"sqlite:///{tmp_path}/m.db"


@pytest.fixture
def small_cnns(monkeypatch):
    """The CNNs with narrow convolutions: what is tested is the stacking and the per-seed dropout,
    not the width (the real 35M-parameter CNN takes seconds a step on 2 cores)."""
    from pipeline.models import baseline

    monkeypatch.setattr(baseline, "CONV_CHANNELS", (8, 8, 4))


def tiny_config(**changes):
    """A one-routing CapsNet run on tiny_data's 28×28 digits, 3 epochs of batch 16 in deterministic fp32."""
    from pipeline.training.config import RunConfig

    cfg = RunConfig(variant="capsnet_r1", model="capsnet", routing_iterations=1, reconstruction=False,
                    image_size=28, num_classes=10, target_accuracy_pct=0.0, seed=0, profile="smoke", epochs=3, batch_size=16,
                    lr=1e-3, lr_decay_rate=0.96, lr_decay_steps=2000, lr_min=1e-6, max_shift=2, amp=False,
                    compile=False, deterministic=True, log_every=2, eval_batch_size=64, device="cpu")
    return dataclasses.replace(cfg, **changes)


def experiment_of(cfg, data, device):
    """What the training loop builds for ``cfg``: its experiment's Training."""
    return cfg.experiment_module().Training(cfg, data, device)


class Recorder:
    """An epoch logger that keeps what it is given and simulates a kill after epoch ``stop_after``."""

    def __init__(self, stop_after=None):
        self.epochs, self.stop_after = [], stop_after

    def log_epoch(self, epoch, metrics):
        self.epochs.append((epoch, metrics))
        if epoch == self.stop_after:
            raise KeyboardInterrupt("simulated kill")


def write_mnist(directory: Path, n_train: int = 40, n_test: int = 20, gz: bool = False) -> dict[str, bytes]:
    """Write the four IDX files (raw or .gz); returns their decoded bytes by name."""
    directory.mkdir(parents=True, exist_ok=True)
    train, train_labels = synthetic_digits(n_train, seed=1)
    test, test_labels = synthetic_digits(n_test, seed=2)
    files = {
        "train-images-idx3-ubyte": idx_bytes(train),
        "train-labels-idx1-ubyte": idx_bytes(train_labels),
        "t10k-images-idx3-ubyte": idx_bytes(test),
        "t10k-labels-idx1-ubyte": idx_bytes(test_labels),
    }
    for name, data in files.items():
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)
    return files


def disk_full(*args, **kwargs):
    """A writer (or any call) that a full disk stops before it writes anything."""
    raise OSError(28, "No space left on device")


def disk_full_midway(obj, target, *args, **kwargs):
    """A writer taking (what, where, …), torch.save's and safetensors' save_file's order, that a full disk
    stops part-way: a few bytes in ``target``, then the error."""
    Path(target).write_bytes(b"half written")
    disk_full()


def trust_mnist(monkeypatch, files: dict[str, bytes]) -> None:
    """Point pipeline.data.download.SHA256 (what download and prepare verify) at synthetic files' hashes."""
    import hashlib

    from pipeline.data import download

    monkeypatch.setattr(download, "SHA256", {k: hashlib.sha256(v).hexdigest() for k, v in files.items()})


@pytest.fixture
def synthetic_mnist(tmp_path, monkeypatch):
    """A mirror of synthetic IDX files, with pipeline.data.download.SHA256 pointed at their hashes."""
    mirror = tmp_path / "mirror"
    files = write_mnist(mirror, gz=True)
    trust_mnist(monkeypatch, files)
    return mirror, files


def tiny_pipeline(root: Path, transforms_per_digit: int = 2) -> Path:
    """Prepared synthetic data (32 train, 12 test digits) in root/prepared and a params.yaml for a
    one-epoch CPU smoke run in root; returns root."""
    from pipeline.data.splits import prepare_mnist
    from pipeline.data.transforms import AffineRanges
    from pipeline.experiments.affnist import prepare_affnist
    from pipeline.experiments.table1 import prepare_affine

    write_mnist(root / "raw", n_train=32, n_test=12)
    out = prepare_mnist(root / "raw", root / "prepared", train_subset=0, test_subset=0)
    prepare_affine(root / "prepared", out["test_images"], out["test_labels"], affine_seed=0, ranges=AffineRanges())
    prepare_affnist(root / "prepared", out["test_images"], out["test_labels"], expanded_seed=1, affnist_seed=2,
                    transforms_per_digit=transforms_per_digit, ranges=AffineRanges())
    text = (REPO / "params.yaml").read_text()
    for old, new in [("epochs: 640", "epochs: 1"), ("batch_size: 128", "batch_size: 16"),
                     ("device: auto", "device: cpu"), ("profile: paper", "profile: smoke")]:
        text = text.replace(old, new)
    (root / "params.yaml").write_text(text)
    return root


def dvc_repo(root: Path, separate: list[str], seeds: list[int], *, stacked: list[str] = (),
             scripts: bool = False) -> Path:
    """A git + DVC repository at ``root`` holding this repository's dvc.yaml cut down to the train and
    evaluate stages (stacked and separate), tiny prepared data as a `dvc add`ed folder, params.yaml's
    ablation set to ``stacked`` and ``separate`` variants × ``seeds``, pipeline/ (the stages' code
    dependencies) and, with ``scripts``, the scripts/ folder; one commit, with a DVC cache outside it
    (``root``/../cache). The stages run the test environment's `capsnet` (callers put it on PATH)."""
    import shutil

    import yaml

    tiny_pipeline(root)
    (root / "data").mkdir()
    shutil.move(root / "prepared", root / "data" / "prepared")
    shutil.rmtree(root / "raw")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["ablation"] = {"seeds": seeds, "stacked": list(stacked), "separate": separate}
    # one step of 32, not the smoke profile's 2 of 16: a smoke run here trains anew instead of finding
    # these runs' checkpoints and MLflow runs (tests/test_dvc.py)
    params["train"]["batch_size"] = 32
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    pipeline = yaml.safe_load((REPO / "dvc.yaml").read_text())  # YAML's anchors and merge keys resolved
    kept = ("train_stacked", "train", "evaluate", "evaluate_stacked")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {k: pipeline["stages"][k] for k in kept}}, sort_keys=False))
    shutil.copytree(REPO / "pipeline", root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    if scripts:
        shutil.copytree(REPO / "scripts", root / "scripts")
    (root / ".gitignore").write_text("/checkpoints/\n/mlflow.db*\n/mlruns/\n/logs/\n")
    for command in (["git", "init", "-q", "-b", "main"], ["dvc", "init", "-q"],
                    ["dvc", "config", "cache.dir", str(root.parent / "cache")], ["dvc", "add", "-q", "data/prepared"],
                    ["git", "add", "-A"], ["git", "commit", "-qm", "tiny pipeline"]):
        sh(root, *command)
    return root


@pytest.fixture(scope="session")
def warm_server(tmp_path_factory):
    """One warm interpreter (pipeline/warm.py) for the session: (its address, its log). Tests whose
    point is what DVC does with the stages (a repro, the one-node fan-out) run their stage
    processes through it; cold stage processes under DVC stay covered by tests/test_scale.py's
    cluster tasks (each runs its own clone's package, which the server refuses) and
    tests/test_warm.py compares cold with warm."""
    from pipeline import warm

    log = tmp_path_factory.mktemp("warm") / "warm.log"
    with warm.running(log) as address:
        assert address is not None, log.read_text()
        yield address, log


# a folder the run's fingerprints are copied into when it ends (.ci/run hands them to its `make smoke`)
FINGERPRINTS_TO = "CAPSNET_TEST_FINGERPRINTS_TO"


@pytest.fixture(scope="session", autouse=True)
def fingerprint_cache(tmp_path_factory):
    """One fingerprint cache for the whole run, every worker and the processes they start sharing it,
    none from an earlier run or the user's (pipeline.training.fingerprint_cache): each fingerprint is
    computed once per run, and a run computes everything it checks itself. Where $FINGERPRINTS_TO names
    a folder, each worker copies the cache's answers there as it ends (the last to end: all of them),
    for a later process of this code on this machine (keyed as they are) to find."""
    from pipeline.training.fingerprint_cache import CACHE_ENV

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, above each worker's
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(shared / "fingerprints"))
        yield shared / "fingerprints"
    if os.environ.get(FINGERPRINTS_TO):
        export_fingerprints(shared / "fingerprints", Path(os.environ[FINGERPRINTS_TO]))


def export_fingerprints(cache: Path, to: Path) -> None:
    """Copy ``cache``'s answers (its JSON files, not its locks) into ``to``, each whole: a reader there
    sees an answer or none."""
    import shutil

    from pipeline.core.files import atomic_path

    for answer in sorted(cache.glob("*.json")):
        with atomic_path(to / answer.name) as tmp:
            shutil.copyfile(answer, tmp)
