"""The one rule for files gemmc commands write where the user said (gemmc/output_file.py)."""
import os

import pytest

from gemmc.errors import GemmcError
from gemmc.output_file import check_output_file, make_parent


def test_a_new_file_in_missing_folders_is_allowed_and_the_folders_are_made(tmp_path):
    dest = check_output_file(tmp_path / "a" / "b" / "r.json", "--out", "report.json")
    assert dest == tmp_path / "a" / "b" / "r.json" and not (tmp_path / "a").exists()   # checking makes nothing
    make_parent(dest, "--out")
    assert (tmp_path / "a" / "b").is_dir()


def test_home_is_expanded_and_relative_paths_made_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert check_output_file("~/x.ptx", "--ptx", "kernel.ptx") == tmp_path / "x.ptx"
    monkeypatch.chdir(tmp_path)
    assert check_output_file("sub/x.json", "--out", "report.json") == tmp_path / "sub" / "x.json"


def test_a_folder_or_a_file_in_the_way_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(GemmcError, match=r"--out d: is a folder; name the file to write, e\.g\. .*report\.json"):
        check_output_file(tmp_path, "--out d", "report.json")
    (tmp_path / "f").write_text("")
    with pytest.raises(GemmcError, match="is a file, not a folder; choose another path"):
        check_output_file(tmp_path / "f" / "x" / "r.json", "--out", "report.json")


def test_the_caller_picks_the_error_class(tmp_path):
    class MyError(GemmcError):
        pass
    with pytest.raises(MyError):
        check_output_file(tmp_path, "export", "tuned.json.gz", error=MyError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_folder_or_file_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "old.json").write_text("")
    (ro / "old.json").chmod(0o444)
    ro.chmod(0o555)
    try:
        with pytest.raises(GemmcError, match="cannot be replaced"):
            check_output_file(ro / "old.json", "--out", "report.json")
        with pytest.raises(GemmcError, match="cannot create files in"):
            check_output_file(ro / "new" / "r.json", "--out", "report.json")
    finally:
        ro.chmod(0o755)
