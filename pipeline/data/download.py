"""Stage `download`: the four MNIST IDX files, verified by the SHA-256 of their decoded bytes.

Sources are tried in order: ``$CAPSNET_MNIST_MIRROR`` (a local directory, or a URL base such as
``file:///…`` or ``https://…``, holding the files gzipped or raw), then the public mirrors that
torchvision's MNIST class uses. A file that cannot be fetched from one source is tried at the
next; a file whose bytes are wrong is an error at once (a corrupt mirror must be fixed, not
papered over). Each file is written under a temporary name and renamed only once verified, so a
failure leaves nothing of that file behind.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.error
from urllib.parse import urlparse
from urllib.request import url2pathname
from pathlib import Path

from pipeline.core.errors import UserError

MIRROR_ENV = "CAPSNET_MNIST_MIRROR"

# SHA-256 of the *decoded* IDX files: facts about MNIST (LeCun, Cortes, Burges).
SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
GZIP_MAGIC = b"\x1f\x8b"


class DownloadError(UserError, RuntimeError):
    """MNIST could not be fetched or verified; the message says which file and what to do."""


def default_sources() -> list[str]:
    """``$CAPSNET_MNIST_MIRROR`` (when set), then torchvision's public MNIST mirrors."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    local = url2pathname(urlparse(mirror).path) if mirror.startswith("file://") else mirror
    if mirror and "://" not in mirror.replace("file://", "") and not Path(local).is_dir():
        raise DownloadError(f"{MIRROR_ENV}={mirror}: no such directory; point it at a folder holding the MNIST "
                            "IDX files (e.g. ../shared/data/mnist) or unset it to use the public mirrors")
    # torchvision is imported on call, here and in download_url: its import takes about 2 s (torch._dynamo's),
    # which `prepare` (this module's checksums) and the warm server that preloads it need not pay
    from torchvision.datasets import MNIST

    return ([mirror] if mirror else []) + list(MNIST.mirrors)


def download_url(url: str, root: str, filename: str) -> None:
    """torchvision's download (its redirects, retries and partial-file handling) of ``url`` into ``root``."""
    from torchvision.datasets.utils import download_url as fetch

    fetch(url, root, filename=filename)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch(source: str, name: str, tmp_dir: Path) -> Path | None:
    """Copy ``name`` (``.gz`` first, then raw) from one source into tmp_dir; None if absent."""
    if source.startswith("file://"):
        source = url2pathname(urlparse(source).path)  # a local mirror: copy, no HTTP machinery
    is_url = "://" in source
    for candidate in (f"{name}.gz", name):
        if not is_url:
            path = Path(source) / candidate
            if path.is_file():
                target = tmp_dir / candidate
                shutil.copyfile(path, target)
                return target
            continue
        try:
            download_url(source.rstrip("/") + "/" + candidate, str(tmp_dir), filename=candidate)
        except (urllib.error.URLError, OSError, ValueError, RuntimeError):
            continue  # absent here or unreachable: try the next candidate / source
        return tmp_dir / candidate
    return None


def _decode(fetched: Path, out: Path, name: str) -> None:
    """Write the decoded bytes of ``fetched`` (gzip or raw IDX) to ``out``."""
    with fetched.open("rb") as f:
        is_gzip = f.read(2) == GZIP_MAGIC
    opener = gzip.open if is_gzip else open
    try:
        with opener(fetched, "rb") as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (EOFError, gzip.BadGzipFile, OSError) as err:
        raise DownloadError(f"{name}: {fetched.name} is truncated or not valid gzip ({err})") from err


def download_mnist(dest: str | Path, sources: list[str] | None = None) -> dict[str, str]:
    """Fetch and verify the four MNIST files into ``dest``; returns {file name: sha256}.

    Files already in ``dest`` with the right hash are kept as they are.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    sources = default_sources() if sources is None else sources
    verified = {}
    for name, expected in SHA256.items():
        final = dest / name
        if final.is_file() and sha256_file(final) == expected:
            verified[name] = expected
            continue
        final.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(dir=dest, prefix=f".{name}.") as tmp:
            tmp_dir = Path(tmp)
            tried = []
            for source in sources:
                fetched = _fetch(source, name, tmp_dir)
                if fetched is None:
                    tried.append(source)
                    continue
                decoded = tmp_dir / f"{name}.decoded"
                _decode(fetched, decoded, name)
                actual = sha256_file(decoded)
                if actual != expected:
                    raise DownloadError(
                        f"{name}: SHA-256 mismatch for the copy from {source}: expected {expected}, "
                        f"got {actual}. The file is corrupt or not MNIST; nothing of it was kept. "
                        f"Fix the mirror (or unset {MIRROR_ENV}) and run again."
                    )
                os.replace(decoded, final)
                verified[name] = actual
                break
            else:
                raise DownloadError(
                    f"{name}: no source answered (tried: {', '.join(tried) or 'none'}). Offline? "
                    f"Set {MIRROR_ENV} to a directory or URL holding the MNIST IDX files, "
                    f"e.g. {MIRROR_ENV}=../shared/data/mnist"
                )
    return verified
