"""What every benchmark script shares: timing with device synchronisation and
the machine description written next to each table."""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    """Seconds one call of fn takes, the device's queued work included."""
    return timed_with_output(fn, device)[0]


def timed_with_output(fn, device: torch.device):
    """(seconds, fn's return value)."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def parser(doc: str, out_help: str = "write the table as Markdown here") -> argparse.ArgumentParser:
    """The options every benchmark takes: --device, --quick, --reps, --out."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="small sizes, few runs (smoke test)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=None, help=out_help)
    return ap


def device_of(args) -> torch.device:
    """args.device, or exit when it is CUDA and mixprec's CUDA ops are not loaded."""
    import mixprec

    device = torch.device(args.device)
    if device.type == "cuda" and not mixprec.cuda_ops_loaded():
        sys.exit("mixprec CUDA ops not loaded (no GPU, or libmixprec_cuda.so not built)")
    return device


def cpu_isa(device: torch.device) -> str:
    """The CPU path libmixprec runs ("" on CUDA)."""
    if device.type != "cpu":
        return ""
    import ctypes

    import mixprec

    lib = ctypes.CDLL(mixprec.library_path())
    return {1: "scalar", 2: "avx2", 3: "avx512"}.get(lib.mixprec_get_cpu_isa(), "?")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


class Table:
    """A Markdown table printed row by row as it is measured, then written
    (with a title, a description and the command) to --out."""

    def __init__(self, header: str):
        self.rows = [header, "|" + "---|" * (header.count("|") - 1)]
        print(header, flush=True)

    def add(self, row: str) -> None:
        self.rows.append(row)
        print(row, flush=True)

    def write(self, path: str | None, title: str, about: str, command: str, tail: str = "") -> None:
        if not path:
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            f.write(f"# {title}\n\n{about}\nCommand: `{command}`\n\n")
            f.write("\n".join(self.rows) + "\n" + (f"\n{tail}\n" if tail else ""))


def add_threads_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads for torch and mixprec alike (default: their own defaults)")


def apply_threads(args) -> None:
    """Set --threads for torch and for libmixprec's OpenMP alike."""
    if args.threads:
        import ctypes

        import mixprec

        torch.set_num_threads(args.threads)
        ctypes.CDLL(mixprec.library_path()).mixprec_set_num_threads(args.threads)
