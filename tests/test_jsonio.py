"""jsonio: hostile bytes refused clearly, kind/version/schema checks, atomic writes that leave nothing half-written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from planner import jsonio
from planner.errors import FormatError, PlannerError
from planner.jsonio import atomic_path, read_json, write_json
from tests.hostile import device


def test_read_json_errors(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        read_json(tmp_path / "missing.json", "profile")
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "profile", "vers')
    with pytest.raises(FormatError, match="not valid JSON"):
        read_json(bad, "profile")
    other = tmp_path / "other.json"
    write_json(other, {"kind": "plan", "version": 1})
    with pytest.raises(FormatError, match="expected 'profile'"):
        read_json(other, "profile")


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PlannerError, match="does not exist"):
        write_json(tmp_path / "nope" / "out.json", {"kind": "plan", "version": 1})


def test_nan_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlannerError, match=r"the document this command made: x is nan: not a finite number"):
        write_json(tmp_path / "x.json", {"x": float("nan")})
    with pytest.raises(PlannerError, match=r"the plan this command made: stages\[0\].t is inf"):
        write_json(tmp_path / "x.json", {"kind": "plan", "stages": [{"t": float("inf")}]})
    assert list(tmp_path.iterdir()) == []


def test_a_document_beyond_its_schemas_bounds_would_not_load_and_is_refused() -> None:
    from planner.jsonio import check_loadable
    from tests.conftest import make_cluster_dict

    doc = make_cluster_dict()
    check_loadable(doc)
    doc["links"]["intra_node"]["latency_s"] = 1e5
    with pytest.raises(PlannerError, match=r"latency_s is 100000\.0, above the maximum 60 ") as err:
        check_loadable(doc)
    assert "it would not load again" in err.value.hint


def test_written_files_get_the_usual_mode(tmp_path: Path) -> None:
    target = tmp_path / "mode.json"
    write_json(target, {"kind": "plan", "version": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def _profile_text() -> bytes:
    from tests.conftest import make_profile_dict

    return json.dumps(make_profile_dict(2)).encode()


@pytest.mark.parametrize(("raw", "message"), [
    (b"[" * 200_000, "nested deeper than 64 levels (at character 64)"),
    (b'{"a": "[[[[' + b"[" * 100 + b'"}', "expected a JSON object of kind 'profile'|field 'kind'"),
    (_profile_text().replace(b'"toy"', b'"caf\xe9"'), "not UTF-8 (byte 0xe9 at offset"),
    (_profile_text().replace(b'"batch_size": 8', b'"batch_size": ' + b"1" * 31), "has 31 digits (at most 30)"),
    (_profile_text().replace(b'"batch_size": 8', b'"batch_size": 8, "batch_size": 9'), "duplicate key 'batch_size'"),
    (_profile_text().replace(b'"forward_s": 0.01', b'"forward_s": NaN', 1), "layers[0].forward_s is nan"),
    (_profile_text().replace(b'"device_flops": 1000000000000.0', b'"device_flops": -Infinity'),
     "device_flops is -inf"),
    (_profile_text().replace(b'"backward_s": 0.02', b'"backward_s": 1e400', 1), "layers[0].backward_s is inf"),
    (_profile_text().replace(b'"param_bytes": 1000000', b'"param_bytes": 1e300', 1),
     "layers[0].param_bytes is 1e+300, above the maximum 1e+15 (bytes)"),
])
def test_hostile_bytes_are_clear_errors(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(raw)
    with pytest.raises(FormatError) as err:
        read_json(path, "profile")
    assert any(part in err.value.cause for part in message.split("|")), err.value.cause
    assert err.value.cause.startswith(str(path))


@pytest.mark.parametrize(("raw", "hint"), [
    (_profile_text().replace(b'"batch_size": 8', b'"batch_size": 8, "batch_size": 9'), "keep one value per key"),
    (_profile_text().replace(b'"batch_size": 8', b'"batch_size": ' + b"1" * 31), "numbers within planner's bounds"),
])
def test_refused_values_get_their_own_hint(tmp_path: Path, raw: bytes, hint: str) -> None:
    """A duplicate key was hinted 'write finite numbers within planner's bounds', which says nothing of keys."""
    path = tmp_path / "x.json"
    path.write_bytes(raw)
    with pytest.raises(FormatError) as err:
        read_json(path, "profile")
    assert hint in err.value.hint and "finite" not in err.value.hint, err.value.hint
    assert err.value.hint.endswith("re-create the profile file")


def test_strings_with_brackets_do_not_count_as_depth(tmp_path: Path) -> None:
    from tests.conftest import make_profile_dict

    path = tmp_path / "p.json"
    write_json(path, make_profile_dict(2, model="[" * 500 + '"\\'))
    assert read_json(path, "profile")["model"].startswith("[[[")


def test_size_limit_and_byte_order_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(b"\xef\xbb\xbf" + _profile_text())
    assert read_json(path, "profile")["kind"] == "profile"
    monkeypatch.setattr(jsonio, "MAX_FILE_BYTES", 100)
    with pytest.raises(FormatError, match="larger than"):
        read_json(path, "profile")


def test_non_regular_inputs_are_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    device("null", 3)(tmp_path)  # the test's own device: a reader that regressed reads nothing from it
    for path, message in ((tmp_path / "fifo", "not a regular file"), (tmp_path / "null", "not a regular file"),
                          (tmp_path, "is a folder")):
        with pytest.raises(FormatError, match=message):
            read_json(path, "profile")


def test_writes_go_through_links_and_refuse_devices(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    os.symlink("real.json", tmp_path / "link.json")
    write_json(tmp_path / "link.json", {"kind": "plan", "version": 2})
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "real.json").read_text())["version"] == 2
    device("full", 7)(tmp_path)
    with pytest.raises(PlannerError, match="not a regular file"):
        write_json(tmp_path / "full", {"kind": "plan", "version": 2})
