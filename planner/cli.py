"""The ``planner`` command line: a thin click shell over the library.

Commands are loaded lazily from ``planner.commands.<name>``, so ``planner search`` never
imports torch. Every :class:`~planner.errors.PlannerError` becomes a one-line cause and a
hint on stderr and the error's exit code (1 error, 2 usage, 3 no feasible plan); no
traceback reaches the user unless ``PLANNER_DEBUG=1``. Any other exception is an internal error to report, but one
raised by a model's own forward (:func:`model_frame`), which is named with its file and line.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any

import click

from planner import __version__
from planner.errors import PlannerError

COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("planner.commands.profile", "Trace a PyTorch model and write its per-layer costs."),
    "clusters": ("planner.commands.clusters", "List the shipped cluster presets."),
    "search": ("planner.commands.search", "Find the fastest plan that fits: HPP and SP dynamic programs."),
    "simulate": ("planner.commands.simulate", "Play a plan's pipeline schedule event by event."),
    "compare": ("planner.commands.compare", "Set the planner's plan against the usual baselines."),
    "export": ("planner.commands.export", "Turn a plan into a runnable DeepSpeed or torch program."),
    "run": ("planner.commands.run", "Train a plan for real and compare with the prediction."),
    "calibrate": ("planner.commands.calibrate", "Measure this machine as a cluster JSON."),
}


def fail(exc: PlannerError) -> None:
    """Print a PlannerError as cause and hint on stderr and exit with its code."""
    from planner.render.text import plain_text

    click.echo(f"error: {plain_text(exc.cause)}", err=True)  # causes quote values from files: no control codes
    if exc.hint:
        click.echo(f"hint: {plain_text(exc.hint)}", err=True)
    sys.exit(exc.exit_code)


def emit_json(doc: Mapping[str, Any]) -> None:
    """Print exactly one JSON document on stdout (the ``--json`` contract), one that would load again."""
    from planner.jsonio import dumps

    click.echo(dumps(doc), nl=False)


class LazyGroup(click.Group):
    """A click group that imports a command's module only when it is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, help_text = COMMANDS[cmd_name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("planner"):
                return _missing_command(cmd_name, help_text)
            raise
        command = getattr(module, cmd_name.replace("-", "_"))
        assert isinstance(command, click.Command), f"{module_name}.{cmd_name} is not a click command"
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Click's main with streams that outlive their readers (``planner.pipes``) from parsing to the last line:
        a usage error's message and ``--help``/``--version`` too, which click prints outside :meth:`invoke` (a
        usage error whose reader had gone exited 1, not 2; ``planner --help | head -1`` exited 1)."""
        from planner.pipes import reader_safe

        with reader_safe():
            return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PlannerError as exc:
            fail(exc)
        except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM or SIGHUP while workers run (planner.runner.processes)
            signum = getattr(exc, "signum", 2)
            click.echo("error: interrupted" + (f" ({exc})" if signum != 2 else ""), err=True)
            sys.exit(128 + signum)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except Exception as exc:  # an unexpected failure: one line, not a traceback
            if os.environ.get("PLANNER_DEBUG"):
                raise
            from planner.render.text import plain_text

            frame = model_frame(exc)
            if frame is not None:
                click.echo(f"error: the model's own code failed: {type(exc).__name__}: {plain_text(exc)} "
                           f"({plain_text(frame.filename)}:{frame.lineno}, in {frame.name})", err=True)
                click.echo("hint: planner runs the model as it is built; a config its library does not build "
                           "(or a factory's bug) fails so: build and run the model once by itself to see it; "
                           "PLANNER_DEBUG=1 shows the traceback", err=True)
                sys.exit(1)
            click.echo(f"error: internal error: {type(exc).__name__}: {plain_text(exc)}", err=True)
            click.echo("hint: rerun with PLANNER_DEBUG=1 for the traceback, and report it", err=True)
            sys.exit(1)


_LIBRARIES = (os.sep + "torch" + os.sep, os.sep + "deepspeed" + os.sep, os.sep + "click" + os.sep)
"""Packages whose frames are not a model's code (planner calls them; transformers' modeling code is a model's)."""

_MODULE_CALLS = ("_call_impl", "_wrapped_call_impl")
"""torch's frames that run a module's forward."""


def model_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc``'s traceback in a model's code: below planner's last frame, run by a
    ``torch.nn.Module`` call (a forward), and not torch's, another library's or the standard library's (a transformers
    model's module or a user's own); None where planner's own code, or a library it called, raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    home = os.path.dirname(os.path.abspath(__file__)) + os.sep
    last = max((i for i, f in enumerate(frames) if f.filename.startswith(home)), default=-1)
    calls = [i for i, f in enumerate(frames) if i > last >= 0 and f.name in _MODULE_CALLS
             and f.filename.endswith(os.path.join("torch", "nn", "modules", "module.py"))]
    stdlib = os.path.dirname(os.__file__) + os.sep
    for frame in reversed(frames[calls[0] + 1:] if calls else []):
        name = frame.filename
        if (name.startswith(stdlib) and "site-packages" not in name) or any(lib in name for lib in _LIBRARIES):
            continue
        return frame
    return None


def _missing_command(name: str, help_text: str) -> click.Command:
    def run() -> None:
        raise PlannerError(f"command {name!r} is not available in this build", "upgrade planner")

    return click.Command(name, callback=run, help=help_text)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="planner")
def main() -> None:
    """Plan how to train a PyTorch model across a GPU cluster, then run the plan.

    Typical flow: planner profile -> planner search -> planner simulate / compare -> planner run.
    """


if __name__ == "__main__":
    main()
