import gzip
import hashlib
import re

import pytest

from pipeline.data import download
from pipeline.data.download import DownloadError, download_mnist


def test_mirror_directory_gz(synthetic_mnist, tmp_path):
    mirror, files = synthetic_mnist
    dest = tmp_path / "raw"
    hashes = download_mnist(dest, sources=[str(mirror)])
    for name, data in files.items():
        assert (dest / name).read_bytes() == data
        assert hashes[name] == hashlib.sha256(data).hexdigest()
    assert sorted(p.name for p in dest.iterdir()) == sorted(files)  # no temporary leftovers


def test_mirror_file_url_raw(synthetic_mnist, tmp_path):
    mirror, files = synthetic_mnist
    raw_mirror = tmp_path / "raw_mirror"
    raw_mirror.mkdir()
    for name, data in files.items():
        (raw_mirror / name).write_bytes(data)
    dest = tmp_path / "raw"
    download_mnist(dest, sources=[raw_mirror.as_uri()])
    assert all((dest / name).read_bytes() == data for name, data in files.items())


def test_a_file_is_gzip_by_its_bytes_not_its_name(synthetic_mnist, tmp_path):
    """A mirror that serves the gzipped files under the raw names (as some do) still decodes."""
    mirror, files = synthetic_mnist
    for name in files:
        (mirror / f"{name}.gz").rename(mirror / name)
    download_mnist(tmp_path / "raw", sources=[str(mirror)])
    assert all((tmp_path / "raw" / name).read_bytes() == data for name, data in files.items())


def test_falls_through_to_next_source(synthetic_mnist, tmp_path):
    """An absent folder, a file URL to nowhere and a server that refuses the connection are each
    passed over for the next source."""
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{closed.getsockname()[1]}/mnist"
    mirror, files = synthetic_mnist
    dest = tmp_path / "raw"
    download_mnist(dest, sources=[str(tmp_path / "empty"), (tmp_path / "nowhere").as_uri(), refused, str(mirror)])
    assert sorted(p.name for p in dest.iterdir()) == sorted(files)


def test_checksum_mismatch_names_file_and_hashes_and_leaves_nothing(synthetic_mnist, tmp_path):
    mirror, files = synthetic_mnist
    bad = bytearray(files["t10k-labels-idx1-ubyte"])
    bad[-1] ^= 0xFF
    (mirror / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(bad)))
    dest = tmp_path / "raw"
    with pytest.raises(DownloadError) as err:
        download_mnist(dest, sources=[str(mirror)])
    message = str(err.value)
    assert "t10k-labels-idx1-ubyte" in message and "SHA-256 mismatch" in message
    assert download.SHA256["t10k-labels-idx1-ubyte"] in message
    assert hashlib.sha256(bytes(bad)).hexdigest() in message
    assert not any(p.name.startswith("t10k-labels") or p.name.startswith(".t10k-labels") for p in dest.iterdir())


def test_truncated_gzip_is_an_error_leaving_nothing(synthetic_mnist, tmp_path):
    mirror, _ = synthetic_mnist
    path = mirror / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:40])
    dest = tmp_path / "raw"
    with pytest.raises(DownloadError, match="train-images-idx3-ubyte.*truncated"):
        download_mnist(dest, sources=[str(mirror)])
    assert not any("train-images" in p.name for p in dest.iterdir())


def test_no_source_names_the_mirror_variable(tmp_path, monkeypatch):
    """It names every source it tried, and a wrong file already there does not stay to look fetched."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train-images-idx3-ubyte").write_bytes(b"not MNIST")
    tried = re.escape(f"no source answered (tried: {tmp_path / 'missing'})")
    with pytest.raises(DownloadError, match=tried + ".*CAPSNET_MNIST_MIRROR"):
        download_mnist(tmp_path / "raw", sources=[str(tmp_path / "missing")])
    assert not (tmp_path / "raw" / "train-images-idx3-ubyte").exists()


def test_default_sources_put_the_mirror_first(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSNET_MNIST_MIRROR", str(tmp_path))
    sources = download.default_sources()
    assert sources[0] == str(tmp_path) and len(sources) > 1
    monkeypatch.setenv("CAPSNET_MNIST_MIRROR", "https://example.invalid/mnist")  # URLs are tried, not checked here
    assert download.default_sources()[0] == "https://example.invalid/mnist"
    monkeypatch.delenv("CAPSNET_MNIST_MIRROR")
    assert str(tmp_path) not in download.default_sources()


@pytest.mark.parametrize("form", ["plain", "file-url"])
def test_a_mirror_that_does_not_exist_is_named_not_skipped(tmp_path, monkeypatch, form):
    missing = tmp_path / "no-such-mirror"
    monkeypatch.setenv("CAPSNET_MNIST_MIRROR", str(missing) if form == "plain" else missing.as_uri())
    with pytest.raises(DownloadError, match="no-such-mirror: no such directory"):
        download.default_sources()


def test_existing_verified_files_are_kept(synthetic_mnist, tmp_path):
    mirror, files = synthetic_mnist
    dest = tmp_path / "raw"
    download_mnist(dest, sources=[str(mirror)])
    download_mnist(dest, sources=[])  # nothing to fetch: all present and verified


def test_files_kept_are_reported_with_their_hashes_as_files_fetched_are(synthetic_mnist, tmp_path):
    """The stage records what `download_mnist` returns: a second run, which fetches nothing, names
    every file with its SHA-256 all the same."""
    mirror, files = synthetic_mnist
    fetched = download_mnist(tmp_path / "raw", sources=[str(mirror)])
    assert download_mnist(tmp_path / "raw", sources=[]) == fetched and sorted(fetched) == sorted(files)


@pytest.mark.parametrize("form", ["plain", "file-url"])
def test_a_mirror_that_exists_is_the_first_source_as_a_folder_or_a_file_url(synthetic_mnist, monkeypatch, form):
    mirror, _ = synthetic_mnist
    monkeypatch.setenv("CAPSNET_MNIST_MIRROR", str(mirror) if form == "plain" else mirror.as_uri())
    assert download.default_sources()[0] == (str(mirror) if form == "plain" else mirror.as_uri())


def test_a_url_mirror_is_asked_under_its_base_and_any_failure_there_passes_to_the_next_source(
        synthetic_mnist, tmp_path, monkeypatch):
    """A URL base (here with a final slash, not doubled) is asked for <base>/<file>.gz, then <base>/<file>;
    torchvision's RuntimeError (too many redirects, say) passes to the next source as a refused
    connection does."""
    asked = []

    def redirected_forever(url, root, filename=None):
        asked.append(url)
        raise RuntimeError("Too many redirects")

    monkeypatch.setattr(download, "download_url", redirected_forever)
    mirror, files = synthetic_mnist
    download_mnist(tmp_path / "raw", sources=["https://mirror.example/mnist/", str(mirror)])
    assert asked[:2] == ["https://mirror.example/mnist/train-images-idx3-ubyte.gz",
                         "https://mirror.example/mnist/train-images-idx3-ubyte"]
    assert all((tmp_path / "raw" / name).read_bytes() == data for name, data in files.items())


def test_a_file_already_there_that_fails_its_checksum_is_fetched_again(synthetic_mnist, tmp_path):
    """A half-written or corrupt file in the destination is never trusted for being there."""
    mirror, files = synthetic_mnist
    dest = tmp_path / "raw"
    dest.mkdir()
    (dest / "train-labels-idx1-ubyte").write_bytes(files["train-labels-idx1-ubyte"][:-3])
    download_mnist(dest, sources=[str(mirror)])
    assert all((dest / name).read_bytes() == data for name, data in files.items())


@pytest.mark.integration
def test_real_mnist_mirror_hashes(tmp_path):
    from conftest import SHARED_MNIST

    if not SHARED_MNIST.is_dir():
        pytest.skip("../shared/data/mnist not present")
    hashes = download_mnist(tmp_path / "raw", sources=[str(SHARED_MNIST)])
    assert hashes == download.SHA256
    from pipeline.data.idx import read_split

    images, labels = read_split(tmp_path / "raw", "test")
    assert images.shape == (10_000, 28, 28) and labels.shape == (10_000,)
