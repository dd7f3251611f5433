"""Archives unpacked as plain files and directories alone (storage/plain_tar.py), whatever the Python: a
link or a path out of the archive refuses the whole of it before anything is written."""
from __future__ import annotations

import io
import tarfile

import pytest

from baton.storage import plain_tar


def _archive(*members: tuple[str, bytes | None, bytes]) -> tarfile.TarFile:
    """(name, link target or None, content) each."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, target, content in members:
            info = tarfile.TarInfo(name)
            if target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, target.decode()
            else:
                info.size, info.mode = len(content), 0o4777
            tar.addfile(info, io.BytesIO(content) if target is None else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


@pytest.mark.quick
@pytest.mark.parametrize("bad, said", [
    (("job/link", b"inside.txt", b""), "'job/link' is not a regular file or directory"),
    (("../out.txt", None, b"x"), "'../out.txt' is not a plain path inside the archive"),
    (("/etc/out.txt", None, b"x"), "'/etc/out.txt' is not a plain path inside the archive"),
])
def test_a_link_or_a_path_out_refuses_the_whole_archive_before_anything_is_written(tmp_path, bad, said):
    with pytest.raises(plain_tar.UnsafeMember, match=said):
        plain_tar.extract(_archive(("job/inside.txt", None, b"kept out"), bad), tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.quick
def test_plain_files_come_out_with_no_set_id_bits_and_no_write_for_others(tmp_path):
    plain_tar.extract(_archive(("job/inside.txt", None, b"weights")), tmp_path)
    made = tmp_path / "job" / "inside.txt"
    assert made.read_bytes() == b"weights" and made.stat().st_mode & 0o7777 == 0o755
