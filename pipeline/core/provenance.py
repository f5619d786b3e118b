"""What every run records about where and from what it ran, whichever tracker records it (the MLflow
store, pipeline.core.tracking, or a journal, pipeline.core.journal): the params every run logs, the
code's commit, the host and device, the library versions, and paths as the repository names them."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

PARAM_KEYS = ("variant", "model", "routing_iterations", "reconstruction", "seed", "batch_size", "lr",
              "lr_decay_rate", "lr_decay_steps", "lr_schedule_epochs", "epochs", "steps", "amp", "compile", "n_params",
              "device", "torch_version", "profile", "recipe", "experiment", "image_size", "n_train", "n_test")


def repo_root() -> Path:
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def git_commit(root: Path) -> str:
    """HEAD (+ "-dirty" when a tracked file outside reports/ differs from it), or $CAPSNET_GIT_COMMIT
    where the tree has no .git (a copy on a GPU box). reports/ is what the report stage rewrites, so
    its own outputs never mark the code that wrote them dirty."""
    if os.environ.get("CAPSNET_GIT_COMMIT"):
        return os.environ["CAPSNET_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)reports"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def shown_path(path: str | Path) -> str:
    """``path`` relative to the repository root when inside it (as runs are moved between machines);
    a relative path is taken as relative to it already (a stage runs in the repository root)."""
    if not Path(path).is_absolute():
        return str(path)
    path = Path(path).resolve()
    return str(path.relative_to(repo_root()) if path.is_relative_to(repo_root()) else path)


def common_params(params: dict) -> dict:
    """The param keys every run logs, so runs compare side by side; a missing one is an error."""
    missing = set(PARAM_KEYS) - set(params)
    if missing:
        raise ValueError(f"run params lack {sorted(missing)}; every run logs {PARAM_KEYS}")
    return {k: params[k] for k in PARAM_KEYS}


def run_tags() -> dict[str, str]:
    """Where a run ran, so a fanned-out run can be traced: commit, DVC stage, host and GPU."""
    return {
        "git_commit": git_commit(repo_root()),
        "dvc_stage": os.environ.get("DVC_STAGE", ""),
        "dvc_exp_name": os.environ.get("DVC_EXP_NAME", ""),
        **placement(),
    }


def placement() -> dict[str, str]:
    """The host, the GPUs this process was given (CUDA_VISIBLE_DEVICES, as a fan-out slot or a
    scheduler set it), the name of the one it uses (cuda:0 of those it sees) and torch's CPU threads
    (a fan-out slot's share of the cores)."""
    import torch  # here, not above: reading a journal (pipeline.core.journal) needs no torch

    return {
        "host": platform.node(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "cpu_threads": str(torch.get_num_threads()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
    }


def environment() -> dict[str, str]:
    """Versions and device facts recorded with every run."""
    import torch

    return {
        "git_commit": git_commit(repo_root()),
        "torch_version": torch.__version__,
        "cuda_version": str(torch.version.cuda),
        "python_version": platform.python_version(),
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
        "dvc_stage": os.environ.get("DVC_STAGE", ""),
        **placement(),
    }
