"""Which kernel setting makes the capped training fingerprint the same on two hosts (issue #36)?

    python3 scripts/fingerprint_probe.py OUT.jsonl [--variant capsnet_r3_recon]
    python3 scripts/fingerprint_probe.py --keep FILE reports/fingerprint-probe

Under `CAPPED` (ATen at AVX2, MKL COMPATIBLE, one thread, oneDNN off) the H200 host's Intel Xeon (glibc
2.39) and this AMD EPYC (glibc 2.36) computed other fingerprints with one torch build (2026-11-27). The
first form computes one variant's fingerprint under each of PROBES, each a process of its own, all at
once, and writes a line per probe (its settings, the environment and fingerprint it computed, the host);
a GPU window runs it beside its CUDA tests (scripts/gpu_session.sh) and `gpu_import.sh` files it in
reports/fingerprint-probe/ (`--keep`: under its host's name, and says per probe whether it computed
what each other host's file there holds). A probe that agrees where `capped` does not names what
differs (MKL's vector-math and GEMM dispatch, ATen's vector kernels, or the C library's libm, which
`GLIBC_TUNABLES` sends to its generic code) and is the cap that would make fingerprints comparable
across hosts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.core.params import load_params  # noqa: E402
from pipeline.training import fingerprint as fp  # noqa: E402
from pipeline.training.config import run_config  # noqa: E402

GENERIC_LIBM = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F"}  # glibc ≥ 2.33's names
PROBES = {  # settings on top of CAPPED
    "capped": {},
    "mkl-sse4_2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "mkl-strict": {"MKL_CBWR": "COMPATIBLE,STRICT"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "libm-generic": GENERIC_LIBM,
    "aten-default-mkl-sse4_2": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "all-generic": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", **GENERIC_LIBM},
}


def probe(variant: str, params_path: Path) -> list[dict]:
    """``variant``'s fingerprint under each of PROBES, one process each, all at once."""
    small = fp.fingerprint_config(run_config(load_params(params_path), variant, seed=0))

    def one(name: str) -> dict:
        settings = fp.CAPPED | PROBES[name]
        try:
            out = fp.in_capped_process([small], caps=settings)
        except fp.FingerprintError as err:
            return {"probe": name, "settings": settings, "error": str(err)}
        return {"probe": name, "settings": settings, "environment": out["environment"],
                "fingerprint": out["fingerprints"][0]}

    with ThreadPoolExecutor(max_workers=len(PROBES)) as pool:
        lines = list(pool.map(one, PROBES))
    host = {"variant": variant, "host": fp.host_numerics(), "cpu": fp.cpuinfo("model name")}
    return [line | host for line in lines]


def compare(a: list[dict], b: list[dict]) -> list[str]:
    """Per probe of ``a``: whether ``b`` computed the same fingerprint under it."""
    theirs = {line["probe"]: line for line in b}
    out = []
    for line in a:
        other = theirs.get(line["probe"])
        if other is None or "fingerprint" not in line or "fingerprint" not in other:
            verdict = "not comparable (" + (line.get("error") or (other or {}).get("error") or "absent in one") + ")"
        elif line["variant"] != other["variant"]:
            verdict = f"not comparable ({line['variant']} and {other['variant']})"
        else:
            verdict = "same" if line["fingerprint"] == other["fingerprint"] else "differs"
        out.append(f"{line['probe']}: {verdict}")
    return out


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def host_name(lines: list[dict]) -> str:
    """A file name for a probe's host: its processor's vendor, C library and torch, 'GenuineIntel-glibc-2.39-torch-2.11.0+cu130'."""
    torch_version = next((line["environment"].split(",")[0] for line in lines if "environment" in line), "torch unknown")
    return re.sub(r"[^A-Za-z0-9.+]+", "-", f"{lines[0]['host']} {torch_version}").strip("-")


def keep(source: Path, folder: Path) -> list[str]:
    """``source`` filed in ``folder`` under its host's name, and how it compares with every other host's there."""
    lines = read(source)
    if not lines:
        return [f"{source} holds no probe"]
    dest = folder / f"{host_name(lines)}.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    dest.write_text(source.read_text())
    out = [f"fingerprint probe of {lines[0]['cpu']} ({lines[0]['host']}) kept in {dest}"]
    for other in sorted(folder.glob("*.jsonl")):
        if other != dest:
            out += [f"  against {other.stem}: " + ", ".join(compare(lines, read(other)))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="where the probe's lines go (JSON lines)")
    parser.add_argument("--variant", default="capsnet_r3_recon")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--keep", nargs=2, type=Path, metavar=("FILE", "FOLDER"),
                        help="file a window's probe under its host's name, compared with the other hosts' there")
    args = parser.parse_args()
    if args.keep:
        print("\n".join(keep(*args.keep)))
        return
    if args.out is None:
        parser.error("name the file the probe writes (OUT.jsonl), or --keep FILE FOLDER")
    lines = probe(args.variant, args.params)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    for line in lines:
        print(f"{line['probe']}: {line.get('fingerprint') or line.get('error')}")


if __name__ == "__main__":
    main()
