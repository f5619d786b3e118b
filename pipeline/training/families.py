"""Which experiment family trains a variant: its image size says (params.yaml's variants).

28×28: Table 1's shifted MNIST (pipeline.data.mnist); 40×40: §5.2's random placement on the canvas
(pipeline.experiments.affnist); 36×36: MultiMNIST's pairs (pipeline.experiments.multimnist). A new family is a class in
its own module (pipeline.training.experiment.Experiment) and a line here.
"""

from __future__ import annotations

import torch

from pipeline.experiments.affnist import CANVAS as AFFNIST_CANVAS, Canvas
from pipeline.data.mnist import MNIST_SIZE, ShiftedMnist
from pipeline.training.experiment import Experiment
from pipeline.experiments.multimnist import CANVAS as MULTIMNIST_CANVAS, Pairs

FAMILIES = {MNIST_SIZE: ShiftedMnist, AFFNIST_CANVAS: Canvas, MULTIMNIST_CANVAS: Pairs}


def experiment(cfg, data: dict[str, torch.Tensor], device: torch.device) -> Experiment:
    """The experiment that trains ``cfg`` (a pipeline.training.train.RunConfig) on ``data``, on ``device``."""
    return FAMILIES[cfg.image_size](cfg, data, device)
