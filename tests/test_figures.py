"""What the figures draw (pipeline/report/figures.py): each figure is captured before it is saved and
its artists are read back, so a dot at the wrong row, a band that spans nothing or a reconstruction
in the wrong colour fails here. The data handed to each figure is tested where it is assembled
(tests/test_report_stage.py)."""

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba

from pipeline.report import figures


@pytest.fixture
def drawn(monkeypatch):
    """The figures the calls under test would save, kept open for reading (closed after the test)."""
    kept = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: kept.append(fig))
    yield kept
    for fig in kept:
        plt.close(fig)


def errorbars(ax):
    """(x, y, bar segments as a (k, 2, 2) array of end points) of each errorbar call on ``ax``, in drawing order."""
    out = []
    for container in ax.containers:
        line, _, bars = container.lines
        x, y = line.get_data()
        out.append((list(x), list(y), np.array([seg for col in bars for seg in col.get_segments()])))
    return out


def test_save_figure_writes_a_png_and_closes_the_figure(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    figures.save_figure(fig, tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert not plt.fignum_exists(fig.number)  # a report draws dozens: an open figure each would pile up
    assert [p.name for p in tmp_path.iterdir()] == ["f.png"]


def test_each_effect_is_drawn_on_the_row_its_label_names(drawn, tmp_path):
    """The forest plot: effect k's estimate, interval and paper diamond sit at the y tick labelled
    with effect k (the first on top); a confounded effect has no bar and is grey."""
    effects = ["routing", "reconstruction", "recipe"]
    figures.effect_intervals(effects, [0.03, -0.11, -0.04], [(-0.15, 0.22), (-0.29, 0.06), (math.nan, math.nan)],
                             [-0.04, -0.14, math.nan], ["84 seeds", "none", "confounded"], tmp_path / "e.png")
    ax = drawn[0].axes[0]
    row_of = {tick.get_text(): y for y, tick in zip(ax.get_yticks(), ax.get_yticklabels())}
    bars = errorbars(ax)
    assert [(x, y) for x, y, _ in bars] == [([0.03], [row_of["routing"]]), ([-0.11], [row_of["reconstruction"]]),
                                            ([-0.04], [row_of["recipe"]])]
    assert row_of["routing"] > row_of["reconstruction"] > row_of["recipe"]  # the first effect on top
    first, second, third = (b[2] for b in bars)
    assert first == pytest.approx(np.array([[[-0.15, row_of["routing"]], [0.22, row_of["routing"]]]]))
    assert second == pytest.approx(np.array([[[-0.29, row_of["reconstruction"]], [0.06, row_of["reconstruction"]]]]))
    assert third.size == 0
    assert to_rgba(ax.containers[2].lines[0].get_color()) == to_rgba("#999999")
    diamonds = [line.get_data() for line in ax.lines if line.get_marker() == "D"]
    assert [(list(x), list(y)) for x, y in diamonds] == [([-0.04], [row_of["routing"]]),
                                                         ([-0.14], [row_of["reconstruction"]])]


def test_seed_errors_draws_every_seed_their_mean_and_interval_beside_the_papers_sigma(drawn, tmp_path):
    figures.seed_errors(["a", "b"], [[0.3, 0.4, 0.8], [0.5]], [(0.1, 0.9), (math.nan, math.nan)],
                        [0.25, 0.35], [0.005, math.nan], tmp_path / "s.png")
    ax = drawn[0].axes[0]
    dots = [xy for c in ax.collections if isinstance(c, PathCollection) for xy in c.get_offsets().tolist()]
    assert np.array(dots) == pytest.approx(np.array([[-0.12, 0.3], [-0.12, 0.4], [-0.12, 0.8], [0.88, 0.5]]))
    (x_a, y_a, bars_a), (x_b, y_b, bars_b), (x_p, y_p, bars_p) = errorbars(ax)
    assert y_a == pytest.approx([0.5]) and bars_a == pytest.approx(np.array([[[-0.12, 0.1], [-0.12, 0.9]]]))  # 95 %
    assert y_b == [0.5] and bars_b.size == 0  # one seed: no interval
    assert x_p == [0.12, 1.12] and y_p == [0.25, 0.35]
    assert bars_p == pytest.approx(np.array([[[0.12, 0.245], [0.12, 0.255]], [[1.12, 0.35], [1.12, 0.35]]]))  # ± σ


def test_learning_curves_are_the_mean_of_the_seeds_that_ran_each_epoch_within_their_range(drawn, tmp_path):
    """A seed that stopped early leaves the later epochs to the others; the band spans min to max;
    the last panel draws each schedule's learning rate."""
    panels = {"MNIST\ncut": {"capsnet_r1": [([1, 2, 3], [4.0, 2.0, 1.0]), ([1, 2], [2.0, 1.0])]}}
    figures.learning_curve_panels(panels, {"cut at 3": ([1, 2, 3], [1e-3, 9e-4, 8e-4])}, tmp_path / "c.png")
    curves, lr = drawn[0].axes[:2]
    (line,) = curves.lines
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [3.0, 1.5, 1.0]
    assert line.get_label() == "capsnet_r1 (n=2)"
    band = curves.collections[0].get_paths()[0].vertices
    assert {tuple(v) for v in band} >= {(1, 2.0), (1, 4.0), (2, 1.0), (2, 2.0), (3, 1.0)}
    assert max(band[:, 1]) == 4.0 and min(band[:, 1]) == 1.0
    (rate,) = lr.lines
    assert list(rate.get_ydata()) == [1e-3, 9e-4, 8e-4] and lr.get_yscale() == "log"


def test_line_colours_are_distinct_however_many_variants():
    for n in (3, 10, 15, 24):
        assert len({to_rgba(c) for c in figures.line_colours(n)}) == n


def test_image_grid_puts_each_image_in_its_own_tile_scaled_to_one(drawn, tmp_path):
    rows = [torch.arange(3 * 4, dtype=torch.uint8).view(3, 2, 2) * 20, torch.rand(3, 2, 2)]
    figures.image_grid(rows, ["input", "reconstruction"], "t", tmp_path / "g.png", gap=1)
    canvas = drawn[0].axes[0].images[0].get_array()
    assert canvas.shape == (5, 8)
    for r, row in enumerate(rows):
        scaled = row.float() / 255 if row.dtype == torch.uint8 else row
        for c in range(3):
            tile = np.asarray(canvas[3 * r:3 * r + 2, 3 * c:3 * c + 2])
            assert tile == pytest.approx(scaled[c].numpy())
    assert canvas[2, 0] == 0.5 and canvas[0, 2] == 0.5  # the grey gap


def test_multimnist_reconstructions_draw_each_capsule_in_its_own_colour_over_the_input(drawn, tmp_path):
    inputs = torch.full((1, 2, 2), 100, dtype=torch.uint8)
    recons = torch.tensor([[[[0.9, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.8]]]])  # (1, 2, H, W)
    figures.multimnist_reconstructions(inputs, recons, ["3 and 7"], "t", tmp_path / "m.png")
    top, bottom = drawn[0].axes
    grey = 0.35 * 100 / 255
    assert np.asarray(top.images[0].get_array()) == pytest.approx(np.full((2, 2), 100 / 255))
    overlay = np.asarray(bottom.images[0].get_array())
    assert overlay[..., 0] == pytest.approx(np.array([[0.9, grey], [grey, grey]]))  # red: the first capsule's digit
    assert overlay[..., 1] == pytest.approx(np.array([[grey, grey], [grey, 0.8]]))  # green: the second's
    assert overlay[..., 2] == pytest.approx(np.full((2, 2), grey))


def test_confusion_counts_sit_in_their_cells_true_class_by_row(drawn, tmp_path):
    cm = [[5, 1, 0], [0, 7, 2], [3, 0, 9]]
    figures.confusion([(cm, "MNIST")], "t", tmp_path / "c.png")
    ax = drawn[0].axes[0]
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): int(t.get_text()) for t in ax.texts}
    assert cells == {(i, j): cm[i][j] for i in range(3) for j in range(3) if cm[i][j]}
    assert ax.get_ylabel() == "true" and ax.get_xlabel() == "predicted"


def test_accuracy_by_transform_draws_each_bins_spread(drawn, tmp_path):
    bins = {name: {"centres": [-1.0, 1.0], "accuracy_pct": [90.0, 95.0], "std": [2.0, 1.0]}
            for name in figures.BIN_LABELS}
    figures.accuracy_by_transform({"capsnet": bins}, "t", tmp_path / "a.png")
    for ax in drawn[0].axes:
        ((x, y, bars),) = errorbars(ax)
        assert x == [-1.0, 1.0] and y == [90.0, 95.0]
        assert bars == pytest.approx(np.array([[[-1.0, 88.0], [-1.0, 92.0]], [[1.0, 94.0], [1.0, 96.0]]]))


def test_the_affine_montage_labels_each_transformed_digit_with_its_transform(drawn, tmp_path):
    images = torch.zeros(2, 4, 4, dtype=torch.uint8)
    params = torch.tensor([[15.0, 0.1, 1.0, 1.1, 2.0, -1.0], [-5.0, 0.0, 0.9, 1.0, 0.0, 0.0]])
    figures.affine_montage(images, images, params, tmp_path / "a.png")
    axes = drawn[0].axes
    assert [ax.get_xlabel() for ax in axes[:2]] == ["", ""]  # the originals' row
    assert axes[2].get_xlabel().startswith("+15°") and axes[3].get_xlabel().startswith("-5°")


def legend_labels(ax) -> list[str]:
    return sorted(t.get_text() for t in ax.get_legend().get_texts())


def test_the_affine_montage_puts_originals_above_transforms_in_uint8_grey_with_every_parameter(drawn, tmp_path):
    originals, transformed = torch.zeros(1, 4, 4, dtype=torch.uint8), torch.full((1, 4, 4), 200, dtype=torch.uint8)
    params = torch.tensor([[15.0, 0.1, 1.2, 0.9, 2.0, -1.0]])  # rotation, shear, scale x, scale y, tx, ty
    figures.affine_montage(originals, transformed, params, tmp_path / "a.png")
    top, bottom = drawn[0].axes
    assert np.asarray(top.images[0].get_array()).max() == 0 and np.asarray(bottom.images[0].get_array()).min() == 200
    assert top.images[0].get_clim() == bottom.images[0].get_clim() == (0, 255)  # uint8 grey levels, not rescaled
    assert bottom.get_xlabel() == "+15° k+0.10\n×1.20,0.90\n(+2.0,-1.0)"
    assert (top.get_ylabel(), bottom.get_ylabel()) == ("MNIST", "affine")


def test_confusion_panels_carry_their_test_sets_name_and_write_dark_cells_in_white(drawn, tmp_path):
    cm = [[9, 1], [2, 5]]
    figures.confusion([(cm, "MNIST"), (cm, "affNIST")], "t", tmp_path / "c.png")
    first, second = (ax for ax in drawn[0].axes if ax.get_label() != "<colorbar>")
    assert (first.get_title(), second.get_title()) == ("MNIST", "affNIST")
    colours = {t.get_text(): to_rgba(t.get_color()) for t in first.texts}
    assert colours == {"9": to_rgba("white"), "5": to_rgba("white"), "1": to_rgba("black"), "2": to_rgba("black")}


def test_learning_curve_panels_give_a_variant_one_colour_everywhere_and_a_dash_per_line(drawn, tmp_path):
    """A variant's colour is the same in every panel; its second line in a panel is dashed; the test error
    is on a log scale; a panel's protocol is wrapped under its title."""
    seeds = [([1, 2], [2.0, 1.0])]
    protocol = "gpu profile, 50 epochs, the paper's decay compressed into them, " * 2
    mnist_lines = {"capsnet_r1 (paper)": seeds, "capsnet_r1 (official)": seeds, "baseline_cnn": seeds}
    panels = {f"MNIST\n{protocol}": mnist_lines,
              "affNIST": {"baseline_cnn": seeds, "capsnet_r1 (paper)": seeds}}
    figures.learning_curve_panels(panels, {"cut": ([1, 2], [1e-3, 9e-4])}, tmp_path / "c.png")
    mnist, affnist = drawn[0].axes[:2]
    lines = {(ax.get_title().split("\n")[0], line.get_label()): line for ax in (mnist, affnist) for line in ax.lines}
    colour = {key: to_rgba(line.get_color()) for key, line in lines.items()}
    capsnet = colour["MNIST", "capsnet_r1 (paper) (n=1)"]
    assert capsnet == colour["MNIST", "capsnet_r1 (official) (n=1)"] == colour["affNIST", "capsnet_r1 (paper) (n=1)"]
    assert colour["MNIST", "baseline_cnn (n=1)"] == colour["affNIST", "baseline_cnn (n=1)"] != capsnet
    styles = [lines["MNIST", label].get_linestyle() for label in ("capsnet_r1 (paper) (n=1)",
                                                                   "capsnet_r1 (official) (n=1)")]
    assert styles == ["-", "--"]
    assert mnist.get_yscale() == affnist.get_yscale() == "log"
    title = mnist.get_title().split("\n")
    assert title[0] == "MNIST" and len(title) >= 3 and " ".join(title[1:]) == protocol.strip()


def test_learning_curve_panels_past_four_fill_rows_of_three_with_the_schedule_last(drawn, tmp_path):
    seeds = [([1], [1.0])]
    panels = {f"set {k}": {"capsnet_r1": seeds} for k in range(4)}
    figures.learning_curve_panels(panels, {"cut": ([1], [1e-3])}, tmp_path / "c.png")
    axes = drawn[0].axes
    assert len(axes) == 6 and axes[3].get_subplotspec().rowspan.start == 1  # 2 rows of 3
    assert [ax.get_title() for ax in axes[:5]] == ["set 0", "set 1", "set 2", "set 3", "learning-rate schedule"]
    assert [ax.axison for ax in axes] == [True] * 5 + [False]  # the spare panel is blank


def test_image_grid_labels_each_row_and_column_at_its_tiles_centre_on_a_zero_to_one_scale(drawn, tmp_path):
    rows = [torch.rand(3, 2, 2), torch.rand(3, 2, 2)]
    figures.image_grid(rows, ["input", "reconstruction"], "t", tmp_path / "g.png", col_labels=["a", "b", "c"], gap=1)
    ax = drawn[0].axes[0]
    assert list(ax.get_yticks()) == [0.5, 3.5]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["input", "reconstruction"]
    assert list(ax.get_xticks()) == [0.5, 3.5, 6.5] and [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert ax.images[0].get_clim() == (0, 1)


def test_each_effects_note_is_on_its_row_beside_a_zero_line_and_the_legend_names_each_mark_once(drawn, tmp_path):
    effects, notes = ["routing", "reconstruction", "recipe"], ["84 seeds", "none", "confounded"]
    figures.effect_intervals(effects, [0.03, -0.11, -0.04], [(-0.15, 0.22), (-0.29, 0.06), (math.nan, math.nan)],
                             [-0.04, -0.14, math.nan], notes, tmp_path / "e.png")
    figures.effect_intervals(effects[:2], [0.03, -0.11], [(-0.15, 0.22), (-0.29, 0.06)], [-0.04, -0.14], notes[:2],
                             tmp_path / "e2.png")
    ax, unconfounded = (fig.axes[0] for fig in drawn)
    row_of = {tick.get_text(): y for y, tick in zip(ax.get_yticks(), ax.get_yticklabels())}
    assert {a.get_text(): a.xy[1] for a in ax.texts} == {note: row_of[e] for note, e in zip(notes, effects)}
    assert [list(line.get_xdata()) for line in ax.lines if line.get_linestyle() == "--"] == [[0, 0]]
    assert legend_labels(ax) == ["ours, 95 % seed-aware interval", "ours, no interval (confounded)", "paper (Table 1)"]
    assert legend_labels(unconfounded) == ["ours, 95 % seed-aware interval", "paper (Table 1)"]


def test_seed_errors_name_each_mark_once_in_the_legend(drawn, tmp_path):
    figures.seed_errors(["a", "b"], [[0.3, 0.4], [0.5, 0.6]], [(0.1, 0.6), (0.2, 0.9)], [0.25, 0.35], [0.005, 0.01],
                        tmp_path / "s.png")
    assert legend_labels(drawn[0].axes[0]) == ["ours, each seed", "ours, mean and 95 % interval over seeds",
                                               "paper (Table 1), mean ± σ"]


def test_accuracy_by_transform_gives_each_model_its_colour_and_each_panel_its_parameter(drawn, tmp_path):
    bins = {name: {"centres": [0.0], "accuracy_pct": [90.0], "std": [1.0]} for name in figures.BIN_LABELS}
    figures.accuracy_by_transform({"capsnet": bins, "baseline": bins}, "t", tmp_path / "a.png")
    figures.accuracy_by_transform({}, "t", tmp_path / "none.png")
    panels, (empty,) = drawn[0].axes, drawn[1].axes
    assert [ax.get_xlabel() for ax in panels] == list(figures.BIN_LABELS.values())
    for ax in panels:
        first, second = (to_rgba(c.lines[0].get_color()) for c in ax.containers)
        assert first != second
    assert [t.get_text() for t in empty.texts] == ["No transform parameters for this test set (real affNIST): "
                                                   "no breakdown."]


def test_multimnist_reconstructions_title_each_example_and_placeholders_say_why(drawn, tmp_path):
    figures.multimnist_reconstructions(torch.zeros(2, 2, 2, dtype=torch.uint8), torch.zeros(2, 2, 2, 2),
                                       ["3 and 7", "1 and 4"], "t", tmp_path / "m.png")
    figures.placeholder("no runs yet: run `dvc repro`", tmp_path / "p.png")
    assert [ax.get_title() for ax in drawn[0].axes[:2]] == ["3 and 7", "1 and 4"]
    assert [t.get_text() for t in drawn[1].axes[0].texts] == ["no runs yet: run `dvc repro`"]


def test_a_runs_learning_curve_plots_its_test_error_and_its_loss_on_a_log_scale(drawn, tmp_path):
    history = [{"epoch": 1, "test_error_pct": 2.0, "train_loss": 0.5},
               {"epoch": 2, "test_error_pct": 1.0, "train_loss": 0.1}]
    figures.learning_curves(history, "capsnet_r1 seed 0", tmp_path / "c.png")
    error, loss = drawn[0].axes
    assert list(error.lines[0].get_ydata()) == [2.0, 1.0] and list(loss.lines[0].get_ydata()) == [0.5, 0.1]
    assert loss.get_yscale() == "log"
