"""An effect row as the report's effects.csv holds it (pipeline.report.claims reads it), for the claims'
tests (tests/test_power.py, test_costs.py)."""

import math


def effect_row(effect, paper, lo, hi, seeds="12", hours=1.5, **extra):
    return {"protocol": "p", "effect": effect, "paper_delta": paper, "our_delta": (lo + hi) / 2, "ci_low": lo,
            "ci_high": hi, "status": "", "n_seeds": 3, "seeds_needed": seeds, "gpu_hours": hours,
            "cost_source": "GPU: one H100 | capsnet_r3_recon bf16: 24,000 images/s", "equivalence_margin": math.nan,
            "equivalence_seeds": "–", "equivalence_hours": math.nan, "paper_protocol_hours": math.nan,
            "equivalence_paper_protocol_hours": math.nan} | extra
