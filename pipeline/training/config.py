"""What determines one training run: `RunConfig`, made from params.yaml by `run_config`.

A run's config is stored with its checkpoint and weights; its `digest` (the fields that change the
mathematics) decides whether a checkpoint may resume it, and pipeline.training.fingerprint fingerprints
the training it names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from types import ModuleType

from pipeline.core import protocol, registry
from pipeline.core.params import Params

ADAM_EPS = 1e-8  # TF1's tf.train.AdamOptimizer default, which the official code uses (1e-7 is Keras')


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one training run; stored with its checkpoint and weights."""

    variant: str
    model: str
    routing_iterations: int
    reconstruction: bool
    image_size: int
    num_classes: int
    target_accuracy_pct: float  # early stopping on the per-epoch test accuracy; 0 = off
    seed: int
    profile: str
    epochs: int
    batch_size: int
    lr: float
    lr_decay_rate: float
    lr_decay_steps: int
    lr_min: float
    max_shift: int
    amp: bool
    compile: bool
    deterministic: bool
    log_every: int
    eval_batch_size: int
    device: str
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch is always saved)
    multimnist_epoch_size: int = 60_000  # MultiMNIST: examples sampled per epoch (pipeline.experiments.multimnist)
    recipe: str = "paper"  # CapsNet: paper | official (pipeline.models.capsnet); the CNNs have one recipe, "paper"
    channels_last: bool = False  # NHWC convolutions: a memory layout, so outside the digest
    lr_schedule_epochs: int = 0  # 0: the decay at its own pace; E: E epochs' decay compressed into `epochs`
    compile_mode: str = "default"  # torch.compile's mode: a speed lever, so outside the digest
    stack_layout: str = "fused"  # how stacked seeds run (pipeline.training.stack): a speed lever too
    cuda_graph: bool = False  # the whole step captured as one CUDA graph (pipeline.training.steps): a speed lever
    experiment: str = ""  # pipeline.core.registry's name; "" in records from before the key (image_size says)
    tf32: bool = False  # TF32 for CUDA's fp32 matmuls and cuDNN convolutions (false: fp32 is fp32)

    @property
    def experiment_name(self) -> str:
        """The experiment that trains this run (a record without the key: its image size says)."""
        return registry.of_record(self.experiment, self.image_size)

    def experiment_module(self) -> ModuleType:
        return registry.load(self.experiment_name)

    def digest(self) -> str:
        """Hash of the fields that change the mathematics (a checkpoint resumes only on a match)."""
        fields = dataclasses.asdict(self) | {"adam_eps": ADAM_EPS}
        for cosmetic in ("log_every", "eval_batch_size", "profile", "checkpoint_every", "channels_last", "compile_mode",
                         "stack_layout", "cuda_graph"):
            fields.pop(cosmetic)
        if not getattr(self.experiment_module(), "USES_EPOCH_SIZE", False):  # unused: digests (checkpoints)
            fields.pop("multimnist_epoch_size")  # from before MultiMNIST stay valid
        if self.experiment == registry.LEGACY_IMAGE_SIZES.get(self.image_size, None):  # checkpoints from before
            fields.pop("experiment")  # the key stay valid: the image size said the same
        if not self.lr_schedule_epochs:  # uncompressed: digests from before the key existed stay valid
            fields.pop("lr_schedule_epochs")
        if not self.tf32:  # likewise (no checkpoint outlives its GPU machine, and on a CPU it changes nothing)
            fields.pop("tf32")
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def run_config(params: Params, variant: str, seed: int, **overrides) -> RunConfig:
    """The RunConfig of (variant, seed) under ``params``: the variant's model settings plus the
    train section's recipe (every TrainParams field is a RunConfig field, but compile_cnns decides
    ``compile`` for the CNNs, and a variant's own precision ``amp``), the settings its experiment's
    prepared sets will hold (`planned`: the train stage reads them from the sets, `configure`; the
    fingerprint table and the bench have none), then ``overrides``."""
    v = params.variant(variant)
    recipe = dataclasses.asdict(params.train)
    compile_cnns = recipe.pop("compile_cnns")
    recipe["compile"] = params.train.compile and (v.model == "capsnet" or compile_cnns)
    recipe["amp"] = protocol.amp_of(v.precision, params.train.amp)  # a precision twin's own
    cfg = RunConfig(variant=variant, model=v.model, routing_iterations=v.routing_iterations,
                    reconstruction=v.reconstruction, experiment=v.experiment, image_size=v.image_size, num_classes=10,
                    target_accuracy_pct=v.target_accuracy_pct, recipe=v.recipe, seed=seed,
                    profile=params.base.profile, **recipe)
    cfg = cfg.experiment_module().planned(cfg, params)  # what its prepared sets will say (MultiMNIST's shift)
    return dataclasses.replace(cfg, **overrides)
