"""export.args: the command line of the generated train.py scripts."""

from __future__ import annotations

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
