"""export.args: the command line of the generated train.py scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.export.args import script_args


def test_script_args_take_the_launchers_local_rank_and_refuse_unknown_losses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["train.py", "--local_rank", "3", "--steps", "2", "--loss", "mse"])
    args = script_args("doc", "pkg:model", local_rank=True)
    assert (args.model, args.steps, args.loss, args.seed, args.local_rank) == ("pkg:model", 2, "mse", 0, 3)
    monkeypatch.setattr("sys.argv", ["train.py", "--local_rank", "3"])
    with pytest.raises(SystemExit):  # only the DeepSpeed script accepts the launcher's argument
        script_args("doc", "pkg:model")
    monkeypatch.setattr("sys.argv", ["train.py", "--loss", "hinge"])
    with pytest.raises(SystemExit):
        script_args("doc", "pkg:model")


def test_script_args_take_a_learning_rate_and_the_torch_scripts_report_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["train.py", "--lr", "0.3", "--report", "out"])
    args = script_args("doc", "pkg:model", report=True)
    assert (args.lr, args.report) == (0.3, "out")
    monkeypatch.setattr("sys.argv", ["train.py"])
    assert script_args("doc", "pkg:model").lr is None  # the optimizer's default rate
    monkeypatch.setattr("sys.argv", ["train.py", "--report", "out"])
    with pytest.raises(SystemExit):  # only the torch script reports what it built
        script_args("doc", "pkg:model", local_rank=True)


def test_the_report_folder_is_made_before_training(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """train.py --report rep/deeper wrote rank<R>.json into a folder nobody made: FileNotFoundError after the
    last step. The folder is made when the arguments are read; a path that cannot be a folder exits 2 then."""
    target = tmp_path / "rep" / "deeper"
    monkeypatch.setattr("sys.argv", ["train.py", "--report", str(target)])
    script_args("doc", "pkg:model", report=True)
    assert target.is_dir()
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr("sys.argv", ["train.py", "--report", str(tmp_path / "file" / "sub")])
    with pytest.raises(SystemExit) as exc:
        script_args("doc", "pkg:model", report=True)
    assert exc.value.code == 2


@pytest.mark.parametrize("argv", [["--seed", "99999999999999999999"], ["--seed", "-1"], ["--seed", "x"],
                                  ["--steps", "0"], ["--steps", "-3"]])
def test_a_seed_or_step_count_out_of_range_exits_2_before_training(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    argv: list[str]) -> None:
    """A huge seed overflowed the data's per-step seed in every worker (a traceback); the run's own bound holds."""
    from planner.export import SEED_MAX

    monkeypatch.setattr("sys.argv", ["train.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        script_args("doc", "pkg:model")
    assert exit_.value.code == 2 and argv[0] in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["train.py", "--seed", str(SEED_MAX), "--steps", "1"])
    assert (script_args("doc", "pkg:model").seed, script_args("doc", "pkg:model").steps) == (SEED_MAX, 1)
