"""`edgedeploy`: the one error boundary and the wiring of the sub-apps."""

from __future__ import annotations

import datetime as dt
import sys
import traceback
from typing import Annotated, NoReturn

import typer

from edgedeploy_agent import __version__ as agent_version
from edgedeploy_agent import tvm_without_torch

from .. import __version__
from ..errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EdgeDeployError, InputError, hint_with_link, os_error_text
from ..paths import state_dir
from . import agent, build, demo, devices, int8, keys, profiles, publish, push, render, report, rollout, status, tune
from .card import app as card_app
from .fleet_servers import app as fleet_servers_app
from .logs import register as register_logs
from .verify import register as register_verify

app = typer.Typer(
    name="edgedeploy",
    help="Build, ship and watch models on NVIDIA edge devices.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # never print locals: SSH secrets can be locals
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from edgedeploy_agent.bundle import SCHEMA_VERSION

        render.out.print(f"edgedeploy {__version__} (agent {agent_version}, bundle schema {SCHEMA_VERSION})")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Build, ship and watch models on NVIDIA edge devices."""


app.add_typer(profiles.app, name="profiles")
app.add_typer(devices.app, name="devices")
app.add_typer(agent.app, name="agent")
app.add_typer(keys.app, name="keys")
app.add_typer(card_app, name="card")
app.add_typer(fleet_servers_app, name="fleet-servers")
build.register(app)
tune.register(app)
int8.register(app)
push.register(app)
publish.register(app)
keys.register(app)
rollout.register(app)
status.register(app)
report.register(app)
demo.register(app)
register_verify(app)
register_logs(app)


def main() -> None:
    tvm_without_torch.install()  # TVM imports PyTorch where installed: 4 s a build command, unused
    try:
        app()
    except EdgeDeployError as e:
        render.error(e.message, hint_with_link(e))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        render.error("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except OSError as e:
        if e.filename is None:  # not about a path the user named: a bug or the system, below
            _internal(e)
        # a folder that is a file, a path that cannot be written, a full disk: the user can fix it
        render.error(os_error_text(e), "check the path, its parent folders and their permissions")
        sys.exit(InputError.exit_code)
    except Exception as e:
        _internal(e)


def _internal(e: Exception) -> NoReturn:
    """The last resort: one line, the details in a log file."""
    log = state_dir() / "logs" / "last-error.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"{dt.datetime.now().isoformat()} {' '.join(sys.argv)}\n{traceback.format_exc()}")
        where = f"details in {log}"
    except OSError:
        where = "could not write a debug log"
    render.error(f"internal error: {type(e).__name__}: {e}", f"{where}; please report it")
    sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
