import pytest

from pipeline.core.files import atomic_path, write_text


def test_atomic_path_renames_on_success(tmp_path):
    target = tmp_path / "sub" / "model.safetensors"
    with atomic_path(target) as tmp:
        assert tmp.suffix == ".safetensors" and tmp != target
        tmp.write_bytes(b"complete")
    assert target.read_bytes() == b"complete"
    assert [p.name for p in target.parent.iterdir()] == ["model.safetensors"]


def test_atomic_path_keeps_old_file_and_no_temp_on_failure(tmp_path):
    target = tmp_path / "metrics.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
